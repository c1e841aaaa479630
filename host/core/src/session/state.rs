//! What a step needs of a session, built once from its log and extended by each append:
//! [`SessionState`], and rendering its last request from the cached fragments.

use super::log::{HeaderRecord, Marker, Snapshot};
use super::*;

use crate::formats::json_text::json_len;
use std::collections::{BTreeMap, BTreeSet};

/// What a message is, for trimming (units, turns, snapshots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    User,
    Snapshot,
    Assistant,
    Tool,
}

pub(super) fn role(message: &Message) -> Role {
    match message {
        Message::User { snapshot: true, .. } => Role::Snapshot,
        Message::User { .. } => Role::User,
        Message::Assistant { .. } => Role::Assistant,
        Message::Tool { .. } => Role::Tool,
    }
}

/// Where the log's runtime context stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SnapshotState {
    Never,
    Active(String),
    Cleared,
}

/// What a step needs to know of a session's log — step count, last header, last snapshot,
/// the tool calls made, the messages rendered in every format — built once from the log and
/// extended by each append, so a step's work does not grow with the history (Q1–Q5).
#[derive(Clone, Debug)]
pub struct SessionState {
    pub(super) session: String,
    pub(super) last_seq: u64,
    pub(super) steps: u64,
    pub(super) header: Option<(Header, Option<String>)>,
    /// The seq of the last `request/header` event (0 before the first).
    pub(super) header_seq: u64,
    /// What the header and the snapshot take, kept as they change (a header may be megabytes
    /// of tools, so the session cache must count it).
    pub(super) header_bytes: usize,
    pub(super) snapshot_bytes: usize,
    pub(super) snapshot: SnapshotState,
    pub(super) tool_calls: BTreeSet<String>,
    /// Calls made and not yet answered: the next step must answer them (Q5).
    pub(super) open_calls: BTreeSet<String>,
    /// The tools the last step showed, when its agent keeps every tool in the header.
    pub(super) shown_tools: Option<Vec<String>>,
    /// The messages measured so far for a budget, extended as messages are appended, so
    /// measuring a step costs what it adds.
    pub(super) measured: Option<Measured>,
    /// Each message's event seq and role, in log order.
    pub(super) roles: Vec<(u64, Role)>,
    /// Messages (by index) left out of every later request (`history/dropped`, and the ranges
    /// of `history/compacted`).
    pub(super) dropped: BTreeSet<usize>,
    /// Compacted ranges: the index of their first message, and the summary shown instead.
    pub(super) summaries: BTreeMap<usize, String>,
    /// Bytes the tool call ids take, kept as they are added so `bytes` costs nothing per step.
    pub(super) tool_call_bytes: usize,
    pub(super) transcript: Transcript,
    pub(super) memo: HeadMemo,
    /// The provenance recorded last (with a header, or in a marker when only it changed).
    pub(super) provenance: Option<crate::provenance::Provenance>,
    /// History was dropped or compacted since the last step marker: the next request does not
    /// start with the last one.
    pub(super) history_changed: bool,
    /// The secret `data` plugins' blocks are keyed with (T8), from the session's first event.
    pub(super) data_secret: std::sync::Arc<str>,
    /// What the next reply's cache outcome compares with.
    pub(super) cache: super::outcome::Track,
    /// The idle gaps and sizes of the session's replied requests (`ttl = "auto"`).
    gaps: crate::cache::ttl::Gaps,
    /// What the body parts written last in each format stand for (a client's copy, issue 31).
    pub(super) marks: Vec<Mark>,
    /// The provenance recorded with the header being sent: what a held change compares with
    /// (a marker's provenance says who serves now, which may be a held plugin's new version).
    header_provenance: Option<crate::provenance::Provenance>,
    /// What the last step held (K7).
    held: Vec<crate::held::Held>,
    /// The client conversation the last `gateway/request` held: how many messages, and their
    /// chained digest (G3).
    gateway: Option<(usize, String)>,
    /// The model the last `gateway/request` named: a gateway reply's cache outcome and cost
    /// are the client's model's.
    pub(super) gateway_model: Option<String>,
    /// The gateway key the last `gateway/request` came with (G12): whose session it is.
    gateway_key: Option<String>,
    /// The seq of the last `gateway/request` (0 before the first): a reply after it answers it.
    gateway_seq: u64,
    /// The redactions the session's last `gateway/request` applied to the client's texts.
    gateway_redactions: Vec<crate::assembly::review::Redaction>,
    /// The user messages the log holds, and the text of the last one (world 0.3.0's inputs).
    user_turns: u64,
    last_user: Option<String>,
    /// The plugins' answers kept for the next steps (world 0.3.0), in memory only.
    reuse: crate::assembly::Reuse,
}

/// What the last parts written for a session in one format stand for (a client's copy, issue 31).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(super) step: u64,
    pub(super) format: Format,
    pub(super) header_seq: u64,
    pub(super) shown: Option<Vec<String>>,
    /// The list's items made once (the transcript's closed fragments) the body held.
    pub(super) closed: usize,
}

/// The last step's request as [`SessionState::request_view`] gives it.
#[derive(Debug)]
pub enum RequestView<'a> {
    /// No message is left out: the header, the tools shown and the message list's fragments.
    Spliced {
        /// The header.
        header: &'a Header,
        /// The tools the step showed, when the agent keeps every tool in the header.
        shown_tools: Option<&'a [String]>,
        /// The message list.
        fragments: crate::formats::transcript::Fragments<'a>,
    },
    /// Some messages are left out: the request of what is kept.
    Kept(FrozenRequest),
}

/// What depends only on the current header, made when a step first needs it and dropped
/// when the header changes: each format's serialized head, and the fixed parts' measure per
/// tokenizer. Keyed by the tools shown too; a few entries at most.
#[derive(Clone, Debug, Default)]
pub(super) struct HeadMemo {
    pub(super) heads: Vec<(Format, Option<Vec<String>>, Head)>,
    pub(super) fixed: Vec<(Format, String, Option<Vec<String>>, crate::budget::Fixed)>,
}

/// Most entries of each kind in a [`HeadMemo`]: the formats a client asks for times the tool
/// subsets it alternates between.
pub(super) const HEAD_MEMO_ENTRIES: usize = 8;

impl HeadMemo {
    /// The index in `heads` of the head of `header` in `format` with `shown` tools, made and
    /// remembered when missing.
    pub(super) fn head(
        &mut self,
        header: &Header,
        shown: &Option<Vec<String>>,
        format: crate::formats::Format,
    ) -> usize {
        let known = (self.heads.iter())
            .position(|(f, s, _)| *f == format && s.as_deref() == shown.as_deref());
        match known {
            Some(at) => at,
            None => {
                let head = Head::new(header, shown.as_deref(), format);
                remember(&mut self.heads, (format, shown.clone(), head));
                self.heads.len() - 1
            }
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.heads.iter().map(|(_, _, h)| h.bytes()).sum::<usize>() + self.fixed.len() * 64
    }
}

pub(super) fn remember<T>(list: &mut Vec<T>, item: T) {
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
            header_seq: 0,
            header_bytes: 0,
            snapshot_bytes: 0,
            gateway: None,
            gateway_model: None,
            gateway_key: None,
            gateway_seq: 0,
            gateway_redactions: Vec::new(),
            user_turns: 0,
            last_user: None,
            reuse: crate::assembly::Reuse::default(),
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
            cache: super::outcome::Track::default(),
            gaps: Default::default(),
            header_provenance: None,
            held: Vec::new(),
            marks: Vec::new(),
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

    /// Takes a `request/header` event: the header every later request starts with.
    fn apply_header(&mut self, seq: u64, record: HeaderRecord) {
        // The record as JSON is what its strings hold; the header's `Value` trees hold more
        // in memory, and the provenance is kept twice (below).
        self.header_bytes = json_len(&record)
            + header_heap_bytes(&record.header)
            + record.provenance.as_ref().map_or(0, json_len);
        let HeaderRecord {
            header,
            provenance,
            run,
            ..
        } = record;
        self.header_provenance.clone_from(&provenance);
        self.provenance = provenance;
        self.header = Some((header, run));
        self.header_seq = seq;
        self.memo = HeadMemo::default();
        self.cache.memo.head = None;
    }

    /// One recorded body applied at `seq` (the log's next).
    pub(super) fn apply_body(&mut self, seq: u64, body: Body) -> Result<()> {
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
                    held,
                    ..
                } = *marker;
                self.held = held;
                self.steps += 1;
                self.cache.step_seq = seq;
                if shown_tools.is_some() || self.shown_tools.is_some() {
                    self.cache.memo.head = None; // the head shows these tools
                }
                self.shown_tools = shown_tools;
                if let Some(p) = provenance {
                    self.provenance = Some(p);
                }
                self.history_changed = false;
                None
            }
            Body::RequestHeader(record) => {
                self.apply_header(seq, *record);
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
            Body::GatewayRequest(record) => {
                self.gateway = Some((record.messages, record.digest));
                self.gateway_model = record.model;
                self.gateway_key = record.key;
                self.gateway_seq = seq;
                self.gateway_redactions = record.redactions;
                None
            }
            Body::HistoryDropped(d) => {
                self.history_changed = true;
                self.cache.compacted = true;
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
                    self.cache.compacted = true;
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
            Body::AssistantMessage(r) => {
                if let (Some(o), Some(usage)) = (&r.cache, r.usage) {
                    let hour = self.hour_ttl();
                    self.gaps
                        .add_outcome(o, usage.input_tokens.unwrap_or(0), hour);
                    self.cache.compacted = false;
                    self.cache.last = Some(super::outcome::Replied {
                        step: self.steps,
                        format: o.format,
                        at_ms: o.sent_at_ms,
                        usage,
                        blocks: None,
                    });
                }
                Some(r.message)
            }
            Body::UserMessage(r) => {
                if let Message::User { content, .. } = &r.message {
                    self.user_turns += 1;
                    self.last_user = Some(content.text());
                }
                Some(r.message)
            }
            Body::ToolResult(r) => Some(r.message),
            Body::PluginOmitted(_) => None,
        };
        if let Some(message) = message {
            self.push_message(seq, &message);
        }
        self.last_seq = seq;
        Ok(())
    }

    /// A message the log recorded at `seq`: its tool calls opened or answered, its role, its
    /// fragments in the transcript.
    fn push_message(&mut self, seq: u64, message: &Message) {
        match message {
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
        self.roles.push((seq, role(message)));
        self.transcript.push(message);
    }

    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// The secret this session's data blocks are keyed with (T8). Sessions created before
    /// the secret was recorded use their id: stable, but weaker, since a plugin sees the id.
    pub fn data_secret(&self) -> &std::sync::Arc<str> {
        &self.data_secret
    }

    /// The last recorded header.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref().map(|(h, _)| h)
    }

    /// The provenance recorded last.
    pub fn provenance(&self) -> Option<&crate::provenance::Provenance> {
        self.provenance.as_ref()
    }

    /// The seq of the last event the state has seen: the next append goes at `last_seq + 1`.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The seq of the last reply the log holds (a Gemini call without an id was named by it).
    pub fn last_reply_seq(&self) -> Option<u64> {
        (self.roles.iter().rev())
            .find(|(_, r)| *r == Role::Assistant)
            .map(|(seq, _)| *seq)
    }

    /// How many steps the log holds.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The seq of the last `request/header` event (0 before the first): a new one means a
    /// new header.
    pub fn header_seq(&self) -> u64 {
        self.header_seq
    }

    /// How many message events later requests leave out (`history/dropped`, and the ranges
    /// of `history/compacted`).
    pub fn left_out(&self) -> usize {
        self.dropped.len()
    }

    /// The idle gaps and sizes of the session's replied requests, from their recorded cache
    /// outcomes (`[agents.NAME.cache] ttl = "auto"` chooses by them).
    pub fn gaps(&self) -> &crate::cache::ttl::Gaps {
        &self.gaps
    }

    /// Whether the header in force asks Anthropic for 1-hour breakpoints.
    pub fn hour_ttl(&self) -> bool {
        self.header()
            .is_some_and(|h| h.cache_ttl == Some(crate::conversation::Ttl::Hour1))
    }

    /// The provenance recorded with the header being sent.
    pub fn header_provenance(&self) -> Option<&crate::provenance::Provenance> {
        self.header_provenance.as_ref()
    }

    /// What the last step held (K7).
    pub fn held(&self) -> &[crate::held::Held] {
        &self.held
    }

    /// When the last reply recorded with a cache outcome was sent (ms since the epoch).
    pub fn last_reply_ms(&self) -> Option<u64> {
        self.cache.last.as_ref().map(|r| r.at_ms)
    }

    /// Whether history was trimmed or compacted since the last reply (a cache-cold point).
    pub fn compacted(&self) -> bool {
        self.cache.compacted || self.history_changed
    }

    /// The bytes of the session's messages as the transcript holds them.
    pub fn message_bytes(&self) -> usize {
        self.transcript.bytes()
    }

    /// Whether the model's call `id` waits for its result.
    pub fn call_open(&self, id: &str) -> bool {
        self.open_calls.contains(id)
    }

    /// The request inputs of the session's next step (world 0.3.0) with `new` its new
    /// messages: the last user message's text (a new one, else the log's last), how many user
    /// messages there are with them; `model` and `client_tools` as the caller knows them.
    pub fn step_inputs(
        &self,
        new: &[Message],
        model: Option<String>,
        client_tools: Option<Vec<String>>,
    ) -> crate::plugin::model::StepInputs {
        let users = new.iter().filter_map(|m| match m {
            Message::User { content, .. } => Some(content),
            _ => None,
        });
        let (count, last) = users.fold((0, None), |(n, _), c| (n + 1, Some(c)));
        crate::plugin::model::StepInputs {
            last_user_message: last.map(|c| c.text()).or_else(|| self.last_user.clone()),
            model,
            client_tools,
            turn_count: Some(self.user_turns + count),
        }
    }

    /// The plugins' answers kept for the session's next steps (world 0.3.0).
    pub fn reuse_mut(&mut self) -> &mut crate::assembly::Reuse {
        &mut self.reuse
    }

    /// The redactions the session's last gateway request applied to the client's texts
    /// (G6): every one its review hooks made so far.
    pub fn gateway_redactions(&self) -> &[crate::assembly::review::Redaction] {
        &self.gateway_redactions
    }

    /// Whose session it is (G12): the gateway key its last `gateway/request` came with, or
    /// `None` (no key, or no gateway request yet: `gateway_conversation` says which).
    pub fn gateway_key(&self) -> Option<&str> {
        self.gateway_key.as_deref()
    }

    /// The client conversation the session's last gateway request held (G3): its messages
    /// and their chained digest.
    pub fn gateway_conversation(&self) -> Option<(usize, &str)> {
        self.gateway.as_ref().map(|(n, d)| (*n, d.as_str()))
    }

    /// Whether the log holds a reply after the session's last gateway request (G10: a reply
    /// another daemon answered may not be recorded yet).
    pub fn gateway_replied(&self) -> bool {
        self.last_reply_seq()
            .is_some_and(|seq| seq > self.gateway_seq)
    }

    /// The runtime context snapshot in force, if one is (Q2).
    pub fn snapshot_text(&self) -> Option<&str> {
        match &self.snapshot {
            SnapshotState::Active(text) => Some(text),
            _ => None,
        }
    }

    /// Roughly how much memory the state holds, in bytes.
    pub fn bytes(&self) -> usize {
        self.transcript.bytes()
            + self.tool_call_bytes
            + self.header_bytes
            + self.snapshot_bytes
            + self.memo.bytes()
            + self.cache_bytes()
            + self.reuse.bytes()
    }

    /// The request of the last step in `format`: the last header and every message, the same
    /// bytes as [`rebuild`] of that step rendered by [`crate::formats::render`].
    pub fn render(&mut self, format: crate::formats::Format) -> Result<String> {
        let mut out = String::new();
        self.render_into(format, &mut out)?;
        Ok(out)
    }

    /// [`SessionState::render`], appended to `out`: a `String`, or
    /// [`crate::formats::pieces::Pieces`] to share the kept fragments instead of copying them.
    pub fn render_into<S: crate::formats::pieces::Sink>(
        &mut self,
        format: crate::formats::Format,
        out: &mut S,
    ) -> Result<()> {
        let header = renderable_header(
            &self.header,
            &self.transcript,
            &self.session,
            self.last_seq,
            format,
        )?;
        if self.dropped.is_empty() {
            let session = &self.session;
            let roles = &self.roles;
            self.transcript
                .activate(format)
                .map_err(|(i, problem)| undecodable(session, roles, i, problem))?;
            let at = self.memo.head(header, &self.shown_tools, format);
            self.transcript
                .render_with(&self.memo.heads[at].2, header, format, out);
            return Ok(());
        }
        // Trimmed: render what is kept (bounded by the budget, not by the history).
        let request = self.kept_request(header)?;
        out.text(&crate::formats::render(&request, format).to_string());
        Ok(())
    }

    /// The last step's request as a frozen request of the messages kept (with the summaries
    /// of compacted ranges in their place).
    pub(super) fn kept_request(&self, header: &Header) -> Result<FrozenRequest> {
        let mut messages = Vec::new();
        for (i, fragment) in self.transcript.neutral().iter().enumerate() {
            if let Some(summary) = self.summaries.get(&i) {
                messages.push(Message::user(summary.clone()));
            }
            if self.dropped.contains(&i) {
                continue;
            }
            let message = serde_json::from_str(fragment)
                .map_err(|e| undecodable(&self.session, &self.roles, i, e))?;
            messages.push(message);
        }
        Ok(FrozenRequest {
            header: header.clone(),
            messages,
            shown_tools: self.shown_tools.clone(),
        })
    }

    /// Renders the messages in `format` as they arrive from now on (the history at once),
    /// as [`SessionState::render`] does on its first call in a format; see
    /// [`SessionState::request_view`].
    pub fn activate(&mut self, format: crate::formats::Format) -> Result<()> {
        let (session, roles) = (&self.session, &self.roles);
        self.transcript
            .activate(format)
            .map_err(|(i, problem)| undecodable(session, roles, i, problem))
    }

    /// The last step's request in `format` without rendering it whole: while no message is
    /// left out and the format is active ([`SessionState::activate`]), the header and the
    /// message list's fragments as the state keeps them ([`Transcript::fragments`]); else the
    /// frozen request of what is kept (what [`SessionState::render`] renders then). Fails as
    /// `render` does.
    pub fn request_view(&self, format: crate::formats::Format) -> Result<RequestView<'_>> {
        let header = renderable_header(
            &self.header,
            &self.transcript,
            &self.session,
            self.last_seq,
            format,
        )?;
        if !self.dropped.is_empty() || !self.transcript.is_active(format) {
            return Ok(RequestView::Kept(self.kept_request(header)?));
        }
        Ok(RequestView::Spliced {
            header,
            shown_tools: self.shown_tools.as_deref(),
            fragments: self.transcript.fragments(header, format),
        })
    }
}

/// Kept message `i` does not decode: `store_corrupt`, naming the event that recorded it.
fn undecodable(
    session: &str,
    roles: &[(u64, Role)],
    i: usize,
    problem: impl std::fmt::Display,
) -> Error {
    let seq = roles.get(i).map_or(0, |(s, _)| *s);
    Error::Store(StoreError::undecodable_message(session, seq, problem))
}

/// The last step's header, if `format` can render what the transcript holds: what
/// [`SessionState::render_into`] and [`SessionState::request_view`] both check first. Over the
/// fields, not `&self`, so the caller may still change the transcript while it holds the header.
pub(super) fn renderable_header<'a>(
    header: &'a Option<(Header, Option<String>)>,
    transcript: &Transcript,
    session: &str,
    seq: u64,
    format: crate::formats::Format,
) -> Result<&'a Header> {
    let (header, _) = header.as_ref().ok_or_else(|| {
        Error::Store(StoreError::Corrupt {
            session: session.to_string(),
            seq,
            problem: "no request header recorded yet".into(),
        })
    })?;
    if let Some(what) = transcript.unsupported(format) {
        return Err(Error::UnsupportedBlock {
            format: format.as_str(),
            what: what.into(),
        });
    }
    Ok(header)
}
