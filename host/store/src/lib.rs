//! Durable session logs on SQLite (Q1, Q7): append-only events with a per-session sequence
//! number, implementing [`promptd_core::store::SessionStore`].
//!
//! **Group commit.** One write connection, written by one caller at a time ([`group`]): the
//! caller that finds no write in progress takes every pending append (from all sessions) at
//! once, writes them in one transaction — one refused append does not undo the others: a
//! conflict is found before the append writes anything, and a job that fails otherwise makes
//! the batch be written again with a savepoint around each job — commits once with
//! `synchronous = FULL`, and only then acknowledges each; the callers that queued meanwhile
//! wait for that write or write the next batch. Nothing is acknowledged before it is on disk,
//! and a failed commit fails every append of its batch. Reads use their own connections (WAL readers), so a
//! read never waits behind a writer's sync.
//!
//! **The files stay the files (Q12).** SQLite keeps writing to a database file that was deleted
//! or replaced under it, and such writes vanish with the process. So the store remembers the
//! device and inode of the database, its `-wal` and its `-shm` when it opens them, and checks
//! (one `stat` each) after every commit, before acknowledging anything, and before every read:
//! when a path no longer leads to the file the store has open, the store is lost for good —
//! every later call fails with a `store` error saying which file and why, one error line is
//! logged, and [`SessionStore::health`] reports it. A database overwritten *in place* (`cp
//! other.db s.db` keeps the inode) is caught by its content instead: the writer remembers the
//! database file's SQLite header (its first 100 bytes: change counter, page count, schema
//! cookie…), size and write time as its own last write left them, and before writing a batch
//! and before acknowledging one, a file that is no longer so was written by someone else:
//! lost too. A commit writes only the WAL; the writer copies the WAL into the database file
//! itself ([`checkpoint`]), after the commit's check, and records what the copy left.
//!
//! Events are kept in a rowid table, in the order they were appended ([`EVENTS`]), and found
//! by (session, seq) through a key table the writer fills about a thousand rows behind
//! ([`keys`]); opening a database from before issue 50, whose events table was keyed by
//! (session, seq), rebuilds it so once, and one from issue 50 on, which found them through a
//! SQLite index, is keyed once.
//!
//! Each event row carries its body's format version (`body_version`). Databases written by
//! 0.1.0 had no such column: opening one adds it with the default 1, which is what those rows
//! are, so old logs keep rebuilding byte-identically.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use promptd_core::sync::lock;

mod blobs;
mod checkpoint;
mod group;
mod keys;

use promptd_core::store::{
    Event, EventKind, NewEvent, PluginSet, SessionStore, SessionSummary, StoreError, BODY_VERSION,
};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

/// Most appends one transaction takes; more wait for the next one.
const MAX_BATCH: usize = 512;

/// Read connections kept open for reuse.
const MAX_IDLE_READERS: usize = 4;

/// SQLite in WAL mode with `synchronous = FULL`, group-committed.
pub struct SqliteStore {
    path: PathBuf,
    /// The files the store has open, checked before anything is acknowledged or read (Q12).
    files: Arc<Files>,
    writer: Arc<group::GroupCommit>,
    readers: Mutex<Vec<Connection>>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.writer.close();
    }
}

/// A write waiting for the write connection.
enum Job {
    Create {
        agent: String,
        first: NewEvent,
    },
    Append {
        id: String,
        next_seq: u64,
        events: Vec<NewEvent>,
    },
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

/// Opens a connection with the pragmas every connection needs. Only the writer's may create
/// the file: a reader opening a deleted database must fail, not start an empty one.
fn connect(path: &Path, create: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::backend(format!("opening {}", path.display()), e))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(db("setting synchronous"))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(db("setting foreign_keys"))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(db("setting busy_timeout"))?;
    // Only the writer checkpoints, and only where Q12's check expects it (`checkpoint`).
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(db("setting wal_autocheckpoint"))?;
    Ok(conn)
}

/// The events table's columns: a rowid table, so rows sit in the order they were appended
/// and a commit group's rows share the table's last pages; a session's rows are found by
/// [`keys`]. Keyed by (session, seq) instead, as databases
/// before issue 50 were, a step's row went in the middle of the tree beside its session's
/// last one, and SQLite rebalanced three leaves and their parent on most commits (3.6 pages
/// per commit for one client, counted in the WAL).
const EVENTS: &str = "(
                 session_id TEXT NOT NULL REFERENCES sessions(id),
                 seq INTEGER NOT NULL,
                 kind TEXT NOT NULL,
                 body TEXT NOT NULL,
                 at_ms INTEGER NOT NULL,
                 body_version INTEGER NOT NULL DEFAULT 1
             )";

/// Rebuilds an events table keyed by (session, seq) (`WITHOUT ROWID`, every database before
/// issue 50) into [`EVENTS`]'s layout, in one transaction: the same rows, column for column.
/// A crash before its commit leaves the old table as it was.
fn append_order(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'events'",
            [],
            |r| r.get(0),
        )
        .map_err(db("reading the schema"))?;
    if !sql.to_ascii_uppercase().contains("WITHOUT ROWID") {
        return Ok(());
    }
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .map_err(db("counting events"))?;
    tracing::info!(rows, path = %path.display(), "moving the events table to append order (once)");
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         CREATE TABLE events_appended {EVENTS};
         INSERT INTO events_appended (session_id, seq, kind, body, at_ms, body_version)
             SELECT session_id, seq, kind, body, at_ms, body_version FROM events;
         DROP TABLE events;
         ALTER TABLE events_appended RENAME TO events;
         COMMIT;"
    ))
    .map_err(|e| {
        let _ = conn.execute_batch("ROLLBACK");
        StoreError::backend(
            format!(
                "moving the events table of {} to append order",
                path.display()
            ),
            e,
        )
    })
}

impl SqliteStore {
    /// Opens (or creates) the database file at `path`, upgrading a 0.1.0 schema in place, and
    /// starts the writer thread.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = connect(path, true)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(db("setting journal_mode"))?;
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS sessions (
                 id TEXT PRIMARY KEY,
                 agent TEXT NOT NULL,
                 created_ms INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS events {EVENTS};
             CREATE TABLE IF NOT EXISTS blobs (
                 sha256 TEXT PRIMARY KEY,
                 data TEXT NOT NULL
             ) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS plugin_files (
                 sha256 TEXT PRIMARY KEY,
                 bytes BLOB NOT NULL
             ) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS plugin_sets (
                 version INTEGER PRIMARY KEY,
                 created_ms INTEGER NOT NULL,
                 files TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS key_spend (
                 key TEXT NOT NULL,
                 period TEXT NOT NULL,
                 micro_usd INTEGER NOT NULL,
                 PRIMARY KEY (key, period)
             ) WITHOUT ROWID;"
        ))
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
        append_order(&conn, path)?;
        keys::make(&conn)?;
        let keys = keys::Keys::load(&conn)?;
        // The schema queries above opened the -wal and -shm, which stay (same inodes) for as
        // long as the writer's connection is open: SQLite removes them only when the last
        // connection closes.
        let files = Arc::new(Files::open(path)?);
        files.settle(lock(&files.left))?;
        checkpoint::watch(&conn);
        let writer = Arc::new(group::GroupCommit::new(conn, keys));
        writer
            .start(files.clone())
            .map_err(|e| StoreError::backend("starting the store's writer thread", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            files,
            writer,
            readers: Mutex::new(Vec::new()),
        })
    }

    /// Makes the next `n` commits fail (SQLite's commit hook turns them into rollbacks), to
    /// test that nothing is acknowledged unless its commit succeeded.
    #[doc(hidden)]
    pub fn fail_commits(&self, n: u32) {
        self.writer.fail_commits.store(n, Ordering::SeqCst);
    }

    /// Runs `during` inside the next commit (SQLite's commit hook, as the transaction's end
    /// begins): after the write's checks, before its pages reach the WAL, to test what the
    /// store finds before it acknowledges anything.
    #[doc(hidden)]
    pub fn during_next_commit(&self, during: impl FnOnce() + Send + 'static) {
        *lock(&self.writer.during_commit) = Some(Box::new(during));
    }

    /// How many batches the store has written (each one transaction and one sync), for the
    /// tests of group commit.
    #[doc(hidden)]
    pub fn batches(&self) -> u64 {
        self.writer.batches.load(Ordering::Relaxed)
    }

    /// Runs `f` on a read connection from the pool (opened when none is idle), unless the
    /// files are lost: a read must not show what is no longer on disk (Q12).
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.files.check()?;
        let idle = lock(&self.readers).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => connect(&self.path, false)?,
        };
        let result = f(&conn);
        let mut readers = lock(&self.readers);
        if readers.len() < MAX_IDLE_READERS {
            readers.push(conn);
        }
        result
    }
}

/// A file's identity: a path that leads to another one (or to none) is not the file we have
/// open any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {} inode {}", self.dev, self.ino)
    }
}

/// What a `stat` of the database file says of its content: its size and when its data was
/// last written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Stat {
    size: u64,
    modified: Option<SystemTime>,
}

/// A file's identity, its size and when it was last written, from one `stat` of its path.
fn file_id(path: &Path) -> std::io::Result<(FileId, Stat)> {
    let meta = std::fs::metadata(path)?;
    let stat = Stat {
        size: meta.len(),
        modified: meta.modified().ok(),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok((
            FileId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            stat,
        ))
    }
    #[cfg(not(unix))]
    {
        // No inodes: only a deletion is noticed.
        Ok((FileId { dev: 0, ino: 0 }, stat))
    }
}

/// A file's identity alone, without asking for its times. Since Linux 6.13 a `stat` that
/// reads a file's times makes the file's next write take a fine-grained time, so that the
/// write is seen to change it: stating the WAL at every commit made every commit change the
/// WAL's modification time, and each `fdatasync` then wrote the WAL's inode as well as its
/// frames (a second synchronous write: about 25 µs more CPU and 50 µs more waiting per
/// sync, `cargo bench -p promptd-store --bench sync`). The `-wal` and `-shm` are checked for
/// identity only, so this asks for the inode number alone; their writes keep the coarse
/// time, which changes once a tick.
#[cfg(target_os = "linux")]
fn identity(path: &Path) -> std::io::Result<FileId> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let got = statx(CWD, path, AtFlags::empty(), StatxFlags::INO)?;
    Ok(FileId {
        dev: rustix::fs::makedev(got.stx_dev_major, got.stx_dev_minor),
        ino: got.stx_ino,
    })
}

/// A file's identity alone (elsewhere than Linux, from a whole `stat`).
#[cfg(not(target_os = "linux"))]
fn identity(path: &Path) -> std::io::Result<FileId> {
    file_id(path).map(|(id, _)| id)
}

/// What the store checks of one of its files: its identity, and for the database file
/// (`whole`) its size and write time too, from one `stat`; the `-wal` and `-shm` are asked
/// for their inode alone ([`identity`]).
fn checked(path: &Path, whole: bool) -> std::io::Result<(FileId, Stat)> {
    if whole {
        file_id(path)
    } else {
        identity(path).map(|id| (id, Stat::default()))
    }
}

/// The database's files as opened, and whether they have been lost (Q12).
struct Files {
    /// Each path with the identity of the file the store opened there.
    open: Vec<(PathBuf, FileId)>,
    /// Why the store is lost, once it is: set once, never cleared (a restart reopens).
    lost: OnceLock<String>,
    /// The database file, read-only, to see its content as it is on disk.
    main: std::fs::File,
    /// Its header, size and write time as this store's writes last left them. Held from a
    /// write's check to the check after it, so one of our own writes is never taken for a
    /// stranger's.
    left: Mutex<Option<Content>>,
}

/// What the store checks of the database file's content: SQLite's 100-byte header, the
/// file's size and when its data was last written. Only the store's own checkpoints write it
/// ([`checkpoint`]), each recorded as it ends, so a later write time is someone else's, even
/// one that left the header and size as they were (a copy of another database of the same
/// schema and page count).
#[derive(Clone, PartialEq, Eq)]
struct Content {
    header: [u8; 100],
    /// How much of `header` the file had (a new file may have less).
    read: usize,
    stat: Stat,
}

/// The database file's content: its header read from the open file, and `stat`, what the
/// `stat` of its path that found it to be the open file gave (no second `stat`).
fn content(file: &std::fs::File, stat: Stat) -> std::io::Result<Content> {
    // On the stack: this runs twice per write group.
    let mut header = [0u8; 100];
    #[cfg(unix)]
    let read = std::os::unix::fs::FileExt::read_at(file, &mut header, 0)?;
    #[cfg(not(unix))]
    let read = {
        let _ = file;
        0
    };
    Ok(Content { header, read, stat })
}

impl Files {
    /// Records the database file at `path` and its `-wal` and `-shm` (named after the
    /// resolved path, as SQLite names them).
    fn open(path: &Path) -> Result<Files, StoreError> {
        let real = std::fs::canonicalize(path)
            .map_err(|e| StoreError::backend(format!("resolving {}", path.display()), e))?;
        let mut open = Vec::with_capacity(3);
        let sibling = |suffix: &str| {
            let mut name = real.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        for (i, file) in [path.to_path_buf(), sibling("-wal"), sibling("-shm")]
            .into_iter()
            .enumerate()
        {
            let (id, _) = checked(&file, i == 0)
                .map_err(|e| StoreError::backend(format!("reading {}", file.display()), e))?;
            open.push((file, id));
        }
        let main = std::fs::File::open(&real)
            .map_err(|e| StoreError::backend(format!("opening {}", real.display()), e))?;
        Ok(Files {
            open,
            lost: OnceLock::new(),
            main,
            left: Mutex::new(None),
        })
    }

    /// A write's check before it writes: the inodes ([`Files::check`]), then that the
    /// database file holds what the last write left. The guard returned is given back to
    /// [`Files::unchanged`] once the write committed. The guard is taken first, so the size
    /// and header compared are never read in the middle of another of this store's writes.
    fn check_written(&self) -> Result<std::sync::MutexGuard<'_, Option<Content>>, StoreError> {
        self.unchanged(lock(&self.left))
    }

    /// The same check after a write committed, before anything of it is acknowledged, with
    /// the guard its check took: committed to a deleted or replaced file is not on disk, and
    /// a database file overwritten while the write ran is someone else's. A commit writes
    /// only the WAL (no connection checkpoints by itself, [`checkpoint`]), so the file must
    /// still hold what the last write left. Returns the guard for a checkpoint to
    /// [`Files::settle`].
    fn unchanged<'f>(
        &'f self,
        left: std::sync::MutexGuard<'f, Option<Content>>,
    ) -> Result<std::sync::MutexGuard<'f, Option<Content>>, StoreError> {
        let stat = self.identify()?;
        let now = content(&self.main, stat)
            .map_err(|e| StoreError::backend("reading the database header", e))?;
        match &*left {
            Some(was) if *was != now => {
                let path = &self.open[0].0;
                let why = format!(
                    "{} was overwritten in place while open (its SQLite header, size or write \
                     time changed from what this store last wrote: {} → {} bytes)",
                    path.display(),
                    was.stat.size,
                    now.stat.size
                );
                drop(left);
                Err(self.lose(path, &why))
            }
            _ => Ok(left),
        }
    }

    /// After the store wrote the database file itself (a checkpoint, or opening it): the
    /// inodes checked again, then the file's content as the write (holding `left`) left it
    /// recorded, for the next write's check.
    fn settle(
        &self,
        mut left: std::sync::MutexGuard<'_, Option<Content>>,
    ) -> Result<(), StoreError> {
        let stat = self.identify()?;
        let now = content(&self.main, stat)
            .map_err(|e| StoreError::backend("reading the database header", e))?;
        *left = Some(now);
        Ok(())
    }

    /// Marks the store lost for `why` (logged once) and returns the error every call gets.
    fn lose(&self, path: &Path, why: &str) -> StoreError {
        if self.lost.set(why.to_owned()).is_ok() {
            tracing::error!(
                path = %path.display(),
                "session store lost: {why}; nothing written since is on disk, so nothing \
                 is acknowledged any more: restart promptd to reopen the database"
            );
        }
        lost(self.lost.get().map_or(why, String::as_str))
    }

    /// Fails when any path no longer leads to the file the store has open: one `stat` per
    /// file. A deleted or replaced file makes the store lost for good, logged once; a file
    /// that cannot be checked (e.g. permissions) fails this call only.
    fn check(&self) -> Result<(), StoreError> {
        self.identify().map(drop)
    }

    /// [`Files::check`], returning the database file's size and write time from the same
    /// `stat` (the first path is the database file's).
    fn identify(&self) -> Result<Stat, StoreError> {
        if let Some(why) = self.lost.get() {
            return Err(lost(why));
        }
        let mut main = Stat::default();
        for (i, (path, id)) in self.open.iter().enumerate() {
            let why = match checked(path, i == 0) {
                Ok((now, stat)) if now == *id => {
                    if i == 0 {
                        main = stat;
                    }
                    continue;
                }
                Ok((now, _)) => format!(
                    "{} was replaced while open ({id}, now {now})",
                    path.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    format!("{} was deleted while open", path.display())
                }
                Err(e) => {
                    return Err(StoreError::backend(
                        format!("checking {}", path.display()),
                        e,
                    ))
                }
            };
            return Err(self.lose(path, &why));
        }
        Ok(main)
    }
}

/// The error every call gets once the files are lost.
fn lost(why: &str) -> StoreError {
    StoreError::backend(
        "session store lost",
        format!("{why}; nothing written since is kept: restart promptd to reopen the database"),
    )
}

/// One batch's write: the files checked (Q12), every job in one transaction, the files
/// checked again before anything is acknowledged, then the WAL copied into the database file
/// when it has grown. Each job's result is valid only once this returns `Ok`. The test hooks
/// (`trial`) make the commit fail, or run something inside it.
fn write_group(
    conn: &mut Connection,
    keys: &mut keys::Keys,
    batch: &[(u64, Job)],
    trial: (bool, Option<group::DuringCommit>),
    files: &Files,
    results: &mut Vec<Result<Written, StoreError>>,
) -> Result<(), StoreError> {
    let (fail, mut during) = trial;
    if fail || during.is_some() {
        conn.commit_hook(Some(move || {
            if let Some(during) = during.take() {
                during();
            }
            fail
        }));
    }
    // Once lost, nothing more is written: it would go to a file no one will read.
    let outcome = files.check_written().and_then(|left| {
        checkpoint::before_commit();
        let written = write_batch(conn, keys, batch, results);
        // Committed to a deleted, replaced or overwritten file is not on disk: acknowledge
        // nothing.
        let left = files.unchanged(left)?;
        if written.is_ok() && checkpoint::due() {
            // Copied into the database file only now, after the comparison: what the copy
            // leaves is what the next write expects.
            checkpoint::run(conn);
            files.settle(left)?;
        }
        written
    });
    conn.commit_hook(None::<fn() -> bool>);
    outcome
}

enum Written {
    Session(String),
    Events,
}

/// Writes every job in one transaction; leaves each job's result in `results`, in order
/// (valid only once the commit succeeded, which is this function's own result). A job that
/// fails must leave nothing of itself while the others are kept (Q11). A refused append (a
/// conflict) fails before it writes anything, so the jobs are first written without
/// savepoints: each costs a statement journal that copies every page the job touches. Only
/// when a job fails otherwise, possibly half-written, is the whole transaction rolled back and
/// the batch written again with a savepoint around each job.
fn write_batch(
    conn: &mut Connection,
    keys: &mut keys::Keys,
    batch: &[(u64, Job)],
    results: &mut Vec<Result<Written, StoreError>>,
) -> Result<(), StoreError> {
    if let Batch::Again = write_jobs(conn, keys, batch, results, false)? {
        results.clear();
        // With savepoints a failed job is rolled back alone: this one commits.
        write_jobs(conn, keys, batch, results, true)?;
    }
    Ok(())
}

/// What [`write_jobs`] did.
enum Batch {
    /// The transaction committed (or, for a batch of one, its job failed and nothing was
    /// written); `results` holds each job's.
    Committed,
    /// Written without savepoints, a job failed after it may have written: nothing was
    /// committed, and the batch must be written again with savepoints.
    Again,
}

/// Whether a job that failed with `error` wrote nothing before it did: a conflict is found by
/// the seq check before any insert ([`append`]).
fn failed_unwritten(error: &StoreError) -> bool {
    matches!(error, StoreError::Conflict { .. })
}

/// Writes `batch` in one transaction, each job in a savepoint of its own when `savepoints`.
fn write_jobs(
    conn: &mut Connection,
    keys: &mut keys::Keys,
    batch: &[(u64, Job)],
    results: &mut Vec<Result<Written, StoreError>>,
    savepoints: bool,
) -> Result<Batch, StoreError> {
    let tx = Immediate::begin(conn).map_err(db("beginning a transaction"))?;
    let tx = &tx;
    keys.begin(tx)?;
    let run = |sql: &str| cached(tx, sql);
    let write = |keys: &mut keys::Keys, job: &Job| match job {
        Job::Create { agent, first, .. } => create(tx, keys, agent, first).map(Written::Session),
        Job::Append {
            id,
            next_seq,
            events,
            ..
        } => append(tx, keys, id, *next_seq, events).map(|()| Written::Events),
    };
    // Keys the tail when due, commits, and tells `keys` so.
    let commit = |keys: &mut keys::Keys| -> Result<(), StoreError> {
        keys.key_if_due(tx)?;
        tx.commit().map_err(db("committing"))?;
        keys.committed();
        Ok(())
    };
    if let [(_, job)] = batch {
        // A batch of one (every write when steps do not overlap) needs no savepoint: the
        // transaction is its job's, and a failed job rolls it back whole.
        let result = write(keys, job);
        if result.is_ok() {
            commit(keys)?;
        }
        results.push(result);
        return Ok(Batch::Committed);
    }
    for (_, job) in batch {
        if !savepoints {
            let result = write(keys, job);
            if let Err(e) = &result {
                if !failed_unwritten(e) {
                    // Dropping `tx` rolls every job back.
                    return Ok(Batch::Again);
                }
            }
            results.push(result);
            continue;
        }
        run("SAVEPOINT job").map_err(db("making a savepoint"))?;
        let result = write(keys, job);
        if result.is_err() {
            // Only this job's writes go, and what `keys` noted of them.
            run("ROLLBACK TO job").map_err(db("rolling back a savepoint"))?;
            keys.reload(tx)?;
        }
        run("RELEASE job").map_err(db("releasing a savepoint"))?;
        results.push(result);
    }
    commit(keys)?;
    Ok(Batch::Committed)
}

/// Runs `sql` (no parameters, no rows) by a cached statement: rusqlite's `Transaction` and
/// `execute_batch` parse their SQL at every use, which costs more than the inserts a
/// transaction or savepoint guards.
fn cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute([]))
        .map(drop)
}

/// A `BEGIN IMMEDIATE` transaction run by cached statements ([`cached`]), rolled back when
/// dropped before [`Immediate::commit`].
struct Immediate<'c> {
    conn: &'c Connection,
    open: std::cell::Cell<bool>,
}

impl<'c> Immediate<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        cached(conn, "BEGIN IMMEDIATE")?;
        Ok(Self {
            conn,
            open: std::cell::Cell::new(true),
        })
    }

    /// Commits; on failure (e.g. the test hook's refused commit) nothing of it is kept.
    fn commit(&self) -> rusqlite::Result<()> {
        let committed = cached(self.conn, "COMMIT");
        if committed.is_ok() {
            self.open.set(false);
        }
        committed
    }
}

impl std::ops::Deref for Immediate<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        // Not committed: undo it all. A transaction SQLite already ended (a failed commit
        // rolls back) makes this fail harmlessly.
        if self.open.get() && !self.conn.is_autocommit() {
            let _ = cached(self.conn, "ROLLBACK");
        }
    }
}

fn create(
    tx: &Connection,
    keys: &mut keys::Keys,
    agent: &str,
    first: &NewEvent,
) -> Result<String, StoreError> {
    let id: String = tx
        .query_row("SELECT lower(hex(randomblob(12)))", [], |r| r.get(0))
        .map_err(db("making a session id"))?;
    tx.execute(
        "INSERT INTO sessions (id, agent, created_ms) VALUES (?1, ?2, ?3)",
        params![id, agent, now_ms() as i64],
    )
    .map_err(db("inserting a session"))?;
    insert_events(tx, keys, &id, 1, std::slice::from_ref(first))?;
    Ok(id)
}

fn append(
    tx: &Connection,
    keys: &mut keys::Keys,
    id: &str,
    next_seq: u64,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    let last = keys.last_seq(tx, id)?;
    if last + 1 != next_seq {
        return Err(StoreError::Conflict {
            session: id.to_string(),
            expected: next_seq,
            found: last,
        });
    }
    insert_events(tx, keys, id, next_seq, events)
}

fn insert_events(
    tx: &Connection,
    keys: &mut keys::Keys,
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
        let (body, blobs) = blobs::deflate(e.kind, &e.body);
        // Prepared only for an event with media: a statement cache lookup allocates its key.
        if !blobs.is_empty() {
            let mut blob = tx
                .prepare_cached("INSERT OR IGNORE INTO blobs (sha256, data) VALUES (?1, ?2)")
                .map_err(db("preparing the blob insert"))?;
            for (sha, data) in blobs {
                blob.execute(params![sha, data])
                    .map_err(db("inserting a blob"))?;
            }
        }
        let seq = next_seq + i as u64;
        stmt.execute(params![
            id,
            seq as i64,
            e.kind.as_str(),
            body.as_deref().unwrap_or(&e.body),
            at,
            BODY_VERSION
        ])
        .map_err(db("inserting an event"))?;
        keys.note(id, seq, tx.last_insert_rowid());
    }
    Ok(())
}

impl SessionStore for SqliteStore {
    fn create_session(&self, agent: &str, first: NewEvent) -> Result<String, StoreError> {
        let job = Job::Create {
            agent: agent.to_string(),
            first,
        };
        match self.writer.submit(&self.files, job)? {
            Written::Session(id) => Ok(id),
            Written::Events => Err(StoreError::backend(
                "creating a session",
                "the writer lost the session id",
            )),
        }
    }

    fn session_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.read(|conn| {
            conn.query_row("SELECT agent FROM sessions WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db("reading a session"))
        })
    }

    fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        self.read(|conn| read_events(conn, id, 0))
    }

    fn events_after(&self, id: &str, seq: u64) -> Result<Vec<Event>, StoreError> {
        self.read(|conn| read_events(conn, id, seq))
    }

    fn last_seq(&self, id: &str) -> Result<u64, StoreError> {
        self.read(|conn| {
            conn.prepare_cached(keys::LAST_SEQ)
                .and_then(|mut last| last.query_row([id], |r| r.get::<_, i64>(0)))
                .map(|last| last as u64)
                .map_err(db("reading the last seq"))
        })
    }

    fn sessions(&self, filter: &str, limit: usize) -> Result<Vec<SessionSummary>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(keys::SESSIONS)
                .map_err(db("listing sessions"))?;
            let rows = stmt
                .query_map(params![filter, limit.min(i64::MAX as usize) as i64], |r| {
                    Ok(SessionSummary {
                        id: r.get(0)?,
                        agent: r.get(1)?,
                        created_ms: r.get::<_, i64>(2)? as u64,
                        steps: r.get::<_, i64>(3)? as u64,
                        events: r.get::<_, i64>(4)? as u64,
                        last_ms: r.get::<_, Option<i64>>(5)?.unwrap_or(0) as u64,
                    })
                })
                .map_err(db("listing sessions"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(db("listing sessions"))
        })
    }

    fn append(&self, id: &str, next_seq: u64, events: Vec<NewEvent>) -> Result<(), StoreError> {
        let job = Job::Append {
            id: id.to_string(),
            next_seq,
            events,
        };
        self.writer.submit(&self.files, job).map(drop)
    }

    fn append_then(
        &self,
        id: &str,
        next_seq: u64,
        events: Vec<NewEvent>,
        then: promptd_core::store::AppendDone,
    ) {
        let job = Job::Append {
            id: id.to_string(),
            next_seq,
            events,
        };
        self.writer.submit_then(job, then);
    }

    fn defers(&self) -> bool {
        true
    }

    fn health(&self) -> Result<(), StoreError> {
        self.files.check()
    }

    fn publish_set(&self, files: &[(String, Vec<u8>)]) -> Result<PluginSet, StoreError> {
        // Checked as any write.
        let left = self.files.check_written()?;
        let published = self.publish_set_in(files)?;
        // Committed to a deleted, replaced or overwritten file is not on disk: not published.
        drop(self.files.unchanged(left)?);
        Ok(published)
    }

    fn latest_set(&self) -> Result<Option<PluginSet>, StoreError> {
        self.read(latest_set)
    }

    fn add_spend(
        &self,
        key: &str,
        periods: &[&str],
        micro_usd: u64,
    ) -> Result<Vec<u64>, StoreError> {
        // Checked and settled as any write (Q12): a count in a lost file is no count.
        let left = self.files.check_written()?;
        let totals = self.add_spend_in(key, periods, micro_usd)?;
        drop(self.files.unchanged(left)?);
        Ok(totals)
    }

    fn spend(&self, key: &str, periods: &[&str]) -> Result<Vec<u64>, StoreError> {
        self.read(|conn| {
            let mut totals = Vec::with_capacity(periods.len());
            for period in periods {
                let total: Option<i64> = conn
                    .query_row(
                        "SELECT micro_usd FROM key_spend WHERE key = ?1 AND period = ?2",
                        params![key, period],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(db("reading a key's spend"))?;
                totals.push(total.unwrap_or(0).max(0) as u64);
            }
            Ok(totals)
        })
    }

    fn plugin_set(&self, version: u64) -> Result<Option<PluginSet>, StoreError> {
        let Ok(version) = i64::try_from(version) else {
            return Ok(None);
        };
        self.read(|conn| {
            let row = conn
                .query_row(
                    "SELECT version, files FROM plugin_sets WHERE version = ?1",
                    params![version],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
                )
                .optional()
                .map_err(db("reading a plugin set"))?;
            row.map(decoded_set).transpose()
        })
    }

    fn set_file(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        self.read(|conn| {
            conn.query_row(
                "SELECT bytes FROM plugin_files WHERE sha256 = ?1",
                params![sha256],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .optional()
            .map_err(db("reading a plugin file"))?
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
fn latest_set(conn: &Connection) -> Result<Option<PluginSet>, StoreError> {
    let row = conn
        .query_row(
            "SELECT version, files FROM plugin_sets ORDER BY version DESC LIMIT 1",
            [],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
        )
        .optional()
        .map_err(db("reading the latest plugin set"))?;
    row.map(decoded_set).transpose()
}

/// A `plugin_sets` row (version, files as JSON) as its set.
fn decoded_set((version, files): (i64, String)) -> Result<PluginSet, StoreError> {
    let files = serde_json::from_str(&files)
        .map_err(|e| StoreError::backend(format!("decoding plugin set {version}"), e))?;
    Ok(PluginSet {
        version: version as u64,
        files,
    })
}

fn read_events(conn: &Connection, id: &str, after: u64) -> Result<Vec<Event>, StoreError> {
    let mut stmt = conn
        .prepare_cached(keys::READ_EVENTS)
        .map_err(db("preparing the read"))?;
    let rows = stmt
        .query_map(params![id, after as i64], |r| {
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
        let kind = kind
            .parse::<EventKind>()
            .map_err(|e| corrupt(e.to_string()))?;
        let body = blobs::inflate(conn, kind, body).map_err(corrupt)?;
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

impl SqliteStore {
    /// [`SessionStore::add_spend`]'s transaction: small and rare (one per recorded reply of
    /// a keyed request), on a pooled connection beside the writer's.
    fn add_spend_in(
        &self,
        key: &str,
        periods: &[&str],
        micro_usd: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let add = i64::try_from(micro_usd).unwrap_or(i64::MAX);
        // A pooled connection: one per reply would open the file and set its pragmas each time.
        let idle = lock(&self.readers).pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => connect(&self.path, false)?,
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("beginning the spend's transaction"))?;
        let mut totals = Vec::with_capacity(periods.len());
        for period in periods {
            let total: i64 = tx
                .query_row(
                    "INSERT INTO key_spend (key, period, micro_usd) VALUES (?1, ?2, ?3)
                     ON CONFLICT (key, period) DO UPDATE SET micro_usd = micro_usd + excluded.micro_usd
                     RETURNING micro_usd",
                    params![key, period, add],
                    |r| r.get(0),
                )
                .map_err(db("counting a key's spend"))?;
            totals.push(total.max(0) as u64);
        }
        tx.commit().map_err(db("committing the spend"))?;
        let mut readers = lock(&self.readers);
        if readers.len() < MAX_IDLE_READERS {
            readers.push(conn);
        }
        Ok(totals)
    }

    /// [`SessionStore::publish_set`]'s transaction.
    fn publish_set_in(&self, files: &[(String, Vec<u8>)]) -> Result<PluginSet, StoreError> {
        // Rare and large: a connection of its own, one immediate transaction.
        let mut conn = connect(&self.path, false)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("beginning the plugin set's transaction"))?;
        let listed = PluginSet::files_of(files);
        if let Some(latest) = latest_set(&tx)? {
            if latest.files == listed {
                return Ok(latest);
            }
        }
        for (_, bytes) in files {
            tx.execute(
                "INSERT OR IGNORE INTO plugin_files (sha256, bytes) VALUES (?1, ?2)",
                params![promptd_core::store::sha256_hex(bytes), bytes],
            )
            .map_err(db("storing a plugin file"))?;
        }
        let json = serde_json::to_string(&listed)
            .map_err(|e| StoreError::backend("encoding the plugin set", e))?;
        tx.execute(
            "INSERT INTO plugin_sets (created_ms, files) VALUES (?1, ?2)",
            params![now_ms() as i64, json],
        )
        .map_err(db("storing the plugin set"))?;
        let version = tx.last_insert_rowid() as u64;
        tx.commit().map_err(db("committing the plugin set"))?;
        Ok(PluginSet {
            version,
            files: listed,
        })
    }
}

#[cfg(test)]
mod tests;
