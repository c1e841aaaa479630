//! Typed errors with stable codes (A10).
//!
//! Every failure of the core is one of these values. `code()` is part of the public contract:
//! the CLI prints `error[CODE]: message` and the HTTP API puts it in its error body, so clients
//! can match on it. Never change a code once released. The edges (engine, store, daemon, CLI)
//! have their own enums for what only they can fail at (files, sockets, the engine itself);
//! each wraps this one and keeps the underlying error as its `source`.

use serde::Serialize;

use crate::plugin::model::Kind;
use crate::store::StoreError;

/// `a`, `b` for messages.
fn quoted(ids: &[String]) -> String {
    ids.iter()
        .map(|id| format!("`{id}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where in a plugin's declaration something is wrong, for messages.
fn list(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_string()
    } else {
        names.join(", ")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- configuration -------------------------------------------------------------------
    /// `message` is the parser's error on one line, with its line and column.
    #[error("config {path}: {message}")]
    ConfigParse {
        path: String,
        message: String,
        #[source]
        source: Box<toml::de::Error>,
    },

    #[error("config: {0}")]
    ConfigInvalid(String),

    /// An agent name (from the config or a client) breaks the naming rule.
    #[error("{role} `{name}` is not a valid agent name: {rule}")]
    InvalidAgent {
        role: String,
        name: String,
        rule: &'static str,
    },

    #[error("config: tool_order lists `{0}` more than once")]
    ToolOrderDuplicate(String),

    #[error("config: tool_order must contain the rest marker `<unlisted-tools>` exactly once")]
    ToolOrderMissingRest,

    // ---- loading (R1, R2) ----------------------------------------------------------------
    /// The engine itself failed (not the plugin): set-up, a worker thread, an internal error.
    #[error("engine: {context}: {source}")]
    Engine {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// `cause` is the engine's error chain on one line; `source` is the error itself (none
    /// when promptd's own check of the bytes refused them before the engine saw them).
    #[error("plugin `{plugin}`: not a WebAssembly component: {cause}")]
    NotAComponent {
        plugin: String,
        cause: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// Compiling hit a bound (L7): `exceeded` says which in plain words ("took longer than
    /// 5000 ms"), `key` is its config key.
    #[error("plugin `{plugin}`: compiling {exceeded} ({key})")]
    CompileLimit {
        plugin: String,
        exceeded: String,
        key: &'static str,
    },

    #[error(
        "plugin `{plugin}`: does not implement the world promptd:plugin/plugin@0.2.0 (nor the older @0.1.0): {cause}"
    )]
    WrongWorld {
        plugin: String,
        cause: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error("plugin `{plugin}`: declare failed: {cause}")]
    DeclareFailed { plugin: String, cause: String },

    #[error("plugin `{plugin}`: {kind} name `{name}` is invalid: {rule}")]
    InvalidName {
        plugin: String,
        kind: Kind,
        name: String,
        rule: &'static str,
    },

    /// `what` says what was counted ("100000 sections"), `limit` the bound and `key` the
    /// config key that sets it.
    #[error("plugin `{plugin}`: {what}, over the limit of {limit} (limits.{key})")]
    DeclarationLimit {
        plugin: String,
        what: String,
        limit: usize,
        key: &'static str,
    },

    /// A body in `format` would lack a setting the provider requires.
    #[error("the {format} format needs model setting `{key}`: set it in [model] or [model.{format}] (or the agent's model table)")]
    MissingModelSetting {
        format: &'static str,
        key: &'static str,
    },

    #[error("plugin `{plugin}`: tool name `{name}` is reserved for tool_order")]
    ReservedToolName { plugin: String, name: String },

    #[error("plugin `{plugin}`: tool `{tool}` has invalid parameters: {cause}")]
    InvalidSchema {
        plugin: String,
        tool: String,
        cause: String,
    },

    #[error("plugin `{plugin}`: scope `{scope}` is invalid: {rule}")]
    InvalidScope {
        plugin: String,
        scope: String,
        rule: &'static str,
    },

    #[error("plugin `{plugin}`: declares {kind} `{name}` twice in scope `{scope}`")]
    DuplicateName {
        plugin: String,
        kind: Kind,
        name: String,
        scope: String,
    },

    #[error("plugin `{plugin}` conflicts with plugin `{existing}`: both declare {kind} `{name}` in scope `{scope}`")]
    Conflict {
        plugin: String,
        existing: String,
        kind: Kind,
        name: String,
        scope: String,
    },

    /// A plugin the config trusts as `data` declares what only `instructions` may (trust).
    #[error("plugin `{plugin}`: its trust is `data` (config `trust`), so it may not declare {kind}s; it declares {}: give it `trust = \"instructions\"` or move the text into a context", list(.names))]
    DataPluginDeclares {
        plugin: String,
        kind: Kind,
        names: Vec<String>,
    },

    #[error("plugin id `{0}` is already loaded")]
    DuplicatePlugin(String),

    #[error("no plugin `{0}` is loaded")]
    UnknownPlugin(String),

    // ---- assembly (A3, A8, A9) -----------------------------------------------------------
    #[error("more than one complete section is effective: {}", list(.0))]
    MultipleComplete(Vec<String>),

    #[error("tool_order names tools no loaded plugin knows: {}; known tools: {}", list(.unknown), list(.known))]
    UnknownToolOrderName {
        unknown: Vec<String>,
        known: Vec<String>,
    },

    #[error("plugin `{plugin}`, {contribution}: {cause}")]
    PluginCall {
        plugin: String,
        contribution: String,
        cause: String,
        /// A trap (including a time-out or memory cap) rather than an error result.
        trapped: bool,
    },

    /// A review hook rejected the step (Q18): nothing was recorded.
    #[error("plugin `{plugin}` rejected the step in review: {reason}")]
    ReviewRejected { plugin: String, reason: String },

    #[error("plugin `{plugin}`: shown-tools returned `{tool}`, which it does not declare")]
    UnknownShownTool { plugin: String, tool: String },

    // ---- rendering (T3, T4) --------------------------------------------------------------
    #[error("{location}: malformed reference at byte {offset} (`{snippet}`): {reason}")]
    MalformedReference {
        location: String,
        offset: usize,
        snippet: String,
        reason: &'static str,
    },

    #[error("{location}: unknown variable `{name}`; {}", known_vars(.known))]
    UnknownVariable {
        location: String,
        name: String,
        known: Vec<String>,
    },

    // ---- sessions and the daemon (Q, L5) ----------------------------------------------------
    #[error("session store: {0}")]
    Store(#[from] StoreError),

    #[error("no session `{0}`")]
    UnknownSession(String),

    #[error("session `{session}` has no step {step} (it has {steps})")]
    UnknownStep {
        session: String,
        step: u64,
        steps: u64,
    },

    #[error("plugin `{plugin}`: {message}")]
    Quarantined { plugin: String, message: String },

    #[error("bad request: {0}")]
    BadRequest(String),

    #[error(
        "tool result answers call `{0}`, but no assistant message in this session made that call"
    )]
    UnknownToolCall(String),

    #[error("tool call `{0}` is already answered; each call gets one result")]
    ToolCallAnswered(String),

    #[error("tool calls {} are not answered: the step must carry one tool result for each (providers require results right after the call)", quoted(.0))]
    OpenToolCalls(Vec<String>),

    #[error("messages[{tool}] is a tool result after the user message messages[{user}]: put tool results first (providers require results right after the call)")]
    ToolResultsFirst { user: usize, tool: usize },

    #[error("content[{index}] ({kind}): {cause}")]
    InvalidBlock {
        index: usize,
        kind: &'static str,
        cause: String,
    },

    #[error("the {format} format cannot carry {what}; this session needs another format")]
    UnsupportedBlock { format: &'static str, what: String },

    #[error("context overflow: {0}")]
    ContextOverflow(String),

    #[error("cannot compact: {0}")]
    InvalidCompaction(String),

    #[error("empty message: {0}")]
    EmptyMessage(&'static str),

    #[error("tool call `{call}`: {cause}")]
    InvalidArguments { call: String, cause: String },

    #[error("no step yet: the model's reply answers a request, so record it after the first step")]
    ReplyBeforeStep,

    #[error("messages[{index}]: {source}")]
    AtMessage {
        index: usize,
        #[source]
        source: Box<Error>,
    },

    #[error("{location}: variable `{name}` (plugin `{plugin}`) has no value this assembly")]
    VariableAbsent {
        location: String,
        name: String,
        plugin: String,
    },
}

fn known_vars(known: &[String]) -> String {
    if known.is_empty() {
        "no variables are registered".to_string()
    } else {
        format!("registered variables: {}", known.join(", "))
    }
}

impl Error {
    /// This error, said of `messages[index]` of a request (the code stays the same).
    pub fn at_message(self, index: usize) -> Error {
        Error::AtMessage {
            index,
            source: Box::new(self),
        }
    }

    /// The stable, machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::ConfigParse { .. } => "config_parse",
            Error::ConfigInvalid(_) => "config_invalid",
            Error::InvalidAgent { .. } => "invalid_agent",
            Error::ToolOrderDuplicate(_) => "tool_order_duplicate",
            Error::ToolOrderMissingRest => "tool_order_missing_rest",
            Error::Engine { .. } => "engine",
            Error::NotAComponent { .. } => "not_a_component",
            Error::CompileLimit { .. } => "compile_limit",
            Error::WrongWorld { .. } => "wrong_world",
            Error::DeclareFailed { .. } => "declare_failed",
            Error::InvalidName { .. } => "invalid_name",
            Error::DeclarationLimit { .. } => "declaration_limit",
            Error::MissingModelSetting { .. } => "missing_model_setting",
            Error::ReservedToolName { .. } => "reserved_tool_name",
            Error::InvalidSchema { .. } => "invalid_schema",
            Error::InvalidScope { .. } => "invalid_scope",
            Error::DuplicateName { .. } => "duplicate_name",
            Error::Conflict { kind, .. } => match kind {
                Kind::Section => "section_conflict",
                Kind::Context => "context_conflict",
                Kind::Variable => "variable_conflict",
                Kind::Tool => "tool_conflict",
            },
            Error::DuplicatePlugin(_) => "duplicate_plugin",
            Error::UnknownPlugin(_) => "unknown_plugin",
            Error::MultipleComplete(_) => "multiple_complete",
            Error::UnknownToolOrderName { .. } => "unknown_tool_order_name",
            Error::PluginCall { trapped: false, .. } => "plugin_error",
            Error::PluginCall { trapped: true, .. } => "plugin_trap",
            Error::UnknownShownTool { .. } => "unknown_shown_tool",
            Error::DataPluginDeclares { .. } => "data_plugin_declares",
            Error::ReviewRejected { .. } => "review_rejected",
            Error::MalformedReference { .. } => "malformed_reference",
            Error::UnknownVariable { .. } => "unknown_variable",
            Error::VariableAbsent { .. } => "variable_absent",
            Error::Store(e) => e.code(),
            Error::UnknownSession(_) => "unknown_session",
            Error::UnknownStep { .. } => "unknown_step",
            Error::BadRequest(_) => "bad_request",
            Error::Quarantined { .. } => "quarantined",
            Error::UnknownToolCall(_) => "unknown_tool_call",
            Error::ToolCallAnswered(_) => "tool_call_answered",
            Error::OpenToolCalls(_) => "open_tool_calls",
            Error::ToolResultsFirst { .. } => "tool_results_first",
            Error::EmptyMessage(_) => "empty_message",
            Error::ContextOverflow(_) => "context_overflow",
            Error::InvalidCompaction(_) => "invalid_compaction",
            Error::InvalidBlock { .. } => "invalid_block",
            Error::UnsupportedBlock { .. } => "unsupported_block",
            Error::InvalidArguments { .. } => "invalid_arguments",
            Error::ReplyBeforeStep => "reply_before_step",
            Error::AtMessage { source, .. } => source.code(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl StoreError {
    /// The stable code of this store error.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Conflict { .. } => "store_conflict",
            StoreError::Corrupt { .. } => "store_corrupt",
            StoreError::Backend { .. } => "store",
            StoreError::Unavailable { .. } => "store_unavailable",
        }
    }
}

/// An error as clients see it: the stable code and the one-line message. Used in HTTP error
/// bodies, plugin status and registry events.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub code: &'static str,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<&Error> for ErrorBody {
    fn from(e: &Error) -> Self {
        Self::new(e.code(), e.to_string())
    }
}
