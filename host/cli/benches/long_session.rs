//! One long session through the real `promptd serve`: does a step cost what it adds, or what
//! the session holds? Latency and daemon CPU per step around steps 10, 100, 500 and 1,000.
//!
//! Run: `cargo bench -p promptd --bench long_session`. Environment: `LONG_STEPS` (1000),
//! `PROMPTD_BIN` / `PROMPTD_BIN_BASELINE` (see the test kit's `bench` module), `LONG_PARTS`:
//! `current` makes the current binary's client ask each step for its parts since the step before
//! (contract Q21: only what is new is sent) while the baseline's asks for whole bodies, so a run
//! with `PROMPTD_BIN_BASELINE` set to the same binary compares the two answers.
//!
//! Method: one daemon per binary (four bundled Rust plugins, durable SQLite in a fresh state
//! folder under target/bench-tmp, `--no-watch`), all started first; the binaries then take
//! turns step by step, so both see the same machine noise. Step 1 carries a user message; each
//! later step N is an agent-loop turn: the model's reply with one tool call `call_N` recorded
//! via `POST /v1/sessions/{id}/messages`, then the step carrying that call's ~4 KB tool result
//! (and the facts `cwd`, `git_branch`). Per checkpoint, averages over the 10 steps ending
//! there: step latency (the `/steps` call), record latency (the `/messages` call), and daemon
//! CPU per turn (both calls), summed over the daemon's threads from /proc/PID/task/*/schedstat
//! (nanoseconds; /proc/PID/stat's 10 ms ticks are too coarse for 10 steps). RSS from VmRSS
//! after start and after the last step; the reply size of the last step.

use std::time::{Duration, Instant};

use promptd_testkit::bench::{
    self as support, binaries, env_or, fmt_duration, fmt_mib, ratio, rust_plugin_folder, scratch,
    thread_cpu_delta, Binary, Client, Daemon, Table,
};

const WINDOW: u64 = 10;
const CHECKPOINTS: [u64; 4] = [10, 100, 500, 1000];

/// A ~4 KB tool result (a file listing), different at every step.
fn tool_result(n: u64) -> String {
    let mut out = String::with_capacity(4200);
    let mut line = 0;
    while out.len() < 4096 - 80 {
        out.push_str(&format!(
            "{n:>5}:{line:>3}  fn handler_{line}(request: &Request) -> Response {{ todo!() }}\n"
        ));
        line += 1;
    }
    out
}

struct Run<'a> {
    bin: &'a Binary,
    daemon: Daemon,
    client: Client,
    session: String,
    rss_start: u64,
    /// Per step: (step latency, record latency, daemon CPU of the turn).
    per_step: Vec<(Duration, Duration, Duration)>,
    last_reply_bytes: usize,
    /// Ask for the parts since the step before (`LONG_PARTS`), and the step held.
    parts: bool,
    held: u64,
}

impl Run<'_> {
    fn turn(&mut self, n: u64) {
        let before = self.daemon.thread_cpu_ns();
        let (record, body) = if n == 1 {
            let body = r#"{"messages":[{"role":"user","content":"Read the handlers and tell me which are unfinished."}],"facts":{"cwd":"/src/app","git_branch":"main"},"format":"neutral"}"#;
            (Duration::ZERO, body.to_string())
        } else {
            let call = serde_json::json!({
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": format!("call_{n}"), "name": "read_file", "arguments": {"path": format!("src/handlers_{n}.rs")}}],
            });
            let t = Instant::now();
            let (status, text) = self.client.post(
                &format!("/v1/sessions/{}/messages", self.session),
                &call.to_string(),
            );
            let record = t.elapsed();
            assert!(
                (200..300).contains(&status),
                "{}: record at step {n}: HTTP {status}: {text}",
                self.bin.label
            );
            let body = serde_json::json!({
                "messages": [{"role": "tool", "tool_call_id": format!("call_{n}"), "content": tool_result(n)}],
                "facts": {"cwd": "/src/app", "git_branch": "main"},
                "format": "neutral",
            });
            (record, body.to_string())
        };
        let body = match self.parts {
            // The body's last `}` closes it: `since` joins its members.
            true => format!("{},\"since\":{}}}", &body[..body.len() - 1], self.held),
            false => body,
        };
        let t = Instant::now();
        let (status, text) = self.client.step(&self.session, &body);
        let step = t.elapsed();
        assert_eq!(status, 200, "{}: step {n}: {text}", self.bin.label);
        if self.parts {
            assert!(
                text.starts_with("{\"parts\":"),
                "{}: {text:.200}",
                self.bin.label
            );
            self.held = n;
        }
        let cpu = thread_cpu_delta(&before, &self.daemon.thread_cpu_ns());
        self.last_reply_bytes = text.len();
        self.per_step.push((step, record, cpu));
    }

    /// Averages over the WINDOW steps ending at step `end` (1-based).
    fn window(&self, end: u64) -> (Duration, Duration, Duration) {
        let from = end.saturating_sub(WINDOW) as usize;
        let w = &self.per_step[from..end as usize];
        let n = w.len() as u32;
        let sum = |f: fn(&(Duration, Duration, Duration)) -> Duration| {
            w.iter().map(f).sum::<Duration>() / n
        };
        (sum(|s| s.0), sum(|s| s.1), sum(|s| s.2))
    }
}

fn main() {
    support::print_machine();
    let bins = binaries();
    let steps: u64 = env_or("LONG_STEPS", 1000);
    let work = scratch("long-session");
    let plugins = work.path().join("plugins");
    let config = rust_plugin_folder(&plugins);
    let mut runs: Vec<Run> = bins
        .iter()
        .map(|bin| {
            let daemon = Daemon::start(
                bin,
                &plugins,
                &config,
                &work.path().join(format!("state-{}", bin.label)),
            );
            daemon.wait_ready();
            let client = Client::new(&daemon.url);
            let session = client.session("coder");
            let rss_start = daemon.rss_kib();
            Run {
                bin,
                daemon,
                client,
                session,
                rss_start,
                per_step: Vec::new(),
                last_reply_bytes: 0,
                parts: std::env::var("LONG_PARTS").as_deref() == Ok("current")
                    && bin.label == "current",
                held: 0,
            }
        })
        .collect();
    println!("long session: {steps} steps, each a tool call + a ~4 KB tool result, 4 Rust plugins");
    for n in 1..=steps {
        // Alternate who goes first at each step.
        let k = runs.len();
        for i in 0..k {
            let j = if n % 2 == 0 { i } else { k - 1 - i };
            runs[j].turn(n);
        }
        if n % 100 == 0 {
            eprintln!("step {n}");
        }
    }

    let mut table = Table::new(&[
        "step",
        "binary",
        "step latency",
        "record latency",
        "daemon CPU/turn",
    ]);
    let checkpoints: Vec<u64> = CHECKPOINTS
        .iter()
        .copied()
        .filter(|&c| c <= steps)
        .collect();
    for &c in &checkpoints {
        let windows: Vec<_> = runs.iter().map(|r| r.window(c)).collect();
        for (r, w) in runs.iter().zip(&windows) {
            table.row(vec![
                format!("{}–{c}", c.saturating_sub(WINDOW) + 1),
                r.bin.label.to_string(),
                fmt_duration(w.0),
                fmt_duration(w.1),
                fmt_duration(w.2),
            ]);
        }
        if let [cur, base] = &windows[..] {
            let s = |d: Duration| d.as_secs_f64();
            table.row(vec![
                format!("{}–{c}", c.saturating_sub(WINDOW) + 1),
                "current / baseline".into(),
                ratio(s(cur.0), s(base.0)),
                ratio(s(cur.1), s(base.1)),
                ratio(s(cur.2), s(base.2)),
            ]);
        }
    }
    println!();
    table.print();

    let mut mem = Table::new(&[
        "binary",
        "RSS after start",
        "RSS after last step",
        "last reply",
        "total daemon CPU",
    ]);
    for r in &runs {
        let total: Duration = r.per_step.iter().map(|s| s.2).sum();
        mem.row(vec![
            r.bin.label.to_string(),
            fmt_mib(r.rss_start),
            fmt_mib(r.daemon.rss_kib()),
            format!("{:.2} MB", r.last_reply_bytes as f64 / 1e6),
            fmt_duration(total),
        ]);
    }
    println!();
    mem.print();
    for r in runs {
        r.daemon.stop();
    }
}
