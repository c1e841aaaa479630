//! Bedrock Runtime's `converse` and `converse-stream` through the gateway (G1, G4, G5, G9):
//! the path that names the model, the splice into a client's body (the sections as a text
//! block first in `system`, the runtime context as a text block closing the last user
//! message, the client's `toolConfig.tools` that `deny_tools` names taken out), the client's
//! `messages` read as neutral messages, and a stream's events folded into the one
//! `ConverseResponse` they stand for.
//!
//! Bedrock caches only at the client's own `cachePoint` blocks: they stay where the client put
//! them, and promptd adds none (a model without prompt caching refuses one).

use std::ops::Range;

use serde_json::{json, Map, Value};

use super::body::{elements, members, ClientBody, Member};
use super::edits::{first_member, into_system_list, quoted, remove_items, Contributions, Part};
use super::edits::{Splice, SpliceSettings};
use super::eventstream::Message as Frame;
use super::{GatewayError, Ingress};
use crate::conversation::content::{Block, Content};
use crate::conversation::{Message, ToolCall};

/// A Bedrock path after the gateway's prefix: `/model/{modelId}/converse[-stream]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BedrockPath {
    /// The model id, percent-decoded (an ARN's `/` and a version's `:` come encoded).
    pub model: String,
    /// `converse` or `converse-stream`.
    pub ingress: Ingress,
}

impl BedrockPath {
    /// Reads `path` (after `/gateway/{agent}`, still percent-encoded); `None` when it is no
    /// Converse method.
    pub fn parse(path: &str) -> Option<BedrockPath> {
        let rest = path.strip_prefix("/model/")?;
        let (id, method) = rest.split_once('/')?;
        let ingress = match method {
            "converse" => Ingress::Converse,
            "converse-stream" => Ingress::ConverseStream,
            _ => return None,
        };
        let model = percent_decode(id)?;
        if model.is_empty() || model.chars().any(char::is_control) {
            return None;
        }
        Some(BedrockPath { model, ingress })
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn field<'m>(fields: &'m [Member], key: &str) -> Option<&'m Member> {
    fields.iter().rev().find(|m| m.key == key)
}

/// The elements of `toolConfig.tools`, each with the name of its `toolSpec` (a `cachePoint`
/// element has none).
fn tools(body: &ClientBody<'_>) -> Vec<(Range<usize>, Option<String>)> {
    let text = body.text;
    let Some(config) = body.member("toolConfig") else {
        return Vec::new();
    };
    let Some(list) = members(text, config.value.clone()).and_then(|f| {
        let tools = field(&f, "tools")?;
        elements(text, tools.value.clone())
    }) else {
        return Vec::new();
    };
    list.into_iter()
        .map(|item| {
            let name = members(text, item.clone())
                .and_then(|f| field(&f, "toolSpec").map(|m| m.value.clone()))
                .and_then(|spec| members(text, spec))
                .and_then(|f| field(&f, "name").map(|m| m.value.clone()))
                .and_then(|n| serde_json::from_str::<String>(&text[n]).ok());
            (item, name)
        })
        .collect()
}

/// The names of the client's tool specs, in its order.
pub fn tool_names(body: &ClientBody<'_>) -> Vec<String> {
    tools(body).into_iter().filter_map(|(_, n)| n).collect()
}

/// Plans the splice into a Converse body (G4).
pub(super) fn splice(
    body: &ClientBody<'_>,
    contributions: &Contributions,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    deny_and_defer(body, settings, splice);
    if !contributions.system.is_empty() {
        system(body, &contributions.system, settings, splice)?;
    }
    if let Some(context) = &contributions.runtime_context {
        last_user_block(body, context, splice)?;
    }
    Ok(())
}

fn deny_and_defer(body: &ClientBody<'_>, settings: &SpliceSettings, splice: &mut Splice) {
    let (deny, defer) = (&settings.deny_tools, &settings.defer_tools);
    let tools = tools(body);
    let denied = |i: usize| tools[i].1.as_ref().is_some_and(|n| deny.contains(n));
    if !deny.is_empty() {
        splice.denied.extend(
            (0..tools.len())
                .filter(|&i| denied(i))
                .filter_map(|i| tools[i].1.clone()),
        );
        let spans: Vec<Range<usize>> = tools.iter().map(|(s, _)| s.clone()).collect();
        remove_items(&spans, denied, splice);
    }
    let kept: Vec<String> = (tools.iter().filter_map(|(_, n)| n.clone()))
        .filter(|n| defer.contains(n) && !deny.contains(n))
        .collect();
    if !kept.is_empty() {
        splice.skipped.push(format!(
            "defer_tools: Bedrock Converse has no deferred loading, so these stay loaded: {}",
            kept.join(", ")
        ));
    }
}

/// The sections as one `{"text":…}` block of `system`: first (before the client's blocks and
/// their `cachePoint`s), or last with `client_system = "first"`; the field is made when the
/// client sent none.
fn system(
    body: &ClientBody<'_>,
    system: &str,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let text = body.text;
    let block = format!("{{\"text\":{}}}", quoted(system));
    let Some(member) = body.member("system") else {
        first_member(
            body,
            splice,
            "system",
            &format!("[{block}]"),
            Part::Sections,
        );
        return Ok(());
    };
    let what = "`system` must be an array of system content blocks ([{\"text\":…}])";
    let list = member.value.clone();
    into_system_list(text, list, block, settings.client_system, splice, what)
}

/// The runtime context as a text block closing the last message when it is the user's; after
/// an assistant message (a prefill) it is left out, said in `skipped`.
fn last_user_block(
    body: &ClientBody<'_>,
    context: &str,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let text = body.text;
    let Some(messages) = body.member("messages") else {
        return Ok(());
    };
    let items = elements(text, messages.value.clone()).unwrap_or_default();
    let Some(last) = items.last() else {
        splice
            .skipped
            .push("runtime context: the request has no messages".into());
        return Ok(());
    };
    let fields = members(text, last.clone()).ok_or_else(|| {
        GatewayError::InvalidBody("each of `messages` must be a Message object".into())
    })?;
    if field(&fields, "role").map(|m| &text[m.value.clone()]) != Some("\"user\"") {
        splice
            .skipped
            .push("runtime context: the last message is not the user's".into());
        return Ok(());
    }
    let block = format!("{{\"text\":{}}}", quoted(context));
    let content = field(&fields, "content")
        .ok_or_else(|| GatewayError::InvalidBody("the last message has no `content`".into()))?;
    match elements(text, content.value.clone()) {
        Some(items) => match items.last() {
            Some(item) => splice.push(item.end, format!(",{block}"), Part::RuntimeContext),
            None => splice.push(content.value.start + 1, block, Part::RuntimeContext),
        },
        None => {
            return Err(GatewayError::InvalidBody(
                "the last message's `content` must be an array of content blocks".into(),
            ))
        }
    }
    Ok(())
}

// --- The client's conversation ---------------------------------------------------------------

/// The client's `messages` as neutral messages (G3): an assistant message's text and tool
/// uses; a user message's tool results as tool messages, its other blocks as a user message.
pub(super) fn conversation(messages: Vec<Value>) -> Vec<Message> {
    let mut out = Vec::new();
    for message in messages {
        let blocks = match message.get("content") {
            Some(Value::Array(blocks)) => blocks.as_slice(),
            _ => &[],
        };
        if message.get("role").and_then(Value::as_str) == Some("assistant") {
            let mut text = String::new();
            let mut tool_calls = Vec::new();
            for b in blocks {
                if let Some(t) = b.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                } else if let Some(call) = b.get("toolUse") {
                    let s = |k: &str| call.get(k).and_then(Value::as_str).unwrap_or("");
                    tool_calls.push(ToolCall {
                        id: s("toolUseId").to_string(),
                        name: s("name").to_string(),
                        arguments: call.get("input").cloned().unwrap_or(json!({})),
                        arguments_text: None,
                    });
                }
            }
            out.push(Message::Assistant {
                content: text,
                tool_calls,
                blocks: Vec::new(),
                native: None,
            });
            continue;
        }
        let mut own = Vec::new();
        for b in blocks {
            if let Some(result) = b.get("toolResult") {
                out.push(tool_result(result));
            } else if let Some(t) = b.get("text").and_then(Value::as_str) {
                own.push(Block::Text {
                    text: t.to_string(),
                });
            }
        }
        if !own.is_empty() {
            out.push(Message::User {
                content: match own.as_slice() {
                    [Block::Text { text }] => Content::Text(text.clone()),
                    _ => Content::Blocks(own),
                },
                snapshot: false,
            });
        }
    }
    out
}

fn tool_result(result: &Value) -> Message {
    let id = result
        .get("toolUseId")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut text = String::new();
    if let Some(Value::Array(content)) = result.get("content") {
        for c in content {
            match (c.get("text"), c.get("json")) {
                (Some(Value::String(t)), _) => text.push_str(t),
                (_, Some(j)) => text.push_str(&j.to_string()),
                _ => {}
            }
        }
    }
    Message::Tool {
        tool_call_id: id.to_string(),
        content: Content::Text(text),
        is_error: result.get("status").and_then(Value::as_str) == Some("error"),
    }
}

// --- Streamed replies ------------------------------------------------------------------------

/// A `converse-stream` reply being folded into the `ConverseResponse` it stands for (G5).
#[derive(Debug, Default)]
pub struct Fold {
    role: Option<Value>,
    /// Content blocks by `contentBlockIndex`; a tool use's input as the JSON text its pieces
    /// made.
    blocks: Vec<(Map<String, Value>, Option<String>)>,
    stop_reason: Option<Value>,
    rest: Map<String, Value>,
    stopped: bool,
    metadata: bool,
    error: Option<String>,
}

impl Fold {
    /// Folds one frame in: an event by its `:event-type`, an exception by its
    /// `:exception-type`.
    pub fn push(&mut self, frame: &Frame) {
        if frame.header(":message-type") == Some("exception")
            || frame.header(":message-type") == Some("error")
        {
            let kind = (frame.header(":exception-type"))
                .or_else(|| frame.header(":error-code"))
                .unwrap_or("exception");
            let message = serde_json::from_slice::<Value>(&frame.payload)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_default();
            self.error = Some(format!("{kind}: {message}"));
            return;
        }
        let Ok(Value::Object(event)) = serde_json::from_slice::<Value>(&frame.payload) else {
            return;
        };
        let index = event
            .get("contentBlockIndex")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        match frame.header(":event-type").unwrap_or("") {
            "messageStart" => self.role = event.get("role").cloned(),
            "contentBlockStart" => {
                if let Some(Value::Object(start)) = event.get("start") {
                    let block = self.block(index);
                    if let Some(Value::Object(tool)) = start.get("toolUse") {
                        block
                            .0
                            .insert("toolUse".into(), Value::Object(tool.clone()));
                        block.1.get_or_insert_with(String::new);
                    }
                }
            }
            "contentBlockDelta" => {
                let Some(Value::Object(delta)) = event.get("delta") else {
                    return;
                };
                let block = self.block(index);
                for (key, value) in delta {
                    match (key.as_str(), value) {
                        ("text", Value::String(t)) => append(&mut block.0, "text", t),
                        ("toolUse", v) => {
                            let piece = v.get("input").and_then(Value::as_str).unwrap_or("");
                            block.1.get_or_insert_with(String::new).push_str(piece);
                        }
                        ("reasoningContent", Value::Object(r)) => {
                            let reasoning = block
                                .0
                                .entry("reasoningContent")
                                .or_insert_with(|| json!({"reasoningText": {}}));
                            if let Some(Value::Object(rt)) = reasoning.get_mut("reasoningText") {
                                if let Some(Value::String(t)) = r.get("text") {
                                    append(rt, "text", t);
                                }
                                if let Some(s) = r.get("signature") {
                                    rt.insert("signature".into(), s.clone());
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            "messageStop" => {
                self.stopped = true;
                self.stop_reason = event.get("stopReason").cloned();
                if let Some(fields) = event.get("additionalModelResponseFields") {
                    self.rest
                        .insert("additionalModelResponseFields".into(), fields.clone());
                }
            }
            "metadata" => {
                self.metadata = true;
                for (key, value) in event {
                    self.rest.insert(key, value);
                }
            }
            _ => {}
        }
    }

    fn block(&mut self, index: usize) -> &mut (Map<String, Value>, Option<String>) {
        if self.blocks.len() <= index {
            self.blocks.resize_with(index + 1, Default::default);
        }
        &mut self.blocks[index]
    }

    /// The reply as far as it came; whether the stream reached its end (`messageStop`, then
    /// the `metadata` event that carries the usage); an exception it sent.
    pub fn finish(self) -> (Value, bool, Option<String>) {
        let content: Vec<Value> = (self.blocks.into_iter())
            .map(|(mut block, input)| {
                if let (Some(input), Some(Value::Object(tool))) = (input, block.get_mut("toolUse"))
                {
                    let parsed = match input.trim() {
                        "" => json!({}),
                        text => serde_json::from_str(text).unwrap_or(Value::String(input)),
                    };
                    tool.insert("input".into(), parsed);
                }
                Value::Object(block)
            })
            .collect();
        let mut reply = Map::new();
        reply.insert(
            "output".into(),
            json!({"message": {
                "role": self.role.unwrap_or_else(|| Value::from("assistant")),
                "content": content,
            }}),
        );
        if let Some(reason) = self.stop_reason {
            reply.insert("stopReason".into(), reason);
        }
        reply.extend(self.rest);
        (
            Value::Object(reply),
            self.stopped && self.metadata,
            self.error,
        )
    }
}

fn append(map: &mut Map<String, Value>, key: &str, more: &str) {
    match map.get_mut(key) {
        Some(Value::String(s)) => s.push_str(more),
        _ => {
            map.insert(key.into(), Value::from(more));
        }
    }
}

/// Marks a partial reply with the reason where a finished one has its `stopReason`.
pub fn mark_partial(reply: &mut Value, why: &Value) {
    reply["stopReason"] = why.clone();
}
