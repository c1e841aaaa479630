//! The bounded queue between steps and the collector.
//!
//! A step hands its finished spans over with [`Sender::push`], which never waits: when the
//! queue is full the span is dropped and counted. One thread batches what is queued and
//! exports each batch within the timeout on a small runtime of its own, so a collector that is
//! down or slow costs the steps nothing but the spans it could not take (also counted).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
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

pub(crate) enum Msg {
    Span(Box<SpanData>),
    /// Export everything queued so far, then answer.
    Flush(std::sync::mpsc::Sender<()>),
}

/// The steps' end of the queue.
#[derive(Clone)]
pub(crate) struct Sender {
    tx: SyncSender<Msg>,
    counts: Arc<Counts>,
}

impl Sender {
    pub(crate) fn new(capacity: usize, counts: Arc<Counts>) -> (Sender, Receiver<Msg>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        (Sender { tx, counts }, rx)
    }

    /// Queues `span`, or counts it dropped when the queue is full.
    pub(crate) fn push(&self, span: SpanData) {
        if self.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            self.counts
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the worker to export what is queued, waiting at most `wait`.
    pub(crate) fn flush(&self, wait: Duration) {
        let (ack, done) = std::sync::mpsc::channel();
        let sent = match self.tx.try_send(Msg::Flush(ack.clone())) {
            Ok(()) => true,
            // A full queue: wait for room, as long as the flush may take.
            Err(TrySendError::Full(msg)) => {
                let deadline = Instant::now() + wait;
                let mut msg = msg;
                loop {
                    match self.tx.try_send(msg) {
                        Ok(()) => break true,
                        Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                            msg = m;
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(_) => break false,
                    }
                }
            }
            Err(TrySendError::Disconnected(_)) => false,
        };
        if sent {
            let _ = done.recv_timeout(wait);
        }
    }
}

/// The exporting thread's state.
pub(crate) struct Worker {
    pub(crate) rx: Receiver<Msg>,
    pub(crate) exporter: opentelemetry_otlp::SpanExporter,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) counts: Arc<Counts>,
    pub(crate) batch_size: usize,
    pub(crate) batch_delay: Duration,
    pub(crate) timeout: Duration,
    pub(crate) endpoint: String,
    /// Called about every 250 ms (spans waiting for their reply are ended here).
    pub(crate) tick: Box<dyn Fn() -> bool + Send>,
}

/// How often the worker wakes when nothing is queued.
const TICK: Duration = Duration::from_millis(250);

impl Worker {
    /// Runs until every sender is gone (the daemon shut telemetry down), exporting what is
    /// left before it returns.
    pub(crate) fn run(mut self) {
        let mut batch: Vec<SpanData> = Vec::with_capacity(self.batch_size);
        let mut due: Option<Instant> = None;
        let mut next_tick = Instant::now() + TICK;
        let mut warned: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + TICK;
                if !(self.tick)() {
                    // Telemetry is gone: export the rest, then stop.
                    while let Ok(msg) = self.rx.try_recv() {
                        if let Msg::Span(s) = msg {
                            batch.push(*s);
                        }
                    }
                    self.export(&mut batch, &mut warned);
                    return;
                }
            }
            let wake = due.map_or(next_tick, |d| d.min(next_tick));
            match self.rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Msg::Span(span)) => {
                    due.get_or_insert_with(|| Instant::now() + self.batch_delay);
                    batch.push(*span);
                    if batch.len() >= self.batch_size {
                        self.export(&mut batch, &mut warned);
                        due = None;
                    }
                }
                Ok(Msg::Flush(ack)) => {
                    while let Ok(msg) = self.rx.try_recv() {
                        match msg {
                            Msg::Span(s) => {
                                batch.push(*s);
                                if batch.len() >= self.batch_size {
                                    self.export(&mut batch, &mut warned);
                                }
                            }
                            Msg::Flush(other) => drop(other.send(())),
                        }
                    }
                    self.export(&mut batch, &mut warned);
                    due = None;
                    let _ = ack.send(());
                }
                Err(RecvTimeoutError::Timeout) => {
                    if due.is_some_and(|d| Instant::now() >= d) {
                        self.export(&mut batch, &mut warned);
                        due = None;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.export(&mut batch, &mut warned);
                    return;
                }
            }
        }
    }

    fn export(&mut self, batch: &mut Vec<SpanData>, warned: &mut Option<Instant>) {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::replace(batch, Vec::with_capacity(self.batch_size));
        let n = spans.len() as u64;
        let exporter = &self.exporter;
        let timeout = self.timeout;
        let result = self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, exporter.export(spans)).await });
        let error = match result {
            Ok(Ok(())) => {
                self.counts.exported.fetch_add(n, Ordering::Relaxed);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", timeout.as_millis()),
        };
        self.counts
            .dropped_export_failed
            .fetch_add(n, Ordering::Relaxed);
        self.counts.failed_exports.fetch_add(1, Ordering::Relaxed);
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
