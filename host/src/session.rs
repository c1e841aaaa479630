//! Sessions as logs (Q1–Q6): what a step appends, and how any step's frozen request is
//! rebuilt from the log alone.
//!
//! Everything here is a pure function of the events; the daemon feeds it the log, the
//! assembly and the step's input, and writes what [`plan_step`] returns in one transaction.
//! The frozen request a step returns is [`rebuild`] of the log *including* the step's events,
//! the same function `GET …/steps/{n}/request` uses, so the two are byte-identical (Q4).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::assembly::Assembly;
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};
use crate::error::{Error, Result};
use crate::store::{Event, NewEvent};

/// Event kinds.
pub mod kind {
    pub const SESSION_CREATED: &str = "session/created";
    pub const USER_MESSAGE: &str = "user/message";
    pub const ASSISTANT_MESSAGE: &str = "assistant/message";
    pub const TOOL_RESULT: &str = "tool/result";
    pub const CONTEXT_SNAPSHOT: &str = "context/snapshot";
    pub const REQUEST_HEADER: &str = "request/header";
    pub const PLUGIN_OMITTED: &str = "plugin/omitted";
    pub const STEP: &str = "step";
}

/// The snapshot appended once when runtime context disappears (Q2).
pub const CLEARED_SNAPSHOT: &str =
    "[Runtime context: there is no runtime context any more; earlier snapshots no longer apply.]";

/// Why a header was recorded (Q3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderReason {
    Initial,
    Resume,
    Change,
}

impl HeaderReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderReason::Initial => "initial",
            HeaderReason::Resume => "resume",
            HeaderReason::Change => "change",
        }
    }
}

/// The header for an assembly: model settings, system prompt, shown tools.
pub fn header(assembly: &Assembly, model: serde_json::Map<String, Value>) -> Header {
    Header {
        model,
        system: assembly.system.clone(),
        tools: assembly
            .tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            })
            .collect(),
    }
}

/// The message an event stands for, if it is one.
fn message_of(event: &Event) -> Option<Message> {
    match event.kind.as_str() {
        kind::USER_MESSAGE | kind::ASSISTANT_MESSAGE | kind::TOOL_RESULT => {
            serde_json::from_value(event.body.clone()).ok()
        }
        kind::CONTEXT_SNAPSHOT => {
            let content = event.body.get("content")?.as_str()?;
            Some(Message::snapshot(content))
        }
        _ => None,
    }
}

/// Where the log's runtime context stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum SnapshotState {
    Never,
    Active(String),
    Cleared,
}

fn snapshot_state(events: &[Event]) -> SnapshotState {
    let last = events
        .iter()
        .rev()
        .find(|e| e.kind == kind::CONTEXT_SNAPSHOT);
    match last {
        None => SnapshotState::Never,
        Some(e) if e.body.get("cleared") == Some(&Value::Bool(true)) => SnapshotState::Cleared,
        Some(e) => SnapshotState::Active(
            e.body
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
    }
}

fn last_header(events: &[Event]) -> Option<Header> {
    events
        .iter()
        .rev()
        .find(|e| e.kind == kind::REQUEST_HEADER)
        .and_then(|e| serde_json::from_value(e.body.get("header")?.clone()).ok())
}

/// How many steps the log holds.
pub fn step_count(events: &[Event]) -> u64 {
    events.iter().filter(|e| e.kind == kind::STEP).count() as u64
}

/// Every tool call id an assistant message in the log made.
pub fn tool_call_ids(events: &[Event]) -> BTreeSet<String> {
    events
        .iter()
        .filter_map(message_of)
        .flat_map(|m| match m {
            Message::Assistant { tool_calls, .. } => tool_calls.into_iter().map(|c| c.id).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// Checks a message a client wants to record: a tool result must answer a call the log (or
/// an earlier message of the same request) holds.
pub fn check_message(events: &[Event], earlier: &[Message], message: &Message) -> Result<()> {
    if let Message::Tool { tool_call_id, .. } = message {
        let in_request = earlier.iter().any(|m| match m {
            Message::Assistant { tool_calls, .. } => {
                tool_calls.iter().any(|c| &c.id == tool_call_id)
            }
            _ => false,
        });
        if !in_request && !tool_call_ids(events).contains(tool_call_id) {
            return Err(Error::UnknownToolCall(tool_call_id.clone()));
        }
    }
    if message.is_snapshot() {
        return Err(Error::BadRequest(
            "`snapshot` is set by promptd; clients cannot send snapshots".into(),
        ));
    }
    Ok(())
}

/// The event that records `message`.
pub fn message_event(message: &Message) -> NewEvent {
    let kind = match message {
        Message::User { .. } => kind::USER_MESSAGE,
        Message::Assistant { .. } => kind::ASSISTANT_MESSAGE,
        Message::Tool { .. } => kind::TOOL_RESULT,
    };
    NewEvent::new(kind, serde_json::to_value(message).unwrap_or(Value::Null))
}

/// What one step appends, in order: the step's messages, the runtime context snapshot when
/// it changed (Q2), the header when it must be recorded (Q3), omissions (A9), and the step
/// marker.
pub struct StepPlan {
    pub step: u64,
    pub events: Vec<NewEvent>,
    pub header_reason: Option<HeaderReason>,
}

/// Plans a step. `resumed` is true when this daemon process has not yet stepped this session
/// (so the header is recorded again with reason `resume`).
pub fn plan_step(
    log: &[Event],
    messages: &[Message],
    facts: &BTreeMap<String, String>,
    assembly: &Assembly,
    header: &Header,
    resumed: bool,
) -> Result<StepPlan> {
    for (i, m) in messages.iter().enumerate() {
        if matches!(m, Message::Assistant { .. }) {
            return Err(Error::BadRequest(format!(
                "messages[{i}]: a step carries user input and tool results; record the model's reply with POST /v1/sessions/{{id}}/messages"
            )));
        }
        check_message(log, &messages[..i], m)?;
    }
    let mut events: Vec<NewEvent> = messages.iter().map(message_event).collect();

    match (&assembly.runtime_context, snapshot_state(log)) {
        (Some(now), SnapshotState::Active(before)) if *now == before => {}
        (Some(now), _) => events.push(NewEvent::new(
            kind::CONTEXT_SNAPSHOT,
            json!({"content": now, "cleared": false}),
        )),
        (None, SnapshotState::Active(_)) => events.push(NewEvent::new(
            kind::CONTEXT_SNAPSHOT,
            json!({"content": CLEARED_SNAPSHOT, "cleared": true}),
        )),
        (None, _) => {}
    }

    let header_reason = match last_header(log) {
        None => Some(HeaderReason::Initial),
        Some(_) if resumed => Some(HeaderReason::Resume),
        Some(old) if old != *header => Some(HeaderReason::Change),
        Some(_) => None,
    };
    if let Some(reason) = header_reason {
        events.push(NewEvent::new(
            kind::REQUEST_HEADER,
            json!({"reason": reason.as_str(), "header": header}),
        ));
    }
    for o in &assembly.omitted {
        events.push(NewEvent::new(
            kind::PLUGIN_OMITTED,
            json!({"plugin": o.plugin, "contribution": o.contribution, "cause": o.cause}),
        ));
    }
    let step = step_count(log) + 1;
    events.push(NewEvent::new(
        kind::STEP,
        json!({"step": step, "facts": facts}),
    ));
    Ok(StepPlan {
        step,
        events,
        header_reason,
    })
}

/// Rebuilds the frozen request of step `n` from the log alone (Q4): the last header recorded
/// at or before the step, and every message up to its marker.
pub fn rebuild(session: &str, events: &[Event], n: u64) -> Result<FrozenRequest> {
    let steps = step_count(events);
    let marker = events
        .iter()
        .filter(|e| e.kind == kind::STEP)
        .nth(n.checked_sub(1).unwrap_or(u64::MAX) as usize)
        .ok_or_else(|| Error::UnknownStep {
            session: session.to_string(),
            step: n,
            steps,
        })?;
    let upto = &events[..events.partition_point(|e| e.seq <= marker.seq)];
    let header = last_header(upto)
        .ok_or_else(|| Error::Store(format!("session {session}: step {n} has no header")))?;
    Ok(FrozenRequest {
        header,
        messages: upto.iter().filter_map(message_of).collect(),
    })
}

/// Appends `events` (not yet stored) to a copy of `log`, numbering them as the store will.
pub fn with_appended(log: &[Event], events: &[NewEvent]) -> Vec<Event> {
    let mut all = log.to_vec();
    let next = log.len() as u64 + 1;
    all.extend(events.iter().enumerate().map(|(i, e)| Event {
        seq: next + i as u64,
        kind: e.kind.clone(),
        body: e.body.clone(),
        at_ms: 0,
    }));
    all
}
