//! The events' index by session, kept about a thousand rows behind the table.
//!
//! An index that SQLite updates at each insert puts each step's key beside its session's
//! earlier ones: a commit group of steps from N sessions rewrote N index leaves, one 4 KiB
//! WAL frame each for a 40-byte key, which was two thirds of the frames a commit wrote at 16
//! clients (BENCHMARKS.md, issue 50's eighth stop). So the keys live in a table of their own,
//! [`KEYS`] `(session_id, seq) → event rowid`, and the writer adds a session's keys several at
//! a time, into the one leaf they share.
//!
//! The rows past the mark [`UPTO`] (the *tail*) are found by rowid; every row at or before it
//! is keyed. A tail row may be keyed already: a session's keyed rows are always its first
//! ones, so a read takes the session's keyed rows, then its tail rows after its last keyed seq,
//! in one statement (one snapshot). Once [`LAG`] rows are unkeyed, each commit keys the
//! oldest unkeyed rows ([`CHUNK`] at most at a time) of the session that has the oldest one,
//! until fewer than [`LAG`] are left, and moves the mark up to the next unkeyed row: about as
//! many keys per commit as it wrote rows, no pause, and a busy session's keys go in dozens
//! at a time.
//!
//! The writer checks an append's seq against the session's last one: the tail's, which it
//! keeps in memory ([`Keys`]), else the key table's. A second row at one (session, seq) is so
//! refused before it is written (a conflict), and the key table's primary key refuses it
//! again when keyed.

use std::collections::HashMap;

use promptd_core::store::StoreError;
use rusqlite::{params, Connection, OptionalExtension};

use crate::db;

/// Unkeyed rows past which each commit keys some ([`Keys::key_if_due`]). A session keyed
/// has about `LAG / sessions stepping` unkeyed rows, and its keys go into one leaf however
/// few they are: at 256, sixteen sessions keyed 16 rows per 4 KiB leaf written, and keying
/// was a third of the WAL frames a commit wrote; at 1,024, about a third of that
/// (BENCHMARKS.md, issue 50's ninth stop). A read scans the tail for its session's rows,
/// about 0.1 ms at 1,024 rows.
pub(crate) const LAG: u64 = 1024;

/// Most keys of one session added at a time: a session that steps alone is keyed 128 rows
/// at once, not a whole tail's worth in one commit.
pub(crate) const CHUNK: usize = 128;

/// The key table: each event's (session, seq), pointing at its row.
pub(crate) const KEYS: &str = "CREATE TABLE IF NOT EXISTS event_keys (
                 session_id TEXT NOT NULL,
                 seq INTEGER NOT NULL,
                 event INTEGER NOT NULL,
                 PRIMARY KEY (session_id, seq)
             ) WITHOUT ROWID";

/// The mark (one row): every event row up to `upto` is keyed; `keyings` counts the commits
/// that added keys, so a store sees that another one keyed rows.
pub(crate) const UPTO: &str = "CREATE TABLE IF NOT EXISTS event_keys_upto (
                 upto INTEGER NOT NULL,
                 keyings INTEGER NOT NULL
             )";

/// A session's last keyed seq (0 when none is).
const LAST_KEYED: &str = "SELECT COALESCE(MAX(seq), 0) FROM event_keys WHERE session_id = ?1";

/// A session's events after a seq, in seq order: its keyed rows, then its tail rows.
pub(crate) const READ_EVENTS: &str = "SELECT e.seq, e.kind, e.body, e.at_ms, e.body_version
     FROM event_keys k JOIN events e ON e.rowid = k.event
     WHERE k.session_id = ?1 AND k.seq > ?2
     UNION ALL
     SELECT seq, kind, body, at_ms, body_version FROM events
     WHERE rowid > (SELECT upto FROM event_keys_upto) AND session_id = ?1
       AND seq > MAX(?2, (SELECT COALESCE(MAX(seq), 0) FROM event_keys WHERE session_id = ?1))
     ORDER BY 1";

/// A session's last seq (0 when it has none).
pub(crate) const LAST_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM (
         SELECT MAX(seq) AS seq FROM event_keys WHERE session_id = ?1
         UNION ALL
         SELECT MAX(seq) FROM events
         WHERE rowid > (SELECT upto FROM event_keys_upto) AND session_id = ?1)";

/// The sessions matching a filter (`instr`, not LIKE: the filter is plain text), with their
/// step and event counts and last event's time, most recent first.
pub(crate) const SESSIONS: &str = "WITH tail AS (
         SELECT session_id, COUNT(*) AS events, SUM(kind = 'step') AS steps,
                MAX(rowid) AS last_row
         FROM events e WHERE rowid > (SELECT upto FROM event_keys_upto)
           AND seq > (SELECT COALESCE(MAX(seq), 0) FROM event_keys k
                      WHERE k.session_id = e.session_id)
         GROUP BY session_id)
     SELECT s.id, s.agent, s.created_ms,
            (SELECT COUNT(*) FROM event_keys k JOIN events e ON e.rowid = k.event
             WHERE k.session_id = s.id AND e.kind = 'step') + COALESCE(t.steps, 0),
            (SELECT COUNT(*) FROM event_keys k WHERE k.session_id = s.id) + COALESCE(t.events, 0),
            COALESCE(
                (SELECT at_ms FROM events WHERE rowid = t.last_row),
                (SELECT e.at_ms FROM event_keys k JOIN events e ON e.rowid = k.event
                 WHERE k.session_id = s.id ORDER BY k.seq DESC LIMIT 1)) AS last
     FROM sessions s LEFT JOIN tail t ON t.session_id = s.id
     WHERE ?1 = '' OR instr(s.id, ?1) > 0 OR instr(s.agent, ?1) > 0
     ORDER BY last DESC, s.id DESC
     LIMIT ?2";

/// Makes the key table and its mark when the database has none, keying every row it holds,
/// and drops the SQLite index that kept the keys before (databases from issue 50 until this
/// table; a binary from then re-creates it when it opens the database, and the rows it writes
/// are the tail). One transaction: a failure leaves the database as it was.
pub(crate) fn make(conn: &Connection) -> Result<(), StoreError> {
    let made: bool = conn
        .query_row(
            "SELECT COUNT(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = 'event_keys_upto'",
            [],
            |r| r.get(0),
        )
        .map_err(db("reading the schema"))?;
    let sql = if made {
        "DROP INDEX IF EXISTS events_by_session;".to_string()
    } else {
        format!(
            "BEGIN IMMEDIATE;
             {KEYS};
             {UPTO};
             INSERT INTO event_keys (session_id, seq, event)
                 SELECT session_id, seq, rowid FROM events;
             INSERT INTO event_keys_upto (upto, keyings) SELECT COALESCE(MAX(rowid), 0), 0 FROM events;
             DROP INDEX IF EXISTS events_by_session;
             COMMIT;"
        )
    };
    conn.execute_batch(&sql).map_err(|e| {
        let _ = conn.execute_batch("ROLLBACK");
        StoreError::backend("keying the events by session", e)
    })
}

/// SQLite's count of commits by other connections, as `conn` sees it.
fn data_version(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut version| version.query_row([], |r| r.get(0)))
        .map_err(db("reading the database's data version"))
}

/// A session's rows past its last keyed one.
#[derive(Debug, Default)]
struct Unkeyed {
    /// The session's last seq.
    last: u64,
    /// The rowids of its unkeyed rows, oldest first; their seqs end at `last`.
    rows: Vec<i64>,
}

/// The writer's view of the tail: where the mark is, and each session's unkeyed rows and
/// last seq. A transaction updates it as it writes; one that does not commit leaves it stale,
/// and the next one reads it again from the database.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    upto: i64,
    /// Unkeyed rows in all.
    rows: u64,
    sessions: HashMap<String, Unkeyed>,
    /// The newest row of the table, and the mark's `keyings`, as this store left them.
    seen: Seen,
    /// Set while a transaction is open, and left set when it does not commit.
    stale: bool,
    /// SQLite's `data_version` when `seen` was last compared: it changes when another
    /// connection commits.
    version: i64,
}

/// What shows that another store wrote events or keyed them: the table's newest row (events
/// are only ever appended) and the count of keying commits.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    newest: i64,
    keyings: i64,
}

impl Seen {
    fn read(conn: &Connection) -> Result<Self, StoreError> {
        conn.prepare_cached(
            "SELECT (SELECT COALESCE(MAX(rowid), 0) FROM events),
                    (SELECT COALESCE(MAX(keyings), 0) FROM event_keys_upto)",
        )
        .and_then(|mut seen| {
            seen.query_row([], |r| {
                Ok(Self {
                    newest: r.get(0)?,
                    keyings: r.get(1)?,
                })
            })
        })
        .map_err(db("reading the keys' mark"))
    }
}

/// Sessions kept in [`Keys`] with every row keyed, past which they are forgotten (their last
/// seq is then read from the key table).
const KEPT: usize = 1024;

impl Keys {
    /// Reads the mark and the unkeyed rows past it.
    pub(crate) fn load(conn: &Connection) -> Result<Self, StoreError> {
        let upto: i64 = conn
            .query_row("SELECT upto FROM event_keys_upto", [], |r| r.get(0))
            .optional()
            .map_err(db("reading the keys' mark"))?
            .unwrap_or(0);
        let mut keys = Self {
            upto,
            seen: Seen::read(conn)?,
            version: data_version(conn)?,
            ..Self::default()
        };
        let failed = db("reading the events past the keys' mark");
        let mut rows = conn
            .prepare_cached(
                "SELECT session_id, seq, rowid FROM events WHERE rowid > ?1 ORDER BY rowid",
            )
            .map_err(&failed)?;
        let mut last_keyed = conn.prepare_cached(LAST_KEYED).map_err(&failed)?;
        // Each session's last keyed seq, read once: its rows after it are unkeyed.
        let mut keyed: HashMap<String, u64> = HashMap::new();
        let mut found = rows.query([upto]).map_err(&failed)?;
        while let Some(row) = found.next().map_err(&failed)? {
            let (session, seq, rowid): (String, i64, i64) = (
                row.get(0).map_err(&failed)?,
                row.get(1).map_err(&failed)?,
                row.get(2).map_err(&failed)?,
            );
            let last = match keyed.get(&session) {
                Some(last) => *last,
                None => {
                    let last: i64 = last_keyed
                        .query_row([&session], |r| r.get(0))
                        .map_err(&failed)?;
                    keyed.insert(session.clone(), last as u64);
                    last as u64
                }
            };
            if seq as u64 > last {
                keys.note(&session, seq as u64, rowid);
            }
        }
        Ok(keys)
    }

    /// A transaction begins on `tx`: reads the tail again if the last one did not commit, or
    /// another connection has committed since.
    pub(crate) fn begin(&mut self, tx: &Connection) -> Result<(), StoreError> {
        let version = data_version(tx)?;
        // Another connection committed: the store's own plugin sets and spend do, on
        // connections of their own, and those leave the events and keys as they were.
        if self.stale || (version != self.version && Seen::read(tx)? != self.seen) {
            *self = Self::load(tx)?;
        }
        self.version = version;
        self.stale = true;
        Ok(())
    }

    /// Reads the tail again in the open transaction `tx` (after a job's writes were rolled
    /// back alone, to its savepoint).
    pub(crate) fn reload(&mut self, tx: &Connection) -> Result<(), StoreError> {
        *self = Self::load(tx)?;
        self.stale = true;
        Ok(())
    }

    /// The session's last seq as the open transaction sees it.
    pub(crate) fn last_seq(&self, tx: &Connection, id: &str) -> Result<u64, StoreError> {
        if let Some(unkeyed) = self.sessions.get(id) {
            return Ok(unkeyed.last);
        }
        tx.prepare_cached(LAST_KEYED)
            .and_then(|mut last| last.query_row([id], |r| r.get::<_, i64>(0)))
            .map(|last| last as u64)
            .map_err(db("reading the last seq"))
    }

    /// Notes the row at `rowid`, session `id`'s at `seq`, written in the open transaction.
    pub(crate) fn note(&mut self, id: &str, seq: u64, rowid: i64) {
        // Looked up first: a session already known costs no key.
        let unkeyed = match self.sessions.get_mut(id) {
            Some(unkeyed) => unkeyed,
            None => self.sessions.entry(id.to_string()).or_default(),
        };
        unkeyed.last = seq;
        unkeyed.rows.push(rowid);
        self.rows += 1;
        self.seen.newest = self.seen.newest.max(rowid);
    }

    /// While the tail holds [`LAG`] unkeyed rows or more, keys the oldest [`CHUNK`] (at
    /// most) of the session with the oldest one, and moves the mark to just before the next
    /// unkeyed row; called just before the commit. So a commit keys about as many rows as it
    /// wrote, a session's keys go in many at a time, and the tail's oldest row is keyed first.
    pub(crate) fn key_if_due(&mut self, tx: &Connection) -> Result<(), StoreError> {
        if self.rows < LAG {
            return Ok(());
        }
        let mut key = tx
            .prepare_cached(
                // `OR FAIL`: a second key at one (session, seq) fails the statement, and so the
                // transaction, without the statement journal `ABORT` keeps.
                "INSERT OR FAIL INTO event_keys (session_id, seq, event) VALUES (?1, ?2, ?3)",
            )
            .map_err(db("keying the events by session"))?;
        while self.rows >= LAG {
            let Some((id, unkeyed)) = self
                .sessions
                .iter_mut()
                .filter(|(_, u)| !u.rows.is_empty())
                .min_by_key(|(_, u)| u.rows[0])
            else {
                break;
            };
            let first = unkeyed.last + 1 - unkeyed.rows.len() as u64;
            let n = unkeyed.rows.len().min(CHUNK);
            for (i, rowid) in unkeyed.rows.drain(..n).enumerate() {
                key.execute(params![id, (first + i as u64) as i64, rowid])
                    .map_err(db("keying the events by session"))?;
            }
            self.rows -= n as u64;
        }
        let next = self
            .sessions
            .values()
            .filter_map(|u| u.rows.first())
            .min()
            .copied();
        // None unkeyed: every row of the table is keyed.
        self.upto = next.map_or(self.seen.newest, |rowid| rowid - 1);
        tx.prepare_cached("UPDATE event_keys_upto SET upto = ?1, keyings = keyings + 1")
            .and_then(|mut mark| mark.execute(params![self.upto]))
            .map_err(db("keying the events by session"))?;
        self.seen.keyings += 1;
        Ok(())
    }

    /// The open transaction committed.
    pub(crate) fn committed(&mut self) {
        self.stale = false;
        if self.sessions.len() > KEPT {
            self.sessions.retain(|_, u| !u.rows.is_empty());
        }
    }
}
