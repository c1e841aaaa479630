//! The session log's event bodies, typed: one struct per [`EventKind`], gathered in [`Body`].
//! `docs/log-format.md` documents every kind and field; this module is that document in code.
//!
//! A body is encoded once, when its step is appended ([`Body::encode`]), and decoded only
//! when a log is read back ([`Body::decode`]): a step applies the bodies it planned to the
//! session's state as they are, never re-reading what it just wrote. A body that does not
//! decode is `store_corrupt`, naming the session, the seq and the field — never skipped and
//! never defaulted, since a request rebuilt without it would not be what the model saw.
//!
//! ```
//! use promptd_core::session::log::{Body, Snapshot};
//! use promptd_core::store::{EventKind, BODY_VERSION};
//!
//! let body = Body::ContextSnapshot(Snapshot { cleared: false, content: "cwd: /repo".into() });
//! let event = body.encode().unwrap();
//! assert_eq!(event.kind, EventKind::ContextSnapshot);
//! assert_eq!(event.body, r#"{"cleared":false,"content":"cwd: /repo"}"#);
//! let back = Body::decode(event.kind, BODY_VERSION, &event.body).unwrap();
//! assert_eq!(back, body);
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::budget::Usage;
use crate::conversation::{Header, Message};
use crate::formats::replies::ProviderUsage;
use crate::provenance::Provenance;
use crate::store::{EventKind, NewEvent, BODY_VERSION};

/// Why a header was recorded (Q3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderReason {
    /// The session's first header.
    Initial,
    /// The header changed, and another daemon process (or a restart) recorded the last one.
    Resume,
    /// The header changed, and this process recorded the last one.
    Change,
}

impl HeaderReason {
    /// The recorded string form.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderReason::Initial => "initial",
            HeaderReason::Resume => "resume",
            HeaderReason::Change => "change",
        }
    }
}

/// `session/created`: the session's first event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCreated {
    /// The agent the session runs (empty in some test logs; the store's session row is the
    /// authority).
    #[serde(default)]
    pub agent: String,
    /// The secret `data` plugins' blocks are keyed with (T8); absent in logs written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret: Option<String>,
}

/// `user/message`, `assistant/message`, `tool/result`: one message of the conversation, and
/// for a reply the usage its provider reported (Q14). The message's own fields and `usage`
/// share one JSON object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// The message, in the neutral shape (`role` tags it).
    #[serde(flatten)]
    pub message: Message,
    /// What the provider reported for this reply, when the client sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ProviderUsage>,
    /// How the provider's cache served the request this reply answers, when the usage says
    /// (issue 29; absent in earlier logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::outcome::Outcome>,
    /// Why the reply is partial, when it is: a gateway stream that ended early (G5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

/// `context/snapshot`: the runtime context as of this step (Q2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// True when the runtime context disappeared: `content` then says so.
    #[serde(default)]
    pub cleared: bool,
    /// The snapshot message's text.
    pub content: String,
}

/// `request/header`: the model settings, system prompt and tools every later request starts
/// with, until the next header (Q3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeaderRecord {
    /// The header itself.
    pub header: Header,
    /// Which plugin gave each part, when recorded (absent in 0.1.0 logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// Why it was recorded.
    pub reason: HeaderReason,
    /// The daemon process that recorded it (absent in 0.1.0 logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// What the last step held that this header applies, and why now (K7); absent when
    /// nothing was held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<crate::held::Released>,
}

/// `plugin/omitted`: an optional plugin's contribution left out of this step (A9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Omitted {
    /// Why it was left out.
    pub cause: String,
    /// What was left out (`declare`, a context name, …).
    pub contribution: String,
    /// The plugin's id.
    pub plugin: String,
}

/// `history/dropped`: messages left out of every later request to fit the budget (Q14).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    /// The seqs of the message events left out.
    pub seqs: Vec<u64>,
}

/// `history/compacted`: a range of message events shown as a client's summary (Q14).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compacted {
    /// The first seq of the range.
    pub from: u64,
    /// Seqs in the range that stay in place after the summary (the active snapshot); absent
    /// when none (and in logs written before snapshots were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<u64>,
    /// The summary shown in the range's place, as a user message.
    pub summary: String,
    /// The last seq of the range.
    pub to: u64,
}

/// `step`: the marker that closes a step; step `n`'s request is the log up to its marker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// The facts the step was given.
    #[serde(default)]
    pub facts: BTreeMap<String, String>,
    /// Who serves now, when plugins changed without changing the header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// The tools shown, when the agent keeps every tool in the header (`allowed_tools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_tools: Option<Vec<String>>,
    /// The step's number, from 1.
    pub step: u64,
    /// What the step's request cost by the agent's budget (absent in 0.1.0 logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Changed parts the step did not send yet, waiting for a cache-cold point (K7).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<crate::held::Held>,
    /// Contributions that kept their answer from an earlier step because nothing they read
    /// changed, without a call (world 0.3.0): `plugin kind \`name\``.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reused: Vec<std::sync::Arc<str>>,
}

/// One event's body, by kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    /// `session/created`.
    SessionCreated(SessionCreated),
    /// `user/message`.
    UserMessage(Recorded),
    /// `assistant/message`.
    AssistantMessage(Recorded),
    /// `tool/result`.
    ToolResult(Recorded),
    /// `context/snapshot`.
    ContextSnapshot(Snapshot),
    /// `request/header`.
    RequestHeader(Box<HeaderRecord>),
    /// `plugin/omitted`.
    PluginOmitted(Omitted),
    /// `history/dropped`.
    HistoryDropped(Dropped),
    /// `history/compacted`.
    HistoryCompacted(Compacted),
    /// `step`.
    Step(Box<Marker>),
    /// `gateway/request`.
    GatewayRequest(Box<crate::gateway::record::GatewayRecord>),
}

impl Body {
    /// The body recording `message` (its kind follows its role).
    pub fn message(message: Message, usage: Option<ProviderUsage>) -> Body {
        let recorded = Recorded {
            message,
            usage,
            cache: None,
            partial: None,
        };
        match recorded.message {
            Message::User { .. } => Body::UserMessage(recorded),
            Message::Assistant { .. } => Body::AssistantMessage(recorded),
            Message::Tool { .. } => Body::ToolResult(recorded),
        }
    }

    /// The kind of event this body is.
    pub fn kind(&self) -> EventKind {
        match self {
            Body::SessionCreated(_) => EventKind::SessionCreated,
            Body::UserMessage(_) => EventKind::UserMessage,
            Body::AssistantMessage(_) => EventKind::AssistantMessage,
            Body::ToolResult(_) => EventKind::ToolResult,
            Body::ContextSnapshot(_) => EventKind::ContextSnapshot,
            Body::RequestHeader(_) => EventKind::RequestHeader,
            Body::PluginOmitted(_) => EventKind::PluginOmitted,
            Body::HistoryDropped(_) => EventKind::HistoryDropped,
            Body::HistoryCompacted(_) => EventKind::HistoryCompacted,
            Body::Step(_) => EventKind::Step,
            Body::GatewayRequest(_) => EventKind::GatewayRequest,
        }
    }

    /// The message this body records, when it is a message event.
    pub fn as_message(&self) -> Option<&Message> {
        match self {
            Body::UserMessage(r) | Body::AssistantMessage(r) | Body::ToolResult(r) => {
                Some(&r.message)
            }
            _ => None,
        }
    }

    /// The event a store appends: the kind and the body's JSON text, at [`BODY_VERSION`].
    pub fn encode(&self) -> Result<NewEvent, serde_json::Error> {
        // Sized for a marker with its usage, so most bodies are written without regrowing, and
        // for a message's text: a 20 MiB message is written into one buffer of its size, not
        // grown by doubling to 32 MiB through every size below (issue 32).
        let text = match self {
            Body::UserMessage(m) | Body::AssistantMessage(m) | Body::ToolResult(m) => {
                m.message.text_bytes()
            }
            _ => 0,
        };
        let mut out = Vec::with_capacity(512 + text + text / 16);
        match self {
            Body::SessionCreated(b) => serde_json::to_writer(&mut out, b),
            Body::UserMessage(b) | Body::AssistantMessage(b) | Body::ToolResult(b) => {
                serde_json::to_writer(&mut out, b)
            }
            Body::ContextSnapshot(b) => serde_json::to_writer(&mut out, b),
            Body::RequestHeader(b) => serde_json::to_writer(&mut out, b),
            Body::PluginOmitted(b) => serde_json::to_writer(&mut out, b),
            Body::HistoryDropped(b) => serde_json::to_writer(&mut out, b),
            Body::HistoryCompacted(b) => serde_json::to_writer(&mut out, b),
            Body::Step(b) => serde_json::to_writer(&mut out, b),
            Body::GatewayRequest(b) => serde_json::to_writer(&mut out, b),
        }?;
        // serde_json writes UTF-8 only.
        let text = String::from_utf8(out).map_err(serde::ser::Error::custom)?;
        Ok(NewEvent::new(self.kind(), text))
    }

    /// Decodes a stored body of `kind` written at body `version`. The error says what is
    /// wrong (an unknown version, or serde's account of the first bad field).
    pub fn decode(kind: EventKind, version: u32, text: &str) -> Result<Body, String> {
        if version != BODY_VERSION {
            return Err(format!(
                "body version {version} (this binary reads version {BODY_VERSION})"
            ));
        }
        fn de<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, String> {
            serde_json::from_str(text).map_err(|e| e.to_string())
        }
        let body = match kind {
            EventKind::SessionCreated => Body::SessionCreated(de(text)?),
            EventKind::UserMessage => Body::UserMessage(de(text)?),
            EventKind::AssistantMessage => Body::AssistantMessage(de(text)?),
            EventKind::ToolResult => Body::ToolResult(de(text)?),
            EventKind::ContextSnapshot => Body::ContextSnapshot(de(text)?),
            EventKind::RequestHeader => Body::RequestHeader(Box::new(de(text)?)),
            EventKind::PluginOmitted => Body::PluginOmitted(de(text)?),
            EventKind::HistoryDropped => Body::HistoryDropped(de(text)?),
            EventKind::HistoryCompacted => Body::HistoryCompacted(de(text)?),
            EventKind::Step => Body::Step(Box::new(de(text)?)),
            EventKind::GatewayRequest => Body::GatewayRequest(Box::new(de(text)?)),
        };
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/log-format.md documents every kind: each has its heading there, and every kind
    /// the document names is one this binary reads.
    #[test]
    fn the_log_format_document_has_a_section_for_every_event_kind() {
        let doc = include_str!("../../../../docs/log-format.md");
        let documented: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("### "))
            .flat_map(|h| h.split(", "))
            .filter_map(|k| k.strip_prefix('`')?.strip_suffix('`'))
            .collect();
        let mut kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        let mut sorted = documented.clone();
        sorted.sort_unstable();
        kinds.sort_unstable();
        assert_eq!(sorted, kinds, "headings: {documented:?}");
    }

    /// docs/log-format.md names every field of a reply's `usage` and `cache` objects (fields
    /// no fixture log holds yet): a reply with each of them set, encoded, shows only names
    /// the messages section gives, as `name` or `name?`.
    #[test]
    fn the_log_format_document_names_every_field_of_a_replys_usage_and_cache() {
        let doc = include_str!("../../../../docs/log-format.md");
        let section: String = doc
            .lines()
            .skip_while(|l| !l.starts_with("### `user/message`"))
            .skip(1)
            .take_while(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let message: Message =
            serde_json::from_value(serde_json::json!({"role": "assistant", "content": "ok"}))
                .unwrap();
        let usage: ProviderUsage = serde_json::from_value(serde_json::json!({
            "input_tokens": 1, "output_tokens": 2, "cached_tokens": 3,
            "cache_write_tokens": 4, "cache_write_1h_tokens": 5,
        }))
        .unwrap();
        let outcome: crate::cache::outcome::Outcome = serde_json::from_value(serde_json::json!({
            "outcome": "prefix_changed", "format": "anthropic", "model": "m",
            "sent_at_ms": 1, "expected_read": 2, "lost": 3, "gap_ms": 4,
            "part": "system", "plugin": "persona", "cause": "section changed",
        }))
        .unwrap();
        let mut body = Body::message(message, Some(usage));
        if let Body::AssistantMessage(r) = &mut body {
            r.cache = Some(outcome);
        }
        let encoded: serde_json::Value =
            serde_json::from_str(&body.encode().unwrap().body).unwrap();
        let mut names = Vec::new();
        for object in ["usage", "cache"] {
            let fields = encoded[object].as_object().unwrap();
            assert!(fields.len() >= 5, "{object}: {fields:?}");
            for name in fields.keys() {
                names.push(name.clone());
                assert!(
                    section.contains(&format!("`{name}`"))
                        || section.contains(&format!("`{name}?`")),
                    "docs/log-format.md does not name `{object}.{name}`"
                );
            }
        }
        assert_eq!(names.len(), 15, "{names:?}");
    }

    /// Each kind's optional fields are left out when empty, as the document says, and a body
    /// missing a required field is refused naming it.
    #[test]
    fn optional_fields_are_left_out_and_a_missing_field_is_named() {
        let marker = Body::Step(Box::new(Marker {
            facts: BTreeMap::new(),
            provenance: None,
            shown_tools: None,
            step: 3,
            usage: None,
            held: Vec::new(),
            reused: Vec::new(),
        }));
        assert_eq!(marker.encode().unwrap().body, r#"{"facts":{},"step":3}"#);
        let err = Body::decode(
            EventKind::HistoryCompacted,
            BODY_VERSION,
            r#"{"from":1,"to":2}"#,
        )
        .unwrap_err();
        assert!(err.contains("summary"), "{err}");
        let err = Body::decode(EventKind::Step, 2, r#"{"step":1}"#).unwrap_err();
        assert!(err.contains("body version 2"), "{err}");
    }
}
