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

/// [`neutral_message`]`(message).to_string()`.
pub fn neutral_text(message: &Message) -> String {
    match plain_text(message) {
        Some(text) => text,
        None => super::json_text::json_string(&neutral_message(message)),
    }
}

/// [`neutral_text`] of a message of text alone (most are), written without building its
/// value: a value costs a map and a copy of every string, and each new message is written
/// twice per step (measured, then kept). The keys come in the order the value's map gives
/// them (sorted), so the bytes are the same (`plain_messages_are_written_as_their_value_is`).
fn plain_text(message: &Message) -> Option<String> {
    use super::json_text::write_json;
    use crate::conversation::content::Content;
    let mut out = Vec::new();
    match message {
        Message::User {
            content: Content::Text(text),
            snapshot,
        } => {
            out.reserve(text.len() + 48);
            out.extend_from_slice(b"{\"content\":");
            write_json(&mut out, text);
            out.extend_from_slice(b",\"role\":\"user\"");
            if *snapshot {
                out.extend_from_slice(b",\"snapshot\":true");
            }
        }
        Message::Tool {
            tool_call_id,
            content: Content::Text(text),
            is_error,
        } => {
            out.reserve(text.len() + tool_call_id.len() + 64);
            out.extend_from_slice(b"{\"content\":");
            write_json(&mut out, text);
            if *is_error {
                out.extend_from_slice(b",\"is_error\":true");
            }
            out.extend_from_slice(b",\"role\":\"tool\",\"tool_call_id\":");
            write_json(&mut out, tool_call_id);
        }
        Message::Assistant {
            content,
            tool_calls,
            blocks,
            native: None,
        } if tool_calls.is_empty() && blocks.is_empty() => {
            out.reserve(content.len() + 48);
            out.extend_from_slice(b"{\"content\":");
            write_json(&mut out, content);
            out.extend_from_slice(b",\"role\":\"assistant\"");
        }
        _ => return None,
    }
    out.push(b'}');
    // serde_json writes UTF-8 only, and so do the literals.
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plain_message() -> impl Strategy<Value = Message> {
        use crate::conversation::content::Content;
        // Any text: quotes, escapes, control characters, non-ASCII.
        let text = || {
            proptest::string::string_regex("(.|\n|\\\\|\"|\u{0}|\u{1f}|\u{7f}|é|😀){0,24}").unwrap()
        };
        prop_oneof![
            (text(), any::<bool>()).prop_map(|(t, snapshot)| Message::User {
                content: Content::Text(t),
                snapshot,
            }),
            (text(), text(), any::<bool>()).prop_map(|(t, id, is_error)| Message::Tool {
                tool_call_id: id,
                content: Content::Text(t),
                is_error,
            }),
            text().prop_map(|t| Message::Assistant {
                content: t,
                tool_calls: Vec::new(),
                blocks: Vec::new(),
                native: None,
            }),
        ]
    }

    proptest! {
        /// Q8 (keys sorted, the same bytes): a message of text alone is written byte for
        /// byte as its neutral value is, without building the value.
        #[test]
        fn plain_messages_are_written_as_their_value_is(message in plain_message()) {
            let written = plain_text(&message);
            prop_assert!(written.is_some(), "{message:?} is plain");
            prop_assert_eq!(written.unwrap(), neutral_message(&message).to_string());
        }
    }

    #[test]
    fn messages_with_blocks_or_calls_are_written_by_their_value() {
        let calls: Message = serde_json::from_value(json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a"}}]}))
        .unwrap();
        let blocks: Message = serde_json::from_value(json!({"role": "user",
            "content": [{"type": "text", "text": "hi"}]}))
        .unwrap();
        for message in [calls, blocks] {
            assert!(plain_text(&message).is_none(), "{message:?}");
            assert_eq!(
                neutral_text(&message),
                neutral_message(&message).to_string()
            );
        }
    }

    #[test]
    fn k9_a_deferred_tool_shows_defer_its_plugin_and_a_full_one_does_not() {
        let spec = |defer: Option<&str>| ToolSpec {
            name: "write_file".into(),
            description: "Writes.".into(),
            parameters: json!({"type": "object"}).into(),
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
