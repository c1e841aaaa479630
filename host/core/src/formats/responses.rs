//! OpenAI Responses bodies: the conversation goes in `input`, as items.

use serde_json::{json, Map, Value};

use super::{allowed_tools, openai_arguments, openai_settings, Format};
use crate::conversation::content::{Block, Content};
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};

/// A Responses body but `input`.
pub(super) fn head(
    header: &Header,
    tools: Option<Value>,
    shown: Option<&[String]>,
) -> Map<String, Value> {
    let mut body = openai_settings(header, Format::OpenaiResponses);
    if !header.system.is_empty() {
        body.insert("instructions".into(), json!(header.system));
    }
    if let Some(tools) = tools {
        body.insert("tools".into(), tools);
        if let Some(shown) = shown {
            let allowed = shown
                .iter()
                .map(|name| json!({ "type": "function", "name": name }))
                .collect();
            body.entry("tool_choice").or_insert_with(|| {
                allowed_tools(
                    shown,
                    json!({ "mode": "auto", "tools": Value::Array(allowed) }),
                )
            });
        }
    }
    body.remove("input");
    body
}

/// Without `strict`, Responses rewrites the schema into strict mode (every property
/// required); keep it as the plugin declared it.
pub(super) fn tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": false,
    })
}

/// The tools of a header with deferred ones (K9): those sent in full, in order; OpenAI's
/// `tool_search`; then one namespace per plugin with deferred tools, in the order its first
/// one comes, holding them with `defer_loading` (the model sees a namespace's name and
/// description until it searches it).
pub(super) fn deferring(tools: &[&ToolSpec]) -> Value {
    let mut out: Vec<Value> = tools
        .iter()
        .filter(|t| t.defer.is_none())
        .map(|t| tool(t))
        .collect();
    out.push(json!({ "type": "tool_search" }));
    let mut plugins: Vec<&str> = Vec::new();
    for t in tools {
        if let Some(p) = t.defer.as_deref() {
            if !plugins.contains(&p) {
                plugins.push(p);
            }
        }
    }
    for plugin in plugins {
        let members: Vec<&&ToolSpec> = tools
            .iter()
            .filter(|t| t.defer.as_deref() == Some(plugin))
            .collect();
        let names: Vec<&str> = members.iter().map(|t| t.name.as_str()).collect();
        let inner: Vec<Value> = members
            .iter()
            .map(|t| {
                let mut f = tool(t);
                if let Value::Object(map) = &mut f {
                    map.insert("defer_loading".into(), Value::Bool(true));
                }
                f
            })
            .collect();
        out.push(json!({
            "type": "namespace",
            "name": namespace(plugin),
            "description": format!("Tools of promptd plugin `{plugin}`: {}.", names.join(", ")),
            "tools": inner,
        }));
    }
    Value::Array(out)
}

/// A plugin id as a namespace name: letters, digits, `_` and `-` kept, anything else `_`.
pub fn namespace(plugin: &str) -> String {
    plugin
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    request.messages.iter().flat_map(responses_items).collect()
}

/// One block as a Responses input content part.
fn responses_part(block: &Block) -> Value {
    match block {
        Block::Text { text } => json!({ "type": "input_text", "text": text }),
        Block::Image { url, .. } => json!({
            "type": "input_image",
            "image_url": block.data_url().or_else(|| url.clone()).unwrap_or_default(),
            "detail": "auto",
        }),
        Block::Document { name, url, .. } => {
            let filename = name.as_deref().unwrap_or("document.pdf");
            match block.data_url() {
                Some(data) => {
                    json!({ "type": "input_file", "filename": filename, "file_data": data })
                }
                None => json!({ "type": "input_file", "file_url": url }),
            }
        }
    }
}

fn responses_content(content: &Content) -> Value {
    match content {
        Content::Text(text) => json!(text),
        Content::Blocks(blocks) => Value::Array(blocks.iter().map(responses_part).collect()),
    }
}

/// One neutral message as OpenAI Responses input items (an assistant reply may be several:
/// its text, then one `function_call` per call; thinking has no place there and is left out).
pub(crate) fn responses_items(message: &Message) -> Vec<Value> {
    match message {
        Message::User { content, .. } => {
            vec![
                json!({ "type": "message", "role": "user", "content": responses_content(content) }),
            ]
        }
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => {
            let mut items = Vec::with_capacity(tool_calls.len() + 1);
            if !content.is_empty() {
                items.push(json!({ "type": "message", "role": "assistant", "content": content }));
            }
            for call in tool_calls {
                items.push(json!({
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": openai_arguments(call),
                }));
            }
            items
        }
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => vec![json!({
            "type": "function_call_output",
            "call_id": tool_call_id,
            "output": responses_content(content),
        })],
    }
}
