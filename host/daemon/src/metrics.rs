//! Prometheus metrics: steps, assembly latency, plugin errors, loaded plugins.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use promptd_core::sync::lock;
use promptd_core::Error;

/// One metric's points now (as `/metrics` shows it, and OTLP exports it).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its name (as `/metrics` spells it).
    pub name: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// A monotonic counter, or a gauge.
    pub counter: bool,
    /// Each series: its labels and value.
    pub points: Vec<(Vec<(&'static str, String)>, f64)>,
}

/// Upper bounds of the step latency histogram, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// The daemon's counters and histograms, shown at `GET /metrics` in Prometheus' text format.
#[derive(Default)]
pub struct Metrics {
    steps_ok: AtomicU64,
    steps_failed: AtomicU64,
    /// Steps whose client went away before they were recorded (nothing recorded).
    steps_cancelled: AtomicU64,
    plugin_errors: AtomicU64,
    plugins_loaded: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
    /// Per agent: steps whose previous request was all a prefix of theirs, and steps that had
    /// a previous request. Agents are the config's, so the map stays small.
    prefix: std::sync::Mutex<std::collections::BTreeMap<String, (u64, u64)>>,
    /// Cache outcomes of recorded replies (issue 29).
    cache: std::sync::Mutex<CacheCounts>,
}

/// Most (agent, plugin) pairs the lost-tokens counter keeps; past it, they count as
/// `plugin="(other)"` so a long run of swaps cannot grow the exposition without bound.
const MAX_PLUGIN_SERIES: usize = 1024;

#[derive(Default)]
struct CacheCounts {
    /// (agent, outcome) → (replies, tokens lost).
    outcomes: std::collections::BTreeMap<(String, &'static str), (u64, u64)>,
    /// (agent, plugin) → tokens of cache lost to the plugin's changes.
    lost_to_plugin: std::collections::BTreeMap<(String, String), u64>,
}

/// The metrics are one of the daemon's observers: they count what the outcomes say.
impl crate::StepObserver for Metrics {
    /// Counts a step that ended with `outcome` (and `error`, when refused): its latency, and
    /// whether it kept its previous prefix; a cancelled step only as cancelled.
    fn step(&self, outcome: &crate::StepOutcome, error: Option<&crate::DaemonError>) {
        let error = match error {
            // Neither served nor failed: nobody asked any more.
            Some(crate::DaemonError::Cancelled) => return self.step_cancelled(),
            Some(crate::DaemonError::Core(e)) => Some(e),
            _ => None,
        };
        // Set once the step was appended.
        if let (Some(kept), Some(plan)) = (outcome.prefix_kept, &outcome.plan) {
            self.prefix(&plan.agent, kept);
        }
        self.count_step(outcome.timings.elapsed, error);
    }

    /// Counts a recorded reply's cache outcome.
    fn record(&self, outcome: &crate::RecordOutcome, error: Option<&crate::DaemonError>) {
        if let (None, Some(o), Some(plan)) = (error, &outcome.cache, &outcome.plan) {
            self.cache_outcome(&plan.agent, o);
        }
    }
}

impl Metrics {
    /// Counts a step that took `took`, failed with `error` if it did.
    pub fn count_step(&self, took: Duration, error: Option<&Error>) {
        match error {
            None => self.steps_ok.fetch_add(1, Ordering::Relaxed),
            Some(e) => {
                if matches!(e, Error::PluginCall { .. } | Error::UnknownShownTool { .. }) {
                    self.plugin_error();
                }
                self.steps_failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        let secs = took.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(&self.buckets) {
            if secs <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts a step stopped before its append because its client disconnected.
    pub fn step_cancelled(&self) {
        self.steps_cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A step of `agent` after the session's first: whether it kept the previous prefix.
    pub fn prefix(&self, agent: &str, kept: bool) {
        let mut prefix = lock(&self.prefix);
        if let Some(counts) = prefix.get_mut(agent) {
            counts.0 += u64::from(kept);
            counts.1 += 1;
        } else {
            prefix.insert(agent.to_string(), (u64::from(kept), 1));
        }
    }

    /// A recorded reply's cache outcome, for `agent`.
    pub fn cache_outcome(&self, agent: &str, o: &promptd_core::cache::outcome::Outcome) {
        let mut c = lock(&self.cache);
        let e = c
            .outcomes
            .entry((agent.to_string(), o.outcome.as_str()))
            .or_default();
        e.0 += 1;
        e.1 += o.lost;
        if let Some(plugin) = &o.plugin {
            let full = c.lost_to_plugin.len() >= MAX_PLUGIN_SERIES;
            let key = (agent.to_string(), plugin.clone());
            let key = if full && !c.lost_to_plugin.contains_key(&key) {
                (agent.to_string(), "(other)".to_string())
            } else {
                key
            };
            *c.lost_to_plugin.entry(key).or_default() += o.lost;
        }
    }

    /// Counts a failed plugin call.
    pub fn plugin_error(&self) {
        self.plugin_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets how many plugins serve now.
    pub fn set_plugins_loaded(&self, n: usize) {
        self.plugins_loaded.store(n as u64, Ordering::Relaxed);
    }

    /// Every counter and gauge now (the step latency histogram aside): what `/metrics` shows
    /// and what OTLP exports.
    pub fn samples(&self) -> Vec<Sample> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let agent = |a: &str| vec![("agent", a.to_string())];
        let mut out = vec![Sample {
            name: "promptd_steps_total",
            help: "Steps handled, by outcome.",
            counter: true,
            points: vec![
                (vec![("outcome", "ok".into())], get(&self.steps_ok)),
                (vec![("outcome", "error".into())], get(&self.steps_failed)),
                (
                    vec![("outcome", "cancelled".into())],
                    get(&self.steps_cancelled),
                ),
            ],
        }];
        out.push(Sample {
            name: "promptd_plugin_errors_total",
            help: "Failed plugin calls and refused loads.",
            counter: true,
            points: vec![(vec![], get(&self.plugin_errors))],
        });
        out.push(Sample {
            name: "promptd_plugins_loaded",
            help: "Plugins serving now.",
            counter: false,
            points: vec![(vec![], get(&self.plugins_loaded))],
        });
        let prefix = lock(&self.prefix);
        out.push(Sample {
            name: "promptd_prefix_kept_steps_total",
            help: "Steps whose previous request was all a prefix of theirs (a provider can reuse its cache), by agent.",
            counter: true,
            points: prefix.iter().map(|(a, (kept, _))| (agent(a), *kept as f64)).collect(),
        });
        out.push(Sample {
            name: "promptd_prefix_compared_steps_total",
            help: "Steps that had a previous request in their session, by agent.",
            counter: true,
            points: prefix
                .iter()
                .map(|(a, (_, n))| (agent(a), *n as f64))
                .collect(),
        });
        out.push(Sample {
            name: "promptd_prefix_kept_share",
            help: "Share of compared steps that kept the prefix, by agent.",
            counter: false,
            points: (prefix.iter())
                .map(|(a, (kept, n))| (agent(a), *kept as f64 / (*n).max(1) as f64))
                .collect(),
        });
        drop(prefix);
        let cache = lock(&self.cache);
        let by_outcome =
            |a: &str, o: &str| vec![("agent", a.to_string()), ("outcome", o.to_string())];
        out.push(Sample {
            name: "promptd_cache_outcomes_total",
            help: "Recorded replies by how the provider's cache served their request (hit, ttl_expired, prefix_changed, …), by agent.",
            counter: true,
            points: (cache.outcomes.iter())
                .map(|((a, o), (n, _))| (by_outcome(a, o), *n as f64))
                .collect(),
        });
        out.push(Sample {
            name: "promptd_cache_lost_tokens_total",
            help: "Input tokens the previous request left cached that a request did not read, by agent and outcome.",
            counter: true,
            points: (cache.outcomes.iter())
                .map(|((a, o), (_, lost))| (by_outcome(a, o), *lost as f64))
                .collect(),
        });
        out.push(Sample {
            name: "promptd_cache_lost_tokens_by_plugin_total",
            help: "Input tokens of cache lost to a plugin's changes (prefix_changed), by agent and plugin.",
            counter: true,
            points: (cache.lost_to_plugin.iter())
                .map(|((a, p), lost)| (vec![("agent", a.clone()), ("plugin", p.clone())], *lost as f64))
                .collect(),
        });
        out
    }

    /// The step latency histogram's sum (seconds) and count, as two counters (OTLP).
    pub fn latency_samples(&self) -> Vec<Sample> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        vec![
            Sample {
                name: "promptd_step_duration_seconds_sum",
                help: "Time to assemble and record steps, summed.",
                counter: false,
                points: vec![(vec![], get(&self.latency_micros) / 1e6)],
            },
            Sample {
                name: "promptd_step_duration_seconds_count",
                help: "Steps timed.",
                counter: true,
                points: vec![(vec![], get(&self.latency_count))],
            },
        ]
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut samples = self.samples().into_iter();
        if let Some(steps) = samples.next() {
            write_sample(&mut out, &steps);
        }
        let _ = writeln!(
            out,
            "# HELP promptd_step_duration_seconds Time to assemble and record a step."
        );
        let _ = writeln!(out, "# TYPE promptd_step_duration_seconds histogram");
        for (bound, count) in BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "promptd_step_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                get(count)
            );
        }
        let count = get(&self.latency_count);
        let _ = writeln!(
            out,
            "promptd_step_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "promptd_step_duration_seconds_sum {}",
            get(&self.latency_micros) as f64 / 1e6
        );
        let _ = writeln!(out, "promptd_step_duration_seconds_count {count}");
        for sample in samples {
            write_sample(&mut out, &sample);
        }
        out
    }
}

/// `sample` in Prometheus' text format.
pub fn write_sample(out: &mut String, sample: &Sample) {
    let kind = if sample.counter { "counter" } else { "gauge" };
    let _ = writeln!(out, "# HELP {} {}", sample.name, sample.help);
    let _ = writeln!(out, "# TYPE {} {kind}", sample.name);
    for (labels, value) in &sample.points {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        match labels.is_empty() {
            true => {
                let _ = writeln!(out, "{} {value}", sample.name);
            }
            false => {
                let _ = writeln!(out, "{}{{{}}} {value}", sample.name, labels.join(","));
            }
        }
    }
}
