//! Plugin files to registry entries, through an [`Engine`] (R1, R2).
//!
//! The engine is a trait so the core never depends on wasmtime: `promptd-engine` implements it
//! for WebAssembly components, tests implement it with native providers. Reading files is the
//! caller's job; here a plugin file is plain data.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::plugin::model::Declaration;
use crate::plugin::provider::Provider;
use crate::plugin::registry::{PluginEntry, Registry};
use crate::plugin::sandbox::Sandbox;

/// A plugin file as read from disk.
#[derive(Debug, Clone)]
pub struct PluginFile {
    /// Where the file was read from.
    pub path: PathBuf,
    /// The file name without `.wasm`: the default plugin id and its `[plugins.…]` key.
    pub stem: String,
    /// The file's bytes: a WebAssembly component.
    pub bytes: Vec<u8>,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
}

/// Whether the compile cache served a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLookup {
    /// The compiled code came from the cache.
    Hit,
    /// The plugin was compiled.
    Miss,
}

impl CacheLookup {
    /// `hit` or `miss`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheLookup::Hit => "hit",
            CacheLookup::Miss => "miss",
        }
    }
}

/// What an engine makes of one plugin: its declaration (data) and its provider (behaviour).
pub struct Instantiated {
    /// What the plugin declares.
    pub declaration: Declaration,
    /// Its dynamic half.
    pub provider: Arc<dyn Provider>,
    /// `None` when the engine keeps no compile cache.
    pub cache: Option<CacheLookup>,
}

/// What a plugin is asked for at load: its id, settings and sandbox.
#[derive(Clone, Debug)]
pub struct LoadRequest<'a> {
    /// The plugin's id.
    pub id: &'a str,
    /// The component's bytes.
    pub bytes: &'a [u8],
    /// Hex SHA-256 of the bytes (the compile cache's key).
    pub sha256: &'a str,
    /// The key/value strings its `declare` receives.
    pub config: Vec<(String, String)>,
    /// The bounds its calls run under.
    pub sandbox: Sandbox,
}

/// Turns plugin bytes into a declaration and a provider.
pub trait Engine: Send + Sync {
    /// Compiles (or takes from a cache), checks the world, instantiates and declares. Nothing
    /// is validated against other plugins here.
    fn instantiate(&self, request: LoadRequest<'_>) -> Result<Instantiated>;

    /// Compile cache counters `(hits, misses)`, when the engine keeps a cache.
    fn cache_counts(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Loads one plugin with its settings from `config` and validates its declaration (R1).
pub fn load(
    engine: &dyn Engine,
    file: &PluginFile,
    config: &Config,
) -> Result<(PluginEntry, Option<CacheLookup>)> {
    let id = config.plugin_id(&file.stem);
    let values = config.plugin_values(&file.stem);
    let loaded = engine.instantiate(LoadRequest {
        id: &id,
        bytes: &file.bytes,
        sha256: &file.sha256,
        config: values.clone(),
        sandbox: config.sandbox(&file.stem),
    })?;
    let entry = PluginEntry::new(
        &id,
        loaded.declaration,
        loaded.provider,
        config.plugin_options(&file.stem),
    )?;
    let origin = format!("{} sha256:{}", file.path.display(), file.sha256);
    Ok((
        entry
            .with_origin(origin)
            .with_sha256(&file.sha256)
            .with_config(&values),
        loaded.cache,
    ))
}

/// A plugin file that could not join the registry, and why.
#[derive(Debug)]
pub struct Refusal {
    /// The file.
    pub file: PathBuf,
    /// Why it was refused.
    pub error: Error,
}

/// The outcome of loading a set of files: what serves, and what was refused.
#[derive(Debug, Default)]
pub struct LoadedSet {
    /// The plugins that serve.
    pub registry: Registry,
    /// The files that were refused, in load order.
    pub refused: Vec<Refusal>,
}

/// Loads `files` in the order given (callers sort by file name, so the outcome never depends
/// on timing, R2). A plugin that fails or conflicts with one loaded before it is refused; the
/// others keep loading.
pub fn load_all(
    engine: &dyn Engine,
    files: impl IntoIterator<Item = PluginFile>,
    config: &Config,
) -> LoadedSet {
    let mut set = LoadedSet::default();
    for file in files {
        let result =
            load(engine, &file, config).and_then(|(entry, _)| set.registry.with_plugin(entry));
        match result {
            Ok(next) => set.registry = next,
            Err(error) => set.refused.push(Refusal {
                file: file.path,
                error,
            }),
        }
    }
    set
}
