//! The on-disk compile cache (H4): compiled components keyed by the plugin file's SHA-256 and
//! the engine's version and settings, so an unchanged plugin loads without compiling, also
//! after a restart. Size-bounded: least recently used entries go first.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use wasmtime::component::Component;
use wasmtime::Engine;

/// Default bound on the cache folder's size.
pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;

/// Compiled components on disk, by the SHA-256 of their bytes and the engine's fingerprint, bounded in size.
pub struct CompileCache {
    dir: PathBuf,
    /// The engine's compatibility fingerprint: wasmtime version, target and settings.
    engine_key: String,
    max_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

use promptd_core::load::CacheLookup as Lookup;

impl CompileCache {
    /// A cache in `dir` (made if missing) for `engine`'s code, at most `max_bytes`.
    pub fn new(dir: &Path, engine: &Engine, max_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        // `DefaultHasher::new()` has fixed keys, so the fingerprint is stable across runs.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Ok(Self {
            dir: dir.to_path_buf(),
            engine_key: format!("{:016x}", h.finish()),
            max_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    fn entry(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key))
    }

    /// Loads served from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Loads that compiled so far.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// The compiled component for `bytes` (whose hash is `sha256`): from the cache when a valid
    /// entry exists, else compiled with `compile` and stored.
    pub fn get_or_compile(
        &self,
        engine: &Engine,
        sha256: &str,
        compile: impl FnOnce() -> wasmtime::Result<Component>,
    ) -> wasmtime::Result<(Component, Lookup)> {
        let path = self.entry(sha256);
        if let Some(component) = self.hit(engine, &path) {
            return Ok((component, Lookup::Hit));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let component = compile()?;
        if let Err(e) = self.store(&path, &component) {
            tracing::warn!(entry = %path.display(), "could not write the compile cache: {e}");
        }
        Ok((component, Lookup::Miss))
    }

    /// Like [`CompileCache::get_or_compile`], for a compiler that writes the serialized
    /// component to the path it is given (the child process, L7): that file is renamed into
    /// the cache and mapped from there, so the artifact never passes through this process's
    /// heap. `unusable` names an artifact that does not load; `uncached` compiles elsewhere
    /// when the cache folder cannot be written (that costs only the cache, as in `store`).
    pub fn get_or_compile_into<E>(
        &self,
        engine: &Engine,
        sha256: &str,
        compile: impl FnOnce(&Path) -> Result<(), E>,
        unusable: impl FnOnce(wasmtime::Error) -> E,
        uncached: impl FnOnce() -> Result<Component, E>,
    ) -> Result<(Component, Lookup), E> {
        let path = self.entry(sha256);
        if let Some(component) = self.hit(engine, &path) {
            return Ok((component, Lookup::Hit));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let tmp = scratch_path(&path);
        // A placeholder the compiler replaces: proof the folder takes new files.
        if let Err(e) = std::fs::File::create_new(&tmp) {
            tracing::warn!(entry = %path.display(), "could not write the compile cache: {e}");
            return Ok((uncached()?, Lookup::Miss));
        }
        compile(&tmp)?;
        // Under its real name only once complete; if the rename fails it loads from beside.
        let at = match std::fs::rename(&tmp, &path) {
            Ok(()) => path.as_path(),
            Err(e) => {
                tracing::warn!(entry = %path.display(), "could not write the compile cache: {e}");
                tmp.as_path()
            }
        };
        // SAFETY: the file was just written by the compiler child from this engine's settings
        // (`crate::compile`); wasmtime checks its header too.
        let component = unsafe { Component::deserialize_file(engine, at) };
        if at == tmp || component.is_err() {
            let _ = std::fs::remove_file(at);
        }
        // Mapped already, so evicting it now (a bound smaller than one entry) costs nothing.
        self.evict();
        Ok((component.map_err(unusable)?, Lookup::Miss))
    }

    /// A valid entry at `path`, counted as a hit; an unusable one is removed.
    fn hit(&self, engine: &Engine, path: &Path) -> Option<Component> {
        if !path.is_file() {
            return None;
        }
        // SAFETY: entries are written only by this cache from `Component::serialize` or the
        // compiler child of this engine configuration (the file name carries its fingerprint);
        // wasmtime also checks the header and refuses artifacts of another version or settings.
        match unsafe { Component::deserialize_file(engine, path) } {
            Ok(component) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                touch(path);
                Some(component)
            }
            Err(e) => {
                tracing::warn!(entry = %path.display(), "discarding unusable cache entry: {e:#}");
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    fn store(&self, path: &Path, component: &Component) -> Result<(), String> {
        let bytes = component.serialize().map_err(|e| format!("{e:#}"))?;
        // Written beside, then renamed: a crash never leaves a half entry under the real name.
        // One name per write: parallel loads of the same bytes must not share a file.
        let tmp = scratch_path(path);
        std::fs::write(&tmp, bytes).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())?;
        self.evict();
        Ok(())
    }

    /// Removes least recently used entries until the folder fits `max_bytes`, and entries of
    /// other engine versions or settings (they can never be used again).
    fn evict(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if !name.ends_with(".cwasm") {
                continue;
            }
            if !name.ends_with(&format!("-{}.cwasm", self.engine_key)) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if let Ok(meta) = entry.metadata() {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                entries.push((used, meta.len(), path));
            }
        }
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// Marks an entry as recently used (its modification time orders eviction).
fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// A fresh path beside `near` (a file name in the same folder, so a rename is atomic) for one
/// compile's output.
pub(crate) fn scratch_path(near: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = near
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    near.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()))
}
