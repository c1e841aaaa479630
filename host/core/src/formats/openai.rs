//! OpenAI Chat Completions bodies.

use serde_json::{json, Map, Value};

use super::{allowed_tools, openai_arguments, openai_settings, Format};
use crate::conversation::content::{Block, Content};
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};

/// A Chat Completions body but `messages`.
pub(super) fn head(
    header: &Header,
    tools: Option<Value>,
    shown: Option<&[String]>,
) -> Map<String, Value> {
    let dialect = super::dialect::Dialect::of(&header.model);
    let mut body = openai_settings(header, Format::Openai);
    if let Some(tools) = tools {
        body.insert("tools".into(), tools);
        if let Some(shown) = shown.filter(|_| dialect.allowed_tools()) {
            let allowed = shown
                .iter()
                .map(|name| json!({ "type": "function", "function": { "name": name } }))
                .collect();
            body.entry("tool_choice").or_insert_with(|| {
                allowed_tools(
                    shown,
                    json!({ "allowed_tools": { "mode": "auto", "tools": Value::Array(allowed) } }),
                )
            });
        }
    }
    body.remove("messages");
    body
}

pub(super) fn tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    let mut items: Vec<Value> = system_message(&request.header).into_iter().collect();
    let mut pending = Vec::new();
    for message in &request.messages {
        push_openai(&mut items, &mut pending, message);
    }
    items.extend(flush_openai(&mut pending));
    items
}

/// OpenAI's system message, first in `messages`, when there is a system prompt.
pub(crate) fn system_message(header: &Header) -> Option<Value> {
    (!header.system.is_empty()).then(|| json!({ "role": "system", "content": header.system }))
}

/// Adds `message` to OpenAI's `messages`. Tool messages may carry only text, so a result's
/// images and documents wait in `pending` and go, after the last tool message of the group,
/// into one user message (the nearest valid form).
pub(crate) fn push_openai(items: &mut Vec<Value>, pending: &mut Vec<Value>, message: &Message) {
    if !matches!(message, Message::Tool { .. }) {
        items.extend(flush_openai(pending));
    }
    items.push(openai_message(message));
    if let Message::Tool {
        tool_call_id,
        content: Content::Blocks(blocks),
        ..
    } = message
    {
        let media: Vec<Value> = blocks
            .iter()
            .filter(|b| !matches!(b, Block::Text { .. }))
            .map(openai_part)
            .collect();
        if !media.is_empty() {
            pending.push(json!({
                "type": "text",
                "text": format!("Attachments of the result of tool call {tool_call_id}:"),
            }));
            pending.extend(media);
        }
    }
}

/// The user message of the attachments waiting in `pending`, if any.
pub(crate) fn flush_openai(pending: &mut Vec<Value>) -> Option<Value> {
    (!pending.is_empty()).then(|| json!({ "role": "user", "content": std::mem::take(pending) }))
}

/// One block as a Chat Completions content part.
fn openai_part(block: &Block) -> Value {
    match block {
        Block::Text { text } => json!({ "type": "text", "text": text }),
        Block::Image { url, .. } => {
            let url = block.data_url().or_else(|| url.clone()).unwrap_or_default();
            json!({ "type": "image_url", "image_url": { "url": url } })
        }
        Block::Document { name, .. } => json!({ "type": "file", "file": {
            "filename": name.as_deref().unwrap_or("document.pdf"),
            "file_data": block.data_url().unwrap_or_default(),
        }}),
    }
}

fn openai_content(content: &Content) -> Value {
    match content {
        Content::Text(text) => json!(text),
        Content::Blocks(blocks) => Value::Array(blocks.iter().map(openai_part).collect()),
    }
}

pub(crate) fn openai_message(message: &Message) -> Value {
    match message {
        Message::User { content, .. } => {
            json!({ "role": "user", "content": openai_content(content) })
        }
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => {
            let mut out = Map::new();
            out.insert("role".into(), json!("assistant"));
            out.insert(
                "content".into(),
                if content.is_empty() {
                    Value::Null
                } else {
                    json!(content)
                },
            );
            if !tool_calls.is_empty() {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|call| {
                        let arguments = openai_arguments(call);
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": { "name": call.name, "arguments": arguments },
                        })
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(out)
        }
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => {
            let content = match content {
                Content::Text(text) => json!(text),
                Content::Blocks(blocks) => {
                    let mut parts: Vec<Value> = blocks
                        .iter()
                        .filter(|b| matches!(b, Block::Text { .. }))
                        .map(openai_part)
                        .collect();
                    if parts.is_empty() {
                        parts.push(json!({ "type": "text", "text": "(attachments follow)" }));
                    }
                    Value::Array(parts)
                }
            };
            json!({ "role": "tool", "tool_call_id": tool_call_id, "content": content })
        }
    }
}
