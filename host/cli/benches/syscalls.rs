//! System calls per short step and per `GET /v1/health` (issue 50), counted from outside the
//! daemon with `strace -c -f` attached to the real `promptd serve` for a window of requests.
//!
//! Run: `cargo bench -p promptd --bench syscalls`; `PROMPTD_BIN_BASELINE` adds a binary to
//! compare (see the test kit's `bench` module). `SYSCALLS_STEPS` (1000): measured steps, after
//! 200 of warm-up. Needs `strace` (and ptrace allowed): `bash host/cli/benches/support/install.sh`
//! installs it.
//!
//! Method: the allocs bench's workload (one client on one keep-alive connection, the four
//! bundled Rust plugins, durable SQLite, a new session every 100 steps, `--no-watch`
//! implied by the bench daemon); then the same steps from 16 clients at once, each on its own
//! connection and sessions (group commit shares a sync, its file checks and SQLite's locks
//! among the appends that queue behind one). strace attaches to every thread of the daemon, the window's
//! requests run, strace detaches and prints its summary; each syscall's calls are divided by
//! the window's requests. strace slows every syscall, so its times are not reported: only
//! counts, which do not depend on speed except where a thread waits (`futex`, `epoll_wait`)
//! and may wake more or less often under a tracer.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use promptd_testkit::bench::{
    self as support, binaries, env_or, rust_plugin_folder, scratch, short_steps, Client, Daemon,
    Table,
};

/// Runs `work` with strace attached to `pid`'s threads; the calls per syscall.
fn traced(pid: u32, work: impl FnOnce()) -> BTreeMap<String, u64> {
    let out = tempfile::NamedTempFile::new().expect("a temp file");
    let mut strace = Command::new("strace")
        .args(["-c", "-f", "-q", "-o"])
        .arg(out.path())
        .args(["-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace runs (install it with host/cli/benches/support/install.sh)");
    // strace says nothing when attached; give it a moment to reach every thread.
    std::thread::sleep(Duration::from_millis(500));
    work();
    // SIGINT: strace detaches and writes its summary.
    let _ = Command::new("kill")
        .args(["-INT", &strace.id().to_string()])
        .status();
    let status = strace.wait().expect("strace ends");
    let mut err = String::new();
    if let Some(mut e) = strace.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let text = std::fs::read_to_string(out.path()).unwrap_or_default();
    assert!(
        text.contains("syscall"),
        "strace gave no summary ({status}): {err}{text}"
    );
    parse(&text)
}

/// strace -c's table: `% time seconds usecs/call calls [errors] syscall`.
fn parse(text: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 5 || cols[0].starts_with('%') || cols[0].starts_with('-') {
            continue;
        }
        let name = cols[cols.len() - 1];
        if name == "total" {
            continue;
        }
        if let Ok(n) = cols[3].parse::<u64>() {
            calls.insert(name.to_string(), n);
        }
    }
    calls
}

fn main() {
    support::print_machine();
    let n: u64 = env_or("SYSCALLS_STEPS", 1000);
    let work = scratch("syscalls");
    let plugins = work.path().join("plugins");
    let config = rust_plugin_folder(&plugins);
    // Per binary: its label, and the calls per syscall in the steps' and the health checks' windows.
    type Calls = BTreeMap<String, u64>;
    let mut rows: Vec<(String, Calls, Calls, Calls)> = Vec::new();
    for (i, bin) in binaries().iter().enumerate() {
        let daemon = Daemon::start(
            bin,
            &plugins,
            &config,
            &work.path().join(format!("state-{i}")),
        );
        daemon.wait_ready();
        let client = Client::new(&daemon.url);
        short_steps(&client, 200);
        let per_step = traced(daemon.pid, || short_steps(&client, n));
        let per_step_16 = traced(daemon.pid, || {
            std::thread::scope(|s| {
                for _ in 0..16 {
                    s.spawn(|| short_steps(&Client::new(&daemon.url), n / 16));
                }
            })
        });
        for _ in 0..200 {
            assert_eq!(client.get("/v1/health").0, 200);
        }
        let per_health = traced(daemon.pid, || {
            for _ in 0..n {
                assert_eq!(client.get("/v1/health").0, 200);
            }
        });
        rows.push((bin.label.to_string(), per_step, per_step_16, per_health));
        daemon.stop();
    }
    let mut table = Table::new(&[
        "binary",
        "syscall",
        "per short step, 1 client",
        "per short step, 16 clients",
        "per GET /v1/health",
    ]);
    let n16 = (n / 16 * 16) as f64;
    for (label, step, step16, health) in &rows {
        let total = |m: &BTreeMap<String, u64>| m.values().sum::<u64>() as f64 / n as f64;
        table.row(vec![
            label.clone(),
            "all".into(),
            format!("{:.1}", total(step)),
            format!("{:.1}", step16.values().sum::<u64>() as f64 / n16),
            format!("{:.1}", total(health)),
        ]);
        let mut names: Vec<&String> = step.keys().chain(health.keys()).collect();
        names.sort();
        names.dedup();
        names.sort_by_key(|s| std::cmp::Reverse(step.get(*s).copied().unwrap_or(0)));
        for name in names {
            let per =
                |m: &BTreeMap<String, u64>| m.get(name).copied().unwrap_or(0) as f64 / n as f64;
            if per(step) < 0.05 && per(health) < 0.05 {
                continue;
            }
            table.row(vec![
                label.clone(),
                name.clone(),
                format!("{:.2}", per(step)),
                format!("{:.2}", step16.get(name).copied().unwrap_or(0) as f64 / n16),
                format!("{:.2}", per(health)),
            ]);
        }
    }
    table.print();
}
