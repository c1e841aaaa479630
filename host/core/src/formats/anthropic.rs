//! Anthropic Messages bodies: alternating user and assistant turns, with cache breakpoints
//! on the system prompt, the last tool and the last turn.

use serde_json::{json, Map, Value};

use super::{settings, Format};
use crate::conversation::content::{Block, Content};
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec, Ttl};

/// An Anthropic Messages body but `messages`.
pub(super) fn head(header: &Header, tools: Option<Value>) -> Map<String, Value> {
    let mut body = settings(&header.model, Format::Anthropic);
    if !header.system.is_empty() {
        body.insert(
            "system".into(),
            json!([{ "type": "text", "text": header.system, "cache_control": ephemeral(header) }]),
        );
    }
    if let Some(tools) = tools {
        body.insert("tools".into(), tools);
    }
    body.remove("messages");
    body
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    let mut turns = anthropic_turns(&request.messages);
    let last = turns.pop();
    let mut out: Vec<Value> = turns
        .into_iter()
        .map(|(role, blocks)| anthropic_turn(role, blocks))
        .collect();
    out.extend(last.map(|(role, blocks)| anthropic_last_turn(&request.header, role, blocks)));
    out
}

/// One block as an Anthropic content block (inside a user turn or a `tool_result`); empty
/// text blocks are left out (Anthropic refuses them).
fn anthropic_part(block: &Block) -> Option<Value> {
    let source = |media_type: &Option<String>, data: &Option<String>, url: &Option<String>| match (
        data, url,
    ) {
        (Some(data), _) => json!({ "type": "base64", "media_type": media_type, "data": data }),
        (None, url) => json!({ "type": "url", "url": url }),
    };
    Some(match block {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => json!({ "type": "text", "text": text }),
        Block::Image {
            media_type,
            data,
            url,
        } => json!({ "type": "image", "source": source(media_type, data, url) }),
        Block::Document {
            media_type,
            data,
            url,
            name,
        } => {
            let mut out = json!({ "type": "document", "source": source(media_type, data, url) });
            if let (Some(name), Value::Object(o)) = (name, &mut out) {
                o.insert("title".into(), json!(name));
            }
            out
        }
    })
}

/// The last Anthropic turn, with the rolling cache breakpoint on its last block that may carry
/// one (thinking blocks may not) when the header's layout has it.
pub(crate) fn anthropic_last_turn(
    header: &Header,
    role: &'static str,
    mut blocks: Vec<Value>,
) -> Value {
    if let Some((i, breakpoint)) = last_breakpoint(header, &blocks) {
        if let Value::Object(block) = &mut blocks[i] {
            block.insert("cache_control".into(), breakpoint);
        }
    }
    anthropic_turn(role, blocks)
}

/// Where the last turn's rolling breakpoint goes (the index of its last block that may carry
/// one, an object) and what it is; `None` when the header's layout has none.
pub(crate) fn last_breakpoint(header: &Header, blocks: &[Value]) -> Option<(usize, Value)> {
    if header.layout < 1 {
        return None;
    }
    let i = blocks.iter().rposition(|b| {
        !matches!(
            b.get("type").and_then(Value::as_str),
            Some("thinking" | "redacted_thinking")
        )
    })?;
    blocks[i].is_object().then(|| (i, ephemeral(header)))
}

/// A breakpoint with the header's TTL: every breakpoint of a request has the same, so none
/// with a longer TTL follows a shorter one (Anthropic refuses that order).
fn ephemeral(header: &Header) -> Value {
    match header.cache_ttl {
        Some(Ttl::Hour1) => json!({ "type": "ephemeral", "ttl": "1h" }),
        Some(Ttl::Minutes5) | None => json!({ "type": "ephemeral" }),
    }
}

/// A tool; the last of the list carries the header's breakpoint.
pub(super) fn anthropic_tool(header: &Header, tool: &ToolSpec, last: bool) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), json!(tool.name));
    out.insert("description".into(), json!(tool.description));
    out.insert("input_schema".into(), (*tool.parameters).clone());
    if last {
        out.insert("cache_control".into(), ephemeral(header));
    }
    Value::Object(out)
}

/// Maps one neutral message to its Anthropic role and content blocks.
pub(crate) fn anthropic_blocks(message: &Message) -> (&'static str, Vec<Value>) {
    match message {
        Message::User {
            content: Content::Text(text),
            ..
        } => ("user", vec![json!({ "type": "text", "text": text })]),
        Message::User {
            content: Content::Blocks(blocks),
            ..
        } => ("user", blocks.iter().filter_map(anthropic_part).collect()),
        Message::Tool {
            tool_call_id,
            content,
            is_error,
        } => {
            let mut block = Map::new();
            block.insert("type".into(), json!("tool_result"));
            block.insert("tool_use_id".into(), json!(tool_call_id));
            block.insert(
                "content".into(),
                match content {
                    Content::Text(text) => json!(text),
                    Content::Blocks(blocks) => {
                        Value::Array(blocks.iter().filter_map(anthropic_part).collect())
                    }
                },
            );
            if *is_error {
                block.insert("is_error".into(), Value::Bool(true));
            }
            ("user", vec![Value::Object(block)])
        }
        Message::Assistant { blocks, .. } if !blocks.is_empty() => ("assistant", blocks.clone()),
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => {
            let mut blocks = Vec::with_capacity(tool_calls.len() + 1);
            if !content.is_empty() {
                blocks.push(json!({ "type": "text", "text": content }));
            }
            for call in tool_calls {
                blocks.push(json!({
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": call.arguments,
                }));
            }
            ("assistant", blocks)
        }
    }
}

/// Anthropic wants user/assistant alternation: consecutive same-role messages merge into one
/// turn; a message with no blocks is left out.
fn anthropic_turns(messages: &[Message]) -> Vec<(&'static str, Vec<Value>)> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        push_anthropic(&mut turns, message);
    }
    turns
}

/// Adds `message` to `turns`, merging it into the last turn when the role is the same.
pub(crate) fn push_anthropic(turns: &mut Vec<(&'static str, Vec<Value>)>, message: &Message) {
    let (role, blocks) = anthropic_blocks(message);
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
        _ => turns.push((role, blocks)),
    }
}

pub(crate) fn anthropic_turn(role: &'static str, blocks: Vec<Value>) -> Value {
    // `json!` would copy the blocks; they are moved in (the same keys in the same order).
    let mut turn = Map::new();
    turn.insert("role".into(), Value::from(role));
    turn.insert("content".into(), Value::Array(blocks));
    Value::Object(turn)
}

/// Anthropic's regex tool search tool: what finds a deferred tool (K9).
pub const TOOL_SEARCH: &str = "tool_search_tool_regex";

/// The tools of a header with deferred ones (K9): those sent in full, in order; the tool
/// search tool, which carries the tools' breakpoint (deferred tools are not in the prompt, so
/// the cached prefix ends there); then each deferred tool with `defer_loading`.
pub(super) fn deferring(header: &Header, tools: &[&ToolSpec]) -> Value {
    let (deferred, sent): (Vec<&&ToolSpec>, Vec<&&ToolSpec>) =
        tools.iter().partition(|t| t.defer.is_some());
    let mut out: Vec<Value> = sent
        .iter()
        .map(|t| anthropic_tool(header, t, false))
        .collect();
    out.push(json!({
        "type": "tool_search_tool_regex_20251119",
        "name": TOOL_SEARCH,
        "cache_control": ephemeral(header),
    }));
    out.extend(deferred.iter().map(|t| {
        let mut tool = anthropic_tool(header, t, false);
        if let Value::Object(map) = &mut tool {
            map.insert("defer_loading".into(), Value::Bool(true));
        }
        tool
    }));
    Value::Array(out)
}
