//! Review hooks' redactions in the client's own bytes (G6). A hook that redacts a gateway
//! step's new messages changes what promptd records; the same rules, every one the session's
//! hooks made, are applied to the client's body before anything else: each JSON string of a
//! user or tool message's text whose decoded value a rule matches is replaced by the redacted
//! string, re-escaped, and no other byte moves. The redacted body is what the log records and
//! what the splice is planned on, so text a hook redacted reaches neither the log nor the
//! upstream.
//!
//! ```
//! use promptd_core::assembly::review::Redaction;
//! use promptd_core::gateway::body::ClientBody;
//! use promptd_core::gateway::redact::redacted;
//! use promptd_core::gateway::Ingress;
//!
//! let client = br#"{"model":"m","messages":[{"role":"user","content":"pw hunter2"}]}"#;
//! let body = ClientBody::parse(client).unwrap();
//! let rules = [Redaction { find: "hunter2".into(), replace: "[redacted]".into() }];
//! let (text, strings) = redacted(Ingress::ChatCompletions, &body, &rules).unwrap().unwrap();
//! assert_eq!(text, r#"{"model":"m","messages":[{"role":"user","content":"pw [redacted]"}]}"#);
//! assert_eq!(strings, 1);
//! ```

use std::ops::Range;

use super::body::{elements, first_byte, members, ClientBody};
use super::splice::quoted;
use super::{GatewayError, Ingress};
use crate::assembly::review::{redact_text, Redaction};

/// The keys whose string values are a message's text, at any depth of a user or tool message
/// (`content` strings, `text` blocks, Responses' `output`).
const TEXT_KEYS: [&str; 3] = ["text", "content", "output"];

/// Replacements of whole JSON strings, in the order of their position.
type Replacements = Vec<(Range<usize>, String)>;

/// `body` with `rules` applied, in order, to the texts of its user and tool messages (Chat's
/// `role: tool`, Anthropic's tool results inside user turns, Responses'
/// `function_call_output` items), and how many strings changed; `None` when no rule matched.
/// The model's turns, system text and tools are never changed. Refused when a redaction would
/// grow a text past the bound a step's has.
pub fn redacted(
    ingress: Ingress,
    body: &ClientBody<'_>,
    rules: &[Redaction],
) -> Result<Option<(String, usize)>, GatewayError> {
    if rules.is_empty() {
        return Ok(None);
    }
    let mut out = Replacements::new();
    let text = body.text;
    let list = match ingress {
        Ingress::Responses => "input",
        Ingress::GenerateContent | Ingress::StreamGenerateContent => "contents",
        _ => "messages",
    };
    let Some(member) = body.member(list) else {
        return Ok(None);
    };
    let range = member.value.clone();
    if first_byte(&text[range.clone()]) == b'"' {
        // Responses' `input` as one string: the user's text.
        string(text, range, rules, &mut out)?;
    } else {
        for item in elements(text, range).unwrap_or_default() {
            if from_the_client(text, &item) {
                value(text, item, false, rules, &mut out)?;
            }
        }
    }
    if out.is_empty() {
        return Ok(None);
    }
    // Found in document order, never overlapping.
    let mut joined = String::with_capacity(text.len());
    let mut at = 0;
    for (range, with) in &out {
        joined.push_str(&text[at..range.start]);
        joined.push_str(with);
        at = range.end;
    }
    joined.push_str(&text[at..]);
    Ok(Some((joined, out.len())))
}

/// Whether a message element is the user's or a tool's (what a review redacts).
fn from_the_client(text: &str, item: &Range<usize>) -> bool {
    let Some(fields) = members(text, item.clone()) else {
        return false;
    };
    let field = |key: &str| {
        fields
            .iter()
            .find(|m| m.key == key)
            .and_then(|m| serde_json::from_str::<String>(&text[m.value.clone()]).ok())
    };
    matches!(field("role").as_deref(), Some("user" | "tool" | "function"))
        || matches!(
            field("type").as_deref(),
            Some("function_call_output" | "custom_tool_call_output")
        )
}

/// Walks a value: strings under a text key are redacted, arrays and objects are entered.
fn value(
    text: &str,
    range: Range<usize>,
    is_text: bool,
    rules: &[Redaction],
    out: &mut Replacements,
) -> Result<(), GatewayError> {
    match first_byte(&text[range.clone()]) {
        b'"' if is_text => string(text, range, rules, out),
        b'[' => elements(text, range)
            .unwrap_or_default()
            .into_iter()
            .try_for_each(|e| value(text, e, is_text, rules, out)),
        b'{' => members(text, range)
            .unwrap_or_default()
            .into_iter()
            .try_for_each(|m| {
                let is_text = TEXT_KEYS.contains(&m.key.as_str());
                value(text, m.value, is_text, rules, out)
            }),
        _ => Ok(()),
    }
}

/// Redacts one JSON string: replaced whole, re-escaped, only when a rule matches it.
fn string(
    text: &str,
    range: Range<usize>,
    rules: &[Redaction],
    out: &mut Replacements,
) -> Result<(), GatewayError> {
    let Ok(mut decoded) = serde_json::from_str::<String>(&text[range.clone()]) else {
        return Ok(());
    };
    // A rule can only match after another changed the text, so none matching is no change.
    if !rules.iter().any(|r| decoded.contains(r.find.as_str())) {
        return Ok(());
    }
    redact_text(&mut decoded, rules).map_err(GatewayError::Redaction)?;
    out.push((range, quoted(&decoded)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Vec<Redaction> {
        vec![Redaction {
            find: "hunter2".into(),
            replace: "[redacted]".into(),
        }]
    }

    fn redact(ingress: Ingress, client: &str) -> (String, usize) {
        let body = ClientBody::parse(client.as_bytes()).unwrap();
        let (out, n) = redacted(ingress, &body, &rules())
            .unwrap()
            .unwrap_or((client.to_string(), 0));
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
        (out, n)
    }

    #[test]
    fn g6_redactions_reach_user_and_tool_texts_and_nothing_else() {
        let client = r#"{"model":"m", "messages":[{"role":"system","content":"hunter2"},{"role":"user","content":[{"type":"text","text":"pw \u0068unter2!","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":"I saw hunter2","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"q\":\"hunter2\"}"}}]},{"role":"tool","tool_call_id":"c","content":"out: hunter2"}],"metadata":{"text":"hunter2"}}"#;
        let (out, n) = redact(Ingress::ChatCompletions, client);
        assert_eq!(n, 2);
        let expected = client
            .replace(r#""pw \u0068unter2!""#, r#""pw [redacted]!""#)
            .replace(r#""out: hunter2""#, r#""out: [redacted]""#);
        assert_eq!(
            out, expected,
            "the system text, the model's turn and metadata stay"
        );
    }

    #[test]
    fn g6_anthropic_tool_results_inside_user_turns_are_redacted() {
        let client = r#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"hunter2 hunter2"}]},{"type":"tool_result","tool_use_id":"u","content":"hunter2"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"hunter2"}}]}]}"#;
        assert_eq!(
            redact(Ingress::Messages, client).0,
            client
                .replace(r#""hunter2 hunter2""#, r#""[redacted] [redacted]""#)
                .replace(r#""content":"hunter2""#, r#""content":"[redacted]""#),
            "an image's data is not text"
        );
    }

    #[test]
    fn g6_responses_input_string_and_function_call_outputs_are_redacted() {
        let client = r#"{"model":"m","input":"hunter2"}"#;
        assert_eq!(
            redact(Ingress::Responses, client).0,
            r#"{"model":"m","input":"[redacted]"}"#
        );
        let client = r#"{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"hunter2"},{"type":"function_call_output","call_id":"c","output":"hunter2"},{"role":"user","content":[{"type":"input_text","text":"hunter2"}]}]}"#;
        assert_eq!(
            redact(Ingress::Responses, client).0,
            client
                .replace(r#""output":"hunter2""#, r#""output":"[redacted]""#)
                .replace(r#""text":"hunter2""#, r#""text":"[redacted]""#)
        );
    }

    #[test]
    fn g6_no_rule_matching_is_no_change_and_a_growing_rule_is_refused() {
        let client = r#"{"model":"m","messages":[{"role":"user","content":"nothing here"}]}"#;
        let body = ClientBody::parse(client.as_bytes()).unwrap();
        assert_eq!(
            redacted(Ingress::ChatCompletions, &body, &rules()).unwrap(),
            None
        );
        assert_eq!(
            redacted(Ingress::ChatCompletions, &body, &[]).unwrap(),
            None
        );
        let body =
            ClientBody::parse(br#"{"messages":[{"role":"user","content":"aaaa"}]}"#).unwrap();
        let grow = [Redaction {
            find: "a".into(),
            replace: "x".repeat(40_000),
        }];
        let err = redacted(Ingress::ChatCompletions, &body, &grow).unwrap_err();
        assert_eq!(err.code(), "redaction");
    }
}
