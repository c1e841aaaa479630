//! Issue 32's soak, three minutes long (the hour is `cargo bench -p promptd --bench soak`,
//! the test kit's `soak` module has both): a real daemon under paced tool-calling steps, a plugin
//! swapped every second, the MCP server killed every 20 s and the daemon killed with SIGKILL
//! every minute, on one state folder. Every acknowledged step is in the log and rebuilds
//! byte-identically, no request mixes the plugin's versions, nothing failed but what the kills
//! cut, and each daemon run's RSS, descriptors and threads stay flat.

use std::time::Duration;

use promptd_testkit::soak as driver;
use promptd_testkit::{bundled, fixture, repo_root};

/// The same checks as the hour, at the scale of a CI run on a debug build.
#[test]
fn soak_three_minutes_of_swaps_and_kills_lose_nothing() {
    let work = tempfile::tempdir().expect("tempdir");
    let plugins = work.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for p in ["identity", "persona", "tools", "workspace"] {
        std::fs::copy(
            bundled().join(format!("{p}.wasm")),
            plugins.join(format!("{p}.wasm")),
        )
        .unwrap();
    }
    let mcp = repo_root().join("tests/mcp/.venv/bin/mcp-server-time");
    assert!(
        mcp.exists(),
        "{} is missing: run tests/mcp/install.sh",
        mcp.display()
    );
    let config = work.path().join("promptd.toml");
    // A small session cache, full within the warm-up: a bounded cache filling is not growth.
    std::fs::write(
        &config,
        driver::config_text(&mcp, "[limits]\nsession_cache_mb = 1\n"),
    )
    .unwrap();
    let secs = |s: u64| Duration::from_secs(s);
    let plan = driver::Plan {
        bin: env!("CARGO_BIN_EXE_promptd").into(),
        plugins,
        config,
        state: work.path().join("state"),
        out: work.path().join("out"),
        versions: [
            std::fs::read(fixture("versioned_v1")).unwrap(),
            std::fs::read(fixture("versioned_v2")).unwrap(),
        ],
        mcp_marker: "mcp-server-time".into(),
        duration: secs(180),
        // A debug daemon beside the other tests: a rate it carries with room to spare.
        rate: 60.0,
        threads: 6,
        steps_per_session: 12,
        kill_every: secs(60),
        swap_every: secs(1),
        mcp_kill_every: secs(20),
        warmup: secs(15),
        window: secs(10),
        verify: true,
    };
    let report = driver::run(&plan);
    eprintln!(
        "soak: {} steps acknowledged and rebuilt ({} messages, {} sessions), {} daemon kills, {} MCP kills, {} swaps, {} cut by kills; runs: {:?}",
        report.acked_steps,
        report.messages,
        report.sessions,
        report.daemon_kills,
        report.mcp_kills,
        report.swaps,
        report.restart_refused + report.restart_503,
        report.runs
    );
    assert_eq!(report.failures(), Vec::<String>::new());
    assert_eq!(report.daemon_kills, 2, "{report:?}");
    assert!(report.mcp_kills >= 6, "{report:?}");
    assert!(report.swaps >= 170, "{report:?}");
}
