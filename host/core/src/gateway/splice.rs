//! The splice: where promptd's contributions go into a client's body, as byte edits the log
//! records (G4). Every byte of the client's body outside an edit reaches the upstream as the
//! client sent it, so the upstream body rebuilds from the client's body and the recorded edits
//! byte for byte ([`Splice::apply`]).

use std::ops::Range;

use serde_json::Value;

use super::body::{elements, first_byte, members, ClientBody};
pub(super) use super::edits::quoted;
use super::edits::{first_member, remove_items};
pub use super::edits::{ClientSystem, Contributions, Edit, Part, Splice, SpliceSettings};
use super::{GatewayError, Ingress};

/// Anthropic's limit on `cache_control` breakpoints in one request.
pub const MAX_BREAKPOINTS: usize = 4;

/// `text` escaped as the inside of a JSON string literal.
fn escaped(text: &str) -> String {
    let q = quoted(text);
    q[1..q.len() - 1].to_string()
}

/// Plans the splice of `contributions` into `body` for `ingress` (G4). Pure: the same body,
/// contributions and settings give the same edits.
pub fn plan(
    ingress: Ingress,
    body: &ClientBody<'_>,
    contributions: &Contributions,
    settings: &SpliceSettings,
) -> Result<Splice, GatewayError> {
    body.check(ingress)?;
    let mut splice = Splice::default();
    if ingress.provider() == super::Provider::Gemini {
        super::gemini::splice(body, contributions, settings, &mut splice)?;
        if !contributions.tools.is_empty() {
            let client = tool_names(ingress, body);
            super::own_tools::add_tools(ingress, body, &contributions.tools, &client, &mut splice)?;
        }
        splice.edits.sort_by_key(|e| e.at);
        return Ok(splice);
    }
    if ingress.provider() == super::Provider::Bedrock {
        super::bedrock::splice(body, contributions, settings, &mut splice)?;
        if !contributions.tools.is_empty() {
            let client = tool_names(ingress, body);
            super::own_tools::add_tools(ingress, body, &contributions.tools, &client, &mut splice)?;
        }
        splice.edits.sort_by_key(|e| e.at);
        return Ok(splice);
    }
    deny_tools(ingress, body, &settings.deny_tools, &mut splice);
    defer_tools(ingress, body, settings, &mut splice);
    if !contributions.tools.is_empty() {
        let client = tool_names(ingress, body);
        super::own_tools::add_tools(ingress, body, &contributions.tools, &client, &mut splice)?;
    }
    match ingress {
        Ingress::Messages | Ingress::CountTokens => {
            messages(body, contributions, settings, &mut splice)?
        }
        Ingress::ChatCompletions => chat(body, contributions, settings, &mut splice)?,
        Ingress::Responses => responses(body, contributions, settings, &mut splice)?,
        Ingress::GenerateContent
        | Ingress::StreamGenerateContent
        | Ingress::Converse
        | Ingress::ConverseStream => {}
    }
    splice.edits.sort_by_key(|e| e.at); // stable: edits at one place keep their order
    Ok(splice)
}

/// Where the value of `key` sits in the object at `object` of `text` (the last, should the
/// object repeat it, as JSON decoders take it).
fn member_span(text: &str, object: Range<usize>, key: &str) -> Option<Range<usize>> {
    members(text, object)?
        .into_iter()
        .rev()
        .find(|m| m.key == key)
        .map(|m| m.value)
}

/// The client's tools: each element of `tools` with its span and the name it gives (read
/// from the client's bytes: nothing else of the tool is decoded).
fn client_tools(ingress: Ingress, body: &ClientBody<'_>) -> Vec<(Range<usize>, Option<String>)> {
    let text = body.text;
    let Some(tools) = body.member("tools") else {
        return Vec::new();
    };
    let name_of = |item: &Range<usize>| -> Option<String> {
        let name = match ingress {
            Ingress::ChatCompletions => {
                member_span(text, member_span(text, item.clone(), "function")?, "name")?
            }
            _ => member_span(text, item.clone(), "name")?,
        };
        serde_json::from_str(&text[name]).ok()
    };
    elements(text, tools.value.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|item| {
            let name = name_of(&item);
            (item, name)
        })
        .collect()
}

/// The names of the client's tools, in its order (those without one left out): what a
/// plugin reading `client-tools` is shown (world 0.3.0).
pub fn tool_names(ingress: Ingress, body: &ClientBody<'_>) -> Vec<String> {
    if ingress.provider() == super::Provider::Gemini {
        return super::gemini::tool_names(body);
    }
    if ingress.provider() == super::Provider::Bedrock {
        return super::bedrock::tool_names(body);
    }
    (client_tools(ingress, body).into_iter())
        .filter_map(|(_, name)| name)
        .collect()
}

/// Takes the client tools `deny` names out of `tools`: each denied element's bytes with the
/// comma that joins it to the list.
fn deny_tools(ingress: Ingress, body: &ClientBody<'_>, deny: &[String], splice: &mut Splice) {
    if deny.is_empty() {
        return;
    }
    let tools = client_tools(ingress, body);
    let is_denied = |i: usize| tools[i].1.as_ref().is_some_and(|n| deny.contains(n));
    let items: Vec<Range<usize>> = tools.iter().map(|(item, _)| item.clone()).collect();
    splice.denied.extend(
        (0..items.len())
            .filter(|&i| is_denied(i))
            .filter_map(|i| tools[i].1.clone()),
    );
    remove_items(&items, is_denied, splice);
}

/// Marks the client tools `defer_tools` names for deferred loading: `"defer_loading":true`
/// inserted as each one's first member, the tool's own bytes untouched. Anthropic Messages
/// defers any named tool, Responses a function tool; a denied tool, or one the client gave its
/// own `defer_loading`, is left as it is. Where the endpoint has no deferred loading (Chat
/// Completions, a token count) the tools stay loaded, said in `skipped`.
fn defer_tools(
    ingress: Ingress,
    body: &ClientBody<'_>,
    settings: &SpliceSettings,
    splice: &mut Splice,
) {
    let defer = &settings.defer_tools;
    if defer.is_empty() {
        return;
    }
    let text = body.text;
    let named: Vec<(Range<usize>, String)> = client_tools(ingress, body)
        .into_iter()
        .filter_map(|(item, name)| Some((item, name?)))
        .filter(|(_, name)| defer.contains(name) && !settings.deny_tools.contains(name))
        .collect();
    if named.is_empty() {
        return;
    }
    let endpoint = match ingress {
        Ingress::Messages | Ingress::Responses => None,
        Ingress::ChatCompletions => Some("Chat Completions"),
        Ingress::CountTokens => Some("a token count"),
        Ingress::GenerateContent | Ingress::StreamGenerateContent => Some("Gemini"),
        Ingress::Converse | Ingress::ConverseStream => Some("Bedrock Converse"),
    };
    if let Some(endpoint) = endpoint {
        let names: Vec<&str> = named.iter().map(|(_, n)| n.as_str()).collect();
        splice.skipped.push(format!(
            "defer_tools: {endpoint} has no deferred loading, so these stay loaded: {}",
            names.join(", ")
        ));
        return;
    }
    let mut not_function = Vec::new();
    for (item, name) in named {
        let fields = members(text, item.clone()).unwrap_or_default();
        let raw = |key: &str| {
            fields
                .iter()
                .find(|m| m.key == key)
                .map(|m| &text[m.value.clone()])
        };
        if raw("defer_loading").is_some() {
            continue; // the client's own word on it
        }
        let kind = raw("type").and_then(|t| serde_json::from_str::<String>(t).ok());
        if ingress == Ingress::Responses && kind.as_deref() != Some("function") {
            not_function.push(name);
            continue;
        }
        let comma = if fields.is_empty() { "" } else { "," };
        splice.push(
            item.start + 1,
            format!("\"defer_loading\":true{comma}"),
            Part::DeferTool,
        );
        splice.deferred.push(name);
    }
    if !not_function.is_empty() {
        splice.skipped.push(format!(
            "defer_tools: only a function tool is deferred on Responses, so these stay loaded: {}",
            not_function.join(", ")
        ));
    }
}

/// Anthropic Messages: the sections as a text block of `system`, the runtime context as a
/// text block closing the last user turn; a breakpoint of promptd's own after the sections
/// when the client left room for one and set none in its system text.
fn messages(
    body: &ClientBody<'_>,
    contributions: &Contributions,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let marks = breakpoints(body)?;
    splice.client_breakpoints = marks.total;
    if !contributions.system.is_empty() {
        let own = marks.total < MAX_BREAKPOINTS && !marks.in_system;
        let mut block = format!(
            "{{\"type\":\"text\",\"text\":{}",
            quoted(&contributions.system)
        );
        if own {
            // A breakpoint's TTL may not be shorter than a later one's (Anthropic refuses
            // the order): ours takes the longest TTL the client set after it.
            let ttl = if marks.hour_after_tools {
                ",\"ttl\":\"1h\""
            } else {
                ""
            };
            block.push_str(&format!(
                ",\"cache_control\":{{\"type\":\"ephemeral\"{ttl}}}"
            ));
            splice.breakpoint_added = true;
        }
        block.push('}');
        system_blocks(body, settings, splice, block)?;
    }
    if let Some(context) = &contributions.runtime_context {
        let block = format!("{{\"type\":\"text\",\"text\":{}}}", quoted(context));
        last_user_block(body, splice, block)?;
    }
    Ok(())
}

/// Joins `block` to the client's `system` (absent, a string, or a list of blocks).
fn system_blocks(
    body: &ClientBody<'_>,
    settings: &SpliceSettings,
    splice: &mut Splice,
    block: String,
) -> Result<(), GatewayError> {
    let text = body.text;
    let Some(system) = body.member("system") else {
        first_member(
            body,
            splice,
            "system",
            &format!("[{block}]"),
            Part::Sections,
        );
        return Ok(());
    };
    let range = system.value.clone();
    let raw = &text[range.clone()];
    match first_byte(raw) {
        b'"' if raw == "\"\"" => splice.replace(range, format!("[{block}]"), Part::Sections),
        b'"' => {
            let (before, after) = match settings.client_system {
                ClientSystem::Last => (format!("[{block},"), "}]".to_string()),
                ClientSystem::First => ("[".to_string(), format!("}},{block}]")),
            };
            let (open, close) = match settings.client_system {
                ClientSystem::Last => (Part::Sections, Part::Wrap),
                ClientSystem::First => (Part::Wrap, Part::Sections),
            };
            splice.push(range.start, before, open);
            splice.push(
                range.start,
                "{\"type\":\"text\",\"text\":".into(),
                Part::Wrap,
            );
            splice.push(range.end, after, close);
        }
        b'[' => {
            let items = elements(text, range.clone()).unwrap_or_default();
            match (items.first(), items.last(), settings.client_system) {
                (Some(first), _, ClientSystem::Last) => {
                    splice.push(first.start, format!("{block},"), Part::Sections)
                }
                (_, Some(last), ClientSystem::First) => {
                    splice.push(last.end, format!(",{block}"), Part::Sections)
                }
                _ => splice.push(range.start + 1, block, Part::Sections),
            }
        }
        b'n' => splice.replace(range, format!("[{block}]"), Part::Sections),
        _ => {
            return Err(GatewayError::InvalidBody(
                "`system` must be a string or an array of blocks".into(),
            ))
        }
    }
    Ok(())
}

/// Adds `block` at the end of the last message's content when that message is the user's (or a
/// system message a client put last, as Claude Code does);
/// otherwise (a prefill of the model's reply) the runtime context is left out, said in
/// `skipped`.
fn last_user_block(
    body: &ClientBody<'_>,
    splice: &mut Splice,
    block: String,
) -> Result<(), GatewayError> {
    let text = body.text;
    let Some(messages) = body.member("messages") else {
        return Ok(());
    };
    let items = elements(text, messages.value.clone()).unwrap_or_default();
    let Some(last) = items.last() else {
        splice
            .skipped
            .push("runtime context: the request has no messages".into());
        return Ok(());
    };
    let fields = members(text, last.clone()).unwrap_or_default();
    let role = fields
        .iter()
        .find(|m| m.key == "role")
        .map(|m| &text[m.value.clone()]);
    if !matches!(role, Some("\"user\"" | "\"system\"")) {
        splice
            .skipped
            .push("runtime context: the last message is not the user's".into());
        return Ok(());
    }
    let Some(content) = fields.iter().find(|m| m.key == "content") else {
        return Err(GatewayError::InvalidBody(
            "the last message has no `content`".into(),
        ));
    };
    let range = content.value.clone();
    let raw = &text[range.clone()];
    match first_byte(raw) {
        b'"' if raw == "\"\"" => splice.replace(range, format!("[{block}]"), Part::RuntimeContext),
        b'"' => list_after_string(splice, range, TEXT_BLOCK, &block, Part::RuntimeContext),
        b'[' => match elements(text, range.clone()).unwrap_or_default().last() {
            Some(item) => splice.push(item.end, format!(",{block}"), Part::RuntimeContext),
            None => splice.push(range.start + 1, block, Part::RuntimeContext),
        },
        _ => {
            return Err(GatewayError::InvalidBody(
                "the last message's `content` must be a string or an array".into(),
            ))
        }
    }
    Ok(())
}

/// How a text block opens, before its JSON string.
const TEXT_BLOCK: &str = "{\"type\":\"text\",\"text\":";

/// Makes the client's string value at `range` the first element of a list, inside an object
/// that `open` starts (its bytes untouched), with `added` after it: `[open"…"}, added]`.
fn list_after_string(
    splice: &mut Splice,
    range: Range<usize>,
    open: &str,
    added: &str,
    part: Part,
) {
    splice.push(range.start, format!("[{open}"), Part::Wrap);
    splice.push(range.end, "}".into(), Part::Wrap);
    splice.push(range.end, format!(",{added}]"), part);
}

/// The client's `cache_control` breakpoints, as the splice needs to know them.
#[derive(Debug, Default)]
struct Breakpoints {
    total: usize,
    /// One is in the client's system text.
    in_system: bool,
    /// One after the tools asks for a 1-hour TTL.
    hour_after_tools: bool,
}

fn breakpoints(body: &ClientBody<'_>) -> Result<Breakpoints, GatewayError> {
    let mut out = Breakpoints::default();
    for key in ["tools", "system", "messages"] {
        let Some(member) = body.member(key) else {
            continue;
        };
        let mut marks = Vec::new();
        collect_marks(body.text, member.value.clone(), &mut marks);
        out.total += marks.len();
        if key == "system" && !marks.is_empty() {
            out.in_system = true;
        }
        if key != "tools" && marks.iter().any(|ttl| ttl.as_deref() == Some("1h")) {
            out.hour_after_tools = true;
        }
    }
    Ok(out)
}

/// Every `cache_control` breakpoint in the value at `range` of `text`, with its TTL. Walks
/// the client's bytes, so a number no float holds is never decoded.
fn collect_marks(text: &str, range: Range<usize>, out: &mut Vec<Option<String>>) {
    match first_byte(&text[range.clone()]) {
        b'{' => {
            for member in members(text, range).unwrap_or_default() {
                let raw = &text[member.value.clone()];
                if member.key == "cache_control" {
                    if raw != "null" {
                        let ttl = serde_json::from_str::<Value>(raw)
                            .ok()
                            .and_then(|m| m.get("ttl").and_then(Value::as_str).map(str::to_string));
                        out.push(ttl);
                    }
                } else {
                    collect_marks(text, member.value, out);
                }
            }
        }
        b'[' => {
            for item in elements(text, range).unwrap_or_default() {
                collect_marks(text, item, out);
            }
        }
        _ => {}
    }
}

/// A chat message of `role` holding `text`.
fn chat_message(role: &str, text: &str) -> String {
    format!("{{\"role\":{},\"content\":{}}}", quoted(role), quoted(text))
}

/// OpenAI Chat Completions: the sections as a system message before the client's messages
/// (or after its leading system and developer messages), the runtime context as a user
/// message after its last; `stream_options.include_usage` asked for a streamed reply.
fn chat(
    body: &ClientBody<'_>,
    contributions: &Contributions,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let text = body.text;
    let Some(messages) = body.member("messages") else {
        return Ok(());
    };
    let range = messages.value.clone();
    let items = elements(text, range.clone()).unwrap_or_default();
    if !contributions.system.is_empty() {
        let message = chat_message("system", &contributions.system);
        let leading = match settings.client_system {
            ClientSystem::Last => 0,
            ClientSystem::First => items
                .iter()
                .take_while(|item| {
                    members(text, (*item).clone())
                        .unwrap_or_default()
                        .iter()
                        .any(|m| {
                            m.key == "role"
                                && matches!(&text[m.value.clone()], "\"system\"" | "\"developer\"")
                        })
                })
                .count(),
        };
        match (leading, items.first()) {
            (0, Some(first)) => splice.push(first.start, format!("{message},"), Part::Sections),
            (0, None) => splice.push(range.start + 1, message, Part::Sections),
            (n, _) => splice.push(items[n - 1].end, format!(",{message}"), Part::Sections),
        }
    }
    if let Some(context) = &contributions.runtime_context {
        let message = chat_message("user", context);
        match items.last() {
            Some(last) => splice.push(last.end, format!(",{message}"), Part::RuntimeContext),
            None if contributions.system.is_empty() => {
                splice.push(range.start + 1, message, Part::RuntimeContext)
            }
            None => splice.push(range.start + 1, format!(",{message}"), Part::RuntimeContext),
        }
    }
    if body.streamed() {
        include_usage(body, splice)?;
    }
    Ok(())
}

/// Asks a streamed Chat Completions reply for its usage when the client did not.
fn include_usage(body: &ClientBody<'_>, splice: &mut Splice) -> Result<(), GatewayError> {
    let text = body.text;
    let Some(options) = body.member("stream_options") else {
        let end = body.members.last().map_or(body.open + 1, |m| m.value.end);
        let comma = if body.members.is_empty() { "" } else { "," };
        splice.push(
            end,
            format!("{comma}\"stream_options\":{{\"include_usage\":true}}"),
            Part::IncludeUsage,
        );
        splice.usage_added = true;
        return Ok(());
    };
    let range = options.value.clone();
    if first_byte(&text[range.clone()]) == b'n' {
        splice.replace(range, "{\"include_usage\":true}".into(), Part::IncludeUsage);
        splice.usage_added = true;
        return Ok(());
    }
    let Some(fields) = members(text, range.clone()) else {
        return Err(GatewayError::InvalidBody(
            "`stream_options` must be an object".into(),
        ));
    };
    match fields.iter().find(|m| m.key == "include_usage") {
        Some(m) if &text[m.value.clone()] == "true" => {}
        Some(m) => {
            splice.replace(m.value.clone(), "true".into(), Part::IncludeUsage);
            splice.usage_added = true;
        }
        None => {
            let comma = if fields.is_empty() { "" } else { "," };
            splice.push(
                range.start + 1,
                format!("\"include_usage\":true{comma}"),
                Part::IncludeUsage,
            );
            splice.usage_added = true;
        }
    }
    Ok(())
}

/// OpenAI Responses: the sections join `instructions` (which a `previous_response_id` does
/// not carry over, so every request says them again), the runtime context is an input
/// message after the client's last item.
fn responses(
    body: &ClientBody<'_>,
    contributions: &Contributions,
    settings: &SpliceSettings,
    splice: &mut Splice,
) -> Result<(), GatewayError> {
    let text = body.text;
    let system = &contributions.system;
    if !system.is_empty() {
        match body.member("instructions") {
            None => first_member(
                body,
                splice,
                "instructions",
                &quoted(system),
                Part::Sections,
            ),
            Some(m) => {
                let range = m.value.clone();
                let raw = &text[range.clone()];
                match first_byte(raw) {
                    b'n' => splice.replace(range, quoted(system), Part::Sections),
                    b'"' if raw == "\"\"" => {
                        splice.push(range.start + 1, escaped(system), Part::Sections)
                    }
                    b'"' => match settings.client_system {
                        ClientSystem::Last => splice.push(
                            range.start + 1,
                            escaped(&format!("{system}\n\n")),
                            Part::Sections,
                        ),
                        ClientSystem::First => splice.push(
                            range.end - 1,
                            escaped(&format!("\n\n{system}")),
                            Part::Sections,
                        ),
                    },
                    _ => {
                        return Err(GatewayError::InvalidBody(
                            "`instructions` must be a string".into(),
                        ))
                    }
                }
            }
        }
    }
    if let Some(context) = &contributions.runtime_context {
        let message = chat_message("user", context);
        match body.member("input") {
            None => splice
                .skipped
                .push("runtime context: the request has no `input`".into()),
            Some(m) => {
                let range = m.value.clone();
                if first_byte(&text[range.clone()]) == b'"' {
                    let open = "{\"role\":\"user\",\"content\":";
                    list_after_string(splice, range, open, &message, Part::RuntimeContext);
                } else {
                    match elements(text, range.clone()).unwrap_or_default().last() {
                        Some(last) => {
                            splice.push(last.end, format!(",{message}"), Part::RuntimeContext)
                        }
                        None => splice.push(range.start + 1, message, Part::RuntimeContext),
                    }
                }
            }
        }
    }
    Ok(())
}
