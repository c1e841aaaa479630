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
use crate::formats::Format;
use crate::store::{Event, EventKind, NewEvent, StoreError, BODY_VERSION};
use crate::transcript::{Head, Transcript};

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
        layout: crate::conversation::LAYOUT,
        cache_key: None,
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
            let body = body(session, event)?;
            // A reply may carry the provider's usage beside the message.
            let message = match body.get("usage") {
                Some(_) => {
                    let mut bare = body.clone();
                    if let Value::Object(o) = &mut bare {
                        o.remove("usage");
                    }
                    Message::deserialize(&bare)
                }
                None => Message::deserialize(body),
            }
            .map_err(|e| corrupt(session, event, e))?;
            Ok(Some(message))
        }
        EventKind::ContextSnapshot => Ok(Some(Message::snapshot(text_field(
            session, event, "content",
        )?))),
        EventKind::SessionCreated
        | EventKind::RequestHeader
        | EventKind::PluginOmitted
        | EventKind::HistoryDropped
        | EventKind::HistoryCompacted
        | EventKind::Step => Ok(None),
    }
}

/// Every message the log holds, in order, less those a `history/dropped` event left out, and
/// with each compacted range shown as its summary.
fn messages(session: &str, events: &[Event]) -> Result<Vec<Message>> {
    let mut dropped = BTreeSet::new();
    let mut summaries = BTreeMap::new();
    for event in events {
        match event.kind {
            EventKind::HistoryDropped => dropped.extend(dropped_seqs(body(session, event)?)),
            EventKind::HistoryCompacted => {
                let c = compaction_of(session, event)?;
                summaries.insert(c.from, c.summary);
                dropped.extend(
                    events
                        .iter()
                        .map(|e| e.seq)
                        .filter(|s| (c.from..=c.to).contains(s) && !c.kept.contains(s)),
                );
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for event in events {
        if let Some(summary) = summaries.get(&event.seq) {
            out.push(Message::user(summary.clone()));
        }
        if !dropped.contains(&event.seq) {
            out.extend(message_of(session, event)?);
        }
    }
    Ok(out)
}

/// A `history/compacted` event: the range of seqs it replaces, its summary, and the seqs in
/// the range it keeps (the active snapshot; absent in logs written before it was kept).
struct Compaction {
    from: u64,
    to: u64,
    summary: String,
    kept: Vec<u64>,
}

fn compaction_of(session: &str, event: &Event) -> Result<Compaction> {
    let b = body(session, event)?;
    let seq = |k: &str| {
        b.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| corrupt(session, event, format!("no `{k}`")))
    };
    let kept = match b.get("kept") {
        None => Vec::new(),
        Some(Value::Array(seqs)) => seqs
            .iter()
            .map(|s| {
                s.as_u64()
                    .ok_or_else(|| corrupt(session, event, "`kept` holds a non-seq"))
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(corrupt(session, event, "`kept` is not an array")),
    };
    Ok(Compaction {
        from: seq("from")?,
        to: seq("to")?,
        summary: text_field(session, event, "summary")?.to_string(),
        kept,
    })
}

/// The message seqs a `history/dropped` event names.
fn dropped_seqs(body: &Value) -> impl Iterator<Item = u64> + '_ {
    body.get("seqs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
}

/// Each message's size by one counter, and the sum of those kept.
#[derive(Clone, Debug, Default)]
struct Measured {
    counter: String,
    sizes: Vec<crate::budget::Size>,
    kept: crate::budget::Size,
    kept_count: usize,
    /// How many messages were dropped when `kept` was summed.
    dropped: usize,
}

/// What a message is, for trimming (units, turns, snapshots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    User,
    Snapshot,
    Assistant,
    Tool,
}

fn role(message: &Message) -> Role {
    match message {
        Message::User { snapshot: true, .. } => Role::Snapshot,
        Message::User { .. } => Role::User,
        Message::Assistant { .. } => Role::Assistant,
        Message::Tool { .. } => Role::Tool,
    }
}

/// Where the log's runtime context stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum SnapshotState {
    Never,
    Active(String),
    Cleared,
}

/// What a message costs a budget: its neutral JSON, with each image and document counted by
/// [`crate::content::measure`] (the provider's image rule, or an estimate) instead of its
/// base64 text.
pub fn message_size(
    message: &Message,
    counter: &dyn crate::budget::Counter,
) -> crate::budget::Size {
    use crate::budget::Size;
    use crate::content::{measure, Block, Content, Measure, MeasureRules};
    let (Message::User {
        content: Content::Blocks(blocks),
        ..
    }
    | Message::Tool {
        content: Content::Blocks(blocks),
        ..
    }) = message
    else {
        return Size::of(
            &crate::formats::neutral_message(message).to_string(),
            counter,
        );
    };
    let rules = MeasureRules::default();
    let mut media = 0usize;
    let mut bare = message.clone();
    if let Message::User {
        content: Content::Blocks(b),
        ..
    }
    | Message::Tool {
        content: Content::Blocks(b),
        ..
    } = &mut bare
    {
        for (block, original) in b.iter_mut().zip(blocks) {
            if let Measure::Tokens { tokens, .. } = measure(original, &rules) {
                media += tokens as usize;
            }
            match block {
                Block::Image { data, url, .. } | Block::Document { data, url, .. } => {
                    *data = None;
                    *url = None;
                }
                Block::Text { .. } => {}
            }
        }
    }
    let mut size = Size::of(&crate::formats::neutral_message(&bare).to_string(), counter);
    size.tokens += media;
    size
}

/// The `shown_tools` a step marker recorded (`tool_subset = "allowed_tools"`).
fn shown_of(marker: &Value) -> Option<Vec<String>> {
    let names = marker.get("shown_tools")?.as_array()?;
    Some(
        names
            .iter()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect(),
    )
}

/// The length of `value` as JSON, without building the text.
fn json_bytes(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The header a `request/header` event records, and the run that recorded it (`None` in 0.1.0
/// logs).
fn header_of(session: &str, event: &Event) -> Result<(Header, Option<String>)> {
    let body = body(session, event)?;
    let header = body
        .get("header")
        .ok_or_else(|| corrupt(session, event, "no `header`"))?;
    let header = Header::deserialize(header).map_err(|e| corrupt(session, event, e))?;
    let run = body.get("run").and_then(Value::as_str).map(str::to_string);
    Ok((header, run))
}

/// What a step needs to know of a session's log — step count, last header, last snapshot,
/// the tool calls made, the messages rendered in every format — built once from the log and
/// extended by each append, so a step's work does not grow with the history (Q1–Q5).
#[derive(Clone, Debug)]
pub struct SessionState {
    session: String,
    last_seq: u64,
    steps: u64,
    header: Option<(Header, Option<String>)>,
    /// What the header and the snapshot take, kept as they change (a header may be megabytes
    /// of tools, so the session cache must count it).
    header_bytes: usize,
    snapshot_bytes: usize,
    snapshot: SnapshotState,
    tool_calls: BTreeSet<String>,
    /// Calls made and not yet answered: the next step must answer them (Q5).
    open_calls: BTreeSet<String>,
    /// The tools the last step showed, when its agent keeps every tool in the header.
    shown_tools: Option<Vec<String>>,
    /// The messages measured so far for a budget, extended as messages are appended, so
    /// measuring a step costs what it adds.
    measured: Option<Measured>,
    /// Each message's event seq and role, in log order.
    roles: Vec<(u64, Role)>,
    /// Messages (by index) left out of every later request (`history/dropped`, and the ranges
    /// of `history/compacted`).
    dropped: BTreeSet<usize>,
    /// Compacted ranges: the index of their first message, and the summary shown instead.
    summaries: BTreeMap<usize, String>,
    /// Bytes the tool call ids take, kept as they are added so `bytes` costs nothing per step.
    tool_call_bytes: usize,
    transcript: Transcript,
    memo: HeadMemo,
    /// The provenance recorded last (with a header, or in a marker when only it changed).
    provenance: Option<crate::provenance::Provenance>,
    /// History was dropped or compacted since the last step marker: the next request does not
    /// start with the last one.
    history_changed: bool,
    /// The secret `data` plugins' blocks are keyed with (T8), from the session's first event.
    data_secret: Option<String>,
}

/// What depends only on the current header, made when a step first needs it and dropped
/// when the header changes: each format's serialized head, and the fixed parts' measure per
/// tokenizer. Keyed by the tools shown too; a few entries at most.
#[derive(Clone, Debug, Default)]
struct HeadMemo {
    heads: Vec<(Format, Option<Vec<String>>, Head)>,
    fixed: Vec<(Format, String, Option<Vec<String>>, crate::budget::Fixed)>,
}

/// Most entries of each kind in a [`HeadMemo`]: the formats a client asks for times the tool
/// subsets it alternates between.
const HEAD_MEMO_ENTRIES: usize = 8;

impl HeadMemo {
    fn bytes(&self) -> usize {
        self.heads.iter().map(|(_, _, h)| h.bytes()).sum::<usize>() + self.fixed.len() * 64
    }
}

fn remember<T>(list: &mut Vec<T>, item: T) {
    if list.len() >= HEAD_MEMO_ENTRIES {
        list.remove(0);
    }
    list.push(item);
}

impl SessionState {
    /// The state of an empty log.
    pub fn new(session: &str) -> Self {
        Self {
            session: session.to_string(),
            last_seq: 0,
            steps: 0,
            header: None,
            header_bytes: 0,
            snapshot_bytes: 0,
            snapshot: SnapshotState::Never,
            tool_calls: BTreeSet::new(),
            open_calls: BTreeSet::new(),
            shown_tools: None,
            measured: None,
            roles: Vec::new(),
            dropped: BTreeSet::new(),
            summaries: BTreeMap::new(),
            tool_call_bytes: 0,
            transcript: Transcript::new(),
            memo: HeadMemo::default(),
            provenance: None,
            history_changed: false,
            data_secret: None,
        }
    }

    /// The state after `events`, the whole log from seq 1.
    pub fn from_log(session: &str, events: &[Event]) -> Result<Self> {
        let mut state = Self::new(session);
        state.apply(events)?;
        Ok(state)
    }

    /// Extends the state by events appended after it, in order and without gaps.
    pub fn apply(&mut self, events: &[Event]) -> Result<()> {
        let session = self.session.clone();
        for event in events {
            if event.seq != self.last_seq + 1 {
                return Err(corrupt(
                    &session,
                    event,
                    format!("expected seq {} (the log has a gap)", self.last_seq + 1),
                ));
            }
            match event.kind {
                EventKind::Step => {
                    self.steps += 1;
                    let marker = body(&session, event)?;
                    self.shown_tools = shown_of(marker);
                    if let Some(p) = provenance_of(marker) {
                        self.provenance = Some(p);
                    }
                    self.history_changed = false;
                }
                EventKind::RequestHeader => {
                    let recorded = body(&session, event)?;
                    self.header_bytes = json_bytes(recorded);
                    self.provenance = provenance_of(recorded);
                    self.header = Some(header_of(&session, event)?);
                    self.memo = HeadMemo::default();
                }
                EventKind::ContextSnapshot => {
                    self.snapshot = if body(&session, event)?.get("cleared")
                        == Some(&Value::Bool(true))
                    {
                        SnapshotState::Cleared
                    } else {
                        SnapshotState::Active(text_field(&session, event, "content")?.to_string())
                    };
                    self.snapshot_bytes = match &self.snapshot {
                        SnapshotState::Active(text) => text.len(),
                        _ => 0,
                    };
                }
                EventKind::HistoryDropped => {
                    self.history_changed = true;
                    for seq in dropped_seqs(body(&session, event)?) {
                        if let Ok(i) = self.roles.binary_search_by_key(&seq, |(s, _)| *s) {
                            self.dropped.insert(i);
                        }
                    }
                }
                EventKind::HistoryCompacted => {
                    let c = compaction_of(&session, event)?;
                    let start = self.roles.partition_point(|(s, _)| *s < c.from);
                    let end = self.roles.partition_point(|(s, _)| *s <= c.to);
                    if start < end {
                        self.history_changed = true;
                        let roles = &self.roles;
                        self.dropped
                            .extend((start..end).filter(|&i| !c.kept.contains(&roles[i].0)));
                        self.summaries.insert(start, c.summary);
                    }
                }
                EventKind::SessionCreated => {
                    let secret = body(&session, event)?.get("data_secret");
                    self.data_secret = secret.and_then(Value::as_str).map(str::to_string);
                }
                EventKind::UserMessage
                | EventKind::AssistantMessage
                | EventKind::ToolResult
                | EventKind::PluginOmitted => {}
            }
            if let Some(message) = message_of(&session, event)? {
                match &message {
                    Message::Assistant { tool_calls, .. } => {
                        for call in tool_calls {
                            if self.tool_calls.insert(call.id.clone()) {
                                self.tool_call_bytes += 2 * (call.id.len() + 32);
                            }
                            self.open_calls.insert(call.id.clone());
                        }
                    }
                    Message::Tool { tool_call_id, .. } => {
                        self.open_calls.remove(tool_call_id);
                    }
                    Message::User { .. } => {}
                }
                self.roles.push((event.seq, role(&message)));
                self.transcript.push(&message);
            }
            self.last_seq = event.seq;
        }
        Ok(())
    }

    /// The secret this session's data blocks are keyed with (T8). Sessions created before
    /// the secret was recorded use their id: stable, but weaker, since a plugin sees the id.
    pub fn data_secret(&self) -> &str {
        self.data_secret.as_deref().unwrap_or(&self.session)
    }

    /// The seq of the last event the state has seen: the next append goes at `last_seq + 1`.
    /// The last recorded header.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref().map(|(h, _)| h)
    }

    /// The provenance recorded last.
    pub fn provenance(&self) -> Option<&crate::provenance::Provenance> {
        self.provenance.as_ref()
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Roughly how much memory the state holds, in bytes.
    pub fn bytes(&self) -> usize {
        self.transcript.bytes()
            + self.tool_call_bytes
            + self.header_bytes
            + self.snapshot_bytes
            + self.memo.bytes()
    }

    /// The request of the last step in `format`: the last header and every message, the same
    /// bytes as [`rebuild`] of that step rendered by [`crate::formats::render`].
    pub fn render(&mut self, format: crate::formats::Format) -> Result<String> {
        let mut out = String::new();
        self.render_into(format, &mut out)?;
        Ok(out)
    }

    /// [`SessionState::render`], appended to `out`.
    pub fn render_into(&mut self, format: crate::formats::Format, out: &mut String) -> Result<()> {
        let (header, _) = self.header.as_ref().ok_or_else(|| {
            Error::Store(StoreError::Corrupt {
                session: self.session.clone(),
                seq: self.last_seq,
                problem: "no request header recorded yet".into(),
            })
        })?;
        if let Some(what) = self.transcript.unsupported(format) {
            return Err(Error::UnsupportedBlock {
                format: format.as_str(),
                what: what.into(),
            });
        }
        if self.dropped.is_empty() {
            let shown = self.shown_tools.as_deref();
            let known = self
                .memo
                .heads
                .iter()
                .position(|(f, s, _)| *f == format && s.as_deref() == shown);
            let at = match known {
                Some(at) => at,
                None => {
                    let head = Head::new(header, shown, format);
                    remember(
                        &mut self.memo.heads,
                        (format, self.shown_tools.clone(), head),
                    );
                    self.memo.heads.len() - 1
                }
            };
            self.transcript
                .render_with(&self.memo.heads[at].2, header, format, out);
            return Ok(());
        }
        // Trimmed: render what is kept (bounded by the budget, not by the history).
        let mut messages = Vec::new();
        for (i, fragment) in self.transcript.neutral().iter().enumerate() {
            if let Some(summary) = self.summaries.get(&i) {
                messages.push(Message::user(summary.clone()));
            }
            if self.dropped.contains(&i) {
                continue;
            }
            let message = serde_json::from_str(fragment).map_err(|e| {
                Error::Store(StoreError::Corrupt {
                    session: self.session.clone(),
                    seq: self.roles.get(i).map_or(0, |(s, _)| *s),
                    problem: format!("a kept message does not decode: {e}"),
                })
            })?;
            messages.push(message);
        }
        let request = FrozenRequest {
            header: header.clone(),
            messages,
            shown_tools: self.shown_tools.clone(),
        };
        out.push_str(&crate::formats::render(&request, format).to_string());
        Ok(())
    }

    /// The size of every kept message so far plus `new` (a step's input and snapshot), by
    /// `counter`; and how many there are. Messages are measured as their neutral JSON, each
    /// once, and the kept ones are summed as they come (re-summed only after a trim).
    pub fn measure_messages(
        &mut self,
        counter: &dyn crate::budget::Counter,
        new: &[Message],
    ) -> (crate::budget::Size, usize) {
        use crate::budget::Size;
        self.measure(counter);
        let (mut total, mut count) = match &self.measured {
            Some(m) => (m.kept, m.kept_count),
            None => (Size::default(), 0),
        };
        for summary in self.summaries.values() {
            let m = Message::user(summary.clone());
            total += Size::of(&crate::formats::neutral_message(&m).to_string(), counter);
            count += 1;
        }
        for m in new {
            total += message_size(m, counter);
        }
        (total, count + new.len())
    }

    /// Measures the messages not measured yet by `counter` (all of them for a new counter).
    fn measure(&mut self, counter: &dyn crate::budget::Counter) {
        use crate::budget::Size;
        let fragments = self.transcript.neutral();
        let mut m = match self.measured.take() {
            Some(m) if m.counter == counter.name() && m.sizes.len() <= fragments.len() => m,
            _ => Measured {
                counter: counter.name().to_string(),
                ..Measured::default()
            },
        };
        if m.dropped != self.dropped.len() {
            // A trim or compaction since: sum the kept ones again (rare).
            m.kept = Size::default();
            m.kept_count = 0;
            for (i, size) in m.sizes.iter().enumerate() {
                if !self.dropped.contains(&i) {
                    m.kept += *size;
                    m.kept_count += 1;
                }
            }
            m.dropped = self.dropped.len();
        }
        for (i, fragment) in fragments.iter().enumerate().skip(m.sizes.len()) {
            // Only messages with media need decoding: their data is not text.
            let size = if fragment.contains("\"media_type\"") || fragment.contains("\"url\"") {
                serde_json::from_str::<Message>(fragment)
                    .map(|msg| message_size(&msg, counter))
                    .unwrap_or_else(|_| Size::of(fragment, counter))
            } else {
                Size::of(fragment, counter)
            };
            m.sizes.push(size);
            if !self.dropped.contains(&i) {
                m.kept += size;
                m.kept_count += 1;
            }
        }
        self.measured = Some(m);
    }

    /// Measures the request a step will send — this state, the step's `new` messages and
    /// snapshot, in `format` — and, when its messages do not fit what `budget` leaves them,
    /// trims the history by [`SessionState::trim`]: returns the usage (less what was dropped)
    /// and the `history/dropped` event to append. Whether it then fits is
    /// [`crate::budget::Usage::check`]'s to say.
    #[allow(clippy::too_many_arguments)]
    pub fn fit(
        &mut self,
        budget: &crate::budget::Budget,
        counter: &dyn crate::budget::Counter,
        header: &Header,
        assembly: &Assembly,
        format: crate::formats::Format,
        new: &[Message],
    ) -> (crate::budget::Usage, Option<NewEvent>) {
        let (measured, count) = self.measure_messages(counter, new);
        let fixed = self.fixed(counter, header, format, assembly.shown_tools.as_deref());
        let mut usage =
            crate::budget::usage_with(budget, counter, fixed, assembly, measured, count);
        let fixed = usage.tools.tokens + usage.system.tokens + budget.reserve as usize;
        let room = match (budget.window.map(|w| w as usize), budget.history_max) {
            (Some(w), cap) if fixed <= w => {
                Some(cap.map_or(w - fixed, |c| (w - fixed).min(c as usize)))
            }
            (None, Some(cap)) => Some(cap as usize),
            _ => None,
        };
        let Some(room) = room.filter(|room| usage.messages.tokens > *room) else {
            return (usage, None);
        };
        match self.trim(counter, new, room, budget.keep_turns) {
            Ok((seqs, size)) if !seqs.is_empty() => {
                usage.leave_out(seqs.len(), size);
                let event = NewEvent::new(EventKind::HistoryDropped, json!({"seqs": seqs}));
                (usage, Some(event))
            }
            _ => (usage, None),
        }
    }

    /// The fixed parts' measure for `header`, remembered while it is the session's header.
    fn fixed(
        &mut self,
        counter: &dyn crate::budget::Counter,
        header: &Header,
        format: Format,
        shown: Option<&[String]>,
    ) -> crate::budget::Fixed {
        let measure = || crate::budget::Fixed::measure(counter, header, format, shown);
        if !self.header.as_ref().is_some_and(|(h, _)| h == header) {
            return measure(); // a new header: measured once, before it is recorded
        }
        let known = self
            .memo
            .fixed
            .iter()
            .find(|(f, t, s, _)| *f == format && t == counter.name() && s.as_deref() == shown);
        if let Some((_, _, _, fixed)) = known {
            return *fixed;
        }
        let fixed = measure();
        let key = (
            format,
            counter.name().to_string(),
            shown.map(<[String]>::to_vec),
        );
        remember(&mut self.memo.fixed, (key.0, key.1, key.2, fixed));
        fixed
    }

    /// Which earlier messages to leave out so the messages fit in `room` tokens (Q14): never
    /// the session's first user message (the goal), nor the latest `keep_turns` turns (a turn
    /// starts at a user message), nor the active snapshot; an assistant message and the tool
    /// results after it go together; older snapshots go first, then the oldest units. `new`
    /// is this step's input (always kept). Returns the seqs to drop (empty: it already fits),
    /// or the tokens still over when even that is not enough.
    pub fn trim(
        &mut self,
        counter: &dyn crate::budget::Counter,
        new: &[Message],
        room: usize,
        keep_turns: usize,
    ) -> std::result::Result<(Vec<u64>, crate::budget::Size), usize> {
        let (total, _) = self.measure_messages(counter, new);
        let mut over = total.tokens.saturating_sub(room);
        if over == 0 {
            return Ok((Vec::new(), crate::budget::Size::default()));
        }
        self.measure(counter);
        let sizes = match &self.measured {
            Some(m) => &m.sizes,
            None => return Err(over),
        };
        let n = self.roles.len();
        let mut protected = vec![false; n];
        if let Some(goal) = self.roles.iter().position(|(_, r)| *r == Role::User) {
            protected[goal] = true;
        }
        // The latest `keep_turns` turns, counting this step's user messages first.
        let new_turns = new.iter().filter(|m| role(m) == Role::User).count();
        let mut turns = keep_turns.saturating_sub(new_turns);
        for i in (0..n).rev() {
            if turns == 0 {
                break;
            }
            protected[i] = true;
            if self.roles[i].1 == Role::User {
                turns -= 1;
            }
        }
        let new_snapshot = new.iter().any(|m| m.is_snapshot());
        if !new_snapshot {
            if let Some(last) = self.roles.iter().rposition(|(_, r)| *r == Role::Snapshot) {
                protected[last] = true;
            }
        }
        // Units: a message and the tool results right after it.
        let mut units: Vec<(usize, usize)> = Vec::new();
        for (i, (_, r)) in self.roles.iter().enumerate() {
            match (r, units.last_mut()) {
                (Role::Tool, Some((_, end))) if *end == i => *end = i + 1,
                _ => units.push((i, i + 1)),
            }
        }
        let droppable = |&(start, end): &(usize, usize)| {
            (start..end).all(|i| !protected[i] && !self.dropped.contains(&i))
        };
        let snapshots = units
            .iter()
            .filter(|(s, _)| self.roles[*s].1 == Role::Snapshot)
            .filter(|u| droppable(u));
        let others = units
            .iter()
            .filter(|(s, _)| self.roles[*s].1 != Role::Snapshot)
            .filter(|u| droppable(u));
        let mut drop = Vec::new();
        let mut dropped = crate::budget::Size::default();
        for &(start, end) in snapshots.chain(others) {
            if over == 0 {
                break;
            }
            for size in &sizes[start..end] {
                dropped += *size;
                over = over.saturating_sub(size.tokens);
            }
            drop.extend(start..end);
        }
        if over > 0 {
            return Err(over);
        }
        drop.sort_unstable();
        Ok((drop.into_iter().map(|i| self.roles[i].0).collect(), dropped))
    }

    /// The `history/compacted` event for the message events `from..=to` (seqs), once
    /// [`SessionState::check_compaction`] passes. The active snapshot — the latest runtime
    /// context message — survives a compaction as it survives trimming (Q14): when the range
    /// holds it, the event names it in `kept` and it stays in its place after the summary, so
    /// the next request still carries the runtime context its usage counts.
    pub fn compaction(&self, from: u64, to: u64, summary: &str) -> Result<NewEvent> {
        self.check_compaction(from, to, summary)?;
        let mut body = json!({"from": from, "to": to, "summary": summary});
        if let Some(seq) = self.active_snapshot_in(from, to) {
            body["kept"] = json!([seq]);
        }
        Ok(NewEvent::new(EventKind::HistoryCompacted, body))
    }

    /// The seq of the latest snapshot message when it lies in `from..=to` and is not left out.
    fn active_snapshot_in(&self, from: u64, to: u64) -> Option<u64> {
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

    pub fn shown_tools(&self) -> Option<&[String]> {
        self.shown_tools.as_deref()
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
    fn check_input(&self, answered: &mut BTreeSet<String>, message: &Message) -> Result<()> {
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

    /// Plans a step (see [`plan_step`]); linear in the step's input.
    pub fn plan(
        &self,
        messages: &[Message],
        facts: &BTreeMap<String, String>,
        assembly: &Assembly,
        header: &Header,
        run: &str,
        provenance: Option<&crate::provenance::Provenance>,
    ) -> Result<StepPlan> {
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
        let open: Vec<String> = self
            .open_calls
            .iter()
            .filter(|id| !answered.contains(*id))
            .cloned()
            .collect();
        if !open.is_empty() {
            return Err(Error::OpenToolCalls(open));
        }
        let mut events: Vec<NewEvent> = messages.iter().map(message_event).collect();

        match (&assembly.runtime_context, &self.snapshot) {
            (Some(now), SnapshotState::Active(before)) if now == before => {}
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

        // An unchanged header is never recorded again, whichever daemon process runs the step:
        // sessions move between daemons (and restarts) without a header event each time, and
        // the rebuild is the same since the bytes are.
        let header_reason = match &self.header {
            None => Some(HeaderReason::Initial),
            Some((old, _)) if old == header => None,
            Some((_, last_run)) if last_run.as_deref() != Some(run) => Some(HeaderReason::Resume),
            Some(_) => Some(HeaderReason::Change),
        };
        if let Some(reason) = header_reason {
            let mut body = json!({"reason": reason.as_str(), "header": header, "run": run});
            if let (Some(p), Value::Object(m)) = (provenance, &mut body) {
                m.insert("provenance".into(), json!(p));
            }
            events.push(NewEvent::new(EventKind::RequestHeader, body));
        }
        // The previous request is all a prefix of this one unless the header's content or the
        // kept history changed (the messages only grow otherwise).
        let prefix_kept = match &self.header {
            Some((old, _)) if self.steps > 0 => Some(old == header && !self.history_changed),
            _ => None,
        };
        for o in &assembly.omitted {
            events.push(NewEvent::new(
                EventKind::PluginOmitted,
                json!({"plugin": o.plugin, "contribution": o.contribution, "cause": o.cause}),
            ));
        }
        let step = self.steps + 1;
        let mut marker = json!({"step": step, "facts": facts});
        if let (Some(shown), Value::Object(m)) = (&assembly.shown_tools, &mut marker) {
            m.insert("shown_tools".into(), json!(shown));
        }
        // Plugins changed without changing the header: the marker says who serves now.
        let changed = provenance.filter(|p| self.provenance.as_ref() != Some(*p));
        if let (None, Some(p), Value::Object(m)) = (header_reason, changed, &mut marker) {
            m.insert("provenance".into(), json!(p));
        }
        events.push(NewEvent::new(EventKind::Step, marker));
        Ok(StepPlan {
            step,
            events,
            header_reason,
            prefix_kept,
        })
    }
}

/// The provenance a header event or a step marker recorded, if any (0.1.0 logs have none; one
/// that no longer decodes is left out rather than failing a rebuild: it explains, it is not
/// part of the request).
fn provenance_of(body: &Value) -> Option<crate::provenance::Provenance> {
    serde_json::from_value(body.get("provenance")?.clone()).ok()
}

/// Step `n`'s provenance: what the last header or marker at or before its marker recorded.
pub fn provenance_at(
    session: &str,
    events: &[Event],
    n: u64,
) -> Result<Option<crate::provenance::Provenance>> {
    let marker = nth_marker(session, events, n)?;
    Ok(events[..events.partition_point(|e| e.seq <= marker.seq)]
        .iter()
        .rev()
        .filter(|e| matches!(e.kind, EventKind::Step | EventKind::RequestHeader))
        .find_map(|e| provenance_of(&e.body)))
}

fn nth_marker<'a>(session: &str, events: &'a [Event], n: u64) -> Result<&'a Event> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::Step)
        .nth(n.checked_sub(1).unwrap_or(u64::MAX) as usize)
        .ok_or_else(|| Error::UnknownStep {
            session: session.to_string(),
            step: n,
            steps: step_count(events),
        })
}

/// The last recorded header and the run that recorded it.
fn last_header(session: &str, events: &[Event]) -> Result<Option<(Header, Option<String>)>> {
    events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::RequestHeader)
        .map(|e| header_of(session, e))
        .transpose()
}

/// How many steps the log holds.
pub fn step_count(events: &[Event]) -> u64 {
    events.iter().filter(|e| e.kind == EventKind::Step).count() as u64
}

/// Checks a message a client wants to record against the whole log (see
/// [`SessionState::check_message`]).
pub fn check_message(session: &str, events: &[Event], message: &Message) -> Result<()> {
    SessionState::from_log(session, events)?.check_message(message)
}

/// Tool results as the agent's config shows them: an empty one says `empty`
/// (`empty_tool_result`), and the text is wrapped in `template` (`tool_result_template`).
pub fn tool_results_shown(
    messages: &[Message],
    template: Option<&str>,
    empty: &str,
) -> Vec<Message> {
    use crate::content::{Block, Content};
    let wrap = |text: &str| -> String {
        match template {
            Some(t) => t.replacen("{observation}", text, 1),
            None => text.to_string(),
        }
    };
    messages
        .iter()
        .map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
                is_error,
            } => {
                let content = match content {
                    Content::Text(t) if t.is_empty() => Content::Text(wrap(empty)),
                    Content::Text(t) => Content::Text(wrap(t)),
                    Content::Blocks(blocks) if blocks.is_empty() => Content::Text(wrap(empty)),
                    Content::Blocks(blocks) => match template {
                        None => Content::Blocks(blocks.clone()),
                        Some(t) => {
                            // The observation is the blocks: the template's text goes around them.
                            let (before, after) = t.split_once("{observation}").unwrap_or((t, ""));
                            let mut out = Vec::with_capacity(blocks.len() + 2);
                            if !before.is_empty() {
                                out.push(Block::Text {
                                    text: before.to_string(),
                                });
                            }
                            out.extend(blocks.iter().cloned());
                            if !after.is_empty() {
                                out.push(Block::Text {
                                    text: after.to_string(),
                                });
                            }
                            Content::Blocks(out)
                        }
                    },
                };
                Message::Tool {
                    tool_call_id: tool_call_id.clone(),
                    content,
                    is_error: *is_error,
                }
            }
            other => other.clone(),
        })
        .collect()
}

/// The event that records the model's reply with the usage its provider reported (Q14).
pub fn reply_event(message: &Message, usage: Option<&crate::replies::ProviderUsage>) -> NewEvent {
    let mut event = message_event(message);
    if let (Some(usage), Value::Object(body)) = (usage, &mut event.body) {
        body.insert("usage".into(), json!(usage));
    }
    event
}

/// Per step: what promptd estimated against what the provider reported for the reply that
/// followed (its input tokens, cached and cache-written ones), and the totals: how far the
/// estimate is off (`actual / estimate`) and what share of the input the cache served.
pub fn usage_report(session: &str, events: &[Event]) -> Result<Value> {
    let mut steps: Vec<Value> = Vec::new();
    let (mut estimate, mut actual, mut cached, mut compared) = (0u64, 0u64, 0u64, 0usize);
    let mut pending: Option<usize> = None;
    for event in events {
        match event.kind {
            EventKind::Step => {
                let b = body(session, event)?;
                let u = &b["usage"];
                steps.push(json!({
                    "step": b["step"],
                    "estimate": u["total"]["tokens"],
                    "tokenizer": u["tokenizer"],
                }));
                pending = Some(steps.len() - 1);
            }
            EventKind::AssistantMessage => {
                let b = body(session, event)?;
                let (Some(i), Some(reported)) = (pending.take(), b.get("usage")) else {
                    continue;
                };
                let step = &mut steps[i];
                step["actual"] = reported.clone();
                let est = step["estimate"].as_u64();
                let input = reported.get("input_tokens").and_then(Value::as_u64);
                if let (Some(est), Some(input)) = (est, input) {
                    estimate += est;
                    actual += input;
                    cached += reported
                        .get("cached_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    compared += 1;
                }
            }
            _ => {}
        }
    }
    let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
    Ok(json!({
        "steps": steps,
        "totals": {
            "compared_steps": compared,
            "estimate": estimate,
            "actual": actual,
            "actual_per_estimate": ratio(actual, estimate),
            "cached": cached,
            "cached_share": ratio(cached, actual),
        }
    }))
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
    /// Whether the previous step's whole request is a prefix of this one's (before any
    /// trimming this step adds); `None` on a session's first step.
    pub prefix_kept: Option<bool>,
}

/// Plans a step on the whole log. `run` identifies the daemon process: it is recorded with
/// each header; a header that differs from the last one is recorded with reason `change` when
/// this run wrote the last one, `resume` when another run (another daemon, an earlier process,
/// or 0.1.0, whose headers name no run) did (Q3). An equal header is not recorded again. The daemon plans on a cached
/// [`SessionState`] instead; this is the same function over a state built from `log`.
pub fn plan_step(
    session: &str,
    log: &[Event],
    messages: &[Message],
    facts: &BTreeMap<String, String>,
    assembly: &Assembly,
    header: &Header,
    run: &str,
) -> Result<StepPlan> {
    SessionState::from_log(session, log)?.plan(messages, facts, assembly, header, run, None)
}

/// Rebuilds the frozen request of step `n` from the log alone (Q4): the last header recorded
/// at or before the step, and every message up to its marker.
pub fn rebuild(session: &str, events: &[Event], n: u64) -> Result<FrozenRequest> {
    let marker = nth_marker(session, events, n)?;
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
        shown_tools: shown_of(body(session, marker)?),
    })
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
