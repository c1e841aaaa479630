//! Shared by the benches that run the real daemon (host/cli/benches): which binaries to
//! measure, the plugins and config they serve, a real `promptd serve` process with its CPU time
//! and memory read from /proc, a blocking HTTP client, percentiles and markdown tables.
//!
//! Binaries: `PROMPTD_BIN` (default: the `promptd` this bench was built with) and, when set,
//! `PROMPTD_BIN_BASELINE`. With both, every scenario runs against both, alternately, in the
//! same run, and the tables print both rows and the ratio `current / baseline`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{build_wasm_workspace, repo_root};

/// A `promptd` binary under test.
#[derive(Clone, Debug)]
pub struct Binary {
    /// `current` or `baseline`.
    pub label: &'static str,
    /// The executable.
    pub path: PathBuf,
}

/// The binaries to measure: `current` first, then `baseline` if `PROMPTD_BIN_BASELINE` is set.
pub fn binaries() -> Vec<Binary> {
    let current = std::env::var_os("PROMPTD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(crate::promptd_bin);
    let mut out = vec![Binary {
        label: "current",
        path: current,
    }];
    if let Some(base) = std::env::var_os("PROMPTD_BIN_BASELINE").filter(|v| !v.is_empty()) {
        out.push(Binary {
            label: "baseline",
            path: PathBuf::from(base),
        });
    }
    for b in &out {
        assert!(
            b.path.is_file(),
            "{} binary {} does not exist",
            b.label,
            b.path.display()
        );
        println!("{:<8} = {}", b.label, b.path.display());
    }
    out
}

/// An environment variable parsed as a number, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        _ => default,
    }
}

/// A scratch folder under target/bench-tmp: on the same (real) disk as the build, never a
/// tmpfs, so SQLite's fsyncs cost what they cost in production. Removed when dropped.
pub fn scratch(name: &str) -> tempfile::TempDir {
    let base = repo_root().join("target/bench-tmp");
    std::fs::create_dir_all(&base).expect("create target/bench-tmp");
    tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir_in(&base)
        .expect("scratch dir")
}

/// The four bundled Rust plugins, as `NAME.wasm` files in one folder. Taken from
/// target/plugins (`cargo xtask plugins`), else built from plugins/ the way the tests do.
pub const RUST_PLUGINS: [&str; 4] = ["identity", "persona", "tools", "workspace"];

fn built_rust_plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = repo_root();
        let shipped = root.join("target/plugins");
        if RUST_PLUGINS
            .iter()
            .all(|p| shipped.join(format!("{p}.wasm")).is_file())
        {
            return shipped;
        }
        println!("target/plugins lacks the Rust plugins: building plugins/ for wasm32-wasip2");
        build_wasm_workspace("plugins")
    })
}

/// Copies the four Rust plugins into `dir` and writes `dir/promptd.toml` for them (agents
/// `coder` and `reviewer`, as in the example config); returns the config's path.
pub fn rust_plugin_folder(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("plugin folder");
    for p in RUST_PLUGINS {
        let file = format!("{p}.wasm");
        std::fs::copy(built_rust_plugins().join(&file), dir.join(&file))
            .unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
    let config = dir.join("promptd.toml");
    std::fs::write(
        &config,
        r#"plugin_dir = "."
tool_order = ["read_file", "list_dir", "<unlisted-tools>"]

[agents.coder]

[agents.reviewer]
parent = "coder"

[plugins.identity]
config = { name = "Ada", model = "example-model" }

[plugins.persona]
config = { text = "You are {{agent_name}}'s {{role}} side: {{style}}.", role = "engineering", style = "precise, brief, and honest about uncertainty" }
"#,
    )
    .expect("write config");
    config
}

/// Clock ticks per second for /proc/PID/stat, from `getconf CLK_TCK` (once; 100 if it fails).
pub fn clk_tck() -> u64 {
    static TCK: OnceLock<u64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// utime + stime of a process in seconds, from /proc/PID/stat (all its threads, live and
/// exited). Resolution: one clock tick (10 ms at CLK_TCK = 100).
pub fn cpu_seconds(pid: &str) -> f64 {
    let (user, system) = cpu_split(pid);
    user + system
}

/// User and system CPU seconds of a process (`pid` may be `self`), from /proc/PID/stat: the
/// split tells work in promptd's own code from work in the kernel (fsync, sockets, futexes).
pub fn cpu_split(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // The command name (field 2) may hold spaces: fields after it start behind the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat has a comm field") + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of the whole line are utime and stime: 11 and 12 after the comm.
    let utime: u64 = fields[11].parse().expect("utime");
    let stime: u64 = fields[12].parse().expect("stime");
    let tck = clk_tck() as f64;
    (utime as f64 / tck, stime as f64 / tck)
}

/// On-CPU nanoseconds per live thread of a process, from /proc/PID/task/*/schedstat: exact to
/// the nanosecond, for windows too short for clock ticks. Threads that exit take their time
/// with them, so compare two samples with [`thread_cpu_delta`].
pub fn thread_cpu_ns(pid: u32) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
            if let Some(ns) = s.split_whitespace().next().and_then(|f| f.parse().ok()) {
                out.insert(tid, ns);
            }
        }
    }
    out
}

/// CPU time spent between two [`thread_cpu_ns`] samples by the threads of the second one
/// (a thread born in between counts from zero).
pub fn thread_cpu_delta(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> Duration {
    let ns: u64 = after
        .iter()
        .map(|(tid, &t)| t.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum();
    Duration::from_nanos(ns)
}

/// VmRSS of a process in KiB, from /proc/PID/status.
pub fn rss_kib(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A running `promptd serve` (durable SQLite in `state`, `--no-watch`, a free loopback port).
pub struct Daemon {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// From spawn to the "promptd listening on" line.
    pub listening: Duration,
    /// When it was spawned.
    pub spawned: Instant,
}

impl Daemon {
    /// Starts `bin` on `plugins` with `config` and the state folder `state` (its log goes to
    /// `state/daemon.log`); returns once it listens.
    pub fn start(bin: &Binary, plugins: &Path, config: &Path, state: &Path) -> Daemon {
        Daemon::start_with_env(bin, plugins, config, state, &[])
    }

    /// [`Daemon::start`] with extra environment variables (e.g. a preloaded counter).
    pub fn start_with_env(
        bin: &Binary,
        plugins: &Path,
        config: &Path,
        state: &Path,
        env: &[(&str, &str)],
    ) -> Daemon {
        std::fs::create_dir_all(state).expect("state dir");
        let log = std::fs::File::create(state.join("daemon.log")).expect("daemon log");
        let mut cmd = Command::new(&bin.path);
        cmd.arg("serve")
            .arg("--plugins")
            .arg(plugins)
            .arg("--config")
            .arg(config)
            .arg("--state")
            .arg(state)
            .args(["--listen", "127.0.0.1:0", "--no-watch"])
            .env("PROMPTD_LOG", "warn")
            .env_remove("PROMPTD_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        let spawned = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.path.display()));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the listen line");
        let listening = spawned.elapsed();
        let Some(url) = line.trim().strip_prefix("promptd listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(state.join("daemon.log")).unwrap_or_default();
            panic!("{} did not start: first line {line:?}\n{log}", bin.label);
        };
        let url = url.to_string();
        // Keep draining stdout, so the daemon can never block on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        Daemon {
            pid: child.id(),
            child,
            url,
            listening,
            spawned,
        }
    }

    /// Its CPU time so far (see [`cpu_seconds`]).
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&self.pid.to_string())
    }

    /// Its user and system CPU time so far (see [`cpu_split`]).
    pub fn cpu_split(&self) -> (f64, f64) {
        cpu_split(&self.pid.to_string())
    }

    /// Its threads' CPU time so far (see [`thread_cpu_ns`]).
    pub fn thread_cpu_ns(&self) -> BTreeMap<u32, u64> {
        thread_cpu_ns(self.pid)
    }

    /// Its resident memory now (see [`rss_kib`]).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid)
    }

    /// Waits (up to 120 s) until `GET /v1/health` says `"status": "ok"`: a daemon that
    /// listens first loads its plugins in the background, and the first step would wait.
    pub fn wait_ready(&self) {
        let client = Client::new(&self.url);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, text) = client.get("/v1/health");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if status == 200 && v["status"] == "ok" {
                return;
            }
            assert!(Instant::now() < deadline, "not ready after 120 s: {text}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `promptd_compile_cache_total` from /metrics: (hits, misses).
    pub fn cache_counts(&self) -> (u64, u64) {
        let (_, text) = Client::new(&self.url).get("/metrics");
        let count = |result: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with(&format!(
                        "promptd_compile_cache_total{{result=\"{result}\"}}"
                    ))
                })
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (count("hit"), count("miss"))
    }

    /// SIGTERM (graceful), then SIGKILL if it has not exited within 10 s.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A blocking HTTP client with one keep-alive connection (one per thread).
pub struct Client {
    agent: ureq::Agent,
    url: String,
}

impl Client {
    /// A client of the daemon at `url` (a 120 s timeout per request).
    pub fn new(url: &str) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Client {
            agent,
            url: url.to_string(),
        }
    }

    /// POST a JSON body; returns (status, body).
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        let response = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json")
            .send(body);
        read(response, path)
    }

    /// GET; returns (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        read(self.agent.get(format!("{}{path}", self.url)).call(), path)
    }

    /// Creates a session for `agent`; returns its id.
    pub fn session(&self, agent: &str) -> String {
        let (status, text) = self.post("/v1/sessions", &format!("{{\"agent\":\"{agent}\"}}"));
        assert_eq!(status, 201, "POST /v1/sessions: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("session JSON");
        v["id"].as_str().expect("session id").to_string()
    }

    /// One step; returns (status, body).
    pub fn step(&self, id: &str, body: &str) -> (u16, String) {
        self.post(&format!("/v1/sessions/{id}/steps"), body)
    }
}

fn read(
    response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    path: &str,
) -> (u16, String) {
    let mut response = response.unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_string()
        .unwrap_or_else(|e| panic!("{path}: read the reply: {e}"));
    (status, text)
}

/// A step body: a short user message and the facts `cwd` and `git_branch`.
pub fn small_step(n: u64) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"What is here? ({n})"}}],"facts":{{"cwd":"/src/app","git_branch":"main"}},"format":"neutral"}}"#
    )
}

/// `n` short steps ([`small_step`]) of agent `coder`, a new session every 100 (its creation
/// counted, as in `load`): the allocs and syscalls benches' workload.
pub fn short_steps(client: &Client, n: u64) {
    let mut session = client.session("coder");
    for k in 0..n {
        if k > 0 && k % 100 == 0 {
            session = client.session("coder");
        }
        let (status, text) = client.step(&session, &small_step(k % 100));
        assert_eq!(status, 200, "{text}");
    }
}

/// The `p`-th percentile (0..=1) of sorted values (nearest rank).
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    assert!(!sorted.is_empty(), "percentile of nothing");
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// A duration in the unit that reads best.
pub fn fmt_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 100.0 {
        format!("{us:.1} µs")
    } else if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.1} s", us / 1e6)
    }
}

/// KiB as MiB, one decimal.
pub fn fmt_mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// `current / baseline` as `x1.23` (`x3.4e-3` below 0.1), or `-` when undefined.
pub fn ratio(current: f64, baseline: f64) -> String {
    if !(baseline > 0.0 && current.is_finite()) {
        return "-".into();
    }
    let r = current / baseline;
    if r >= 0.1 {
        format!("x{r:.2}")
    } else {
        format!("x{r:.1e}")
    }
}

/// A markdown table, printed at once.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.header.len(), "row width");
        self.rows.push(cells);
    }

    /// Prints it to stdout.
    pub fn print(&self) {
        let line = |cells: &[String]| println!("| {} |", cells.join(" | "));
        line(&self.header);
        line(
            &self
                .header
                .iter()
                .map(|_| "---".to_string())
                .collect::<Vec<_>>(),
        );
        for r in &self.rows {
            line(r);
        }
    }
}

/// Machine and build facts printed at the top of each bench's output.
pub fn print_machine() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {cores} cores, {cpu}; CLK_TCK {}; scratch dirs in {}",
        clk_tck(),
        repo_root().join("target/bench-tmp").display()
    );
}

/// A minimal OTLP/HTTP collector on loopback for the telemetry benches: it reads each export and
/// answers 200 with an empty (valid) protobuf response, so the daemon's own cost is measured,
/// not a trace backend's. Returns its base URL; it lives as long as the process.
pub fn otlp_sink() -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the OTLP sink");
    let url = format!("http://{}", listener.local_addr().expect("sink address"));
    // Named, so a bench can take the sink's CPU off its own figure.
    let thread = || std::thread::Builder::new().name("otlp-sink".into());
    let accept = thread().spawn(move || {
        for conn in listener.incoming().flatten() {
            let served = thread().spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut conn = conn;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
            if served.is_err() {
                return;
            }
        }
    });
    accept.expect("start the OTLP sink");
    url
}
