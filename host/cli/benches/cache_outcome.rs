//! What recording a reply's cache outcome costs (issue 29): daemon CPU of recording a reply
//! with its provider usage (the outcome is judged and recorded with it) against recording the
//! same reply without usage, beside the step itself.
//!
//! Run: `cargo bench -p promptd --bench cache_outcome`. Environment: `OUTCOME_SESSIONS` (200
//! pairs of short sessions), `OUTCOME_TURNS` (8 turns each), `OUTCOME_LONG_TURNS` (200 turns
//! for the two long ones).
//!
//! Method: one real `promptd serve` (four bundled Rust plugins, durable SQLite, `--no-watch`);
//! sessions in pairs, one recording plain replies, one recording the same replies with an
//! Anthropic usage (`?format=anthropic&sent_at=…`), turn by turn in alternation so both see the
//! same machine. A turn is a short step in the Anthropic format (a user message, or the result
//! of the reply's tool call) and the reply. Daemon CPU per call is summed over the daemon's
//! threads from /proc/PID/task/*/schedstat around each call (one client, calls in sequence).

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use support::{
    binaries, env_or, fmt_duration, rust_plugin_folder, scratch, thread_cpu_delta, Client, Daemon,
    Table,
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
    text.push_str(
        "\n[model]\nmax_tokens = 1024\n[model.anthropic]\nmodel = \"claude-sonnet-4-5\"\n",
    );
    std::fs::write(&config, text).expect("config");
    let daemon = Daemon::start(&bins[0], &plugins, &config, &work.path().join("state"));
    daemon.wait_ready();
    let client = Client::new(&daemon.url);
    let mut table = Table::new(&[
        "sessions",
        "step (anthropic)",
        "record, no usage",
        "record with usage",
        "the outcome's cost",
        "share of a step",
    ]);
    for (label, pairs, turns) in [
        (format!("{pairs} × {short} turns"), pairs, short),
        (format!("2 × {long} turns"), 2, long),
    ] {
        let (step, plain, with) = run(&daemon, &client, pairs, turns);
        let extra = with.saturating_sub(plain);
        table.row(vec![
            label,
            fmt_duration(step),
            fmt_duration(plain),
            fmt_duration(with),
            fmt_duration(extra),
            format!("{:.1}%", 100.0 * extra.as_secs_f64() / step.as_secs_f64()),
        ]);
    }
    table.print();
}

/// `pairs` pairs of sessions, `turns` turns each; the mean daemon CPU per call of the step,
/// of recording a plain reply and of recording it with its usage.
fn run(
    daemon: &Daemon,
    client: &Client,
    pairs: usize,
    turns: u64,
) -> (Duration, Duration, Duration) {
    let sessions: Vec<(String, String)> = (0..pairs)
        .map(|_| (client.session("coder"), client.session("coder")))
        .collect();
    let (mut step_cpu, mut plain_cpu, mut outcome_cpu) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut calls = 0u32;
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
        for (plain, priced) in &sessions {
            for (id, usage) in [(plain, false), (priced, true)] {
                let message = if n == 1 {
                    serde_json::json!({"role": "user", "content": "Which handlers are unfinished?"})
                } else {
                    serde_json::json!({"role": "tool", "tool_call_id": format!("call_{}", n - 1), "content": "src/a.rs\nsrc/b.rs"})
                };
                let body = serde_json::json!({"messages": [message], "facts": {"cwd": "/src/app"}, "format": "anthropic"});
                step_cpu += measure(&format!("/v1/sessions/{id}/steps"), &body.to_string());
                let mut reply = serde_json::json!({"role": "assistant", "content": "",
                    "tool_calls": [{"id": format!("call_{n}"), "name": "read_file", "arguments": {"path": "src/a.rs"}}]});
                let path = if usage {
                    reply["usage"] = serde_json::json!({"input_tokens": 40, "output_tokens": 20,
                        "cache_read_input_tokens": 2800 + 30 * n, "cache_creation_input_tokens": 30});
                    format!(
                        "/v1/sessions/{id}/messages?format=anthropic&sent_at={}",
                        n * 20_000
                    )
                } else {
                    format!("/v1/sessions/{id}/messages")
                };
                let cpu = measure(&path, &reply.to_string());
                if usage {
                    outcome_cpu += cpu;
                } else {
                    plain_cpu += cpu;
                    calls += 1;
                }
            }
        }
    }
    (
        step_cpu / (2 * calls),
        plain_cpu / calls,
        outcome_cpu / calls,
    )
}
