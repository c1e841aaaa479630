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
pub mod json_text;
mod neutral;
mod openai;
pub mod pieces;
pub mod replies;
mod responses;
pub mod transcript;

pub use neutral::{neutral_message, neutral_text};

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
mod tests;
