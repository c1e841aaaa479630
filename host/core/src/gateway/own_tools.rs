//! promptd's own tools in a gateway request (G13): tools the client does not know, which
//! promptd runs itself (an MCP server's). Pure pieces the daemon's tool loop uses: the tools
//! spliced into the client's `tools` in the provider's shape, a reply's calls split into
//! promptd's and the client's, the next round's body (the client's with the model's turn and
//! promptd's results appended), the reply the client is shown (promptd's calls taken out),
//! and the restore that puts promptd's calls and results back into the client's next body at
//! their place, so the upstream sees the same bytes every request.
//!
//! Covered: Anthropic Messages, OpenAI Chat Completions and Responses, and Gemini
//! `generateContent` / `streamGenerateContent`, streamed and not, and Bedrock Converse
//! unstreamed ([`covers`]).

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::body::{elements, first_byte, members, ClientBody};
use super::edits::{first_member, Part, Splice};
use super::messages::Conversation;
use super::stream::Frame;
use super::{GatewayError, Ingress};
use crate::conversation::ToolSpec as Tool;

/// `[agents.NAME.gateway] max_tool_rounds` when not set: rounds of promptd's own calls one
/// client request may take.
pub const DEFAULT_MAX_TOOL_ROUNDS: u32 = 8;
/// `[agents.NAME.gateway] tool_timeout_ms` when not set: the longest one call may run.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 30_000;
/// `[agents.NAME.gateway] max_tool_output_bytes` when not set: the largest output a call may
/// give the model.
pub const DEFAULT_MAX_TOOL_OUTPUT_BYTES: u64 = 1 << 20;
/// Most restores a session holds: beyond, the oldest is dropped (its calls then stay out of
/// the upstream's view: a valid conversation, a colder cache).
pub const MAX_RESTORES: usize = 256;

/// Whether promptd runs its own tools for `ingress` (else an agent with them is refused).
pub fn covers(ingress: Ingress) -> bool {
    matches!(
        ingress,
        Ingress::Messages
            | Ingress::ChatCompletions
            | Ingress::Responses
            | Ingress::GenerateContent
            | Ingress::StreamGenerateContent
            | Ingress::Converse
    )
}

/// Whether `ingress` is Gemini's.
fn gemini(ingress: Ingress) -> bool {
    matches!(
        ingress,
        Ingress::GenerateContent | Ingress::StreamGenerateContent
    )
}

/// One tool in the provider's shape (serialized with sorted keys: the same bytes every step).
fn tool_json(ingress: Ingress, tool: &Tool) -> Result<String, GatewayError> {
    let parameters = &tool.parameters;
    Ok(match ingress {
        Ingress::ChatCompletions => json!({"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": parameters}}),
        Ingress::Converse | Ingress::ConverseStream => json!({"toolSpec": {
            "name": tool.name, "description": tool.description,
            "inputSchema": {"json": parameters}}}),
        // Responses' `strict` is true when left out, which an MCP schema (optional properties,
        // no `additionalProperties: false`) seldom meets: said false.
        Ingress::Responses => json!({"type": "function", "name": tool.name,
            "description": tool.description, "parameters": parameters, "strict": false}),
        // An MCP schema is JSON Schema, which Gemini takes as `parametersJsonSchema` (its
        // `parameters` is an OpenAPI subset).
        Ingress::GenerateContent | Ingress::StreamGenerateContent => json!({
            "name": tool.name, "description": tool.description,
            "parametersJsonSchema": parameters}),
        _ => json!({"name": tool.name, "description": tool.description,
            "input_schema": parameters}),
    }
    .to_string())
}

/// Adds promptd's `tools` before the client's in `tools` (a body without one gets it as its
/// first member). A client tool of the same name is refused: the model could not tell them
/// apart. Runs after the `deny_tools` edits of `splice`; `client` names the client's tools.
pub fn add_tools(
    ingress: Ingress,
    body: &ClientBody<'_>,
    tools: &[Tool],
    client: &[String],
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    if tools.is_empty() {
        return Ok(());
    }
    if let Some(t) = tools.iter().find(|t| client.contains(&t.name)) {
        return Err(GatewayError::InvalidBody(format!(
            "the client's tool `{}` has the name of a tool promptd runs itself (an MCP server's); rename one of them",
            t.name
        )));
    }
    let items = tools
        .iter()
        .map(|t| tool_json(ingress, t))
        .collect::<Result<Vec<_>, _>>()?
        .join(",");
    // Gemini's tools are one element of `tools` holding every declaration.
    let items = match gemini(ingress) {
        true => format!("{{\"functionDeclarations\":[{items}]}}"),
        false => items,
    };
    splice.own_tools = tools.iter().map(|t| t.name.clone()).collect();
    let range = match ingress {
        // Bedrock's tools are `toolConfig.tools`.
        Ingress::Converse | Ingress::ConverseStream => {
            let Some(config) = body.member("toolConfig").map(|m| m.value.clone()) else {
                let config = format!("{{\"tools\":[{items}]}}");
                first_member(body, splice, "toolConfig", &config, Part::OwnTools);
                return Ok(());
            };
            if first_byte(&body.text[config.clone()]) == b'n' {
                splice.replace(config, format!("{{\"tools\":[{items}]}}"), Part::OwnTools);
                return Ok(());
            }
            let inner = members(body.text, config.clone()).ok_or_else(|| {
                GatewayError::InvalidBody("`toolConfig` must be an object".into())
            })?;
            match inner.iter().rev().find(|m| m.key == "tools") {
                Some(tools) => tools.value.clone(),
                None => {
                    let comma = if inner.is_empty() { "" } else { "," };
                    let member = format!("\"tools\":[{items}]{comma}");
                    splice.push(config.start + 1, member, Part::OwnTools);
                    return Ok(());
                }
            }
        }
        _ => match body.member("tools") {
            Some(member) => member.value.clone(),
            None => {
                first_member(body, splice, "tools", &format!("[{items}]"), Part::OwnTools);
                return Ok(());
            }
        },
    };
    match first_byte(&body.text[range.clone()]) {
        b'n' => splice.replace(range, format!("[{items}]"), Part::OwnTools),
        b'[' => {
            let elements = elements(body.text, range.clone()).unwrap_or_default();
            // Every client tool denied: its bytes go, so nothing follows promptd's. (A Gemini
            // tool goes whole only when all its declarations are denied: read off the edits.)
            let all_denied = match gemini(ingress) {
                true => elements.iter().all(|e| {
                    (splice.edits.iter()).any(|d| {
                        d.part == Part::DenyTool && d.at <= e.start && e.end <= d.at + d.remove
                    })
                }),
                false => splice.denied.len() >= elements.len(),
            };
            let all_denied = !elements.is_empty() && all_denied;
            match elements.first() {
                Some(first) if !all_denied => {
                    splice.push(first.start, format!("{items},"), Part::OwnTools)
                }
                Some(first) => splice.push(first.start, items, Part::OwnTools),
                None => splice.push(range.start + 1, items, Part::OwnTools),
            }
        }
        _ => {
            return Err(GatewayError::InvalidBody(
                "`tools` must be an array".to_string(),
            ))
        }
    }
    Ok(())
}

/// One tool call of a reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Its id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments (an object; `{}` when they do not parse to one).
    pub arguments: Value,
    /// Where it sits: its index in Messages' `content`, in Chat's `tool_calls`, in
    /// Responses' `output`, in Gemini's first candidate's `parts`.
    pub index: usize,
    /// Its place among the reply's calls (a Gemini call without an id is named by it in the
    /// log, and found by it in a stream's chunks).
    pub nth: usize,
}

/// Chat's one message of a reply.
fn chat_message(reply: &Value) -> &Value {
    &reply["choices"][0]["message"]
}

/// Bedrock's reply message.
fn converse_message(reply: &Value) -> &Value {
    &reply["output"]["message"]
}

/// Gemini's reply content (its first candidate's: the one the client reads).
fn gemini_content(reply: &Value) -> &Value {
    &reply["candidates"][0]["content"]
}

/// The content blocks of a Messages or Converse reply, Responses' output items, Gemini's
/// parts.
fn content_of(ingress: Ingress, reply: &Value) -> &Value {
    match ingress {
        Ingress::Converse | Ingress::ConverseStream => &converse_message(reply)["content"],
        Ingress::Responses => &reply["output"],
        Ingress::GenerateContent | Ingress::StreamGenerateContent => {
            &gemini_content(reply)["parts"]
        }
        _ => &reply["content"],
    }
}

/// A Gemini part's function call (either spelling).
fn function_call(part: &Value) -> Option<&Value> {
    part.get("functionCall")
        .or_else(|| part.get("function_call"))
}

/// Arguments given as a JSON string, as an object (`{}` when they are not one).
fn arguments_of(text: &Value) -> Value {
    (text.as_str())
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The tool calls of a whole (unstreamed) reply, in its order.
pub fn calls(ingress: Ingress, reply: &Value) -> Vec<Call> {
    let mut calls = reply_calls(ingress, reply);
    for (nth, call) in calls.iter_mut().enumerate() {
        call.nth = nth;
    }
    calls
}

fn reply_calls(ingress: Ingress, reply: &Value) -> Vec<Call> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let items = || content_of(ingress, reply).as_array().into_iter().flatten();
    match ingress {
        Ingress::Responses => items()
            .enumerate()
            .filter(|(_, item)| item["type"] == "function_call")
            .map(|(index, item)| Call {
                id: s(&item["call_id"]),
                name: s(&item["name"]),
                arguments: arguments_of(&item["arguments"]),
                index,
                nth: 0,
            })
            .collect(),
        Ingress::GenerateContent | Ingress::StreamGenerateContent => items()
            .enumerate()
            .filter_map(|(index, part)| Some((index, function_call(part)?)))
            .map(|(index, call)| Call {
                // Gemini may leave ids out: "" then (the log names it by its place).
                id: s(&call["id"]),
                name: s(&call["name"]),
                arguments: (call.get("args").filter(|a| a.is_object()).cloned())
                    .unwrap_or_else(|| json!({})),
                index,
                nth: 0,
            })
            .collect(),
        Ingress::ChatCompletions => (chat_message(reply)["tool_calls"].as_array())
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(index, c)| Call {
                id: s(&c["id"]),
                name: s(&c["function"]["name"]),
                arguments: arguments_of(&c["function"]["arguments"]),
                index,
                nth: 0,
            })
            .collect(),
        Ingress::Converse | Ingress::ConverseStream => (content_of(ingress, reply).as_array())
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(index, b)| Some((index, b.get("toolUse")?)))
            .map(|(index, u)| Call {
                id: s(&u["toolUseId"]),
                name: s(&u["name"]),
                arguments: u.get("input").cloned().unwrap_or_else(|| json!({})),
                index,
                nth: 0,
            })
            .collect(),
        _ => (reply["content"].as_array())
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(_, b)| b["type"] == "tool_use")
            .map(|(index, b)| Call {
                id: s(&b["id"]),
                name: s(&b["name"]),
                arguments: b.get("input").cloned().unwrap_or_else(|| json!({})),
                index,
                nth: 0,
            })
            .collect(),
    }
}

/// What running one of promptd's calls gave the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ran {
    /// The call's id, as the reply gave it (a Gemini call's may be "").
    pub id: String,
    /// The tool's name (a Gemini function response names its call by it).
    pub name: String,
    /// The text the model reads.
    pub content: String,
    /// Whether the tool failed.
    pub is_error: bool,
}

/// The model's turn as the conversation holds it (Messages: its `content`; Chat: its text and
/// calls; Responses: each output item, as it came; Gemini: the candidate's content), each
/// message's JSON.
fn assistant_turn(ingress: Ingress, reply: &Value) -> Vec<String> {
    match ingress {
        Ingress::ChatCompletions => {
            let m = chat_message(reply);
            let mut turn = json!({"role": "assistant", "content": m["content"].clone()});
            if let Some(calls) = m.get("tool_calls").filter(|c| c.is_array()) {
                turn["tool_calls"] = calls.clone();
            }
            vec![turn.to_string()]
        }
        // Output items go back as input items (reasoning items among them, which a
        // reasoning model needs back during tool use).
        Ingress::Responses => (content_of(ingress, reply).as_array().into_iter().flatten())
            .map(Value::to_string)
            .collect(),
        Ingress::GenerateContent | Ingress::StreamGenerateContent => {
            // As it came: a part's `thoughtSignature` must go back unchanged (Gemini 3).
            let mut content = gemini_content(reply).clone();
            if let Some(object) = content.as_object_mut() {
                object.entry("role").or_insert_with(|| json!("model"));
            }
            vec![content.to_string()]
        }
        _ => vec![
            json!({"role": "assistant", "content": content_of(ingress, reply).clone()}).to_string(),
        ],
    }
}

/// The result block of one run call: Messages' `tool_result`, Bedrock's `toolResult`,
/// Gemini's `functionResponse` part (with the call's id when it had one), Responses'
/// `function_call_output` item.
fn result_block(ingress: Ingress, ran: &Ran) -> Value {
    match ingress {
        Ingress::Converse | Ingress::ConverseStream => {
            let mut result = json!({"toolUseId": ran.id, "content": [{"text": ran.content}]});
            if ran.is_error {
                result["status"] = json!("error");
            }
            json!({ "toolResult": result })
        }
        Ingress::GenerateContent | Ingress::StreamGenerateContent => {
            // Gemini's documented keys: `output`, or `error` for a failure.
            let key = if ran.is_error { "error" } else { "output" };
            let mut response = json!({"name": ran.name, "response": {key: ran.content}});
            if !ran.id.is_empty() {
                response["id"] = json!(ran.id);
            }
            json!({ "functionResponse": response })
        }
        // Responses has no error flag: the output says it.
        Ingress::Responses => json!({"type": "function_call_output", "call_id": ran.id,
            "output": ran.content}),
        _ => {
            let mut block =
                json!({"type": "tool_result", "tool_use_id": ran.id, "content": ran.content});
            if ran.is_error {
                block["is_error"] = json!(true);
            }
            block
        }
    }
}

/// The results as messages: Messages' one user turn of `tool_result` blocks (Bedrock's of
/// `toolResult`s, Gemini's one user content of `functionResponse` parts), Chat's one `tool`
/// message per call, Responses' one `function_call_output` item per call.
fn result_messages(ingress: Ingress, ran: &[Ran]) -> Vec<String> {
    match ingress {
        Ingress::ChatCompletions => ran
            .iter()
            .map(|r| {
                json!({"role": "tool", "tool_call_id": r.id, "content": r.content}).to_string()
            })
            .collect(),
        Ingress::Responses => ran
            .iter()
            .map(|r| result_block(ingress, r).to_string())
            .collect(),
        Ingress::GenerateContent | Ingress::StreamGenerateContent => vec![json!({"role": "user",
            "parts": ran.iter().map(|r| result_block(ingress, r)).collect::<Vec<_>>()})
        .to_string()],
        _ => vec![json!({"role": "user",
            "content": ran.iter().map(|r| result_block(ingress, r)).collect::<Vec<_>>()})
        .to_string()],
    }
}

/// The messages one round of promptd's own calls adds: the model's turn, then the results.
pub fn round_messages(ingress: Ingress, reply: &Value, ran: &[Ran]) -> Vec<String> {
    let mut out = assistant_turn(ingress, reply);
    out.extend(result_messages(ingress, ran));
    out
}

/// The member holding the conversation: `messages`, Responses' `input`, Gemini's `contents`.
fn list_key(ingress: Ingress) -> &'static str {
    match ingress {
        Ingress::Responses => "input",
        Ingress::GenerateContent | Ingress::StreamGenerateContent => "contents",
        _ => "messages",
    }
}

/// Where the conversation's list sits in `body`, and its elements.
fn message_list(
    ingress: Ingress,
    body: &ClientBody<'_>,
) -> Result<(Range<usize>, Vec<Range<usize>>), GatewayError> {
    let key = list_key(ingress);
    let range = (body.member(key).map(|m| m.value.clone()))
        .ok_or_else(|| GatewayError::InvalidBody(format!("the body has no `{key}`")))?;
    let items = elements(body.text, range.clone())
        .ok_or_else(|| GatewayError::InvalidBody(format!("`{key}` must be an array")))?;
    Ok((range, items))
}

/// Where the reply to `body` lands in the client's next body: after the messages it sent
/// (Responses' `input` given as a string is one user message).
pub fn anchor(ingress: Ingress, body: &ClientBody<'_>) -> Option<usize> {
    let range = body.member(list_key(ingress))?.value.clone();
    if ingress == Ingress::Responses && first_byte(&body.text[range.clone()]) == b'"' {
        return Some(1);
    }
    Some(elements(body.text, range)?.len())
}

/// The next round's body: `body` with `messages` appended to its conversation's list (nothing
/// else of it changes; Responses' `input` given as a string becomes that user message's
/// item, its string's bytes kept, with the messages after it).
pub fn appended(ingress: Ingress, body: &str, messages: &[String]) -> Result<String, GatewayError> {
    let parsed = ClientBody::parse(body.as_bytes())?;
    let mut splice = Splice::default();
    let text = parsed.member("input").map(|m| m.value.clone());
    match text.filter(|r| ingress == Ingress::Responses && first_byte(&body[r.clone()]) == b'"') {
        Some(text) => {
            let item = format!("[{{\"role\":\"user\",\"content\":{}}}", &body[text.clone()]);
            splice.replace(
                text,
                format!("{item},{}]", messages.join(",")),
                Part::OwnTools,
            );
        }
        // A Responses request that chains by `previous_response_id` may send no `input`.
        None if ingress == Ingress::Responses && parsed.member("input").is_none() => {
            let items = format!("[{}]", messages.join(","));
            first_member(&parsed, &mut splice, "input", &items, Part::OwnTools);
        }
        None => {
            let (range, items) = message_list(ingress, &parsed)?;
            match items.last() {
                Some(last) => {
                    splice.push(last.end, format!(",{}", messages.join(",")), Part::OwnTools)
                }
                None => splice.push(range.start + 1, messages.join(","), Part::OwnTools),
            }
        }
    }
    String::from_utf8(splice.apply(body.as_bytes()))
        .map_err(|_| GatewayError::InvalidBody("the appended body is not UTF-8".into()))
}

/// The reply the client is shown when it mixes promptd's calls and the client's: promptd's
/// (`own`) taken out; the rest as the upstream sent it.
pub fn for_client(ingress: Ingress, reply: &Value, own: &[Call]) -> Value {
    let mut reply = reply.clone();
    let keep =
        |item: &Value, id: &str| !own.iter().any(|o| o.id == item[id].as_str().unwrap_or(""));
    // Responses' output items and Gemini's parts by their place (a Gemini call may have no id).
    let not_own = |i: usize| !own.iter().any(|o| o.index == i);
    match ingress {
        Ingress::ChatCompletions => {
            if let Some(calls) = reply["choices"][0]["message"]["tool_calls"].as_array_mut() {
                calls.retain(|c| keep(c, "id"));
            }
        }
        Ingress::Converse | Ingress::ConverseStream => {
            if let Some(blocks) = reply["output"]["message"]["content"].as_array_mut() {
                blocks.retain(|b| b.get("toolUse").is_none_or(|u| keep(u, "toolUseId")));
            }
        }
        Ingress::Responses => {
            if let Some(items) = reply["output"].as_array_mut() {
                let mut i = 0;
                items.retain(|_| {
                    let keep = not_own(i);
                    i += 1;
                    keep
                });
            }
        }
        Ingress::GenerateContent | Ingress::StreamGenerateContent => {
            if let Some(parts) = reply["candidates"][0]["content"]["parts"].as_array_mut() {
                let mut i = 0;
                parts.retain(|_| {
                    let keep = not_own(i);
                    i += 1;
                    keep
                });
            }
        }
        _ => {
            if let Some(blocks) = reply["content"].as_array_mut() {
                blocks.retain(|b| b["type"] != "tool_use" || keep(b, "id"));
            }
        }
    }
    reply
}

/// The frames of a streamed reply the client is shown when it mixes promptd's calls with the
/// client's: the frames of promptd's calls (`own`) taken out and the indexes after them
/// renumbered (Messages' content blocks, Chat's `tool_calls`, Responses' `output_index` and
/// the output of the response an event carries), or, on Gemini, whose calls come whole and
/// without an index, their parts taken out of the chunks (a chunk left with nothing goes), so
/// the frames fold into [`for_client`]'s reply. A frame that changes is re-encoded; the others
/// go as they came.
pub fn frames_for_client(ingress: Ingress, frames: Vec<Frame>, own: &[Call]) -> Vec<Frame> {
    let own_at: Vec<usize> = own.iter().map(|c| c.index).collect();
    let shift = |index: u64| index - own_at.iter().filter(|&&o| (o as u64) < index).count() as u64;
    let is_own = |index: u64| own_at.iter().any(|&o| o as u64 == index);
    // Gemini: the calls seen so far in the first candidate's chunks.
    let mut gemini_calls = 0usize;
    let mut out = Vec::with_capacity(frames.len());
    for frame in frames {
        let Some(Value::Object(mut event)) = frame.json() else {
            out.push(frame);
            continue;
        };
        match ingress {
            Ingress::ChatCompletions => {
                let calls = event
                    .get_mut("choices")
                    .and_then(|c| c.get_mut(0))
                    .and_then(|c| c.get_mut("delta"))
                    .and_then(|d| d.get_mut("tool_calls"))
                    .and_then(Value::as_array_mut);
                let Some(calls) = calls else {
                    out.push(frame);
                    continue;
                };
                calls.retain(|c| !c["index"].as_u64().is_some_and(is_own));
                for call in calls.iter_mut() {
                    if let Some(i) = call["index"].as_u64() {
                        call["index"] = json!(shift(i));
                    }
                }
                if calls.is_empty() {
                    if let Some(delta) = event["choices"][0]["delta"].as_object_mut() {
                        delta.remove("tool_calls");
                    }
                }
            }
            Ingress::Responses => {
                if let Some(index) = event.get("output_index").and_then(Value::as_u64) {
                    if is_own(index) {
                        continue;
                    }
                    if shift(index) == index {
                        out.push(frame);
                        continue;
                    }
                    event.insert("output_index".into(), json!(shift(index)));
                } else {
                    // `response.created` … `response.completed` carry the response whole.
                    let output = (event.get_mut("response"))
                        .and_then(|r| r.get_mut("output"))
                        .and_then(Value::as_array_mut);
                    let Some(output) = output else {
                        out.push(frame);
                        continue;
                    };
                    let before = output.len();
                    let mut i = 0u64;
                    output.retain(|_| {
                        let keep = !is_own(i);
                        i += 1;
                        keep
                    });
                    if output.len() == before {
                        out.push(frame);
                        continue;
                    }
                }
            }
            Ingress::GenerateContent | Ingress::StreamGenerateContent => {
                let parts = (event.get_mut("candidates"))
                    .and_then(|c| c.get_mut(0))
                    .and_then(|c| c.get_mut("content"))
                    .and_then(|c| c.get_mut("parts"))
                    .and_then(Value::as_array_mut);
                let Some(parts) = parts else {
                    out.push(frame);
                    continue;
                };
                let before = parts.len();
                parts.retain(|p| {
                    if function_call(p).is_none() {
                        return true;
                    }
                    gemini_calls += 1;
                    !own.iter().any(|c| c.nth == gemini_calls - 1)
                });
                if parts.len() == before {
                    out.push(frame);
                    continue;
                }
                // A chunk that held only promptd's call, and no finish, says nothing more.
                let finish = event["candidates"][0].get("finishReason").is_some();
                if !finish && event["candidates"][0]["content"]["parts"] == json!([]) {
                    continue;
                }
            }
            _ => {
                let Some(index) = event.get("index").and_then(Value::as_u64) else {
                    out.push(frame);
                    continue;
                };
                if is_own(index) {
                    continue;
                }
                if shift(index) == index {
                    out.push(frame);
                    continue;
                }
                event.insert("index".into(), json!(shift(index)));
            }
        }
        let data = Value::Object(event).to_string();
        let raw = match &frame.event {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        };
        out.push(Frame {
            raw: raw.into_bytes(),
            event: frame.event,
            data: Some(data),
        });
    }
    out
}

/// What promptd puts back into a client's later bodies (the client's history lacks it): the
/// rounds of its own calls before the reply the client got, and, when that reply mixed its
/// calls with the client's, its calls in that reply and their results after it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restore {
    /// The client's messages (as promptd reads them) before the reply, and their chained
    /// digest: a later body holding them holds the reply next.
    pub messages: usize,
    /// The digest over them.
    pub digest: String,
    /// The index in the client's `messages` array where the reply sits.
    pub anchor: usize,
    /// Whole messages (each round's model turn and results) put before the reply.
    pub before: Vec<String>,
    /// promptd's calls put back into the reply: their index in it (Gemini: their place among
    /// its calls) and their JSON.
    pub calls: Vec<(usize, String)>,
    /// Their results: Messages' `tool_result` blocks first in the turn after the reply (Gemini's
    /// `functionResponse` parts first in the content after it), Chat's `tool` messages right
    /// after it, Responses' `function_call_output` items right after the reply's items.
    pub results: Vec<String>,
    /// Responses: how many of the reply's output items the client was shown (they sit from
    /// `anchor` on in its next `input`).
    #[serde(default)]
    pub shown: usize,
    /// Responses: the reply's id. A client that chains by `previous_response_id` sends none of
    /// its history (the upstream holds the reply whole, promptd's calls in it), so that
    /// request gets only promptd's results back, first in its `input`.
    #[serde(default)]
    pub response: Option<String>,
}

impl Restore {
    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        let texts = self.before.iter().chain(&self.results);
        texts.map(String::len).sum::<usize>()
            + self.calls.iter().map(|(_, c)| c.len()).sum::<usize>()
            + self.digest.len()
            + self.response.as_ref().map_or(0, String::len)
    }

    /// A restore of the rounds `before` the reply (at `anchor`, after the client's
    /// `conversation`), and, for a mixed reply, of promptd's `own` calls in it and their `ran`
    /// results.
    pub fn new(
        ingress: Ingress,
        conversation: &Conversation,
        anchor: usize,
        before: Vec<String>,
        reply: &Value,
        own: &[Call],
        ran: &[Ran],
    ) -> Restore {
        let items: Vec<Value> = match ingress {
            Ingress::ChatCompletions => (chat_message(reply)["tool_calls"].as_array())
                .cloned()
                .unwrap_or_default(),
            _ => (content_of(ingress, reply).as_array())
                .cloned()
                .unwrap_or_default(),
        };
        // A Gemini call goes back by its place among the reply's calls: a client folding a
        // stream holds each chunk's parts, so the reply's part indexes are not its.
        let calls = own
            .iter()
            .filter_map(|c| {
                let at = if gemini(ingress) { c.nth } else { c.index };
                Some((at, items.get(c.index)?.to_string()))
            })
            .collect();
        let results = match ingress {
            Ingress::ChatCompletions => result_messages(ingress, ran),
            _ => ran
                .iter()
                .map(|r| result_block(ingress, r).to_string())
                .collect(),
        };
        let response = (ingress == Ingress::Responses)
            .then(|| reply["id"].as_str().map(str::to_string))
            .flatten();
        Restore {
            messages: conversation.messages.len(),
            digest: conversation.digest(conversation.messages.len()).to_string(),
            anchor,
            before,
            shown: items.len().saturating_sub(own.len()),
            calls,
            results,
            response,
        }
    }
}

/// The insertions that put `restores` back into a client's `body` whose conversation is
/// `conversation` (sorted by place). A restore whose place the body no longer holds (the
/// client rewrote its history, or has not sent the reply back yet) is left out, as is a
/// mixed reply's part when its results have no place (Messages' turn after it not a list of
/// blocks): the upstream then sees the client's history, still a valid conversation.
pub fn restore<R: std::borrow::Borrow<Restore>>(
    ingress: Ingress,
    body: &ClientBody<'_>,
    conversation: &Conversation,
    restores: &[R],
) -> Vec<super::edits::Edit> {
    let Ok((list_at, items)) = message_list(ingress, body) else {
        return Vec::new();
    };
    let mut splice = Splice::default();
    let chained = (ingress == Ingress::Responses)
        .then(|| body.decode::<String>("previous_response_id").ok().flatten())
        .flatten();
    if let Some(previous) = chained {
        // The upstream holds the chain (the rounds, and promptd's calls in the reply): only
        // the results it lacks go back, first in `input`.
        let held = restores.iter().map(std::borrow::Borrow::<Restore>::borrow);
        for r in held.filter(|r| r.response.as_deref() == Some(previous.as_str())) {
            if r.results.is_empty() {
                continue;
            }
            let results = r.results.join(",");
            match items.first() {
                Some(first) => splice.push(first.start, format!("{results},"), Part::Restored),
                None => splice.push(list_at.start + 1, results, Part::Restored),
            }
        }
        return splice.edits;
    }
    for r in restores {
        let r: &Restore = r.borrow();
        let holds =
            conversation.messages.len() > r.messages && conversation.digest(r.messages) == r.digest;
        let Some(reply) = items.get(r.anchor).filter(|_| holds) else {
            continue;
        };
        if !r.before.is_empty() {
            // Right after the message before the reply, as the round appended them: the
            // client's own separator (`, ` from some encoders) then follows, so the bytes the
            // upstream saw in that round come again unchanged.
            let before = r.before.join(",");
            match r.anchor.checked_sub(1).and_then(|i| items.get(i)) {
                Some(previous) => splice.push(previous.end, format!(",{before}"), Part::Restored),
                None => splice.push(reply.start, format!("{before},"), Part::Restored),
            }
        }
        if r.calls.is_empty() {
            continue;
        }
        if ingress == Ingress::Responses {
            // The reply is `shown` items of `input` itself: promptd's calls go back among
            // them, its results right after them (before the client's own outputs).
            let Some(kept) = items
                .get(r.anchor..r.anchor + r.shown)
                .filter(|k| !k.is_empty())
            else {
                continue;
            };
            let last = kept[kept.len() - 1].end;
            put_back(&list_at, kept, &r.calls, &mut splice);
            splice.push(last, format!(",{}", r.results.join(",")), Part::Restored);
            continue;
        }
        // The reply's list the calls go back into, and where the results go.
        let parts = if gemini(ingress) { "parts" } else { "content" };
        let list = match ingress {
            Ingress::ChatCompletions => member(body.text, reply.clone(), "tool_calls"),
            _ => member(body.text, reply.clone(), parts),
        };
        let Some(list) = list.and_then(|l| Some((l.clone(), elements(body.text, l)?))) else {
            continue;
        };
        let results_at = match ingress {
            Ingress::ChatCompletions => Some((reply.end, format!(",{}", r.results.join(",")))),
            _ => items
                .get(r.anchor + 1)
                .and_then(|next| member(body.text, next.clone(), parts))
                .and_then(|c| elements(body.text, c))
                .and_then(|blocks| blocks.first().cloned())
                .map(|first| (first.start, format!("{},", r.results.join(",")))),
        };
        let Some((results_at, results)) = results_at else {
            continue;
        };
        if gemini(ingress) {
            put_back_calls(body.text, &list.1, &r.calls, &mut splice);
        } else {
            put_back(&list.0, &list.1, &r.calls, &mut splice);
        }
        splice.push(results_at, results, Part::Restored);
    }
    splice.edits.sort_by_key(|e| e.at); // stable: insertions at one place keep their order
    splice.edits
}

/// The value of `key` in the object at `object`.
fn member(text: &str, object: Range<usize>, key: &str) -> Option<Range<usize>> {
    members(text, object)?
        .into_iter()
        .rev()
        .find(|m| m.key == key)
        .map(|m| m.value)
}

/// Gemini: inserts `calls` (each at its place among the reply's calls) among the client's
/// `parts`: before the client's call that came after it, else after the last part.
fn put_back_calls(
    text: &str,
    parts: &[Range<usize>],
    calls: &[(usize, String)],
    splice: &mut Splice,
) {
    let Some(last) = parts.last() else {
        return;
    };
    let theirs: Vec<&Range<usize>> = (parts.iter())
        .filter(|p| {
            let fields = members(text, (*p).clone()).unwrap_or_default();
            (fields.iter()).any(|m| m.key == "functionCall" || m.key == "function_call")
        })
        .collect();
    for (nth, call) in calls {
        // The client's calls before it in the reply.
        let before = nth - calls.iter().filter(|(o, _)| o < nth).count();
        match theirs.get(before) {
            Some(next) => splice.push(next.start, format!("{call},"), Part::Restored),
            None => splice.push(last.end, format!(",{call}"), Part::Restored),
        }
    }
}

/// Inserts `calls` (each at its index in the whole list) among the client's `kept` elements
/// of the list at `list`.
fn put_back(
    list: &Range<usize>,
    kept: &[Range<usize>],
    calls: &[(usize, String)],
    splice: &mut Splice,
) {
    let total = kept.len() + calls.len();
    let mut next_kept = 0;
    let mut placed = 0;
    for index in 0..total {
        let Some((_, call)) = calls.iter().find(|(i, _)| *i == index) else {
            next_kept += 1;
            continue;
        };
        // Before the next kept element, or after the last one (or into the empty list).
        let (at, text) = match kept.get(next_kept) {
            Some(k) => (k.start, format!("{call},")),
            None => match kept.last() {
                Some(last) => (last.end, format!(",{call}")),
                None if placed == 0 => (list.start + 1, call.clone()),
                None => (list.start + 1, format!(",{call}")),
            },
        };
        splice.push(at, text, Part::Restored);
        placed += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::messages::conversation;

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            description: "What time it is.".into(),
            parameters: json!({"type": "object", "properties": {"tz": {"type": "string"}}}).into(),
            defer: None,
        }
    }

    /// promptd's call at `index` (the first of its reply's calls).
    fn at(index: usize) -> Call {
        Call {
            id: String::new(),
            name: "clock_now".into(),
            arguments: json!({}),
            index,
            nth: 0,
        }
    }

    fn spliced(ingress: Ingress, body: &str, tools: &[Tool]) -> Result<String, GatewayError> {
        let parsed = ClientBody::parse(body.as_bytes())?;
        let client = crate::gateway::splice::tool_names(ingress, &parsed);
        let mut splice = Splice::default();
        add_tools(ingress, &parsed, tools, &client, &mut splice)?;
        splice.edits.sort_by_key(|e| e.at);
        Ok(String::from_utf8(splice.apply(body.as_bytes())).unwrap())
    }

    /// G13: promptd's tools go before the client's, in each provider's shape, keys sorted; a
    /// body without `tools` gets it first; a client tool of the same name is refused.
    #[test]
    fn g13_own_tools_are_spliced_before_the_clients_in_the_providers_shape() {
        let body = r#"{"model":"m","messages":[],"tools":[ {"name":"read_file"} ]}"#;
        assert_eq!(
            spliced(Ingress::Messages, body, &[tool("clock_now")]).unwrap(),
            r#"{"model":"m","messages":[],"tools":[ {"description":"What time it is.","input_schema":{"properties":{"tz":{"type":"string"}},"type":"object"},"name":"clock_now"},{"name":"read_file"} ]}"#
        );
        let chat = r#"{"model":"m","messages":[]}"#;
        assert_eq!(
            spliced(Ingress::ChatCompletions, chat, &[tool("a"), tool("b")]).unwrap(),
            format!(
                r#"{{"tools":[{},{}],"model":"m","messages":[]}}"#,
                r#"{"function":{"description":"What time it is.","name":"a","parameters":{"properties":{"tz":{"type":"string"}},"type":"object"}},"type":"function"}"#,
                r#"{"function":{"description":"What time it is.","name":"b","parameters":{"properties":{"tz":{"type":"string"}},"type":"object"}},"type":"function"}"#
            )
        );
        let null = r#"{"model":"m","messages":[],"tools":null}"#;
        assert!(spliced(Ingress::Messages, null, &[tool("a")])
            .unwrap()
            .ends_with(r#""tools":[{"description":"What time it is.","input_schema":{"properties":{"tz":{"type":"string"}},"type":"object"},"name":"a"}]}"#));
        let clash = spliced(Ingress::Messages, body, &[tool("read_file")]).unwrap_err();
        assert_eq!(clash.code(), "invalid_body");
        assert!(clash.to_string().contains("`read_file`"), "{clash}");
    }

    /// G13: a mixed reply's calls split by name; the client is shown its own only; the next
    /// body gets promptd's call back at its index and its result first in the next turn, and
    /// nothing when the place is gone.
    #[test]
    fn g13_a_mixed_reply_is_split_and_put_back_at_its_place() {
        let reply = json!({"content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "t1", "name": "read_file", "input": {}},
            {"type": "tool_use", "id": "t2", "name": "clock_now", "input": {"tz": "UTC"}},
        ], "stop_reason": "tool_use"});
        let all = calls(Ingress::Messages, &reply);
        assert_eq!(
            all.iter()
                .map(|c| (c.index, c.name.as_str()))
                .collect::<Vec<_>>(),
            [(1, "read_file"), (2, "clock_now")]
        );
        let own = vec![all[1].clone()];
        let shown = for_client(Ingress::Messages, &reply, &own);
        assert_eq!(shown["content"].as_array().unwrap().len(), 2);
        let first = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let parsed = ClientBody::parse(first.as_bytes()).unwrap();
        let ran = [Ran {
            id: "t2".into(),
            name: "clock_now".into(),
            content: "12:00".into(),
            is_error: false,
        }];
        let restore = Restore::new(
            Ingress::Messages,
            &conversation(Ingress::Messages, &parsed),
            1,
            Vec::new(),
            &reply,
            &own,
            &ran,
        );
        let next = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":{}}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t1","content":"x"}}]}}]}}"#,
            shown["content"]
        );
        let edits = restore_edits(&next, std::slice::from_ref(&restore));
        let restored = String::from_utf8(
            Splice {
                edits,
                ..Splice::default()
            }
            .apply(next.as_bytes()),
        )
        .unwrap();
        let v: Value = serde_json::from_str(&restored).unwrap();
        assert_eq!(v["messages"][1]["content"], reply["content"], "{restored}");
        assert_eq!(v["messages"][2]["content"][0]["tool_use_id"], "t2");
        assert_eq!(v["messages"][2]["content"][1]["tool_use_id"], "t1");
        // The client rewrote the message before the reply: nothing goes back.
        let rewritten = next.replace("\"hi\"", "\"hello\"");
        assert!(restore_edits(&rewritten, &[restore]).is_empty());
    }

    fn restore_edits(body: &str, restores: &[Restore]) -> Vec<super::super::edits::Edit> {
        let parsed = ClientBody::parse(body.as_bytes()).unwrap();
        let conv = conversation(Ingress::Messages, &parsed);
        restore(Ingress::Messages, &parsed, &conv, restores)
    }

    /// G13: a round's messages append to the body's messages, nothing else of it changed.
    #[test]
    fn g13_a_round_appends_the_models_turn_and_the_results() {
        let reply = json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "clock_now", "arguments": "{\"tz\":\"UTC\"}"}}]}}]});
        let ran = [Ran {
            id: "c1".into(),
            name: "clock_now".into(),
            content: "12:00".into(),
            is_error: false,
        }];
        let added = round_messages(Ingress::ChatCompletions, &reply, &ran);
        let body = r#"{"messages":[ {"role":"user","content":"hi"} ],"model":"m"}"#;
        assert_eq!(
            appended(Ingress::ChatCompletions, body, &added).unwrap(),
            r#"{"messages":[ {"role":"user","content":"hi"},{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"tz\":\"UTC\"}","name":"clock_now"},"id":"c1","type":"function"}]},{"content":"12:00","role":"tool","tool_call_id":"c1"} ],"model":"m"}"#
        );
    }

    /// G13: a mixed stream's frames: promptd's block taken out, the blocks after it
    /// renumbered (re-encoded), every other frame as it came.
    #[test]
    fn g13_a_mixed_streams_frames_lose_promptds_call() {
        let mut cut = crate::gateway::stream::Frames::default();
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"own\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"theirs\"}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let frames = cut.push(stream.as_bytes()).unwrap();
        let shown = frames_for_client(Ingress::Messages, frames.clone(), &[at(0)]);
        assert_eq!(shown.len(), 3);
        assert_eq!(shown[0], frames[0], "untouched frames go as they came");
        assert_eq!(
            String::from_utf8(shown[1].raw.clone()).unwrap(),
            "event: content_block_start\ndata: {\"content_block\":{\"id\":\"theirs\",\"type\":\"tool_use\"},\"index\":0,\"type\":\"content_block_start\"}\n\n"
        );
        assert_eq!(shown[2], frames[4]);
        let chat = "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\"},{\"index\":1,\"id\":\"b\"}]}}]}\n\n";
        let frames = crate::gateway::stream::Frames::default()
            .push(chat.as_bytes())
            .unwrap();
        let shown = frames_for_client(Ingress::ChatCompletions, frames, &[at(0)]);
        let calls = &shown[0].json().unwrap()["choices"][0]["delta"]["tool_calls"];
        assert_eq!(calls, &json!([{"index": 0, "id": "b"}]));
    }

    /// G13: Bedrock's tools are `toolConfig.tools` toolSpecs, made when absent.
    #[test]
    fn g13_bedrock_own_tools_go_into_tool_config() {
        let none = r#"{"messages":[]}"#;
        assert_eq!(
            spliced(Ingress::Converse, none, &[tool("a")]).unwrap(),
            r#"{"toolConfig":{"tools":[{"toolSpec":{"description":"What time it is.","inputSchema":{"json":{"properties":{"tz":{"type":"string"}},"type":"object"}},"name":"a"}}]},"messages":[]}"#
        );
        let some = r#"{"messages":[],"toolConfig":{"toolChoice":{"auto":{}},"tools":[{"toolSpec":{"name":"b"}},{"cachePoint":{"type":"default"}}]}}"#;
        let out = spliced(Ingress::Converse, some, &[tool("a")]).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let names: Vec<&str> = (v["toolConfig"]["tools"].as_array().unwrap().iter())
            .filter_map(|t| t["toolSpec"]["name"].as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert!(out.ends_with(r#"{"toolSpec":{"name":"b"}},{"cachePoint":{"type":"default"}}]}}"#));
    }

    fn ran(id: &str, name: &str, content: &str) -> Ran {
        Ran {
            id: id.into(),
            name: name.into(),
            content: content.into(),
            is_error: false,
        }
    }

    fn restored(ingress: Ingress, body: &str, restores: &[Restore]) -> String {
        let parsed = ClientBody::parse(body.as_bytes()).unwrap();
        let conv = conversation(ingress, &parsed);
        let edits = restore(ingress, &parsed, &conv, restores);
        String::from_utf8(
            Splice {
                edits,
                ..Splice::default()
            }
            .apply(body.as_bytes()),
        )
        .unwrap()
    }

    /// G13: on Responses promptd's tools are flat functions, `strict` said false (Responses
    /// takes a tool left without it as strict, which an MCP schema seldom meets).
    #[test]
    fn g13_responses_own_tools_are_flat_functions_not_strict() {
        let body = r#"{"model":"m","input":"hi","tools":[{"type":"function","name":"read_file"}]}"#;
        assert_eq!(
            spliced(Ingress::Responses, body, &[tool("a")]).unwrap(),
            r#"{"model":"m","input":"hi","tools":[{"description":"What time it is.","name":"a","parameters":{"properties":{"tz":{"type":"string"}},"type":"object"},"strict":false,"type":"function"},{"type":"function","name":"read_file"}]}"#
        );
        let clash = spliced(Ingress::Responses, body, &[tool("read_file")]).unwrap_err();
        assert_eq!(clash.code(), "invalid_body");
    }

    /// G13: on Gemini promptd's tools are one `functionDeclarations` tool before the client's,
    /// their schemas as `parametersJsonSchema`; a client tool denied whole leaves no comma.
    #[test]
    fn g13_gemini_own_tools_are_one_declarations_tool_first() {
        let own = r#"{"functionDeclarations":[{"description":"What time it is.","name":"a","parametersJsonSchema":{"properties":{"tz":{"type":"string"}},"type":"object"}}]}"#;
        let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"read_file"}]}]}"#;
        let plan = |deny: &[&str]| {
            let parsed = ClientBody::parse(body.as_bytes()).unwrap();
            let contributions = crate::gateway::splice::Contributions {
                system: String::new(),
                runtime_context: None,
                tools: vec![tool("a")],
            };
            let settings = crate::gateway::splice::SpliceSettings {
                deny_tools: deny.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            };
            let splice = crate::gateway::splice::plan(
                Ingress::GenerateContent,
                &parsed,
                &contributions,
                &settings,
            )
            .unwrap();
            assert_eq!(splice.own_tools, ["a"]);
            String::from_utf8(splice.apply(body.as_bytes())).unwrap()
        };
        assert_eq!(
            plan(&[]),
            body.replace(r#""tools":["#, &format!(r#""tools":[{own},"#))
        );
        assert_eq!(
            plan(&["read_file"]),
            format!(
                r#"{{"contents":[{{"role":"user","parts":[{{"text":"hi"}}]}}],"tools":[{own}]}}"#
            )
        );
        let none = r#"{"contents":[]}"#;
        assert_eq!(
            spliced(Ingress::StreamGenerateContent, none, &[tool("a")]).unwrap(),
            format!(r#"{{"tools":[{own}],"contents":[]}}"#)
        );
    }

    /// G13: a Responses round appends the reply's output items as they came and one
    /// `function_call_output` per call; an `input` given as a string becomes its user item,
    /// the string's bytes kept.
    #[test]
    fn g13_responses_a_round_appends_output_items_and_outputs() {
        let reply = json!({"id": "resp_1", "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "clock_now",
             "arguments": "{\"tz\":\"UTC\"}"},
        ]});
        let all = calls(Ingress::Responses, &reply);
        assert_eq!(all.len(), 1);
        assert_eq!(
            (all[0].id.as_str(), all[0].index, &all[0].arguments),
            ("call_1", 1, &json!({"tz": "UTC"}))
        );
        let added = round_messages(
            Ingress::Responses,
            &reply,
            &[ran("call_1", "clock_now", "12:00")],
        );
        let body = r#"{"model":"m","input":"what \"time\"?"}"#;
        assert_eq!(
            appended(Ingress::Responses, body, &added).unwrap(),
            r#"{"model":"m","input":[{"role":"user","content":"what \"time\"?"},{"id":"rs_1","summary":[],"type":"reasoning"},{"arguments":"{\"tz\":\"UTC\"}","call_id":"call_1","id":"fc_1","name":"clock_now","type":"function_call"},{"call_id":"call_1","output":"12:00","type":"function_call_output"}]}"#
        );
        let parsed = ClientBody::parse(body.as_bytes()).unwrap();
        assert_eq!(anchor(Ingress::Responses, &parsed), Some(1));
        // A chained request without `input` gets one.
        let chained = r#"{"model":"m","previous_response_id":"resp_0"}"#;
        let out = appended(Ingress::Responses, chained, &added[2..]).unwrap();
        assert!(out.starts_with(r#"{"input":[{"call_id":"call_1""#), "{out}");
    }

    /// G13: a mixed Responses reply: the client is shown its items only; its next `input`
    /// gets promptd's call back among the reply's items and its output right after them;
    /// a client chaining by `previous_response_id` gets the output alone, first.
    #[test]
    fn g13_responses_a_mixed_reply_is_split_and_put_back() {
        let reply = json!({"id": "resp_9", "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "c_theirs", "name": "read_file", "arguments": "{}"},
            {"type": "function_call", "call_id": "c_own", "name": "clock_now", "arguments": "{}"},
        ]});
        let all = calls(Ingress::Responses, &reply);
        assert_eq!(all.iter().map(|c| c.nth).collect::<Vec<_>>(), [0, 1]);
        let own = vec![all[1].clone()];
        let shown = for_client(Ingress::Responses, &reply, &own);
        assert_eq!(shown["output"].as_array().unwrap().len(), 2);
        assert_eq!(shown["output"][1]["call_id"], "c_theirs");
        let first = r#"{"model":"m","input":[{"role":"user","content":"hi"}]}"#;
        let parsed = ClientBody::parse(first.as_bytes()).unwrap();
        let r = Restore::new(
            Ingress::Responses,
            &conversation(Ingress::Responses, &parsed),
            anchor(Ingress::Responses, &parsed).unwrap(),
            Vec::new(),
            &reply,
            &own,
            &[ran("c_own", "clock_now", "12:00")],
        );
        assert_eq!((r.shown, r.response.as_deref()), (2, Some("resp_9")));
        let items = shown["output"].as_array().unwrap();
        let next = format!(
            r#"{{"model":"m","input":[{{"role":"user","content":"hi"}},{},{},{{"type":"function_call_output","call_id":"c_theirs","output":"x"}}]}}"#,
            items[0], items[1]
        );
        let v: Value = serde_json::from_str(&restored(
            Ingress::Responses,
            &next,
            std::slice::from_ref(&r),
        ))
        .unwrap();
        let ids: Vec<&str> = (v["input"].as_array().unwrap().iter())
            .map(|i| i["call_id"].as_str().unwrap_or("-"))
            .collect();
        assert_eq!(ids, ["-", "-", "c_theirs", "c_own", "c_own", "c_theirs"]);
        assert_eq!(v["input"][4]["type"], "function_call_output");
        // Chained: the upstream holds the reply whole; only promptd's output goes back.
        let chained = r#"{"model":"m","previous_response_id":"resp_9","input":[{"type":"function_call_output","call_id":"c_theirs","output":"x"}]}"#;
        assert_eq!(
            restored(Ingress::Responses, chained, std::slice::from_ref(&r)),
            r#"{"model":"m","previous_response_id":"resp_9","input":[{"call_id":"c_own","output":"12:00","type":"function_call_output"},{"type":"function_call_output","call_id":"c_theirs","output":"x"}]}"#
        );
        let other = chained.replace("resp_9", "resp_8");
        assert_eq!(restored(Ingress::Responses, &other, &[r]), other);
    }

    /// G13: Gemini's calls may come without ids: a round appends the model's content as it
    /// came (its thought signature kept) and one user content of function responses named by
    /// the calls' names; a mixed reply's call goes back among its parts by its place, its
    /// response first in the next content.
    #[test]
    fn g13_gemini_rounds_and_a_mixed_reply_without_ids() {
        let reply = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "Looking."},
            {"functionCall": {"name": "read_file", "args": {}}, "thoughtSignature": "c2ln"},
            {"functionCall": {"name": "clock_now", "args": {"tz": "UTC"}}},
        ]}, "finishReason": "STOP", "index": 0}]});
        let all = calls(Ingress::GenerateContent, &reply);
        assert_eq!(
            all.iter()
                .map(|c| (c.id.as_str(), c.index, c.nth))
                .collect::<Vec<_>>(),
            [("", 1, 0), ("", 2, 1)]
        );
        let added = round_messages(
            Ingress::GenerateContent,
            &reply,
            &[ran("", "clock_now", "12:00")],
        );
        assert_eq!(added.len(), 2);
        assert!(
            added[0].contains(r#""thoughtSignature":"c2ln""#),
            "{}",
            added[0]
        );
        assert_eq!(
            added[1],
            r#"{"parts":[{"functionResponse":{"name":"clock_now","response":{"output":"12:00"}}}],"role":"user"}"#
        );
        // A failed tool's result is Gemini's `error`; a call that had an id gets it back.
        let failed = Ran {
            is_error: true,
            ..ran("c9", "clock_now", "no such zone")
        };
        assert_eq!(
            result_messages(Ingress::GenerateContent, &[failed])[0],
            r#"{"parts":[{"functionResponse":{"id":"c9","name":"clock_now","response":{"error":"no such zone"}}}],"role":"user"}"#
        );
        let own = vec![all[1].clone()];
        let shown = for_client(Ingress::GenerateContent, &reply, &own);
        let parts = &shown["candidates"][0]["content"]["parts"];
        assert_eq!(parts.as_array().unwrap().len(), 2);
        let first = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
        let parsed = ClientBody::parse(first.as_bytes()).unwrap();
        let r = Restore::new(
            Ingress::GenerateContent,
            &conversation(Ingress::GenerateContent, &parsed),
            anchor(Ingress::GenerateContent, &parsed).unwrap(),
            Vec::new(),
            &reply,
            &own,
            &[ran("", "clock_now", "12:00")],
        );
        let next = format!(
            r#"{{"contents":[{{"role":"user","parts":[{{"text":"hi"}}]}},{{"role":"model","parts":{parts}}},{{"role":"user","parts":[{{"functionResponse":{{"name":"read_file","response":{{"output":"x"}}}}}}]}}]}}"#
        );
        let v: Value = serde_json::from_str(&restored(
            Ingress::GenerateContent,
            &next,
            std::slice::from_ref(&r),
        ))
        .unwrap();
        assert_eq!(
            v["contents"][1]["parts"],
            reply["candidates"][0]["content"]["parts"]
        );
        let names: Vec<&str> = (v["contents"][2]["parts"].as_array().unwrap().iter())
            .map(|p| p["functionResponse"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["clock_now", "read_file"]);
        // A client that folded a stream holds its text in pieces: the call still goes back
        // after the client's call before it, not by the reply's part index.
        let pieces = r#"[{"text":"Look"},{"text":"ing."},{"functionCall":{"name":"read_file","args":{}},"thoughtSignature":"c2ln"}]"#;
        let streamed = next.replace(&parts.to_string(), pieces);
        assert_ne!(streamed, next);
        let v: Value =
            serde_json::from_str(&restored(Ingress::GenerateContent, &streamed, &[r])).unwrap();
        let called: Vec<&str> = (v["contents"][1]["parts"].as_array().unwrap().iter())
            .map(|p| p["functionCall"]["name"].as_str().unwrap_or("-"))
            .collect();
        assert_eq!(called, ["-", "-", "read_file", "clock_now"]);
    }

    /// G13, G5: mixed streams: Responses loses promptd's item's events (the output indexes
    /// after it renumbered, the completed response without it); Gemini loses the chunk of
    /// promptd's call, found by its place among the calls.
    #[test]
    fn g13_responses_and_gemini_mixed_streams_lose_promptds_call() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"output\":[]}}\n\n",
            "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"call_id\":\"own\"}}\n\n",
            "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"call_id\":\"theirs\"}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"call_id\":\"own\"},{\"call_id\":\"theirs\"}]}}\n\n",
        );
        let frames = crate::gateway::stream::Frames::default()
            .push(stream.as_bytes())
            .unwrap();
        let shown = frames_for_client(Ingress::Responses, frames.clone(), &[at(0)]);
        assert_eq!(shown.len(), 3);
        assert_eq!(shown[0], frames[0], "untouched frames go as they came");
        assert_eq!(
            shown[1].json().unwrap(),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"call_id": "theirs"}})
        );
        assert_eq!(
            shown[2].json().unwrap()["response"]["output"],
            json!([{"call_id": "theirs"}])
        );
        let chunk = |part: Value, finish: bool| {
            let mut c = json!({"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}]});
            if finish {
                c["candidates"][0]["finishReason"] = json!("STOP");
            }
            format!("data: {c}\r\n\r\n")
        };
        let stream = [
            chunk(json!({"text": "Looking."}), false),
            chunk(json!({"functionCall": {"name": "read_file"}}), false),
            chunk(json!({"functionCall": {"name": "clock_now"}}), true),
        ]
        .concat();
        let frames = crate::gateway::stream::Frames::default()
            .push(stream.as_bytes())
            .unwrap();
        let mut own = at(2);
        own.nth = 1;
        let shown = frames_for_client(
            Ingress::StreamGenerateContent,
            frames.clone(),
            &[own.clone()],
        );
        assert_eq!(shown.len(), 3, "the last chunk keeps its finishReason");
        assert_eq!(shown[..2], frames[..2]);
        assert_eq!(
            shown[2].json().unwrap()["candidates"][0]["content"]["parts"],
            json!([])
        );
        // Not the last: its chunk goes.
        let stream = [
            chunk(json!({"functionCall": {"name": "clock_now"}}), false),
            chunk(json!({"functionCall": {"name": "read_file"}}), true),
        ]
        .concat();
        let frames = crate::gateway::stream::Frames::default()
            .push(stream.as_bytes())
            .unwrap();
        own.nth = 0;
        let shown = frames_for_client(Ingress::StreamGenerateContent, frames.clone(), &[own]);
        assert_eq!(shown, frames[1..]);
    }
}
