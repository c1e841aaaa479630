//! Load generator against the real `promptd serve` binary: steps per second, latency, and what
//! one step costs the daemon in CPU time, under closed and open loops.
//!
//! Run: `cargo bench -p promptd --bench load`. Environment:
//! - `LOAD_SECS` (10): measured seconds per scenario, after `LOAD_WARMUP_SECS` (1) of warm-up;
//! - `LOAD_ROUNDS` (1): how many times each binary runs each scenario, in rounds that take
//!   turns (A B, then B A…); a binary's rounds are reported as one window (their steps, CPU
//!   and latencies together). On a shared machine the binary that runs second has often been
//!   the cheaper by about 8% (BENCHMARKS.md, issue 50's ninth stop): with 2, each runs first
//!   once and last once;
//! - `LOAD_RATE` (4000): the open loop's offered steps per second, over `LOAD_OPEN_THREADS` (64);
//! - `LOAD_SCENARIOS` (all): which scenarios to run, 1-based and comma-separated (`2` = 16 threads,
//!   `5` = the HTTP floor);
//! - `PROMPTD_BIN` / `PROMPTD_BIN_BASELINE`: see the test kit's `bench` module (before/after
//!   side by side);
//! - `LOAD_STORE=postgres`: each scenario also runs on PostgreSQL (a server of its own, started by
//!   the bench with the test kit's `postgres` module, as the e2e tests do) with 1 and with 2
//!   daemons, beside SQLite; with 2, each client sends its steps to the daemons in turn (every step
//!   moves), and the daemon CPU is both daemons' (PostgreSQL's own is not counted);
//! - `LOAD_TELEMETRY=1`: each scenario also runs with `[telemetry]` on, exporting over OTLP/HTTP
//!   to a minimal sink in this process (it answers every export; its CPU counts as the
//!   client's), with 10% of sessions sampled, and with telemetry on and the collector down
//!   (connections refused).
//!
//! Method: per scenario and binary, a fresh `promptd serve --listen 127.0.0.1:0 --no-watch`
//! with the four bundled Rust plugins (identity, persona, tools, workspace) and a fresh state
//! folder (durable SQLite, `synchronous = FULL`) under target/bench-tmp; the binaries take
//! turns, scenario by scenario. Each client has its own keep-alive connection and starts a new
//! session (agent `coder`) every 100 steps; a step is one short user message with the facts `cwd`
//! and `git_branch`. The closed loops' clients are tasks on one runtime thread of this process
//! (hyper's HTTP/1.1 client), as wrk and oha drive theirs; the open loop's are threads (ureq),
//! since its schedule needs sleeps finer than tokio's 1 ms timer.
//! - Closed loop, 1/16/64 threads: each thread sends its next step when the last one returned.
//! - The HTTP floor, `GET /v1/health` in a closed loop of 16 threads on the same kind of
//!   connections: what the daemon's CPU per request is when a request does nothing (issue 50
//!   compares a short step's against it).
//! - Open loop: each thread sends on a fixed schedule (thread k of T at `k/rate + i*T/rate`),
//!   and latency is measured from the *scheduled* send time, so a stalled daemon is charged for
//!   the steps it delayed (no coordinated omission). Slots still unsent at the end are counted.
//!
//! Daemon CPU per step: utime + stime from /proc/PID/stat over the measured window (session
//! creation included: one per 100 steps), divided by the steps. Client CPU per step likewise
//! for this process (the client shares the two cores). RSS: VmRSS after the window.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use promptd_testkit::bench::{
    self as support, binaries, cpu_seconds, env_or, fmt_duration, fmt_mib, otlp_sink, percentile,
    ratio, rust_plugin_folder, scratch, small_step, Binary, Client, Daemon, Table,
};
use promptd_testkit::postgres as harness;

const STEPS_PER_SESSION: u64 = 100;

#[derive(Clone, Copy)]
enum Scenario {
    Closed(usize),
    Open {
        rate: f64,
        threads: usize,
    },
    /// `GET /v1/health` instead of steps, closed loop.
    Health(usize),
}

impl Scenario {
    fn label(self) -> String {
        match self {
            Scenario::Closed(t) => format!("closed, {t} thread{}", if t == 1 { "" } else { "s" }),
            Scenario::Open { rate, threads } => {
                format!("open, {rate:.0}/s offered, {threads} threads")
            }
            Scenario::Health(t) => format!("GET /v1/health, closed, {t} threads"),
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
    /// Adds a later measure of the same binary and scenario, as one window.
    fn merge(&mut self, other: Measured) {
        self.latencies.extend(other.latencies);
        self.latencies.sort_unstable();
        self.errors += other.errors;
        self.unsent += other.unsent;
        self.elapsed += other.elapsed;
        self.daemon_cpu += other.daemon_cpu;
        self.daemon_sys += other.daemon_sys;
        self.client_cpu += other.client_cpu;
        self.rss_kib = self.rss_kib.max(other.rss_kib);
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

/// Where the daemons keep sessions, and how many serve them.
#[derive(Clone)]
enum Store {
    Sqlite,
    Postgres {
        url: String,
        daemons: usize,
    },
    /// SQLite, with `[telemetry]` on, exporting to `endpoint` (`down`: nothing listens there),
    /// tracing `ratio` of the sessions.
    Telemetry {
        endpoint: String,
        down: bool,
        ratio: f64,
    },
}

impl Store {
    fn label(&self) -> String {
        match self {
            Store::Sqlite => "sqlite".into(),
            Store::Postgres { daemons, .. } => format!("postgres x{daemons}"),
            Store::Telemetry {
                down: false, ratio, ..
            } if *ratio < 1.0 => format!("telemetry on, {:.0}% sampled", ratio * 100.0),
            Store::Telemetry { down: false, .. } => "telemetry on".into(),
            Store::Telemetry { down: true, .. } => "telemetry on, collector down".into(),
        }
    }
}

/// One thread's steps: a new session every 100 steps, `send` decides when each step goes;
/// with several daemons, step i goes to daemon i mod n.
struct Stepper {
    clients: Vec<Client>,
    session: String,
    done: u64,
    result: ThreadResult,
}

impl Stepper {
    fn new(urls: &[String]) -> Stepper {
        Stepper {
            clients: urls.iter().map(|u| Client::new(u)).collect(),
            session: String::new(),
            done: 0,
            result: ThreadResult::default(),
        }
    }

    /// One step; the latency is counted from `since` (the send time, or the scheduled time).
    fn step(&mut self, since: Option<Instant>) {
        let client = &self.clients[self.done as usize % self.clients.len()];
        if self.done.is_multiple_of(STEPS_PER_SESSION) {
            self.session = client.session("coder");
        }
        let sent = Instant::now();
        let (status, text) = client.step(&self.session, &small_step(self.done));
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

/// The closed loops' client: one runtime thread drives every connection (as wrk and oha do),
/// each connection a task on it. One blocking thread per connection (ureq, as the open loop
/// has) cost the generator 150–180 µs of CPU per request here, most of it in the scheduler,
/// and took as much of the two cores as the daemon did.
mod driver {
    use std::time::{Duration, Instant};

    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper::client::conn::http1::SendRequest;
    use hyper::{header, Method, Request};
    use hyper_util::rt::TokioIo;

    use super::{small_step, ThreadResult, STEPS_PER_SESSION};

    /// One keep-alive HTTP/1.1 connection to a daemon.
    pub struct Conn {
        sender: SendRequest<Full<Bytes>>,
        host: String,
    }

    impl Conn {
        /// Connects to `url` (`http://host:port`).
        pub async fn open(url: &str) -> Conn {
            let host = url.trim_start_matches("http://").to_string();
            let stream = tokio::net::TcpStream::connect(&host)
                .await
                .unwrap_or_else(|e| panic!("connect {host}: {e}"));
            stream.set_nodelay(true).expect("TCP_NODELAY");
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("HTTP/1.1 handshake");
            tokio::spawn(conn);
            Conn { sender, host }
        }

        /// Sends one request and reads the whole reply; returns (status, body).
        pub async fn send(&mut self, method: Method, path: &str, body: String) -> (u16, Bytes) {
            let mut request = Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, &self.host);
            if !body.is_empty() {
                request = request.header(header::CONTENT_TYPE, "application/json");
            }
            let request = request
                .body(Full::new(Bytes::from(body)))
                .expect("a request");
            self.sender.ready().await.expect("connection ready");
            let response = self
                .sender
                .send_request(request)
                .await
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .unwrap_or_else(|e| panic!("{path}: read the reply: {e}"))
                .to_bytes();
            (status, body)
        }
    }

    /// One client's closed loop of steps until `deadline`: a new session every 100 steps, step
    /// i to daemon i mod n.
    pub async fn steps(urls: Vec<String>, deadline: Instant) -> ThreadResult {
        let mut conns = Vec::with_capacity(urls.len());
        for url in &urls {
            conns.push(Conn::open(url).await);
        }
        let mut result = ThreadResult::default();
        let (mut session, mut done) = (String::new(), 0u64);
        while Instant::now() < deadline {
            let n = conns.len();
            let conn = &mut conns[done as usize % n];
            if done.is_multiple_of(STEPS_PER_SESSION) {
                let (status, body) = conn
                    .send(Method::POST, "/v1/sessions", r#"{"agent":"coder"}"#.into())
                    .await;
                assert_eq!(status, 201, "POST /v1/sessions: {body:?}");
                let v: serde_json::Value = serde_json::from_slice(&body).expect("session JSON");
                session = v["id"].as_str().expect("session id").to_string();
            }
            let sent = Instant::now();
            let path = format!("/v1/sessions/{session}/steps");
            let (status, body) = conn.send(Method::POST, &path, small_step(done)).await;
            let latency = sent.elapsed();
            done += 1;
            record(&mut result, status, latency, &body);
        }
        result
    }

    /// One client's closed loop of `GET /v1/health` until `deadline`.
    pub async fn health(url: String, deadline: Instant) -> ThreadResult {
        let mut conn = Conn::open(&url).await;
        let mut result = ThreadResult::default();
        while Instant::now() < deadline {
            let sent = Instant::now();
            let (status, body) = conn.send(Method::GET, "/v1/health", String::new()).await;
            record(&mut result, status, sent.elapsed(), &body);
        }
        result
    }

    fn record(result: &mut ThreadResult, status: u16, latency: Duration, body: &Bytes) {
        if status == 200 {
            result.latencies.push(latency);
        } else {
            if result.errors == 0 {
                eprintln!(
                    "request failed: HTTP {status}: {}",
                    String::from_utf8_lossy(body)
                );
            }
            result.errors += 1;
        }
    }
}

/// Runs `clients` closed-loop clients for `secs` on one runtime thread of this process;
/// `client(k, deadline)` is client k's loop.
fn run_driven<F>(
    clients: usize,
    secs: f64,
    client: impl Fn(usize, Instant) -> F,
) -> (Vec<ThreadResult>, Duration)
where
    F: std::future::Future<Output = ThreadResult> + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the load generator's runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs_f64(secs);
        let tasks: Vec<_> = (0..clients)
            .map(|k| tokio::task::spawn_local(client(k, deadline)))
            .collect();
        let mut results = Vec::with_capacity(clients);
        for task in tasks {
            results.push(task.await.expect("client task"));
        }
        (results, t0.elapsed())
    })
}

fn closed_loop(urls: &[String], threads: usize, secs: f64) -> (Vec<ThreadResult>, Duration) {
    run_driven(threads, secs, |_, deadline| {
        driver::steps(urls.to_vec(), deadline)
    })
}

/// Like [`closed_loop`], with `GET /v1/health` for each step.
fn health_loop(urls: &[String], threads: usize, secs: f64) -> (Vec<ThreadResult>, Duration) {
    run_driven(threads, secs, |_, deadline| {
        driver::health(urls[0].clone(), deadline)
    })
}

fn open_loop(
    urls: &[String],
    rate: f64,
    threads: usize,
    secs: f64,
) -> (Vec<ThreadResult>, Duration) {
    let urls = urls.to_vec();
    run_threads(threads, move |k, t0| {
        let interval = Duration::from_secs_f64(threads as f64 / rate);
        let first = t0 + Duration::from_secs_f64(k as f64 / rate);
        let deadline = t0 + Duration::from_secs_f64(secs);
        let mut s = Stepper::new(&urls);
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
    store: &Store,
) -> Measured {
    let (config, count) = match store {
        Store::Sqlite => (plugins.join("promptd.toml"), 1),
        Store::Telemetry {
            endpoint,
            down,
            ratio,
        } => {
            let config = plugins.join(format!("promptd-telemetry-{down}-{ratio}.toml"));
            let text = std::fs::read_to_string(plugins.join("promptd.toml")).unwrap();
            std::fs::write(
                &config,
                format!("{text}\n[telemetry]\nenabled = true\nendpoint = \"{endpoint}\"\nmetrics = false\nsample_ratio = {ratio:?}\n"),
            )
            .unwrap();
            (config, 1)
        }
        Store::Postgres { url, daemons } => {
            let config = plugins.join("promptd-postgres.toml");
            let text = std::fs::read_to_string(plugins.join("promptd.toml")).unwrap();
            std::fs::write(&config, format!("store = \"{url}\"\n{text}")).unwrap();
            (config, *daemons)
        }
    };
    let daemons: Vec<Daemon> = (0..count)
        .map(|d| Daemon::start(bin, plugins, &config, &state.join(format!("d{d}"))))
        .collect();
    daemons.iter().for_each(Daemon::wait_ready);
    let urls: Vec<String> = daemons.iter().map(|d| d.url.clone()).collect();
    let cpu = || {
        daemons
            .iter()
            .map(Daemon::cpu_split)
            .fold((0.0, 0.0), |(u, s), (du, ds)| (u + du, s + ds))
    };
    let secs: f64 = env_or("LOAD_SECS", 10.0);
    let warmup: f64 = env_or("LOAD_WARMUP_SECS", 1.0);
    let warm_threads = match scenario {
        Scenario::Closed(t) | Scenario::Health(t) => t,
        Scenario::Open { .. } => 16,
    };
    if warmup > 0.0 {
        closed_loop(&urls, warm_threads, warmup);
    }
    let ((user0, sys0), client0) = (cpu(), cpu_seconds("self"));
    let (results, elapsed) = match scenario {
        Scenario::Closed(t) => closed_loop(&urls, t, secs),
        Scenario::Open { rate, threads } => open_loop(&urls, rate, threads, secs),
        Scenario::Health(t) => health_loop(&urls, t, secs),
    };
    let ((user1, sys1), client1) = (cpu(), cpu_seconds("self"));
    let rss_kib = daemons.iter().map(Daemon::rss_kib).max().unwrap_or(0);
    daemons.into_iter().for_each(Daemon::stop);
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
        Scenario::Health(16),
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
    // Kept until the end of the run (stopped when this process exits).
    let postgres =
        (std::env::var("LOAD_STORE").as_deref() == Ok("postgres")).then(harness::Server::start);
    let mut stores = vec![Store::Sqlite];
    if let Some(server) = &postgres {
        for daemons in [1, 2] {
            stores.push(Store::Postgres {
                url: server.database(),
                daemons,
            });
        }
    }
    // `LOAD_TELEMETRY=1`: each scenario also with telemetry on, exporting to a sink, and with
    // telemetry on and the collector down (a port nothing listens on).
    if std::env::var("LOAD_TELEMETRY").as_deref() == Ok("1") {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let sink = otlp_sink();
        stores.push(Store::Telemetry {
            endpoint: sink.clone(),
            down: false,
            ratio: 1.0,
        });
        stores.push(Store::Telemetry {
            endpoint: sink,
            down: false,
            ratio: 0.1,
        });
        stores.push(Store::Telemetry {
            endpoint: format!("http://{closed}"),
            down: true,
            ratio: 1.0,
        });
    }
    let rounds: usize = env_or("LOAD_ROUNDS", 1_usize).max(1);
    println!("load: {secs} s per scenario and round, {rounds} round(s) taking turns, 4 Rust plugins, agent coder, new session every {STEPS_PER_SESSION} steps");

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
        "daemon RSS after (max)",
        "errors, unsent",
    ]);
    for (i, scenario) in scenarios.iter().enumerate() {
        // Alternate who goes first, so neither binary always runs on a warmer machine; with
        // `LOAD_ROUNDS`, each round reverses the last (A B, B A, A B…), so each binary runs
        // first and last as often.
        let mut order: Vec<&Binary> = bins.iter().collect();
        if i % 2 == 1 {
            order.reverse();
        }
        let rounds: Vec<Vec<&Binary>> = (0..rounds)
            .map(|r| {
                let mut o = order.clone();
                if r % 2 == 1 {
                    o.reverse();
                }
                o
            })
            .collect();
        let mut measured: Vec<(String, &Binary, Measured)> = Vec::new();
        for (bin, store) in rounds
            .iter()
            .flatten()
            .flat_map(|b| stores.iter().map(move |s| (*b, s)))
        {
            // The store column only when there is more than one.
            let label = match stores.len() {
                1 => bin.label.to_string(),
                _ => format!("{}, {}", bin.label, store.label()),
            };
            eprintln!("{} against {label} ...", scenario.label());
            let state = work
                .path()
                .join(format!("state-{i}-{label}").replace([' ', ','], "_"));
            let m = measure(bin, *scenario, &plugins, &state, store);
            eprintln!(
                "  {:.0} steps/s, p50 {}, p99 {}, daemon CPU/step {} (kernel {})",
                m.rate(),
                fmt_duration(m.p(0.5)),
                fmt_duration(m.p(0.99)),
                fmt_duration(m.daemon_cpu_per_step()),
                fmt_duration(m.daemon_sys_per_step())
            );
            // A later round of the same binary and store joins its earlier window.
            match measured.iter_mut().find(|(l, _, _)| *l == label) {
                Some((_, _, earlier)) => earlier.merge(m),
                None => measured.push((label, bin, m)),
            }
        }
        measured.sort_by_key(|(_, b, _)| b.label != "current");
        for (label, _, m) in &measured {
            table.row(vec![
                scenario.label(),
                label.clone(),
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
        // Each row of the current binary against the first (its SQLite one), or against the
        // baseline binary.
        let pairs: Vec<(String, &Measured, &Measured)> = if stores.len() > 1 {
            let current: Vec<_> = measured
                .iter()
                .filter(|(_, b, _)| b.label == "current")
                .collect();
            current
                .iter()
                .skip(1)
                .map(|(l, _, m)| (format!("{l} / sqlite"), m, &current[0].2))
                .collect()
        } else if let [(_, _, cur), (_, _, base)] = &measured[..] {
            vec![("current / baseline".to_string(), cur, base)]
        } else {
            Vec::new()
        };
        for (label, cur, base) in pairs {
            let secs = |d: Duration| d.as_secs_f64();
            table.row(vec![
                scenario.label(),
                label,
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
