//! Load generator against the real `promptd serve` binary: steps per second, latency, and what
//! one step costs the daemon in CPU time, under closed and open loops.
//!
//! Run: `cargo bench -p promptd --bench load`. Environment:
//! - `LOAD_SECS` (10): measured seconds per scenario, after `LOAD_WARMUP_SECS` (1) of warm-up;
//! - `LOAD_RATE` (4000): the open loop's offered steps per second, over `LOAD_OPEN_THREADS` (64);
//! - `LOAD_SCENARIOS` (all): which scenarios to run, 1-based and comma-separated (`2` = 16 threads);
//! - `PROMPTD_BIN` / `PROMPTD_BIN_BASELINE`: see support/mod.rs (before/after side by side).
//!
//! Method: per scenario and binary, a fresh `promptd serve --listen 127.0.0.1:0 --no-watch`
//! with the four bundled Rust plugins (identity, persona, tools, workspace) and a fresh state
//! folder (durable SQLite, `synchronous = FULL`) under target/bench-tmp; the binaries take
//! turns, scenario by scenario. Each client thread has its own keep-alive connection (ureq) and
//! starts a new session (agent `coder`) every 100 steps; a step is one short user message with
//! the facts `cwd` and `git_branch`.
//! - Closed loop, 1/16/64 threads: each thread sends its next step when the last one returned.
//! - Open loop: each thread sends on a fixed schedule (thread k of T at `k/rate + i*T/rate`),
//!   and latency is measured from the *scheduled* send time, so a stalled daemon is charged for
//!   the steps it delayed (no coordinated omission). Slots still unsent at the end are counted.
//!
//! Daemon CPU per step: utime + stime from /proc/PID/stat over the measured window (session
//! creation included: one per 100 steps), divided by the steps. Client CPU per step likewise
//! for this process (the client shares the two cores). RSS: VmRSS after the window.

#[path = "support/mod.rs"]
mod support;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use support::{
    binaries, cpu_seconds, env_or, fmt_duration, fmt_mib, percentile, ratio, rust_plugin_folder,
    scratch, small_step, Binary, Client, Daemon, Table,
};

const STEPS_PER_SESSION: u64 = 100;

#[derive(Clone, Copy)]
enum Scenario {
    Closed(usize),
    Open { rate: f64, threads: usize },
}

impl Scenario {
    fn label(self) -> String {
        match self {
            Scenario::Closed(t) => format!("closed, {t} thread{}", if t == 1 { "" } else { "s" }),
            Scenario::Open { rate, threads } => {
                format!("open, {rate:.0}/s offered, {threads} threads")
            }
        }
    }
}

/// What one thread saw.
#[derive(Default)]
struct ThreadResult {
    latencies: Vec<Duration>,
    errors: u64,
    unsent: u64,
}

/// What one scenario measured against one binary.
struct Measured {
    latencies: Vec<Duration>,
    errors: u64,
    unsent: u64,
    elapsed: Duration,
    daemon_cpu: f64,
    /// The part of `daemon_cpu` spent in the kernel (fsync, sockets, futexes).
    daemon_sys: f64,
    client_cpu: f64,
    rss_kib: u64,
}

impl Measured {
    fn steps(&self) -> u64 {
        self.latencies.len() as u64
    }
    fn rate(&self) -> f64 {
        self.steps() as f64 / self.elapsed.as_secs_f64()
    }
    fn p(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }
    fn daemon_cpu_per_step(&self) -> Duration {
        Duration::from_secs_f64(self.daemon_cpu / self.steps().max(1) as f64)
    }
    fn daemon_sys_per_step(&self) -> Duration {
        Duration::from_secs_f64(self.daemon_sys / self.steps().max(1) as f64)
    }
    fn client_cpu_per_step(&self) -> Duration {
        Duration::from_secs_f64(self.client_cpu / self.steps().max(1) as f64)
    }
}

/// One thread's steps: a new session every 100 steps, `send` decides when each step goes.
struct Stepper {
    client: Client,
    session: String,
    done: u64,
    result: ThreadResult,
}

impl Stepper {
    fn new(url: &str) -> Stepper {
        Stepper {
            client: Client::new(url),
            session: String::new(),
            done: 0,
            result: ThreadResult::default(),
        }
    }

    /// One step; the latency is counted from `since` (the send time, or the scheduled time).
    fn step(&mut self, since: Option<Instant>) {
        if self.done.is_multiple_of(STEPS_PER_SESSION) {
            self.session = self.client.session("coder");
        }
        let sent = Instant::now();
        let (status, text) = self.client.step(&self.session, &small_step(self.done));
        let latency = since.unwrap_or(sent).elapsed();
        self.done += 1;
        if status == 200 {
            self.result.latencies.push(latency);
        } else {
            if self.result.errors == 0 {
                eprintln!("step failed: HTTP {status}: {text}");
            }
            self.result.errors += 1;
        }
    }
}

fn run_threads(
    threads: usize,
    body: impl Fn(usize, Instant) -> ThreadResult + Send + Sync + 'static,
) -> (Vec<ThreadResult>, Duration) {
    let body = Arc::new(body);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (body, barrier, start) = (body.clone(), barrier.clone(), start.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let t0 = *start.get_or_init(Instant::now);
                body(k, t0)
            })
        })
        .collect();
    barrier.wait();
    let t0 = *start.get_or_init(Instant::now);
    let results: Vec<ThreadResult> = handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    (results, t0.elapsed())
}

fn closed_loop(url: &str, threads: usize, secs: f64) -> (Vec<ThreadResult>, Duration) {
    let url = url.to_string();
    run_threads(threads, move |_, t0| {
        let deadline = t0 + Duration::from_secs_f64(secs);
        let mut s = Stepper::new(&url);
        while Instant::now() < deadline {
            s.step(None);
        }
        s.result
    })
}

fn open_loop(url: &str, rate: f64, threads: usize, secs: f64) -> (Vec<ThreadResult>, Duration) {
    let url = url.to_string();
    run_threads(threads, move |k, t0| {
        let interval = Duration::from_secs_f64(threads as f64 / rate);
        let first = t0 + Duration::from_secs_f64(k as f64 / rate);
        let deadline = t0 + Duration::from_secs_f64(secs);
        let mut s = Stepper::new(&url);
        let mut i = 0u32;
        loop {
            let scheduled = first + interval * i;
            if scheduled >= deadline {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                // Behind schedule at the end: the slots left were never sent.
                let left = (deadline - scheduled).as_secs_f64() / interval.as_secs_f64();
                s.result.unsent += left.ceil() as u64;
                break;
            }
            if scheduled > now {
                std::thread::sleep(scheduled - now);
            }
            s.step(Some(scheduled));
            i += 1;
        }
        s.result
    })
}

fn measure(
    bin: &Binary,
    scenario: Scenario,
    plugins: &std::path::Path,
    state: &std::path::Path,
) -> Measured {
    let config = plugins.join("promptd.toml");
    let daemon = Daemon::start(bin, plugins, &config, state);
    daemon.wait_ready();
    let secs: f64 = env_or("LOAD_SECS", 10.0);
    let warmup: f64 = env_or("LOAD_WARMUP_SECS", 1.0);
    let warm_threads = match scenario {
        Scenario::Closed(t) => t,
        Scenario::Open { .. } => 16,
    };
    if warmup > 0.0 {
        closed_loop(&daemon.url, warm_threads, warmup);
    }
    let ((user0, sys0), client0) = (daemon.cpu_split(), cpu_seconds("self"));
    let (results, elapsed) = match scenario {
        Scenario::Closed(t) => closed_loop(&daemon.url, t, secs),
        Scenario::Open { rate, threads } => open_loop(&daemon.url, rate, threads, secs),
    };
    let ((user1, sys1), client1) = (daemon.cpu_split(), cpu_seconds("self"));
    let rss_kib = daemon.rss_kib();
    daemon.stop();
    let mut latencies: Vec<Duration> = results
        .iter()
        .flat_map(|r| r.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    assert!(!latencies.is_empty(), "no step succeeded ({})", bin.label);
    Measured {
        latencies,
        errors: results.iter().map(|r| r.errors).sum(),
        unsent: results.iter().map(|r| r.unsent).sum(),
        elapsed,
        daemon_cpu: (user1 + sys1) - (user0 + sys0),
        daemon_sys: sys1 - sys0,
        client_cpu: client1 - client0,
        rss_kib,
    }
}

fn main() {
    support::print_machine();
    let bins = binaries();
    let secs: f64 = env_or("LOAD_SECS", 10.0);
    let rate: f64 = env_or("LOAD_RATE", 4000.0);
    let open_threads: usize = env_or("LOAD_OPEN_THREADS", 64);
    let work = scratch("load");
    let plugins = work.path().join("plugins");
    rust_plugin_folder(&plugins);
    let all = [
        Scenario::Closed(1),
        Scenario::Closed(16),
        Scenario::Closed(64),
        Scenario::Open {
            rate,
            threads: open_threads,
        },
    ];
    // `LOAD_SCENARIOS=2,3` runs only the second and third (1-based), e.g. under a profiler.
    let picked: Vec<usize> = std::env::var("LOAD_SCENARIOS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let scenarios: Vec<Scenario> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| picked.is_empty() || picked.contains(&(i + 1)))
        .map(|(_, s)| *s)
        .collect();
    println!("load: {secs} s per scenario, 4 Rust plugins, agent coder, new session every {STEPS_PER_SESSION} steps");

    let mut table = Table::new(&[
        "scenario",
        "binary",
        "steps",
        "steps/s",
        "p50",
        "p99",
        "max",
        "daemon CPU/step",
        "of it kernel",
        "client CPU/step",
        "daemon RSS after",
        "errors, unsent",
    ]);
    for (i, scenario) in scenarios.iter().enumerate() {
        // Alternate who goes first, so neither binary always runs on a warmer machine.
        let mut order: Vec<&Binary> = bins.iter().collect();
        if i % 2 == 1 {
            order.reverse();
        }
        let mut measured: Vec<(&Binary, Measured)> = Vec::new();
        for bin in order {
            eprintln!("{} against {} ...", scenario.label(), bin.label);
            let state = work.path().join(format!("state-{i}-{}", bin.label));
            let m = measure(bin, *scenario, &plugins, &state);
            eprintln!(
                "  {:.0} steps/s, p50 {}, p99 {}, daemon CPU/step {} (kernel {})",
                m.rate(),
                fmt_duration(m.p(0.5)),
                fmt_duration(m.p(0.99)),
                fmt_duration(m.daemon_cpu_per_step()),
                fmt_duration(m.daemon_sys_per_step())
            );
            measured.push((bin, m));
        }
        measured.sort_by_key(|(b, _)| b.label != "current");
        for (bin, m) in &measured {
            table.row(vec![
                scenario.label(),
                bin.label.to_string(),
                m.steps().to_string(),
                format!("{:.0}", m.rate()),
                fmt_duration(m.p(0.5)),
                fmt_duration(m.p(0.99)),
                fmt_duration(*m.latencies.last().unwrap()),
                fmt_duration(m.daemon_cpu_per_step()),
                fmt_duration(m.daemon_sys_per_step()),
                fmt_duration(m.client_cpu_per_step()),
                fmt_mib(m.rss_kib),
                format!("{}, {}", m.errors, m.unsent),
            ]);
        }
        if let [(_, cur), (_, base)] = &measured[..] {
            let secs = |d: Duration| d.as_secs_f64();
            table.row(vec![
                scenario.label(),
                "current / baseline".into(),
                String::new(),
                ratio(cur.rate(), base.rate()),
                ratio(secs(cur.p(0.5)), secs(base.p(0.5))),
                ratio(secs(cur.p(0.99)), secs(base.p(0.99))),
                ratio(
                    secs(*cur.latencies.last().unwrap()),
                    secs(*base.latencies.last().unwrap()),
                ),
                ratio(
                    secs(cur.daemon_cpu_per_step()),
                    secs(base.daemon_cpu_per_step()),
                ),
                ratio(
                    secs(cur.daemon_sys_per_step()),
                    secs(base.daemon_sys_per_step()),
                ),
                ratio(
                    secs(cur.client_cpu_per_step()),
                    secs(base.client_cpu_per_step()),
                ),
                ratio(cur.rss_kib as f64, base.rss_kib as f64),
                String::new(),
            ]);
        }
    }
    println!();
    table.print();
}
