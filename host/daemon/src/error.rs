//! What the daemon can fail at beyond the core: files, folders and the watcher. Each variant
//! keeps the underlying error as its source; codes are stable like the core's.

use std::path::PathBuf;

use promptd_core::{Error, ErrorBody};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Core(#[from] Error),

    #[error("plugin folder {}: {source}", path.display())]
    PluginDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("plugin file {}: {source}", path.display())]
    PluginRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("plugin file {}: a plugin file name must be printable ASCII without whitespace", path.display())]
    PluginFileName { path: PathBuf },

    #[error("config {}: {source}", path.display())]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot watch {}: {source}", path.display())]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },

    #[error("cannot start the watcher thread: {0}")]
    WatchThread(#[source] std::io::Error),

    #[error(
        "the daemon is still loading its plugins ({loaded} of {total} files); try again shortly"
    )]
    Loading { loaded: usize, total: usize },

    #[error("the session has no tool call `{0}`")]
    ToolCallNotFound(String),

    #[error("the tool call `{0}` already has its result")]
    ToolCallClosed(String),

    #[error("the tool call `{call}` names `{tool}`, which no running MCP server provides")]
    ToolNotRunnable { call: String, tool: String },
}

impl DaemonError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            DaemonError::Core(e) => e.code(),
            DaemonError::PluginDir { .. } => "plugin_dir",
            DaemonError::PluginRead { .. } => "plugin_read",
            DaemonError::PluginFileName { .. } => "plugin_file_name",
            DaemonError::ConfigRead { .. } => "config_read",
            DaemonError::Watch { .. } | DaemonError::WatchThread(_) => "watch",
            DaemonError::Loading { .. } => "loading",
            DaemonError::ToolCallNotFound(_) => "unknown_tool_call",
            DaemonError::ToolCallClosed(_) => "tool_call_answered",
            DaemonError::ToolNotRunnable { .. } => "tool_not_runnable",
        }
    }
}

impl From<promptd_core::store::StoreError> for DaemonError {
    fn from(e: promptd_core::store::StoreError) -> Self {
        DaemonError::Core(Error::Store(e))
    }
}

impl From<&DaemonError> for ErrorBody {
    fn from(e: &DaemonError) -> Self {
        ErrorBody::new(e.code(), e.to_string())
    }
}

pub type Result<T, E = DaemonError> = std::result::Result<T, E>;
