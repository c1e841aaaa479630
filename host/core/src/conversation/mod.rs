//! The neutral conversation model: messages, tool calls, the request header, and the frozen
//! request the daemon returns each step. Plain data with serde, rendered into provider bodies
//! by [`crate::formats`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub mod content;

pub use content::{Block, Content};

/// One tool call the model made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The provider's call id; tool results answer it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The call's arguments, a JSON object.
    #[serde(default = "empty_object")]
    pub arguments: Value,
    /// The arguments exactly as the model wrote them, when it wrote a JSON string (OpenAI):
    /// the OpenAI formats send this string back unchanged, so the cached prefix matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_text: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// One message of the conversation, in the project's neutral shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "role", rename_all = "lowercase", deny_unknown_fields)]
pub enum Message {
    /// User input, or a runtime context snapshot (see [`Message::is_snapshot`]).
    User {
        /// Text, or blocks (text, images, documents).
        content: Content,
        /// True for runtime context snapshots the daemon appended (Q2).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        snapshot: bool,
    },
    /// The model's reply: text and/or tool calls.
    Assistant {
        /// The reply's text.
        #[serde(default)]
        content: String,
        /// The tool calls it makes.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// The reply's Anthropic content blocks in their order (text, tool_use, thinking,
        /// redacted_thinking), when it was recorded in Anthropic's shape: the Anthropic format
        /// sends them back as they came, signatures included. `content` and `tool_calls` are
        /// derived from them for the other formats.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        blocks: Vec<Value>,
        /// The reply as Gemini or Bedrock wrote it, when it was recorded in their shape: those
        /// formats send it back as it came (Gemini's thought signatures, Bedrock's reasoning).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        native: Option<Box<Native>>,
    },
    /// A tool's output, answering the call `tool_call_id`.
    Tool {
        /// The call it answers.
        tool_call_id: String,
        /// Text, or blocks (text, images — a screenshot — and documents).
        content: Content,
        /// Whether the tool failed (providers that support it are told).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl Native {
    /// Roughly the bytes of its JSON (its strings, and 64 a part or block).
    fn value_bytes(&self) -> usize {
        let (Native::Gemini { parts: items, .. } | Native::Bedrock { content: items }) = self;
        items.iter().map(|v| 64 + text_bytes(v)).sum()
    }
}

/// The strings' bytes in a JSON value, keys included: what its text is at least.
fn text_bytes(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(text_bytes).sum(),
        Value::Object(m) => m.iter().map(|(k, v)| k.len() + text_bytes(v)).sum(),
        _ => 0,
    }
}

impl Message {
    /// The bytes of text the message carries (its content, blocks' data, tool arguments):
    /// what its JSON is at least, to size a buffer once instead of regrowing it.
    pub fn text_bytes(&self) -> usize {
        let content = |c: &Content| match c {
            Content::Text(t) => t.len(),
            Content::Blocks(blocks) => blocks
                .iter()
                .map(|b| match b {
                    Block::Text { text } => text.len(),
                    Block::Image { data, url, .. } | Block::Document { data, url, .. } => {
                        data.as_ref().or(url.as_ref()).map_or(0, String::len)
                    }
                })
                .sum(),
        };
        match self {
            Message::User { content: c, .. } | Message::Tool { content: c, .. } => content(c),
            Message::Assistant {
                content,
                tool_calls,
                blocks,
                native,
            } => {
                content.len()
                    + tool_calls
                        .iter()
                        .map(|c| {
                            c.id.len()
                                + c.name.len()
                                + c.arguments_text.as_ref().map_or(64, String::len)
                        })
                        .sum::<usize>()
                    + blocks.len() * 64
                    + native.as_ref().map_or(0, |n| n.value_bytes())
            }
        }
    }

    /// A user message of plain text.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: Content::Text(content.into()),
            snapshot: false,
        }
    }

    /// A runtime context snapshot of plain text.
    pub fn snapshot(content: impl Into<String>) -> Self {
        Message::User {
            content: Content::Text(content.into()),
            snapshot: true,
        }
    }

    /// Whether this is a runtime context snapshot the daemon appended (Q2).
    pub fn is_snapshot(&self) -> bool {
        matches!(self, Message::User { snapshot: true, .. })
    }
}

/// A reply's own content in the shape of the provider that wrote it, kept for that provider's
/// format (the others derive theirs from the message's `content` and `tool_calls`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "format", rename_all = "lowercase", deny_unknown_fields)]
pub enum Native {
    /// A Gemini `Content`'s parts in order (text, thought, functionCall…, each with its
    /// `thoughtSignature` as written), and the model that wrote them (`modelVersion`):
    /// signatures go back only to that model.
    Gemini {
        /// The model that wrote the reply, when the response said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// The parts, keys in Gemini's JSON (camelCase) spelling.
        parts: Vec<Value>,
    },
    /// A Bedrock Converse message's content blocks in order (text, toolUse,
    /// reasoningContent…).
    Bedrock {
        /// The content blocks.
        content: Vec<Value>,
    },
}

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// A JSON Schema object, shared with the assembly that gave it: a step compares its
    /// header's tools with the assembly's ([`crate::session::same_header`]), and the same
    /// schema is then one pointer comparison, not a walk of the whole tree.
    pub parameters: std::sync::Arc<Value>,
    /// K9: deferred (`defer = true` in its plugin's config): the id of the plugin that gives
    /// it, which names its namespace. Absent for a tool sent in full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defer: Option<String>,
}

/// The canonical, cacheable part of a request: model settings, system prompt, tools.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Model settings from the config (`model`, `max_tokens`…), passed through to providers.
    #[serde(default)]
    pub model: Map<String, Value>,
    /// The assembled system prompt.
    pub system: String,
    /// The tools, in request order.
    pub tools: Vec<ToolSpec>,
    /// How bodies are laid out (Q8): absent (0) in headers recorded before cache breakpoints
    /// on messages, so an old step still rebuilds to its old bytes; [`LAYOUT`] since.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub layout: u32,
    /// The session's key for OpenAI's prompt cache (`prompt_cache_key`), sent in the OpenAI
    /// formats only; none in headers recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_key: Option<String>,
    /// The TTL of Anthropic's cache breakpoints when it is not the default 5 minutes
    /// (`[agents.NAME.cache] ttl = "1h"`); none in headers that use the default, so their
    /// bytes are what they were before the setting existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ttl: Option<Ttl>,
}

/// The TTL a `cache_control` marker asks for: how long an Anthropic cache entry lives after
/// its last write or hit (`[agents.NAME.cache] ttl`, recorded in the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Ttl {
    /// `{"type": "ephemeral"}`: 5 minutes.
    #[serde(rename = "5m")]
    Minutes5,
    /// `{"type": "ephemeral", "ttl": "1h"}`.
    #[serde(rename = "1h")]
    Hour1,
}

/// The body layout new headers record: 1 adds Anthropic's breakpoint on the last message.
pub const LAYOUT: u32 = 1;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What the model sees at one step: the header and every message derived from the log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FrozenRequest {
    /// The header: model settings, system prompt and tools.
    pub header: Header,
    /// Every message, from the log.
    pub messages: Vec<Message>,
    /// The tools shown at this step when the agent keeps every tool in the header
    /// (`tool_subset = "allowed_tools"`); `None` when `header.tools` are the shown ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_tools: Option<Vec<String>>,
}
