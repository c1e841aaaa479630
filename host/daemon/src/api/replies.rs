//! The reply shapes `POST /v1/sessions/{id}/messages` takes, as JSON Schema: what
//! `promptd_core::formats::replies::reply` records, one function per provider's shape.

use serde_json::{json, Value};
use utoipa::ToSchema;

use super::ReplyMessage;

fn schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn text_or_null() -> Value {
    json!({"type": ["string", "null"]})
}

fn named() -> Value {
    json!({"type": "string", "minLength": 1})
}

/// A Gemini response (`candidates`) decides first, then `choices`, then `output`; the shapes
/// below them must have none of these.
fn neither() -> Value {
    json!({"not": {"anyOf": [
        {"required": ["choices"]}, {"required": ["output"]}, {"required": ["candidates"]}]}})
}

/// The neutral assistant and tool messages (`usage` may stand beside them at the top).
fn neutral(usage: bool) -> (Value, Value) {
    let mut assistant = json!({
        "type": "object",
        "description": "A neutral assistant message (`Message`). (`blocks`, as the daemon records \
                        an Anthropic reply, are taken too when they agree with `content` and \
                        `tool_calls`.)",
        "properties": {
            "role": {"const": "assistant"},
            "content": {"type": "string"},
            "tool_calls": {"type": "array", "items": schema("ToolCall")},
        },
        "required": ["role"],
        "additionalProperties": false,
    });
    let mut tool = json!({
        "type": "object",
        "description": "A tool's output, answering the call `tool_call_id` (`Message`).",
        "properties": {
            "role": {"const": "tool"},
            "tool_call_id": {"type": "string"},
            "content": schema("Content"),
            "is_error": {"type": "boolean"},
        },
        "required": ["role", "tool_call_id", "content"],
        "additionalProperties": false,
    });
    if usage {
        for shape in [&mut assistant, &mut tool] {
            shape["properties"]["usage"] = json!({});
        }
    }
    (assistant, tool)
}

/// An OpenAI Chat Completions assistant message.
fn openai_message() -> Value {
    let openai_call = json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "minLength": 1},
            "function": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
        "required": ["id", "function"],
    });
    json!({
        "type": "object",
        "description": "An OpenAI Chat Completions assistant message: `tool_calls[].function.arguments` \
                        is kept as written.",
        "properties": {
            "role": {"const": "assistant"},
            "content": text_or_null(),
            "refusal": text_or_null(),
            // Anything but a list is left alone.
            "tool_calls": {"items": openai_call},
        },
        "required": ["role"],
        "anyOf": [
            {"properties": {"content": {"type": "null"}}, "required": ["content"]},
            {"required": ["refusal"]},
            {"required": ["annotations"]},
            {"required": ["audio"]},
            {"required": ["function_call"]},
            {"properties": {"tool_calls": {"type": "array",
                "contains": {"type": "object", "required": ["function"]}}},
             "required": ["tool_calls"]},
        ],
        "allOf": [neither()],
    })
}

/// An Anthropic message.
fn anthropic() -> Value {
    let block = |kind: &str, properties: Value, required: &[&str]| {
        let mut properties = properties;
        properties["type"] = json!({"const": kind});
        let mut required: Vec<&str> = required.to_vec();
        required.push("type");
        json!({"type": "object", "properties": properties, "required": required})
    };
    json!({
        "type": "object",
        "description": "An Anthropic message (or its role and content): text, tool_use, thinking and \
                        redacted_thinking blocks, kept in their order.",
        "properties": {
            "role": {"const": "assistant"},
            "content": {"type": "array", "items": {"oneOf": [
                block("text", json!({"text": text_or_null()}), &["text"]),
                block("tool_use", json!({"id": text_or_null(), "name": text_or_null(), "input": {"type": "object"}}),
                      &["id", "name", "input"]),
                block("thinking", json!({}), &["thinking", "signature"]),
                block("redacted_thinking", json!({}), &["data"]),
            ]}},
        },
        "required": ["role", "content"],
        "allOf": [neither()],
    })
}

/// An OpenAI Response.
fn openai_response() -> Value {
    let part = |kind: &str, field: &str| {
        json!({"type": "object", "properties": {"type": {"const": kind}, field: text_or_null()},
               "required": ["type"]})
    };
    json!({
        "type": "object",
        "description": "An OpenAI Response (or its `output`): message and function_call items are \
                        recorded, reasoning items left out.",
        "properties": {
            "output": {"type": "array", "items": {"oneOf": [
                {"type": "object", "properties": {"type": {"const": "message"},
                    "content": {"items": {"oneOf": [part("output_text", "text"), part("refusal", "refusal")]}}},
                 "required": ["type"]},
                {"type": "object", "properties": {"type": {"const": "function_call"},
                    "call_id": named(), "name": named()}, "required": ["type", "call_id", "name"]},
                {"type": "object", "properties": {"type": {"const": "reasoning"}}, "required": ["type"]},
            ]}},
        },
        "required": ["output"],
        "not": {"required": ["choices"]},
    })
}

/// An OpenAI Chat Completion.
fn completion() -> Value {
    json!({
        "type": "object",
        "description": "An OpenAI Chat Completion: `choices[0].message` is recorded.",
        "properties": {
            "choices": {
                "type": "array",
                "minItems": 1,
                "prefixItems": [{
                    "type": "object",
                    "properties": {"message": schema(ReplyMessage::name().as_ref())},
                    "required": ["message"],
                }],
            },
        },
        "required": ["choices"],
        "not": {"required": ["candidates"]},
    })
}

/// A Gemini response or model content.
fn gemini() -> Value {
    // Gemini: a part's data keys in either spelling (the Python SDK dumps snake_case).
    let function_call = json!({"type": "object",
        "properties": {"name": named(), "args": {"type": ["object", "null"]},
                       "id": {"type": ["string", "null"]}},
        "required": ["name"]});
    let gemini_content = json!({
        "type": "object",
        "properties": {
            "parts": {"type": ["array", "null"], "items": {"type": "object", "properties": {
                "text": {"type": "string"},
                "functionCall": function_call,
                "function_call": function_call,
            }}},
        },
    });
    json!({
        "type": "object",
        "description": "A Gemini GenerateContentResponse (its first candidate's content is \
                        recorded; `usageMetadata` is its usage) or a model content \
                        (`{\"role\": \"model\", \"parts\"}`): the parts are kept in order, \
                        thought signatures as written; a call without an id is named by the \
                        daemon (`call_{seq}_{n}`).",
        "anyOf": [
            {"properties": {"candidates": {"type": "array", "minItems": 1, "prefixItems": [
                {"type": "object", "properties": {"content": gemini_content},
                 "required": ["content"]}]}},
             "required": ["candidates"]},
            {"allOf": [gemini_content, {"properties": {"role": {"const": "model"}},
                                        "required": ["role", "parts"]}]},
        ],
    })
}

/// A Bedrock ConverseResponse or its message.
fn bedrock() -> Value {
    // Bedrock: content blocks keyed by kind (no `type`).
    let converse_block = json!({"type": "object", "anyOf": [
        {"properties": {"text": {"type": "string"}}, "required": ["text"]},
        {"properties": {"toolUse": {"type": "object",
            "properties": {"toolUseId": named(), "name": named(),
                           "input": {"type": ["object", "null"]}},
            "required": ["toolUseId", "name"]}},
         "not": {"required": ["text"]}, "required": ["toolUse"]},
        {"not": {"anyOf": [{"required": ["text"]}, {"required": ["toolUse"]}]},
         "anyOf": [{"required": ["reasoningContent"]}, {"required": ["citationsContent"]}]},
    ]});
    json!({
        "type": "object",
        "description": "A Bedrock ConverseResponse (`output.message` is recorded, `usage` is its \
                        usage) or its message: text, toolUse, reasoningContent and \
                        citationsContent blocks, kept in their order.",
        "anyOf": [
            {"properties": {"output": {"type": "object", "properties": {"message": {
                "type": "object",
                "properties": {"content": {"type": "array", "items": converse_block}},
                "required": ["content"]}}, "required": ["message"]}},
             "required": ["output"], "not": {"anyOf": [{"required": ["candidates"]},
                                                        {"required": ["choices"]}]}},
            {"properties": {"role": {"const": "assistant"}, "content": {
                "type": "array",
                "items": {"allOf": [converse_block, {"not": {"required": ["type"]}}]},
                "contains": {"type": "object", "anyOf": [
                    {"required": ["text"]}, {"required": ["toolUse"]},
                    {"required": ["reasoningContent"]}]}}},
             "required": ["role", "content"], "allOf": [neither()]},
        ],
    })
}

/// What `promptd_core::formats::replies::reply` records, as JSON Schema; `usage` (removed before the
/// shape is read, so only at the top) may stand beside each shape.
pub(super) fn reply_shapes(usage: bool) -> Value {
    let (neutral_assistant, neutral_tool) = neutral(usage);
    json!({
        "description": if usage {
            "A reply in any provider's own shape, or a neutral message such as \
             `{\"role\": \"tool\", \"tool_call_id\", \"content\"}`; a `usage` key beside it is the \
             provider's usage."
        } else {
            "A reply in any provider's own shape, or a neutral message (as `choices[0].message` \
             holds it: no `usage` key)."
        },
        "anyOf": [completion(), openai_response(), neutral_assistant, neutral_tool, openai_message(),
                  anthropic(), gemini(), bedrock()],
    })
}

/// The parser checked against the one schema: a reply of each shape the schema describes is
/// one the parser records, and what the parser refuses the schema refuses too.
#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    /// The JSON Schema keywords the reply shapes use (others are not checked).
    fn valid(v: &Value, s: &Value, doc: &Value) -> bool {
        let Some(s) = s.as_object() else {
            return true;
        };
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            let name = r.trim_start_matches("#/components/schemas/");
            return valid(v, &doc["components"]["schemas"][name], doc);
        }
        let kind = |t: &str| match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            _ => true,
        };
        let every = |key: &str, f: &dyn Fn(&Value) -> bool| {
            s.get(key)
                .and_then(Value::as_array)
                .is_none_or(|all| all.iter().all(f))
        };
        let typed = match s.get("type") {
            Some(Value::String(t)) => kind(t),
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).any(kind),
            _ => true,
        };
        let object = v.as_object();
        let required = every("required", &|k| {
            object.is_none_or(|o| k.as_str().is_some_and(|k| o.contains_key(k)))
        });
        let props = s.get("properties").and_then(Value::as_object);
        let properties = match (object, props) {
            (Some(o), Some(p)) => o
                .iter()
                .all(|(k, x)| p.get(k).is_none_or(|ps| valid(x, ps, doc))),
            _ => true,
        };
        let closed = s.get("additionalProperties") == Some(&Value::Bool(false));
        let additional = !closed
            || object.is_none_or(|o| o.keys().all(|k| props.is_some_and(|p| p.contains_key(k))));
        let array = v.as_array();
        let items = match (array, s.get("items")) {
            (Some(a), Some(i)) => a.iter().all(|x| valid(x, i, doc)),
            _ => true,
        };
        let prefix = match (array, s.get("prefixItems").and_then(Value::as_array)) {
            (Some(a), Some(p)) => a.iter().zip(p).all(|(x, ps)| valid(x, ps, doc)),
            _ => true,
        };
        let contains = match (array, s.get("contains")) {
            (Some(a), Some(c)) => a.iter().any(|x| valid(x, c, doc)),
            _ => true,
        };
        let min_items = match (array, s.get("minItems").and_then(Value::as_u64)) {
            (Some(a), Some(n)) => a.len() as u64 >= n,
            _ => true,
        };
        let min_length = match (v.as_str(), s.get("minLength").and_then(Value::as_u64)) {
            (Some(t), Some(n)) => t.chars().count() as u64 >= n,
            _ => true,
        };
        let constant = s.get("const").is_none_or(|c| c == v);
        let any_of = s
            .get("anyOf")
            .and_then(Value::as_array)
            .is_none_or(|all| all.iter().any(|x| valid(v, x, doc)));
        let one_of = s
            .get("oneOf")
            .and_then(Value::as_array)
            .is_none_or(|all| all.iter().filter(|x| valid(v, x, doc)).count() == 1);
        let all_of = every("allOf", &|x| valid(v, x, doc));
        let not = s.get("not").is_none_or(|x| !valid(v, x, doc));
        typed
            && required
            && properties
            && additional
            && items
            && prefix
            && contains
            && min_items
            && min_length
            && constant
            && any_of
            && one_of
            && all_of
            && not
    }

    #[test]
    fn the_parser_records_what_the_schema_describes_and_refuses_what_it_refuses() {
        let doc = serde_json::to_value(crate::http::openapi()).unwrap();
        let shapes = super::reply_shapes(true);
        let described = [
            json!({"choices": [{"message": {"role": "assistant", "content": "Hi."}}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": 2}}),
            json!({"output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi."}]},
                              {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]}),
            json!({"role": "assistant", "content": "Hi."}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Hi."},
                   {"type": "tool_use", "id": "c1", "name": "f", "input": {}}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi."}]}}]}),
            json!({"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}),
            json!({"output": {"message": {"role": "assistant", "content": [{"text": "Hi."}]}},
                   "usage": {"inputTokens": 3, "outputTokens": 1}}),
            json!({"role": "assistant", "content": [{"toolUse": {"toolUseId": "c1", "name": "f", "input": {}}}]}),
        ];
        for reply in described {
            assert!(valid(&reply, &shapes, &doc), "the schema refuses {reply}");
            let parsed = promptd_core::formats::replies::reply_with_usage(reply.clone());
            assert!(parsed.is_ok(), "the parser refuses {reply}: {parsed:?}");
        }
        let refused = [
            json!({"foo": 1}),
            json!({"choices": []}),
            json!({"role": "tool", "content": "no call id"}),
            json!({"output": [{"type": "function_call", "call_id": "", "name": "f"}]}),
        ];
        for reply in refused {
            let parsed = promptd_core::formats::replies::reply_with_usage(reply.clone());
            assert!(parsed.is_err(), "the parser records {reply}");
            assert!(!valid(&reply, &shapes, &doc), "the schema takes {reply}");
        }
    }
}
