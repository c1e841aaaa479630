//! What an assembly takes and gives: the options taken from the config, the assembly with its
//! tools, and who gave each part ([`Explain`]) or was left out ([`Omission`]).

use std::sync::Arc;

/// Per-assembly choices taken from the config.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `tool_order` from the config, already validated (R6).
    pub tool_order: Option<std::sync::Arc<[String]>>,
    /// False suppresses the runtime context for this agent (A4); contexts are then not called.
    pub suppress_runtime_context: bool,
    /// The agent's `tool_subset = "allowed_tools"`: `tools` keeps every tool the agent can
    /// see, and [`Assembly::shown_tools`] says which of them this step shows (A6).
    pub keep_all_tools: bool,
    /// The secret `data` plugins' blocks are keyed with (T8): the session's, so every step
    /// of a session fences alike and no plugin can guess the key.
    pub data_secret: std::sync::Arc<str>,
}

/// The result of one assembly.
#[derive(Clone, Debug, PartialEq)]
pub struct Assembly {
    /// T5: interpolated section texts, empty ones dropped, joined by one blank line.
    pub system: String,
    /// T6: the runtime context snapshot text, or `None` when every context is empty.
    pub runtime_context: Option<String>,
    /// The tools shown this step, in `tool_order` (with [`Options::keep_all_tools`], every
    /// tool the agent can see). Shared with other assemblies of the same registry snapshot,
    /// chain and options when no plugin filters tools (they are then the same every step).
    pub tools: Arc<[AssembledTool]>,
    /// With [`Options::keep_all_tools`], the names of `tools` shown this step, in order.
    pub shown_tools: Option<Vec<String>>,
    /// Each section's and context's interpolated text by name, in output order (empty ones
    /// included), so a budget can say what each one costs. Shared: a static text is the one
    /// the layout rendered at load, not a copy per step.
    pub sections: Vec<(Arc<str>, Arc<str>)>,
    /// Each context's interpolated text by name, in output order (empty ones included).
    pub contexts: Vec<(Arc<str>, Arc<str>)>,
    /// Which plugin gave each effective contribution.
    pub explain: Explain,
    /// Optional plugins left out because a call failed (A9).
    pub omitted: Vec<Omission>,
    /// The plugin calls it made.
    pub called: usize,
    /// The contributions that kept their answer from the session's earlier step, without a
    /// call (world 0.3.0): `plugin kind \`name\``, in the order they were asked for.
    pub reused: Vec<Arc<str>>,
}

/// One tool of a request, as assembly resolved it.
#[derive(Clone, Debug, PartialEq)]
pub struct AssembledTool {
    /// The tool's name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The declared schema, parsed once at load (A6): shared, never mutated.
    pub parameters: Arc<serde_json::Value>,
    /// K9: the id of the plugin that gives it, when its config defers it.
    pub defer: Option<Arc<str>>,
}

/// Which plugin gave each effective contribution, in output order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Explain {
    /// Who gave each effective section, in output order; shared by every assembly of the
    /// same registry snapshot, chain and options.
    pub sections: Arc<[Origin]>,
    /// Who gave each effective context, in output order; shared as `sections` is.
    pub contexts: Arc<[Origin]>,
    /// Who gave each variable the texts referenced; shared with other assemblies of the same
    /// layout when only its fixed texts reference any.
    pub variables: Arc<[Origin]>,
    /// Who gave each tool shown, in output order; shared as [`Assembly::tools`] is.
    pub tools: Arc<[Origin]>,
}

/// One effective contribution and the plugin that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The contribution's name.
    pub name: String,
    /// The plugin's id.
    pub plugin: String,
    /// The effective scope key.
    pub scope: String,
}

/// An optional plugin's contribution left out of an assembly because its call failed (A9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Omission {
    /// The plugin's id.
    pub plugin: String,
    /// Which of its contributions failed.
    pub contribution: String,
    /// Why the call failed.
    pub cause: String,
}
