//! The step boundary and the record boundary as types: what a front door (the HTTP API, the
//! CLI, a gateway) asks of [`crate::Daemon::step`] and [`crate::Daemon::record`], and what it
//! and the observers get back.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use promptd_core::budget::Usage;
use promptd_core::cache::outcome::Outcome;
use promptd_core::cache::price::Cost;
use promptd_core::config::gateway::OnPluginFailure;
use promptd_core::config::AgentSettings;
use promptd_core::conversation::{Message, ToolCall};
use promptd_core::formats::pieces::Pieces;
use promptd_core::formats::replies::ProviderUsage;
use promptd_core::formats::Format;
use promptd_core::gateway::body::Spans;
use promptd_core::gateway::messages::Conversation;
use promptd_core::gateway::record::{GatewayRecord, JoinedBy};
use promptd_core::gateway::splice::SpliceSettings;
use promptd_core::gateway::Ingress;
use promptd_core::held::Held;
use promptd_core::step::StepInput;

pub(crate) mod facts;
pub(crate) mod timeline;

use crate::Result;
use facts::{ReplyFacts, StepFacts};
use timeline::Stage;

/// One step to run ([`crate::Daemon::step`]).
#[derive(Debug, Default)]
pub struct StepRequest {
    /// The session (shared: the step's outcome names it too).
    pub session: Arc<str>,
    /// The step's new messages and facts.
    pub input: StepInput,
    /// The format to render the request body in.
    pub format: Format,
    /// With `Some(n)`, the body is the request's parts relative to step `n`
    /// (`SessionState::render_parts_into`) instead of the whole request.
    pub since: Option<u64>,
    /// The body is appended to this (a caller writes its envelope around it).
    pub out: Pieces,
    /// Once set (the client went away), the step stops before its append and records
    /// nothing: `DaemonError::Cancelled`.
    pub cancelled: Option<Arc<AtomicBool>>,
    /// The client's trace context.
    pub trace: Option<TraceContext>,
    /// A gateway client's request (G3, G4): the step's messages are its conversation's new
    /// ones, and the body is the client's with the step's contributions spliced in.
    pub gateway: Option<Box<GatewayStep>>,
}

/// What a gateway step needs of the client's request.
#[derive(Debug)]
pub struct GatewayStep {
    /// The endpoint the client called.
    pub ingress: Ingress,
    /// The upstream it goes to.
    pub upstream: String,
    /// The model the client named.
    pub model: Option<String>,
    /// The gateway key that sent it (G12).
    pub key: Option<String>,
    /// How it joined the session.
    pub joined_by: JoinedBy,
    /// The client's body.
    pub client_body: String,
    /// Where its members sit, as the gateway parsed it.
    pub spans: Spans,
    /// Its conversation, read.
    pub conversation: Conversation,
    /// The agent's splice settings.
    pub splice: SpliceSettings,
    /// What the step does when its plugins fail (`on_plugin_failure`).
    pub on_plugin_failure: OnPluginFailure,
    /// Why the step goes without its plugins, once they failed and the agent forwards: the
    /// client's body goes upstream as it came.
    pub degraded: Option<&'static str>,
    /// G13: the round of promptd's own tool calls (0: the client's request).
    pub round: u32,
    /// G13: promptd's calls and results put back into `client_body` at their place.
    pub restored: Vec<promptd_core::gateway::splice::Edit>,
}

impl StepRequest {
    /// A step of `session` with `input`, rendered in `format`.
    pub fn new(session: impl Into<Arc<str>>, input: StepInput, format: Format) -> StepRequest {
        StepRequest {
            session: session.into(),
            input,
            format,
            ..StepRequest::default()
        }
    }
}

/// When a step or record ran, and its stages (timed only when an observer asked).
#[derive(Clone, Debug)]
pub struct Timings {
    /// When the daemon received it.
    pub start: SystemTime,
    /// When it answered.
    pub end: SystemTime,
    /// How long it took, by the monotonic clock.
    pub elapsed: Duration,
    /// Its stages and plugin calls, in the order they started.
    pub stages: Vec<Stage>,
}

impl Timings {
    pub(crate) fn started() -> Timings {
        let now = SystemTime::now();
        Timings {
            start: now,
            end: now,
            elapsed: Duration::ZERO,
            stages: Vec::new(),
        }
    }
}

/// What a step did ([`crate::Daemon::step`]); observers see it too, filled as far as the step
/// got when it was refused.
#[derive(Debug)]
pub struct StepOutcome {
    /// The session.
    pub session: Arc<str>,
    /// The client's trace context.
    pub trace: Option<TraceContext>,
    /// The format of the body.
    pub format: Format,
    /// The session's agent's plan, once known.
    pub plan: Option<Arc<AgentSettings>>,
    /// The step's number (from 1; 0 when refused before it had one).
    pub step: u64,
    /// Events appended to the session's log (0 until appended).
    pub appended: usize,
    /// The request body in `format` (after what the request's `out` held).
    pub body: Pieces,
    /// The request's size by part.
    pub usage: Usage,
    /// Why a header was recorded (`initial`, `change`, `resume`), when one was.
    pub header_reason: Option<&'static str>,
    /// What the step held back for a cache-cold point (K7).
    pub held: Vec<Held>,
    /// The contributions that kept their answer from an earlier step, without a call (W4);
    /// gathered only for a step an observer traces (`Detail::traced`): the step's marker in
    /// the log has them anyway.
    pub reused: Vec<String>,
    /// Whether the previous step's request is a prefix of this one (`None` on the first).
    pub prefix_kept: Option<bool>,
    /// Header and prefix facts, when an observer asked for them.
    pub facts: Option<StepFacts>,
    /// The messages the step added, when an observer asked for content.
    pub content: Option<Vec<Message>>,
    /// When it ran, and its stages.
    pub timings: Timings,
    /// A gateway step's record (the body is its upstream body).
    pub gateway: Option<Box<GatewayRecord>>,
    /// How long the step's append to the log took (its durable write).
    pub append: std::time::Duration,
}

/// The message a record records, and what came with it ([`crate::Daemon::record`]).
#[derive(Debug)]
pub struct RecordRequest {
    /// The session.
    pub session: String,
    /// The model's reply or a tool's output (user input comes with a step).
    pub message: Message,
    /// The usage the provider reported for a reply (Q14).
    pub usage: Option<ProviderUsage>,
    /// The format the reply's request was sent in, and when (ms since the Unix epoch; default
    /// now): the request's cache outcome is recorded with the reply (issue 29).
    pub sent: Option<(Format, Option<u64>)>,
    /// What the reply says of itself (its model, id and stop reason).
    pub reply: Option<ReplyFacts>,
    /// The client's trace context.
    pub trace: Option<TraceContext>,
    /// Why the reply is partial, when it is (a gateway stream that ended early, G5): it is
    /// recorded with its reason, even when nothing of it came.
    pub partial: Option<String>,
}

impl RecordRequest {
    /// Records `message` in `session`, with nothing else.
    pub fn message(session: impl Into<String>, message: Message) -> RecordRequest {
        RecordRequest {
            session: session.into(),
            message,
            usage: None,
            sent: None,
            reply: None,
            trace: None,
            partial: None,
        }
    }

    /// A reply in any provider's own shape (`promptd_core::formats::replies`), or a neutral
    /// message: its format is `format` when named, else what its shape says; it was sent at
    /// `sent_at`.
    pub fn reply(
        session: impl Into<String>,
        reply: serde_json::Value,
        format: Option<Format>,
        sent_at: Option<u64>,
    ) -> Result<RecordRequest> {
        let format = format.or_else(|| promptd_core::formats::replies::format_of(&reply));
        // What the reply says of itself, read before it is parsed.
        let facts = ReplyFacts::of(&reply);
        let (message, usage) = promptd_core::formats::replies::reply_with_usage(reply)?;
        Ok(RecordRequest {
            session: session.into(),
            message,
            usage,
            sent: format.map(|f| (f, sent_at)),
            reply: Some(facts),
            trace: None,
            partial: None,
        })
    }
}

/// What a record did ([`crate::Daemon::record`]); observers see it too.
#[derive(Debug)]
pub struct RecordOutcome {
    /// The session.
    pub session: Arc<str>,
    /// The client's trace context.
    pub trace: Option<TraceContext>,
    /// The session's agent's plan, once known.
    pub plan: Option<Arc<AgentSettings>>,
    /// The step the message follows (the session's last).
    pub step: u64,
    /// The event's sequence number (0 until recorded).
    pub seq: u64,
    /// `assistant`, `tool` or `user`.
    pub role: &'static str,
    /// The usage the provider reported.
    pub usage: Option<ProviderUsage>,
    /// The reply's cache outcome.
    pub cache: Option<Outcome>,
    /// What the reply's request cost, when its model has a price (gathered when traced).
    pub cost: Option<Cost>,
    /// What the reply says of itself.
    pub reply: Option<ReplyFacts>,
    /// The tool calls the message opened, named as recorded (calls sent without ids are
    /// named by the seq).
    pub tool_calls: Vec<ToolCall>,
    /// The message as recorded, when an observer asked for content.
    pub content: Option<Message>,
    /// When it ran, and its stages.
    pub timings: Timings,
}

/// The W3C trace context a client sent (`traceparent`, `tracestate`), as it sent it: an
/// observer that follows traces reads it (a malformed one is ignored there, as W3C Trace
/// Context asks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// The `traceparent` header.
    pub traceparent: String,
    /// The `tracestate` header, when sent.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context of a request's headers, when it has a `traceparent`.
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        Some(TraceContext {
            traceparent: traceparent?.to_string(),
            tracestate: tracestate.map(str::to_string),
        })
    }
}
