//! Telemetry as one of the daemon's observers ([`promptd_daemon::StepObserver`]): the
//! daemon's step and record outcomes mapped to the records spans are made of
//! ([`StepRecord`], [`RecordRecord`]), after the GenAI semantic conventions.

use std::sync::Arc;

use promptd_core::formats::{self, Format};
use promptd_daemon::metrics::Sample;
use promptd_daemon::observe::{Detail, Stage, StepObserver, TraceContext, Work as Stages};
use promptd_daemon::{DaemonError, RecordOutcome, StepOutcome};

use crate::spans::{messages_json, StepContent};
use crate::{Parent, PrefixFacts, RecordRecord, StepRecord, Telemetry, Timed, Work};

/// Exports the daemon's steps, records and sessions as spans.
pub struct Observer {
    telemetry: Arc<Telemetry>,
    /// The session store's `db.system.name` (`sqlite`, `postgresql`), as the binary opened it.
    store: &'static str,
}

impl Observer {
    /// An observer exporting with `telemetry`, over a session store named `store`.
    pub fn new(telemetry: Arc<Telemetry>, store: &'static str) -> Observer {
        Observer { telemetry, store }
    }

    fn timeline(&self, stages: &[Stage]) -> Vec<Timed> {
        let t = &self.telemetry;
        stages
            .iter()
            .map(|s| Timed {
                work: match &s.work {
                    Stages::Assembly => Work::Assembly,
                    Stages::Call {
                        plugin,
                        sha256,
                        what,
                    } => Work::Call {
                        plugin: t.shared(plugin),
                        sha256: sha256.as_deref().map(|s| t.shared(s)),
                        what,
                    },
                    Stages::Review { plugin, sha256 } => Work::Review {
                        plugin: t.shared(plugin),
                        sha256: sha256.as_deref().map(|s| t.shared(s)),
                    },
                    Stages::Budget => Work::Budget,
                    Stages::Append { events } => Work::Append {
                        events: *events,
                        store: self.store,
                    },
                },
                start: s.start,
                end: s.end,
                failed: s.failed.clone(),
            })
            .collect()
    }

    fn agent(&self, plan: Option<&Arc<promptd_core::config::AgentSettings>>) -> Arc<str> {
        plan.map_or_else(|| Arc::from(""), |p| self.telemetry.shared(&p.agent))
    }
}

fn parent(trace: Option<&TraceContext>) -> Option<Parent> {
    let trace = trace?;
    Parent::from_headers(Some(&trace.traceparent), trace.tracestate.as_deref())
}

fn error(e: Option<&DaemonError>) -> Option<(String, String)> {
    e.map(|e| (e.code().to_string(), e.to_string()))
}

impl StepObserver for Observer {
    fn step_detail(&self, session: &str, trace: Option<&TraceContext>) -> Detail {
        let traced = self
            .telemetry
            .sample(session, parent(trace).as_ref())
            .is_some();
        Detail {
            traced,
            content: traced && self.telemetry.captures_content(),
        }
    }

    fn record_detail(&self, _session: &str, _trace: Option<&TraceContext>) -> Detail {
        Detail {
            traced: true,
            content: self.telemetry.captures_content(),
        }
    }

    fn session_created(
        &self,
        session: &str,
        agent: &str,
        at: std::time::SystemTime,
        trace: Option<&TraceContext>,
    ) {
        self.telemetry
            .session_created(session, agent, at, parent(trace).as_ref());
    }

    fn step(&self, o: &StepOutcome, e: Option<&DaemonError>) {
        let parent = parent(o.trace.as_ref());
        let Some(sampled) = self.telemetry.sample(&o.session, parent.as_ref()) else {
            return;
        };
        let mut record = StepRecord {
            session: o.session.clone(),
            agent: self.agent(o.plan.as_ref()),
            sampled: Some(sampled),
            format: Some(o.format),
            start: Some(o.timings.start),
            end: Some(o.timings.end),
            parent,
            step: (o.step > 0).then_some(o.step),
            header_reason: o.header_reason,
            held: o.held.clone(),
            reused: o.reused.clone(),
            timeline: self.timeline(&o.timings.stages),
            request_bytes: o.body.len(),
            error: error(e),
            ..StepRecord::default()
        };
        if let Some(plan) = &o.plan {
            request_settings(&plan.model, o.format, &mut record);
        }
        let system = o.facts.as_ref().and_then(|f| f.system.clone());
        record.content = o.content.as_ref().map(|input| StepContent {
            system,
            input_messages: messages_json(input.iter()),
        });
        if let Some(facts) = &o.facts {
            record.cache_key = facts.cache_key.clone();
            record.cache_ttl = facts.cache_ttl.clone();
            if let Some(h) = &facts.header {
                record.system = Some(h.system.clone());
                record.tool_groups = h.tool_groups.clone();
            }
            record.prefix = facts.prefix.as_ref().map(|p| PrefixFacts {
                kept: p.kept,
                bytes: p.bytes,
                shared_bytes: p.shared_bytes,
                first_difference: p.first_difference.clone(),
                causes: p.causes.clone(),
            });
        }
        self.telemetry
            .step(&record, e.is_none().then_some(&o.usage));
    }

    fn record(&self, o: &RecordOutcome, e: Option<&DaemonError>) {
        let reply = o.reply.clone().unwrap_or_default();
        let record = RecordRecord {
            session: o.session.clone(),
            agent: self.agent(o.plan.as_ref()),
            step: o.step,
            seq: e.is_none().then_some(o.seq),
            role: o.role,
            start: Some(o.timings.start),
            end: Some(o.timings.end),
            timeline: self.timeline(&o.timings.stages),
            error: error(e),
            usage: o.usage,
            outcome: o.cache.clone(),
            cost: o.cost,
            response_model: reply.model,
            response_id: reply.id,
            finish_reasons: reply.finish_reasons,
            output_messages: o
                .content
                .as_ref()
                .map(|m| messages_json(std::iter::once(m))),
            parent: parent(o.trace.as_ref()),
        };
        self.telemetry.record(&record);
    }

    fn samples(&self) -> Vec<Sample> {
        crate::samples(&self.telemetry)
    }
}

/// The request settings of `model` in `format` (its model, and what `gen_ai.request.*` names)
/// onto `record`.
fn request_settings(
    model: &serde_json::Map<String, serde_json::Value>,
    format: Format,
    record: &mut StepRecord,
) {
    use crate::spans::attr as kv;
    use crate::spans::semconv as a;
    let get = |key: &str| formats::setting(model, format, key);
    record.model = get("model").and_then(|v| v.as_str()).map(str::to_string);
    let max = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| get(k).and_then(|v| v.as_i64()));
    if let Some(max) = max {
        record
            .params
            .push(kv::int(a::GEN_AI_REQUEST_MAX_TOKENS, max));
    }
    for (key, name) in [
        ("temperature", a::GEN_AI_REQUEST_TEMPERATURE),
        ("top_p", a::GEN_AI_REQUEST_TOP_P),
        ("frequency_penalty", a::GEN_AI_REQUEST_FREQUENCY_PENALTY),
        ("presence_penalty", a::GEN_AI_REQUEST_PRESENCE_PENALTY),
    ] {
        if let Some(v) = get(key).and_then(|v| v.as_f64()) {
            record.params.push(kv::float(name, v));
        }
    }
    for (key, name) in [
        ("top_k", a::GEN_AI_REQUEST_TOP_K),
        ("seed", a::GEN_AI_REQUEST_SEED),
    ] {
        if let Some(v) = get(key).and_then(|v| v.as_i64()) {
            record.params.push(kv::int(name, v));
        }
    }
    let stop = get("stop_sequences").or_else(|| get("stop"));
    let stop: Vec<String> = match stop {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    if !stop.is_empty() {
        record
            .params
            .push(kv::strings(a::GEN_AI_REQUEST_STOP_SEQUENCES, stop));
    }
    if format == Format::Openai {
        if let Some(d) = get("dialect").and_then(|v| v.as_str()) {
            record.params.push(kv::string("promptd.dialect", d));
        }
    }
}
