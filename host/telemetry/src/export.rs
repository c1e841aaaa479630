//! The bounded queue between steps and the collector.
//!
//! A step hands its finished spans over with [`Sender::push`], which never waits: when the
//! queue is full the span is dropped and counted. One thread batches what is queued and
//! exports each batch within the timeout on a small runtime of its own, so a collector that is
//! down or slow costs the steps nothing but the spans it could not take (also counted).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};

/// What became of the spans, since the daemon started.
#[derive(Debug, Default)]
pub struct Counts {
    /// Spans exported (the collector took them).
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Spans dropped because their export failed or timed out.
    pub dropped_export_failed: AtomicU64,
    /// Exports that failed or timed out.
    pub failed_exports: AtomicU64,
}

/// Spans waiting for export, and flushes asked for.
#[derive(Default)]
struct Buffer {
    spans: Vec<SpanData>,
    /// Answered once what was queued before them is exported.
    flushes: Vec<std::sync::mpsc::Sender<()>>,
    /// The last sender is gone: export what is left and stop.
    closed: bool,
}

/// The queue the steps and the worker share: a buffer under a lock the steps hold only to
/// append. The worker is woken when a batch is full or a flush is asked for, else it wakes on
/// its own every batch delay: a step never pays a wake-up (a syscall) per span.
pub(crate) struct Queue {
    buffer: Mutex<Buffer>,
    ready: Condvar,
    capacity: usize,
    batch_size: usize,
    counts: Arc<Counts>,
}

/// The steps' end of the queue.
#[derive(Clone)]
pub(crate) struct Sender {
    queue: Arc<Queue>,
}

fn lock(m: &Mutex<Buffer>) -> std::sync::MutexGuard<'_, Buffer> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sender {
    pub(crate) fn new(
        capacity: usize,
        batch_size: usize,
        counts: Arc<Counts>,
    ) -> (Sender, Arc<Queue>) {
        let queue = Arc::new(Queue {
            buffer: Mutex::new(Buffer::default()),
            ready: Condvar::new(),
            capacity,
            batch_size,
            counts,
        });
        (
            Sender {
                queue: queue.clone(),
            },
            queue,
        )
    }

    /// Whether the queue is full: a step then makes no spans, and counts them dropped
    /// ([`Sender::dropped`]) — a collector that is down costs the steps next to nothing.
    pub(crate) fn full(&self) -> bool {
        lock(&self.queue.buffer).spans.len() >= self.queue.capacity
    }

    /// Counts `n` spans dropped because the queue was full.
    pub(crate) fn dropped(&self, n: u64) {
        self.queue
            .counts
            .dropped_queue_full
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Queues `span`, or counts it dropped when the queue is full.
    pub(crate) fn push(&self, span: SpanData) {
        self.push_all(std::iter::once(span));
    }

    /// Queues `spans` (a step's, at once); those that find the queue full are dropped and
    /// counted.
    pub(crate) fn push_all(&self, spans: impl IntoIterator<Item = SpanData>) {
        let q = &self.queue;
        let mut dropped = 0u64;
        let mut buffer = lock(&q.buffer);
        let before = buffer.spans.len();
        for span in spans {
            if buffer.spans.len() < q.capacity {
                buffer.spans.push(span);
            } else {
                dropped += 1;
            }
        }
        let full = before < q.batch_size && buffer.spans.len() >= q.batch_size;
        drop(buffer);
        if full {
            q.ready.notify_one();
        }
        if dropped > 0 {
            q.counts
                .dropped_queue_full
                .fetch_add(dropped, Ordering::Relaxed);
        }
    }

    /// Asks the worker to export what is queued, waiting at most `wait`.
    pub(crate) fn flush(&self, wait: Duration) {
        let (ack, done) = std::sync::mpsc::channel();
        lock(&self.queue.buffer).flushes.push(ack);
        self.queue.ready.notify_one();
        let _ = done.recv_timeout(wait);
    }

    /// Tells the worker to export what is left and stop.
    pub(crate) fn close(&self) {
        lock(&self.queue.buffer).closed = true;
        self.queue.ready.notify_one();
    }
}

/// The exporting thread's state.
pub(crate) struct Worker {
    pub(crate) queue: Arc<Queue>,
    pub(crate) exporter: opentelemetry_otlp::SpanExporter,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) batch_delay: Duration,
    pub(crate) timeout: Duration,
    pub(crate) endpoint: String,
    /// Called about every 250 ms (spans waiting for their reply are ended here); false once
    /// telemetry is gone.
    pub(crate) tick: Box<dyn Fn() -> bool + Send>,
}

/// How often the worker wakes when nothing is queued.
const TICK: Duration = Duration::from_millis(250);

impl Worker {
    /// Runs until telemetry is closed or gone, exporting what is left before it returns.
    pub(crate) fn run(mut self) {
        let mut warned: Option<Instant> = None;
        let mut next_tick = Instant::now() + TICK;
        let mut due = Instant::now() + self.batch_delay;
        loop {
            let (spans, flushes, closed) = {
                let q = &self.queue;
                let mut buffer = lock(&q.buffer);
                loop {
                    let now = Instant::now();
                    let ready = buffer.spans.len() >= q.batch_size
                        || !buffer.flushes.is_empty()
                        || buffer.closed
                        || (now >= due && !buffer.spans.is_empty())
                        || now >= next_tick;
                    if ready {
                        break;
                    }
                    let wake = due.max(now).min(next_tick);
                    buffer = q
                        .ready
                        .wait_timeout(buffer, wake.saturating_duration_since(now))
                        .map(|(b, _)| b)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
                let now = Instant::now();
                let take = buffer.spans.len() >= q.batch_size
                    || !buffer.flushes.is_empty()
                    || buffer.closed
                    || now >= due;
                let spans = match take {
                    true => std::mem::take(&mut buffer.spans),
                    false => Vec::new(),
                };
                (spans, std::mem::take(&mut buffer.flushes), buffer.closed)
            };
            if !spans.is_empty() {
                due = Instant::now() + self.batch_delay;
                let mut spans = spans;
                while !spans.is_empty() {
                    let rest = spans.split_off(spans.len().min(self.queue.batch_size));
                    self.export(spans, &mut warned);
                    spans = rest;
                }
            } else if Instant::now() >= due {
                due = Instant::now() + self.batch_delay;
            }
            for ack in flushes {
                let _ = ack.send(());
            }
            if closed {
                return;
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + TICK;
                if !(self.tick)() {
                    let left = std::mem::take(&mut lock(&self.queue.buffer).spans);
                    if !left.is_empty() {
                        self.export(left, &mut warned);
                    }
                    return;
                }
            }
        }
    }

    fn export(&mut self, spans: Vec<SpanData>, warned: &mut Option<Instant>) {
        let n = spans.len() as u64;
        let counts = &self.queue.counts;
        let exporter = &self.exporter;
        let timeout = self.timeout;
        let result = self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, exporter.export(spans)).await });
        let error = match result {
            Ok(Ok(())) => {
                counts.exported.fetch_add(n, Ordering::Relaxed);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", timeout.as_millis()),
        };
        self.queue
            .counts
            .dropped_export_failed
            .fetch_add(n, Ordering::Relaxed);
        self.queue
            .counts
            .failed_exports
            .fetch_add(1, Ordering::Relaxed);
        // Once a minute at most: a collector that is down must not flood the daemon's log.
        if warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
            *warned = Some(Instant::now());
            tracing::warn!(
                endpoint = %self.endpoint,
                error = %error,
                spans = n,
                "telemetry: exporting spans failed; they are dropped (counted at /metrics)"
            );
        }
    }
}
