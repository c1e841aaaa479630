//! Sessions as logs (Q1–Q6): what a step appends, and how any step's frozen request is
//! rebuilt from the log alone.
//!
//! Everything here is a pure function of the events; the daemon feeds it the log, the
//! assembly and the step's input, and writes what [`plan_step`] returns in one transaction.
//! The frozen request a step returns is [`rebuild`] of the log *including* the step's events,
//! the same function `GET …/steps/{n}/request` uses, so the two are byte-identical (Q4).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::assembly::Assembly;
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};
use crate::error::{Error, Result};
use crate::store::{Event, EventKind, NewEvent, StoreError, BODY_VERSION};

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

/// An event whose body does not decode: an error naming the session and seq, never a silent
/// omission (a request rebuilt without it would not be what the model saw).
fn corrupt(session: &str, event: &Event, problem: impl std::fmt::Display) -> Error {
    Error::Store(StoreError::Corrupt {
        session: session.to_string(),
        seq: event.seq,
        problem: format!("{} event: {problem}", event.kind),
    })
}

/// The event's body, checked to be in a format version this binary reads.
fn body<'a>(session: &str, event: &'a Event) -> Result<&'a Value> {
    if event.version != BODY_VERSION {
        return Err(corrupt(
            session,
            event,
            format!(
                "body version {} (this binary reads version {BODY_VERSION})",
                event.version
            ),
        ));
    }
    Ok(&event.body)
}

fn text_field<'a>(session: &str, event: &'a Event, field: &str) -> Result<&'a str> {
    body(session, event)?
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| corrupt(session, event, format!("no string `{field}`")))
}

/// The message an event stands for, if it is one.
fn message_of(session: &str, event: &Event) -> Result<Option<Message>> {
    match event.kind {
        EventKind::UserMessage | EventKind::AssistantMessage | EventKind::ToolResult => {
            let message = Message::deserialize(body(session, event)?)
                .map_err(|e| corrupt(session, event, e))?;
            Ok(Some(message))
        }
        EventKind::ContextSnapshot => Ok(Some(Message::snapshot(text_field(
            session, event, "content",
        )?))),
        EventKind::SessionCreated
        | EventKind::RequestHeader
        | EventKind::PluginOmitted
        | EventKind::Step => Ok(None),
    }
}

/// Every message the log holds, in order.
fn messages(session: &str, events: &[Event]) -> Result<Vec<Message>> {
    let mut out = Vec::new();
    for event in events {
        out.extend(message_of(session, event)?);
    }
    Ok(out)
}

/// Where the log's runtime context stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum SnapshotState {
    Never,
    Active(String),
    Cleared,
}

fn snapshot_state(session: &str, events: &[Event]) -> Result<SnapshotState> {
    let last = events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::ContextSnapshot);
    Ok(match last {
        None => SnapshotState::Never,
        Some(e) if body(session, e)?.get("cleared") == Some(&Value::Bool(true)) => {
            SnapshotState::Cleared
        }
        Some(e) => SnapshotState::Active(text_field(session, e, "content")?.to_string()),
    })
}

/// The last recorded header and the run that recorded it (`None` for 0.1.0 logs).
fn last_header(session: &str, events: &[Event]) -> Result<Option<(Header, Option<String>)>> {
    let Some(event) = events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::RequestHeader)
    else {
        return Ok(None);
    };
    let body = body(session, event)?;
    let header = body
        .get("header")
        .ok_or_else(|| corrupt(session, event, "no `header`"))?;
    let header = Header::deserialize(header).map_err(|e| corrupt(session, event, e))?;
    let run = body.get("run").and_then(Value::as_str).map(str::to_string);
    Ok(Some((header, run)))
}

/// How many steps the log holds.
pub fn step_count(events: &[Event]) -> u64 {
    events.iter().filter(|e| e.kind == EventKind::Step).count() as u64
}

/// Every tool call id an assistant message in the log made.
pub fn tool_call_ids(session: &str, events: &[Event]) -> Result<BTreeSet<String>> {
    let mut ids = BTreeSet::new();
    for message in messages(session, events)? {
        if let Message::Assistant { tool_calls, .. } = message {
            ids.extend(tool_calls.into_iter().map(|c| c.id));
        }
    }
    Ok(ids)
}

/// Checks a message a client wants to record: a tool result must answer a call the log (or
/// an earlier message of the same request) holds.
pub fn check_message(
    session: &str,
    events: &[Event],
    earlier: &[Message],
    message: &Message,
) -> Result<()> {
    if let Message::Tool { tool_call_id, .. } = message {
        let in_request = earlier.iter().any(|m| match m {
            Message::Assistant { tool_calls, .. } => {
                tool_calls.iter().any(|c| &c.id == tool_call_id)
            }
            _ => false,
        });
        if !in_request && !tool_call_ids(session, events)?.contains(tool_call_id) {
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
        Message::User { .. } => EventKind::UserMessage,
        Message::Assistant { .. } => EventKind::AssistantMessage,
        Message::Tool { .. } => EventKind::ToolResult,
    };
    NewEvent::new(kind, serde_json::to_value(message).unwrap_or(Value::Null))
}

/// What one step appends, in order: the step's messages, the runtime context snapshot when
/// it changed (Q2), the header when it must be recorded (Q3), omissions (A9), and the step
/// marker.
#[derive(Debug)]
pub struct StepPlan {
    pub step: u64,
    pub events: Vec<NewEvent>,
    pub header_reason: Option<HeaderReason>,
}

/// Plans a step. `run` identifies the daemon process: it is recorded with each header, and a
/// log whose last header another run wrote (or a 0.1.0 log, whose headers name no run) gets
/// the header again with reason `resume` (Q3).
pub fn plan_step(
    session: &str,
    log: &[Event],
    messages: &[Message],
    facts: &BTreeMap<String, String>,
    assembly: &Assembly,
    header: &Header,
    run: &str,
) -> Result<StepPlan> {
    for (i, m) in messages.iter().enumerate() {
        if matches!(m, Message::Assistant { .. }) {
            return Err(Error::BadRequest(format!(
                "messages[{i}]: a step carries user input and tool results; record the model's reply with POST /v1/sessions/{{id}}/messages"
            )));
        }
        check_message(session, log, &messages[..i], m)?;
    }
    let mut events: Vec<NewEvent> = messages.iter().map(message_event).collect();

    match (&assembly.runtime_context, snapshot_state(session, log)?) {
        (Some(now), SnapshotState::Active(before)) if *now == before => {}
        (Some(now), _) => events.push(NewEvent::new(
            EventKind::ContextSnapshot,
            json!({"content": now, "cleared": false}),
        )),
        (None, SnapshotState::Active(_)) => events.push(NewEvent::new(
            EventKind::ContextSnapshot,
            json!({"content": CLEARED_SNAPSHOT, "cleared": true}),
        )),
        (None, _) => {}
    }

    let header_reason = match last_header(session, log)? {
        None => Some(HeaderReason::Initial),
        Some((_, last_run)) if last_run.as_deref() != Some(run) => Some(HeaderReason::Resume),
        Some((old, _)) if old != *header => Some(HeaderReason::Change),
        Some(_) => None,
    };
    if let Some(reason) = header_reason {
        events.push(NewEvent::new(
            EventKind::RequestHeader,
            json!({"reason": reason.as_str(), "header": header, "run": run}),
        ));
    }
    for o in &assembly.omitted {
        events.push(NewEvent::new(
            EventKind::PluginOmitted,
            json!({"plugin": o.plugin, "contribution": o.contribution, "cause": o.cause}),
        ));
    }
    let step = step_count(log) + 1;
    events.push(NewEvent::new(
        EventKind::Step,
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
        .filter(|e| e.kind == EventKind::Step)
        .nth(n.checked_sub(1).unwrap_or(u64::MAX) as usize)
        .ok_or_else(|| Error::UnknownStep {
            session: session.to_string(),
            step: n,
            steps,
        })?;
    let upto = &events[..events.partition_point(|e| e.seq <= marker.seq)];
    let (header, _) = last_header(session, upto)?.ok_or_else(|| {
        Error::Store(StoreError::Corrupt {
            session: session.to_string(),
            seq: marker.seq,
            problem: format!("step {n} has no request header before it"),
        })
    })?;
    Ok(FrozenRequest {
        header,
        messages: messages(session, upto)?,
    })
}

/// Appends `events` (not yet stored) to a copy of `log`, numbering them as the store will.
pub fn with_appended(log: &[Event], events: &[NewEvent]) -> Vec<Event> {
    let mut all = log.to_vec();
    let next = log.len() as u64 + 1;
    all.extend(
        events
            .iter()
            .enumerate()
            .map(|(i, e)| e.recorded(next + i as u64, 0)),
    );
    all
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
