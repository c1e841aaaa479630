//! What recording a reply's cache outcome costs (issue 29): daemon CPU of recording a reply
//! with its provider usage (the outcome is judged and recorded with it) against recording the
//! same reply without usage, beside the step itself.
//!
//! Run: `cargo bench -p promptd --bench cache_outcome`. Environment: `OUTCOME_SESSIONS` (200
//! pairs of short sessions), `OUTCOME_TURNS` (8 turns each), `OUTCOME_LONG_TURNS` (200 turns
//! for the two long ones).
//!
//! Method: one real `promptd serve` (four bundled Rust plugins, durable SQLite, `--no-watch`);
//! sessions in pairs, turn by turn in alternation so both see the same machine. A turn is a
//! short step in the OpenAI format (a user message, or the result of the reply's tool call)
//! and the reply, a neutral message with an OpenAI `usage` recorded the same way in both
//! sessions, except that one names its format (`?format=openai&sent_at=…`), so only its
//! outcome is judged and recorded. Daemon CPU per call is summed over the daemon's
//! threads from /proc/PID/task/*/schedstat around each call (one client, calls in sequence);
//! the table gives medians, the outcome's cost as the difference of the two records' medians.

use std::time::Duration;

use promptd_testkit::bench::{
    self as support, binaries, env_or, fmt_duration, rust_plugin_folder, scratch, thread_cpu_delta,
    Client, Daemon, Table,
};

fn main() {
    support::print_machine();
    let bins = binaries();
    let short: u64 = env_or("OUTCOME_TURNS", 8);
    let pairs: usize = env_or("OUTCOME_SESSIONS", 200);
    let long: u64 = env_or("OUTCOME_LONG_TURNS", 200);
    let work = scratch("cache-outcome");
    let plugins = work.path().join("plugins");
    let config = rust_plugin_folder(&plugins);
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[model]\nmax_tokens = 1024\n[model.openai]\nmodel = \"gpt-4.1\"\n");
    std::fs::write(&config, text).expect("config");
    let daemon = Daemon::start(&bins[0], &plugins, &config, &work.path().join("state"));
    daemon.wait_ready();
    let client = Client::new(&daemon.url);
    let mut table = Table::new(&[
        "sessions",
        "step (openai)",
        "record, no outcome",
        "record with outcome",
        "the outcome's cost",
        "share of a step",
        "judging, in process",
        "share of a step",
    ]);
    for (label, pairs, turns) in [
        (format!("{pairs} × {short} turns"), pairs, short),
        (format!("2 × {long} turns"), 2, long),
    ] {
        let (step, plain, with, priced) = run(&daemon, &client, pairs, turns);
        let extra = with.saturating_sub(plain);
        let judged = in_process(&client, &priced);
        table.row(vec![
            label,
            fmt_duration(step),
            fmt_duration(plain),
            fmt_duration(with),
            fmt_duration(extra),
            format!("{:.1}%", 100.0 * extra.as_secs_f64() / step.as_secs_f64()),
            fmt_duration(judged),
            format!("{:.1}%", 100.0 * judged.as_secs_f64() / step.as_secs_f64()),
        ]);
    }
    table.print();
}

/// The median time of judging one reply's outcome in this process, over the replies of
/// `sessions` (their logs read back from the daemon, the state built as the daemon builds
/// it, each reply applied and its blocks kept before the next is judged), 20 passes.
fn in_process(client: &Client, sessions: &[String]) -> Duration {
    use promptd_core::formats::replies::ProviderUsage;
    use promptd_core::session::log::Body;
    use promptd_core::session::SessionState;
    use promptd_core::store::Event;
    let rules = promptd_core::cache::RulesConfig::default();
    let mut times = Vec::new();
    for id in sessions {
        let (status, text) = client.get(&format!("/v1/sessions/{id}/events"));
        assert_eq!(status, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("events");
        let events: Vec<Event> = v["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| Event {
                seq: e["seq"].as_u64().unwrap_or(0),
                kind: e["kind"].as_str().unwrap_or("").parse().expect("a kind"),
                version: promptd_core::store::BODY_VERSION,
                body: e["body"].to_string(),
                at_ms: e["at_ms"].as_u64().unwrap_or(0),
            })
            .collect();
        for _ in 0..20 {
            let mut state = SessionState::new(id);
            for (i, e) in events.iter().enumerate() {
                let body = promptd_core::session::decode(id, e).expect("a body");
                if let Body::AssistantMessage(r) = &body {
                    if let (Some(o), Some(usage)) = (&r.cache, r.usage) {
                        let usage: ProviderUsage = usage;
                        let t = std::time::Instant::now();
                        let judged = state
                            .cache_outcome(o.format, o.sent_at_ms, &usage, &rules, &mut || {
                                Ok(events[..i].to_vec())
                            })
                            .expect("judged");
                        times.push(t.elapsed());
                        state.apply(std::slice::from_ref(e)).expect("apply");
                        if let Some((_, blocks)) = judged {
                            state.remember_blocks(blocks);
                        }
                        continue;
                    }
                }
                state.apply(std::slice::from_ref(e)).expect("apply");
            }
        }
    }
    median(times)
}

/// `pairs` pairs of sessions, `turns` turns each; the median daemon CPU per call of the step,
/// of recording a reply without its outcome and of recording it with its outcome; and up to
/// 20 of the sessions whose outcomes were judged.
fn run(
    daemon: &Daemon,
    client: &Client,
    pairs: usize,
    turns: u64,
) -> (Duration, Duration, Duration, Vec<String>) {
    let sessions: Vec<(String, String)> = (0..pairs)
        .map(|_| (client.session("coder"), client.session("coder")))
        .collect();
    let (mut step_cpu, mut plain_cpu, mut outcome_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let measure = |path: &str, body: &str| {
        let before = daemon.thread_cpu_ns();
        let (status, reply) = client.post(path, body);
        let cpu = thread_cpu_delta(&before, &daemon.thread_cpu_ns());
        assert!(
            (200..300).contains(&status),
            "{path}: HTTP {status}: {reply}"
        );
        cpu
    };
    for n in 1..=turns {
        for (k, (plain, priced)) in sessions.iter().enumerate() {
            // Who goes first alternates, so neither kind always follows the other's write.
            let order = if (k as u64 + n).is_multiple_of(2) {
                [(plain, false), (priced, true)]
            } else {
                [(priced, true), (plain, false)]
            };
            for (id, usage) in order {
                let message = if n == 1 {
                    serde_json::json!({"role": "user", "content": "Which handlers are unfinished?"})
                } else {
                    serde_json::json!({"role": "tool", "tool_call_id": format!("call_{}", n - 1), "content": "src/a.rs\nsrc/b.rs"})
                };
                let body = serde_json::json!({"messages": [message], "facts": {"cwd": "/src/app"}, "format": "openai"});
                step_cpu.push(measure(
                    &format!("/v1/sessions/{id}/steps"),
                    &body.to_string(),
                ));
                // The same reply and usage both ways: a neutral message with OpenAI's usage
                // names no format, so only `?format=openai` has its outcome judged.
                let reply = serde_json::json!({"role": "assistant", "content": "",
                    "tool_calls": [{"id": format!("call_{n}"), "name": "read_file", "arguments": {"path": "src/a.rs"}}],
                    "usage": {"prompt_tokens": 2900 + 30 * n, "completion_tokens": 20,
                              "prompt_tokens_details": {"cached_tokens": 2816}}});
                let path = if usage {
                    format!(
                        "/v1/sessions/{id}/messages?format=openai&sent_at={}",
                        n * 20_000
                    )
                } else {
                    format!("/v1/sessions/{id}/messages")
                };
                let cpu = measure(&path, &reply.to_string());
                if usage {
                    outcome_cpu.push(cpu);
                } else {
                    plain_cpu.push(cpu);
                }
            }
        }
    }
    let priced = sessions.into_iter().map(|(_, p)| p).take(20).collect();
    (
        median(step_cpu),
        median(plain_cpu),
        median(outcome_cpu),
        priced,
    )
}

/// The median: one call's CPU is noisy (another thread's work lands in it), the middle is not.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}
