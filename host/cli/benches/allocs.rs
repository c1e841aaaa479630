//! Heap allocations per short step and per `GET /v1/health`, counted from outside the daemon:
//! a small preloaded library (`support/malloc_count.c`, built here with `cc`) counts every
//! `malloc`, `calloc` and `realloc` call of the real `promptd serve` process, as uprobes on
//! libc's would, so a baseline binary built before this bench existed is counted alike.
//!
//! Run: `cargo bench -p promptd --bench allocs`; `PROMPTD_BIN_BASELINE` adds a binary to compare
//! (see the test kit's `bench` module). `ALLOCS_STEPS` (1000): measured steps, after 200 of
//! warm-up.
//!
//! Method: one client on one keep-alive connection, the four bundled Rust plugins, durable
//! SQLite; each step is the load bench's short step (one user message, the facts `cwd` and
//! `git_branch`), with a new session every 100 steps (its creation counted, as in `load`).
//! The count is read from the shared counter before and after the window; nothing else talks
//! to the daemon (`--no-watch`).

use std::path::Path;

use promptd_testkit::bench::{
    self as support, binaries, env_or, rust_plugin_folder, scratch, short_steps, Client, Daemon,
    Table,
};

fn count(file: &Path) -> u64 {
    let bytes = std::fs::read(file).expect("the counter file");
    u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn build_counter(out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/support/malloc_count.c");
    let status = std::process::Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(&src)
        .status()
        .expect("cc (the C compiler SQLite's build already needs)");
    assert!(status.success(), "building {}", src.display());
}

fn main() {
    support::print_machine();
    let n: u64 = env_or("ALLOCS_STEPS", 1000);
    let work = scratch("allocs");
    let plugins = work.path().join("plugins");
    let config = rust_plugin_folder(&plugins);
    let lib = work.path().join("malloc_count.so");
    build_counter(&lib);
    let mut table = Table::new(&["binary", "allocations per short step", "per GET /v1/health"]);
    for (i, bin) in binaries().iter().enumerate() {
        let file = work.path().join(format!("count-{i}"));
        let daemon = Daemon::start_with_env(
            bin,
            &plugins,
            &config,
            &work.path().join(format!("state-{i}")),
            &[
                ("LD_PRELOAD", lib.to_str().expect("a UTF-8 path")),
                ("MALLOC_COUNT_FILE", file.to_str().expect("a UTF-8 path")),
            ],
        );
        let client = Client::new(&daemon.url);
        short_steps(&client, 200);
        let before = count(&file);
        assert!(
            before > 0,
            "the counter is not counting (LD_PRELOAD ignored?)"
        );
        short_steps(&client, n);
        let per_step = (count(&file) - before) as f64 / n as f64;
        for _ in 0..200 {
            assert_eq!(client.get("/v1/health").0, 200);
        }
        let before = count(&file);
        for _ in 0..n {
            assert_eq!(client.get("/v1/health").0, 200);
        }
        let per_health = (count(&file) - before) as f64 / n as f64;
        table.row(vec![
            bin.label.to_string(),
            format!("{per_step:.0}"),
            format!("{per_health:.0}"),
        ]);
        drop(daemon);
    }
    table.print();
}
