//! The session log's shape (Q1, Q7): events, their kinds and versions, and the
//! [`SessionStore`] trait every store implements.
//!
//! The trait lives here, beside the session logic that reads it, so the core never depends on a
//! database: `promptd-store` implements it on SQLite, [`MemoryStore`] implements it in memory
//! for tests and tools.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use crate::sync::lock;

/// The version written into every new event body's record. Version 1 is the format of the
/// first release (0.1.0), whose rows carried no version: a store reads a missing version as 1.
pub const BODY_VERSION: u32 = 1;

/// What an event records. The string forms are stored and shown in the API: never change one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// The session's first event: its agent and what it was created with.
    SessionCreated,
    /// A user message.
    UserMessage,
    /// A model's reply, with the usage its provider reported.
    AssistantMessage,
    /// A tool's result, answering a call of the model.
    ToolResult,
    /// The runtime context as of a step (Q2).
    ContextSnapshot,
    /// The model settings, system prompt and tools every later request starts with (Q3).
    RequestHeader,
    /// An optional plugin's contribution left out of a step (A9).
    PluginOmitted,
    /// Messages left out of every later request to keep it inside its budget (Q14).
    HistoryDropped,
    /// A range of messages shown as a client's summary in every later request (Q14).
    HistoryCompacted,
    /// The marker that closes a step: step `n`'s request is the log up to its marker.
    Step,
    /// What a gateway client sent and what promptd spliced in: the upstream body rebuilds
    /// from it byte for byte (G4).
    GatewayRequest,
}

impl EventKind {
    /// Every kind, in a fixed order.
    pub const ALL: [EventKind; 11] = [
        EventKind::SessionCreated,
        EventKind::UserMessage,
        EventKind::AssistantMessage,
        EventKind::ToolResult,
        EventKind::ContextSnapshot,
        EventKind::RequestHeader,
        EventKind::PluginOmitted,
        EventKind::HistoryDropped,
        EventKind::HistoryCompacted,
        EventKind::Step,
        EventKind::GatewayRequest,
    ];

    /// The kind's stored string, e.g. `user/message`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::SessionCreated => "session/created",
            EventKind::UserMessage => "user/message",
            EventKind::AssistantMessage => "assistant/message",
            EventKind::ToolResult => "tool/result",
            EventKind::ContextSnapshot => "context/snapshot",
            EventKind::RequestHeader => "request/header",
            EventKind::PluginOmitted => "plugin/omitted",
            EventKind::HistoryDropped => "history/dropped",
            EventKind::HistoryCompacted => "history/compacted",
            EventKind::Step => "step",
            EventKind::GatewayRequest => "gateway/request",
        }
    }
}

/// A stored string that names no [`EventKind`]: its message names the value and every kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown event kind `{0}`; one of {list}", list = EventKind::ALL.map(EventKind::as_str).join(", "))]
pub struct UnknownEventKind(pub String);

/// The kind a stored string names.
impl std::str::FromStr for EventKind {
    type Err = UnknownEventKind;

    fn from_str(s: &str) -> Result<EventKind, UnknownEventKind> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownEventKind(s.to_string()))
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// 1-based, gapless within a session.
    pub seq: u64,
    /// What the event records; it says how to read `body`.
    pub kind: EventKind,
    /// The format version of `body` (see [`BODY_VERSION`]).
    pub version: u32,
    /// The body's JSON text, as stored: [`crate::session::log::Body::decode`] reads it.
    pub body: String,
    /// Milliseconds since the Unix epoch when it was written (informational only: never part
    /// of a request).
    pub at_ms: u64,
}

impl Event {
    /// The body as a JSON value (for tests and tools: the session logic decodes typed bodies).
    pub fn body_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.body)
    }
}

/// An event about to be appended; always written at [`BODY_VERSION`].
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    /// What it records.
    pub kind: EventKind,
    /// The body's JSON text ([`crate::session::log::Body::encode`] writes it).
    pub body: String,
}

impl NewEvent {
    /// An event of `kind` whose body is the JSON text `body`.
    pub fn new(kind: EventKind, body: impl Into<String>) -> Self {
        Self {
            kind,
            body: body.into(),
        }
    }

    /// The event as a store records it: numbered `seq`, written at `at_ms`, in the current
    /// body version.
    pub fn recorded(&self, seq: u64, at_ms: u64) -> Event {
        Event {
            seq,
            kind: self.kind,
            version: BODY_VERSION,
            body: self.body.clone(),
            at_ms,
        }
    }

    /// An event of `kind` whose body is `body`'s JSON text (for tests and tools; the daemon
    /// writes typed bodies, [`crate::session::log::Body::encode`]).
    pub fn json(kind: EventKind, body: &serde_json::Value) -> Self {
        Self::new(kind, body.to_string())
    }

    /// [`NewEvent::recorded`], without copying the body.
    pub fn into_recorded(self, seq: u64, at_ms: u64) -> Event {
        Event {
            seq,
            kind: self.kind,
            version: BODY_VERSION,
            body: self.body,
            at_ms,
        }
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The log grew under us: another writer appended to this session.
    #[error("session `{session}`: expected to append at seq {expected}, but the log holds {found} events (another writer?)")]
    Conflict {
        /// The session's id.
        session: String,
        /// The seq the writer meant to append at.
        expected: u64,
        /// How many events the log holds.
        found: u64,
    },
    /// A stored row no longer decodes: the log is damaged or was written by a newer binary.
    #[error("session `{session}`, event {seq}: {problem}")]
    Corrupt {
        /// The session's id.
        session: String,
        /// The seq of the damaged event.
        seq: u64,
        /// What does not decode.
        problem: String,
    },
    /// The database itself failed (open, query, sync).
    #[error("{context}: {source}")]
    Backend {
        /// What the store was doing.
        context: String,
        /// The database's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database server cannot be reached (down, restarting, connection lost): nothing of
    /// the call was acknowledged, and the same call may succeed once it is back.
    #[error("{context}: the session store is unavailable: {source}")]
    Unavailable {
        /// What the store was doing.
        context: String,
        /// The connection's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// A message kept from a session's log that does not decode (`store_corrupt`): `seq` is the
    /// event that recorded it. The one error a session's state and a transcript both give.
    pub fn undecodable_message(session: &str, seq: u64, problem: impl fmt::Display) -> StoreError {
        StoreError::Corrupt {
            session: session.to_string(),
            seq,
            problem: format!("a kept message does not decode: {problem}"),
        }
    }
}

impl StoreError {
    /// A [`StoreError::Backend`] doing `context`, failed with `source`.
    pub fn backend(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError::Backend {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// What [`SessionStore::append_then`] calls with an append's result.
pub type AppendDone = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// Where session logs live.
pub trait SessionStore: Send + Sync {
    /// Creates a session for `agent` with a fresh id, recording `first` as event 1.
    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String, StoreError>;
    /// The session's agent, or `None` if there is no such session.
    fn session_agent(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// The whole log, in order.
    fn events(&self, id: &str) -> Result<Vec<Event>, StoreError>;
    /// Appends `events` atomically (all or none), durable before it returns. `next_seq` must
    /// be the log's length + 1, so a concurrent writer is detected instead of interleaved.
    /// The events are the store's: a writer on another thread takes them without a copy.
    fn append(&self, id: &str, next_seq: u64, events: Vec<NewEvent>) -> Result<(), StoreError>;
    /// [`SessionStore::append`], its result given to `then` instead of returned. A store that
    /// [`defers`](SessionStore::defers) returns at once and calls `then` from a writer of its
    /// own once the events are durable (or refused); the default calls it before returning.
    fn append_then(&self, id: &str, next_seq: u64, events: Vec<NewEvent>, then: AppendDone) {
        then(self.append(id, next_seq, events));
    }
    /// Whether [`SessionStore::append_then`] returns before the append is written (so a
    /// caller whose thread must not block on the disk or the network may use it).
    fn defers(&self) -> bool {
        false
    }
    /// Sessions whose id or agent contains `filter` (all when empty), most recent activity
    /// first, at most `limit`.
    fn sessions(&self, filter: &str, limit: usize) -> Result<Vec<SessionSummary>, StoreError>;
    /// Sessions with activity at or after `since_ms`, most recent first, at most `limit`
    /// (G10: a daemon sharing the store learns what the others recorded). Stores shared by
    /// several daemons answer it from an index.
    fn active_since(&self, since_ms: u64, limit: usize) -> Result<Vec<SessionSummary>, StoreError> {
        let mut out = self.sessions("", limit)?;
        out.retain(|s| s.last_ms >= since_ms);
        Ok(out)
    }
    /// Whether the store can still keep what it acknowledges (Q12): an error says why not
    /// (e.g. its database file was deleted). Cheap: health checks call it.
    fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The seq of the session's last event (0 when it has none). Cheap: a daemon sharing the
    /// store with others calls it before each use of its cached state.
    fn last_seq(&self, id: &str) -> Result<u64, StoreError> {
        Ok(self.events(id)?.last().map_or(0, |e| e.seq))
    }
    /// The events after `seq`, in order.
    fn events_after(&self, id: &str, seq: u64) -> Result<Vec<Event>, StoreError> {
        let mut events = self.events(id)?;
        events.retain(|e| e.seq > seq);
        Ok(events)
    }
    /// Whether other processes may append to the same sessions (a database server several
    /// daemons use): a cached session state must then be checked against the log before use.
    fn is_shared(&self) -> bool {
        false
    }
    /// K10: stores a plugin set (`promptd plugins publish`): each file's bytes under their
    /// sha256, then the set, numbered after the latest. A set with the same files as the
    /// latest is that one (no new version). Files and set in one transaction.
    fn publish_set(&self, files: &[(String, Vec<u8>)]) -> Result<PluginSet, StoreError> {
        let _ = files;
        Err(StoreError::backend(
            "publishing a plugin set",
            "this store keeps no plugin sets",
        ))
    }
    /// K10: the latest published plugin set, if any.
    fn latest_set(&self) -> Result<Option<PluginSet>, StoreError> {
        Ok(None)
    }
    /// K10: published plugin set `version`, if the store holds it (a following daemon whose
    /// latest set does not load looks for an older one that does).
    fn plugin_set(&self, version: u64) -> Result<Option<PluginSet>, StoreError> {
        let _ = version;
        Ok(None)
    }
    /// K10: the bytes of a published plugin file, by its sha256 (hex).
    fn set_file(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        Err(StoreError::backend(
            format!("reading plugin file {sha256}"),
            "this store keeps no plugin sets",
        ))
    }
    /// G12: adds `micro_usd` to gateway key `key`'s spend in each of `periods` (a UTC day
    /// `2026-12-06` and month `2026-12`), durably and atomically, and returns each period's
    /// total after it, in order. A shared store counts every daemon's spend.
    fn add_spend(
        &self,
        key: &str,
        periods: &[&str],
        micro_usd: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let _ = (key, periods, micro_usd);
        Err(StoreError::backend(
            format!("counting gateway key {key}'s spend"),
            "this store keeps no spend",
        ))
    }
    /// G12: gateway key `key`'s spend in each of `periods`, in micro-USD (0 for a period
    /// with none).
    fn spend(&self, key: &str, periods: &[&str]) -> Result<Vec<u64>, StoreError> {
        let _ = periods;
        Err(StoreError::backend(
            format!("reading gateway key {key}'s spend"),
            "this store keeps no spend",
        ))
    }
}

/// A plugin set published for a fleet of daemons (K10): its version and its files, by stem.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginSet {
    /// 1 for the first set a store holds, then one more per set with other files.
    pub version: u64,
    /// Each plugin file, sorted by stem.
    pub files: Vec<SetFile>,
}

/// The sha256 of `bytes`, in hex: a plugin file's address in a store (K10).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One file of a [`PluginSet`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetFile {
    /// The file's stem: `persona` for `persona.wasm` (the plugin id unless the config sets one).
    pub stem: String,
    /// The sha256 of its bytes, in hex.
    pub sha256: String,
}

impl PluginSet {
    /// The files of a set made of `files` (stem, bytes), sorted by stem, each with its sha256.
    pub fn files_of(files: &[(String, Vec<u8>)]) -> Vec<SetFile> {
        let mut out: Vec<SetFile> = files
            .iter()
            .map(|(stem, bytes)| SetFile {
                stem: stem.clone(),
                sha256: sha256_hex(bytes),
            })
            .collect();
        out.sort_by(|a, b| a.stem.cmp(&b.stem));
        out
    }
}

/// The cases every store must pass, run by each store's tests through [`store_suite!`]
/// (the same cases for SQLite and PostgreSQL).
#[cfg(feature = "test-suite")]
pub mod conformance;

/// One session as a list shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionSummary {
    /// The session's id.
    pub id: String,
    /// The agent it was created for.
    pub agent: String,
    /// Steps taken.
    pub steps: u64,
    /// Events in the log.
    pub events: u64,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When its last event was written.
    pub last_ms: u64,
}

/// A store in memory: for tests and one-shot tools. Nothing survives the process.
#[derive(Default)]
pub struct MemoryStore {
    sessions: Mutex<BTreeMap<String, (String, Vec<Event>)>>,
    sets: Mutex<PublishedSets>,
    /// Spend by (key, period), in micro-USD.
    spend: Mutex<BTreeMap<(String, String), u64>>,
}

/// A memory store's plugin sets, in order, and their files by sha256.
type PublishedSets = (Vec<PluginSet>, BTreeMap<String, Vec<u8>>);

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, Vec<Event>)>> {
        lock(&self.sessions)
    }
}

impl SessionStore for MemoryStore {
    fn publish_set(&self, files: &[(String, Vec<u8>)]) -> Result<PluginSet, StoreError> {
        let listed = PluginSet::files_of(files);
        let mut sets = lock(&self.sets);
        if let Some(latest) = sets.0.last().filter(|s| s.files == listed) {
            return Ok(latest.clone());
        }
        for (_, bytes) in files {
            sets.1.insert(sha256_hex(bytes), bytes.clone());
        }
        let set = PluginSet {
            version: sets.0.len() as u64 + 1,
            files: listed,
        };
        sets.0.push(set.clone());
        Ok(set)
    }

    fn latest_set(&self) -> Result<Option<PluginSet>, StoreError> {
        Ok(lock(&self.sets).0.last().cloned())
    }

    fn plugin_set(&self, version: u64) -> Result<Option<PluginSet>, StoreError> {
        Ok(lock(&self.sets)
            .0
            .iter()
            .find(|s| s.version == version)
            .cloned())
    }

    fn add_spend(
        &self,
        key: &str,
        periods: &[&str],
        micro_usd: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let mut spend = lock(&self.spend);
        Ok(periods
            .iter()
            .map(|p| {
                let total = spend.entry((key.to_string(), p.to_string())).or_default();
                *total = total.saturating_add(micro_usd);
                *total
            })
            .collect())
    }

    fn spend(&self, key: &str, periods: &[&str]) -> Result<Vec<u64>, StoreError> {
        let spend = lock(&self.spend);
        Ok(periods
            .iter()
            .map(|p| {
                spend
                    .get(&(key.to_string(), p.to_string()))
                    .copied()
                    .unwrap_or(0)
            })
            .collect())
    }

    fn set_file(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        lock(&self.sets).1.get(sha256).cloned().ok_or_else(|| {
            StoreError::backend(
                format!("reading plugin file {sha256}"),
                "no published set holds it",
            )
        })
    }

    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String, StoreError> {
        let mut sessions = self.sessions();
        // Sequential ids keep test runs deterministic.
        let id = format!("mem{:08}", sessions.len() + 1);
        sessions.insert(id.clone(), (agent.to_string(), vec![first.recorded(1, 0)]));
        Ok(id)
    }

    fn session_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.sessions().get(id).map(|(agent, _)| agent.clone()))
    }

    fn last_seq(&self, id: &str) -> Result<u64, StoreError> {
        Ok(self
            .sessions()
            .get(id)
            .map_or(0, |(_, log)| log.len() as u64))
    }

    fn sessions(&self, filter: &str, limit: usize) -> Result<Vec<SessionSummary>, StoreError> {
        let mut out: Vec<SessionSummary> = self
            .sessions()
            .iter()
            .filter(|(id, (agent, _))| id.contains(filter) || agent.contains(filter))
            .map(|(id, (agent, log))| SessionSummary {
                id: id.clone(),
                agent: agent.clone(),
                steps: log.iter().filter(|e| e.kind == EventKind::Step).count() as u64,
                events: log.len() as u64,
                created_ms: log.first().map_or(0, |e| e.at_ms),
                last_ms: log.last().map_or(0, |e| e.at_ms),
            })
            .collect();
        // Most recent first; the id breaks ties so the order never depends on the map.
        out.sort_by(|a, b| b.last_ms.cmp(&a.last_ms).then_with(|| b.id.cmp(&a.id)));
        out.truncate(limit);
        Ok(out)
    }

    fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        Ok(self
            .sessions()
            .get(id)
            .map(|(_, events)| events.clone())
            .unwrap_or_default())
    }

    fn append(&self, id: &str, next_seq: u64, events: Vec<NewEvent>) -> Result<(), StoreError> {
        let mut sessions = self.sessions();
        let Some((_, log)) = sessions.get_mut(id) else {
            return Err(StoreError::backend(
                format!("session `{id}`"),
                "no such session",
            ));
        };
        let found = log.len() as u64;
        if found + 1 != next_seq {
            return Err(StoreError::Conflict {
                session: id.to_string(),
                expected: next_seq,
                found,
            });
        }
        log.extend(
            events
                .iter()
                .enumerate()
                .map(|(i, e)| e.recorded(next_seq + i as u64, 0)),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn event_kinds_round_trip_through_their_stable_strings() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse(), Ok(kind));
        }
        let err = "session/deleted".parse::<EventKind>().unwrap_err();
        assert_eq!(err, UnknownEventKind("session/deleted".into()));
        assert!(err
            .to_string()
            .starts_with("unknown event kind `session/deleted`; one of session/created, "));
    }

    #[test]
    fn q7_memory_store_checks_the_next_seq() {
        let store = MemoryStore::new();
        let id = store
            .create_session(
                "coder",
                NewEvent::json(EventKind::SessionCreated, &json!({})),
            )
            .unwrap();
        store
            .append(
                &id,
                2,
                vec![NewEvent::json(EventKind::Step, &json!({"step": 1}))],
            )
            .unwrap();
        let err = store
            .append(
                &id,
                2,
                vec![NewEvent::json(EventKind::Step, &json!({"step": 2}))],
            )
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict { found: 2, .. }),
            "{err}"
        );
        let seqs: Vec<u64> = store.events(&id).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2]);
    }
}
