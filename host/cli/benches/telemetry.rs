//! What telemetry costs a short step, in CPU: the step's path (its spans built and queued) and
//! the export thread (OTLP encoding and HTTP), measured in this process with nothing else
//! running in it, so the figure is telemetry's alone.
//!
//! Run: `cargo bench -p promptd --bench telemetry`. `TELEMETRY_STEPS` (20000) steps per case at
//! `TELEMETRY_RATE` (2000) a second, each a step of a short session (the load bench's: 4 plugin calls, 6 sections, 4 contexts)
//! and its reply recorded with usage and a cache outcome, a new session every 100 steps; the
//! cases run in turn, `TELEMETRY_ROUNDS` (3) times, and each case's median is reported:
//! - on: exporting over OTLP/HTTP to a sink in this process (its CPU is excluded: it is read
//!   per thread and taken off);
//! - on, 10% of sessions sampled;
//! - on, the collector down (nothing listens; spans are dropped and counted).
//!
//! Method: process CPU (utime + stime of every thread, /proc/self/stat) over the steps and the
//! flush that exports them, less the sink threads' CPU, divided by the steps. The daemon's CPU
//! per short step without telemetry comes from the load bench (`cargo bench -p promptd --bench
//! load`, BENCHMARKS.md): the ratio of the two is telemetry's share.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use promptd_core::budget::Usage;
use promptd_core::cache::outcome::Outcome;
use promptd_core::config::Config;
use promptd_core::formats::replies::ProviderUsage;
use promptd_core::formats::Format;
use promptd_telemetry::{RecordRecord, Settings, StepRecord, Telemetry, Timed, Work};
use promptd_testkit::bench::{self as support, cpu_split, env_or, otlp_sink, Table};

fn telemetry(endpoint: &str, ratio: f64) -> Telemetry {
    let text = format!(
        "[telemetry]\nenabled = true\nendpoint = \"{endpoint}\"\nmetrics = false\nsample_ratio = {ratio:?}\ntimeout_ms = 1000\n"
    );
    let config = Config::parse(&text, "bench").expect("config");
    let settings = Settings::resolve(&config.telemetry, &|_| None, "127.0.0.1:8417")
        .expect("settings")
        .expect("on");
    Telemetry::start(settings, None).expect("telemetry")
}

fn usage() -> Usage {
    let part = |name: &str, tokens: u64| serde_json::json!({"name": name, "chars": tokens * 4, "tokens": tokens});
    let size = |tokens: u64| serde_json::json!({"chars": tokens * 4, "tokens": tokens});
    serde_json::from_value(serde_json::json!({
        "tokenizer": "chars", "reserve": 0, "tools": size(1384), "system": size(883),
        "sections": [part("identity", 201), part("persona", 77), part("skills:catalogue", 389),
                     part("skills:active", 0), part("tools:guidance", 210), part("workspace:rules", 6)],
        "contexts": [part("workspace", 40), part("tools:mode", 0), part("datetime:now", 12),
                     part("documents:retrieved", 0)],
        "snapshot": size(52), "messages": size(146), "message_count": 3, "total": size(2413)
    }))
    .expect("usage")
}

fn step(t: &Telemetry, session: &Arc<str>, n: u64, shas: &[(Arc<str>, Arc<str>)]) -> StepRecord {
    let now = SystemTime::now();
    let at = |us: u64| now + Duration::from_micros(us);
    let mut timeline = vec![Timed {
        work: Work::Assembly,
        start: at(0),
        end: at(400),
        failed: None,
    }];
    for (i, (plugin, sha)) in shas.iter().enumerate() {
        timeline.push(Timed {
            work: Work::Call {
                plugin: plugin.clone(),
                sha256: Some(sha.clone()),
                what: "evaluate",
            },
            start: at(10 + 90 * i as u64),
            end: at(90 + 90 * i as u64),
            failed: None,
        });
    }
    timeline.push(Timed {
        work: Work::Budget,
        start: at(420),
        end: at(440),
        failed: None,
    });
    timeline.push(Timed {
        work: Work::Append {
            events: 3,
            store: "sqlite",
        },
        start: at(450),
        end: at(900),
        failed: None,
    });
    StepRecord {
        session: session.clone(),
        agent: t.shared("coder"),
        step: Some(n),
        format: Some(Format::Anthropic),
        model: Some("claude-sonnet-4-5".into()),
        start: Some(now),
        end: Some(at(950)),
        timeline,
        header_reason: (n == 1).then_some("initial"),
        cache_key: Some("promptd-coder".into()),
        request_bytes: 2659,
        system: Some((t.shared(&"a5".repeat(32)).to_string(), 883)),
        ..StepRecord::default()
    }
}

fn reply(t: &Telemetry, session: &Arc<str>, n: u64) -> RecordRecord {
    let now = SystemTime::now();
    let outcome: Outcome = serde_json::from_value(serde_json::json!({
        "outcome": "hit", "format": "anthropic", "model": "claude-sonnet-4-5",
        "sent_at_ms": 1_790_000_000_000u64, "expected_read": 2000
    }))
    .expect("outcome");
    RecordRecord {
        session: session.clone(),
        agent: t.shared("coder"),
        step: n,
        seq: Some(n * 4),
        role: "assistant",
        start: Some(now),
        end: Some(now + Duration::from_micros(600)),
        timeline: vec![Timed {
            work: Work::Append {
                events: 1,
                store: "sqlite",
            },
            start: now,
            end: now + Duration::from_micros(500),
            failed: None,
        }],
        usage: Some(ProviderUsage {
            input_tokens: Some(2400),
            output_tokens: Some(20),
            cached_tokens: Some(2000),
            cache_write_tokens: Some(100),
            cache_write_1h_tokens: None,
        }),
        outcome: Some(outcome),
        response_model: Some("claude-sonnet-4-5".into()),
        response_id: Some("msg_1".into()),
        finish_reasons: vec!["end_turn".into()],
        ..RecordRecord::default()
    }
}

/// CPU seconds of this process's threads whose name starts with `prefix`.
fn threads_cpu(prefix: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .map(|t| {
            let (u, s) = cpu_split(&format!("self/task/{}", t.file_name().to_string_lossy()));
            u + s
        })
        .sum()
}

/// CPU per step of `steps` steps and replies through `t`, at `rate` steps a second (as a
/// daemon serves them: faster, the queue would only fill and drop), less the sink's.
fn run(t: &Telemetry, steps: u64, rate: f64, round: u64) -> Duration {
    let usage = usage();
    let shas: Vec<(Arc<str>, Arc<str>)> = ["identity", "persona", "tools", "workspace"]
        .iter()
        .map(|p| (t.shared(p), t.shared(&format!("{p:0>64}"))))
        .collect();
    let (u0, s0) = cpu_split("self");
    let sink0 = threads_cpu("otlp-sink");
    let mut session: Arc<str> = Arc::from("");
    let started = std::time::Instant::now();
    for i in 0..steps {
        if i % 20 == 0 {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let n = i % 100 + 1;
        if n == 1 {
            session = Arc::from(format!("bench-{round}-{i:08}").as_str());
            t.session_created(&session, "coder", SystemTime::now(), None);
        }
        t.step(&step(t, &session, n, &shas), Some(&usage));
        t.record(&reply(t, &session, n));
    }
    t.flush(Duration::from_secs(30));
    let (u1, s1) = cpu_split("self");
    let sink = threads_cpu("otlp-sink") - sink0;
    Duration::from_secs_f64(((u1 + s1) - (u0 + s0) - sink).max(0.0) / steps as f64)
}

fn main() {
    support::print_machine();
    let steps: u64 = env_or("TELEMETRY_STEPS", 20_000);
    let rounds: u64 = env_or("TELEMETRY_ROUNDS", 3);
    let rate: f64 = env_or("TELEMETRY_RATE", 2000.0);
    let sink = otlp_sink();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let down = format!("http://{closed}");
    let cases: [(&str, &str, f64); 3] = [
        ("on", sink.as_str(), 1.0),
        ("on, 10% of sessions sampled", sink.as_str(), 0.1),
        ("on, collector down", down.as_str(), 1.0),
    ];
    let mut measured: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for (i, (label, endpoint, ratio)) in cases.iter().enumerate() {
            let t = telemetry(endpoint, *ratio);
            let per_step = run(&t, steps, rate, round);
            let c = t.counts();
            let get =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            eprintln!(
                "round {round}, {label}: {:.1} µs per step (exported {}, dropped {} + {})",
                per_step.as_secs_f64() * 1e6,
                get(&c.exported),
                get(&c.dropped_queue_full),
                get(&c.dropped_export_failed)
            );
            measured[i].push(per_step);
        }
    }
    let mut table = Table::new(&["telemetry", "CPU per step and reply (median)", "rounds"]);
    for ((label, _, _), mut runs) in cases.iter().zip(measured) {
        runs.sort();
        let median = runs[runs.len() / 2];
        let all: Vec<String> = runs
            .iter()
            .map(|d| format!("{:.1}", d.as_secs_f64() * 1e6))
            .collect();
        table.row(vec![
            label.to_string(),
            format!("{:.1} µs", median.as_secs_f64() * 1e6),
            format!("{} µs", all.join(", ")),
        ]);
    }
    println!("telemetry: {steps} steps and replies per case at {rate:.0}/s, {rounds} rounds");
    table.print();
}
