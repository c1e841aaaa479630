//! Gemini's `generateContent` and `streamGenerateContent` through the gateway (G1, G4, G5):
//! the path that names the model, the splice into a client's body (the sections as a part of
//! `systemInstruction`, the runtime context as a text part closing the last user content, the
//! client's function declarations `deny_tools` names taken out), the client's `contents` read
//! as neutral messages, and a streamed reply's chunks folded into the one
//! `GenerateContentResponse` they stand for.
//!
//! Gemini caches implicitly (no breakpoints to keep or add) and has no deferred tool loading.
//! Its function calls may come without ids: a `functionResponse` is paired with its call by name
//! in the model content before it, and one whose call had no id is named by the call's place in
//! it ([`UNNAMED_CALL`]) until the step knows the name the log gave that call.

use std::ops::Range;

use serde_json::{Map, Value};

use super::body::{elements, members, ClientBody, Member};
use super::edits::{first_member, into_system_list, quoted, remove_items, Contributions, Part};
use super::edits::{Splice, SpliceSettings};
use super::{GatewayError, Ingress};
use crate::conversation::content::{Block, Content};
use crate::conversation::{Message, ToolCall};

/// The id a function response gets when its call carried none: this prefix and the call's
/// place among the function calls of the model content before it. A step of a session whose
/// last reply made that call names it as the log did (`call_{seq}_{n}`, see
/// [`crate::formats::replies::name_calls`]).
pub const UNNAMED_CALL: &str = "promptd:gemini-call:";

/// A Gemini path after the gateway's prefix: `/{version}/models/{model}:{method}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeminiPath {
    /// `v1beta` (the REST docs) or `v1` (google-genai's default), sent upstream as it came.
    pub version: String,
    /// The model, as the path names it.
    pub model: String,
    /// `generateContent` or `streamGenerateContent`.
    pub ingress: Ingress,
}

impl GeminiPath {
    /// Reads `path` (after `/gateway/{agent}`); `None` when it is no Gemini content method.
    pub fn parse(path: &str) -> Option<GeminiPath> {
        let rest = path.strip_prefix('/')?;
        let (version, rest) = rest.split_once('/')?;
        if !matches!(version, "v1" | "v1beta" | "v1alpha") {
            return None;
        }
        let (model, method) = rest.strip_prefix("models/")?.rsplit_once(':')?;
        let ingress = match method {
            "generateContent" => Ingress::GenerateContent,
            "streamGenerateContent" => Ingress::StreamGenerateContent,
            _ => return None,
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@');
        if model.is_empty() || !model.chars().all(valid) {
            return None;
        }
        Some(GeminiPath {
            version: version.to_string(),
            model: model.to_string(),
            ingress,
        })
    }
}

/// The member `key` of an object, under its JSON or its proto (snake_case) name, as the API's
/// parser takes either.
fn field<'m>(fields: &'m [Member], json: &str, proto: &str) -> Option<&'m Member> {
    (fields.iter().rev()).find(|m| m.key == json || m.key == proto)
}

fn body_field<'m>(body: &'m ClientBody<'_>, json: &str, proto: &str) -> Option<&'m Member> {
    field(&body.members, json, proto)
}

/// The client's function declarations: per element of `tools`, its span, its members, and its
/// declarations' spans with their names.
struct Tool {
    span: Range<usize>,
    others: usize,
    declarations: Vec<(Range<usize>, Option<String>)>,
}

fn tools(body: &ClientBody<'_>) -> Vec<Tool> {
    let text = body.text;
    let Some(list) = body.member("tools") else {
        return Vec::new();
    };
    let name_of = |item: &Range<usize>| -> Option<String> {
        let fields = members(text, item.clone())?;
        let name = fields.iter().rev().find(|m| m.key == "name")?;
        serde_json::from_str(&text[name.value.clone()]).ok()
    };
    (elements(text, list.value.clone())
        .unwrap_or_default()
        .into_iter())
    .map(|span| {
        let fields = members(text, span.clone()).unwrap_or_default();
        let declared = field(&fields, "functionDeclarations", "function_declarations");
        let declarations = declared
            .and_then(|d| elements(text, d.value.clone()))
            .unwrap_or_default()
            .into_iter()
            .map(|d| {
                let name = name_of(&d);
                (d, name)
            })
            .collect();
        Tool {
            others: fields.len() - usize::from(declared.is_some()),
            span,
            declarations,
        }
    })
    .collect()
}

/// The names of the client's function declarations, in its order.
pub fn tool_names(body: &ClientBody<'_>) -> Vec<String> {
    (tools(body).into_iter())
        .flat_map(|t| t.declarations.into_iter().filter_map(|(_, n)| n))
        .collect()
}

/// Plans the splice into a Gemini body (G4).
pub(super) fn splice(
    body: &ClientBody<'_>,
    contributions: &Contributions,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    deny_and_defer(body, settings, splice);
    if !contributions.system.is_empty() {
        system_instruction(body, &contributions.system, settings, splice)?;
    }
    if let Some(context) = &contributions.runtime_context {
        last_user_part(body, context, splice)?;
    }
    Ok(())
}

/// `deny_tools` takes the named declarations out (a tool left with none goes whole, as Gemini
/// refuses an empty `functionDeclarations`); `defer_tools` has nothing to mark on Gemini.
fn deny_and_defer(body: &ClientBody<'_>, settings: &SpliceSettings, splice: &mut Splice) {
    let (deny, defer) = (&settings.deny_tools, &settings.defer_tools);
    let tools = tools(body);
    let denied = |name: &Option<String>| name.as_ref().is_some_and(|n| deny.contains(n));
    if !deny.is_empty() {
        let whole = |t: &Tool| {
            t.others == 0
                && !t.declarations.is_empty()
                && t.declarations.iter().all(|(_, n)| denied(n))
        };
        let spans: Vec<Range<usize>> = tools.iter().map(|t| t.span.clone()).collect();
        remove_items(&spans, |i| whole(&tools[i]), splice);
        for tool in &tools {
            splice.denied.extend(
                (tool.declarations.iter())
                    .filter(|(_, n)| denied(n))
                    .filter_map(|(_, n)| n.clone()),
            );
            if !whole(tool) {
                let spans: Vec<Range<usize>> =
                    tool.declarations.iter().map(|(s, _)| s.clone()).collect();
                remove_items(&spans, |i| denied(&tool.declarations[i].1), splice);
            }
        }
    }
    let kept: Vec<String> = (tools.iter().flat_map(|t| t.declarations.iter()))
        .filter_map(|(_, n)| n.clone())
        .filter(|n| defer.contains(n) && !deny.contains(n))
        .collect();
    if !kept.is_empty() {
        splice.skipped.push(format!(
            "defer_tools: Gemini has no deferred loading, so these stay loaded: {}",
            kept.join(", ")
        ));
    }
}

/// The sections as one text part of `systemInstruction` (first, or last with
/// `client_system = "first"`); the field is made when the client sent none.
fn system_instruction(
    body: &ClientBody<'_>,
    system: &str,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let text = body.text;
    let part = format!("{{\"text\":{}}}", quoted(system));
    let Some(member) = body_field(body, "systemInstruction", "system_instruction") else {
        let value = format!("{{\"parts\":[{part}]}}");
        first_member(body, splice, "systemInstruction", &value, Part::Sections);
        return Ok(());
    };
    let range = member.value.clone();
    if &text[range.clone()] == "null" {
        splice.replace(range, format!("{{\"parts\":[{part}]}}"), Part::Sections);
        return Ok(());
    }
    let Some(fields) = members(text, range.clone()) else {
        return Err(GatewayError::InvalidBody(
            "`systemInstruction` must be a Content object ({\"parts\":[{\"text\":…}]})".into(),
        ));
    };
    let Some(parts) = field(&fields, "parts", "parts") else {
        let comma = if fields.is_empty() { "" } else { "," };
        splice.push(
            range.start + 1,
            format!("\"parts\":[{part}]{comma}"),
            Part::Sections,
        );
        return Ok(());
    };
    let what = "`systemInstruction.parts` must be an array of parts";
    let list = parts.value.clone();
    into_system_list(text, list, part, settings.client_system, splice, what)
}

/// The runtime context as a text part closing the last content when it is the user's (a
/// content without a role is the user's); after a model content (a prefill) it is left out,
/// said in `skipped`.
fn last_user_part(
    body: &ClientBody<'_>,
    context: &str,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let text = body.text;
    let Some(contents) = body.member("contents") else {
        return Ok(());
    };
    let items = elements(text, contents.value.clone()).unwrap_or_default();
    let Some(last) = items.last() else {
        splice
            .skipped
            .push("runtime context: the request has no contents".into());
        return Ok(());
    };
    let fields = members(text, last.clone()).ok_or_else(|| {
        GatewayError::InvalidBody("each of `contents` must be a Content object".into())
    })?;
    let role = field(&fields, "role", "role").map(|m| &text[m.value.clone()]);
    if !matches!(role, None | Some("\"user\"")) {
        splice
            .skipped
            .push("runtime context: the last content is not the user's".into());
        return Ok(());
    }
    let part = format!("{{\"text\":{}}}", quoted(context));
    let Some(parts) = field(&fields, "parts", "parts") else {
        return Err(GatewayError::InvalidBody(
            "the last content has no `parts`".into(),
        ));
    };
    let list = parts.value.clone();
    match elements(text, list.clone()) {
        Some(items) => match items.last() {
            Some(item) => splice.push(item.end, format!(",{part}"), Part::RuntimeContext),
            None => splice.push(list.start + 1, part, Part::RuntimeContext),
        },
        None => {
            return Err(GatewayError::InvalidBody(
                "the last content's `parts` must be an array".into(),
            ))
        }
    }
    Ok(())
}

// --- The client's conversation ---------------------------------------------------------------

/// The client's `contents` as neutral messages (G3): a model content's text (thoughts aside)
/// and function calls; a user content's function responses as tool results, its other parts
/// as a user message.
pub(super) fn conversation(contents: Vec<Value>) -> Vec<Message> {
    let mut out = Vec::new();
    // The calls of the model content before: name, id, answered yet.
    let mut calls: Vec<(String, Option<String>, bool)> = Vec::new();
    for content in contents {
        let content = crate::formats::gemini::camel_keys(content);
        let parts = match content.get("parts") {
            Some(Value::Array(parts)) => parts.as_slice(),
            _ => &[],
        };
        if content.get("role").and_then(Value::as_str) == Some("model") {
            let (message, made) = model_turn(parts);
            out.push(message);
            calls = made;
            continue;
        }
        let mut own = Vec::new();
        let mut responded = 0;
        for part in parts {
            if let Some(response) = part.get("functionResponse") {
                out.push(tool_result(response, &mut calls, responded));
                responded += 1;
            } else if let Some(block) = block(part) {
                own.push(block);
            }
        }
        if !own.is_empty() {
            out.push(Message::User {
                content: match own.as_slice() {
                    [Block::Text { text }] => Content::Text(text.clone()),
                    _ => Content::Blocks(own),
                },
                snapshot: false,
            });
        }
        calls.clear();
    }
    out
}

fn model_turn(parts: &[Value]) -> (Message, Vec<(String, Option<String>, bool)>) {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut calls = Vec::new();
    for part in parts {
        if let Some(call) = part.get("functionCall") {
            let s = |k: &str| call.get(k).and_then(Value::as_str).map(str::to_string);
            let name = s("name").unwrap_or_default();
            calls.push((name.clone(), s("id"), false));
            tool_calls.push(ToolCall {
                id: s("id").unwrap_or_default(),
                name,
                arguments: call
                    .get("args")
                    .filter(|a| a.is_object())
                    .cloned()
                    .unwrap_or(Value::Object(Map::new())),
                arguments_text: None,
            });
        } else if let Some(t) = part.get("text").and_then(Value::as_str) {
            if part.get("thought") != Some(&Value::Bool(true)) {
                text.push_str(t);
            }
        }
    }
    let message = Message::Assistant {
        content: text,
        tool_calls,
        blocks: Vec::new(),
        native: None,
    };
    (message, calls)
}

/// A function response as a tool result: its id, else its call's (the first unanswered call
/// of its name), else the call's place ([`UNNAMED_CALL`]).
fn tool_result(
    response: &Value,
    calls: &mut [(String, Option<String>, bool)],
    nth: usize,
) -> Message {
    let s = |k: &str| response.get(k).and_then(Value::as_str);
    let name = s("name").unwrap_or("");
    let at = calls.iter().position(|(n, _, used)| n == name && !used);
    if let Some(at) = at {
        calls[at].2 = true;
    }
    let id = match (s("id"), at) {
        (Some(id), _) => id.to_string(),
        (None, Some(at)) => match &calls[at].1 {
            Some(id) => id.clone(),
            None => format!("{UNNAMED_CALL}{at}"),
        },
        (None, None) => format!("{UNNAMED_CALL}{nth}"),
    };
    let body = response.get("response").unwrap_or(&Value::Null);
    let (text, is_error) = match (body.get("output"), body.get("error")) {
        (Some(Value::String(out)), _) => (out.clone(), false),
        (None, Some(Value::String(err))) => (err.clone(), true),
        _ => (body.to_string(), false),
    };
    Message::Tool {
        tool_call_id: id,
        content: Content::Text(text),
        is_error,
    }
}

/// A user part as a neutral block, when it has one.
fn block(part: &Value) -> Option<Block> {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    if let Some(text) = part.get("text").and_then(Value::as_str) {
        return Some(Block::Text {
            text: text.to_string(),
        });
    }
    let (media_type, data, url) = if let Some(inline) = part.get("inlineData") {
        (s(inline, "mimeType"), s(inline, "data"), None)
    } else {
        let file = part.get("fileData")?;
        (s(file, "mimeType"), None, s(file, "fileUri"))
    };
    let image = media_type
        .as_deref()
        .is_some_and(|m| m.starts_with("image/"));
    Some(match image {
        true => Block::Image {
            media_type,
            data,
            url,
        },
        false => Block::Document {
            media_type,
            data,
            url,
            name: None,
        },
    })
}

/// A tool result's id as the session's log named the call: an [`UNNAMED_CALL`] id becomes
/// `call_{seq}_{n}`, `seq` the log position of the reply that made the call.
pub fn resolve_call(id: &str, reply_seq: Option<u64>) -> Option<String> {
    let n: usize = id.strip_prefix(UNNAMED_CALL)?.parse().ok()?;
    Some(format!("call_{}_{n}", reply_seq?))
}

// --- Streamed replies ------------------------------------------------------------------------

/// What a chunk said of the stream, besides what it folded in.
#[derive(Debug, Default)]
pub(super) struct Folded {
    /// A candidate finished (`finishReason`): the stream reached its end.
    pub finished: bool,
    /// The chunk was an error.
    pub error: Option<String>,
}

/// Folds one streamed `GenerateContentResponse` into `reply` (G5): each candidate's parts are
/// appended (a text part joins the text part before it when both are thoughts or neither and
/// the one before has no signature yet; a function call comes whole), its other fields are
/// the latest chunk's; `usageMetadata` holds cumulative totals on every chunk, so the last one
/// is assigned, never added.
pub(super) fn fold(reply: &mut Map<String, Value>, chunk: Map<String, Value>) -> Folded {
    let mut out = Folded::default();
    if let Some(error) = chunk.get("error") {
        let message = error.get("message").and_then(Value::as_str);
        out.error = Some(message.map_or_else(|| error.to_string(), str::to_string));
        return out;
    }
    let chunk = match crate::formats::gemini::camel_keys(Value::Object(chunk)) {
        Value::Object(chunk) => chunk,
        _ => return out,
    };
    for (key, value) in chunk {
        match (key.as_str(), value) {
            ("candidates", Value::Array(candidates)) => {
                for (i, candidate) in candidates.into_iter().enumerate() {
                    if let Value::Object(candidate) = candidate {
                        out.finished |= fold_candidate(reply, i, candidate);
                    }
                }
            }
            (_, Value::Null) => {}
            (_, value) => {
                reply.insert(key, value);
            }
        }
    }
    out
}

/// Folds one candidate in; whether it finished.
fn fold_candidate(reply: &mut Map<String, Value>, i: usize, mut chunk: Map<String, Value>) -> bool {
    let index = chunk
        .get("index")
        .and_then(Value::as_u64)
        .map_or(i, |n| n as usize);
    let candidates = object_list(reply, "candidates");
    while candidates.len() <= index {
        candidates.push(Value::Object(Map::new()));
    }
    let Value::Object(slot) = &mut candidates[index] else {
        return false;
    };
    let content = chunk.remove("content");
    let finished = chunk.get("finishReason").is_some_and(|f| !f.is_null());
    for (key, value) in chunk.into_iter().filter(|(_, v)| !v.is_null()) {
        slot.insert(key, value);
    }
    let Some(Value::Object(content)) = content else {
        return finished;
    };
    let target = match slot
        .entry("content")
        .or_insert_with(|| Value::Object(Map::new()))
    {
        Value::Object(target) => target,
        other => {
            *other = Value::Object(Map::new());
            let Value::Object(target) = other else {
                return finished;
            };
            target
        }
    };
    for (key, value) in content {
        match (key.as_str(), value) {
            ("parts", Value::Array(parts)) => {
                let list = object_list(target, "parts");
                for part in parts {
                    append_part(list, part);
                }
            }
            (_, value) => {
                target.insert(key, value);
            }
        }
    }
    finished
}

fn object_list<'m>(map: &'m mut Map<String, Value>, key: &str) -> &'m mut Vec<Value> {
    let value = map.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    if !value.is_array() {
        *value = Value::Array(Vec::new());
    }
    match value {
        Value::Array(list) => list,
        _ => unreachable!("made an array above"),
    }
}

/// Whether a part is text alone (with its thought flag and signature).
fn plain_text(part: &Map<String, Value>) -> bool {
    part.get("text").is_some_and(Value::is_string)
        && part
            .keys()
            .all(|k| matches!(k.as_str(), "text" | "thought" | "thoughtSignature"))
}

fn append_part(parts: &mut Vec<Value>, part: Value) {
    let Value::Object(part) = part else {
        return;
    };
    if let Some(Value::Object(last)) = parts.last_mut() {
        let same_kind = last.get("thought") == part.get("thought");
        if plain_text(last)
            && plain_text(&part)
            && same_kind
            && !last.contains_key("thoughtSignature")
        {
            let more = part.get("text").and_then(Value::as_str).unwrap_or("");
            if let Some(Value::String(text)) = last.get_mut("text") {
                text.push_str(more);
            }
            if let Some(signature) = part.get("thoughtSignature") {
                last.insert("thoughtSignature".into(), signature.clone());
            }
            return;
        }
    }
    parts.push(Value::Object(part));
}

/// Marks a partial reply's candidates with the reason, where a finished one has its
/// `finishReason`.
pub fn mark_partial(reply: &mut Value, why: &Value) {
    if let Some(Value::Array(candidates)) = reply.get_mut("candidates") {
        for candidate in candidates {
            candidate["finishReason"] = why.clone();
        }
    }
}
