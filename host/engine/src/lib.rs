//! promptd's WebAssembly engine: wasmtime components as [`promptd_core::load::Engine`].
//!
//! [`WasmEngine`] owns the wasmtime engine, the linker and the epoch ticker; each loaded plugin
//! becomes a [`WasmProvider`] with a warm instance, a call deadline, a memory cap and the
//! grants of its [`promptd_core::plugin::sandbox::Sandbox`]. [`cache`] keeps compiled code on disk.

pub mod cache;
pub mod compile;
mod log;
mod state;
mod wasm;
mod worlds;

use std::path::PathBuf;

pub use compile::Compiler;
pub use wasm::{WasmEngine, WasmProvider};

/// Why the engine itself could not be set up (a plugin's own failures are
/// [`promptd_core::Error`]s such as `not_a_component`).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// wasmtime could not be set up (its configuration or the linker).
    #[error("cannot set up the WebAssembly engine: {0:#}")]
    Init(#[source] wasmtime::Error),
    /// The thread that ends calls at their deadline could not start.
    #[error("cannot start the epoch ticker thread: {0}")]
    Ticker(#[source] std::io::Error),
    /// The compile cache's folder cannot be made.
    #[error("compile cache {}: {source}", path.display())]
    CacheDir {
        /// The folder.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

impl EngineError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Init(_) | EngineError::Ticker(_) => "engine",
            EngineError::CacheDir { .. } => "cache_dir",
        }
    }
}
