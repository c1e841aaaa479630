//! The soak (issue 32), shared by `cargo bench -p promptd --bench soak` (one hour) and the
//! three-minute e2e test `soak::` (CI): a real `promptd serve` under paced steps with tool calls,
//! a plugin swapped between two versions on a schedule, an MCP server killed on a schedule, and
//! the daemon itself killed with SIGKILL and restarted on the same state on a schedule. At the
//! end every acknowledged step is read back from the session log and rebuilt; a [`Report`]
//! says what held and what did not ([`Report::failures`]).
//!
//! What a client counts apart from failures: connections refused or cut while the daemon is
//! being killed and restarted, and 503s in that window. Everything else that is not a 2xx is a
//! failure. A client whose request was cut abandons its session (what it had acknowledged
//! stays checked) and starts a new one: it cannot know whether the cut request was recorded.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use promptd_core::formats::{self, Format};
use promptd_core::store::SessionStore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// What to run and for how long.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The `promptd` binary.
    pub bin: PathBuf,
    /// The plugin folder the daemon watches; `versioned.wasm` in it is swapped.
    pub plugins: PathBuf,
    /// The daemon's promptd.toml (see [`config_text`]).
    pub config: PathBuf,
    /// The daemon's state folder, kept across its restarts.
    pub state: PathBuf,
    /// Where samples, acknowledgements and daemon logs go.
    pub out: PathBuf,
    /// The swapped plugin's two versions (their section and tool say `version 1` / `version 2`).
    pub versions: [Vec<u8>; 2],
    /// A piece of the MCP server's command line, to find its process among the daemon's
    /// children.
    pub mcp_marker: String,
    /// How long the clients step.
    pub duration: Duration,
    /// Steps offered per second, over `threads` client threads on a fixed schedule.
    pub rate: f64,
    /// Client threads.
    pub threads: usize,
    /// Steps a client takes in one session before it starts the next.
    pub steps_per_session: u64,
    /// How often the daemon is killed with SIGKILL and restarted on the same state.
    pub kill_every: Duration,
    /// How often `versioned.wasm` is swapped for the other version.
    pub swap_every: Duration,
    /// How often the MCP server is killed.
    pub mcp_kill_every: Duration,
    /// Per daemon run: samples left out before the first RSS window.
    pub warmup: Duration,
    /// The length of the first and the last RSS window of a run.
    pub window: Duration,
    /// Check the acknowledgements in this process at the end (the bench checks them in a
    /// fresh one: an hour of client threads leaves glibc's heap slow to allocate in).
    pub verify: bool,
}

/// One second of what the clients and /proc saw.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Seconds since the start.
    pub t: f64,
    /// Which daemon run (0, then one more at each restart).
    pub run: u64,
    /// Steps acknowledged in this second.
    pub steps: u64,
    /// Median latency from the scheduled send, in ms.
    pub p50_ms: f64,
    /// 99th percentile latency from the scheduled send, in ms.
    pub p99_ms: f64,
    /// The daemon's resident memory.
    pub rss_kib: u64,
    /// The daemon's open file descriptors.
    pub fds: u64,
    /// The daemon's threads.
    pub threads: u64,
    /// Requests refused, cut or answered 503 while the daemon was being restarted.
    pub restart_errors: u64,
    /// Failures (anything else that was not a 2xx).
    pub failures: u64,
}

/// One daemon run's flatness: the first window after warm-up against the last.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Which daemon run.
    pub run: u64,
    /// How long it ran.
    pub seconds: f64,
    /// Steps acknowledged during it.
    pub steps: u64,
    /// RSS over the first window after warm-up.
    pub rss_first_kib: u64,
    /// RSS over the last window.
    pub rss_last_kib: u64,
    /// Open descriptors over the first window.
    pub fds_first: u64,
    /// Open descriptors over the last window.
    pub fds_last: u64,
    /// Threads over the first window.
    pub threads_first: u64,
    /// Threads over the last window.
    pub threads_last: u64,
    /// False when the run was too short for two windows after warm-up (not judged).
    pub judged: bool,
}

impl RunReport {
    /// The last window's RSS over the first's.
    pub fn rss_ratio(&self) -> f64 {
        self.rss_last_kib as f64 / self.rss_first_kib.max(1) as f64
    }
}

/// Everything the soak measured and checked.
#[derive(Debug, Default)]
pub struct Report {
    /// How long the clients ran.
    pub elapsed: Duration,
    /// One a second.
    pub samples: Vec<Sample>,
    /// One per daemon run.
    pub runs: Vec<RunReport>,
    /// Steps the daemon acknowledged (2xx).
    pub acked_steps: u64,
    /// Messages in the acknowledged steps.
    pub messages: u64,
    /// Sessions the clients created.
    pub sessions: u64,
    /// Sessions a client gave up because a request was cut (what they acknowledged is checked).
    pub abandoned_sessions: u64,
    /// Scheduled steps never sent because a client was a second or more behind (a restart).
    pub unsent: u64,
    /// Connections refused or cut while the daemon was being restarted.
    pub restart_refused: u64,
    /// 503s while the daemon was being restarted.
    pub restart_503: u64,
    /// Everything else that was not a 2xx.
    pub failures: u64,
    /// The first few failures, in words.
    pub failure_examples: Vec<String>,
    /// Acknowledged steps that saw version 1 and version 2 of the swapped plugin.
    pub version_steps: [u64; 2],
    /// Requests that held both versions' text, or neither.
    pub mixed_requests: u64,
    /// Swaps of the plugin file.
    pub swaps: u64,
    /// SIGKILLs of the daemon.
    pub daemon_kills: u64,
    /// Kills of the MCP server.
    pub mcp_kills: u64,
    /// Distinct MCP server processes seen under the daemons (restarts show as new ones).
    pub mcp_processes_seen: u64,
    /// MCP server processes still alive after the last daemon stopped.
    pub mcp_leaked: u64,
    /// Acknowledged steps found in the log and rebuilt byte-identically.
    pub verified_steps: u64,
    /// Acknowledged steps not in the log.
    pub missing_steps: u64,
    /// Acknowledged steps whose rebuilt request differs from the one the client received.
    pub differing_steps: u64,
    /// The first few missing or differing steps, in words.
    pub verify_examples: Vec<String>,
    /// Steps in the log that no client acknowledged (cut by a kill after they were written).
    pub unacked_in_log: u64,
    /// How long reading back and rebuilding took.
    pub verify_seconds: f64,
    /// 99th percentile latency over the whole soak, in ms.
    pub p99_all_ms: f64,
}

impl Report {
    /// Each rule the soak checks that did not hold, said plainly (empty: all held).
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.acked_steps == 0 {
            out.push("no step was acknowledged".into());
        }
        if self.failures > 0 {
            out.push(format!(
                "{} requests failed outside a restart: {:?}",
                self.failures, self.failure_examples
            ));
        }
        if self.missing_steps + self.differing_steps > 0 || self.verified_steps != self.acked_steps
        {
            out.push(format!(
                "{} acknowledged steps, {} rebuilt identically, {} missing from the log, {} differing: {:?}",
                self.acked_steps, self.verified_steps, self.missing_steps, self.differing_steps, self.verify_examples
            ));
        }
        if self.mixed_requests > 0 {
            out.push(format!(
                "{} requests mixed the swapped plugin's versions or had neither",
                self.mixed_requests
            ));
        }
        if self.version_steps[0] == 0 || self.version_steps[1] == 0 {
            out.push(format!(
                "steps saw version 1 {} times and version 2 {} times: the swaps did not apply",
                self.version_steps[0], self.version_steps[1]
            ));
        }
        if self.mcp_kills > 0 && self.mcp_processes_seen <= self.mcp_kills {
            out.push(format!(
                "the MCP server was killed {} times but only {} processes of it were seen: it was not restarted",
                self.mcp_kills, self.mcp_processes_seen
            ));
        }
        if self.mcp_leaked > 0 {
            out.push(format!(
                "{} MCP server processes outlived their daemon",
                self.mcp_leaked
            ));
        }
        for r in self.runs.iter().filter(|r| r.judged) {
            let ratio = r.rss_ratio();
            if !(0.9..=1.1).contains(&ratio) {
                out.push(format!(
                    "run {}: RSS {} KiB in its last window against {} KiB in its first (x{ratio:.3}, outside ±10%)",
                    r.run, r.rss_last_kib, r.rss_first_kib
                ));
            }
            // A descriptor or thread more is noise (a connection, a blocking-pool thread);
            // growth is not.
            if r.fds_last > r.fds_first + r.fds_first / 10 + 4 {
                out.push(format!(
                    "run {}: open descriptors grew from {} to {}",
                    r.run, r.fds_first, r.fds_last
                ));
            }
            if r.threads_last > r.threads_first + r.threads_first / 10 + 4 {
                out.push(format!(
                    "run {}: threads grew from {} to {}",
                    r.run, r.threads_first, r.threads_last
                ));
            }
        }
        if !self.runs.iter().any(|r| r.judged) {
            out.push("no daemon run was long enough to judge its RSS".into());
        }
        out
    }
}

/// samples.csv's columns (benches/soak/plot.py reads them by name).
const CSV_HEADER: &str =
    "t_s,run,steps_per_s,p50_ms,p99_ms,rss_mib,fds,threads,restart_errors,failures\n";

impl Sample {
    fn csv_row(&self) -> String {
        format!(
            "{:.1},{},{},{:.3},{:.3},{:.2},{},{},{},{}\n",
            self.t,
            self.run,
            self.steps,
            self.p50_ms,
            self.p99_ms,
            self.rss_kib as f64 / 1024.0,
            self.fds,
            self.threads,
            self.restart_errors,
            self.failures
        )
    }
}

/// What the clients share with the conductor.
struct Shared {
    url: RwLock<String>,
    /// The daemon run (1-based); bumped when a new daemon serves.
    run: AtomicU64,
    restarting: AtomicBool,
    stop: AtomicBool,
    /// The latencies (µs, from the scheduled send) of the current second.
    window: Mutex<Vec<u32>>,
    all: Mutex<Vec<u32>>,
    steps: AtomicU64,
    messages: AtomicU64,
    sessions: AtomicU64,
    abandoned: AtomicU64,
    unsent: AtomicU64,
    restart_refused: AtomicU64,
    restart_503: AtomicU64,
    failures: AtomicU64,
    failure_examples: Mutex<Vec<String>>,
    version: [AtomicU64; 2],
    mixed: AtomicU64,
}

impl Shared {
    fn fail(&self, what: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut ex = self.failure_examples.lock().unwrap();
        if ex.len() < 5 {
            ex.push(what);
        }
    }
}

/// A running daemon.
struct Daemon {
    child: Child,
    url: String,
}

impl Daemon {
    fn start(plan: &Plan, run: u64) -> Daemon {
        let log =
            std::fs::File::create(plan.out.join(format!("daemon-{run}.log"))).expect("daemon log");
        let mut child = Command::new(&plan.bin)
            .arg("serve")
            .arg("--plugins")
            .arg(&plan.plugins)
            .arg("--config")
            .arg(&plan.config)
            .arg("--state")
            .arg(&plan.state)
            .args(["--listen", "127.0.0.1:0"])
            .env("PROMPTD_LOG", "warn")
            .env_remove("PROMPTD_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", plan.bin.display()));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        // The listen line is the daemon's first; a wrapper (a profiler) may print before it.
        let mut line = String::new();
        while stdout.read_line(&mut line).is_ok_and(|n| n > 0)
            && !line.starts_with("promptd listening on ")
        {
            line.clear();
        }
        let Some(url) = line.trim().strip_prefix("promptd listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "run {run}: the daemon did not start: {line:?}; see {}",
                plan.out.display()
            );
        };
        let url = url.to_string();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        let daemon = Daemon { child, url };
        daemon.wait_ready();
        daemon
    }

    fn wait_ready(&self) {
        let agent = agent();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(mut r) = agent.get(format!("{}/v1/health", self.url)).call() {
                let text = r.body_mut().read_to_string().unwrap_or_default();
                let v: Value = serde_json::from_str(&text).unwrap_or_default();
                if v["status"] == "ok" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the daemon is not ready after 120 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(mut self) {
        // SIGTERM through kill(1): std only sends SIGKILL, and this file stays free of unsafe.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// What one request came to.
enum Answer {
    Ok(u16, String),
    /// Refused or cut: the daemon was being killed (counted apart) or it failed.
    Cut(String),
}

fn post(agent: &ureq::Agent, url: &str, path: &str, body: &str) -> Answer {
    let r = agent
        .post(format!("{url}{path}"))
        .header("Content-Type", "application/json")
        .send(body);
    match r {
        Ok(mut r) => {
            let status = r.status().as_u16();
            match r.body_mut().with_config().limit(64 << 20).read_to_string() {
                Ok(text) => Answer::Ok(status, text),
                Err(e) => Answer::Cut(e.to_string()),
            }
        }
        Err(e) => Answer::Cut(e.to_string()),
    }
}

/// /proc figures of a process: (VmRSS KiB, Threads, open descriptors).
fn proc_figures(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((field("VmRSS:")?, field("Threads:")?, fds))
}

/// Processes whose command line holds `marker`, with their parent's pid.
fn processes_with(marker: &str) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(marker) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        // After the command name: state, then the parent's pid.
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            out.push((pid, ppid));
        }
    }
    out
}

/// A step reply's request body (its exact bytes) and step number.
fn split_step_reply(text: &str) -> Option<(&str, u64)> {
    let body = text.strip_prefix("{\"request\":")?;
    let tail = body.rfind(",\"step\":")?;
    let digits: String = body[tail + 8..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((&body[..tail], digits.parse().ok()?))
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const FORMATS: [&str; 3] = ["anthropic", "openai", "neutral"];

/// One client thread: steps on a fixed schedule, each session a tool-calling loop of
/// `steps_per_session` steps; every acknowledged step goes to `acks` as
/// `session \t step \t format \t sha256 of its request`.
fn client(plan: &Plan, shared: &Shared, k: usize, t0: Instant, acks: &Path) {
    let mut acks = BufWriter::new(std::fs::File::create(acks).expect("acks file"));
    let agent = agent();
    let interval = Duration::from_secs_f64(plan.threads as f64 / plan.rate);
    let mut next = t0 + Duration::from_secs_f64(k as f64 / plan.rate);
    let end = t0 + plan.duration;
    let mut session: Option<(String, u64, &str)> = None;
    let mut sessions_made = 0u64;
    let mut pending_result: Option<String> = None;
    let mut turn = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next >= end {
            break;
        }
        if now + Duration::from_secs(1) < next {
            std::thread::sleep(next - now);
        } else if now > next + Duration::from_secs(1) {
            // A second or more behind (a restart): those slots were never sent.
            let behind = (now - next).as_secs_f64() / interval.as_secs_f64();
            shared.unsent.fetch_add(behind as u64, Ordering::Relaxed);
            next += interval * behind as u32;
            continue;
        } else if now < next {
            std::thread::sleep(next - now);
        }
        let scheduled = next;
        next += interval;
        let url = shared.url.read().unwrap().clone();
        let run = shared.run.load(Ordering::Relaxed);
        // A cut or refused request while the daemon is being replaced is counted apart.
        let cut = |what: String| {
            if shared.restarting.load(Ordering::Relaxed)
                || shared.run.load(Ordering::Relaxed) != run
            {
                shared.restart_refused.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.fail(what);
            }
        };
        let status_failed = |status: u16, what: String| {
            if status == 503
                && (shared.restarting.load(Ordering::Relaxed)
                    || shared.run.load(Ordering::Relaxed) != run)
            {
                shared.restart_503.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.fail(format!("HTTP {status}: {what}"));
            }
        };
        if session.is_none() {
            let agent_name = if sessions_made % 4 == 3 {
                "reviewer"
            } else {
                "coder"
            };
            match post(
                &agent,
                &url,
                "/v1/sessions",
                &json!({ "agent": agent_name }).to_string(),
            ) {
                Answer::Ok(201, text) => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    let id = v["id"].as_str().unwrap_or_default().to_string();
                    let format = FORMATS[(k + sessions_made as usize) % FORMATS.len()];
                    sessions_made += 1;
                    shared.sessions.fetch_add(1, Ordering::Relaxed);
                    session = Some((id, 0, format));
                    pending_result = None;
                }
                Answer::Ok(status, text) => {
                    status_failed(status, format!("POST /v1/sessions: {text}"));
                    continue;
                }
                Answer::Cut(e) => {
                    cut(format!("POST /v1/sessions: {e}"));
                    continue;
                }
            }
        }
        let (id, done, format) = session.clone().expect("a session");
        let message = match pending_result.take() {
            Some(call) => json!({"role": "tool", "tool_call_id": call,
                "content": format!("fn main() {{ println!(\"{k}-{turn}\"); }}")}),
            None => {
                json!({"role": "user", "content": format!("Read the entry point, please ({k}-{turn}).")})
            }
        };
        let body = json!({
            "messages": [message],
            "facts": {"cwd": format!("/work/c{k}"), "git_branch": "main"},
            "format": format,
        })
        .to_string();
        let path = format!("/v1/sessions/{id}/steps");
        let text = match post(&agent, &url, &path, &body) {
            Answer::Ok(200, text) => text,
            Answer::Ok(status, text) => {
                status_failed(status, format!("POST {path}: {text}"));
                shared.abandoned.fetch_add(1, Ordering::Relaxed);
                session = None;
                continue;
            }
            Answer::Cut(e) => {
                cut(format!("POST {path}: {e}"));
                shared.abandoned.fetch_add(1, Ordering::Relaxed);
                session = None;
                continue;
            }
        };
        let latency = scheduled.elapsed().as_micros().min(u32::MAX as u128) as u32;
        // The reply is `{"request":BODY,"step":N,"usage":{…}}` (http.rs writes it so): the
        // body's exact bytes are hashed, as the log must rebuild them, without a parse.
        let Some((request, n)) = split_step_reply(&text) else {
            shared.fail(format!("POST {path}: not a step reply: {text:.200}"));
            session = None;
            continue;
        };
        let (one, two) = (request.contains("version 1"), request.contains("version 2"));
        match (one, two) {
            (true, false) => shared.version[0].fetch_add(1, Ordering::Relaxed),
            (false, true) => shared.version[1].fetch_add(1, Ordering::Relaxed),
            _ => shared.mixed.fetch_add(1, Ordering::Relaxed),
        };
        writeln!(acks, "{id}\t{n}\t{format}\t{}", sha256_hex(request)).expect("write acks");
        shared.steps.fetch_add(1, Ordering::Relaxed);
        shared.window.lock().unwrap().push(latency);
        turn += 1;
        // The model's reply: a tool call on even turns, text on odd ones.
        let call = format!("call_{k}_{turn}");
        let reply = if turn % 2 == 1 {
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": call, "name": "read_file", "arguments": {"path": "src/main.rs"}}]})
        } else {
            json!({"role": "assistant", "content": format!("It prints a greeting ({k}-{turn}).")})
        };
        let path = format!("/v1/sessions/{id}/messages");
        match post(&agent, &url, &path, &reply.to_string()) {
            Answer::Ok(201, _) => {
                shared.messages.fetch_add(1, Ordering::Relaxed);
                if turn % 2 == 1 {
                    pending_result = Some(call);
                }
                session = (done + 1 < plan.steps_per_session).then(|| (id, done + 1, format));
                if session.is_none() {
                    pending_result = None;
                }
            }
            Answer::Ok(status, text) => {
                status_failed(status, format!("POST {path}: {text}"));
                shared.abandoned.fetch_add(1, Ordering::Relaxed);
                session = None;
            }
            Answer::Cut(e) => {
                cut(format!("POST {path}: {e}"));
                shared.abandoned.fetch_add(1, Ordering::Relaxed);
                session = None;
            }
        }
    }
    acks.flush().expect("flush acks");
}

/// Runs the soak and checks it; panics only when the harness itself cannot go on (a daemon
/// that does not start), everything else is in the [`Report`].
pub fn run(plan: &Plan) -> Report {
    std::fs::create_dir_all(&plan.out).expect("out folder");
    let versioned = plan.plugins.join("versioned.wasm");
    put(&versioned, &plan.versions[0]);
    let mut daemon = Daemon::start(plan, 1);
    let shared = Arc::new(Shared {
        url: RwLock::new(daemon.url.clone()),
        run: AtomicU64::new(1),
        restarting: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        window: Mutex::new(Vec::new()),
        all: Mutex::new(Vec::new()),
        steps: AtomicU64::new(0),
        messages: AtomicU64::new(0),
        sessions: AtomicU64::new(0),
        abandoned: AtomicU64::new(0),
        unsent: AtomicU64::new(0),
        restart_refused: AtomicU64::new(0),
        restart_503: AtomicU64::new(0),
        failures: AtomicU64::new(0),
        failure_examples: Mutex::new(Vec::new()),
        version: [AtomicU64::new(0), AtomicU64::new(0)],
        mixed: AtomicU64::new(0),
    });
    let pid = Arc::new(AtomicU32::new(daemon.pid()));
    let t0 = Instant::now();
    let ack_files: Vec<PathBuf> = (0..plan.threads)
        .map(|k| plan.out.join(format!("acks-{k}.tsv")))
        .collect();
    let clients: Vec<_> = ack_files
        .iter()
        .enumerate()
        .map(|(k, file)| {
            let (plan, shared, file) = (plan.clone(), shared.clone(), file.clone());
            std::thread::spawn(move || client(&plan, &shared, k, t0, &file))
        })
        .collect();
    // The swapper: version 2, 1, 2, … into place by an atomic rename.
    let swapper = {
        let (plan, shared) = (plan.clone(), shared.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            let mut next = Instant::now() + plan.swap_every;
            while !shared.stop.load(Ordering::Relaxed) {
                sleep_until(next, &shared.stop);
                next += plan.swap_every;
                swaps += 1;
                put(&versioned, &plan.versions[(swaps % 2) as usize]);
            }
            swaps
        })
    };
    // The MCP killer: SIGKILL to the server under the current daemon; it notes each server
    // process it sees, so restarts show as new pids.
    let mcp = {
        let (plan, shared, pid) = (plan.clone(), shared.clone(), pid.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            let mut kills = 0u64;
            let mut next = Instant::now() + plan.mcp_kill_every;
            while !shared.stop.load(Ordering::Relaxed) {
                let daemon = pid.load(Ordering::Relaxed);
                let servers: Vec<u32> = processes_with(&plan.mcp_marker)
                    .into_iter()
                    .filter(|(_, ppid)| *ppid == daemon)
                    .map(|(p, _)| p)
                    .collect();
                seen.extend(servers.iter().copied());
                if Instant::now() >= next {
                    next += plan.mcp_kill_every;
                    for p in servers {
                        let _ = Command::new("kill")
                            .args(["-KILL", &p.to_string()])
                            .status();
                        kills += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (kills, seen)
        })
    };
    // The conductor: a sample each second, and the daemon killed and restarted on schedule.
    let mut samples = Vec::new();
    let mut run_started = Instant::now();
    let mut run = 1u64;
    let mut kills = 0u64;
    let mut next_sample = t0 + Duration::from_secs(1);
    let mut steps_before = 0u64;
    let mut csv =
        BufWriter::new(std::fs::File::create(plan.out.join("samples.csv")).expect("samples.csv"));
    csv.write_all(CSV_HEADER.as_bytes())
        .expect("write samples.csv");
    let (mut restart_before, mut failures_before) = (0u64, 0u64);
    while t0.elapsed() < plan.duration {
        sleep_until(next_sample, &shared.stop);
        next_sample += Duration::from_secs(1);
        let mut lat = std::mem::take(&mut *shared.window.lock().unwrap());
        lat.sort_unstable();
        let pick = |p: f64| {
            if lat.is_empty() {
                0.0
            } else {
                lat[((lat.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
            }
        };
        let (rss, threads, fds) = proc_figures(daemon.pid()).unwrap_or_default();
        let steps = shared.steps.load(Ordering::Relaxed);
        let restart = shared.restart_refused.load(Ordering::Relaxed)
            + shared.restart_503.load(Ordering::Relaxed);
        let failures = shared.failures.load(Ordering::Relaxed);
        samples.push(Sample {
            t: t0.elapsed().as_secs_f64(),
            run,
            steps: steps - steps_before,
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
            rss_kib: rss,
            fds,
            threads,
            restart_errors: restart - restart_before,
            failures: failures - failures_before,
        });
        csv.write_all(samples[samples.len() - 1].csv_row().as_bytes())
            .and_then(|()| csv.flush())
            .expect("write samples.csv");
        shared.all.lock().unwrap().extend(lat);
        (steps_before, restart_before, failures_before) = (steps, restart, failures);
        if run_started.elapsed() >= plan.kill_every
            && t0.elapsed() + Duration::from_secs(5) < plan.duration
        {
            shared.restarting.store(true, Ordering::Relaxed);
            daemon.kill9();
            kills += 1;
            run += 1;
            daemon = Daemon::start(plan, run);
            pid.store(daemon.pid(), Ordering::Relaxed);
            *shared.url.write().unwrap() = daemon.url.clone();
            shared.run.store(run, Ordering::Relaxed);
            shared.restarting.store(false, Ordering::Relaxed);
            run_started = Instant::now();
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    let elapsed = t0.elapsed();
    let swaps = swapper.join().expect("the swapper panicked");
    let (mcp_kills, mcp_seen) = mcp.join().expect("the MCP killer panicked");
    daemon.stop();
    // A server under a stopped or killed daemon reads EOF and exits; give it a moment. Only
    // the servers seen under this soak's daemons count (other tests run their own).
    let mut mcp_leaked = 0;
    for _ in 0..50 {
        let alive: Vec<u32> = processes_with(&plan.mcp_marker)
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| mcp_seen.contains(p))
            .collect();
        mcp_leaked = alive.len() as u64;
        if mcp_leaked == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mcp_seen = mcp_seen.len() as u64;

    let mut all = std::mem::take(&mut *shared.all.lock().unwrap());
    all.sort_unstable();
    let p99_all_ms = if all.is_empty() {
        0.0
    } else {
        all[((all.len() - 1) as f64 * 0.99).round() as usize] as f64 / 1000.0
    };
    let mut report = Report {
        elapsed,
        runs: run_reports(&samples, plan),
        samples,
        acked_steps: shared.steps.load(Ordering::Relaxed),
        messages: shared.messages.load(Ordering::Relaxed),
        sessions: shared.sessions.load(Ordering::Relaxed),
        abandoned_sessions: shared.abandoned.load(Ordering::Relaxed),
        unsent: shared.unsent.load(Ordering::Relaxed),
        restart_refused: shared.restart_refused.load(Ordering::Relaxed),
        restart_503: shared.restart_503.load(Ordering::Relaxed),
        failures: shared.failures.load(Ordering::Relaxed),
        failure_examples: shared.failure_examples.lock().unwrap().clone(),
        version_steps: [
            shared.version[0].load(Ordering::Relaxed),
            shared.version[1].load(Ordering::Relaxed),
        ],
        mixed_requests: shared.mixed.load(Ordering::Relaxed),
        swaps,
        daemon_kills: kills,
        mcp_kills,
        mcp_processes_seen: mcp_seen,
        mcp_leaked,
        p99_all_ms,
        ..Report::default()
    };
    if plan.verify {
        verify(&plan.state, &ack_files, &mut report);
    }
    report
}

/// Per run: the median RSS (and the largest descriptor and thread counts) of the first
/// window after warm-up against the run's last window.
fn run_reports(samples: &[Sample], plan: &Plan) -> Vec<RunReport> {
    let mut out = Vec::new();
    let runs: std::collections::BTreeSet<u64> = samples.iter().map(|s| s.run).collect();
    for run in runs {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.run == run).collect();
        let start = of[0].t;
        let warm = plan.warmup.as_secs_f64();
        let window = plan.window.as_secs_f64();
        let end = of[of.len() - 1].t;
        let first: Vec<&&Sample> = of
            .iter()
            .filter(|s| s.t >= start + warm && s.t < start + warm + window)
            .collect();
        let last: Vec<&&Sample> = of.iter().filter(|s| s.t > end - window).collect();
        let judged =
            end - start >= warm + 2.0 * window - 1.0 && !first.is_empty() && !last.is_empty();
        let median = |xs: &[&&Sample]| {
            let mut v: Vec<u64> = xs.iter().map(|s| s.rss_kib).collect();
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        let max =
            |xs: &[&&Sample], f: fn(&Sample) -> u64| xs.iter().map(|s| f(s)).max().unwrap_or(0);
        out.push(RunReport {
            run,
            seconds: end - start + 1.0,
            steps: of.iter().map(|s| s.steps).sum(),
            rss_first_kib: median(&first),
            rss_last_kib: median(&last),
            fds_first: max(&first, |s| s.fds),
            fds_last: max(&last, |s| s.fds),
            threads_first: max(&first, |s| s.threads),
            threads_last: max(&last, |s| s.threads),
            judged,
        });
    }
    out
}

/// A session's format and its acknowledged steps (number, SHA-256 of the request's bytes).
type SessionAcks = (Format, Vec<(u64, String)>);

/// Every acknowledged step, rebuilt from the log the daemons left (Q4) and rendered in the
/// session's format, must hash to what the client was answered. `state` is the daemons' state
/// folder. Sessions are checked on as many threads as there are cores.
pub fn verify(state: &Path, ack_files: &[PathBuf], report: &mut Report) {
    let started = Instant::now();
    let mut by_session: BTreeMap<String, SessionAcks> = BTreeMap::new();
    for file in ack_files {
        let text = std::fs::read_to_string(file).expect("read acks");
        for line in text.lines() {
            let mut f = line.split('\t');
            let (Some(id), Some(n), Some(format), Some(sha)) =
                (f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let format: Format = format.parse().expect("a format");
            by_session
                .entry(id.to_string())
                .or_insert_with(|| (format, Vec::new()))
                .1
                .push((n.parse().unwrap_or(0), sha.to_string()));
        }
    }
    let store = promptd_store::SqliteStore::open(&state.join("sessions.db"))
        .expect("open the soak's session log");
    let sessions: Vec<(&String, &SessionAcks)> = by_session.iter().collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = sessions.len().div_ceil(threads).max(1);
    let parts: Vec<Report> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .chunks(chunk)
            .map(|part| {
                let store = &store;
                scope.spawn(move || {
                    let mut r = Report::default();
                    for (id, (format, steps)) in part {
                        verify_session(store, id, *format, steps, &mut r);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a verifying thread panicked"))
            .collect()
    });
    for p in parts {
        report.verified_steps += p.verified_steps;
        report.missing_steps += p.missing_steps;
        report.differing_steps += p.differing_steps;
        report.unacked_in_log += p.unacked_in_log;
        for e in p.verify_examples {
            if report.verify_examples.len() < 5 {
                report.verify_examples.push(e);
            }
        }
    }
    report.verify_seconds = started.elapsed().as_secs_f64();
}

fn verify_session(
    store: &promptd_store::SqliteStore,
    id: &str,
    format: Format,
    steps: &[(u64, String)],
    report: &mut Report,
) {
    let note = |report: &mut Report, what: String| {
        if report.verify_examples.len() < 5 {
            report.verify_examples.push(what);
        }
    };
    let events = match store.events(id) {
        Ok(e) => e,
        Err(e) => {
            report.missing_steps += steps.len() as u64;
            note(report, format!("session {id}: {e}"));
            return;
        }
    };
    let logged = promptd_core::session::step_count(&events);
    report.unacked_in_log += logged.saturating_sub(steps.len() as u64);
    for (n, sha) in steps {
        match promptd_core::session::rebuild(id, &events, *n) {
            Ok(frozen) => {
                // What GET …/steps/{n}/request answers, byte for byte.
                let rebuilt = formats::render(&frozen, format).to_string();
                if &sha256_hex(&rebuilt) == sha {
                    report.verified_steps += 1;
                } else {
                    report.differing_steps += 1;
                    note(
                        report,
                        format!("session {id} step {n} rebuilds differently"),
                    );
                }
            }
            Err(e) => {
                report.missing_steps += 1;
                note(report, format!("session {id} step {n}: {e}"));
            }
        }
    }
}

/// Writes `bytes` beside `path` and renames it into place (what a deploy does).
fn put(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("wasm.tmp");
    std::fs::write(&tmp, bytes).expect("write the plugin");
    std::fs::rename(&tmp, path).expect("rename the plugin into place");
}

fn sleep_until(at: Instant, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= at {
            return;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(200)));
    }
}

/// The config the soak serves: the example's agents and models, the bundled Rust plugins, the
/// swapped `versioned` plugin, and MCP server `time` (PyPI's mcp-server-time) at `mcp_command`.
/// `extra` is appended (a `[limits]` table, say).
pub fn config_text(mcp_command: &Path, extra: &str) -> String {
    format!(
        r#"plugin_dir = "."
tool_order = ["read_file", "list_dir", "<unlisted-tools>"]

[model]
max_tokens = 4096

[model.openai]
model = "gpt-4.1"

[model.anthropic]
model = "claude-sonnet-4-5"

[agents.coder]

[agents.reviewer]
parent = "coder"

[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}

[plugins.persona]
config = {{ text = "You are {{{{agent_name}}}}'s {{{{role}}}} side: {{{{style}}}}.", role = "engineering", style = "precise, brief, and honest about uncertainty" }}

[mcp.time]
command = {:?}
args = ["--local-timezone", "UTC"]
tool_prefix = "time_"
timeout_ms = 5000

{extra}
"#,
        mcp_command.display().to_string()
    )
}
