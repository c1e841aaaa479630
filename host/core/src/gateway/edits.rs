//! The splice's vocabulary (G4): what promptd adds to a client's body, how an agent's splice
//! is made, and the byte edits that carry it, with the helpers every ingress's splice uses.
//! Apart from [`super::splice`], so an ingress planned in a module of its own
//! ([`super::gemini`]) uses them without importing the dispatch that calls it.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::body::{elements, first_byte, ClientBody};
use super::GatewayError;

/// What promptd adds to a client's request: the agent's assembled sections (its system
/// text) and its runtime context snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contributions {
    /// The sections' text, in canonical order (empty: none).
    pub system: String,
    /// The runtime context snapshot, when the agent has one.
    pub runtime_context: Option<String>,
    /// The tools promptd runs itself (G13), spliced before the client's.
    pub tools: Vec<crate::conversation::ToolSpec>,
}

/// Where the client's own system text sits among the agent's sections
/// (`[agents.NAME.gateway] client_system`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientSystem {
    /// After the sections (the default): the sections, stable, start the prompt, before any
    /// breakpoint the client put in its own system text.
    #[default]
    Last,
    /// Before the sections.
    First,
}

/// How an agent's splice is made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpliceSettings {
    /// Where the client's system text sits among the sections.
    pub client_system: ClientSystem,
    /// Client tools taken out of the request (`[agents.NAME.gateway] deny_tools`).
    pub deny_tools: Vec<String>,
    /// Client tools marked for deferred loading where the endpoint has it
    /// (`[agents.NAME.gateway] defer_tools`).
    pub defer_tools: Vec<String>,
}

/// The part of promptd's contribution an edit carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The agent's sections, joined to the client's system text.
    Sections,
    /// The runtime context snapshot, after the client's last message.
    RuntimeContext,
    /// The JSON that wraps a client's value so a part can join it (a string system prompt
    /// made a list of blocks, …): the client's value itself is inside, unchanged.
    Wrap,
    /// `stream_options.include_usage`, asked for so a streamed reply can be costed (G5).
    IncludeUsage,
    /// A client tool the agent's `deny_tools` takes out: the edit removes its bytes.
    DenyTool,
    /// `"defer_loading":true`, the first member of a client tool the agent's `defer_tools`
    /// names: the tool is loaded only when the client's tool-search tool finds it.
    DeferTool,
    /// The tools promptd runs itself (G13), before the client's; in a round of promptd's own
    /// calls, the model's turn and the results appended to the conversation.
    OwnTools,
    /// promptd's own calls and results put back at their place in a client's later body
    /// (G13): the client's history lacks them.
    Restored,
}

/// One edit of the client's body: `remove` bytes at `at` replaced by `insert`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edit {
    /// Where, in the client's bytes.
    pub at: usize,
    /// How many of the client's bytes it replaces (0: an insertion; only a `null`, `false`
    /// or empty string the part stands in for is ever replaced).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub remove: usize,
    /// What goes there.
    pub insert: String,
    /// What it carries.
    pub part: Part,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The edits that make the upstream body of a client's body, and what they say of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Splice {
    /// The edits in the order of their position.
    pub edits: Vec<Edit>,
    /// Whether promptd asked for a streamed reply's usage the client did not ask for: the
    /// client is not shown it (G5).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub usage_added: bool,
    /// The breakpoints the client set.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub client_breakpoints: usize,
    /// Whether promptd added a breakpoint of its own (never past the provider's limit).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub breakpoint_added: bool,
    /// The client tools taken out (`deny_tools`), in the client's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// The client tools promptd marked for deferred loading (`defer_tools`), in the client's
    /// order; a tool the client gave its own `defer_loading` is not among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deferred: Vec<String>,
    /// The tools promptd runs itself (G13), spliced in before the client's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_tools: Vec<String>,
    /// A part that had no place in this body, and why (e.g. the runtime context when the
    /// client's last message is the model's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl Splice {
    /// The upstream body: `client` with the edits applied.
    pub fn apply(&self, client: &[u8]) -> Vec<u8> {
        let added: usize = self.edits.iter().map(|e| e.insert.len()).sum();
        let mut out = Vec::with_capacity(client.len() + added);
        let mut at = 0;
        for edit in &self.edits {
            let start = edit.at.min(client.len()).max(at);
            out.extend_from_slice(&client[at..start]);
            out.extend_from_slice(edit.insert.as_bytes());
            at = (start + edit.remove).min(client.len());
        }
        out.extend_from_slice(&client[at..]);
        out
    }

    /// The bytes promptd added.
    pub fn added_bytes(&self) -> usize {
        self.edits.iter().map(|e| e.insert.len()).sum()
    }

    pub(super) fn push(&mut self, at: usize, insert: String, part: Part) {
        self.replace(at..at, insert, part);
    }

    pub(super) fn replace(&mut self, range: Range<usize>, insert: String, part: Part) {
        self.edits.push(Edit {
            at: range.start,
            remove: range.len(),
            insert,
            part,
        });
    }
}

/// A JSON string literal of `text`.
pub(super) fn quoted(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// `item` (promptd's block) joined to the client's system list at `list` (its JSON value):
/// the list made when it is `null`, else put before the client's blocks, after them
/// ([`ClientSystem::First`]) or into an empty list. Anything but a list or null is refused as
/// `what` says a list must be.
pub(super) fn into_system_list(
    text: &str,
    list: Range<usize>,
    item: String,
    client_system: ClientSystem,
    splice: &mut Splice,
    what: &str,
) -> Result<(), GatewayError> {
    match first_byte(&text[list.clone()]) {
        b'n' => splice.replace(list, format!("[{item}]"), Part::Sections),
        b'[' => {
            let items = elements(text, list.clone()).unwrap_or_default();
            match (items.first(), items.last(), client_system) {
                (Some(first), _, ClientSystem::Last) => {
                    splice.push(first.start, format!("{item},"), Part::Sections)
                }
                (_, Some(last), ClientSystem::First) => {
                    splice.push(last.end, format!(",{item}"), Part::Sections)
                }
                _ => splice.push(list.start + 1, item, Part::Sections),
            }
        }
        _ => return Err(GatewayError::InvalidBody(what.into())),
    }
    Ok(())
}

/// Inserts member `"key":value` as the body's first member.
pub(super) fn first_member(
    body: &ClientBody<'_>,
    splice: &mut Splice,
    key: &str,
    value: &str,
    part: Part,
) {
    let comma = if body.members.is_empty() { "" } else { "," };
    splice.push(
        body.open + 1,
        format!("{}:{value}{comma}", quoted(key)),
        part,
    );
}

/// Removes the elements of a list (`items`, in order) that `remove` picks. Each run of them
/// goes with the commas that join it: up to the next kept element, or, for a run at the end,
/// from the end of the kept element before it.
pub(super) fn remove_items(
    items: &[Range<usize>],
    remove: impl Fn(usize) -> bool,
    splice: &mut Splice,
) {
    let mut i = 0;
    while i < items.len() {
        if !remove(i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < items.len() && remove(i) {
            i += 1;
        }
        let range = match (items.get(i), start.checked_sub(1)) {
            (Some(next), _) => items[start].start..next.start,
            (None, Some(kept)) => items[kept].end..items[i - 1].end,
            (None, None) => items[start].start..items[i - 1].end,
        };
        splice.replace(range, String::new(), Part::DenyTool);
    }
}
