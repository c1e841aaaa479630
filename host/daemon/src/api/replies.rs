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
