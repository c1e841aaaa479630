//! Group commit (Q11): the caller that finds no write in progress becomes the writer, takes
//! everything queued (its own job and any others, from all sessions), writes it in one
//! transaction and one sync, then hands each queued job its result. A caller that finds a
//! write in progress queues its job and waits; when that write ends, its job is either done
//! or the next writer takes it.
//!
//! Alone, a step's append so costs no thread switch at all (a writer thread meant a wake of
//! that thread and a wake back per append: issue 50 counted 14 `futex` calls per short step);
//! under load, the appends that queue behind a sync still share the next one. A write that
//! ends wakes exactly the callers it wrote for, and the oldest one still queued to write next
//! (waking every waiter cost 8% of the steps at 16 clients).
//!
//! A caller that must not block (a step planned on the async runtime) queues a deferred job
//! instead ([`GroupCommit::submit_then`]): it returns at once, and whoever writes the job
//! gives its result to the job's callback. When no write is in progress the store's writer
//! thread is woken to write it: one wake per batch, not per job.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{Thread, ThreadId};

use promptd_core::store::{AppendDone, StoreError};
use promptd_core::sync::lock;
use rusqlite::Connection;

use crate::keys::Keys;
use crate::{write_group, Files, Job, Written, MAX_BATCH};

/// The write connection and the queue of jobs waiting for it.
pub(crate) struct GroupCommit {
    queue: Mutex<Queue>,
    /// The write connection and its view of the events past the index ([`crate::keys`]).
    /// Only the caller writing (`Queue::writing`) locks it: never contended.
    conn: Mutex<(Connection, Keys)>,
    /// Test hook: how many commits to fail on purpose.
    pub(crate) fail_commits: AtomicU32,
    /// Test hook: what to run inside the next commit.
    pub(crate) during_commit: Mutex<Option<DuringCommit>>,
    /// How many batches were written (the tests see that appends share them).
    pub(crate) batches: AtomicU64,
    /// The thread that writes deferred jobs when no caller is writing ([`GroupCommit::start`]).
    writer: OnceLock<Thread>,
    /// Set when the store closes: the writer thread ends.
    stop: AtomicBool,
}

/// What a test runs inside a commit ([`crate::SqliteStore::during_next_commit`]).
pub(crate) type DuringCommit = Box<dyn FnOnce() + Send>;

/// Who waits for a job's result.
enum Waiter {
    /// A caller parked in [`GroupCommit::submit`]: its result is left in `Queue::results`.
    Caller(Thread),
    /// A deferred append ([`GroupCommit::submit_then`]): its result goes to the callback.
    Then(AppendDone),
}

#[derive(Default)]
struct Queue {
    /// The next job's ticket.
    next: u64,
    /// Jobs not taken by a write yet, oldest first, each with who waits for it.
    jobs: VecDeque<(u64, Job, Waiter)>,
    /// Results of written jobs whose callers have not taken them yet.
    results: HashMap<u64, Result<Written, StoreError>>,
    /// Whether a caller is writing.
    writing: bool,
    /// The writer's buffers, kept from one batch to the next (each at most [`MAX_BATCH`]
    /// long): a short step's batch of one would otherwise allocate five.
    spare: Spare,
}

/// The buffers a batch is written with; empty between batches.
#[derive(Default)]
struct Spare {
    batch: Vec<(u64, Job)>,
    waiters: Vec<(u64, Waiter)>,
    results: Vec<Result<Written, StoreError>>,
    callbacks: Vec<(AppendDone, Result<Written, StoreError>)>,
    wake: Vec<Thread>,
}

impl GroupCommit {
    pub(crate) fn new(conn: Connection, keys: Keys) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            conn: Mutex::new((conn, keys)),
            fail_commits: AtomicU32::new(0),
            during_commit: Mutex::new(None),
            batches: AtomicU64::new(0),
            writer: OnceLock::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// Starts the writer thread of deferred jobs. It holds the group weakly, so it ends when
    /// the store is dropped ([`GroupCommit::close`]).
    pub(crate) fn start(self: &Arc<Self>, files: Arc<Files>) -> std::io::Result<()> {
        let group = Arc::downgrade(self);
        let thread = std::thread::Builder::new()
            .name("promptd-store-writer".into())
            .spawn(move || loop {
                std::thread::park();
                let Some(group) = group.upgrade() else {
                    return;
                };
                if group.stop.load(Ordering::Acquire) {
                    return;
                }
                let me = std::thread::current().id();
                let mut queue = lock(&group.queue);
                while !queue.writing && !queue.jobs.is_empty() {
                    queue = group.lead(&files, queue, me);
                }
            })?;
        let _ = self.writer.set(thread.thread().clone());
        Ok(())
    }

    /// Ends the writer thread (deferred jobs still queued are never written: their callbacks
    /// are dropped, which their callers see as a failure, not an acknowledgement).
    pub(crate) fn close(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    /// Writes `job` with whatever else is queued, durable (and the files checked, Q12) before
    /// it returns.
    pub(crate) fn submit(&self, files: &Files, job: Job) -> Result<Written, StoreError> {
        let me = std::thread::current();
        let mut queue = lock(&self.queue);
        let ticket = queue.next;
        queue.next += 1;
        queue
            .jobs
            .push_back((ticket, job, Waiter::Caller(me.clone())));
        loop {
            if let Some(result) = queue.results.remove(&ticket) {
                return result;
            }
            if queue.writing {
                // Woken by the write that took this job, or to write the next batch; a wake
                // that comes first makes `park` return at once (and a spurious one loops).
                drop(queue);
                std::thread::park();
                queue = lock(&self.queue);
                continue;
            }
            queue = self.lead(files, queue, me.id());
        }
    }

    /// Queues the append `job` and returns at once: `then` gets its result once it is written
    /// (durable, the files checked), from the thread that writes it — a caller writing its own
    /// batch, or the writer thread, woken when no write is in progress.
    pub(crate) fn submit_then(&self, job: Job, then: AppendDone) {
        let mut queue = lock(&self.queue);
        let ticket = queue.next;
        queue.next += 1;
        queue.jobs.push_back((ticket, job, Waiter::Then(then)));
        let idle = !queue.writing;
        drop(queue);
        if idle {
            if let Some(writer) = self.writer.get() {
                writer.unpark();
            }
        }
    }

    /// Writes a batch of what is queued (the caller holds `queue`, no write in progress) and
    /// hands out its results: a caller's is left for it and the caller woken, a deferred
    /// job's given to its callback. Then wakes whoever writes next: the oldest job still
    /// queued's caller, or the writer thread for a deferred one. `me` is not woken (it
    /// loops). Returns the queue locked again.
    fn lead<'q>(
        &'q self,
        files: &Files,
        mut queue: MutexGuard<'q, Queue>,
        me: ThreadId,
    ) -> MutexGuard<'q, Queue> {
        queue.writing = true;
        let n = queue.jobs.len().min(MAX_BATCH);
        let mut spare = std::mem::take(&mut queue.spare);
        for (ticket, job, waiter) in queue.jobs.drain(..n) {
            spare.batch.push((ticket, job));
            spare.waiters.push((ticket, waiter));
        }
        drop(queue);
        self.write(files, &spare.batch, &mut spare.results);
        // The events go before any caller wakes: a step may hold a large message's other
        // copies then.
        spare.batch.clear();
        queue = lock(&self.queue);
        queue.writing = false;
        for ((ticket, waiter), result) in spare.waiters.drain(..).zip(spare.results.drain(..)) {
            match waiter {
                Waiter::Caller(caller) => {
                    queue.results.insert(ticket, result);
                    spare.wake.push(caller);
                }
                Waiter::Then(then) => spare.callbacks.push((then, result)),
            }
        }
        let next = queue.jobs.front().and_then(|(_, _, waiter)| match waiter {
            Waiter::Caller(caller) => Some(caller.clone()),
            Waiter::Then(_) => self.writer.get().cloned(),
        });
        drop(queue);
        for thread in spare.wake.drain(..).chain(next) {
            if thread.id() != me {
                thread.unpark();
            }
        }
        for (then, result) in spare.callbacks.drain(..) {
            // A callback that panics must not take the writer with it.
            let _ = catch_unwind(AssertUnwindSafe(|| then(result.map(drop))));
        }
        let mut queue = lock(&self.queue);
        queue.spare = spare;
        queue
    }

    /// Writes one batch, leaving each job's result in `results` in the batch's order, whatever
    /// happens (a panic while writing fails the batch rather than leaving its callers
    /// waiting).
    fn write(
        &self,
        files: &Files,
        batch: &[(u64, Job)],
        results: &mut Vec<Result<Written, StoreError>>,
    ) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut writer = lock(&self.conn);
            let (conn, keys) = &mut *writer;
            let fail = self.fail_commits.load(Ordering::SeqCst) > 0;
            if fail {
                self.fail_commits.fetch_sub(1, Ordering::SeqCst);
            }
            let during = lock(&self.during_commit).take();
            write_group(conn, keys, batch, (fail, during), files, results)
        }));
        let failed = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => {
                // The commit failed (or went to a lost file): nothing of the batch is on
                // disk, so nothing is acknowledged.
                match e {
                    StoreError::Backend { context, source } => (context, source.to_string()),
                    other => ("committing".to_string(), other.to_string()),
                }
            }
            Err(_) => (
                "writing a batch".to_string(),
                "the writer panicked".to_string(),
            ),
        };
        results.clear();
        let (context, message) = failed;
        results.extend(
            batch
                .iter()
                .map(|_| Err(StoreError::backend(context.clone(), message.clone()))),
        );
    }
}
