//! Session logs on PostgreSQL (Q1, Q7, Q11), implementing
//! [`promptd_core::store::SessionStore`] for several daemons that serve the same sessions.
//!
//! **One step, one transaction.** An append locks its session's row (`SELECT … FOR UPDATE`),
//! checks that the log ends at `next_seq - 1` (else [`StoreError::Conflict`], as SQLite
//! does), inserts its events, moves the row's `last_seq`, and commits; only then is it
//! acknowledged. Two daemons appending to one session at once are serialised by the row lock,
//! and the loser of a seq sees the winner's `last_seq` and is refused: never two step N. The
//! primary key `(session_id, seq)` backs that up.
//!
//! **Group commit** is PostgreSQL's own: concurrent appends run on separate pooled
//! connections, and the server flushes the WAL of every transaction committing at that moment
//! in one sync (`synchronous_commit = on` stays: nothing is acknowledged before it is durable).
//! A writer thread batching appends as the SQLite store does would add a hop and serialise
//! every session behind one connection, for no fewer syncs.
//!
//! **Bodies are stored whole** (TEXT, `serde_json`'s own serialization), so they read back as
//! the same values, and rebuilds are byte-identical wherever they run. The SQLite store's media
//! dedup is not ported: it saves space, not correctness, and keeping bodies whole keeps a row
//! readable by `psql`.
//!
//! **The server may go away.** A failure to connect, or a connection lost mid-call, is
//! [`StoreError::Unavailable`] (`store_unavailable`, HTTP 503): nothing of that call was
//! acknowledged. The broken connection is dropped and the next call connects anew, so the
//! daemon recovers by itself when the server is back. (A commit whose connection died after the
//! server received it may still have committed; the client's retry then gets `store_conflict`
//! for that seq, and reads show the step — never one acknowledged and missing.)
//!
//! **Schema.** Versioned migrations ([`MIGRATIONS`]) are applied at start, in one transaction
//! under an advisory lock (several daemons starting at once migrate once). A database whose
//! schema is newer than this binary's is refused, naming both versions.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls, Statement};
use promptd_core::store::{
    Event, EventKind, NewEvent, PluginSet, SessionStore, SessionSummary, StoreError, BODY_VERSION,
};
use promptd_core::sync::{lock, wait};

/// The schema this binary writes: the last of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 3;

/// Each version's SQL, applied in order from the database's version + 1.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        // `last_seq`, `last_ms` and `steps` on the session row: the append's check, the daemons'
        // freshness check and the session list each read one row instead of counting events.
        "CREATE TABLE sessions (
         id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         created_ms BIGINT NOT NULL,
         last_seq BIGINT NOT NULL,
         last_ms BIGINT NOT NULL,
         steps BIGINT NOT NULL DEFAULT 0
     );
     CREATE TABLE events (
         session_id TEXT NOT NULL REFERENCES sessions(id),
         seq BIGINT NOT NULL,
         kind TEXT NOT NULL,
         body TEXT NOT NULL,
         at_ms BIGINT NOT NULL,
         body_version INTEGER NOT NULL,
         PRIMARY KEY (session_id, seq)
     );
     CREATE INDEX sessions_by_last ON sessions (last_ms DESC, id DESC);",
    ),
    (
        2,
        // K10: plugin sets a fleet serves, their files content-addressed.
        "CREATE TABLE plugin_files (
         sha256 TEXT PRIMARY KEY,
         bytes BYTEA NOT NULL
     );
     CREATE TABLE plugin_sets (
         version BIGINT PRIMARY KEY,
         created_ms BIGINT NOT NULL,
         files TEXT NOT NULL
     );",
    ),
    (
        3,
        // G12: each gateway key's spend per UTC day and month, counted by every daemon.
        "CREATE TABLE key_spend (
         key TEXT NOT NULL,
         period TEXT NOT NULL,
         micro_usd BIGINT NOT NULL,
         PRIMARY KEY (key, period)
     );",
    ),
];

/// The advisory lock migrations hold (any fixed number; "promptd" in ASCII).
const MIGRATION_LOCK: i64 = 0x70726f6d707464;

/// Connections open at most; more callers wait for one.
const MAX_CONNECTIONS: usize = 16;

/// How long a connection attempt may take before the store is called unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A PostgreSQL database shared by any number of daemons.
pub struct PostgresStore {
    config: postgres::Config,
    pool: Mutex<Pool>,
    freed: Condvar,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Conn>,
    /// Connections open, idle or in use.
    open: usize,
}

/// A connection with its statements prepared once.
struct Conn {
    client: Client,
    lock: Statement,
    insert: Statement,
    advance: Statement,
    last_seq: Statement,
    read: Statement,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Whether `e` says the server cannot be reached (rather than that a statement failed): no
/// answer from the server, a lost connection, or a server shutting down or starting.
fn unreachable(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            // 08: connection exceptions; 57P0x: admin/crash shutdown, cannot connect now.
            code.starts_with("08") || code.starts_with("57P")
        }
    }
}

/// A store error for `e`, saying what was being done.
fn pg(context: &'static str) -> impl Fn(postgres::Error) -> StoreError {
    move |e| {
        if unreachable(&e) {
            StoreError::Unavailable {
                context: context.into(),
                source: e.into(),
            }
        } else {
            StoreError::backend(context, e)
        }
    }
}

/// The URL without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            match user.split_once(':') {
                Some((name, _)) => format!("{}{name}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// `e`, saying which database (without its password) it is about.
fn naming(url: &str, e: StoreError) -> StoreError {
    let shown = redacted(url);
    match e {
        StoreError::Backend { context, source } => StoreError::Backend {
            context: format!("{shown}: {context}"),
            source,
        },
        StoreError::Unavailable { context, source } => StoreError::Unavailable {
            context: format!("{shown}: {context}"),
            source,
        },
        other => other,
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db`, or
    /// libpq's `key=value` form) and applies the migrations it lacks.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let store = Self::lazy(url)?;
        store.migrate().map_err(|e| naming(url, e))?;
        Ok(store)
    }

    /// Applies the migrations the database at `url` lacks, and nothing else (`promptd
    /// migrate`); returns its schema version before and after.
    pub fn migrate_url(url: &str) -> Result<(i32, i32), StoreError> {
        Self::lazy(url)?.migrate().map_err(|e| naming(url, e))
    }

    /// A store for `url` that has not connected yet (nor checked the schema).
    fn lazy(url: &str) -> Result<Self, StoreError> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| StoreError::backend(format!("the store URL {}", redacted(url)), e))?;
        config.connect_timeout(CONNECT_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("promptd");
        }
        Ok(Self {
            config,
            pool: Mutex::new(Pool::default()),
            freed: Condvar::new(),
        })
    }

    /// Applies the migrations the database lacks; returns its schema version before and
    /// after. Refused when the database's schema is newer than this binary's.
    pub fn migrate(&self) -> Result<(i32, i32), StoreError> {
        let mut client = self
            .config
            .connect(NoTls)
            .map_err(pg("connecting to PostgreSQL"))?;
        let mut tx = client
            .transaction()
            .map_err(pg("beginning the migration"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .map_err(pg("taking the migration lock"))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS promptd_schema (
                 version INTEGER PRIMARY KEY,
                 applied_ms BIGINT NOT NULL
             )",
        )
        .map_err(pg("creating promptd_schema"))?;
        let found: i32 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM promptd_schema", &[])
            .map_err(pg("reading the schema version"))?
            .get(0);
        if found > SCHEMA_VERSION {
            return Err(StoreError::backend(
                "checking the schema",
                format!(
                    "the database's schema is version {found}, newer than this promptd's \
                     (version {SCHEMA_VERSION}): run a promptd at least as new as the one \
                     that migrated it"
                ),
            ));
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
            tx.batch_execute(sql).map_err(pg("applying a migration"))?;
            tx.execute(
                "INSERT INTO promptd_schema (version, applied_ms) VALUES ($1, $2)",
                &[version, &now_ms()],
            )
            .map_err(pg("recording a migration"))?;
            tracing::info!(version, "applied store migration");
        }
        tx.commit().map_err(pg("committing the migration"))?;
        Ok((found, SCHEMA_VERSION))
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        lock(&self.pool)
    }

    /// An idle connection, a new one, or (at [`MAX_CONNECTIONS`]) the next one freed.
    fn take(&self) -> Result<Conn, StoreError> {
        let mut pool = self.pool();
        loop {
            if let Some(conn) = pool.idle.pop() {
                if !conn.client.is_closed() {
                    return Ok(conn);
                }
                pool.open -= 1;
                continue;
            }
            if pool.open < MAX_CONNECTIONS {
                pool.open += 1;
                drop(pool);
                let conn = self.connect();
                if conn.is_err() {
                    self.pool().open -= 1;
                    self.freed.notify_one();
                }
                return conn;
            }
            pool = wait(&self.freed, pool);
        }
    }

    fn connect(&self) -> Result<Conn, StoreError> {
        let mut client = self
            .config
            .connect(NoTls)
            .map_err(pg("connecting to PostgreSQL"))?;
        let mut prepare = |sql: &str| client.prepare(sql).map_err(pg("preparing a statement"));
        Ok(Conn {
            lock: prepare("SELECT last_seq FROM sessions WHERE id = $1 FOR UPDATE")?,
            insert: prepare(
                "INSERT INTO events (session_id, seq, kind, body, at_ms, body_version)
                 SELECT $1, seq, kind, body, $5, $6
                 FROM unnest($2::BIGINT[], $3::TEXT[], $4::TEXT[]) AS e(seq, kind, body)",
            )?,
            advance: prepare(
                "UPDATE sessions SET last_seq = $2, last_ms = $3, steps = steps + $4 WHERE id = $1",
            )?,
            last_seq: prepare("SELECT last_seq FROM sessions WHERE id = $1")?,
            read: prepare(
                "SELECT seq, kind, body, at_ms, body_version FROM events
                 WHERE session_id = $1 AND seq > $2 ORDER BY seq",
            )?,
            client,
        })
    }

    /// Runs `f` on a pooled connection; a connection that failed for want of the server is
    /// dropped, not pooled again.
    fn with<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut conn = self.take()?;
        let result = f(&mut conn);
        let broken =
            matches!(result, Err(StoreError::Unavailable { .. })) || conn.client.is_closed();
        let mut pool = self.pool();
        if broken {
            pool.open -= 1;
        } else {
            pool.idle.push(conn);
        }
        drop(pool);
        self.freed.notify_one();
        result
    }
}

fn read_events(conn: &mut Conn, id: &str, after: u64) -> Result<Vec<Event>, StoreError> {
    let rows = conn
        .client
        .query(&conn.read, &[&id, &(after as i64)])
        .map_err(pg("reading events"))?;
    let mut events = Vec::with_capacity(rows.len());
    for row in rows {
        let seq = row.get::<_, i64>(0) as u64;
        let corrupt = |problem: String| StoreError::Corrupt {
            session: id.to_string(),
            seq,
            problem,
        };
        let kind: &str = row.get(1);
        let kind = kind
            .parse::<EventKind>()
            .map_err(|e| corrupt(e.to_string()))?;
        let body: String = row.get(2);
        let version: i32 = row.get(4);
        events.push(Event {
            seq,
            kind,
            version: u32::try_from(version)
                .map_err(|_| corrupt(format!("body version {version}")))?,
            body,
            at_ms: row.get::<_, i64>(3) as u64,
        });
    }
    Ok(events)
}

/// Inserts `events` from `next_seq` and moves the session row past them (inside the caller's
/// transaction, which holds the row's lock).
fn insert(
    tx: &mut postgres::Transaction<'_>,
    conn: &Statements<'_>,
    id: &str,
    next_seq: u64,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    let at = now_ms();
    let seqs: Vec<i64> = (0..events.len() as i64)
        .map(|i| next_seq as i64 + i)
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let bodies: Vec<&str> = events.iter().map(|e| e.body.as_str()).collect();
    let version = BODY_VERSION as i32;
    tx.execute(conn.insert, &[&id, &seqs, &kinds, &bodies, &at, &version])
        .map_err(pg("inserting events"))?;
    let steps = events.iter().filter(|e| e.kind == EventKind::Step).count() as i64;
    let last = next_seq as i64 + events.len() as i64 - 1;
    tx.execute(conn.advance, &[&id, &last, &at, &steps])
        .map_err(pg("moving the session's last seq"))?;
    Ok(())
}

/// The statements a transaction needs, borrowed apart from the client it runs on.
struct Statements<'a> {
    lock: &'a Statement,
    insert: &'a Statement,
    advance: &'a Statement,
}

impl SessionStore for PostgresStore {
    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String, StoreError> {
        self.with(|conn| {
            let statements = Statements {
                lock: &conn.lock,
                insert: &conn.insert,
                advance: &conn.advance,
            };
            let mut tx = conn
                .client
                .transaction()
                .map_err(pg("beginning a transaction"))?;
            // 96 random bits, as the SQLite store's ids.
            let id: String = tx
                .query_one(
                    "INSERT INTO sessions (id, agent, created_ms, last_seq, last_ms)
                     VALUES (substr(replace(gen_random_uuid()::text, '-', ''), 1, 24), $1, $2, 0, $2)
                     RETURNING id",
                    &[&agent, &now_ms()],
                )
                .map_err(pg("inserting a session"))?
                .get(0);
            insert(&mut tx, &statements, &id, 1, std::slice::from_ref(&first))?;
            tx.commit().map_err(pg("committing"))?;
            Ok(id)
        })
    }

    fn session_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.with(|conn| {
            Ok(conn
                .client
                .query_opt("SELECT agent FROM sessions WHERE id = $1", &[&id])
                .map_err(pg("reading a session"))?
                .map(|row| row.get(0)))
        })
    }

    fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        self.with(|conn| read_events(conn, id, 0))
    }

    fn events_after(&self, id: &str, seq: u64) -> Result<Vec<Event>, StoreError> {
        self.with(|conn| read_events(conn, id, seq))
    }

    fn last_seq(&self, id: &str) -> Result<u64, StoreError> {
        self.with(|conn| {
            Ok(conn
                .client
                .query_opt(&conn.last_seq, &[&id])
                .map_err(pg("reading the last seq"))?
                .map_or(0, |row| row.get::<_, i64>(0) as u64))
        })
    }

    fn append(&self, id: &str, next_seq: u64, events: Vec<NewEvent>) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        self.with(|conn| {
            let statements = Statements {
                lock: &conn.lock,
                insert: &conn.insert,
                advance: &conn.advance,
            };
            let mut tx = conn
                .client
                .transaction()
                .map_err(pg("beginning a transaction"))?;
            // The row lock serialises appends to this session across every daemon.
            let last: i64 = tx
                .query_opt(statements.lock, &[&id])
                .map_err(pg("locking the session"))?
                .ok_or_else(|| StoreError::backend(format!("session `{id}`"), "no such session"))?
                .get(0);
            if last as u64 + 1 != next_seq {
                return Err(StoreError::Conflict {
                    session: id.to_string(),
                    expected: next_seq,
                    found: last as u64,
                });
            }
            insert(&mut tx, &statements, id, next_seq, &events)?;
            tx.commit().map_err(pg("committing"))
        })
    }

    fn sessions(&self, filter: &str, limit: usize) -> Result<Vec<SessionSummary>, StoreError> {
        // `strpos` rather than LIKE: the filter is plain text, `%` and `_` mean themselves.
        self.with(|conn| {
            let rows = conn
                .client
                .query(
                    "SELECT id, agent, created_ms, steps, last_seq, last_ms FROM sessions
                     WHERE $1 = '' OR strpos(id, $1) > 0 OR strpos(agent, $1) > 0
                     ORDER BY last_ms DESC, id DESC
                     LIMIT $2",
                    &[&filter, &(limit.min(i64::MAX as usize) as i64)],
                )
                .map_err(pg("listing sessions"))?;
            Ok(rows
                .iter()
                .map(|r| SessionSummary {
                    id: r.get(0),
                    agent: r.get(1),
                    created_ms: r.get::<_, i64>(2) as u64,
                    steps: r.get::<_, i64>(3) as u64,
                    events: r.get::<_, i64>(4) as u64,
                    last_ms: r.get::<_, i64>(5) as u64,
                })
                .collect())
        })
    }

    fn active_since(&self, since_ms: u64, limit: usize) -> Result<Vec<SessionSummary>, StoreError> {
        // Read off `sessions_by_last`: only the rows active since.
        self.with(|conn| {
            let rows = conn
                .client
                .query(
                    "SELECT id, agent, created_ms, steps, last_seq, last_ms FROM sessions
                     WHERE last_ms >= $1
                     ORDER BY last_ms DESC, id DESC
                     LIMIT $2",
                    &[
                        &(since_ms.min(i64::MAX as u64) as i64),
                        &(limit.min(i64::MAX as usize) as i64),
                    ],
                )
                .map_err(pg("listing active sessions"))?;
            Ok(rows
                .iter()
                .map(|r| SessionSummary {
                    id: r.get(0),
                    agent: r.get(1),
                    created_ms: r.get::<_, i64>(2) as u64,
                    steps: r.get::<_, i64>(3) as u64,
                    events: r.get::<_, i64>(4) as u64,
                    last_ms: r.get::<_, i64>(5) as u64,
                })
                .collect())
        })
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn publish_set(&self, files: &[(String, Vec<u8>)]) -> Result<PluginSet, StoreError> {
        let listed = PluginSet::files_of(files);
        let json = serde_json::to_string(&listed)
            .map_err(|e| StoreError::backend("encoding the plugin set", e))?;
        self.with(|conn| {
            let mut tx = conn
                .client
                .transaction()
                .map_err(pg("beginning a transaction"))?;
            // Publishers queue on the table lock, so versions follow each other.
            tx.batch_execute("LOCK TABLE plugin_sets IN EXCLUSIVE MODE")
                .map_err(pg("locking the plugin sets"))?;
            if let Some(latest) = latest_set(&mut tx)? {
                if latest.files == listed {
                    return Ok(latest);
                }
            }
            for (_, bytes) in files {
                tx.execute(
                    "INSERT INTO plugin_files (sha256, bytes) VALUES ($1, $2)
                     ON CONFLICT (sha256) DO NOTHING",
                    &[&promptd_core::store::sha256_hex(bytes), bytes],
                )
                .map_err(pg("storing a plugin file"))?;
            }
            let version: i64 = tx
                .query_one(
                    "INSERT INTO plugin_sets (version, created_ms, files)
                     SELECT COALESCE(MAX(version), 0) + 1, $1, $2 FROM plugin_sets
                     RETURNING version",
                    &[&now_ms(), &json],
                )
                .map_err(pg("storing the plugin set"))?
                .get(0);
            tx.commit().map_err(pg("committing the plugin set"))?;
            Ok(PluginSet {
                version: version as u64,
                files: listed.clone(),
            })
        })
    }

    fn latest_set(&self) -> Result<Option<PluginSet>, StoreError> {
        self.with(|conn| latest_set(&mut conn.client))
    }

    fn add_spend(
        &self,
        key: &str,
        periods: &[&str],
        micro_usd: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let add = i64::try_from(micro_usd).unwrap_or(i64::MAX);
        self.with(|conn| {
            let mut tx = conn
                .client
                .transaction()
                .map_err(pg("beginning a transaction"))?;
            let mut totals = Vec::with_capacity(periods.len());
            for period in periods {
                let total: i64 = tx
                    .query_one(
                        "INSERT INTO key_spend (key, period, micro_usd) VALUES ($1, $2, $3)
                         ON CONFLICT (key, period)
                         DO UPDATE SET micro_usd = key_spend.micro_usd + EXCLUDED.micro_usd
                         RETURNING micro_usd",
                        &[&key, period, &add],
                    )
                    .map_err(pg("counting a key's spend"))?
                    .get(0);
                totals.push(total.max(0) as u64);
            }
            tx.commit().map_err(pg("committing the spend"))?;
            Ok(totals)
        })
    }

    fn spend(&self, key: &str, periods: &[&str]) -> Result<Vec<u64>, StoreError> {
        let periods: Vec<&str> = periods.to_vec();
        self.with(|conn| {
            let rows = conn
                .client
                .query(
                    "SELECT period, micro_usd FROM key_spend WHERE key = $1 AND period = ANY($2)",
                    &[&key, &periods],
                )
                .map_err(pg("reading a key's spend"))?;
            Ok(periods
                .iter()
                .map(|p| {
                    rows.iter()
                        .find(|r| r.get::<_, &str>(0) == *p)
                        .map_or(0, |r| r.get::<_, i64>(1).max(0) as u64)
                })
                .collect())
        })
    }

    fn plugin_set(&self, version: u64) -> Result<Option<PluginSet>, StoreError> {
        let Ok(version) = i64::try_from(version) else {
            return Ok(None);
        };
        self.with(|conn| {
            conn.client
                .query_opt(
                    "SELECT version, files FROM plugin_sets WHERE version = $1",
                    &[&version],
                )
                .map_err(pg("reading a plugin set"))?
                .map(|row| decoded_set(&row))
                .transpose()
        })
    }

    fn set_file(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        self.with(|conn| {
            conn.client
                .query_opt(
                    "SELECT bytes FROM plugin_files WHERE sha256 = $1",
                    &[&sha256],
                )
                .map_err(pg("reading a plugin file"))?
                .map(|row| row.get::<_, Vec<u8>>(0))
                .ok_or_else(|| {
                    StoreError::backend(
                        format!("reading plugin file {sha256}"),
                        "no published set holds it",
                    )
                })
        })
    }
}

/// The latest plugin set the database holds (K10).
fn latest_set(client: &mut impl postgres::GenericClient) -> Result<Option<PluginSet>, StoreError> {
    let row = client
        .query_opt(
            "SELECT version, files FROM plugin_sets ORDER BY version DESC LIMIT 1",
            &[],
        )
        .map_err(pg("reading the latest plugin set"))?;
    row.map(|row| decoded_set(&row)).transpose()
}

/// A `plugin_sets` row (version, files as JSON) as its set.
fn decoded_set(row: &postgres::Row) -> Result<PluginSet, StoreError> {
    let version = row.get::<_, i64>(0);
    let files: String = row.get(1);
    let files = serde_json::from_str(&files)
        .map_err(|e| StoreError::backend(format!("decoding plugin set {version}"), e))?;
    Ok(PluginSet {
        version: version as u64,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_never_shows_in_messages() {
        assert_eq!(
            redacted("postgres://promptd:s3cret@db.local:5432/promptd"),
            "postgres://promptd:***@db.local:5432/promptd"
        );
        assert_eq!(
            redacted("postgres://promptd@db/promptd"),
            "postgres://promptd@db/promptd"
        );
    }

    #[test]
    fn a_server_that_does_not_answer_is_unavailable_not_a_failure() {
        // Port 1 on loopback: nothing listens there.
        let err = PostgresStore::open("postgres://promptd@127.0.0.1:1/promptd")
            .err()
            .expect("no server");
        assert_eq!(err.code(), "store_unavailable", "{err}");
    }
}
