//! Durable session logs (Q1, Q7): append-only events with a per-session sequence number.
//!
//! [`SessionStore`] is the seam: the daemon talks to the trait, so a server database (for
//! several daemons sharing sessions) can be added beside [`SqliteStore`] without touching
//! assembly or the HTTP layer.

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde_json::Value;

use crate::error::{Error, Result};

/// One recorded event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// 1-based, gapless within a session.
    pub seq: u64,
    /// e.g. `user/message`, `request/header`; see [`crate::session::kind`].
    pub kind: String,
    pub body: Value,
    /// Milliseconds since the Unix epoch when it was written (informational only: never part
    /// of a request).
    pub at_ms: u64,
}

/// An event about to be appended.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub kind: String,
    pub body: Value,
}

impl NewEvent {
    pub fn new(kind: &str, body: Value) -> Self {
        Self {
            kind: kind.to_string(),
            body,
        }
    }
}

/// Where session logs live.
pub trait SessionStore: Send + Sync {
    /// Creates a session for `agent` with a fresh id, recording `first` as event 1.
    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String>;
    /// The session's agent, or `None` if there is no such session.
    fn session_agent(&self, id: &str) -> Result<Option<String>>;
    /// The whole log, in order.
    fn events(&self, id: &str) -> Result<Vec<Event>>;
    /// Appends `events` atomically (all or none), durable before it returns. `next_seq` must
    /// be the log's length + 1, so a concurrent writer is detected instead of interleaved.
    fn append(&self, id: &str, next_seq: u64, events: &[NewEvent]) -> Result<()>;
}

/// SQLite in WAL mode with `synchronous = FULL`: each append is one transaction, synced
/// before the call returns, so an acknowledged step survives `kill -9`.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

fn store_err(e: rusqlite::Error) -> Error {
    Error::Store(e.to_string())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SqliteStore {
    /// Opens (or creates) the database file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn =
            Connection::open(path).map_err(|e| Error::Store(format!("{}: {e}", path.display())))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(store_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(store_err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(store_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(store_err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS sessions (
                 id TEXT PRIMARY KEY,
                 agent TEXT NOT NULL,
                 created_ms INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS events (
                 session_id TEXT NOT NULL REFERENCES sessions(id),
                 seq INTEGER NOT NULL,
                 kind TEXT NOT NULL,
                 body TEXT NOT NULL,
                 at_ms INTEGER NOT NULL,
                 PRIMARY KEY (session_id, seq)
             ) WITHOUT ROWID;",
        )
        .map_err(store_err)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a transaction half-applied (SQLite
        // rolls back), so a poisoned lock is safe to keep using.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn insert_events(
    tx: &rusqlite::Transaction,
    id: &str,
    next_seq: u64,
    events: &[NewEvent],
) -> Result<()> {
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO events (session_id, seq, kind, body, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(store_err)?;
    let at = now_ms() as i64;
    for (i, e) in events.iter().enumerate() {
        let body = serde_json::to_string(&e.body).map_err(|e| Error::Store(e.to_string()))?;
        stmt.execute(params![id, (next_seq + i as u64) as i64, e.kind, body, at])
            .map_err(store_err)?;
    }
    Ok(())
}

impl SessionStore for SqliteStore {
    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(store_err)?;
        let id: String = tx
            .query_row("SELECT lower(hex(randomblob(12)))", [], |r| r.get(0))
            .map_err(store_err)?;
        tx.execute(
            "INSERT INTO sessions (id, agent, created_ms) VALUES (?1, ?2, ?3)",
            params![id, agent, now_ms() as i64],
        )
        .map_err(store_err)?;
        insert_events(&tx, &id, 1, std::slice::from_ref(&first))?;
        tx.commit().map_err(store_err)?;
        Ok(id)
    }

    fn session_agent(&self, id: &str) -> Result<Option<String>> {
        self.conn()
            .query_row("SELECT agent FROM sessions WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(store_err)
    }

    fn events(&self, id: &str) -> Result<Vec<Event>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, kind, body, at_ms FROM events WHERE session_id = ?1 ORDER BY seq",
            )
            .map_err(store_err)?;
        let rows = stmt
            .query_map([id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(store_err)?;
        let mut events = Vec::new();
        for row in rows {
            let (seq, kind, body, at) = row.map_err(store_err)?;
            let body = serde_json::from_str(&body).map_err(|e| {
                Error::Store(format!("session {id} event {seq}: corrupt body: {e}"))
            })?;
            events.push(Event {
                seq: seq as u64,
                kind,
                body,
                at_ms: at as u64,
            });
        }
        Ok(events)
    }

    fn append(&self, id: &str, next_seq: u64, events: &[NewEvent]) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(store_err)?;
        let last: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?1",
                [id],
                |r| r.get(0),
            )
            .map_err(store_err)?;
        if last as u64 + 1 != next_seq {
            return Err(Error::Store(format!(
                "session {id}: expected to append at {next_seq}, but the log has {last} events (a concurrent writer?)"
            )));
        }
        insert_events(&tx, id, next_seq, events)?;
        tx.commit().map_err(store_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn q7_appends_are_ordered_durable_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let id = {
            let store = SqliteStore::open(&path).unwrap();
            let id = store
                .create_session(
                    "coder",
                    NewEvent::new("session/created", json!({"agent": "coder"})),
                )
                .unwrap();
            store
                .append(
                    &id,
                    2,
                    &[
                        NewEvent::new("a", json!(1)),
                        NewEvent::new("b", json!({"x": "y"})),
                    ],
                )
                .unwrap();
            let err = store
                .append(&id, 2, &[NewEvent::new("c", json!(null))])
                .unwrap_err();
            assert_eq!(err.code(), "store");
            id
        };
        // Reopened from the file: everything acknowledged is there, in order.
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.session_agent(&id).unwrap().as_deref(), Some("coder"));
        let events = store.events(&id).unwrap();
        let kinds: Vec<(u64, &str)> = events.iter().map(|e| (e.seq, e.kind.as_str())).collect();
        assert_eq!(kinds, [(1, "session/created"), (2, "a"), (3, "b")]);
        assert_eq!(events[2].body, json!({"x": "y"}));
        assert_eq!(store.session_agent("nope").unwrap(), None);
        assert!(store.events("nope").unwrap().is_empty());
    }
}
