//! A client's conversation read into neutral messages, for the session log and for telling
//! which messages are new (G3). Lenient by design: the client's bytes go upstream whatever
//! they hold (the log keeps them whole), so what has no neutral shape (a system message in the
//! list, a block type promptd does not know) is left out of this view, never refused.
//!
//! Each message also gets a digest of its neutral form, chained from the first, so "the log
//! holds messages 0..n of this request" is one comparison. The neutral form ignores what a
//! client changes without changing the conversation: `cache_control` marks move, and a single
//! text block is resent as a string (Claude Code does both).

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::body::ClientBody;
use super::Ingress;
use crate::conversation::content::{Block, Content};
use crate::conversation::{Message, ToolCall};

/// The client's conversation: its messages as neutral ones, and the chained digest after each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conversation {
    /// The messages promptd reads, in order.
    pub messages: Vec<Message>,
    /// `digests[i]`: the chain over `messages[..=i]` (hex).
    pub digests: Vec<String>,
}

impl Conversation {
    /// The chain over the first `n` messages ("" for none).
    pub fn digest(&self, n: usize) -> &str {
        match n {
            0 => "",
            n => self.digests.get(n - 1).map_or("", String::as_str),
        }
    }
}

/// Reads the conversation of `body` for `ingress`.
pub fn conversation(ingress: Ingress, body: &ClientBody<'_>) -> Conversation {
    let messages = match ingress {
        Ingress::Messages | Ingress::CountTokens => {
            list(body, "messages").iter().flat_map(anthropic).collect()
        }
        Ingress::ChatCompletions => list(body, "messages").iter().flat_map(chat).collect(),
        Ingress::Responses => match body.decode::<Value>("input").ok().flatten() {
            Some(Value::String(text)) => vec![user(Content::Text(text))],
            Some(Value::Array(items)) => responses(items),
            _ => Vec::new(),
        },
        Ingress::GenerateContent | Ingress::StreamGenerateContent => {
            super::gemini::conversation(list(body, "contents"))
        }
        Ingress::Converse | Ingress::ConverseStream => {
            super::bedrock::conversation(list(body, "messages"))
        }
    };
    let mut chain = String::new();
    let digests = messages
        .iter()
        .map(|m| {
            let mut h = Sha256::new();
            h.update(chain.as_bytes());
            h.update(serde_json::to_vec(m).unwrap_or_default());
            chain = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
            chain.clone()
        })
        .collect();
    Conversation { messages, digests }
}

fn list(body: &ClientBody<'_>, key: &str) -> Vec<Value> {
    match body.decode::<Value>(key).ok().flatten() {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

fn user(content: Content) -> Message {
    Message::User {
        content,
        snapshot: false,
    }
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Content as text when it is text or one text block, else its blocks.
fn content(blocks: Vec<Block>) -> Content {
    match blocks.as_slice() {
        [Block::Text { text }] => Content::Text(text.clone()),
        _ => Content::Blocks(blocks),
    }
}

/// A provider's content part as a neutral block, when it has one.
fn block(part: &Value) -> Option<Block> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    match kind {
        "text" | "input_text" | "output_text" => Some(Block::Text {
            text: s(part.get("text")).unwrap_or_default(),
        }),
        "image" | "document" => {
            let source = part.get("source")?;
            let (media_type, data, url) = (
                s(source.get("media_type")),
                s(source.get("data")),
                s(source.get("url")),
            );
            Some(if kind == "image" {
                Block::Image {
                    media_type,
                    data,
                    url,
                }
            } else {
                Block::Document {
                    media_type,
                    data,
                    url,
                    name: s(part.get("title")),
                }
            })
        }
        "image_url" | "input_image" => {
            let url = part
                .get("image_url")
                .map(|u| u.get("url").unwrap_or(u))
                .and_then(Value::as_str)?;
            Some(Block::Image {
                media_type: None,
                data: None,
                url: Some(url.to_string()),
            })
        }
        _ => None,
    }
}

fn blocks_of(value: &Value) -> Content {
    match value {
        Value::String(text) => Content::Text(text.clone()),
        Value::Array(parts) => content(parts.iter().filter_map(block).collect()),
        _ => Content::Text(String::new()),
    }
}

/// Blocks without their `cache_control` marks.
fn unmarked(blocks: &[Value]) -> Vec<Value> {
    blocks
        .iter()
        .map(|b| match b {
            Value::Object(o) => {
                let mut o: Map<String, Value> = o.clone();
                o.remove("cache_control");
                Value::Object(o)
            }
            other => other.clone(),
        })
        .collect()
}

fn anthropic(message: &Value) -> Vec<Message> {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    let Some(body) = message.get("content") else {
        return Vec::new();
    };
    match (role, body) {
        ("user", Value::String(text)) => vec![user(Content::Text(text.clone()))],
        ("user", Value::Array(parts)) => {
            let mut out = Vec::new();
            let mut own = Vec::new();
            for part in parts {
                if part.get("type").and_then(Value::as_str) == Some("tool_result") {
                    out.push(Message::Tool {
                        tool_call_id: part
                            .get("tool_use_id")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        content: part
                            .get("content")
                            .map_or(Content::Text(String::new()), blocks_of),
                        is_error: part
                            .get("is_error")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    });
                } else if let Some(b) = block(part) {
                    own.push(b);
                }
            }
            if !own.is_empty() {
                out.push(user(content(own)));
            }
            out
        }
        ("assistant", Value::String(text)) => vec![assistant(text.clone(), Vec::new(), Vec::new())],
        ("assistant", Value::Array(parts)) => {
            let text = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("");
            let calls = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("tool_use"))
                .map(|p| ToolCall {
                    id: p
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name: p
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    arguments: p.get("input").cloned().unwrap_or(Value::Object(Map::new())),
                    arguments_text: None,
                })
                .collect();
            vec![assistant(text, calls, unmarked(parts))]
        }
        _ => Vec::new(),
    }
}

fn assistant(content: String, tool_calls: Vec<ToolCall>, blocks: Vec<Value>) -> Message {
    Message::Assistant {
        content,
        tool_calls,
        blocks,
        native: None,
    }
}

/// An OpenAI call's arguments: the object they parse to, and their text as sent.
fn call(id: &str, name: &str, arguments: Option<&Value>) -> ToolCall {
    let text = arguments
        .and_then(Value::as_str)
        .unwrap_or("{}")
        .to_string();
    ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments: serde_json::from_str::<Value>(&text)
            .ok()
            .filter(Value::is_object)
            .unwrap_or(Value::Object(Map::new())),
        arguments_text: Some(text),
    }
}

fn chat(message: &Value) -> Vec<Message> {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    let body = message.get("content").unwrap_or(&Value::Null);
    match role {
        "user" => vec![user(blocks_of(body))],
        "assistant" => {
            let calls = message
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            let f = c.get("function").unwrap_or(&Value::Null);
                            call(
                                c.get("id").and_then(Value::as_str).unwrap_or(""),
                                f.get("name").and_then(Value::as_str).unwrap_or(""),
                                f.get("arguments"),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            vec![assistant(text_of(body), calls, Vec::new())]
        }
        "tool" => vec![Message::Tool {
            tool_call_id: message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            content: blocks_of(body),
            is_error: false,
        }],
        _ => Vec::new(), // system and developer messages are the client's system text
    }
}

fn responses(items: Vec<Value>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    for item in items {
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let s = |k: &str| {
            item.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        match kind {
            "message" => match item.get("role").and_then(Value::as_str) {
                Some("user") => {
                    out.push(user(blocks_of(item.get("content").unwrap_or(&Value::Null))))
                }
                Some("assistant") => out.push(assistant(
                    text_of(item.get("content").unwrap_or(&Value::Null)),
                    Vec::new(),
                    Vec::new(),
                )),
                _ => {}
            },
            "function_call" => {
                let c = call(&s("call_id"), &s("name"), item.get("arguments"));
                // Calls one after another are one reply's.
                match out.last_mut() {
                    Some(Message::Assistant { tool_calls, .. }) => tool_calls.push(c),
                    _ => out.push(assistant(String::new(), vec![c], Vec::new())),
                }
            }
            "function_call_output" => out.push(Message::Tool {
                tool_call_id: s("call_id"),
                content: blocks_of(item.get("output").unwrap_or(&Value::Null)),
                is_error: false,
            }),
            _ => {}
        }
    }
    out
}

/// What a gateway request adds to its session's log (G3).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepMessages {
    /// The first of the client's messages new to the log.
    pub new_from: usize,
    /// Whether the client's messages do not continue what the log holds.
    pub rewrote: bool,
    /// The step's input: the user messages and tool results after the conversation's last
    /// reply, past what the log holds; a result of a call the log does not hold open is left
    /// out (its bytes are in the recorded body).
    pub messages: Vec<Message>,
}

/// What a session holds that decides which messages a gateway step appends: the conversation
/// its last gateway request held (messages and digest), and which calls wait for results.
pub struct Held<'a> {
    /// The last gateway request's conversation, when the session has one.
    pub last: Option<(usize, &'a str)>,
    /// Whether the call with this id waits for its result.
    pub call_open: &'a dyn Fn(&str) -> bool,
    /// The log position of the session's last reply: a Gemini call that came without an id
    /// was named by it (`call_{seq}_{n}`), so a response to it is too.
    pub reply_seq: Option<u64>,
}

/// G10: whether `conversation` carries back a reply to the session's last gateway request
/// (`last`: the messages it held and their digest) that the log does not hold yet (`replied`
/// is false): the client continues the conversation that request held, and the message after it is the model's. Another daemon answered that
/// reply and records it off the answer's path, so the step waits for it; a client resending
/// the request itself (a retry after a cut) carries no reply and waits for nothing.
pub fn awaits_reply(
    last: Option<(usize, &str)>,
    replied: bool,
    conversation: &Conversation,
) -> bool {
    match last {
        Some((n, digest)) if !replied && n < conversation.messages.len() => {
            conversation.digest(n) == digest
                && matches!(conversation.messages[n], Message::Assistant { .. })
        }
        _ => false,
    }
}

/// Which of `conversation`'s messages a step of the session appends. A conversation that
/// continues the last recorded one adds what follows it (the model's reply the client sends
/// back was recorded when it came); one that does not (the first request of a client with
/// history, or a rewrite) adds its newest turn, and says it rewrote when the session had a
/// conversation before.
pub fn step_messages(held: &Held<'_>, conversation: &Conversation) -> StepMessages {
    let all = &conversation.messages;
    let last_reply = all
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }))
        .map_or(0, |i| i + 1);
    let (new_from, rewrote) = match held.last {
        Some((n, digest)) if n <= all.len() && conversation.digest(n) == digest => (n, false),
        Some(_) => (last_reply, true),
        None => (last_reply, false),
    };
    let messages = all[new_from.max(last_reply)..]
        .iter()
        .map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => match super::gemini::resolve_call(tool_call_id, held.reply_seq) {
                Some(id) => Message::Tool {
                    tool_call_id: id,
                    content: content.clone(),
                    is_error: *is_error,
                },
                None => m.clone(),
            },
            m => m.clone(),
        })
        .filter(|m| match m {
            Message::Tool { tool_call_id, .. } => (held.call_open)(tool_call_id),
            Message::User { content, .. } => !content.is_blank(),
            Message::Assistant { .. } => true,
        })
        .collect();
    StepMessages {
        new_from,
        rewrote,
        messages,
    }
}
