//! Rendering a neutral [`FrozenRequest`] into provider request bodies (Q8).
//!
//! Pure functions: the same request always renders to the same JSON value, and because
//! `serde_json` is built without `preserve_order`, object keys serialize sorted, so the same
//! request also gives the same bytes. Nothing here panics on any input.
//!
//! One module per body shape: `neutral`, `openai` (Chat Completions), `responses` (OpenAI
//! Responses), `anthropic` (Messages), `gemini` (`generateContent`) and `bedrock` (Converse). This module holds [`Format`], the model settings a
//! body carries, the dispatch ([`render`]) and the helpers both OpenAI shapes share.
//! [`replies`] reads a model's reply in any of these shapes; [`transcript`] renders a
//! session's messages once per format as they are appended.

mod anthropic;
pub mod bedrock;
pub mod dialect;
pub mod gemini;
mod neutral;
mod openai;
pub mod pieces;
pub mod replies;
mod responses;
pub mod transcript;

pub use neutral::neutral_message;

use serde_json::{json, Map, Value};

use crate::conversation::content::Block;
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};

/// The shape of the request body to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The project's own shape: model, system, tools, messages as serde gives them.
    #[default]
    Neutral,
    /// OpenAI Chat Completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
    /// Google Gemini `generateContent`, as the SDKs' `generate_content` takes it.
    Gemini,
    /// AWS Bedrock Converse, as `bedrock-runtime`'s `converse` takes it.
    Bedrock,
}

/// A name that is no [`Format`]'s: its message names the value and every format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown format `{0}`; use {list}", list = Format::ALL.map(Format::as_str).join(", "))]
pub struct UnknownFormat(pub String);

/// Parses a format name as written in config, on the command line and in the API.
impl std::str::FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Format, UnknownFormat> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

impl Format {
    /// The format's name, the inverse of its [`FromStr`](std::str::FromStr) impl.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Neutral => "neutral",
            Format::Openai => "openai",
            Format::Anthropic => "anthropic",
            Format::OpenaiResponses => "openai-responses",
            Format::Gemini => "gemini",
            Format::Bedrock => "bedrock",
        }
    }

    /// Every format, in a fixed order.
    pub const ALL: [Format; 6] = [
        Format::Neutral,
        Format::Openai,
        Format::Anthropic,
        Format::OpenaiResponses,
        Format::Gemini,
        Format::Bedrock,
    ];

    /// The model settings a body in this format cannot do without (the official SDKs refuse
    /// a call without them).
    pub fn required_settings(self) -> &'static [&'static str] {
        match self {
            Format::Neutral => &[],
            Format::Openai | Format::OpenaiResponses | Format::Gemini | Format::Bedrock => {
                &["model"]
            }
            Format::Anthropic => &["model", "max_tokens"],
        }
    }
}

/// Tables inside `model` that hold one provider format's own settings.
pub const PROVIDER_TABLES: [&str; 5] = [
    "openai",
    "anthropic",
    "openai-responses",
    "gemini",
    "bedrock",
];

/// What a body in `format` carries of the merged model settings: every key that is not a
/// provider table, overridden by the keys of the format's own table (`model.anthropic`, …).
/// The neutral format shows the settings as configured, provider tables included.
pub fn settings(model: &Map<String, Value>, format: Format) -> Map<String, Value> {
    if format == Format::Neutral {
        return model.clone();
    }
    let mut out: Map<String, Value> = model
        .iter()
        .filter(|(key, _)| !PROVIDER_TABLES.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Responses is OpenAI too: it takes the `openai` table, then its own; and it names the
    // output bound `max_output_tokens` (it refuses `max_tokens`).
    let tables: &[Format] = match format {
        Format::OpenaiResponses => &[Format::Openai, Format::OpenaiResponses],
        _ => &[format],
    };
    for table in tables {
        if let Some(Value::Object(own)) = model.get(table.as_str()) {
            out.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if format == Format::OpenaiResponses && *table == Format::Openai {
            if let Some(max) = out.remove("max_tokens") {
                out.entry("max_output_tokens").or_insert(max);
            }
        }
    }
    out
}

/// One key of [`settings`]`(model, format)`, read in place: the format's own table (the
/// `openai` one too for Responses) over the keys for every format, without copying the map.
/// For a key the Responses format renames (`max_tokens`), use [`settings`].
pub fn setting<'a>(model: &'a Map<String, Value>, format: Format, key: &str) -> Option<&'a Value> {
    if format == Format::Neutral {
        return model.get(key);
    }
    let tables: &[Format] = match format {
        Format::OpenaiResponses => &[Format::OpenaiResponses, Format::Openai],
        _ => &[format],
    };
    tables
        .iter()
        .find_map(|t| model.get(t.as_str()).and_then(|own| own.get(key)))
        .or_else(|| model.get(key).filter(|_| !PROVIDER_TABLES.contains(&key)))
}

/// The settings of an OpenAI body, with the header's `prompt_cache_key` (one per session, so
/// OpenAI routes a session's requests to the same prompt cache) unless the config sets its
/// own; `prompt_cache_key = false` in the config leaves it out.
fn openai_settings(header: &Header, format: Format) -> Map<String, Value> {
    let mut body = settings(&header.model, format);
    // The dialect is for Chat Completions; the Responses body takes the same table without it.
    let dialect = match format {
        Format::Openai => dialect::Dialect::of(&header.model),
        _ => dialect::Dialect::Openai,
    };
    dialect.adjust(&mut body);
    if dialect != dialect::Dialect::Openai {
        return body;
    }
    match (body.get("prompt_cache_key"), &header.cache_key) {
        (Some(Value::Bool(false)), _) => {
            body.remove("prompt_cache_key");
        }
        (None, Some(key)) => {
            body.insert("prompt_cache_key".into(), json!(key));
        }
        _ => {}
    }
    body
}

/// The model a provider body asks for (`model`, or Bedrock's `modelId`), empty when none.
pub fn model_of_body(body: &Value) -> &str {
    body.get("model")
        .or_else(|| body.get("modelId"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Refuses a format whose required settings are missing from `model` (`missing_model_setting`).
pub fn check_settings(model: &Map<String, Value>, format: Format) -> Result<(), crate::Error> {
    let settings = settings(model, format);
    if format == Format::Openai {
        dialect::check(&settings).map_err(crate::Error::ConfigInvalid)?;
    }
    match format
        .required_settings()
        .iter()
        .find(|key| settings.get(**key).is_none_or(Value::is_null))
    {
        Some(key) => Err(crate::Error::MissingModelSetting {
            format: format.as_str(),
            key,
        }),
        None => Ok(()),
    }
}

/// Renders `request` as a request body in `format`.
pub fn render(request: &FrozenRequest, format: Format) -> Value {
    let mut body = head(&request.header, format, request.shown_tools.as_deref());
    let messages = match format {
        Format::Neutral => neutral::messages(request),
        Format::Openai => openai::messages(request),
        Format::Anthropic => anthropic::messages(request),
        Format::OpenaiResponses => responses::messages(request),
        Format::Gemini => gemini::messages(request),
        Format::Bedrock => bedrock::messages(request),
    };
    body.insert(list_key(format).into(), Value::Array(messages));
    Value::Object(body)
}

/// The key of the conversation in a body: `input` for Responses, `contents` for Gemini, else
/// `messages`.
pub(crate) fn list_key(format: Format) -> &'static str {
    match format {
        Format::OpenaiResponses => "input",
        Format::Gemini => "contents",
        _ => "messages",
    }
}

/// The `tools` of a body in `format`: `None` where the format leaves an empty list out.
/// With a shown subset (`tool_subset = "allowed_tools"`), OpenAI bodies keep every tool (and
/// narrow the call with `tool_choice`); the others can only shrink the array.
pub(crate) fn tools_value(
    header: &Header,
    format: Format,
    shown: Option<&[String]>,
) -> Option<Value> {
    // A server that takes no `allowed_tools` gets the shown tools only, as the other formats.
    let keeps_all = match format {
        Format::Openai => dialect::Dialect::of(&header.model).allowed_tools(),
        Format::OpenaiResponses => true,
        _ => false,
    };
    let arrayed: Vec<&ToolSpec> = match shown {
        Some(shown) if !keeps_all => header
            .tools
            .iter()
            .filter(|t| shown.contains(&t.name))
            .collect(),
        _ => header.tools.iter().collect(),
    };
    if arrayed.is_empty() && format != Format::Neutral {
        return None;
    }
    // K9: deferred tools go after the provider's tool search, out of the cached prefix.
    if arrayed.iter().any(|t| t.defer.is_some()) {
        match format {
            Format::Anthropic => return Some(anthropic::deferring(header, &arrayed)),
            Format::OpenaiResponses => return Some(responses::deferring(&arrayed)),
            // Chat Completions, Gemini and Converse have no tool search (every tool is sent),
            // and the neutral shape shows `defer`.
            Format::Openai | Format::Neutral | Format::Gemini | Format::Bedrock => {}
        }
    }
    if format == Format::Gemini {
        return Some(gemini::tools(&arrayed));
    }
    let count = arrayed.len();
    let tools = arrayed.iter().enumerate().map(|(i, tool)| match format {
        Format::Neutral => neutral::tool(tool),
        Format::Openai => openai::tool(tool),
        Format::OpenaiResponses => responses::tool(tool),
        Format::Anthropic => anthropic::anthropic_tool(header, tool, i + 1 == count),
        Format::Gemini | Format::Bedrock => bedrock::tool(tool),
    });
    Some(Value::Array(tools.collect()))
}

/// Everything of the body but `messages`: model settings, system prompt, tools.
pub(crate) fn head(
    header: &Header,
    format: Format,
    shown: Option<&[String]>,
) -> Map<String, Value> {
    let tools = tools_value(header, format, shown);
    match format {
        Format::Neutral => neutral::head(header, tools),
        Format::Openai => openai::head(header, tools, shown),
        Format::OpenaiResponses => responses::head(header, tools, shown),
        Format::Anthropic => anthropic::head(header, tools),
        Format::Gemini => gemini::head(header, tools),
        Format::Bedrock => bedrock::head(header, tools),
    }
}

/// OpenAI's `tool_choice` for a shown subset: `allowed_tools` with the subset, or `none` when
/// nothing is shown (the API wants at least one allowed tool).
fn allowed_tools(shown: &[String], mut fields: Value) -> Value {
    if shown.is_empty() {
        return json!("none");
    }
    if let Value::Object(map) = &mut fields {
        map.insert("type".into(), json!("allowed_tools"));
    }
    fields
}

/// Why `format` cannot carry `message`, if it cannot: a PDF by URL in Chat Completions, which
/// takes files as base64 data only; an image or document by URL in Converse, which takes bytes
/// (or an S3 location, with a format a URL does not say).
pub fn unsupported(format: Format, message: &Message) -> Option<&'static str> {
    let (Message::User { content, .. } | Message::Tool { content, .. }) = message else {
        return None;
    };
    content
        .blocks()
        .iter()
        .find_map(|block| match (format, block) {
            (Format::Openai, Block::Document { url: Some(_), .. }) => {
                Some("a document by URL (Chat Completions takes PDFs as base64 data only)")
            }
            (Format::Bedrock, Block::Image { url: Some(_), .. }) => {
                Some("an image by URL (Converse takes images as bytes)")
            }
            (Format::Bedrock, Block::Document { url: Some(_), .. }) => {
                Some("a document by URL (Converse takes documents as bytes)")
            }
            _ => None,
        })
}

/// Refuses a tool `format` cannot carry by its name: promptd's names match
/// `^[a-zA-Z0-9_-]{1,64}$`, and Gemini's function names must start with a letter or `_`.
pub fn check_tool_name(format: Format, name: &str) -> Result<(), crate::Error> {
    let starts = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if format == Format::Gemini && !starts {
        return Err(crate::Error::UnsupportedTool {
            format: format.as_str(),
            tool: name.to_string(),
            rule: "Gemini's function names start with a letter or an underscore",
        });
    }
    Ok(())
}

/// A call's arguments as OpenAI's JSON string: as the model wrote them when known.
fn openai_arguments(call: &crate::conversation::ToolCall) -> String {
    call.arguments_text.clone().unwrap_or_else(|| {
        serde_json::to_string(&call.arguments).unwrap_or_else(|_| "{}".to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Header, ToolCall};

    fn fixture() -> FrozenRequest {
        let mut model = Map::new();
        model.insert("model".into(), json!("test-model"));
        model.insert("max_tokens".into(), json!(1024));
        FrozenRequest {
            shown_tools: None,
            header: Header {
                layout: 0,
                cache_key: None,
                cache_ttl: None,
                model,
                system: "You are Ada.".into(),
                tools: vec![
                    ToolSpec {
                        name: "read_file".into(),
                        description: "Read a file.".into(),
                        parameters: json!({
                            "type": "object",
                            "properties": { "path": { "type": "string" } },
                            "required": ["path"],
                        }),
                        defer: None,
                    },
                    ToolSpec {
                        name: "list-dir".into(),
                        description: "List a directory.".into(),
                        parameters: json!({ "type": "object", "properties": {} }),
                        defer: None,
                    },
                ],
            },
            messages: vec![
                Message::user("Show me main.rs"),
                Message::Assistant {
                    content: "Reading it.".into(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "read_file".into(),
                        arguments: json!({ "path": "src/main.rs" }),
                        arguments_text: None,
                    }],
                    blocks: Vec::new(),
                    native: None,
                },
                Message::Tool {
                    tool_call_id: "call_1".into(),
                    content: "fn main() {}".into(),
                    is_error: false,
                },
                Message::snapshot("cwd: /work"),
            ],
        }
    }

    /// A fixture exercising the edge cases: tool errors, tool-only and empty assistant turns,
    /// consecutive user messages.
    fn edge_fixture() -> FrozenRequest {
        let mut request = fixture();
        request.messages = vec![
            Message::user("one"),
            Message::user("two"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: "a".into(),
                        name: "read_file".into(),
                        arguments: json!({ "path": "x" }),
                        arguments_text: None,
                    },
                    ToolCall {
                        id: "b".into(),
                        name: "list-dir".into(),
                        arguments: json!({}),
                        arguments_text: None,
                    },
                ],
                blocks: Vec::new(),
                native: None,
            },
            Message::Tool {
                tool_call_id: "a".into(),
                content: "no such file".into(),
                is_error: true,
            },
            Message::Tool {
                tool_call_id: "b".into(),
                content: "".into(),
                is_error: false,
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![],
                blocks: Vec::new(),
                native: None,
            },
            Message::Assistant {
                content: "Done.".into(),
                tool_calls: vec![],
                blocks: Vec::new(),
                native: None,
            },
            Message::snapshot("cwd: /work"),
        ];
        request
    }

    fn bare() -> FrozenRequest {
        FrozenRequest {
            shown_tools: None,
            header: Header {
                layout: 0,
                cache_key: None,
                cache_ttl: None,
                model: Map::new(),
                system: String::new(),
                tools: vec![],
            },
            messages: vec![Message::user("hi")],
        }
    }

    const ALL: [Format; 3] = [Format::Neutral, Format::Openai, Format::Anthropic];

    #[test]
    fn q8_format_parse_round_trips() {
        for format in ALL {
            assert_eq!(format.as_str().parse(), Ok(format));
            let from_serde: Format =
                serde_json::from_value(json!(format.as_str())).expect("deserializes");
            assert_eq!(from_serde, format);
        }
        assert_eq!(
            "OpenAI".parse::<Format>().unwrap_err().to_string(),
            "unknown format `OpenAI`; use neutral, openai, anthropic, openai-responses, gemini, bedrock"
        );
        assert_eq!("".parse::<Format>(), Err(UnknownFormat(String::new())));
        assert_eq!(Format::default(), Format::Neutral);
    }

    #[test]
    fn q8_neutral_exact() {
        let expected = json!({
            "model": { "model": "test-model", "max_tokens": 1024 },
            "system": "You are Ada.",
            "tools": [
                {
                    "name": "read_file",
                    "description": "Read a file.",
                    "parameters": {
                        "type": "object",
                        "properties": { "path": { "type": "string" } },
                        "required": ["path"],
                    },
                },
                {
                    "name": "list-dir",
                    "description": "List a directory.",
                    "parameters": { "type": "object", "properties": {} },
                },
            ],
            "messages": [
                { "role": "user", "content": "Show me main.rs" },
                {
                    "role": "assistant",
                    "content": "Reading it.",
                    "tool_calls": [
                        { "id": "call_1", "name": "read_file", "arguments": { "path": "src/main.rs" } },
                    ],
                },
                { "role": "tool", "tool_call_id": "call_1", "content": "fn main() {}" },
                { "role": "user", "content": "cwd: /work", "snapshot": true },
            ],
        });
        assert_eq!(render(&fixture(), Format::Neutral), expected);
    }

    #[test]
    fn q8_neutral_messages_round_trip() {
        let request = edge_fixture();
        let body = render(&request, Format::Neutral);
        let messages: Vec<Message> =
            serde_json::from_value(body["messages"].clone()).expect("messages deserialize");
        assert_eq!(messages, request.messages);
    }

    #[test]
    fn q8_openai_exact() {
        let expected = json!({
            "model": "test-model",
            "max_tokens": 1024,
            "messages": [
                { "role": "system", "content": "You are Ada." },
                { "role": "user", "content": "Show me main.rs" },
                {
                    "role": "assistant",
                    "content": "Reading it.",
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": { "name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}" },
                    }],
                },
                { "role": "tool", "tool_call_id": "call_1", "content": "fn main() {}" },
                { "role": "user", "content": "cwd: /work" },
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "description": "Read a file.",
                        "parameters": {
                            "type": "object",
                            "properties": { "path": { "type": "string" } },
                            "required": ["path"],
                        },
                    },
                },
                {
                    "type": "function",
                    "function": {
                        "name": "list-dir",
                        "description": "List a directory.",
                        "parameters": { "type": "object", "properties": {} },
                    },
                },
            ],
        });
        assert_eq!(render(&fixture(), Format::Openai), expected);
    }

    #[test]
    fn q8_openai_edge_cases() {
        let body = render(&edge_fixture(), Format::Openai);
        let messages = body["messages"].as_array().expect("messages");
        // system, 2 users, tool-call assistant, 2 tools, empty assistant, text assistant, snapshot.
        assert_eq!(messages.len(), 9);
        assert_eq!(messages[3]["content"], Value::Null);
        assert_eq!(messages[3]["tool_calls"][1]["function"]["arguments"], "{}");
        // OpenAI has no is_error on tool messages.
        assert_eq!(
            messages[4],
            json!({ "role": "tool", "tool_call_id": "a", "content": "no such file" })
        );
        assert_eq!(messages[6], json!({ "role": "assistant", "content": null }));
    }

    #[test]
    fn q8_anthropic_exact() {
        let expected = json!({
            "model": "test-model",
            "max_tokens": 1024,
            "system": [
                { "type": "text", "text": "You are Ada.", "cache_control": { "type": "ephemeral" } },
            ],
            "tools": [
                {
                    "name": "read_file",
                    "description": "Read a file.",
                    "input_schema": {
                        "type": "object",
                        "properties": { "path": { "type": "string" } },
                        "required": ["path"],
                    },
                },
                {
                    "name": "list-dir",
                    "description": "List a directory.",
                    "input_schema": { "type": "object", "properties": {} },
                    "cache_control": { "type": "ephemeral" },
                },
            ],
            "messages": [
                { "role": "user", "content": [{ "type": "text", "text": "Show me main.rs" }] },
                {
                    "role": "assistant",
                    "content": [
                        { "type": "text", "text": "Reading it." },
                        { "type": "tool_use", "id": "call_1", "name": "read_file", "input": { "path": "src/main.rs" } },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        { "type": "tool_result", "tool_use_id": "call_1", "content": "fn main() {}" },
                        { "type": "text", "text": "cwd: /work" },
                    ],
                },
            ],
        });
        assert_eq!(render(&fixture(), Format::Anthropic), expected);
    }

    #[test]
    fn q8_anthropic_edge_cases() {
        let expected_messages = json!([
            {
                "role": "user",
                "content": [{ "type": "text", "text": "one" }, { "type": "text", "text": "two" }],
            },
            {
                "role": "assistant",
                "content": [
                    { "type": "tool_use", "id": "a", "name": "read_file", "input": { "path": "x" } },
                    { "type": "tool_use", "id": "b", "name": "list-dir", "input": {} },
                ],
            },
            {
                "role": "user",
                "content": [
                    { "type": "tool_result", "tool_use_id": "a", "content": "no such file", "is_error": true },
                    { "type": "tool_result", "tool_use_id": "b", "content": "" },
                ],
            },
            // The empty assistant message is skipped; "Done." stands alone.
            { "role": "assistant", "content": [{ "type": "text", "text": "Done." }] },
            { "role": "user", "content": [{ "type": "text", "text": "cwd: /work" }] },
        ]);
        let body = render(&edge_fixture(), Format::Anthropic);
        assert_eq!(body["messages"], expected_messages);
    }

    #[test]
    fn q8_gemini_exact() {
        let expected = json!({
            "model": "test-model",
            "config": {
                "maxOutputTokens": 1024,
                "systemInstruction": { "parts": [{ "text": "You are Ada." }] },
                "tools": [{ "functionDeclarations": [
                    {
                        "name": "read_file",
                        "description": "Read a file.",
                        "parametersJsonSchema": {
                            "type": "object",
                            "properties": { "path": { "type": "string" } },
                            "required": ["path"],
                        },
                    },
                    {
                        "name": "list-dir",
                        "description": "List a directory.",
                        "parametersJsonSchema": { "type": "object", "properties": {} },
                    },
                ]}],
            },
            "contents": [
                { "role": "user", "parts": [{ "text": "Show me main.rs" }] },
                { "role": "model", "parts": [
                    { "text": "Reading it." },
                    // A call Gemini did not write carries the documented dummy signature.
                    { "functionCall": { "id": "call_1", "name": "read_file", "args": { "path": "src/main.rs" } },
                      "thoughtSignature": "skip_thought_signature_validator" },
                ]},
                { "role": "user", "parts": [
                    { "functionResponse": { "id": "call_1", "name": "read_file", "response": { "output": "fn main() {}" } } },
                    { "text": "cwd: /work" },
                ]},
            ],
        });
        assert_eq!(render(&fixture(), Format::Gemini), expected);
    }

    #[test]
    fn q8_bedrock_exact() {
        let point = json!({ "cachePoint": { "type": "default" } });
        let expected = json!({
            "modelId": "test-model",
            "inferenceConfig": { "maxTokens": 1024 },
            "system": [{ "text": "You are Ada." }, point],
            "toolConfig": { "tools": [
                { "toolSpec": {
                    "name": "read_file",
                    "description": "Read a file.",
                    "inputSchema": { "json": {
                        "type": "object",
                        "properties": { "path": { "type": "string" } },
                        "required": ["path"],
                    }},
                }},
                { "toolSpec": {
                    "name": "list-dir",
                    "description": "List a directory.",
                    "inputSchema": { "json": { "type": "object", "properties": {} } },
                }},
                point,
            ]},
            "messages": [
                { "role": "user", "content": [{ "text": "Show me main.rs" }] },
                { "role": "assistant", "content": [
                    { "text": "Reading it." },
                    { "toolUse": { "toolUseId": "call_1", "name": "read_file", "input": { "path": "src/main.rs" } } },
                ]},
                { "role": "user", "content": [
                    { "toolResult": { "toolUseId": "call_1", "content": [{ "text": "fn main() {}" }] } },
                    { "text": "cwd: /work" },
                ]},
            ],
        });
        assert_eq!(render(&fixture(), Format::Bedrock), expected);
        // Layout 1 adds the rolling cache point at the end of the last turn; an hour's TTL
        // goes on every point.
        let mut request = fixture();
        request.header.layout = crate::conversation::LAYOUT;
        request.header.cache_ttl = Some(crate::conversation::Ttl::Hour1);
        let body = render(&request, Format::Bedrock);
        let hour = json!({ "cachePoint": { "type": "default", "ttl": "1h" } });
        assert_eq!(body["messages"][2]["content"][2], hour);
        assert_eq!(body["system"][1], hour);
        assert_eq!(body["toolConfig"]["tools"][2], hour);
        assert_eq!(
            body.to_string().matches("cachePoint").count(),
            3,
            "at most Bedrock's 4"
        );
    }

    #[test]
    fn q8_bedrock_errors_and_media() {
        let mut request = edge_fixture();
        request.messages.push(Message::User {
            content: crate::conversation::Content::Blocks(vec![
                Block::Image {
                    media_type: Some("image/webp".into()),
                    data: Some("UklGRg==".into()),
                    url: None,
                },
                Block::Document {
                    media_type: Some("application/pdf".into()),
                    data: Some("JVBERi0=".into()),
                    url: None,
                    name: Some("Q3 report (final).v2.pdf".into()),
                },
            ]),
            snapshot: false,
        });
        let body = render(&request, Format::Bedrock);
        let messages = body["messages"].as_array().unwrap();
        let result = &messages[2]["content"][0]["toolResult"];
        assert_eq!(result["status"], "error");
        assert_eq!(result["content"], json!([{ "text": "no such file" }]));
        let last = messages.last().unwrap()["content"].as_array().unwrap();
        assert_eq!(
            last[last.len() - 1],
            json!({ "document": { "format": "pdf", "name": "Q3 report (final)-v2", "source": { "bytes": "JVBERi0=" } } })
        );
        assert_eq!(
            last[last.len() - 2],
            json!({ "image": { "format": "webp", "source": { "bytes": "UklGRg==" } } })
        );
        // Roles alternate from user, as Converse wants.
        for (i, m) in messages.iter().enumerate() {
            assert_eq!(m["role"], if i % 2 == 0 { "user" } else { "assistant" });
        }
        assert_eq!(bedrock::document_name(None), "document");
        assert_eq!(bedrock::document_name(Some("  a  b.pdf")), "a b");
        assert_eq!(bedrock::document_name(Some("../..")), "----");
        let url = Message::User {
            content: crate::conversation::Content::Blocks(vec![Block::Image {
                media_type: None,
                data: None,
                url: Some("https://x/a.png".into()),
            }]),
            snapshot: false,
        };
        assert!(unsupported(Format::Bedrock, &url).is_some());
        assert!(unsupported(Format::Gemini, &url).is_none());
    }

    /// Gemini 3 refuses earlier function calls without the signature the model returned with
    /// them, and a signature does not carry to another model: the recorded parts go back as
    /// they came to the model that wrote them, and with the documented dummy to another.
    #[test]
    fn q8_gemini_signatures_go_back_exactly_to_their_model_only() {
        let response = json!({
            "candidates": [{ "content": { "role": "model", "parts": [
                { "text": "thinking...", "thought": true, "thoughtSignature": "dGhvdWdodA==" },
                { "function_call": { "name": "read_file", "args": { "path": "a" } }, "thought_signature": "c2lnLTE=" },
                { "functionCall": { "name": "list-dir", "args": {} } },
            ]}, "finishReason": "STOP" }],
            "modelVersion": "gemini-3-pro-preview",
            "usageMetadata": { "promptTokenCount": 5000, "cachedContentTokenCount": 4096,
                "candidatesTokenCount": 20, "thoughtsTokenCount": 30 },
        });
        assert_eq!(replies::format_of(&response), Some(Format::Gemini));
        let (mut reply, usage) = replies::reply_with_usage(response).unwrap();
        let usage = usage.unwrap();
        assert_eq!(
            (usage.input_tokens, usage.cached_tokens, usage.output_tokens),
            (Some(5000), Some(4096), Some(50))
        );
        replies::name_calls(&mut reply, 7);
        let Message::Assistant {
            content,
            tool_calls,
            ..
        } = &reply
        else {
            panic!()
        };
        assert_eq!(content, "", "a thought is not the answer");
        let ids: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_7_0", "call_7_1"]);
        let mut request = fixture();
        request
            .header
            .model
            .insert("model".into(), json!("gemini-3-pro-preview"));
        request.messages = vec![
            Message::user("go"),
            reply,
            Message::Tool {
                tool_call_id: "call_7_0".into(),
                content: "A".into(),
                is_error: false,
            },
            Message::Tool {
                tool_call_id: "call_7_1".into(),
                content: "B".into(),
                is_error: true,
            },
        ];
        let body = render(&request, Format::Gemini);
        assert_eq!(
            body["contents"][1]["parts"],
            json!([
                { "text": "thinking...", "thought": true, "thoughtSignature": "dGhvdWdodA==" },
                { "functionCall": { "name": "read_file", "args": { "path": "a" } }, "thoughtSignature": "c2lnLTE=" },
                { "functionCall": { "name": "list-dir", "args": {} } },
            ]),
            "as recorded, keys in the JSON spelling"
        );
        // The calls had no ids: neither have their responses (Gemini matches them by name).
        assert_eq!(
            body["contents"][2]["parts"],
            json!([
                { "functionResponse": { "name": "read_file", "response": { "output": "A" } } },
                { "functionResponse": { "name": "list-dir", "response": { "error": "B" } } },
            ])
        );
        // Another model: no signature of the first, the dummy on the first call.
        request
            .header
            .model
            .insert("model".into(), json!("gemini-3-flash-preview"));
        let other = render(&request, Format::Gemini);
        assert_eq!(
            other["contents"][1]["parts"],
            json!([
                { "text": "thinking...", "thought": true },
                { "functionCall": { "name": "read_file", "args": { "path": "a" } }, "thoughtSignature": gemini::SKIP_SIGNATURE },
                { "functionCall": { "name": "list-dir", "args": {} } },
            ])
        );
    }

    #[test]
    fn q8_bedrock_replies_keep_their_blocks() {
        let response = json!({
            "ResponseMetadata": { "HTTPStatusCode": 200 },
            "output": { "message": { "role": "assistant", "content": [
                { "reasoningContent": { "reasoningText": { "text": "hm", "signature": "sig" } } },
                { "text": "Reading." },
                { "toolUse": { "toolUseId": "tu1", "name": "read_file", "input": { "path": "a" } } },
            ]}},
            "stopReason": "tool_use",
            "usage": { "inputTokens": 10, "outputTokens": 5, "totalTokens": 3015,
                "cacheReadInputTokens": 2000, "cacheWriteInputTokens": 1000,
                "cacheDetails": [{ "ttl": "1h", "inputTokens": 1000 }] },
            "metrics": { "latencyMs": 12 },
        });
        assert_eq!(replies::format_of(&response), Some(Format::Bedrock));
        let (reply, usage) = replies::reply_with_usage(response).unwrap();
        let usage = usage.unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.cached_tokens,
                usage.cache_write_tokens,
                usage.cache_write_1h_tokens
            ),
            (Some(3010), Some(2000), Some(1000), Some(1000))
        );
        let Message::Assistant {
            content,
            tool_calls,
            ..
        } = &reply
        else {
            panic!()
        };
        assert_eq!(
            (content.as_str(), tool_calls[0].id.as_str()),
            ("Reading.", "tu1")
        );
        let mut request = fixture();
        request.messages = vec![Message::user("go"), reply.clone()];
        let body = render(&request, Format::Bedrock);
        assert_eq!(
            body["messages"][1]["content"][0]["reasoningContent"]["reasoningText"]["signature"],
            "sig"
        );
        // The other formats see the text and the call.
        let anthropic = render(&request, Format::Anthropic);
        assert_eq!(anthropic["messages"][1]["content"][1]["type"], "tool_use");
        // Recorded in the log's neutral shape, it reads back the same.
        let again = replies::reply(neutral_message(&reply)).unwrap();
        assert_eq!(again, reply);
        let server = json!({"role": "assistant", "content": [{"text": "a"}, {"image": {}}]});
        assert!(replies::reply(server)
            .unwrap_err()
            .to_string()
            .contains("image"));
    }

    /// docs/formats.md, "Model settings": in a Gemini body every key but `model` goes into
    /// `config`, camel-cased, `max_tokens` as `maxOutputTokens`, `stop` as `stopSequences`, a
    /// key in Gemini's own spelling winning; in a Bedrock body the generic sampling keys go into
    /// `inferenceConfig`, whose own table wins, and the rest at the top as written.
    #[test]
    fn q8_gemini_and_bedrock_settings_are_mapped_as_documented() {
        let mut request = bare();
        let model = &mut request.header.model;
        for (k, v) in [
            ("model", json!("m")),
            ("max_tokens", json!(100)),
            ("top_p", json!(0.5)),
            ("stop", json!("END")),
            ("temperature", json!(0.2)),
        ] {
            model.insert(k.into(), v);
        }
        model.insert(
            "gemini".into(),
            json!({"maxOutputTokens": 9, "thinkingConfig": {"thinkingLevel": "low"}}),
        );
        model.insert("bedrock".into(), json!({"inferenceConfig": {"maxTokens": 7}, "performanceConfig": {"latency": "optimized"}}));
        let gemini = render(&request, Format::Gemini);
        assert_eq!(gemini["model"], "m");
        assert_eq!(
            gemini["config"],
            json!({"maxOutputTokens": 9, "topP": 0.5, "stopSequences": ["END"], "temperature": 0.2,
                "thinkingConfig": {"thinkingLevel": "low"}})
        );
        let bedrock = render(&request, Format::Bedrock);
        assert_eq!(bedrock["modelId"], "m");
        assert_eq!(
            bedrock["inferenceConfig"],
            json!({"maxTokens": 7, "topP": 0.5, "stopSequences": ["END"], "temperature": 0.2})
        );
        assert_eq!(
            bedrock["performanceConfig"],
            json!({"latency": "optimized"})
        );
        // One key read in place is the key of the merged settings.
        for format in Format::ALL {
            for key in [
                "model",
                "top_p",
                "maxOutputTokens",
                "inferenceConfig",
                "gemini",
            ] {
                assert_eq!(
                    setting(&request.header.model, format, key),
                    settings(&request.header.model, format).get(key),
                    "{} {key}",
                    format.as_str()
                );
            }
        }
    }

    /// Issue 33: a server that speaks Chat Completions gets what its docs say it takes.
    #[test]
    fn q8_openai_dialects_adjust_what_their_servers_refuse() {
        let mut request = fixture();
        request.header.cache_key = Some("promptd-coder".into());
        request.shown_tools = Some(vec!["list-dir".into()]);
        request
            .header
            .model
            .insert("max_completion_tokens".into(), json!(99));
        let openai = render(&request, Format::Openai);
        assert_eq!(openai["prompt_cache_key"], "promptd-coder");
        assert_eq!(openai["tool_choice"]["type"], "allowed_tools");
        assert_eq!(openai["tools"].as_array().unwrap().len(), 2);
        for (name, max) in [
            ("vllm", "max_completion_tokens"),
            ("llamacpp", "max_tokens"),
            ("ollama", "max_tokens"),
        ] {
            let mut r = request.clone();
            r.header.model.remove("max_tokens");
            r.header
                .model
                .insert("openai".into(), json!({"dialect": name}));
            let body = render(&r, Format::Openai);
            assert!(
                body.get("dialect").is_none() && body.get("prompt_cache_key").is_none(),
                "{body}"
            );
            assert!(
                body.get("tool_choice").is_none(),
                "{name}: no allowed_tools: {body}"
            );
            let tools: Vec<&str> = body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap())
                .collect();
            assert_eq!(tools, ["list-dir"], "{name}: the shown tools only");
            assert_eq!(body[max], 99, "{name}: {body}");
            // The Responses body never carries the key.
            assert!(render(&r, Format::OpenaiResponses).get("dialect").is_none());
        }
        let mut model = Map::new();
        model.insert("model".into(), json!("m"));
        model.insert("openai".into(), json!({"dialect": "tgi"}));
        let e = check_settings(&model, Format::Openai).unwrap_err();
        assert_eq!(e.code(), "config_invalid");
        assert!(
            e.to_string()
                .contains("unknown dialect `tgi`; use openai, vllm, llamacpp, ollama"),
            "{e}"
        );
    }

    // --- Shape checks, written from the providers' public API docs. ---

    fn valid_function_name(name: &str) -> bool {
        (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    fn check_openai_shape(body: &Value) {
        let messages = body["messages"].as_array().expect("messages is a list");
        for message in messages {
            let role = message["role"].as_str().expect("role is a string");
            assert!(
                ["system", "user", "assistant", "tool"].contains(&role),
                "unknown role {role}"
            );
            if role == "tool" {
                assert!(
                    message["tool_call_id"].is_string(),
                    "tool message without tool_call_id"
                );
            }
            if let Some(calls) = message.get("tool_calls") {
                assert_eq!(role, "assistant");
                for call in calls.as_array().expect("tool_calls is a list") {
                    assert!(call["id"].is_string());
                    assert_eq!(call["type"], "function");
                    let arguments = call["function"]["arguments"]
                        .as_str()
                        .expect("arguments is a string");
                    serde_json::from_str::<Value>(arguments).expect("arguments parse as JSON");
                }
            }
        }
        if let Some(tools) = body.get("tools") {
            for tool in tools.as_array().expect("tools is a list") {
                assert_eq!(tool["type"], "function");
                let name = tool["function"]["name"].as_str().expect("name is a string");
                assert!(valid_function_name(name), "bad function name {name:?}");
                assert!(tool["function"]["parameters"].is_object());
            }
        }
    }

    fn count_cache_control(value: &Value) -> usize {
        match value {
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| usize::from(k == "cache_control") + count_cache_control(v))
                .sum(),
            Value::Array(items) => items.iter().map(count_cache_control).sum(),
            _ => 0,
        }
    }

    fn check_anthropic_shape(body: &Value) {
        let messages = body["messages"].as_array().expect("messages is a list");
        let mut previous_tool_uses: Vec<&str> = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            let expected_role = if i % 2 == 0 { "user" } else { "assistant" };
            assert_eq!(
                message["role"], expected_role,
                "roles must alternate from user"
            );
            let blocks = message["content"].as_array().expect("content is a list");
            assert!(!blocks.is_empty(), "content must not be empty");
            let mut tool_uses = Vec::new();
            for block in blocks {
                match block["type"].as_str() {
                    Some("text") => assert!(block["text"].is_string()),
                    Some("tool_use") => {
                        assert_eq!(expected_role, "assistant");
                        assert!(block["input"].is_object());
                        assert!(block["name"].is_string());
                        tool_uses.push(block["id"].as_str().expect("tool_use id"));
                    }
                    Some("tool_result") => {
                        assert_eq!(expected_role, "user");
                        let id = block["tool_use_id"].as_str().expect("tool_use_id");
                        assert!(
                            previous_tool_uses.contains(&id),
                            "tool_result {id} answers no tool_use in the preceding message"
                        );
                    }
                    other => panic!("unknown block type {other:?}"),
                }
            }
            previous_tool_uses = tool_uses;
        }
        assert!(
            count_cache_control(body) <= 4,
            "too many cache_control markers"
        );
        if let Some(system) = body.get("system") {
            for block in system.as_array().expect("system is a list") {
                assert_eq!(block["type"], "text");
            }
        }
        if let Some(tools) = body.get("tools") {
            for tool in tools.as_array().expect("tools is a list") {
                assert!(tool["name"].is_string());
                assert!(tool["description"].is_string());
                assert!(tool["input_schema"].is_object());
            }
        }
    }

    #[test]
    fn q8_openai_shape() {
        for request in [fixture(), edge_fixture(), bare()] {
            check_openai_shape(&render(&request, Format::Openai));
        }
    }

    #[test]
    fn q8_anthropic_shape() {
        for request in [fixture(), edge_fixture(), bare()] {
            check_anthropic_shape(&render(&request, Format::Anthropic));
        }
    }

    #[test]
    fn q8_anthropic_cache_control_only_on_system_and_last_tool() {
        let body = render(&fixture(), Format::Anthropic);
        assert_eq!(count_cache_control(&body), 2);
        assert_eq!(count_cache_control(&body["messages"]), 0);
        assert!(body["tools"][0].get("cache_control").is_none());
        assert!(body["tools"][1].get("cache_control").is_some());
    }

    #[test]
    fn q8_empty_system_and_no_tools_are_omitted() {
        let request = bare();
        let openai = render(&request, Format::Openai);
        assert!(openai.get("tools").is_none());
        assert_eq!(
            openai["messages"],
            json!([{ "role": "user", "content": "hi" }])
        );
        let anthropic = render(&request, Format::Anthropic);
        assert!(anthropic.get("system").is_none());
        assert!(anthropic.get("tools").is_none());
        assert_eq!(
            anthropic,
            json!({ "messages": [{ "role": "user", "content": [{ "type": "text", "text": "hi" }] }] })
        );
        assert_eq!(
            render(&request, Format::Neutral),
            json!({
                "model": {},
                "system": "",
                "tools": [],
                "messages": [{ "role": "user", "content": "hi" }],
            })
        );
    }

    #[test]
    fn q8_deterministic() {
        for request in [fixture(), edge_fixture(), bare()] {
            for format in ALL {
                let first = serde_json::to_string(&render(&request, format)).expect("serializes");
                let second = serde_json::to_string(&render(&request, format)).expect("serializes");
                assert_eq!(first, second, "{} not deterministic", format.as_str());
            }
        }
        // Keys come out sorted (no preserve_order), independent of insertion order.
        let text = serde_json::to_string(&render(&bare(), Format::Neutral)).expect("serializes");
        assert_eq!(
            text,
            r#"{"messages":[{"content":"hi","role":"user"}],"model":{},"system":"","tools":[]}"#
        );
    }

    #[test]
    fn q8_model_keys_at_top_level() {
        let request = fixture();
        for format in [Format::Openai, Format::Anthropic] {
            let body = render(&request, format);
            assert_eq!(body["model"], "test-model", "{}", format.as_str());
            assert_eq!(body["max_tokens"], 1024, "{}", format.as_str());
        }
        let neutral = render(&request, Format::Neutral);
        assert_eq!(neutral["model"]["model"], "test-model");
        assert_eq!(neutral["model"]["max_tokens"], 1024);
    }

    #[test]
    fn q8_never_panics_on_odd_input() {
        // Non-object arguments/parameters, empty names, assistant-first conversations.
        let request = FrozenRequest {
            shown_tools: None,
            header: Header {
                layout: 0,
                cache_key: None,
                cache_ttl: None,
                model: Map::new(),
                system: String::new(),
                tools: vec![ToolSpec {
                    name: String::new(),
                    description: String::new(),
                    parameters: Value::Null,
                    defer: None,
                }],
            },
            messages: vec![
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: json!([1, "two", null]),
                        arguments_text: None,
                    }],
                    blocks: Vec::new(),
                    native: None,
                },
                Message::Tool {
                    tool_call_id: "missing".into(),
                    content: String::new().into(),
                    is_error: true,
                },
            ],
        };
        for format in ALL {
            let body = render(&request, format);
            assert!(serde_json::to_string(&body).is_ok());
        }
        let openai = render(&request, Format::Openai);
        assert_eq!(
            openai["messages"][0]["tool_calls"][0]["function"]["arguments"],
            r#"[1,"two",null]"#
        );
        assert_eq!(
            render(&FrozenRequest::default(), Format::Anthropic),
            json!({ "messages": [] })
        );
    }
}
