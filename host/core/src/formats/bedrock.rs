//! AWS Bedrock `Converse` bodies, in the shape `bedrock-runtime`'s `converse` takes
//! (`converse(**body)`: `modelId`, `system`, `messages`, `toolConfig`, `inferenceConfig`),
//! which is also the REST body with `modelId` from the URL.
//!
//! Bedrock caches only at explicit `cachePoint` blocks. They go where Anthropic's breakpoints
//! go, by the same policy: after the system prompt, after the last tool, and at the end of the
//! last turn (header layout 1), all with the header's TTL; three, under Bedrock's four.
//! Media go as base64 text in `source.bytes`: the JSON the REST API takes. boto3 wants raw
//! bytes there and encodes them itself; the Python client hands it bytes (`step.sdk_kwargs()`).

use serde_json::{json, Map, Value};

use super::gemini::camel;
use super::{settings, Format};
use crate::conversation::content::{Block, Content};
use crate::conversation::{FrozenRequest, Header, Message, Native, ToolSpec, Ttl};

/// Generic model settings that go in `inferenceConfig`, with their Bedrock names.
const INFERENCE: [(&str, &str); 5] = [
    ("max_tokens", "maxTokens"),
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("stop_sequences", "stopSequences"),
    ("stop", "stopSequences"),
];

/// A `cachePoint` block with the header's TTL (the default, 5 minutes, unsaid).
fn cache_point(header: &Header) -> Value {
    match header.cache_ttl {
        Some(Ttl::Hour1) => json!({ "cachePoint": { "type": "default", "ttl": "1h" } }),
        Some(Ttl::Minutes5) | None => json!({ "cachePoint": { "type": "default" } }),
    }
}

/// A Converse body but `messages`.
pub(super) fn head(header: &Header, tools: Option<Value>) -> Map<String, Value> {
    let mut body = Map::new();
    let mut inference = Map::new();
    for (key, value) in settings(&header.model, Format::Bedrock) {
        if key == "model" {
            body.entry("modelId").or_insert(value);
        } else if let Some((_, name)) = INFERENCE.iter().find(|(from, _)| *from == key) {
            let value = match (*name, value) {
                ("stopSequences", Value::String(s)) => json!([s]),
                (_, v) => v,
            };
            inference.entry(name.to_string()).or_insert(value);
        } else if key == "inferenceConfig" {
            // Written in Bedrock's own spelling: it wins over the generic settings.
            if let Value::Object(own) = value {
                inference.extend(own);
            }
        } else {
            body.insert(key, value);
        }
    }
    if !inference.is_empty() {
        body.insert("inferenceConfig".into(), Value::Object(inference));
    }
    if !header.system.is_empty() {
        body.insert(
            "system".into(),
            json!([{ "text": header.system }, cache_point(header)]),
        );
    }
    if let Some(Value::Array(mut tools)) = tools {
        tools.push(cache_point(header));
        let mut config = match body.remove("toolConfig") {
            Some(Value::Object(own)) => own,
            _ => Map::new(),
        };
        config.insert("tools".into(), Value::Array(tools));
        body.insert("toolConfig".into(), Value::Object(config));
    }
    body.remove("messages");
    body
}

/// A tool's `toolSpec` (an empty description left out: Bedrock wants it non-empty).
pub(super) fn tool(tool: &ToolSpec) -> Value {
    let mut spec = Map::new();
    spec.insert("name".into(), json!(tool.name));
    if !tool.description.is_empty() {
        spec.insert("description".into(), json!(tool.description));
    }
    spec.insert("inputSchema".into(), json!({ "json": tool.parameters }));
    json!({ "toolSpec": spec })
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    let mut turns = Vec::new();
    for message in &request.messages {
        push(&mut turns, message);
    }
    let last = turns.pop();
    let mut out: Vec<Value> = turns.into_iter().map(|(r, c)| turn(r, c)).collect();
    out.extend(last.map(|(role, content)| last_turn(&request.header, role, content)));
    out
}

/// A message of the Converse body.
pub(crate) fn turn(role: &'static str, content: Vec<Value>) -> Value {
    // `json!` would copy the content; it is moved in (the same keys in the same order).
    let mut turn = Map::new();
    turn.insert("role".into(), Value::from(role));
    turn.insert("content".into(), Value::Array(content));
    Value::Object(turn)
}

/// The last turn, with the rolling cache point at its end when the header's layout has it.
pub(crate) fn last_turn(header: &Header, role: &'static str, mut content: Vec<Value>) -> Value {
    content.extend(last_cache_point(header));
    turn(role, content)
}

/// The cache point the last turn ends with, when the header's layout has it.
pub(crate) fn last_cache_point(header: &Header) -> Option<Value> {
    (header.layout >= 1).then(|| cache_point(header))
}

/// Adds `message` to `turns`; Converse wants user and assistant in turn, so consecutive
/// messages of one role share a message. A message with no blocks is left out.
pub(crate) fn push(turns: &mut Vec<(&'static str, Vec<Value>)>, message: &Message) {
    let (role, content) = blocks(message);
    if content.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some((last, blocks)) if *last == role => blocks.extend(content),
        _ => turns.push((role, content)),
    }
}

fn blocks(message: &Message) -> (&'static str, Vec<Value>) {
    match message {
        Message::User {
            content: Content::Text(text),
            ..
        } if text.is_empty() => ("user", Vec::new()),
        Message::User {
            content: Content::Text(text),
            ..
        } => ("user", vec![json!({ "text": text })]),
        Message::User {
            content: Content::Blocks(blocks),
            ..
        } => ("user", blocks.iter().filter_map(block).collect()),
        Message::Assistant {
            content,
            tool_calls,
            native,
            ..
        } => {
            if let Some(Native::Bedrock { content }) = native.as_deref() {
                return ("assistant", content.clone());
            }
            let mut out = Vec::with_capacity(tool_calls.len() + 1);
            if !content.is_empty() {
                out.push(json!({ "text": content }));
            }
            for call in tool_calls {
                out.push(json!({ "toolUse": {
                    "toolUseId": call.id, "name": call.name, "input": call.arguments,
                }}));
            }
            ("assistant", out)
        }
        Message::Tool {
            tool_call_id,
            content,
            is_error,
        } => {
            let content = match content {
                Content::Text(text) => vec![json!({ "text": text })],
                Content::Blocks(blocks) => {
                    let out: Vec<Value> = blocks.iter().filter_map(block).collect();
                    if out.is_empty() {
                        vec![json!({ "text": "" })]
                    } else {
                        out
                    }
                }
            };
            let mut result = Map::new();
            result.insert("toolUseId".into(), json!(tool_call_id));
            result.insert("content".into(), Value::Array(content));
            if *is_error {
                result.insert("status".into(), json!("error"));
            }
            ("user", vec![json!({ "toolResult": result })])
        }
    }
}

/// One block as a Converse content block; empty text is left out (Bedrock refuses blank text),
/// and so is media by URL ([`super::unsupported`] refuses it before a step is recorded).
fn block(block: &Block) -> Option<Value> {
    Some(match block {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => json!({ "text": text }),
        Block::Image {
            media_type,
            data: Some(data),
            ..
        } => {
            let format = media_type
                .as_deref()
                .and_then(|m| m.strip_prefix("image/"))
                .unwrap_or("png");
            json!({ "image": { "format": format, "source": { "bytes": data } } })
        }
        Block::Document {
            data: Some(data),
            name,
            ..
        } => json!({ "document": {
            "format": "pdf",
            "name": document_name(name.as_deref()),
            "source": { "bytes": data },
        }}),
        Block::Image { .. } | Block::Document { .. } => return None,
    })
}

/// A document's name as Bedrock takes it: letters, digits, single spaces, hyphens, parentheses
/// and square brackets, 1 to 200 characters. The extension goes (the format says it), any
/// other character becomes a hyphen; no name is `document`.
pub(crate) fn document_name(name: Option<&str>) -> String {
    let name = name.unwrap_or("");
    let stem = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && !ext.contains(' ') => stem,
        _ => name,
    };
    let mut out = String::new();
    for c in stem.chars() {
        let c = if c.is_whitespace() {
            ' '
        } else if c.is_ascii_alphanumeric() || "-()[]".contains(c) {
            c
        } else {
            '-'
        };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        out.push(c);
    }
    let out: String = out.trim_end().chars().take(200).collect();
    let out = out.trim_end().to_string();
    if out.is_empty() {
        "document".into()
    } else {
        out
    }
}

// --- Replies ---------------------------------------------------------------------------------

/// Whether `object` is a Converse response (`output.message`) or a Converse assistant message
/// (content blocks keyed by kind, without Anthropic's `type`).
pub(crate) fn is_reply(object: &Map<String, Value>) -> bool {
    if object
        .get("output")
        .is_some_and(|o| o.get("message").is_some())
    {
        return true;
    }
    object.get("role").and_then(Value::as_str) == Some("assistant")
        && object
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| {
                blocks
                    .iter()
                    .all(|b| b.is_object() && b.get("type").is_none())
                    && blocks.iter().any(|b| {
                        ["text", "toolUse", "reasoningContent"]
                            .iter()
                            .any(|k| b.get(*k).is_some())
                    })
            })
}

/// A `ConverseResponse` or its `output.message` as a message: text and toolUse blocks give its
/// content and calls; every block is kept as it came (reasoning with its signature) for the
/// Bedrock format. Keys in boto3's spelling (the API's).
pub(crate) fn reply(object: Map<String, Value>) -> crate::error::Result<Message> {
    use crate::conversation::ToolCall;
    use crate::error::Error;
    let bad = |m: String| Error::BadRequest(m);
    let message = match object.get("output") {
        Some(output) => output
            .get("message")
            .cloned()
            .ok_or_else(|| bad("a Converse response needs output.message".into()))?,
        None => Value::Object(object),
    };
    let blocks = match message.get("content") {
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => return Err(bad("a Converse message needs a `content` list".into())),
    };
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut kept = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.into_iter().enumerate() {
        let Value::Object(map) = block else {
            return Err(bad(format!("content[{i}] must be an object")));
        };
        if let Some(t) = map.get("text") {
            let t = t
                .as_str()
                .ok_or_else(|| bad(format!("content[{i}].text must be a string")))?;
            if t.is_empty() {
                continue; // Bedrock refuses blank text back
            }
            text.push_str(t);
        } else if let Some(call) = map.get("toolUse") {
            let field = |name: &str| {
                call.get(name)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("content[{i}].toolUse needs `{name}`")))
            };
            let (id, name) = (field("toolUseId")?, field("name")?);
            let input = call.get("input").cloned().unwrap_or(Value::Null);
            let input = match input {
                Value::Null => Value::Object(Map::new()),
                i @ Value::Object(_) => i,
                _ => {
                    return Err(Error::InvalidArguments {
                        call: id,
                        cause: "input must be a JSON object".into(),
                    })
                }
            };
            tool_calls.push(ToolCall {
                id,
                name,
                arguments: input,
                arguments_text: None,
            });
        } else if !["reasoningContent", "citationsContent"]
            .iter()
            .any(|k| map.contains_key(*k))
        {
            let kind = map.keys().next().map_or("?", String::as_str);
            return Err(bad(format!(
                "content[{i}]: block `{}` cannot be recorded (text, toolUse, reasoningContent and citationsContent can)",
                camel(kind)
            )));
        }
        kept.push(Value::Object(map));
    }
    Ok(Message::Assistant {
        content: text,
        tool_calls,
        blocks: Vec::new(),
        native: Some(Box::new(Native::Bedrock { content: kept })),
    })
}
