//! The neutral body: the project's own shape, model, system, tools and messages as serde gives
//! them.

use serde_json::{json, Map, Value};

use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};

/// The neutral body but `messages`.
pub(super) fn head(header: &Header, tools: Option<Value>) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), Value::Object(header.model.clone()));
    body.insert("system".into(), json!(header.system));
    body.insert("tools".into(), tools.unwrap_or_else(|| json!([])));
    body
}

pub(super) fn tool(tool: &ToolSpec) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
    })
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    request.messages.iter().map(neutral_message).collect()
}

/// `message` in the neutral shape: the project's own serde form.
pub fn neutral_message(message: &Message) -> Value {
    // Strings, lists and JSON values only: writing a message as a value cannot fail.
    serde_json::json!(message)
}
