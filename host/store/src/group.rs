//! Group commit (Q11) without a writer thread: the caller that finds no write in progress
//! becomes the writer, takes everything queued (its own job and any others, from all
//! sessions), writes it in one transaction and one sync, then hands each queued caller its
//! result and wakes those that wait. A caller that finds a write in progress queues its job
//! and waits; when that write ends, its job is either done or the next writer takes it.
//!
//! Alone, a step's append so costs no thread switch at all (a writer thread meant a wake of
//! that thread and a wake back per append: issue 50 counted 14 `futex` calls per short step);
//! under load, the appends that queue behind a sync still share the next one. A write that
//! ends wakes exactly the callers it wrote for, and the oldest one still queued to write next
//! (waking every waiter cost 8% of the steps at 16 clients).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::Thread;

use promptd_core::store::StoreError;
use promptd_core::sync::lock;
use rusqlite::Connection;

use crate::{write_group, Files, Job, Written, MAX_BATCH};

/// The write connection and the queue of jobs waiting for it.
pub(crate) struct GroupCommit {
    queue: Mutex<Queue>,
    /// Only the caller writing (`Queue::writing`) locks it: never contended.
    conn: Mutex<Connection>,
    /// Test hook: how many commits to fail on purpose.
    pub(crate) fail_commits: AtomicU32,
    /// How many batches were written (the tests see that appends share them).
    pub(crate) batches: AtomicU64,
}

#[derive(Default)]
struct Queue {
    /// The next job's ticket.
    next: u64,
    /// Jobs not taken by a write yet, oldest first, each with its caller (to wake).
    jobs: VecDeque<(u64, Job, Thread)>,
    /// Results of written jobs whose callers have not taken them yet.
    results: HashMap<u64, Result<Written, StoreError>>,
    /// Whether a caller is writing.
    writing: bool,
}

impl GroupCommit {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            conn: Mutex::new(conn),
            fail_commits: AtomicU32::new(0),
            batches: AtomicU64::new(0),
        }
    }

    /// Writes `job` with whatever else is queued, durable (and the files checked, Q12) before
    /// it returns.
    pub(crate) fn submit(&self, files: &Files, job: Job) -> Result<Written, StoreError> {
        let me = std::thread::current();
        let mut queue = lock(&self.queue);
        let ticket = queue.next;
        queue.next += 1;
        queue.jobs.push_back((ticket, job, me.clone()));
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
            queue.writing = true;
            let n = queue.jobs.len().min(MAX_BATCH);
            let mut callers = Vec::with_capacity(n);
            let batch: Vec<(u64, Job)> = (queue.jobs.drain(..n))
                .map(|(ticket, job, caller)| {
                    callers.push(caller);
                    (ticket, job)
                })
                .collect();
            drop(queue);
            let results = self.write(files, batch);
            queue = lock(&self.queue);
            queue.writing = false;
            queue.results.extend(results);
            let next = queue.jobs.front().map(|(_, _, caller)| caller.clone());
            drop(queue);
            for caller in callers.iter().chain(&next) {
                if caller.id() != me.id() {
                    caller.unpark();
                }
            }
            queue = lock(&self.queue);
        }
    }

    /// Writes one batch; every job gets a result, whatever happens (a panic while writing
    /// fails the batch rather than leaving its callers waiting).
    fn write(
        &self,
        files: &Files,
        batch: Vec<(u64, Job)>,
    ) -> Vec<(u64, Result<Written, StoreError>)> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut conn = lock(&self.conn);
            let fail = self.fail_commits.load(Ordering::SeqCst) > 0;
            if fail {
                self.fail_commits.fetch_sub(1, Ordering::SeqCst);
            }
            write_group(&mut conn, &batch, fail, files)
        }));
        let tickets = batch.iter().map(|(ticket, _)| *ticket);
        let results: Vec<_> = match outcome {
            Ok(Ok(results)) => tickets.zip(results).collect(),
            Ok(Err(e)) => {
                // The commit failed (or went to a lost file): nothing of the batch is on
                // disk, so nothing is acknowledged.
                let (context, message) = match &e {
                    StoreError::Backend { context, source } => {
                        (context.clone(), source.to_string())
                    }
                    other => ("committing".to_string(), other.to_string()),
                };
                let error = || StoreError::backend(context.clone(), message.clone());
                tickets.map(|ticket| (ticket, Err(error()))).collect()
            }
            Err(_) => {
                let error = || StoreError::backend("writing a batch", "the writer panicked");
                tickets.map(|ticket| (ticket, Err(error()))).collect()
            }
        };
        // The events go before any caller wakes: a step may hold a large message's other
        // copies then.
        drop(batch);
        results
    }
}
