//! When the writer copies the WAL into the database file (Q12).
//!
//! SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000 pages,
//! so a commit could rewrite the database file, and the store could not tell the file its own
//! commit left from one overwritten while the commit ran: it could only record what it found.
//! So no connection checkpoints by itself (`wal_autocheckpoint = 0`); the writer's connection
//! reports the WAL's size after each commit ([`watch`]), and once the commit is checked
//! (the file still as the last write left it) the writer makes the `PASSIVE` checkpoint
//! SQLite would have made ([`due`], [`run`]), at a quarter of SQLite's size, and records what
//! it left.
//!
//! Copying it beside the commits instead, on a thread of its own, was tried and measured no
//! faster (BENCHMARKS.md, issue 50's fourth stop).

use std::cell::Cell;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::hooks::Wal;
use rusqlite::Connection;

/// The WAL's size, in pages, past which a commit is followed by a checkpoint. Every write
/// waits while it copies, and with the events keyed apart ([`crate::keys`]) a WAL's pages are
/// mostly distinct: SQLite's 1,000 pages stalled every client for about 4 ms, 1% of the steps
/// at 16 clients (p99 4.5–5.9 ms against 3.1–3.6 ms at 250; BENCHMARKS.md, issue 50's eighth
/// stop).
pub(crate) const CHECKPOINT_PAGES: u32 = 250;

thread_local! {
    /// The WAL's pages after the last commit on this thread's writer connection ([`watch`]).
    static WAL_PAGES: Cell<u32> = const { Cell::new(0) };
}

/// SQLite's WAL hook: called in the committing thread, after each commit, with the number of
/// pages in the WAL.
fn wal_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(u32::try_from(pages).unwrap_or(0)));
    Ok(())
}

/// Makes `conn` (the writer's) report the WAL's size after each commit. The hook takes the
/// place of SQLite's automatic checkpoint on this connection.
pub(crate) fn watch(conn: &Connection) {
    conn.wal_hook(Some(wal_pages));
}

/// Forgets the last commit's report: a commit that fails reports nothing.
pub(crate) fn before_commit() {
    WAL_PAGES.with(|p| p.set(0));
}

/// Whether the commit just made on this thread took the WAL past [`CHECKPOINT_PAGES`].
pub(crate) fn due() -> bool {
    WAL_PAGES.with(Cell::get) >= CHECKPOINT_PAGES
}

/// Copies what it can of the WAL into the database file, without waiting for readers, as
/// SQLite's automatic checkpoint does. A checkpoint that fails fails nothing: the commit's
/// pages are in the synced WAL, and the next commit past the limit tries again. Failures are
/// logged when they begin, not at each commit.
pub(crate) fn run(conn: &Connection) {
    static FAILING: AtomicBool = AtomicBool::new(false);
    let failed = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .err();
    let was_failing = FAILING.swap(failed.is_some(), Ordering::Relaxed);
    if let (Some(e), false) = (&failed, was_failing) {
        tracing::warn!("checkpointing the session store failed: {e}");
    }
}
