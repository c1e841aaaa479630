//! What the command line itself can fail at: flags, scaffolding and builds. Everything else is
//! an error of the crate that failed (core, engine, store, daemon), shown with its own code.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A flag's value is malformed.
    #[error("{flag} `{value}`: {expected}")]
    BadArgument {
        flag: &'static str,
        value: String,
        expected: String,
    },

    #[error("listening on {addr} (not loopback) requires a token: set `token` in the config or PROMPTD_TOKEN")]
    TokenRequired { addr: std::net::SocketAddr },

    #[error("{}: already exists; choose another name or folder", path.display())]
    AlreadyExists { path: PathBuf },

    #[error("{}: no plugin here (no Cargo.toml, plugin.js, app.py or .c file): run `promptd plugin build` in a folder made by `promptd plugin new`", dir.display())]
    NotAPluginFolder { dir: PathBuf },

    #[error("{}: {source}", path.display())]
    Folder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("the {lang} SDK is not at {}: {source}; set PROMPTD_SDK to the sdk/ folder of a promptd checkout", path.display())]
    SdkNotFound {
        lang: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("building {} ({lang}): {cause}", dir.display())]
    BuildFailed {
        dir: PathBuf,
        lang: &'static str,
        cause: String,
    },
}

impl CliError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            CliError::BadArgument { .. } => "bad_argument",
            CliError::TokenRequired { .. } => "token_required",
            CliError::AlreadyExists { .. } => "already_exists",
            CliError::NotAPluginFolder { .. } => "not_a_plugin_folder",
            CliError::Folder { .. } => "folder",
            CliError::SdkNotFound { .. } => "sdk_not_found",
            CliError::Write { .. } => "write_failed",
            CliError::BuildFailed { .. } => "build_failed",
        }
    }
}

/// The stable code of any error promptd reports, found in the chain of `err`.
pub fn code_of(err: &anyhow::Error) -> &'static str {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<CliError>() {
            return e.code();
        }
        if let Some(e) = cause.downcast_ref::<promptd_daemon::DaemonError>() {
            return e.code();
        }
        if let Some(e) = cause.downcast_ref::<promptd_core::Error>() {
            return e.code();
        }
        if let Some(e) = cause.downcast_ref::<promptd_core::store::StoreError>() {
            return e.code();
        }
        if let Some(e) = cause.downcast_ref::<promptd_engine::EngineError>() {
            return e.code();
        }
    }
    "internal"
}
