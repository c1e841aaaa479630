//! Files to registry: read plugin files, load them through the engine, validate, register.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::cache::Lookup;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::names::is_item_name;
use crate::registry::{PluginEntry, Registry};
use crate::wasm::WasmRuntime;

/// A plugin file that could not join the registry, and why.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub file: PathBuf,
    pub error: Error,
}

/// The outcome of loading a folder: what serves, and what was refused.
#[derive(Debug, Default)]
pub struct Loaded {
    pub registry: Registry,
    pub refused: Vec<Refusal>,
}

/// The `*.wasm` files in `dir`, sorted by file name so start-up never depends on timing (R2).
pub fn plugin_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |e: std::io::Error| Error::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "wasm") && path.is_file() {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Loads every plugin in `dir` in file-name order. A plugin that fails to load or conflicts
/// with one loaded before it is refused; the others keep loading.
pub fn load_dir(runtime: &WasmRuntime, dir: &Path, config: &Config) -> Result<Loaded> {
    let mut loaded = Loaded::default();
    for file in plugin_files(dir)? {
        let result =
            load_file(runtime, &file, config).and_then(|entry| loaded.registry.with_plugin(entry));
        match result {
            Ok(next) => loaded.registry = next,
            Err(error) => loaded.refused.push(Refusal { file, error }),
        }
    }
    Ok(loaded)
}

/// A plugin file read from disk.
#[derive(Debug, Clone)]
pub struct PluginFile {
    pub path: PathBuf,
    /// The file name without `.wasm`: the default plugin id and its `[plugins.…]` key.
    pub stem: String,
    pub bytes: Vec<u8>,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
}

/// Reads a plugin file.
pub fn read(path: &Path) -> Result<PluginFile> {
    let stem = file_stem(path)?;
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let sha256 = hex(&Sha256::digest(&bytes));
    Ok(PluginFile {
        path: path.to_path_buf(),
        stem,
        bytes,
        sha256,
    })
}

/// Compiles (or takes from the compile cache), declares and validates a plugin (R1) with its
/// settings from `config`. Also says whether the compile cache served it.
pub fn load(
    runtime: &WasmRuntime,
    file: &PluginFile,
    config: &Config,
) -> Result<(PluginEntry, Option<Lookup>)> {
    let id = config.plugin_id(&file.stem);
    let values = config.plugin_values(&file.stem);
    let sandbox = config.sandbox(&file.stem);
    let (declaration, provider, lookup) =
        runtime.load(&id, &file.bytes, &file.sha256, values, sandbox)?;
    let entry = PluginEntry::new(
        &id,
        declaration,
        provider as Arc<_>,
        config.plugin_options(&file.stem),
    )?;
    let origin = format!("{} sha256:{}", file.path.display(), file.sha256);
    Ok((entry.with_origin(origin), lookup))
}

/// Reads and loads one plugin file.
pub fn load_file(runtime: &WasmRuntime, path: &Path, config: &Config) -> Result<PluginEntry> {
    load(runtime, &read(path)?, config).map(|(entry, _)| entry)
}

fn file_stem(path: &Path) -> Result<String> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string();
    if is_item_name(&stem) {
        Ok(stem)
    } else {
        Err(Error::Io {
            path: path.display().to_string(),
            message: "a plugin file name must be printable ASCII without whitespace".into(),
        })
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
