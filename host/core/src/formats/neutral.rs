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

/// A tool in the neutral shape; a deferred one (K9) says so with `defer`: its plugin's id.
pub(super) fn tool(tool: &ToolSpec) -> Value {
    let mut value = json!({
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
    });
    if let (Some(plugin), Value::Object(map)) = (&tool.defer, &mut value) {
        map.insert("defer".into(), json!(plugin));
    }
    value
}

pub(super) fn messages(request: &FrozenRequest) -> Vec<Value> {
    request.messages.iter().map(neutral_message).collect()
}

/// `message` in the neutral shape: the project's own serde form.
pub fn neutral_message(message: &Message) -> Value {
    // Strings, lists and JSON values only: writing a message as a value cannot fail.
    serde_json::json!(message)
}

/// [`neutral_message`]`(message).to_string()`, in a buffer of exactly its size.
pub fn neutral_text(message: &Message) -> String {
    super::json_text::json_string(&neutral_message(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k9_a_deferred_tool_shows_defer_its_plugin_and_a_full_one_does_not() {
        let spec = |defer: Option<&str>| ToolSpec {
            name: "write_file".into(),
            description: "Writes.".into(),
            parameters: json!({"type": "object"}),
            defer: defer.map(str::to_string),
        };
        let header = Header {
            tools: vec![spec(Some("tools"))],
            ..Header::default()
        };
        let body = crate::formats::render(
            &FrozenRequest {
                header,
                messages: Vec::new(),
                shown_tools: None,
            },
            crate::formats::Format::Neutral,
        );
        assert_eq!(body["tools"][0]["defer"], "tools", "{body}");
        assert!(tool(&spec(None)).get("defer").is_none());
    }
}
