//! Sessions as logs (Q1–Q6): what a step appends, and how any step's frozen request is
//! rebuilt from the log alone.
//!
//! Everything here is a pure function of the events; the daemon feeds it the log, the
//! assembly and the step's input, and writes what [`plan_step`] returns in one transaction.
//! The frozen request a step returns is [`rebuild`] of the log *including* the step's events,
//! the same function `GET …/steps/{n}/request` uses, so the two are byte-identical (Q4).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::assembly::Assembly;
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};
use crate::error::{Error, Result};
use crate::formats::Format;
use crate::store::{Event, StoreError};
use crate::transcript::{Head, Transcript};

pub mod log;

pub use log::HeaderReason;
use log::{Body, Compacted, HeaderRecord, Marker, Omitted, Snapshot};

/// The snapshot appended once when runtime context disappears (Q2).
pub const CLEARED_SNAPSHOT: &str =
    "[Runtime context: there is no runtime context any more; earlier snapshots no longer apply.]";

/// The header for an assembly: model settings, system prompt, shown tools.
pub fn header(assembly: &Assembly, model: serde_json::Map<String, serde_json::Value>) -> Header {
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

/// The event's body, decoded; one that does not decode is `store_corrupt`.
pub fn decode(session: &str, event: &Event) -> Result<Body> {
    Body::decode(event.kind, event.version, &event.body).map_err(|e| corrupt(session, event, e))
}

/// The message a body stands for, if it is one (a snapshot is a user message).
fn message_of(body: &Body) -> Option<Message> {
    match body {
        Body::ContextSnapshot(s) => Some(Message::snapshot(s.content.clone())),
        other => other.as_message().cloned(),
    }
}

/// Every message the log holds, in order, less those a `history/dropped` event left out, and
/// with each compacted range shown as its summary.
fn messages(events: &[(u64, Body)]) -> Vec<Message> {
    let mut dropped = BTreeSet::new();
    let mut summaries = BTreeMap::new();
    for (_, body) in events {
        match body {
            Body::HistoryDropped(d) => dropped.extend(d.seqs.iter().copied()),
            Body::HistoryCompacted(c) => {
                summaries.insert(c.from, c.summary.clone());
                dropped.extend(
                    events
                        .iter()
                        .map(|(seq, _)| *seq)
                        .filter(|s| (c.from..=c.to).contains(s) && !c.kept.contains(s)),
                );
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (seq, body) in events {
        if let Some(summary) = summaries.get(seq) {
            out.push(Message::user(summary.clone()));
        }
        if !dropped.contains(seq) {
            out.extend(message_of(body));
        }
    }
    out
}

/// Every event of `events` decoded, with its seq.
fn decode_all(session: &str, events: &[Event]) -> Result<Vec<(u64, Body)>> {
    events
        .iter()
        .map(|e| Ok((e.seq, decode(session, e)?)))
        .collect()
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

/// The length of `value` as JSON, without building the text.
fn json_bytes(value: &impl Serialize) -> usize {
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
    // Writing to a counter cannot fail, and these bodies hold no non-string map keys.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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
    data_secret: std::sync::Arc<str>,
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
            data_secret: std::sync::Arc::from(session),
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
        for event in events {
            let body = decode(&self.session, event)?;
            self.apply_body(event.seq, body)?;
        }
        Ok(())
    }

    /// Extends the state by the bodies a step planned, appended from seq `first`: they are
    /// applied as built, not decoded again.
    pub fn apply_planned(&mut self, first: u64, bodies: Vec<Body>) -> Result<()> {
        for (i, body) in bodies.into_iter().enumerate() {
            self.apply_body(first + i as u64, body)?;
        }
        Ok(())
    }

    fn apply_body(&mut self, seq: u64, body: Body) -> Result<()> {
        if seq != self.last_seq + 1 {
            return Err(Error::Store(StoreError::Corrupt {
                session: self.session.clone(),
                seq,
                problem: format!(
                    "{} event: expected seq {} (the log has a gap)",
                    body.kind(),
                    self.last_seq + 1
                ),
            }));
        }
        let message = match body {
            Body::Step(marker) => {
                let Marker {
                    shown_tools,
                    provenance,
                    ..
                } = *marker;
                self.steps += 1;
                self.shown_tools = shown_tools;
                if let Some(p) = provenance {
                    self.provenance = Some(p);
                }
                self.history_changed = false;
                None
            }
            Body::RequestHeader(record) => {
                self.header_bytes = json_bytes(&record);
                let HeaderRecord {
                    header,
                    provenance,
                    run,
                    ..
                } = *record;
                self.provenance = provenance;
                self.header = Some((header, run));
                self.memo = HeadMemo::default();
                None
            }
            Body::ContextSnapshot(Snapshot { cleared, content }) => {
                let message = Message::snapshot(content.clone());
                self.snapshot = if cleared {
                    SnapshotState::Cleared
                } else {
                    SnapshotState::Active(content)
                };
                self.snapshot_bytes = match &self.snapshot {
                    SnapshotState::Active(text) => text.len(),
                    _ => 0,
                };
                Some(message)
            }
            Body::HistoryDropped(d) => {
                self.history_changed = true;
                for seq in d.seqs {
                    if let Ok(i) = self.roles.binary_search_by_key(&seq, |(s, _)| *s) {
                        self.dropped.insert(i);
                    }
                }
                None
            }
            Body::HistoryCompacted(c) => {
                let start = self.roles.partition_point(|(s, _)| *s < c.from);
                let end = self.roles.partition_point(|(s, _)| *s <= c.to);
                if start < end {
                    self.history_changed = true;
                    let roles = &self.roles;
                    self.dropped
                        .extend((start..end).filter(|&i| !c.kept.contains(&roles[i].0)));
                    self.summaries.insert(start, c.summary);
                }
                None
            }
            Body::SessionCreated(created) => {
                if let Some(secret) = created.data_secret {
                    self.data_secret = secret.into();
                }
                None
            }
            Body::UserMessage(r) | Body::AssistantMessage(r) | Body::ToolResult(r) => {
                Some(r.message)
            }
            Body::PluginOmitted(_) => None,
        };
        if let Some(message) = message {
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
            self.roles.push((seq, role(&message)));
            self.transcript.push(&message);
        }
        self.last_seq = seq;
        Ok(())
    }

    /// The secret this session's data blocks are keyed with (T8). Sessions created before
    /// the secret was recorded use their id: stable, but weaker, since a plugin sees the id.
    pub fn data_secret(&self) -> &std::sync::Arc<str> {
        &self.data_secret
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

    /// The seq of the last event applied.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Steps taken.
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
        new: &[&Message],
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
        header: Option<&Header>,
        assembly: &Assembly,
        format: crate::formats::Format,
        new: &[&Message],
    ) -> (crate::budget::Usage, Option<Body>) {
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
                (usage, Some(Body::HistoryDropped(log::Dropped { seqs })))
            }
            _ => (usage, None),
        }
    }

    /// The fixed parts' measure for `header`, remembered while it is the session's header.
    /// `header` is a new header (measured once, before it is recorded), or `None` for the
    /// recorded one.
    fn fixed(
        &mut self,
        counter: &dyn crate::budget::Counter,
        header: Option<&Header>,
        format: Format,
        shown: Option<&[String]>,
    ) -> crate::budget::Fixed {
        let recorded = match (header, &self.header) {
            (Some(new), _) => return crate::budget::Fixed::measure(counter, new, format, shown),
            (None, Some((h, _))) => h,
            (None, None) => {
                return crate::budget::Fixed::measure(counter, &Header::default(), format, shown)
            }
        };
        let measure = || crate::budget::Fixed::measure(counter, recorded, format, shown);
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
        new: &[&Message],
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

    /// The tools the last step showed, when the agent keeps every tool in the header.
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

    /// Plans a step (see [`plan_step`]); linear in the step's input. Takes the step's
    /// messages (checked, and moved into their events).
    /// `header` is the header this step's request starts with; `None` says it is the one
    /// recorded last (the caller compared them), so nothing is built or compared again.
    pub fn plan(
        &self,
        messages: Vec<Message>,
        facts: BTreeMap<String, String>,
        assembly: &Assembly,
        header: Option<Header>,
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
            (Some((old, _)), Some(new)) if *old == new => None,
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
        };
        Ok(StepPlan {
            step,
            events,
            marker,
            header_reason,
            prefix_kept,
        })
    }
}

/// Step `n`'s provenance: what the last header or marker at or before its marker recorded.
pub fn provenance_at(
    session: &str,
    events: &[Event],
    n: u64,
) -> Result<Option<crate::provenance::Provenance>> {
    let upto = up_to_step(session, events, n)?;
    for event in upto.iter().rev() {
        match decode(session, event)? {
            Body::Step(m) if m.provenance.is_some() => return Ok(m.provenance),
            Body::RequestHeader(h) if h.provenance.is_some() => return Ok(h.provenance),
            _ => {}
        }
    }
    Ok(None)
}

/// The events up to and including step `n`'s marker.
fn up_to_step<'a>(session: &str, events: &'a [Event], n: u64) -> Result<&'a [Event]> {
    let marker = events
        .iter()
        .filter(|e| e.kind == crate::store::EventKind::Step)
        .nth(n.checked_sub(1).unwrap_or(u64::MAX) as usize)
        .ok_or_else(|| Error::UnknownStep {
            session: session.to_string(),
            step: n,
            steps: step_count(events),
        })?;
    Ok(&events[..events.partition_point(|e| e.seq <= marker.seq)])
}

/// How many steps the log holds.
pub fn step_count(events: &[Event]) -> u64 {
    events
        .iter()
        .filter(|e| e.kind == crate::store::EventKind::Step)
        .count() as u64
}

/// Checks a message a client wants to record against the whole log (see
/// [`SessionState::check_message`]).
pub fn check_message(session: &str, events: &[Event], message: &Message) -> Result<()> {
    SessionState::from_log(session, events)?.check_message(message)
}

/// Tool results as the agent's config shows them: an empty one says `empty`
/// (`empty_tool_result`), and the text is wrapped in `template` (`tool_result_template`).
pub fn tool_results_shown(
    mut messages: Vec<Message>,
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
    for m in &mut messages {
        let Message::Tool { content, .. } = m else {
            continue;
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
    messages
}

/// The body that records the model's reply with the usage its provider reported (Q14).
pub fn reply_event(message: Message, usage: Option<crate::replies::ProviderUsage>) -> Body {
    Body::message(message, usage)
}

/// The body that records `message`.
pub fn message_event(message: Message) -> Body {
    Body::message(message, None)
}

/// One step's estimate against what the provider reported for the reply that followed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepUsage {
    /// The step's number.
    pub step: u64,
    /// promptd's estimate of the request's tokens (`None` in logs without usage).
    pub estimate: Option<usize>,
    /// The tokenizer that estimated it.
    pub tokenizer: Option<String>,
    /// What the provider reported for the reply, when the client recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<crate::replies::ProviderUsage>,
}

/// The totals of a [`UsageReport`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageTotals {
    /// Steps with both an estimate and a reported input count.
    pub compared_steps: usize,
    /// Their estimates, summed.
    pub estimate: u64,
    /// Their reported input tokens, summed.
    pub actual: u64,
    /// `actual / estimate`, when there is an estimate.
    pub actual_per_estimate: Option<f64>,
    /// Their reported cached input tokens, summed.
    pub cached: u64,
    /// `cached / actual`, when there is an actual.
    pub cached_share: Option<f64>,
}

/// Per step, what promptd estimated against what the provider reported (Q14).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageReport {
    /// One entry per step, in order.
    pub steps: Vec<StepUsage>,
    /// The totals over the steps compared.
    pub totals: UsageTotals,
}

/// Per step: what promptd estimated against what the provider reported for the reply that
/// followed (its input tokens, cached and cache-written ones), and the totals: how far the
/// estimate is off (`actual / estimate`) and what share of the input the cache served.
pub fn usage_report(session: &str, events: &[Event]) -> Result<UsageReport> {
    let mut steps: Vec<StepUsage> = Vec::new();
    let (mut estimate, mut actual, mut cached, mut compared) = (0u64, 0u64, 0u64, 0usize);
    let mut pending: Option<usize> = None;
    for event in events {
        match event.kind {
            crate::store::EventKind::Step | crate::store::EventKind::AssistantMessage => {}
            _ => continue,
        }
        match decode(session, event)? {
            Body::Step(m) => {
                steps.push(StepUsage {
                    step: m.step,
                    estimate: m.usage.as_ref().map(|u| u.total.tokens),
                    tokenizer: m.usage.map(|u| u.tokenizer),
                    actual: None,
                });
                pending = Some(steps.len() - 1);
            }
            Body::AssistantMessage(r) => {
                let (Some(i), Some(reported)) = (pending.take(), r.usage) else {
                    continue;
                };
                let step = &mut steps[i];
                if let (Some(est), Some(input)) = (step.estimate, reported.input_tokens) {
                    estimate += est as u64;
                    actual += input;
                    cached += reported.cached_tokens.unwrap_or(0);
                    compared += 1;
                }
                step.actual = Some(reported);
            }
            _ => {}
        }
    }
    let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
    Ok(UsageReport {
        steps,
        totals: UsageTotals {
            compared_steps: compared,
            estimate,
            actual,
            actual_per_estimate: ratio(actual, estimate),
            cached,
            cached_share: ratio(cached, actual),
        },
    })
}

/// What one step appends, in order: the step's messages, the runtime context snapshot when
/// it changed (Q2), the header when it must be recorded (Q3), omissions (A9) — `events` —
/// then, after any `history/dropped` the budget adds, the step `marker`.
#[derive(Debug)]
pub struct StepPlan {
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

impl StepPlan {
    /// Every body the step appends, the marker last.
    pub fn into_bodies(self) -> Vec<Body> {
        let mut bodies = self.events;
        bodies.push(Body::Step(Box::new(self.marker)));
        bodies
    }
}

/// Plans a step on the whole log. `run` identifies the daemon process: it is recorded with
/// each header; a header that differs from the last one is recorded with reason `change` when
/// this run wrote the last one, `resume` when another run (another daemon, an earlier process,
/// or 0.1.0, whose headers name no run) did (Q3). An equal header is not recorded again. The
/// daemon plans on a cached [`SessionState`] instead; this is the same function over a state
/// built from `log`.
pub fn plan_step(
    session: &str,
    log: &[Event],
    messages: &[Message],
    facts: &BTreeMap<String, String>,
    assembly: &Assembly,
    header: &Header,
    run: &str,
) -> Result<StepPlan> {
    SessionState::from_log(session, log)?.plan(
        messages.to_vec(),
        facts.clone(),
        assembly,
        Some(header.clone()),
        run,
        None,
    )
}

/// Rebuilds the frozen request of step `n` from the log alone (Q4): the last header recorded
/// at or before the step, and every message up to its marker.
pub fn rebuild(session: &str, events: &[Event], n: u64) -> Result<FrozenRequest> {
    let upto = decode_all(session, up_to_step(session, events, n)?)?;
    let marker_seq = upto.last().map_or(0, |(seq, _)| *seq);
    let header = upto.iter().rev().find_map(|(_, b)| match b {
        Body::RequestHeader(h) => Some(h.header.clone()),
        _ => None,
    });
    let header = header.ok_or_else(|| {
        Error::Store(StoreError::Corrupt {
            session: session.to_string(),
            seq: marker_seq,
            problem: format!("step {n} has no request header before it"),
        })
    })?;
    let shown_tools = match upto.last() {
        Some((_, Body::Step(m))) => m.shown_tools.clone(),
        _ => None,
    };
    Ok(FrozenRequest {
        header,
        messages: messages(&upto),
        shown_tools,
    })
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
