//! The soak of issue 32: an hour of paced tool-calling steps against a real `promptd serve`,
//! with a plugin swapped between two versions every second, the MCP server (PyPI's
//! mcp-server-time) killed every minute and the daemon killed with SIGKILL and restarted on the
//! same state every ten minutes. At the end every acknowledged step is read back from the log
//! and rebuilt, and each daemon run's RSS, descriptors and threads are judged flat.
//! The test kit's `soak` module (host/testkit/src/soak.rs) does the work; the e2e test `soak::`
//! runs it for three minutes in CI.
//!
//! Run: `cargo bench -p promptd --bench soak`. Environment (seconds unless said):
//! `SOAK_SECS` (3600), `SOAK_RATE` (2000 steps/s offered), `SOAK_THREADS` (32),
//! `SOAK_STEPS_PER_SESSION` (20), `SOAK_KILL_EVERY` (600), `SOAK_SWAP_EVERY` (1),
//! `SOAK_MCP_KILL_EVERY` (60), `SOAK_WARMUP` (180: the 256 MiB session cache fills first), `SOAK_WINDOW` (60), `SOAK_OUT` (a new
//! folder under target/soak), `SOAK_CONFIG_EXTRA` (TOML appended to the config, e.g.
//! `[limits]` keys), `PROMPTD_BIN` (the binary to soak).
//!
//! `SOAK_VERIFY_ONLY=OUT` checks an earlier run's out folder again (acknowledgements against
//! its state), without running anything.
//!
//! Output: the tables below on stdout, and in the out folder `samples.csv` (one row a second:
//! steps/s, p50 and p99 from the scheduled send, the daemon's RSS, descriptors and threads),
//! `soak.png` (drawn by benches/soak/plot.sh, matplotlib in a pinned venv), the daemon logs
//! and the clients' acknowledgements. The process exits 1 when a check failed.

use std::process::Command;
use std::time::Duration;

use promptd_testkit::bench::{self as support, env_or, rust_plugin_folder, Table};
use promptd_testkit::soak as driver;
use promptd_testkit::{build_wasm_workspace, repo_root};

fn main() {
    support::print_machine();
    if let Some(dir) = std::env::var_os("SOAK_VERIFY_ONLY") {
        verify_only(std::path::Path::new(&dir));
        return;
    }
    let bin = support::binaries().remove(0);
    let root = repo_root();
    let secs = |name: &str, default: u64| Duration::from_secs(env_or(name, default));
    let out = std::env::var_os("SOAK_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            root.join(format!("target/soak/{stamp}"))
        });
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("out folder");
    let plugins = out.join("plugins");
    rust_plugin_folder(&plugins);
    let mcp = root.join("tests/mcp/.venv/bin/mcp-server-time");
    if !mcp.exists() {
        let status = Command::new("bash")
            .arg(root.join("tests/mcp/install.sh"))
            .status()
            .expect("run tests/mcp/install.sh");
        assert!(status.success(), "tests/mcp/install.sh failed");
    }
    let config = out.join("promptd.toml");
    std::fs::write(
        &config,
        driver::config_text(
            &mcp,
            &std::env::var("SOAK_CONFIG_EXTRA").unwrap_or_default(),
        ),
    )
    .expect("write the config");
    let fixtures = build_wasm_workspace("tests/fixtures");
    let read = |name: &str| std::fs::read(fixtures.join(format!("{name}.wasm"))).expect(name);
    let plan = driver::Plan {
        bin: bin.path.clone(),
        plugins,
        config,
        state: out.join("state"),
        out: out.clone(),
        versions: [read("versioned_v1"), read("versioned_v2")],
        mcp_marker: "mcp-server-time".into(),
        duration: secs("SOAK_SECS", 3600),
        rate: env_or("SOAK_RATE", 2000.0),
        threads: env_or("SOAK_THREADS", 32),
        steps_per_session: env_or("SOAK_STEPS_PER_SESSION", 20),
        kill_every: secs("SOAK_KILL_EVERY", 600),
        swap_every: secs("SOAK_SWAP_EVERY", 1),
        mcp_kill_every: secs("SOAK_MCP_KILL_EVERY", 60),
        warmup: secs("SOAK_WARMUP", 180),
        window: secs("SOAK_WINDOW", 60),
        verify: false,
    };
    println!(
        "soak: {:?} at {} steps/s offered over {} threads, {} steps a session; daemon SIGKILL every {:?}, \
         plugin swap every {:?}, MCP server SIGKILL every {:?}; out: {}",
        plan.duration,
        plan.rate,
        plan.threads,
        plan.steps_per_session,
        plan.kill_every,
        plan.swap_every,
        plan.mcp_kill_every,
        out.display()
    );
    let mut report = driver::run(&plan);
    // The check runs in a fresh process of this bench (see `Plan::verify`).
    let checked = Command::new(std::env::current_exe().expect("this bench's path"))
        .env("SOAK_VERIFY_ONLY", &out)
        .output()
        .expect("run the check");
    let stdout = String::from_utf8_lossy(&checked.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SOAK_VERIFIED "))
        .unwrap_or_else(|| panic!("the check said nothing: {stdout}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("the check's JSON");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    report.verified_steps = n("verified");
    report.missing_steps = n("missing");
    report.differing_steps = n("differing");
    report.unacked_in_log = n("unacked_in_log");
    report.verify_seconds = v["seconds"].as_f64().unwrap_or(0.0);
    report.verify_examples = serde_json::from_value(v["examples"].clone()).unwrap_or_default();

    let mut totals = Table::new(&["measure", "value"]);
    let secs_run = report.elapsed.as_secs_f64();
    let rows: Vec<(&str, String)> = vec![
        ("elapsed", format!("{secs_run:.0} s")),
        (
            "steps acknowledged",
            format!(
                "{} ({:.0}/s)",
                report.acked_steps,
                report.acked_steps as f64 / secs_run
            ),
        ),
        (
            "replies recorded (POST …/messages)",
            report.messages.to_string(),
        ),
        (
            "sessions (abandoned after a cut)",
            format!("{} ({})", report.sessions, report.abandoned_sessions),
        ),
        (
            "p99 from the scheduled send, whole run",
            format!("{:.2} ms", report.p99_all_ms),
        ),
        (
            "slots unsent (a second or more behind)",
            report.unsent.to_string(),
        ),
        (
            "refused or cut by a restart, 503s in one",
            format!("{}, {}", report.restart_refused, report.restart_503),
        ),
        ("failed requests otherwise", report.failures.to_string()),
        (
            "steps rebuilt byte-identically from the log",
            format!(
                "{} of {} ({} missing, {} differing; {:.0} s to check)",
                report.verified_steps,
                report.acked_steps,
                report.missing_steps,
                report.differing_steps,
                report.verify_seconds
            ),
        ),
        (
            "steps in the log no client heard of",
            report.unacked_in_log.to_string(),
        ),
        (
            "steps with version 1, version 2, mixed",
            format!(
                "{}, {}, {}",
                report.version_steps[0], report.version_steps[1], report.mixed_requests
            ),
        ),
        ("plugin swaps", report.swaps.to_string()),
        ("daemon SIGKILLs", report.daemon_kills.to_string()),
        (
            "MCP SIGKILLs, server processes seen, outlived their daemon",
            format!(
                "{}, {}, {}",
                report.mcp_kills, report.mcp_processes_seen, report.mcp_leaked
            ),
        ),
    ];
    for (k, v) in rows {
        totals.row(vec![k.to_string(), v]);
    }
    println!();
    totals.print();

    let mut runs = Table::new(&[
        "daemon run",
        "seconds",
        "steps",
        "RSS first window",
        "RSS last window",
        "ratio",
        "fds first, last",
        "threads first, last",
        "judged",
    ]);
    for r in &report.runs {
        runs.row(vec![
            r.run.to_string(),
            format!("{:.0}", r.seconds),
            r.steps.to_string(),
            support::fmt_mib(r.rss_first_kib),
            support::fmt_mib(r.rss_last_kib),
            format!("x{:.3}", r.rss_ratio()),
            format!("{}, {}", r.fds_first, r.fds_last),
            format!("{}, {}", r.threads_first, r.threads_last),
            if r.judged { "yes" } else { "no (too short)" }.to_string(),
        ]);
    }
    println!();
    runs.print();

    let plot = Command::new("bash")
        .arg(root.join("host/cli/benches/soak/plot.sh"))
        .arg(out.join("samples.csv"))
        .arg(out.join("soak.png"))
        .status();
    match plot {
        Ok(s) if s.success() => println!("\nplot: {}", out.join("soak.png").display()),
        _ => println!("\nplot: host/cli/benches/soak/plot.sh failed; samples in samples.csv"),
    }
    let failures = report.failures();
    if failures.is_empty() {
        println!("\nevery check held");
    } else {
        println!("\nchecks that did not hold:");
        for f in &failures {
            println!("- {f}");
        }
        std::process::exit(1);
    }
}

/// Checks an earlier run's acknowledgements against its log again.
fn verify_only(out: &std::path::Path) {
    let acks: Vec<std::path::PathBuf> = std::fs::read_dir(out)
        .expect("read the out folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("acks-"))
        })
        .collect();
    let mut report = driver::Report::default();
    driver::verify(&out.join("state"), &acks, &mut report);
    println!(
        "{} steps rebuilt byte-identically, {} missing, {} differing, {} in the log unacknowledged; {:.1} s; {:?}",
        report.verified_steps,
        report.missing_steps,
        report.differing_steps,
        report.unacked_in_log,
        report.verify_seconds,
        report.verify_examples
    );
    println!(
        "SOAK_VERIFIED {}",
        serde_json::json!({
            "verified": report.verified_steps,
            "missing": report.missing_steps,
            "differing": report.differing_steps,
            "unacked_in_log": report.unacked_in_log,
            "seconds": report.verify_seconds,
            "examples": report.verify_examples,
        })
    );
}
