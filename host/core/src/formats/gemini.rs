//! Google Gemini `generateContent` bodies, in the shape the official SDKs' `generate_content`
//! takes (`{model, contents, config}`, keys in the API's JSON spelling), so
//! `client.models.generate_content(**body)` sends it unchanged. `config` holds what the REST
//! body has beside `contents`: `systemInstruction`, `tools`, and the generation settings
//! (the REST body nests those under `generationConfig`; docs/formats.md shows the mapping).
//!
//! Gemini caches implicitly (no markers). What costs errors is the thought signatures: a reply
//! recorded in Gemini's shape keeps its parts ([`Native::Gemini`]) and goes back as it came,
//! signatures byte for byte, to the model that wrote it. To another model, or for calls
//! recorded in another provider's shape, signatures cannot carry over: the first function call
//! of each model turn carries the dummy signature Gemini documents for calls it did not write
//! ([`SKIP_SIGNATURE`]), and the other model's signatures are left out.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::{settings, Format};
use crate::conversation::content::{Block, Content};
use crate::conversation::{FrozenRequest, Header, Message, Native, ToolSpec};

/// The signature Gemini's thought-signature guide gives for function calls it did not write
/// (another model's, or made by hand): it skips the check.
pub const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

/// Generic model settings under their Gemini names (the others are camel-cased).
const RENAMED: [(&str, &str); 2] = [("max_tokens", "maxOutputTokens"), ("stop", "stopSequences")];

/// `snake_case` as `camelCase` (a key already camel-cased stays).
pub(crate) fn camel(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' && !out.is_empty() {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The model the body asks for, without the `models/` prefix.
pub(crate) fn model_of(header: &Header) -> Option<&str> {
    super::setting(&header.model, Format::Gemini, "model")
        .and_then(Value::as_str)
        .map(|m| m.trim_start_matches("models/"))
}

/// A Gemini body but `contents`.
pub(super) fn head(header: &Header, tools: Option<Value>) -> Map<String, Value> {
    let mut body = Map::new();
    let mut config = Map::new();
    for (key, value) in settings(&header.model, Format::Gemini) {
        if key == "model" {
            body.insert(key, value);
            continue;
        }
        let renamed = RENAMED.iter().find(|(from, _)| *from == key);
        let name = renamed.map_or_else(|| camel(&key), |(_, to)| to.to_string());
        let value = match (name.as_str(), value) {
            ("stopSequences", Value::String(s)) => json!([s]),
            (_, v) => v,
        };
        // A setting written in Gemini's own spelling wins over a generic one.
        if name == key {
            config.insert(name, value);
        } else {
            config.entry(name).or_insert(value);
        }
    }
    if !header.system.is_empty() {
        config.insert(
            "systemInstruction".into(),
            json!({ "parts": [{ "text": header.system }] }),
        );
    }
    match tools {
        Some(tools) => config.insert("tools".into(), tools),
        None => config.remove("tools"),
    };
    if !config.is_empty() {
        body.insert("config".into(), Value::Object(config));
    }
    body
}

/// The tools, as one tool of function declarations (JSON Schema parameters as they are).
pub(super) fn tools(tools: &[&ToolSpec]) -> Value {
    let declarations: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "parametersJsonSchema": t.parameters,
            })
        })
        .collect();
    json!([{ "functionDeclarations": declarations }])
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    let model = model_of(&request.header);
    let mut state = State::default();
    for message in &request.messages {
        state.push(message, model);
    }
    state.turns.into_iter().map(|(r, p)| turn(r, p)).collect()
}

/// A `Content`.
pub(crate) fn turn(role: &'static str, parts: Vec<Value>) -> Value {
    // `json!` would copy the parts; they are moved in (the same keys in the same order).
    let mut turn = Map::new();
    turn.insert("role".into(), Value::from(role));
    turn.insert("parts".into(), Value::Array(parts));
    Value::Object(turn)
}

/// What rendering messages one by one needs to remember: the turns so far (consecutive
/// messages of one role share a `Content`), and each call's name, for its response.
#[derive(Clone, Debug, Default)]
pub(crate) struct State {
    /// Each turn's role and parts; the last one is still open.
    pub turns: Vec<(&'static str, Vec<Value>)>,
    /// Call id → (function name, whether its `functionCall` part carries the id).
    calls: HashMap<String, (String, bool)>,
}

impl State {
    /// Adds `message` for a body asking for `model`.
    pub fn push(&mut self, message: &Message, model: Option<&str>) {
        match message {
            Message::User { content, .. } => {
                let parts = content_parts(content);
                self.extend("user", parts, Vec::new());
            }
            Message::Assistant {
                content,
                tool_calls,
                native,
                ..
            } => {
                let parts = match native.as_deref() {
                    Some(Native::Gemini {
                        model: wrote,
                        parts,
                    }) => {
                        self.remember_native(tool_calls, parts);
                        let same = match (wrote.as_deref(), model) {
                            (Some(w), Some(m)) => w.trim_start_matches("models/") == m,
                            _ => true,
                        };
                        if same {
                            parts.clone()
                        } else {
                            foreign(parts.clone())
                        }
                    }
                    _ => {
                        let mut parts = Vec::with_capacity(tool_calls.len() + 1);
                        if !content.is_empty() {
                            parts.push(json!({ "text": content }));
                        }
                        for call in tool_calls {
                            self.calls
                                .insert(call.id.clone(), (call.name.clone(), true));
                            parts.push(json!({ "functionCall": {
                                "id": call.id, "name": call.name, "args": call.arguments,
                            }}));
                        }
                        foreign(parts)
                    }
                };
                self.extend("model", parts, Vec::new());
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let (name, with_id) = self
                    .calls
                    .get(tool_call_id)
                    .cloned()
                    .unwrap_or_else(|| (String::new(), true));
                let key = if *is_error { "error" } else { "output" };
                let mut response = Map::new();
                response.insert("name".into(), json!(name));
                response.insert("response".into(), json!({ key: content.text() }));
                if with_id {
                    response.insert("id".into(), json!(tool_call_id));
                }
                let media = content
                    .blocks()
                    .iter()
                    .filter(|b| !matches!(b, Block::Text { .. }))
                    .filter_map(part)
                    .collect();
                self.extend(
                    "user",
                    vec![json!({ "functionResponse": Value::Object(response) })],
                    media,
                );
            }
        }
    }

    /// The calls of a reply recorded in Gemini's shape: the n-th `functionCall` part is the
    /// n-th call; its response carries an id only if the part did.
    fn remember_native(&mut self, calls: &[crate::conversation::ToolCall], parts: &[Value]) {
        let with_ids = parts
            .iter()
            .filter_map(|p| p.get("functionCall"))
            .map(|c| c.get("id").is_some_and(|id| !id.is_null()));
        for (call, with_id) in calls.iter().zip(with_ids) {
            self.calls
                .insert(call.id.clone(), (call.name.clone(), with_id));
        }
    }

    /// Adds `responses` (function responses, after those already in an open user turn) and
    /// `tail` (everything else, at its end) to the turn of `role`.
    fn extend(&mut self, role: &'static str, responses: Vec<Value>, tail: Vec<Value>) {
        if responses.is_empty() && tail.is_empty() {
            return;
        }
        match self.turns.last_mut() {
            Some((last, parts)) if *last == role => {
                let at = parts
                    .iter()
                    .rposition(|p| p.get("functionResponse").is_some())
                    .map_or(parts.len(), |i| i + 1);
                let at = if responses
                    .first()
                    .is_some_and(|p| p.get("functionResponse").is_some())
                {
                    at
                } else {
                    parts.len()
                };
                parts.splice(at..at, responses);
                parts.extend(tail);
            }
            _ => {
                let mut parts = responses;
                parts.extend(tail);
                self.turns.push((role, parts));
            }
        }
    }
}

/// A model turn Gemini did not write for this model: no signatures but the dummy one on its
/// first function call.
fn foreign(mut parts: Vec<Value>) -> Vec<Value> {
    for part in &mut parts {
        if let Value::Object(map) = part {
            map.remove("thoughtSignature");
        }
    }
    if let Some(Value::Object(first)) = parts.iter_mut().find(|p| p.get("functionCall").is_some()) {
        first.insert("thoughtSignature".into(), json!(SKIP_SIGNATURE));
    }
    parts
}

/// A user message's or tool result's content as parts (empty text left out: Gemini refuses it).
fn content_parts(content: &Content) -> Vec<Value> {
    match content {
        Content::Text(text) if text.is_empty() => Vec::new(),
        Content::Text(text) => vec![json!({ "text": text })],
        Content::Blocks(blocks) => blocks.iter().filter_map(part).collect(),
    }
}

/// One block as a part: text, `inlineData` (base64) or `fileData` (by URL).
fn part(block: &Block) -> Option<Value> {
    Some(match block {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => json!({ "text": text }),
        Block::Image {
            media_type,
            data,
            url,
        }
        | Block::Document {
            media_type,
            data,
            url,
            ..
        } => match (data, url) {
            (Some(data), _) => json!({ "inlineData": { "mimeType": media_type, "data": data } }),
            (None, url) => json!({ "fileData": { "fileUri": url } }),
        },
    })
}

// --- Replies ---------------------------------------------------------------------------------

/// `value` with its keys camel-cased (Python SDKs dump `function_call`, `thought_signature`),
/// except inside a call's `args` and a response's `response`, which are data.
pub(crate) fn camel_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let k = camel(&k);
                    let v = if k == "args" || k == "response" {
                        v
                    } else {
                        camel_keys(v)
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(camel_keys).collect()),
        other => other,
    }
}

/// Whether `object` is a Gemini response (`candidates`) or `Content` (`parts`, role `model`).
pub(crate) fn is_reply(object: &Map<String, Value>) -> bool {
    object.contains_key("candidates")
        || (object.contains_key("parts")
            && object.get("role").and_then(Value::as_str) == Some("model"))
}

/// A `GenerateContentResponse` (its first candidate) or a model `Content` as a message; keys
/// in either spelling, kept in the JSON one. A `functionCall` without an `id` gets an empty one
/// (the daemon names it when it records the reply).
pub(crate) fn reply(object: Map<String, Value>) -> crate::error::Result<Message> {
    use crate::conversation::ToolCall;
    use crate::error::Error;
    let bad = |m: String| Error::BadRequest(m);
    let Value::Object(object) = camel_keys(Value::Object(object)) else {
        unreachable!("an object stays an object")
    };
    let model = object
        .get("modelVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    let content = match object.get("candidates") {
        Some(candidates) => {
            let first = candidates.get(0).ok_or_else(|| {
                bad("a Gemini response needs a candidate (was it blocked?)".into())
            })?;
            first.get("content").cloned().ok_or_else(|| {
                bad(format!(
                    "candidates[0] has no content (finishReason {})",
                    first.get("finishReason").unwrap_or(&Value::Null)
                ))
            })?
        }
        None => Value::Object(object),
    };
    let parts = match content.get("parts") {
        Some(Value::Array(parts)) => parts.clone(),
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(bad("a Gemini content's `parts` must be a list".into())),
    };
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let Some(map) = part.as_object() else {
            return Err(bad(format!("parts[{i}] must be an object")));
        };
        if let Some(call) = map.get("functionCall") {
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad(format!("parts[{i}].functionCall needs a name")))?;
            let id = call.get("id").and_then(Value::as_str).unwrap_or("");
            let arguments = match call.get("args") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(args @ Value::Object(_)) => args.clone(),
                Some(_) => {
                    return Err(Error::InvalidArguments {
                        call: if id.is_empty() { name } else { id }.to_string(),
                        cause: "args must be a JSON object".into(),
                    })
                }
            };
            tool_calls.push(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments,
                arguments_text: None,
            });
        } else if let Some(t) = map.get("text") {
            let t = t
                .as_str()
                .ok_or_else(|| bad(format!("parts[{i}].text must be a string")))?;
            if map.get("thought") != Some(&Value::Bool(true)) {
                text.push_str(t);
            }
        }
    }
    Ok(Message::Assistant {
        content: text,
        tool_calls,
        blocks: Vec::new(),
        native: Some(Box::new(Native::Gemini { model, parts })),
    })
}
