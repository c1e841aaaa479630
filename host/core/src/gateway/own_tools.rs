//! promptd's own tools in a gateway request (G13): tools the client does not know, which
//! promptd runs itself (an MCP server's). Pure pieces the daemon's tool loop uses: the tools
//! spliced into the client's `tools` in the provider's shape, a reply's calls split into
//! promptd's and the client's, the next round's body (the client's with the model's turn and
//! promptd's results appended), the reply the client is shown (promptd's calls taken out),
//! and the restore that puts promptd's calls and results back into the client's next body at
//! their place, so the upstream sees the same bytes every request.
//!
//! Covered: Anthropic Messages and OpenAI Chat Completions, streamed and not, and Bedrock
//! Converse unstreamed ([`covers`]).

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
        Ingress::Messages | Ingress::ChatCompletions | Ingress::Converse
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
            // Every client tool denied: its bytes go, so nothing follows promptd's.
            let all_denied = !elements.is_empty() && splice.denied.len() >= elements.len();
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
    /// Where it sits: its index in Messages' `content`, in Chat's `tool_calls`.
    pub index: usize,
}

/// Chat's one message of a reply.
fn chat_message(reply: &Value) -> &Value {
    &reply["choices"][0]["message"]
}

/// Bedrock's reply message.
fn converse_message(reply: &Value) -> &Value {
    &reply["output"]["message"]
}

/// The content blocks of a Messages or Converse reply.
fn content_of(ingress: Ingress, reply: &Value) -> &Value {
    match ingress {
        Ingress::Converse | Ingress::ConverseStream => &converse_message(reply)["content"],
        _ => &reply["content"],
    }
}

/// The tool calls of a whole (unstreamed) reply, in its order.
pub fn calls(ingress: Ingress, reply: &Value) -> Vec<Call> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    match ingress {
        Ingress::ChatCompletions => (chat_message(reply)["tool_calls"].as_array())
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(index, c)| Call {
                id: s(&c["id"]),
                name: s(&c["function"]["name"]),
                arguments: (c["function"]["arguments"].as_str())
                    .and_then(|a| serde_json::from_str::<Value>(a).ok())
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({})),
                index,
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
            })
            .collect(),
    }
}

/// What running one of promptd's calls gave the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ran {
    /// The call's id.
    pub id: String,
    /// The text the model reads.
    pub content: String,
    /// Whether the tool failed.
    pub is_error: bool,
}

/// The model's turn as the conversation holds it (Messages: its `content`; Chat: its text and
/// calls), as one message's JSON.
fn assistant_turn(ingress: Ingress, reply: &Value) -> String {
    match ingress {
        Ingress::ChatCompletions => {
            let m = chat_message(reply);
            let mut turn = json!({"role": "assistant", "content": m["content"].clone()});
            if let Some(calls) = m.get("tool_calls").filter(|c| c.is_array()) {
                turn["tool_calls"] = calls.clone();
            }
            turn.to_string()
        }
        _ => {
            json!({"role": "assistant", "content": content_of(ingress, reply).clone()}).to_string()
        }
    }
}

/// The result block of one run call: Messages' `tool_result`, Bedrock's `toolResult`.
fn result_block(ingress: Ingress, ran: &Ran) -> Value {
    if matches!(ingress, Ingress::Converse | Ingress::ConverseStream) {
        let mut result = json!({"toolUseId": ran.id, "content": [{"text": ran.content}]});
        if ran.is_error {
            result["status"] = json!("error");
        }
        return json!({ "toolResult": result });
    }
    let mut block = json!({"type": "tool_result", "tool_use_id": ran.id, "content": ran.content});
    if ran.is_error {
        block["is_error"] = json!(true);
    }
    block
}

/// The results as messages: Messages' one user turn of `tool_result` blocks, Chat's one
/// `tool` message per call.
fn result_messages(ingress: Ingress, ran: &[Ran]) -> Vec<String> {
    match ingress {
        Ingress::ChatCompletions => ran
            .iter()
            .map(|r| {
                json!({"role": "tool", "tool_call_id": r.id, "content": r.content}).to_string()
            })
            .collect(),
        _ => vec![json!({"role": "user",
            "content": ran.iter().map(|r| result_block(ingress, r)).collect::<Vec<_>>()})
        .to_string()],
    }
}

/// The messages one round of promptd's own calls adds: the model's turn, then the results.
pub fn round_messages(ingress: Ingress, reply: &Value, ran: &[Ran]) -> Vec<String> {
    let mut out = vec![assistant_turn(ingress, reply)];
    out.extend(result_messages(ingress, ran));
    out
}

/// Where `messages` sits in `body`, and its elements.
fn message_list(body: &ClientBody<'_>) -> Result<(Range<usize>, Vec<Range<usize>>), GatewayError> {
    let range = (body.member("messages").map(|m| m.value.clone()))
        .ok_or_else(|| GatewayError::InvalidBody("the body has no `messages`".into()))?;
    let items = elements(body.text, range.clone())
        .ok_or_else(|| GatewayError::InvalidBody("`messages` must be an array".into()))?;
    Ok((range, items))
}

/// The next round's body: `body` with `messages` appended to its `messages` (nothing else of
/// it changes).
pub fn appended(body: &str, messages: &[String]) -> Result<String, GatewayError> {
    let parsed = ClientBody::parse(body.as_bytes())?;
    let (range, items) = message_list(&parsed)?;
    let mut splice = Splice::default();
    match items.last() {
        Some(last) => splice.push(last.end, format!(",{}", messages.join(",")), Part::OwnTools),
        None => splice.push(range.start + 1, messages.join(","), Part::OwnTools),
    }
    String::from_utf8(splice.apply(body.as_bytes()))
        .map_err(|_| GatewayError::InvalidBody("the appended body is not UTF-8".into()))
}

/// The reply the client is shown when it mixes promptd's calls and the client's: promptd's
/// (`own`, by id) taken out; the rest as the upstream sent it.
pub fn for_client(ingress: Ingress, reply: &Value, own: &[String]) -> Value {
    let mut reply = reply.clone();
    let keep = |item: &Value, id: &str| !own.iter().any(|o| o == item[id].as_str().unwrap_or(""));
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
        _ => {
            if let Some(blocks) = reply["content"].as_array_mut() {
                blocks.retain(|b| b["type"] != "tool_use" || keep(b, "id"));
            }
        }
    }
    reply
}

/// The frames of a streamed reply the client is shown when it mixes promptd's calls with the
/// client's: the frames of promptd's calls (`own`: their indexes, Messages' content blocks,
/// Chat's `tool_calls`) taken out and the indexes after them renumbered, so the frames fold
/// into [`for_client`]'s reply. A frame that changes is re-encoded; the others go as they came.
pub fn frames_for_client(ingress: Ingress, frames: Vec<Frame>, own: &[usize]) -> Vec<Frame> {
    let shift = |index: u64| index - own.iter().filter(|&&o| (o as u64) < index).count() as u64;
    let is_own = |index: u64| own.iter().any(|&o| o as u64 == index);
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
    /// promptd's calls put back into the reply: their index in it and their JSON.
    pub calls: Vec<(usize, String)>,
    /// Their results: Messages' `tool_result` blocks first in the turn after the reply,
    /// Chat's `tool` messages right after it.
    pub results: Vec<String>,
}

impl Restore {
    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        let texts = self.before.iter().chain(&self.results);
        texts.map(String::len).sum::<usize>()
            + self.calls.iter().map(|(_, c)| c.len()).sum::<usize>()
            + self.digest.len()
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
        let calls = own
            .iter()
            .filter_map(|c| Some((c.index, items.get(c.index)?.to_string())))
            .collect();
        let results = match ingress {
            Ingress::ChatCompletions => result_messages(ingress, ran),
            _ => ran
                .iter()
                .map(|r| result_block(ingress, r).to_string())
                .collect(),
        };
        Restore {
            messages: conversation.messages.len(),
            digest: conversation.digest(conversation.messages.len()).to_string(),
            anchor,
            before,
            calls,
            results,
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
    let Ok((_, items)) = message_list(body) else {
        return Vec::new();
    };
    let mut splice = Splice::default();
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
        // The reply's list the calls go back into, and where the results go.
        let list = match ingress {
            Ingress::ChatCompletions => member(body.text, reply.clone(), "tool_calls"),
            _ => member(body.text, reply.clone(), "content"),
        };
        let Some(list) = list.and_then(|l| Some((l.clone(), elements(body.text, l)?))) else {
            continue;
        };
        let results_at = match ingress {
            Ingress::ChatCompletions => Some((reply.end, format!(",{}", r.results.join(",")))),
            _ => items
                .get(r.anchor + 1)
                .and_then(|next| member(body.text, next.clone(), "content"))
                .and_then(|c| elements(body.text, c))
                .and_then(|blocks| blocks.first().cloned())
                .map(|first| (first.start, format!("{},", r.results.join(",")))),
        };
        let Some((results_at, results)) = results_at else {
            continue;
        };
        put_back(&list.0, &list.1, &r.calls, &mut splice);
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
            parameters: json!({"type": "object", "properties": {"tz": {"type": "string"}}}),
            defer: None,
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
        let shown = for_client(Ingress::Messages, &reply, &["t2".to_string()]);
        assert_eq!(shown["content"].as_array().unwrap().len(), 2);
        let first = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let parsed = ClientBody::parse(first.as_bytes()).unwrap();
        let ran = [Ran {
            id: "t2".into(),
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
            content: "12:00".into(),
            is_error: false,
        }];
        let added = round_messages(Ingress::ChatCompletions, &reply, &ran);
        let body = r#"{"messages":[ {"role":"user","content":"hi"} ],"model":"m"}"#;
        assert_eq!(
            appended(body, &added).unwrap(),
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
        let shown = frames_for_client(Ingress::Messages, frames.clone(), &[0]);
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
        let shown = frames_for_client(Ingress::ChatCompletions, frames, &[0]);
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
}
