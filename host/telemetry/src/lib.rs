//! OpenTelemetry export of promptd's steps (docs/telemetry.md).
//!
//! The daemon tells [`Telemetry`] what each step, recorded message and new session was, as
//! plain data ([`StepRecord`], [`RecordRecord`]); telemetry makes the spans after the GenAI
//! semantic conventions ([`spans`]) and hands them to a bounded queue that one thread exports
//! over OTLP ([`export`]). Nothing here runs on a step's path but building the spans and a
//! queue push that never waits: a collector that is down or slow never slows or fails a step,
//! and what it cannot take is counted ([`Counts`]).
//!
//! A step's `chat` span waits (bounded, `reply_wait`) for the reply to be recorded, so it
//! carries the provider's token counts, the cache outcome and the cost, and spans the model
//! call as the client made it.

mod export;
mod ids;
mod metrics;
mod observer;
mod settings;
pub mod spans;
mod transport;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData};
use opentelemetry_sdk::Resource;
use promptd_core::config::telemetry::Protocol;

pub use export::Counts;
pub use ids::{ratio_sampled, session_span, session_trace, step_span, Parent};
pub use metrics::{Sample, Source};
pub use observer::Observer;
pub use settings::Settings;
pub use spans::{PrefixFacts, RecordRecord, Sampled, StepContent, StepRecord, Timed, Work};

use spans::{kv, Place, SpanParts};

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A setting (config or environment) is invalid.
    #[error("telemetry setting {0}")]
    Config(String),
    /// The OTLP exporter could not be built.
    #[error("building the OTLP {signal} exporter for {endpoint}: {source}")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// Where it would export.
        endpoint: String,
        /// What the exporter said.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The trace transport could not be built (a bad endpoint or header).
    #[error("the OTLP trace export to {endpoint}: {source}")]
    Transport {
        /// Where it would export.
        endpoint: String,
        /// What was wrong.
        #[source]
        source: transport::BuildError,
    },
    /// The export thread or its runtime could not start.
    #[error("starting the export thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl TelemetryError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            TelemetryError::Config(_) => "telemetry_config",
            TelemetryError::Exporter { .. } | TelemetryError::Transport { .. } => {
                "telemetry_exporter"
            }
            TelemetryError::Thread(_) => "telemetry_thread",
        }
    }
}

/// Most steps' spans waiting for their reply at once; past it the oldest is exported
/// without one.
const MAX_WAITING: usize = 4096;

/// A step's `chat` span, finished but for the reply.
struct Waiting {
    span: SpanData,
    step: u64,
    /// Export it without a reply after this.
    deadline: Instant,
}

struct Inner {
    settings: Settings,
    sender: export::Sender,
    counts: Arc<Counts>,
    scope: InstrumentationScope,
    ids: RandomIdGenerator,
    /// By session: its last step's span, until its reply is recorded.
    waiting: Mutex<HashMap<Arc<str>, Waiting>>,
    /// Keys and texts spans share.
    keys: spans::Keys,
    /// The daemon's base URL in links (`public_url`, else where it listens).
    public_url: std::sync::RwLock<String>,
}

/// The exporter of one daemon (see the crate docs).
pub struct Telemetry {
    inner: Arc<Inner>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    meters: Mutex<Option<opentelemetry_sdk::metrics::SdkMeterProvider>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The export headers as gRPC metadata (lower-case keys; a header gRPC cannot carry is left
/// out).
fn grpc_metadata(headers: &HashMap<String, String>) -> tonic::metadata::MetadataMap {
    let mut m = tonic::metadata::MetadataMap::new();
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            v.parse(),
        ) {
            m.insert(k, v);
        }
    }
    m
}

impl Telemetry {
    /// Starts exporting as `settings` say; `source` gives the counters to export as metrics.
    pub fn start(settings: Settings, source: Option<Source>) -> Result<Telemetry, TelemetryError> {
        // One worker thread: exports are rare and small, and must not take the daemon's cores.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("promptd-otlp")
            .enable_all()
            .build()
            .map_err(TelemetryError::Thread)?;
        let mut resource = Resource::builder().with_service_name(settings.service_name.clone());
        for (k, v) in &settings.resource {
            resource = resource.with_attribute(KeyValue::new(k.clone(), v.clone()));
        }
        let resource = resource.build();
        let timeout = settings.timeout;
        let exporter_error = |signal: &'static str, endpoint: &str| {
            let endpoint = endpoint.to_string();
            move |source| TelemetryError::Exporter {
                signal,
                endpoint,
                source,
            }
        };
        let headers: HashMap<String, String> = settings.headers.clone().into_iter().collect();
        // The gRPC client needs the runtime's reactor when it is built.
        let _entered = runtime.enter();
        let transport = transport::Transport::new(
            settings.protocol,
            &settings.traces_endpoint,
            &settings.trace_headers,
            timeout,
        )
        .map_err(|source| TelemetryError::Transport {
            endpoint: settings.traces_endpoint.clone(),
            source,
        })?;
        let counts = Arc::new(Counts::default());
        let (sender, queue) =
            export::Sender::new(settings.queue_size, settings.batch_size, counts.clone());
        let scope = InstrumentationScope::builder("promptd")
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(spans::semconv::SCHEMA_URL)
            .build();
        let inner = Arc::new(Inner {
            settings,
            sender,
            counts: counts.clone(),
            scope,
            ids: RandomIdGenerator::default(),
            waiting: Mutex::new(HashMap::new()),
            keys: spans::Keys::default(),
            public_url: std::sync::RwLock::new(String::new()),
        });
        *inner.public_url.write().unwrap_or_else(|p| p.into_inner()) =
            inner.settings.public_url.clone();
        let meters = match (inner.settings.metrics, source) {
            (true, Some(source)) => {
                let exporter = match inner.settings.protocol {
                    Protocol::HttpProtobuf => opentelemetry_otlp::MetricExporter::builder()
                        .with_http()
                        .with_endpoint(inner.settings.metrics_endpoint.clone())
                        .with_timeout(timeout)
                        .with_headers(headers.clone())
                        .build(),
                    Protocol::Grpc => opentelemetry_otlp::MetricExporter::builder()
                        .with_tonic()
                        .with_endpoint(inner.settings.metrics_endpoint.clone())
                        .with_timeout(timeout)
                        .with_metadata(grpc_metadata(&headers))
                        .build(),
                }
                .map_err(exporter_error("metrics", &inner.settings.metrics_endpoint))?;
                Some(metrics::provider(
                    exporter,
                    runtime.handle().clone(),
                    &inner.settings,
                    resource.clone(),
                    &with_own(source, Arc::downgrade(&inner)),
                ))
            }
            _ => None,
        };
        drop(_entered);
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let worker = export::Worker {
            queue,
            transport,
            resource,
            runtime: runtime.handle().clone(),
            batch_delay: inner.settings.batch_delay,
            timeout: inner.settings.timeout,
            endpoint: inner.settings.traces_endpoint.clone(),
            tick: Box::new(move || match weak.upgrade() {
                Some(inner) => {
                    inner.end_expired(Instant::now());
                    true
                }
                None => false,
            }),
        };
        let worker = std::thread::Builder::new()
            .name("promptd-otlp-export".into())
            .spawn(move || worker.run())
            .map_err(TelemetryError::Thread)?;
        Ok(Telemetry {
            inner,
            worker: Mutex::new(Some(worker)),
            meters: Mutex::new(meters),
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// Where the daemon listens, once bound (`http://127.0.0.1:8417`): the base of links in
    /// spans, unless the config's `public_url` says otherwise.
    pub fn set_listening(&self, base: &str, configured: bool) {
        if !configured {
            *self
                .inner
                .public_url
                .write()
                .unwrap_or_else(|p| p.into_inner()) = base.trim_end_matches('/').to_string();
        }
    }

    /// The resolved settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Whether message and system texts go into spans.
    pub fn captures_content(&self) -> bool {
        self.inner.settings.capture_content
    }

    /// What became of the spans so far.
    pub fn counts(&self) -> &Counts {
        &self.inner.counts
    }

    /// Steps' spans waiting for their reply now.
    pub fn waiting(&self) -> usize {
        lock(&self.inner.waiting).len()
    }

    /// Where session `session`'s spans (with the client's context `parent`) go, `None` when
    /// they are not exported: hand it to [`Telemetry::step`] in [`StepRecord::sampled`].
    pub fn sample(&self, session: &str, parent: Option<&Parent>) -> Option<Sampled> {
        self.inner.place(session, parent).map(Sampled)
    }

    /// A session was created: its `invoke_agent` span, the parent of its steps' spans (a
    /// client's trace context is linked, not followed: the session's trace is its own).
    pub fn session_created(
        &self,
        session: &str,
        agent: &str,
        at: SystemTime,
        parent: Option<&Parent>,
    ) {
        let trace = session_trace(session);
        if !ratio_sampled(trace, self.inner.settings.sample_ratio) {
            return;
        }
        let place = Place {
            trace,
            parent: SpanId::INVALID,
            remote: false,
        };
        let attributes = vec![
            kv(spans::semconv::GEN_AI_OPERATION_NAME, "invoke_agent"),
            kv(spans::semconv::GEN_AI_AGENT_NAME, agent.to_string()),
            kv(spans::semconv::GEN_AI_CONVERSATION_ID, session.to_string()),
            kv("session.id", session.to_string()),
            kv("openinference.span.kind", "AGENT"),
            kv("promptd.session", session.to_string()),
            kv("promptd.agent", agent.to_string()),
            kv(
                "promptd.session.url",
                format!("{}/v1/sessions/{session}", self.inner.public_url()),
            ),
        ];
        let mut span = spans::span(
            &self.inner.scope,
            SpanParts {
                name: format!("invoke_agent {agent}").into(),
                kind: SpanKind::Internal,
                place,
                id: session_span(session),
                time: (at, at),
                attributes,
                status: Status::Unset,
            },
        );
        if let Some(p) = parent {
            span.links
                .links
                .push(opentelemetry::trace::Link::with_context(p.0.clone()));
        }
        self.inner.sender.push(span);
    }

    /// `text` as spans share it (a plugin id, a hash, an agent): made once, then referenced.
    pub fn shared(&self, text: &str) -> Arc<str> {
        self.inner.keys.text(text)
    }

    /// A step ended: its `chat` span (waiting for the reply when it was served) and a span
    /// for each stage and plugin call; `usage` is the request's size by part.
    pub fn step(&self, r: &StepRecord, usage: Option<&promptd_core::budget::Usage>) {
        let inner = &self.inner;
        let Some(place) = r
            .sampled
            .map(|s| s.0)
            .or_else(|| inner.place(&r.session, r.parent.as_ref()))
        else {
            return;
        };
        let now = SystemTime::now();
        let (start, end) = (r.start.unwrap_or(now), r.end.unwrap_or(now));
        let served = r.error.is_none();
        if inner.sender.full() {
            // The collector is behind or down: the spans would only be dropped.
            inner.sender.dropped(r.timeline.len() as u64 + 1);
            return;
        }
        let id = match r.step {
            Some(n) if served => step_span(&r.session, n),
            _ => inner.ids.new_span_id(),
        };
        let mut out = Vec::with_capacity(r.timeline.len() + 2);
        let events = inner.children(place.trace, id, &r.timeline, &mut out);
        let url = match (r.step, r.format) {
            (Some(n), Some(f)) if served => Some(format!(
                "{}/v1/sessions/{}/steps/{n}/request?format={}",
                inner.public_url(),
                r.session,
                f.as_str()
            )),
            _ => None,
        };
        let name = match &r.model {
            Some(m) => format!("chat {m}"),
            None => "chat".to_string(),
        };
        let attributes = spans::step_attributes(r, usage, &inner.keys, url);
        let mut span = spans::span(
            &inner.scope,
            SpanParts {
                name: name.into(),
                kind: SpanKind::Client,
                place,
                id,
                time: (start, end),
                attributes,
                status: spans::status(r.error.as_ref()),
            },
        );
        span.events.events = events;
        match r.step {
            Some(step) if served && !inner.settings.reply_wait.is_zero() => {
                let waiting = Waiting {
                    span,
                    step,
                    deadline: Instant::now() + inner.settings.reply_wait,
                };
                let mut all = lock(&inner.waiting);
                let earlier = all.insert(r.session.clone(), waiting);
                let oldest = (all.len() > MAX_WAITING)
                    .then(|| {
                        let key = all
                            .iter()
                            .min_by_key(|(_, w)| w.deadline)
                            .map(|(k, _)| k.clone());
                        key.and_then(|k| all.remove(&k))
                    })
                    .flatten();
                drop(all);
                // A session's next step came first: its last one had no reply recorded.
                out.extend(earlier.into_iter().chain(oldest).map(without_reply));
            }
            _ => out.push(span),
        }
        inner.sender.push_all(out);
    }

    /// A message was recorded (or refused): a `promptd.record` span with its review hooks and
    /// append; a reply's usage, cache outcome and cost go on its step's `chat` span, which is
    /// then exported (or on the record's own span, when that one was exported already).
    pub fn record(&self, r: &RecordRecord) {
        let inner = &self.inner;
        let now = SystemTime::now();
        let (start, end) = (r.start.unwrap_or(now), r.end.unwrap_or(now));
        let reply = r.role == "assistant" && r.error.is_none();
        if inner.sender.full() {
            let waited = lock(&inner.waiting).remove(&*r.session).is_some();
            inner
                .sender
                .dropped(r.timeline.len() as u64 + 1 + u64::from(waited));
            return;
        }
        let waiting = {
            let mut all = lock(&inner.waiting);
            match all.get(&r.session) {
                Some(w) if reply && w.step == r.step => all.remove(&r.session),
                _ => None,
            }
        };
        // The record's place: the client's context, else its step's span.
        let step_place = match &waiting {
            Some(w) => Some(Place {
                trace: w.span.span_context.trace_id(),
                parent: w.span.span_context.span_id(),
                remote: false,
            }),
            None => inner.place(&r.session, None).map(|p| Place {
                parent: step_span(&r.session, r.step),
                ..p
            }),
        };
        let place = match &r.parent {
            Some(p) if !p.sampled() => None,
            Some(p) => Some(Place {
                trace: p.0.trace_id(),
                parent: p.0.span_id(),
                remote: true,
            }),
            None => step_place,
        };
        let mut attributes = vec![
            kv("promptd.session", r.session.clone()),
            kv("promptd.agent", r.agent.clone()),
            kv("promptd.step", r.step as i64),
            kv("promptd.record.role", r.role),
            kv("session.id", r.session.clone()),
        ];
        if let Some(seq) = r.seq {
            attributes.push(kv("promptd.seq", seq as i64));
        }
        if let Some((code, _)) = &r.error {
            attributes.push(kv("error.type", code.clone()));
        }
        let reply_attributes = if reply {
            spans::reply_attributes(r)
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(r.timeline.len() + 2);
        match waiting {
            Some(mut w) => {
                w.span.attributes.extend(reply_attributes);
                w.span.attributes.push(kv("promptd.reply.recorded", true));
                w.span.end_time = end.max(w.span.start_time);
                out.push(w.span);
            }
            None => attributes.extend(reply_attributes),
        }
        if let Some(place) = place {
            let id = inner.ids.new_span_id();
            let events = inner.children(place.trace, id, &r.timeline, &mut out);
            let mut span = spans::span(
                &inner.scope,
                SpanParts {
                    name: format!("promptd.record {}", r.role).into(),
                    kind: SpanKind::Server,
                    place,
                    id,
                    time: (start, end),
                    attributes,
                    status: spans::status(r.error.as_ref()),
                },
            );
            span.events.events = events;
            if r.parent.is_some() {
                if let Some(step) = step_place {
                    let cx = opentelemetry::trace::SpanContext::new(
                        step.trace,
                        step.parent,
                        opentelemetry::trace::TraceFlags::SAMPLED,
                        true,
                        opentelemetry::trace::TraceState::NONE,
                    );
                    span.links
                        .links
                        .push(opentelemetry::trace::Link::with_context(cx));
                }
            }
            out.push(span);
        }
        inner.sender.push_all(out);
    }

    /// Exports what is queued now (spans waiting for a reply stay), waiting at most `wait`.
    pub fn flush(&self, wait: Duration) {
        self.inner.sender.flush(wait);
    }

    /// Ends every waiting span, exports everything (within `wait`) and stops.
    pub fn shutdown(&self, wait: Duration) {
        let waiting: Vec<Waiting> = lock(&self.inner.waiting).drain().map(|(_, w)| w).collect();
        self.inner
            .sender
            .push_all(waiting.into_iter().map(without_reply));
        self.inner.sender.flush(wait);
        if let Some(meters) = lock(&self.meters).take() {
            let _ = meters.shutdown_with_timeout(wait);
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(2));
        // The worker exports what is left and stops; it is not waited for, so an export
        // stuck on a collector that is down never holds up the process (it times out alone).
        self.inner.sender.close();
        drop(lock(&self.worker).take());
        if let Some(runtime) = lock(&self.runtime).take() {
            runtime.shutdown_background();
        }
    }
}

/// A waiting span whose reply never came, as exported.
fn without_reply(mut w: Waiting) -> SpanData {
    w.span.attributes.push(kv("promptd.reply.recorded", false));
    w.span
}

impl Inner {
    fn public_url(&self) -> String {
        self.public_url
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where session `session`'s step spans go, or `None` when the trace is not sampled: in
    /// the client's trace (`parent`), else under the session's span.
    fn place(&self, session: &str, parent: Option<&Parent>) -> Option<Place> {
        match parent {
            Some(p) => p.sampled().then(|| Place {
                trace: p.0.trace_id(),
                parent: p.0.span_id(),
                remote: true,
            }),
            None => {
                let trace = session_trace(session);
                ratio_sampled(trace, self.settings.sample_ratio).then(|| Place {
                    trace,
                    parent: session_span(session),
                    remote: false,
                })
            }
        }
    }

    /// A span for each timed piece of work under `parent`; a plugin call under the assembly
    /// it happened in.
    /// The timed work of a step or record under `parent`: with `call_spans`, a span for each
    /// piece (a plugin call under the assembly it happened in); by default only the assembly
    /// is a span, and each plugin call is an event on it, each other piece an event on the
    /// parent (returned): a third of the spans to encode and send per step.
    fn children(
        &self,
        trace: TraceId,
        parent: SpanId,
        timeline: &[Timed],
        out: &mut Vec<SpanData>,
    ) -> Vec<opentelemetry::trace::Event> {
        let mut assembly: Option<(usize, SystemTime, SystemTime)> = None;
        let mut parent_events = Vec::new();
        for t in timeline {
            let inside = |a: Option<(usize, SystemTime, SystemTime)>| {
                a.filter(|(_, s, e)| t.start >= *s && t.end <= *e)
                    .map(|(i, _, _)| i)
            };
            let (name, attributes) = spans::work_span(&t.work);
            let is_assembly = t.work == Work::Assembly;
            if !self.settings.call_spans && !is_assembly {
                let event = spans::work_event(name, attributes, t);
                match (&t.work, inside(assembly)) {
                    (Work::Call { .. }, Some(i)) => out[i].events.events.push(event),
                    _ => parent_events.push(event),
                }
                continue;
            }
            let id = self.ids.new_span_id();
            let under = match (&t.work, inside(assembly)) {
                (Work::Call { .. }, Some(i)) => out[i].span_context.span_id(),
                _ => parent,
            };
            if is_assembly {
                assembly = Some((out.len(), t.start, t.end));
            }
            let status = match &t.failed {
                Some(why) => Status::error(why.clone()),
                None => Status::Unset,
            };
            let place = Place {
                trace,
                parent: under,
                remote: false,
            };
            out.push(spans::span(
                &self.scope,
                SpanParts {
                    name,
                    kind: SpanKind::Internal,
                    place,
                    id,
                    time: (t.start, t.end),
                    attributes,
                    status,
                },
            ));
        }
        parent_events
    }

    /// Exports the waiting spans whose reply did not come in time.
    fn end_expired(&self, now: Instant) {
        let expired: Vec<Waiting> = {
            let mut all = lock(&self.waiting);
            if all.is_empty() || all.values().all(|w| w.deadline > now) {
                return;
            }
            let keys: Vec<Arc<str>> = all
                .iter()
                .filter(|(_, w)| w.deadline <= now)
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| all.remove(k)).collect()
        };
        self.sender.push_all(expired.into_iter().map(without_reply));
    }
}

/// `source`'s samples and telemetry's own.
fn with_own(source: Source, inner: Weak<Inner>) -> Source {
    Arc::new(move || {
        let mut all = source();
        if let Some(inner) = inner.upgrade() {
            all.extend(own_samples(&inner));
        }
        all
    })
}

/// The counters of [`Counts`] (and the spans waiting) as samples, for `/metrics` and OTLP.
pub fn samples(t: &Telemetry) -> Vec<Sample> {
    own_samples(&t.inner)
}

fn own_samples(inner: &Inner) -> Vec<Sample> {
    let c = &inner.counts;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    vec![
        Sample {
            name: "promptd_telemetry_spans_exported_total",
            help: "Spans the OTLP collector took.",
            counter: true,
            points: vec![(vec![], get(&c.exported))],
        },
        Sample {
            name: "promptd_telemetry_spans_dropped_total",
            help: "Spans dropped: the export queue was full, or their export failed or timed out.",
            counter: true,
            points: vec![
                (
                    vec![("reason", "queue_full".to_string())],
                    get(&c.dropped_queue_full),
                ),
                (
                    vec![("reason", "export_failed".to_string())],
                    get(&c.dropped_export_failed),
                ),
            ],
        },
        Sample {
            name: "promptd_telemetry_exports_failed_total",
            help: "OTLP span exports that failed or timed out.",
            counter: true,
            points: vec![(vec![], get(&c.failed_exports))],
        },
        Sample {
            name: "promptd_telemetry_spans_waiting",
            help: "Steps' spans waiting for their reply to be recorded.",
            counter: false,
            points: vec![(vec![], lock(&inner.waiting).len() as f64)],
        },
    ]
}
