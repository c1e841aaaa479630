//! The plugin folder and the config file on disk: the daemon's file edge. Reading happens
//! here; what the bytes mean is decided by the core ([`promptd_core::load`],
//! [`promptd_core::config`]).

use std::path::{Path, PathBuf};

use promptd_core::config::Config;
use promptd_core::load::PluginFile;
use promptd_core::plugin::names::is_item_name;
use sha2::{Digest, Sha256};

use crate::error::{DaemonError, Result};

/// The `*.wasm` files in `dir`, sorted by file name so start-up never depends on timing (R2).
pub fn plugin_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| DaemonError::PluginDir {
        path: dir.to_path_buf(),
        source,
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

/// Reads a plugin file.
pub fn read(path: &Path) -> Result<PluginFile> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| is_item_name(s))
        .ok_or_else(|| DaemonError::PluginFileName {
            path: path.to_path_buf(),
        })?
        .to_string();
    let bytes = std::fs::read(path).map_err(|source| DaemonError::PluginRead {
        path: path.to_path_buf(),
        source,
    })?;
    let sha256 = hex(&Sha256::digest(&bytes));
    Ok(PluginFile {
        path: path.to_path_buf(),
        stem,
        bytes,
        sha256,
    })
}

/// Reads every plugin file in `dir`, in file-name order. One-shot commands are strict: the
/// first unreadable file is an error.
pub fn read_all(dir: &Path) -> Result<Vec<PluginFile>> {
    plugin_files(dir)?.iter().map(|p| read(p)).collect()
}

/// Reads and validates the config file at `path`, capturing the granted environment.
pub fn read_config(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path).map_err(|source| DaemonError::ConfigRead {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Config::from_file(&text, path, &|name| {
        std::env::var(name).ok()
    })?)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
