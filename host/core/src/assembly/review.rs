//! Review hooks (world 0.2.0): what a hook is shown, what it may decide, and how a redaction is
//! applied to a step's new messages (SPEC Q18).
//!
//! A hook sees the messages the client sent this step and what assembly made of the step. It
//! may accept, reject (the step fails, nothing is recorded) or redact: replace text in the
//! step's `user` and `tool` messages before they are recorded and rendered. The model's own
//! replies are shown but never changed: they were already sent to the provider.
//!
//! ```
//! use promptd_core::conversation::Message;
//! use promptd_core::assembly::review::{redact, Redaction};
//!
//! let step = vec![Message::user("my password is hunter2")];
//! let rules = [Redaction { find: "hunter2".into(), replace: "[redacted]".into() }];
//! let redacted = redact(&step, &rules).unwrap();
//! assert_eq!(redacted, vec![Message::user("my password is [redacted]")]);
//! ```

use super::model::Assembly;
use crate::conversation::content::{Block, Content};
use crate::conversation::Message;
// What a hook is shown and decides travels with the other calls into a plugin.
pub use crate::plugin::provider::{
    Redaction, ReviewInput, ReviewMessage, Verdict, MAX_REDACTIONS, MAX_REDACTION_BYTES,
};

/// How much longer redactions may make one text, in bytes: a redaction is meant to hide
/// text, and a one-byte `find` with a long `replace` must not multiply a message.
pub const MAX_REDACTION_GROWTH: usize = 64 * 1024;

fn texts(content: &Content) -> Vec<String> {
    match content {
        Content::Text(t) => vec![t.clone()],
        Content::Blocks(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.clone()),
                _ => None,
            })
            .collect(),
    }
}

/// What a hook is shown for `messages` (the step's new ones) and `assembly`.
pub fn input(messages: &[Message], assembly: &Assembly) -> ReviewInput {
    let tools = match &assembly.shown_tools {
        Some(shown) => shown.clone(),
        None => assembly.tools.iter().map(|t| t.name.clone()).collect(),
    };
    ReviewInput {
        messages: shown_messages(messages),
        system: assembly.system.clone(),
        runtime_context: assembly.runtime_context.clone(),
        tools,
    }
}

/// `messages` as a hook is shown them.
pub fn shown_messages(messages: &[Message]) -> Vec<ReviewMessage> {
    messages
        .iter()
        .map(|m| match m {
            Message::User { content, .. } => ReviewMessage {
                role: "user",
                texts: texts(content),
                tool_call_id: String::new(),
            },
            Message::Assistant { content, .. } => ReviewMessage {
                role: "assistant",
                texts: vec![content.clone()],
                tool_call_id: String::new(),
            },
            Message::Tool {
                tool_call_id,
                content,
                ..
            } => ReviewMessage {
                role: "tool",
                texts: texts(content),
                tool_call_id: tool_call_id.clone(),
            },
        })
        .collect()
}

pub(crate) fn redact_text(text: &mut String, rules: &[Redaction]) -> Result<(), String> {
    let limit = text.len() + MAX_REDACTION_GROWTH;
    for (i, r) in rules.iter().enumerate() {
        let hits = text.matches(r.find.as_str()).count();
        if hits == 0 {
            continue;
        }
        // Sized before replacing, so a growing rule is refused before it allocates.
        let grown = (text.len() - hits * r.find.len()).saturating_add(hits * r.replace.len());
        if grown > limit {
            return Err(format!(
                "redaction {} would make a text {grown} bytes, more than \
                 {MAX_REDACTION_GROWTH} bytes longer than it was",
                i + 1
            ));
        }
        *text = text.replace(&r.find, &r.replace);
    }
    Ok(())
}

fn redact_content(content: &mut Content, rules: &[Redaction]) -> Result<(), String> {
    match content {
        Content::Text(t) => redact_text(t, rules),
        Content::Blocks(blocks) => blocks.iter_mut().try_for_each(|b| match b {
            Block::Text { text } => redact_text(text, rules),
            _ => Ok(()),
        }),
    }
}

/// `messages` with `rules` applied, in order, to the texts of `user` and `tool` messages.
/// Refused when a text would grow by more than [`MAX_REDACTION_GROWTH`].
pub fn redact(messages: &[Message], rules: &[Redaction]) -> Result<Vec<Message>, String> {
    let mut out = messages.to_vec();
    for (i, m) in out.iter_mut().enumerate() {
        match m {
            Message::User { content, .. } | Message::Tool { content, .. } => {
                redact_content(content, rules).map_err(|e| format!("message {i}: {e}"))?
            }
            Message::Assistant { .. } => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(find: &str, replace: &str) -> Redaction {
        Redaction {
            find: find.into(),
            replace: replace.into(),
        }
    }

    #[test]
    fn q18_redactions_apply_in_order_to_user_and_tool_texts_only() {
        let messages = vec![
            Message::user("key sk-1 and sk-1"),
            Message::Assistant {
                content: "I saw sk-1".into(),
                tool_calls: vec![],
                blocks: vec![],
                native: None,
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: Content::Blocks(vec![
                    Block::Text {
                        text: "out: sk-1".into(),
                    },
                    Block::Image {
                        media_type: Some("image/png".into()),
                        data: Some("c2stMQ==".into()),
                        url: None,
                    },
                ]),
                is_error: false,
            },
        ];
        let out = redact(&messages, &[rule("sk-1", "[k]"), rule("[k]", "<k>")]).unwrap();
        assert_eq!(out[0], Message::user("key <k> and <k>"));
        assert_eq!(out[1], messages[1], "the model's reply is never changed");
        let Message::Tool { content, .. } = &out[2] else {
            panic!("a tool message")
        };
        assert_eq!(
            texts(content),
            ["out: <k>"],
            "text blocks change, images do not"
        );
    }

    #[test]
    fn q18_a_verdict_out_of_bounds_is_refused() {
        assert!(Verdict::Redact(vec![rule("", "x")]).check().is_err());
        let many = vec![rule("a", "b"); MAX_REDACTIONS + 1];
        assert!(Verdict::Redact(many).check().is_err());
        let long = "x".repeat(MAX_REDACTION_BYTES + 1);
        assert!(Verdict::Redact(vec![rule("a", &long)]).check().is_err());
        assert!(Verdict::Redact(vec![rule("a", "b")]).check().is_ok());
        assert!(Verdict::Reject("no".into()).check().is_ok());
    }

    #[test]
    fn q18_a_redaction_cannot_multiply_a_text() {
        let step = vec![Message::user("a".repeat(1000))];
        let grow = rule("a", &"b".repeat(100));
        let err = redact(&step, &[grow]).unwrap_err();
        assert!(
            err.starts_with("message 0: redaction 1 would make a text 100000 bytes"),
            "{err}"
        );
        // Chained rules are bounded too, each against the text as it was.
        let chain: Vec<Redaction> = (0..20).map(|_| rule("a", "aa")).collect();
        assert!(redact(&step, &chain).is_err());
    }
}
