//! Typed errors with stable codes (A10).
//!
//! Every failure of the core is one of these values. `code()` is part of the public contract:
//! the CLI prints `error[CODE]: message` and the HTTP API puts it in its error body, so clients
//! can match on it. Never change a code once released. The edges (engine, store, daemon, CLI)
//! have their own enums for what only they can fail at (files, sockets, the engine itself);
//! each wraps this one and keeps the underlying error as its `source`.

use serde::Serialize;

use crate::kind::Kind;
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

/// Every failure of the core, each with a stable [`code`](Error::code).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- configuration -------------------------------------------------------------------
    /// `message` is the parser's error on one line, with its line and column.
    #[error("config {path}: {message}")]
    ConfigParse {
        /// Where the config came from (its path).
        path: String,
        /// The parser's message.
        message: String,
        /// The parser's error.
        #[source]
        source: Box<toml::de::Error>,
    },

    /// The config parses but breaks a rule; the message says which.
    #[error("config: {0}")]
    ConfigInvalid(String),

    /// An agent name (from the config or a client) breaks the naming rule.
    #[error("{role} `{name}` is not a valid agent name: {rule}")]
    InvalidAgent {
        /// What the name is for: an agent, an agent's parent, a plugin's scope.
        role: String,
        /// The name as written.
        name: String,
        /// The rule it breaks.
        rule: &'static str,
    },

    /// `tool_order` names this tool twice.
    #[error("config: tool_order lists `{0}` more than once")]
    ToolOrderDuplicate(String),

    /// `tool_order` lacks the rest marker, or has it more than once.
    #[error("config: tool_order must contain the rest marker `<unlisted-tools>` exactly once")]
    ToolOrderMissingRest,

    // ---- loading (R1, R2) ----------------------------------------------------------------
    /// The engine itself failed (not the plugin): set-up, a worker thread, an internal error.
    #[error("engine: {context}: {source}")]
    Engine {
        /// What the engine was doing.
        context: String,
        /// The engine's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// `cause` is the engine's error chain on one line; `source` is the error itself (none
    /// when promptd's own check of the bytes refused them before the engine saw them).
    #[error("plugin `{plugin}`: not a WebAssembly component: {cause}")]
    NotAComponent {
        /// The plugin's id.
        plugin: String,
        /// Why the engine refused the bytes, on one line.
        cause: String,
        /// The engine's error, if it got that far.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// Compiling hit a bound (L7): `exceeded` says which in plain words ("took longer than
    /// 5000 ms"), `key` is its config key.
    #[error("plugin `{plugin}`: compiling {exceeded} ({key})")]
    CompileLimit {
        /// The plugin's id.
        plugin: String,
        /// The bound, in plain words.
        exceeded: String,
        /// The config key that sets the bound.
        key: &'static str,
    },

    /// The component does not implement the plugin world promptd knows.
    #[error(
        "plugin `{plugin}`: does not implement the world promptd:plugin/plugin@0.3.0 (nor the older @0.2.0 or @0.1.0): {cause}"
    )]
    WrongWorld {
        /// The plugin's id.
        plugin: String,
        /// The engine's error chain on one line.
        cause: String,
        /// The engine's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The plugin's `declare` returned an error or trapped.
    #[error("plugin `{plugin}`: declare failed: {cause}")]
    DeclareFailed {
        /// The plugin's id.
        plugin: String,
        /// What it returned or why it trapped.
        cause: String,
    },

    /// A name the plugin declares breaks the naming rule.
    #[error("plugin `{plugin}`: {kind} name `{name}` is invalid: {rule}")]
    InvalidName {
        /// The plugin's id.
        plugin: String,
        /// What kind of contribution the name is.
        kind: Kind,
        /// The name as declared.
        name: String,
        /// The rule it breaks.
        rule: &'static str,
    },

    /// What a contribution says it reads cannot be (world 0.3.0): `reads` on a static item,
    /// or a fact name that is empty, too long or repeated past the bound.
    #[error("plugin `{plugin}`: {kind} `{name}`: reads {cause}")]
    InvalidReads {
        /// The plugin's id.
        plugin: String,
        /// What kind of contribution it is (`reads` on the declaration: a section named `*`).
        kind: Kind,
        /// Its name.
        name: String,
        /// What is wrong.
        cause: String,
    },

    /// `what` says what was counted ("100000 sections"), `limit` the bound and `key` the
    /// config key that sets it.
    #[error("plugin `{plugin}`: {what}, over the limit of {limit} (limits.{key})")]
    DeclarationLimit {
        /// The plugin's id.
        plugin: String,
        /// What was counted, with its count.
        what: String,
        /// The bound.
        limit: usize,
        /// The config key under `limits` that sets it.
        key: &'static str,
    },

    /// A body in `format` would lack a setting the provider requires.
    #[error("the {format} format needs model setting `{key}`: set it in [model] or [model.{format}] (or the agent's model table)")]
    MissingModelSetting {
        /// The format's name.
        format: &'static str,
        /// The missing setting.
        key: &'static str,
    },

    /// The plugin declares a tool under the name `tool_order` reserves.
    #[error("plugin `{plugin}`: tool name `{name}` is reserved for tool_order")]
    ReservedToolName {
        /// The plugin's id.
        plugin: String,
        /// The tool's name.
        name: String,
    },

    /// A tool's parameters are not a JSON Schema promptd accepts.
    #[error("plugin `{plugin}`: tool `{tool}` has invalid parameters: {cause}")]
    InvalidSchema {
        /// The plugin's id.
        plugin: String,
        /// The tool's name.
        tool: String,
        /// What is wrong with the schema.
        cause: String,
    },

    /// A scope the plugin declares into breaks the scope rule.
    #[error("plugin `{plugin}`: scope `{scope}` is invalid: {rule}")]
    InvalidScope {
        /// The plugin's id.
        plugin: String,
        /// The scope as declared.
        scope: String,
        /// The rule it breaks.
        rule: &'static str,
    },

    /// The plugin declares one name twice in one scope.
    #[error("plugin `{plugin}`: declares {kind} `{name}` twice in scope `{scope}`")]
    DuplicateName {
        /// The plugin's id.
        plugin: String,
        /// What kind of contribution the name is.
        kind: Kind,
        /// The name.
        name: String,
        /// The scope.
        scope: String,
    },

    /// Two plugins declare the same name in the same scope.
    #[error("plugin `{plugin}` conflicts with plugin `{existing}`: both declare {kind} `{name}` in scope `{scope}`")]
    Conflict {
        /// The plugin being loaded.
        plugin: String,
        /// The loaded plugin that already declares it.
        existing: String,
        /// What kind of contribution the name is.
        kind: Kind,
        /// The name.
        name: String,
        /// The scope.
        scope: String,
    },

    /// A plugin the config trusts as `data` declares what only `instructions` may (trust).
    #[error("plugin `{plugin}`: its trust is `data` (config `trust`), so it may not declare {kind}s; it declares {}: give it `trust = \"instructions\"` or move the text into a context", list(.names))]
    DataPluginDeclares {
        /// The plugin's id.
        plugin: String,
        /// The kind it may not declare.
        kind: Kind,
        /// What it declares of that kind.
        names: Vec<String>,
    },

    /// A plugin's config `refresh` names a section or tool it does not declare (K7).
    #[error("plugin `{plugin}`: config `refresh` names {kind} `{name}`, which the plugin does not declare; name its own sections and tools, or use `refresh = \"boundary\"` for all of them")]
    RefreshUnknown {
        /// The plugin's id.
        plugin: String,
        /// `section` or `tool`.
        kind: &'static str,
        /// The name it does not declare.
        name: String,
    },

    /// A plugin's config `defer` names a tool it does not declare (K9).
    #[error("plugin `{plugin}`: config `defer` names tool `{name}`, which the plugin does not declare; name its own tools, or use `defer = true` for all of them")]
    DeferUnknown {
        /// The plugin's id.
        plugin: String,
        /// The name it does not declare.
        name: String,
    },

    /// A plugin with this id is already in the registry.
    #[error("plugin id `{0}` is already loaded")]
    DuplicatePlugin(String),

    /// No plugin with this id is in the registry.
    #[error("no plugin `{0}` is loaded")]
    UnknownPlugin(String),

    // ---- assembly (A3, A8, A9) -----------------------------------------------------------
    /// More than one effective section is marked complete; their names.
    #[error("more than one complete section is effective: {}", list(.0))]
    MultipleComplete(Vec<String>),

    /// `tool_order` names tools no loaded plugin declares.
    #[error("tool_order names tools no loaded plugin knows: {}; known tools: {}", list(.unknown), list(.known))]
    UnknownToolOrderName {
        /// The names no plugin declares.
        unknown: Vec<String>,
        /// Every tool the registry knows.
        known: Vec<String>,
    },

    /// A step planned where no plugin may be called needed a call (internal: such a step is
    /// planned again where calls may be made, so no client is answered with it).
    #[error("a plugin call is needed where none may be made")]
    WouldCall,

    /// A plugin's call failed during assembly: an error result or a trap.
    #[error("plugin `{plugin}`, {contribution}: {cause}")]
    PluginCall {
        /// The plugin's id.
        plugin: String,
        /// Which of its contributions was being computed.
        contribution: String,
        /// Its error or trap message.
        cause: String,
        /// A trap (including a time-out or memory cap) rather than an error result.
        trapped: bool,
    },

    /// A review hook rejected the step (Q18): nothing was recorded.
    #[error("plugin `{plugin}` rejected the step in review: {reason}")]
    ReviewRejected {
        /// The plugin's id.
        plugin: String,
        /// The reason it gave.
        reason: String,
    },

    /// A plugin's shown-tools named a tool it does not declare.
    #[error("plugin `{plugin}`: shown-tools returned `{tool}`, which it does not declare")]
    UnknownShownTool {
        /// The plugin's id.
        plugin: String,
        /// The tool it named.
        tool: String,
    },

    // ---- rendering (T3, T4) --------------------------------------------------------------
    /// A `{{...}}` reference in a template is malformed (T3).
    #[error("{location}: malformed reference at byte {offset} (`{snippet}`): {reason}")]
    MalformedReference {
        /// Where the template is: the contribution and its plugin.
        location: String,
        /// The byte offset of the reference in the template.
        offset: usize,
        /// The reference's text, braces included.
        snippet: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A template names a variable no plugin registers (T4).
    #[error("{location}: unknown variable `{name}`; {}", known_vars(.known))]
    UnknownVariable {
        /// Where the template is: the contribution and its plugin.
        location: String,
        /// The variable's name.
        name: String,
        /// The variables that are registered.
        known: Vec<String>,
    },

    // ---- sessions and the daemon (Q, L5) ----------------------------------------------------
    /// The session store failed.
    #[error("session store: {0}")]
    Store(#[from] StoreError),

    /// No session with this id exists.
    #[error("no session `{0}`")]
    UnknownSession(String),

    /// A session has fewer steps than asked for.
    #[error("session `{session}` has no step {step} (it has {steps})")]
    UnknownStep {
        /// The session's id.
        session: String,
        /// The step asked for.
        step: u64,
        /// How many steps the session has.
        steps: u64,
    },

    /// A plugin is quarantined after failing too often (L3), so its call was not made.
    #[error("plugin `{plugin}`: {message}")]
    Quarantined {
        /// The plugin's id.
        plugin: String,
        /// Why it was quarantined.
        message: String,
    },

    /// A request is malformed; the message says how.
    #[error("bad request: {0}")]
    BadRequest(String),

    /// A tool result answers a call id that no assistant message made.
    #[error(
        "tool result answers call `{0}`, but no assistant message in this session made that call"
    )]
    UnknownToolCall(String),

    /// A tool result answers a call that already has one.
    #[error("tool call `{0}` is already answered; each call gets one result")]
    ToolCallAnswered(String),

    /// Calls of the last assistant message that this step leaves unanswered; their ids.
    #[error("tool calls {} are not answered: the step must carry one tool result for each (providers require results right after the call)", quoted(.0))]
    OpenToolCalls(Vec<String>),

    /// A tool result comes after a user message in one step.
    #[error("messages[{tool}] is a tool result after the user message messages[{user}]: put tool results first (providers require results right after the call)")]
    ToolResultsFirst {
        /// The index of the user message.
        user: usize,
        /// The index of the tool result after it.
        tool: usize,
    },

    /// A content block of a message is invalid.
    #[error("content[{index}] ({kind}): {cause}")]
    InvalidBlock {
        /// The block's index in the content.
        index: usize,
        /// The block's type.
        kind: &'static str,
        /// What is wrong with it.
        cause: String,
    },

    /// The session holds content the format cannot render.
    #[error("the {format} format cannot carry {what}; this session needs another format")]
    UnsupportedBlock {
        /// The format's name.
        format: &'static str,
        /// What it cannot carry.
        what: String,
    },

    /// A tool's name breaks the format's rule for names (Gemini's start with a letter or `_`).
    #[error("the {format} format cannot carry tool `{tool}`: {rule}")]
    UnsupportedTool {
        /// The format's name.
        format: &'static str,
        /// The tool.
        tool: String,
        /// The provider's rule it breaks.
        rule: &'static str,
    },

    /// The request cannot fit its budget; the message says what overflowed.
    #[error("context overflow: {0}")]
    ContextOverflow(String),

    /// A compaction request is invalid; the message says why.
    #[error("cannot compact: {0}")]
    InvalidCompaction(String),

    /// A message has no content where some is needed; the rule it breaks.
    #[error("empty message: {0}")]
    EmptyMessage(&'static str),

    /// A tool call's arguments are invalid.
    #[error("tool call `{call}`: {cause}")]
    InvalidArguments {
        /// The call's id.
        call: String,
        /// What is wrong with its arguments.
        cause: String,
    },

    /// A model reply was recorded before the session's first step.
    #[error("no step yet: the model's reply answers a request, so record it after the first step")]
    ReplyBeforeStep,

    /// An error in one message of a request.
    #[error("messages[{index}]: {source}")]
    AtMessage {
        /// The message's index.
        index: usize,
        /// The error in it.
        #[source]
        source: Box<Error>,
    },

    /// A template names a variable whose plugin gave no value this assembly.
    #[error("{location}: variable `{name}` (plugin `{plugin}`) has no value this assembly")]
    VariableAbsent {
        /// Where the template is: the contribution and its plugin.
        location: String,
        /// The variable's name.
        name: String,
        /// The plugin that registers it.
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
            Error::InvalidReads { .. } => "invalid_reads",
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
            Error::WouldCall => "would_call",
            Error::PluginCall { trapped: false, .. } => "plugin_error",
            Error::PluginCall { trapped: true, .. } => "plugin_trap",
            Error::UnknownShownTool { .. } => "unknown_shown_tool",
            Error::DataPluginDeclares { .. } => "data_plugin_declares",
            Error::RefreshUnknown { .. } => "refresh_unknown",
            Error::DeferUnknown { .. } => "defer_unknown",
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
            Error::UnsupportedTool { .. } => "unsupported_tool",
            Error::InvalidArguments { .. } => "invalid_arguments",
            Error::ReplyBeforeStep => "reply_before_step",
            Error::AtMessage { source, .. } => source.code(),
        }
    }
}

/// A result whose error is the core's [`Error`] by default.
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
    /// The stable, machine-readable code.
    pub code: &'static str,
    /// The one-line message.
    pub message: String,
    /// `open_tool_calls` only: the ids of the calls the step leaves unanswered, in the
    /// order the assistant made them (the message names them too, for people).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_ids: Option<Vec<String>>,
}

impl ErrorBody {
    /// An error body with `code` and `message`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            call_ids: None,
        }
    }
}

impl Error {
    /// The tool call ids an `open_tool_calls` error names (through a message's position).
    pub fn call_ids(&self) -> Option<&[String]> {
        match self {
            Error::OpenToolCalls(ids) => Some(ids),
            Error::AtMessage { source, .. } => source.call_ids(),
            _ => None,
        }
    }
}

impl From<&Error> for ErrorBody {
    fn from(e: &Error) -> Self {
        Self {
            call_ids: e.call_ids().map(<[String]>::to_vec),
            ..Self::new(e.code(), e.to_string())
        }
    }
}
