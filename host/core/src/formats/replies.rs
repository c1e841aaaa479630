//! A model's reply as the official SDKs return it, turned into a neutral [`Message`] so an
//! agent loop records it without conversion code (Q5):
//!
//! - the neutral shape (`{"role": "assistant", "content", "tool_calls": [{id, name,
//!   arguments}]}`; `arguments` may be the JSON text of an object);
//! - an OpenAI Chat Completions message (`choices[0].message`, or the whole completion):
//!   `tool_calls[].function.arguments` is kept as written, so the OpenAI formats send it back
//!   byte for byte;
//! - Anthropic Messages content (`{"role": "assistant", "content": [blocks]}`, or the whole
//!   message object): text, tool_use, thinking and redacted_thinking blocks are kept in their
//!   order and sent back unchanged in the Anthropic format (signatures included); the other
//!   formats see their text and tool calls, not the thinking;
//! - OpenAI Responses output (`{"output": [items]}`, or the whole response): message and
//!   function_call items; reasoning items are left out (the other formats have no place for
//!   them);
//! - a Gemini `GenerateContentResponse` (its first candidate) or model `Content`, keys in
//!   either spelling: its parts are kept in order, thought signatures exactly as written, and
//!   sent back in the Gemini format to the model that wrote them (`modelVersion`); a
//!   `functionCall` without an `id` is named `call_{seq}_{n}` when recorded ([`name_calls`]);
//! - a Bedrock `ConverseResponse` or its `output.message`: its content blocks (text, toolUse,
//!   reasoningContent, citationsContent) are kept and sent back in the Bedrock format.
//!
//! ```
//! use promptd_core::formats::replies::reply;
//! use promptd_core::conversation::Message;
//! let openai = serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
//!     {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\": 1}"}}]});
//! let Message::Assistant { tool_calls, .. } = reply(openai).unwrap() else { panic!() };
//! assert_eq!(tool_calls[0].arguments, serde_json::json!({"p": 1}));
//! assert_eq!(tool_calls[0].arguments_text.as_deref(), Some("{\"p\": 1}"));
//! ```

use serde_json::{Map, Value};

use crate::conversation::{Message, ToolCall};
use crate::error::{Error, Result};
use crate::formats::Format;

/// Token counts the provider reported for a reply, in one shape whatever the provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProviderUsage {
    /// Input tokens, cached ones included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Input tokens written to the cache (Anthropic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Of `cache_write_tokens`, those written to live 1 hour (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`; 1-hour writes cost more), when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h_tokens: Option<u64>,
}

impl ProviderUsage {
    /// Reads OpenAI Chat (`prompt_tokens`, `prompt_tokens_details.cached_tokens`), Responses
    /// (`input_tokens`, `input_tokens_details.cached_tokens`), Anthropic (`input_tokens`
    /// without the cache, `cache_read_input_tokens`, `cache_creation_input_tokens` and its
    /// `cache_creation.ephemeral_1h_input_tokens` part), Gemini's `usageMetadata`
    /// (`promptTokenCount` with the cache, `cachedContentTokenCount`, output
    /// `candidatesTokenCount` plus `thoughtsTokenCount`), Bedrock's (`inputTokens` without the
    /// cache, `cacheReadInputTokens`, `cacheWriteInputTokens`, `cacheDetails` by TTL) or this
    /// shape itself.
    pub fn from_value(v: &Value) -> Option<ProviderUsage> {
        if let Some(usage) = Self::gemini_or_bedrock(v) {
            return (usage != ProviderUsage::default()).then_some(usage);
        }
        let n = |path: &[&str]| {
            let mut at = v;
            for k in path {
                at = at.get(*k)?;
            }
            at.as_u64()
        };
        let anthropic = v.get("cache_read_input_tokens").is_some()
            || v.get("cache_creation_input_tokens").is_some();
        let usage = if anthropic {
            let read = n(&["cache_read_input_tokens"]).unwrap_or(0);
            let write = n(&["cache_creation_input_tokens"]).unwrap_or(0);
            ProviderUsage {
                // Anthropic's input_tokens leave out what the cache read and wrote.
                input_tokens: n(&["input_tokens"]).map(|i| i + read + write),
                output_tokens: n(&["output_tokens"]),
                cached_tokens: Some(read),
                cache_write_tokens: Some(write),
                cache_write_1h_tokens: n(&["cache_creation", "ephemeral_1h_input_tokens"]),
            }
        } else {
            ProviderUsage {
                input_tokens: n(&["prompt_tokens"]).or(n(&["input_tokens"])),
                output_tokens: n(&["completion_tokens"]).or(n(&["output_tokens"])),
                cached_tokens: n(&["prompt_tokens_details", "cached_tokens"])
                    .or(n(&["input_tokens_details", "cached_tokens"]))
                    .or(n(&["cached_tokens"])),
                cache_write_tokens: n(&["cache_write_tokens"]),
                cache_write_1h_tokens: n(&["cache_write_1h_tokens"]),
            }
        };
        (usage != ProviderUsage::default()).then_some(usage)
    }
}

impl ProviderUsage {
    /// Gemini's or Bedrock's usage (keys in either spelling), if `v` is one.
    fn gemini_or_bedrock(raw: &Value) -> Option<ProviderUsage> {
        let gemini = super::gemini::camel_keys(raw.clone());
        let n = |k: &str| gemini.get(k).and_then(Value::as_u64);
        if gemini.get("promptTokenCount").is_some() || gemini.get("candidatesTokenCount").is_some()
        {
            let output = match (n("candidatesTokenCount"), n("thoughtsTokenCount")) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            };
            return Some(ProviderUsage {
                input_tokens: n("promptTokenCount"),
                output_tokens: output,
                cached_tokens: Some(n("cachedContentTokenCount").unwrap_or(0)),
                cache_write_tokens: None,
                cache_write_1h_tokens: None,
            });
        }
        // Bedrock's keys are camel-cased in boto3's dicts too (Anthropic's `input_tokens` are not).
        let v = raw;
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        if v.get("inputTokens").is_some() || v.get("outputTokens").is_some() {
            let read = n("cacheReadInputTokens").unwrap_or(0);
            let write = n("cacheWriteInputTokens").unwrap_or(0);
            let hour = v.get("cacheDetails").and_then(Value::as_array).map(|d| {
                d.iter()
                    .filter(|d| d.get("ttl").and_then(Value::as_str) == Some("1h"))
                    .filter_map(|d| d.get("inputTokens").and_then(Value::as_u64))
                    .sum()
            });
            return Some(ProviderUsage {
                // Bedrock's inputTokens leave out what the cache read and wrote.
                input_tokens: n("inputTokens").map(|i| i + read + write),
                output_tokens: n("outputTokens"),
                cached_tokens: Some(read),
                cache_write_tokens: Some(write),
                cache_write_1h_tokens: hour,
            });
        }
        None
    }
}

/// [`reply`], and the provider's usage when the body carries one (a whole completion,
/// message or response, or a `usage` key beside the message).
pub fn reply_with_usage(value: Value) -> Result<(Message, Option<ProviderUsage>)> {
    let mut value = value;
    let usage = match &mut value {
        Value::Object(o) => ["usage", "usageMetadata", "usage_metadata"]
            .iter()
            .find_map(|k| o.remove(*k))
            .and_then(|u| ProviderUsage::from_value(&u)),
        _ => None,
    };
    Ok((reply(value)?, usage))
}

/// The provider format a reply's shape comes from: a Chat completion (`choices`), a
/// Responses response (`output`), an Anthropic message (`"type": "message"`, or a usage with
/// Anthropic's cache fields); `None` for a neutral message.
pub fn format_of(value: &Value) -> Option<Format> {
    let anthropic_usage = value.get("usage").is_some_and(|u| {
        u.get("cache_read_input_tokens").is_some() || u.get("cache_creation_input_tokens").is_some()
    });
    let object = value.as_object()?;
    if super::gemini::is_reply(object)
        || value.get("usageMetadata").is_some()
        || value.get("usage_metadata").is_some()
    {
        Some(Format::Gemini)
    } else if super::bedrock::is_reply(object) {
        Some(Format::Bedrock)
    } else if value.get("choices").is_some() {
        Some(Format::Openai)
    } else if value.get("output").is_some() {
        Some(Format::OpenaiResponses)
    } else if value.get("type").and_then(Value::as_str) == Some("message") || anthropic_usage {
        Some(Format::Anthropic)
    } else {
        None
    }
}

/// The message a client posts to `POST /v1/sessions/{id}/messages`, in any of the shapes above.
pub fn reply(value: Value) -> Result<Message> {
    let Value::Object(mut object) = value else {
        return Err(Error::BadRequest("a message must be a JSON object".into()));
    };
    if super::gemini::is_reply(&object) {
        return super::gemini::reply(object);
    }
    if super::bedrock::is_reply(&object) {
        return super::bedrock::reply(object);
    }
    if let Some(choices) = object.remove("choices") {
        let message = choices
            .get(0)
            .and_then(|c| c.get("message"))
            .cloned()
            .ok_or_else(|| bad("an OpenAI completion needs choices[0].message"))?;
        return reply(message);
    }
    if let Some(output) = object.remove("output") {
        return responses(output);
    }
    let role = object.get("role").and_then(Value::as_str);
    match (role, object.get("content")) {
        (Some("assistant"), Some(Value::Array(_))) => {
            let Some(Value::Array(blocks)) = object.remove("content") else {
                unreachable!("matched above")
            };
            anthropic(blocks)
        }
        (Some("assistant"), _) if is_openai(&object) => openai(&object),
        _ => neutral(object),
    }
}

fn bad(message: impl Into<String>) -> Error {
    Error::BadRequest(message.into())
}

/// OpenAI messages carry `function` in their tool calls, or fields only OpenAI sends.
fn is_openai(object: &Map<String, Value>) -> bool {
    let calls = object.get("tool_calls").and_then(Value::as_array);
    calls.is_some_and(|c| c.iter().any(|c| c.get("function").is_some()))
        || ["refusal", "annotations", "audio", "function_call"]
            .iter()
            .any(|k| object.contains_key(*k))
        || object.get("content").is_some_and(Value::is_null)
}

/// Arguments written as JSON text: parsed, and the text kept; they must be an object.
fn arguments(call: &str, value: Value) -> Result<(Value, Option<String>)> {
    let invalid = |cause: String| Error::InvalidArguments {
        call: call.to_string(),
        cause,
    };
    match value {
        Value::String(text) => match serde_json::from_str::<Value>(&text) {
            Ok(parsed @ Value::Object(_)) => Ok((parsed, Some(text))),
            Ok(_) => Err(invalid("arguments must be a JSON object".into())),
            Err(e) => Err(invalid(format!("arguments are not JSON: {e}"))),
        },
        object @ Value::Object(_) => Ok((object, None)),
        Value::Null => Ok((Value::Object(Map::new()), None)),
        _ => Err(invalid("arguments must be a JSON object".into())),
    }
}

fn text_of(value: Option<&Value>, what: &str) -> Result<String> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(bad(format!("{what} must be a string"))),
    }
}

fn neutral(mut object: Map<String, Value>) -> Result<Message> {
    if let Some(Value::Array(calls)) = object.get_mut("tool_calls") {
        for call in calls.iter_mut() {
            let Some(call) = call.as_object_mut() else {
                continue;
            };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if let Some(value) = call.remove("arguments") {
                let (parsed, text) = arguments(&id, value)?;
                call.insert("arguments".into(), parsed);
                if let Some(text) = text {
                    call.insert("arguments_text".into(), Value::String(text));
                }
            }
        }
    }
    let message: Message = serde_json::from_value(Value::Object(object))
        .map_err(|e| bad(format!("not a message: {e}")))?;
    if let Message::Assistant { tool_calls, .. } = &message {
        for call in tool_calls {
            let text = call
                .arguments_text
                .as_deref()
                .map(serde_json::from_str::<Value>);
            if text.is_some_and(|t| t.ok().as_ref() != Some(&call.arguments)) {
                return Err(Error::InvalidArguments {
                    call: call.id.clone(),
                    cause: "`arguments_text` is not the JSON text of `arguments`".into(),
                });
            }
        }
    }
    match message {
        Message::Assistant {
            content,
            tool_calls,
            native: Some(native),
            ..
        } => {
            let from_native = match *native {
                crate::conversation::Native::Gemini { model, parts } => {
                    let mut object = Map::new();
                    object.insert("role".into(), Value::String("model".into()));
                    object.insert("parts".into(), Value::Array(parts));
                    if let Some(model) = model {
                        object.insert("modelVersion".into(), Value::String(model));
                    }
                    super::gemini::reply(object)?
                }
                crate::conversation::Native::Bedrock { content } => {
                    let mut object = Map::new();
                    object.insert("role".into(), Value::String("assistant".into()));
                    object.insert("content".into(), Value::Array(content));
                    super::bedrock::reply(object)?
                }
            };
            agrees(from_native, &content, &tool_calls, "native")
        }
        Message::Assistant {
            content,
            tool_calls,
            blocks,
            ..
        } if !blocks.is_empty() => {
            let from_blocks = anthropic(blocks)?;
            match &from_blocks {
                Message::Assistant {
                    content: c,
                    tool_calls: t,
                    ..
                } if (content.is_empty() || content == *c)
                    && (tool_calls.is_empty() || tool_calls == *t) =>
                {
                    Ok(from_blocks)
                }
                _ => Err(bad(
                    "`blocks` disagree with `content` and `tool_calls`; send one or the other",
                )),
            }
        }
        message => Ok(message),
    }
}

/// `derived` (a message read from its provider-shaped `field`) when the neutral `content` and
/// `tool_calls` sent beside it say the same or nothing (ids the daemon gave count as the same).
fn agrees(
    derived: Message,
    content: &str,
    tool_calls: &[ToolCall],
    field: &str,
) -> Result<Message> {
    let Message::Assistant {
        content: c,
        tool_calls: mut t,
        blocks,
        native,
    } = derived
    else {
        unreachable!("readers of replies give assistant messages")
    };
    let same_calls = tool_calls.len() == t.len()
        && tool_calls.iter().zip(&t).all(|(a, b)| {
            a.name == b.name && a.arguments == b.arguments && (b.id.is_empty() || a.id == b.id)
        });
    if !(content.is_empty() || content == c) || !(tool_calls.is_empty() || same_calls) {
        return Err(bad(format!(
            "`{field}` disagrees with `content` and `tool_calls`; send one or the other"
        )));
    }
    if !tool_calls.is_empty() {
        for (ours, given) in t.iter_mut().zip(tool_calls) {
            ours.id = given.id.clone();
        }
    }
    Ok(Message::Assistant {
        content: c,
        tool_calls: t,
        blocks,
        native,
    })
}

/// Names the tool calls of a reply that came without ids (Gemini may leave them out):
/// `call_{seq}_{n}`, `seq` the log position the reply is recorded at, `n` the call's place in
/// it, so a name is unique in its session and the same on every rebuild.
pub fn name_calls(message: &mut Message, seq: u64) {
    if let Message::Assistant { tool_calls, .. } = message {
        for (n, call) in tool_calls.iter_mut().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_{seq}_{n}");
            }
        }
    }
}

fn openai(object: &Map<String, Value>) -> Result<Message> {
    let mut content = text_of(object.get("content"), "content")?;
    if content.is_empty() {
        // A refusal is what the model said instead of an answer.
        content = text_of(object.get("refusal"), "refusal")?;
    }
    let mut tool_calls = Vec::new();
    for call in object
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let id = call.get("id").and_then(Value::as_str).unwrap_or("");
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("tool call `{id}` needs function.name")))?;
        if id.is_empty() {
            return Err(bad("an OpenAI tool call needs an id"));
        }
        let raw = function
            .and_then(|f| f.get("arguments"))
            .cloned()
            .unwrap_or(Value::Null);
        let (arguments, arguments_text) = arguments(id, raw)?;
        tool_calls.push(ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments,
            arguments_text,
        });
    }
    Ok(Message::Assistant {
        content,
        tool_calls,
        blocks: Vec::new(),
        native: None,
    })
}

/// Anthropic content blocks, normalized to what the API accepts back: each block keeps the
/// fields a request may carry, thinking and signatures exactly as they came.
fn anthropic(blocks: Vec<Value>) -> Result<Message> {
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let mut kept = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.into_iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let field = |name: &str| -> Result<Value> {
            block
                .get(name)
                .cloned()
                .ok_or_else(|| bad(format!("content[{i}] ({kind}) needs `{name}`")))
        };
        let mut out = Map::new();
        out.insert("type".into(), Value::String(kind.to_string()));
        match kind {
            "text" => {
                let text = text_of(Some(&field("text")?), "text")?;
                if text.is_empty() {
                    continue; // Anthropic refuses empty text blocks
                }
                content.push_str(&text);
                out.insert("text".into(), Value::String(text));
                if let Some(c @ Value::Array(list)) = block.get("citations") {
                    if !list.is_empty() {
                        out.insert("citations".into(), c.clone());
                    }
                }
            }
            "tool_use" => {
                let id = text_of(Some(&field("id")?), "id")?;
                let name = text_of(Some(&field("name")?), "name")?;
                let input = field("input")?;
                if !input.is_object() {
                    return Err(Error::InvalidArguments {
                        call: id,
                        cause: "input must be a JSON object".into(),
                    });
                }
                tool_calls.push(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: input.clone(),
                    arguments_text: None,
                });
                out.insert("id".into(), Value::String(id));
                out.insert("name".into(), Value::String(name));
                out.insert("input".into(), input);
            }
            "thinking" => {
                out.insert("thinking".into(), field("thinking")?);
                out.insert("signature".into(), field("signature")?);
            }
            "redacted_thinking" => {
                out.insert("data".into(), field("data")?);
            }
            other => {
                return Err(bad(format!(
                    "content[{i}]: block type `{other}` cannot be recorded (text, tool_use, thinking and redacted_thinking can)"
                )))
            }
        }
        kept.push(Value::Object(out));
    }
    Ok(Message::Assistant {
        content,
        tool_calls,
        blocks: kept,
        native: None,
    })
}

fn responses(output: Value) -> Result<Message> {
    let Value::Array(items) = output else {
        return Err(bad("`output` must be a list of Responses output items"));
    };
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            content.push_str(&text_of(part.get("text"), "output_text.text")?)
                        }
                        Some("refusal") => {
                            content.push_str(&text_of(part.get("refusal"), "refusal")?)
                        }
                        other => {
                            return Err(bad(format!(
                                "output[{i}]: content part `{}` cannot be recorded",
                                other.unwrap_or("?")
                            )))
                        }
                    }
                }
            }
            Some("function_call") => {
                let id = text_of(item.get("call_id"), "call_id")?;
                let name = text_of(item.get("name"), "name")?;
                if id.is_empty() || name.is_empty() {
                    return Err(bad(format!("output[{i}]: a function_call needs call_id and name")));
                }
                let raw = item.get("arguments").cloned().unwrap_or(Value::Null);
                let (arguments, arguments_text) = arguments(&id, raw)?;
                tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                    arguments_text,
                });
            }
            Some("reasoning") => {} // no place for it in the other formats
            other => {
                return Err(bad(format!(
                    "output[{i}]: item type `{}` cannot be recorded (message, function_call and reasoning can)",
                    other.unwrap_or("?")
                )))
            }
        }
    }
    Ok(Message::Assistant {
        content,
        tool_calls,
        blocks: Vec::new(),
        native: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assistant(m: Message) -> (String, Vec<ToolCall>, Vec<Value>) {
        match m {
            Message::Assistant {
                content,
                tool_calls,
                blocks,
                ..
            } => (content, tool_calls, blocks),
            other => panic!("not an assistant message: {other:?}"),
        }
    }

    #[test]
    fn q5_openai_messages_and_completions_are_recorded_as_returned() {
        let message = json!({"role": "assistant", "content": null, "refusal": null,
            "annotations": [], "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}}]});
        let (content, calls, blocks) = assistant(reply(message.clone()).unwrap());
        assert_eq!((content.as_str(), blocks.len()), ("", 0));
        assert_eq!(calls[0].arguments, json!({"path": "a"}));
        assert_eq!(
            calls[0].arguments_text.as_deref(),
            Some("{\"path\": \"a\"}")
        );
        let completion = json!({"id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]});
        assert_eq!(assistant(reply(completion).unwrap()).1, calls);
        let bad = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
            "type": "function", "function": {"name": "read", "arguments": "[1]"}}]});
        assert_eq!(reply(bad).unwrap_err().code(), "invalid_arguments");
    }

    #[test]
    fn q5_anthropic_blocks_keep_their_order_and_signatures() {
        let message = json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude", "stop_reason": "tool_use", "usage": {"input_tokens": 1},
            "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Reading.", "citations": null},
                {"type": "text", "text": ""},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}}]});
        let (content, calls, blocks) = assistant(reply(message).unwrap());
        assert_eq!(content, "Reading.");
        assert_eq!(calls[0].id, "t1");
        assert_eq!(
            Value::Array(blocks),
            json!([
                {"type": "thinking", "thinking": "Let me look.", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}}])
        );
        let server = json!({"role": "assistant", "content": [{"type": "server_tool_use"}]});
        assert!(reply(server)
            .unwrap_err()
            .to_string()
            .contains("server_tool_use"));
    }

    #[test]
    fn q14_provider_usage_is_read_in_one_shape() {
        let openai = json!({"choices": [{"message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 64}}});
        let (_, u) = reply_with_usage(openai).unwrap();
        assert_eq!(
            u.unwrap(),
            ProviderUsage {
                input_tokens: Some(100),
                output_tokens: Some(5),
                cached_tokens: Some(64),
                cache_write_tokens: None,
                cache_write_1h_tokens: None,
            }
        );
        let anthropic = json!({"type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": 10, "output_tokens": 3,
                "cache_read_input_tokens": 80, "cache_creation_input_tokens": 10}});
        let (_, u) = reply_with_usage(anthropic).unwrap();
        assert_eq!(u.unwrap().input_tokens, Some(100));
        let neutral = json!({"role": "assistant", "content": "hi"});
        assert_eq!(reply_with_usage(neutral).unwrap().1, None);
    }

    /// Issue 29: Anthropic splits its cache writes by TTL; the 1-hour part is kept, since it
    /// is priced at 2x input against 1.25x for the 5-minute part.
    #[test]
    fn anthropic_cache_writes_keep_their_one_hour_part() {
        let reply = json!({"type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 3000,
                "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000}}});
        let u = reply_with_usage(reply).unwrap().1.unwrap();
        assert_eq!(
            (u.cache_write_tokens, u.cache_write_1h_tokens),
            (Some(3000), Some(2000))
        );
        assert_eq!(u.input_tokens, Some(3010));
        // Recorded in the log's own shape, it reads back the same.
        let own = serde_json::to_value(u).unwrap();
        assert_eq!(own["cache_write_1h_tokens"], 2000);
        assert_eq!(ProviderUsage::from_value(&own), Some(u));
        // Without the split, nothing is guessed.
        let plain = json!({"input_tokens": 1, "cache_creation_input_tokens": 5});
        assert_eq!(
            ProviderUsage::from_value(&plain)
                .unwrap()
                .cache_write_1h_tokens,
            None
        );
    }

    #[test]
    fn q5_responses_output_and_neutral_string_arguments() {
        let output = json!({"object": "response", "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Hi", "annotations": []}]},
            {"type": "function_call", "call_id": "f1", "name": "read", "arguments": "{}"}]});
        let (content, calls, _) = assistant(reply(output).unwrap());
        assert_eq!((content.as_str(), calls[0].id.as_str()), ("Hi", "f1"));
        let neutral = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "n1", "name": "read", "arguments": "{\"a\":1}"}]});
        let (_, calls, _) = assistant(reply(neutral).unwrap());
        assert_eq!(calls[0].arguments, json!({"a": 1}));
        let not_object = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "n1", "name": "read", "arguments": "\"x\""}]});
        assert_eq!(reply(not_object).unwrap_err().code(), "invalid_arguments");
        let typo = json!({"role": "assistant", "contnet": "x"});
        assert_eq!(reply(typo).unwrap_err().code(), "bad_request");
    }
}
