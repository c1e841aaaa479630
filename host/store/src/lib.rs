//! Durable session logs on SQLite (Q1, Q7): append-only events with a per-session sequence
//! number, implementing [`promptd_core::store::SessionStore`].
//!
//! Each event row carries its body's format version (`body_version`). Databases written by
//! 0.1.0 had no such column: opening one adds it with the default 1, which is what those rows
//! are, so old logs keep rebuilding byte-identically.

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use promptd_core::store::{Event, EventKind, NewEvent, SessionStore, StoreError, BODY_VERSION};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// SQLite in WAL mode with `synchronous = FULL`: each append is one transaction, synced
/// before the call returns, so an acknowledged step survives `kill -9`.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

/// A database failure, saying what was being done.
fn db(context: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::backend(context, e)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SqliteStore {
    /// Opens (or creates) the database file at `path`, upgrading a 0.1.0 schema in place.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)
            .map_err(|e| StoreError::backend(format!("opening {}", path.display()), e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(db("setting journal_mode"))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(db("setting synchronous"))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(db("setting foreign_keys"))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(db("setting busy_timeout"))?;
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
                 body_version INTEGER NOT NULL DEFAULT 1,
                 PRIMARY KEY (session_id, seq)
             ) WITHOUT ROWID;",
        )
        .map_err(db("creating the schema"))?;
        let versioned: bool = conn
            .query_row(
                "SELECT COUNT(*) > 0 FROM pragma_table_info('events') WHERE name = 'body_version'",
                [],
                |r| r.get(0),
            )
            .map_err(db("reading the schema"))?;
        if !versioned {
            // A 0.1.0 database: its rows are version 1, the column's default.
            conn.execute_batch(
                "ALTER TABLE events ADD COLUMN body_version INTEGER NOT NULL DEFAULT 1",
            )
            .map_err(db("adding events.body_version"))?;
        }
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
) -> Result<(), StoreError> {
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO events (session_id, seq, kind, body, at_ms, body_version)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(db("preparing the insert"))?;
    let at = now_ms() as i64;
    for (i, e) in events.iter().enumerate() {
        let body = e.body.to_string();
        stmt.execute(params![
            id,
            (next_seq + i as u64) as i64,
            e.kind.as_str(),
            body,
            at,
            BODY_VERSION
        ])
        .map_err(db("inserting an event"))?;
    }
    Ok(())
}

impl SessionStore for SqliteStore {
    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String, StoreError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("beginning a transaction"))?;
        let id: String = tx
            .query_row("SELECT lower(hex(randomblob(12)))", [], |r| r.get(0))
            .map_err(db("making a session id"))?;
        tx.execute(
            "INSERT INTO sessions (id, agent, created_ms) VALUES (?1, ?2, ?3)",
            params![id, agent, now_ms() as i64],
        )
        .map_err(db("inserting a session"))?;
        insert_events(&tx, &id, 1, std::slice::from_ref(&first))?;
        tx.commit().map_err(db("committing"))?;
        Ok(id)
    }

    fn session_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.conn()
            .query_row("SELECT agent FROM sessions WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db("reading a session"))
    }

    fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, kind, body, at_ms, body_version FROM events
                 WHERE session_id = ?1 ORDER BY seq",
            )
            .map_err(db("preparing the read"))?;
        let rows = stmt
            .query_map([id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .map_err(db("reading events"))?;
        let mut events = Vec::new();
        for row in rows {
            let (seq, kind, body, at, version) = row.map_err(db("reading an event"))?;
            let corrupt = |problem: String| StoreError::Corrupt {
                session: id.to_string(),
                seq: seq as u64,
                problem,
            };
            let kind = EventKind::parse(&kind)
                .ok_or_else(|| corrupt(format!("unknown event kind `{kind}`")))?;
            let body = serde_json::from_str(&body)
                .map_err(|e| corrupt(format!("{kind} body is not JSON: {e}")))?;
            events.push(Event {
                seq: seq as u64,
                kind,
                version: u32::try_from(version)
                    .map_err(|_| corrupt(format!("body version {version}")))?,
                body,
                at_ms: at as u64,
            });
        }
        Ok(events)
    }

    fn append(&self, id: &str, next_seq: u64, events: &[NewEvent]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("beginning a transaction"))?;
        let last: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?1",
                [id],
                |r| r.get(0),
            )
            .map_err(db("reading the last seq"))?;
        if last as u64 + 1 != next_seq {
            return Err(StoreError::Conflict {
                session: id.to_string(),
                expected: next_seq,
                found: last as u64,
            });
        }
        insert_events(&tx, id, next_seq, events)?;
        tx.commit().map_err(db("committing"))
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
                    NewEvent::new(EventKind::SessionCreated, json!({"agent": "coder"})),
                )
                .unwrap();
            store
                .append(
                    &id,
                    2,
                    &[
                        NewEvent::new(EventKind::UserMessage, json!(1)),
                        NewEvent::new(EventKind::Step, json!({"x": "y"})),
                    ],
                )
                .unwrap();
            let err = store
                .append(&id, 2, &[NewEvent::new(EventKind::Step, json!(null))])
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    StoreError::Conflict {
                        expected: 2,
                        found: 3,
                        ..
                    }
                ),
                "{err}"
            );
            id
        };
        // Reopened from the file: everything acknowledged is there, in order.
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.session_agent(&id).unwrap().as_deref(), Some("coder"));
        let events = store.events(&id).unwrap();
        let kinds: Vec<(u64, &str)> = events.iter().map(|e| (e.seq, e.kind.as_str())).collect();
        assert_eq!(
            kinds,
            [(1, "session/created"), (2, "user/message"), (3, "step")]
        );
        assert!(events.iter().all(|e| e.version == BODY_VERSION));
        assert_eq!(events[2].body, json!({"x": "y"}));
        assert_eq!(store.session_agent("nope").unwrap(), None);
        assert!(store.events("nope").unwrap().is_empty());
    }
}
