//! What the daemon can fail at beyond the core: files, folders and the watcher. Each variant
//! keeps the underlying error as its source; codes are stable like the core's.

use std::path::PathBuf;

use promptd_core::{Error, ErrorBody};

/// Every failure of the daemon, each with a stable [`code`](DaemonError::code).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A failure of the core.
    #[error(transparent)]
    Core(#[from] Error),

    /// The plugin folder cannot be listed.
    #[error("plugin folder {}: {source}", path.display())]
    PluginDir {
        /// The folder.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// A plugin file cannot be read.
    #[error("plugin file {}: {source}", path.display())]
    PluginRead {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// A plugin file's name is not printable ASCII without whitespace (C5).
    #[error("plugin file {}: a plugin file name must be printable ASCII without whitespace", path.display())]
    PluginFileName {
        /// The file.
        path: PathBuf,
    },

    /// The config file cannot be read.
    #[error("config {}: {source}", path.display())]
    ConfigRead {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// The watcher cannot watch a path.
    #[error("cannot watch {}: {source}", path.display())]
    Watch {
        /// The path.
        path: PathBuf,
        /// The watcher's error.
        #[source]
        source: notify::Error,
    },

    /// The watcher's thread cannot be started.
    #[error("cannot start the watcher thread: {0}")]
    WatchThread(#[source] std::io::Error),

    /// The client went away before its step was recorded: nothing was (issue 32).
    #[error("the client disconnected before the step was recorded; nothing was recorded")]
    Cancelled,

    /// A step came before the first load of the plugin folder finished.
    #[error(
        "the daemon is still loading its plugins ({loaded} of {total} files); try again shortly"
    )]
    Loading {
        /// Plugin files loaded so far.
        loaded: usize,
        /// Plugin files to load.
        total: usize,
    },

    /// A replay's candidate (`POST /v1/replay`) cannot be used: its plugin folder, a plugin
    /// file or its config file is missing, unreadable, not absolute or not what it must be.
    #[error("replay candidate: {what} {}: {source}", path.display())]
    ReplayCandidate {
        /// `plugin folder`, `plugin file` or `config`.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// Why it cannot be used: the IO error, or the config's own.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A tool call the session does not hold.
    #[error("the session has no tool call `{0}`")]
    ToolCallNotFound(String),

    /// A tool call that already has its result.
    #[error("the tool call `{0}` already has its result")]
    ToolCallClosed(String),

    /// K10: the session already moved to a newer plugin set on another daemon of the fleet
    /// than the one this daemon serves.
    #[error("session `{session}` already moved to plugin set {recorded}, and this daemon serves set {serving} (it has not loaded the newer one, or could not: see /v1/health); send the step to another daemon, or retry once this one has switched")]
    PluginSetBehind {
        /// The session.
        session: String,
        /// The set this daemon serves (0: none yet).
        serving: u64,
        /// The set the session's log records.
        recorded: u64,
    },

    /// K10: this daemon follows the store's plugin sets and serves none, though a set is
    /// published: no published set loaded (neither the latest nor an older one), or the
    /// store's sets could not be read. It serves no empty registry in their place.
    #[error("this daemon follows the store's plugin sets and serves none: {reason}; send the step to another daemon, or retry once a set loads (see /v1/health)")]
    PluginSetUnavailable {
        /// Why none serves: the latest set and its error, or the store's.
        reason: String,
    },

    /// Writing or checking a published plugin set's files failed (K10).
    #[error("{what}: {source}")]
    PluginSetFiles {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },

    /// A tool call whose tool no running MCP server provides.
    #[error("the tool call `{call}` names `{tool}`, which no running MCP server provides")]
    ToolNotRunnable {
        /// The call's id.
        call: String,
        /// The tool it names.
        tool: String,
    },

    /// G4, G13: a gateway agent whose scope gives it tools promptd cannot run for this
    /// request (a plugin's tool has no runner; an endpoint or a stream not covered yet): the
    /// client cannot run them, so they must not reach the model.
    #[error("agent `{agent}` is served by the gateway, and its scope gives it tools ({}) that the client cannot run: {why}", tools.join(", "))]
    GatewayPluginTools {
        /// The agent.
        agent: String,
        /// The tools.
        tools: Vec<String>,
        /// Why promptd does not run them itself.
        why: String,
    },

    /// A gateway client's body the splice cannot read.
    #[error(transparent)]
    Gateway(#[from] promptd_core::gateway::GatewayError),
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
            DaemonError::Cancelled => "cancelled",
            DaemonError::ReplayCandidate { .. } => "replay_candidate",
            DaemonError::ToolCallNotFound(_) => "unknown_tool_call",
            DaemonError::ToolCallClosed(_) => "tool_call_answered",
            DaemonError::ToolNotRunnable { .. } => "tool_not_runnable",
            DaemonError::PluginSetBehind { .. } => "plugin_set_behind",
            DaemonError::PluginSetUnavailable { .. } => "plugin_set_unavailable",
            DaemonError::PluginSetFiles { .. } => "plugin_set_files",
            DaemonError::GatewayPluginTools { .. } => "gateway_plugin_tools",
            DaemonError::Gateway(e) => e.code(),
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
        match e {
            DaemonError::Core(core) => ErrorBody::from(core),
            _ => ErrorBody::new(e.code(), e.to_string()),
        }
    }
}

/// A result whose error is a [`DaemonError`] by default.
pub type Result<T, E = DaemonError> = std::result::Result<T, E>;
