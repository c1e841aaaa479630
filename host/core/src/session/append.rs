//! Planning a step on a session's state: the checks a step's input must pass (Q5, Q6) and
//! the events it appends (Q1–Q3); compactions and recorded messages.

use super::*;

use std::collections::{BTreeMap, BTreeSet};

use super::log::{Compacted, HeaderRecord, Marker, Omitted, Snapshot};

impl SessionState {
    /// The `history/compacted` event for the message events `from..=to` (seqs), once
    /// [`SessionState::check_compaction`] passes. The active snapshot — the latest runtime
    /// context message — survives a compaction as it survives trimming (Q14): when the range
    /// holds it, the event names it in `kept` and it stays in its place after the summary, so
    /// the next request still carries the runtime context its usage counts.
    pub fn compaction(&self, from: u64, to: u64, summary: &str) -> Result<Body> {
        self.check_compaction(from, to, summary)?;
        Ok(Body::HistoryCompacted(Compacted {
            from,
            kept: self.active_snapshot_in(from, to).into_iter().collect(),
            summary: summary.to_string(),
            to,
        }))
    }

    /// The seq of the latest snapshot message when it lies in `from..=to` and is not left out.
    pub(super) fn active_snapshot_in(&self, from: u64, to: u64) -> Option<u64> {
        let last = self.roles.iter().rposition(|(_, r)| *r == Role::Snapshot)?;
        let seq = self.roles[last].0;
        ((from..=to).contains(&seq) && !self.dropped.contains(&last)).then_some(seq)
    }

    /// Checks a compaction of the message events `from..=to` (seqs): a non-blank summary, a
    /// range that holds messages none of which is already left out, that splits no tool
    /// call from its results, and that holds more than the active snapshot (which it keeps).
    pub fn check_compaction(&self, from: u64, to: u64, summary: &str) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidCompaction(why));
        if summary.trim().is_empty() {
            return bad("the summary is blank".into());
        }
        if from > to {
            return bad(format!("`from` ({from}) is after `to` ({to})"));
        }
        let start = self.roles.partition_point(|(s, _)| *s < from);
        let end = self.roles.partition_point(|(s, _)| *s <= to);
        if start == end {
            return bad(format!("no message event in seqs {from}..={to}"));
        }
        if (start..end).any(|i| self.dropped.contains(&i)) {
            return bad("the range holds messages already dropped or compacted".into());
        }
        if end - start == 1 && self.active_snapshot_in(from, to).is_some() {
            return bad(format!(
                "seqs {from}..={to} hold only the active runtime context snapshot, which a \
                 compaction keeps: nothing would be replaced"
            ));
        }
        if self.roles[start].1 == Role::Tool {
            return bad(format!(
                "seq {} is a tool result whose call is before the range",
                self.roles[start].0
            ));
        }
        if self.roles.get(end).is_some_and(|(_, r)| *r == Role::Tool) {
            return bad(format!(
                "seq {} is a tool result whose call is in the range",
                self.roles[end].0
            ));
        }
        if end == self.roles.len() && !self.open_calls.is_empty() {
            return bad("the range ends with tool calls not answered yet".into());
        }
        Ok(())
    }

    /// The tools the last step showed, when its agent keeps every tool in the header.
    pub fn shown_tools(&self) -> Option<&[String]> {
        self.shown_tools.as_deref()
    }

    /// Checks that the server a Chat Completions body is for ([`crate::formats::dialect`])
    /// takes the session so far and `messages`: only OpenAI documents PDFs as `file` parts.
    pub fn check_dialect(
        &self,
        format: crate::formats::Format,
        model: &serde_json::Map<String, serde_json::Value>,
        messages: &[Message],
    ) -> Result<()> {
        use crate::conversation::content::Block;
        use crate::formats::{dialect::Dialect, Format};
        if format != Format::Openai {
            return Ok(());
        }
        let dialect = Dialect::of(model);
        let document = |m: &Message| match m {
            Message::User { content, .. } | Message::Tool { content, .. } => content
                .blocks()
                .iter()
                .any(|b| matches!(b, Block::Document { .. })),
            Message::Assistant { .. } => false,
        };
        let at = messages.iter().position(document);
        if dialect.takes_files() || (at.is_none() && !self.transcript.has_documents()) {
            return Ok(());
        }
        let e = Error::UnsupportedBlock {
            format: format.as_str(),
            what: format!(
                "a document for the `{}` dialect (its chat API takes no `file` parts)",
                dialect.as_str()
            ),
        };
        Err(match at {
            Some(i) => e.at_message(i),
            None => e,
        })
    }

    /// Checks that `format` can carry the session so far and `messages` (a step's input),
    /// before anything is appended (Q6).
    pub fn check_renders(
        &self,
        format: crate::formats::Format,
        messages: &[Message],
    ) -> Result<()> {
        if let Some(what) = self.transcript.unsupported(format) {
            return Err(Error::UnsupportedBlock {
                format: format.as_str(),
                what: what.into(),
            });
        }
        for (i, m) in messages.iter().enumerate() {
            if let Some(what) = crate::formats::unsupported(format, m) {
                let e = Error::UnsupportedBlock {
                    format: format.as_str(),
                    what: what.into(),
                };
                return Err(e.at_message(i));
            }
        }
        Ok(())
    }

    /// Checks a user message or a tool result of a step, or one recorded on its own (Q5): no
    /// snapshots from clients, no empty text, and a result answers an open call, once.
    pub(super) fn check_input(
        &self,
        answered: &mut BTreeSet<String>,
        message: &Message,
    ) -> Result<()> {
        match message {
            Message::User { snapshot: true, .. } => Err(Error::BadRequest(
                "`snapshot` is set by promptd; clients cannot send snapshots".into(),
            )),
            Message::User { content, .. } if content.is_blank() => {
                Err(Error::EmptyMessage("a user message needs non-blank text"))
            }
            Message::User { .. } => Ok(()),
            Message::Tool { tool_call_id, .. } => {
                if !self.tool_calls.contains(tool_call_id) {
                    Err(Error::UnknownToolCall(tool_call_id.clone()))
                } else if !self.open_calls.contains(tool_call_id)
                    || !answered.insert(tool_call_id.clone())
                {
                    Err(Error::ToolCallAnswered(tool_call_id.clone()))
                } else {
                    Ok(())
                }
            }
            Message::Assistant { .. } => Err(Error::BadRequest(
                "a step carries user input and tool results; record the model's reply with POST /v1/sessions/{id}/messages".into(),
            )),
        }
    }

    /// Checks a message recorded on its own (`POST …/messages`): the model's reply follows a
    /// step whose calls are all answered, says something, and uses each call id once; a user
    /// message or a tool result is checked as in a step.
    pub fn check_message(&self, message: &Message) -> Result<()> {
        let Message::Assistant {
            content,
            tool_calls,
            ..
        } = message
        else {
            return self.check_input(&mut BTreeSet::new(), message);
        };
        if self.steps == 0 {
            return Err(Error::ReplyBeforeStep);
        }
        if !self.open_calls.is_empty() {
            return Err(Error::OpenToolCalls(
                self.open_calls.iter().cloned().collect(),
            ));
        }
        if content.trim().is_empty() && tool_calls.is_empty() {
            return Err(Error::EmptyMessage(
                "an assistant reply needs text or tool calls",
            ));
        }
        let mut ids = BTreeSet::new();
        for call in tool_calls {
            if !call.arguments.is_object() {
                return Err(Error::InvalidArguments {
                    call: call.id.clone(),
                    cause: "arguments must be a JSON object".into(),
                });
            }
            if self.tool_calls.contains(&call.id) || !ids.insert(&call.id) {
                return Err(Error::BadRequest(format!(
                    "tool call id `{}` is already used in this session; each call needs its own id",
                    call.id
                )));
            }
        }
        Ok(())
    }

    /// The events a step appends ([`StepEvents`]): stage 7 of `step::plan`; linear in
    /// the step's input. Takes the step's messages (checked, and moved into their events).
    /// `header` is the header this step's request starts with; `None` says it is the one
    /// recorded last (the caller compared them), so nothing is built or compared again. `run`
    /// identifies the daemon process: it is recorded with each header; a header that differs
    /// from the last one is recorded with reason `change` when this run wrote the last one,
    /// `resume` when another run (another daemon, an earlier process, or 0.1.0, whose headers
    /// name no run) did (Q3). An equal header is not recorded again.
    pub fn step_events(
        &self,
        messages: Vec<Message>,
        facts: BTreeMap<String, String>,
        assembly: &Assembly,
        header: Option<Header>,
        run: &str,
        provenance: Option<&crate::provenance::Provenance>,
    ) -> Result<StepEvents> {
        let mut answered = BTreeSet::new();
        let mut user_at = None;
        for (i, m) in messages.iter().enumerate() {
            match (m, user_at) {
                (Message::Tool { .. }, Some(u)) => {
                    return Err(Error::ToolResultsFirst { user: u, tool: i })
                }
                (Message::User { .. }, None) => user_at = Some(i),
                _ => {}
            }
            self.check_input(&mut answered, m)
                .map_err(|e| e.at_message(i))?;
        }
        if self.open_calls.iter().any(|id| !answered.contains(id)) {
            let open = self.open_calls.difference(&answered).cloned().collect();
            return Err(Error::OpenToolCalls(open));
        }
        let mut events: Vec<Body> = Vec::with_capacity(messages.len() + 4);
        events.extend(messages.into_iter().map(|m| Body::message(m, None)));

        let snapshot = |content: &str, cleared| {
            Body::ContextSnapshot(Snapshot {
                cleared,
                content: content.to_string(),
            })
        };
        match (&assembly.runtime_context, &self.snapshot) {
            (Some(now), SnapshotState::Active(before)) if now == before => {}
            (Some(now), _) => events.push(snapshot(now, false)),
            (None, SnapshotState::Active(_)) => events.push(snapshot(CLEARED_SNAPSHOT, true)),
            (None, _) => {}
        }

        // An unchanged header is never recorded again, whichever daemon process runs the step:
        // sessions move between daemons (and restarts) without a header event each time, and
        // the rebuild is the same since the bytes are.
        let header = match (&self.header, header) {
            (Some((old, _)), Some(new))
                if super::same_header(old, super::Proposed::built(&new)) =>
            {
                None
            }
            (_, header) => header,
        };
        let header_reason = match (&self.header, &header) {
            (_, None) => None,
            (None, Some(_)) => Some(HeaderReason::Initial),
            (Some((_, last_run)), Some(_)) if last_run.as_deref() != Some(run) => {
                Some(HeaderReason::Resume)
            }
            (Some(_), Some(_)) => Some(HeaderReason::Change),
        };
        // The previous request is all a prefix of this one unless the header's content or the
        // kept history changed (the messages only grow otherwise).
        let prefix_kept = match &self.header {
            Some(_) if self.steps > 0 => Some(header.is_none() && !self.history_changed),
            _ => None,
        };
        if let (Some(reason), Some(header)) = (header_reason, header) {
            events.push(Body::RequestHeader(Box::new(HeaderRecord {
                header,
                provenance: provenance.cloned(),
                reason,
                run: Some(run.to_string()),
                released: None,
            })));
        }
        events.extend(assembly.omitted.iter().map(|o| {
            Body::PluginOmitted(Omitted {
                cause: o.cause.clone(),
                contribution: o.contribution.clone(),
                plugin: o.plugin.clone(),
            })
        }));
        let step = self.steps + 1;
        // Plugins changed without changing the header: the marker says who serves now.
        let changed = provenance.filter(|p| self.provenance.as_ref() != Some(*p));
        let marker = Marker {
            facts,
            provenance: changed.filter(|_| header_reason.is_none()).cloned(),
            shown_tools: assembly.shown_tools.clone(),
            step,
            usage: None,
            held: Vec::new(),
            reused: assembly.reused.clone(),
        };
        Ok(StepEvents {
            step,
            events,
            marker,
            header_reason,
            prefix_kept,
        })
    }
}
/// Checks a message a client wants to record against the whole log (see
/// [`SessionState::check_message`]).
pub fn check_message(session: &str, events: &[Event], message: &Message) -> Result<()> {
    SessionState::from_log(session, events)?.check_message(message)
}

/// Tool results as the agent's config shows them (see [`tool_result_shown`]); other
/// messages as they are.
pub fn tool_results_shown(
    mut messages: Vec<Message>,
    template: Option<&str>,
    empty: &str,
) -> Vec<Message> {
    for m in &mut messages {
        tool_result_shown(m, template, empty);
    }
    messages
}

/// A tool result as the agent's config shows it, in place: an empty one says `empty`
/// (`empty_tool_result`), and the text is wrapped in `template` (`tool_result_template`).
/// Any other message is left as it is.
pub fn tool_result_shown(message: &mut Message, template: Option<&str>, empty: &str) {
    use crate::conversation::content::{Block, Content};
    let wrap = |text: &str| -> String {
        match template {
            Some(t) => t.replacen("{observation}", text, 1),
            None => text.to_string(),
        }
    };
    let Message::Tool { content, .. } = message else {
        return;
    };
    match content {
        Content::Text(t) if t.is_empty() => *t = wrap(empty),
        Content::Text(t) => {
            if template.is_some() {
                *t = wrap(t);
            }
        }
        Content::Blocks(blocks) if blocks.is_empty() => *content = Content::Text(wrap(empty)),
        Content::Blocks(blocks) => {
            if let Some(t) = template {
                // The observation is the blocks: the template's text goes around them.
                let (before, after) = t.split_once("{observation}").unwrap_or((t, ""));
                if !before.is_empty() {
                    blocks.insert(
                        0,
                        Block::Text {
                            text: before.to_string(),
                        },
                    );
                }
                if !after.is_empty() {
                    blocks.push(Block::Text {
                        text: after.to_string(),
                    });
                }
            }
        }
    }
}

/// The body that records the model's reply with the usage its provider reported (Q14).
pub fn reply_event(
    message: Message,
    usage: Option<crate::formats::replies::ProviderUsage>,
) -> Body {
    Body::message(message, usage)
}

/// The body that records `message`.
pub fn message_event(message: Message) -> Body {
    Body::message(message, None)
}

/// What one step appends, in order: the step's messages, the runtime context snapshot when
/// it changed (Q2), the header when it must be recorded (Q3), omissions (A9) — `events` —
/// then, after any `history/dropped` the budget adds, the step `marker`.
#[derive(Debug)]
pub struct StepEvents {
    /// The step's number.
    pub step: u64,
    /// The events before the marker.
    pub events: Vec<Body>,
    /// The marker that closes the step.
    pub marker: Marker,
    /// Why a header is recorded, when one is.
    pub header_reason: Option<HeaderReason>,
    /// Whether the previous step's whole request is a prefix of this one's (before any
    /// trimming this step adds); `None` on a session's first step.
    pub prefix_kept: Option<bool>,
}

impl StepEvents {
    /// Every body the step appends, the marker last.
    pub fn into_bodies(self) -> Vec<Body> {
        let mut bodies = self.events;
        bodies.push(Body::Step(Box::new(self.marker)));
        bodies
    }
}
