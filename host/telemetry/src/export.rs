//! The bounded queue between steps and the collector.
//!
//! A step hands its finished spans over with [`Sender::push`], which never waits: when the
//! queue is full the span is dropped and counted. One thread batches what is queued and
//! exports each batch within the timeout on a small runtime of its own, so a collector that is
//! down or slow costs the steps nothing but the spans it could not take (also counted).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

use crate::transport::Transport;

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
    pub(crate) transport: Transport,
    /// The resource every span is of.
    pub(crate) resource: Resource,
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

/// The pause after a failed export, doubled on each failure in a row up to [`MOST_PAUSE`]:
/// while it lasts the queue fills and then steps make no spans at all, so a collector that is
/// down costs them next to nothing (instead of every span built, encoded and refused).
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const MOST_PAUSE: Duration = Duration::from_secs(30);

impl Worker {
    /// Runs until telemetry is closed or gone, exporting what is left before it returns.
    pub(crate) fn run(mut self) {
        let mut warned: Option<Instant> = None;
        let mut next_tick = Instant::now() + TICK;
        let mut due = Instant::now() + self.batch_delay;
        // After a failed export: no export before this (a flush or the close still exports).
        let mut paused: Option<(Instant, Duration)> = None;
        loop {
            let (spans, flushes, closed) = {
                let q = &self.queue;
                let mut buffer = lock(&q.buffer);
                loop {
                    let now = Instant::now();
                    let pause = paused.map(|(until, _)| until).filter(|&u| now < u);
                    let ready = !buffer.flushes.is_empty()
                        || buffer.closed
                        || now >= next_tick
                        || (pause.is_none()
                            && (buffer.spans.len() >= q.batch_size
                                || (now >= due && !buffer.spans.is_empty())));
                    if ready {
                        break;
                    }
                    // Nothing queued: sleep to the tick (a span that comes meanwhile is past its
                    // due time then, and goes at once), never spin on a due time gone by.
                    let wake = match buffer.spans.is_empty() {
                        true => next_tick,
                        false => pause.unwrap_or(due).max(now).min(next_tick),
                    };
                    buffer = q
                        .ready
                        .wait_timeout(buffer, wake.saturating_duration_since(now))
                        .map(|(b, _)| b)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
                let now = Instant::now();
                let pause = paused.is_some_and(|(until, _)| now < until);
                let take = !buffer.flushes.is_empty()
                    || buffer.closed
                    || (!pause && (buffer.spans.len() >= q.batch_size || now >= due));
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
                    if self.export(spans, &mut warned) {
                        paused = None;
                        spans = rest;
                    } else {
                        // The rest would meet the same collector: dropped and counted, and
                        // nothing is sent until the pause is over.
                        self.failed(rest.len() as u64, false);
                        let pause = paused.map_or(FIRST_PAUSE, |(_, p)| (p * 2).min(MOST_PAUSE));
                        paused = Some((Instant::now() + pause, pause));
                        break;
                    }
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
                        let _ = self.export(left, &mut warned);
                    }
                    return;
                }
            }
        }
    }

    /// Counts `n` spans dropped because their export failed (`attempt`: one more export failed).
    fn failed(&self, n: u64, attempt: bool) {
        let counts = &self.queue.counts;
        if n > 0 {
            counts.dropped_export_failed.fetch_add(n, Ordering::Relaxed);
        }
        if attempt {
            counts.failed_exports.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Exports `spans`; whether the collector took them (else they are counted dropped).
    fn export(&mut self, spans: Vec<SpanData>, warned: &mut Option<Instant>) -> bool {
        let n = spans.len() as u64;
        let counts = &self.queue.counts;
        let body = crate::wire::request(&self.resource, &spans);
        drop(spans);
        let transport = &self.transport;
        let timeout = self.timeout;
        let result = self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, transport.send(body)).await });
        let error = match result {
            Ok(Ok(())) => {
                counts.exported.fetch_add(n, Ordering::Relaxed);
                return true;
            }
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {} ms", timeout.as_millis()),
        };
        self.failed(n, true);
        // Once a minute at most: a collector that is down must not flood the daemon's log.
        if warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
            *warned = Some(Instant::now());
            tracing::warn!(
                endpoint = %self.endpoint,
                error = %error,
                spans = n,
                "telemetry: exporting spans failed; they are dropped (counted at /metrics), and \
                 the next export waits (1 s, doubling to 30 s while it goes on failing)"
            );
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::AtomicUsize;

    use opentelemetry::trace::{SpanContext, SpanKind, Status};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use promptd_core::config::telemetry::Protocol;

    use super::*;

    fn span() -> SpanData {
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("s"),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: vec![],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("test").build(),
        }
    }

    /// A collector that answers every export `503` and counts them.
    fn refusing_collector() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut buf = [0u8; 65536];
                // One request per connection: read its head (the bodies here are small).
                let _ = conn.read(&mut buf);
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = conn.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        (url, count)
    }

    #[test]
    fn after_a_failed_export_the_next_waits_and_meanwhile_a_full_queue_drops() {
        let (url, requests) = refusing_collector();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let transport = {
            let _in = runtime.enter();
            Transport::new(
                Protocol::HttpProtobuf,
                &url,
                &Default::default(),
                Duration::from_secs(2),
            )
            .expect("transport")
        };
        let counts = Arc::new(Counts::default());
        let (sender, queue) = Sender::new(20, 5, counts.clone());
        let worker = Worker {
            queue,
            transport,
            resource: Resource::builder_empty().build(),
            runtime: runtime.handle().clone(),
            batch_delay: Duration::from_millis(10),
            timeout: Duration::from_secs(2),
            endpoint: url,
            tick: Box::new(|| true),
        };
        let thread = std::thread::spawn(move || worker.run());
        // 2.5 s of a span every 5 ms: without the pause, an export every 10 ms at least.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(2500) {
            sender.push(span());
            std::thread::sleep(Duration::from_millis(5));
        }
        // Exports at about 0 s, 1 s and 3 s: two have been tried by now.
        let tried = requests.load(Ordering::SeqCst);
        assert!((1..=3).contains(&tried), "{tried} exports tried");
        assert_eq!(counts.failed_exports.load(Ordering::SeqCst) as usize, tried);
        assert!(counts.dropped_queue_full.load(Ordering::SeqCst) > 100);
        assert!(counts.dropped_export_failed.load(Ordering::SeqCst) > 0);
        assert_eq!(counts.exported.load(Ordering::SeqCst), 0);
        // A close still exports what is left, pause or not.
        sender.close();
        thread.join().expect("worker");
        assert_eq!(requests.load(Ordering::SeqCst), tried + 1);
    }
}
