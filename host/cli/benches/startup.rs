//! Start-up of the real `promptd serve`: from spawn to the "promptd listening on" line (all
//! plugins loaded) and to the first successful step, with an empty and a warm compile cache.
//!
//! Run: `cargo bench -p promptd --bench startup`. Environment: `STARTUP_RUNS` (5) starts per
//! case and binary; `STARTUP_COLD_ALL=1` adds the seven plugins with an empty cache (the
//! JavaScript and Python components compile for 10–30 s each); `PROMPTD_BIN` /
//! `PROMPTD_BIN_BASELINE` (see the test kit's `bench` module).
//!
//! Method: every start gets a fresh state folder under target/bench-tmp (so a fresh SQLite
//! database), `--listen 127.0.0.1:0 --no-watch`. "Empty cache": `STATE/cache/` does not exist.
//! "Warm cache": `STATE/cache/` is first filled with the compiled entries of exactly this
//! binary and plugin set (kept in target/bench-cache/, seeded from the tests' compile cache
//! when it has them, else by one untimed start). The binaries take turns start by start. The
//! first step: `POST /v1/sessions` right after the listening line, then one small step (user
//! message, facts `cwd`, `git_branch`), tried again while the daemon answers 503 `loading`
//! (a daemon that listens first loads its plugins in the background). The compile-cache counters from /metrics confirm each case hit or missed.
//! Cases: the four bundled Rust plugins (identity, persona, tools, workspace); all seven
//! (plus skills in JavaScript, documents in Python, datetime in C) from target/plugins with
//! the repository's promptd.toml, as `cargo xtask run` serves them, when they are built.

use std::path::{Path, PathBuf};
use std::time::Duration;

use promptd_testkit::bench::{
    self as support, binaries, env_or, fmt_duration, percentile, ratio, rust_plugin_folder,
    scratch, small_step, Binary, Client, Daemon, Table,
};
use promptd_testkit::repo_root;
use sha2::{Digest, Sha256};

struct Case {
    label: &'static str,
    plugins: PathBuf,
    config: PathBuf,
    warm: bool,
    runs: usize,
    /// target/bench-cache/NAME-LABEL holds the warm entries per binary.
    seed_name: &'static str,
}

struct Sample {
    listening: Duration,
    first_step: Duration,
    hits: u64,
    misses: u64,
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read plugin");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn wasm_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("plugin folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    files.sort();
    files
}

/// Copies into `to` the cache entries in `from` of the plugins in `plugins`.
fn copy_entries(from: &Path, to: &Path, plugins: &Path) -> usize {
    std::fs::create_dir_all(to).expect("cache dir");
    let shas: Vec<String> = wasm_files(plugins).iter().map(|p| sha256_hex(p)).collect();
    let mut copied = 0;
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.ends_with(".cwasm") && shas.iter().any(|s| name.starts_with(s.as_str())) {
            std::fs::copy(entry.path(), to.join(&name)).expect("copy cache entry");
            copied += 1;
        }
    }
    copied
}

/// The warm cache of `case` for `bin`: filled once (from the tests' cache, then one untimed
/// start that compiles whatever is missing) and kept across runs.
fn seed(case: &Case, bin: &Binary) -> PathBuf {
    let state = repo_root()
        .join("target/bench-cache")
        .join(format!("{}-{}", case.seed_name, bin.label));
    let cache = state.join("cache");
    if !cache.is_dir() {
        copy_entries(
            &repo_root().join("target/test-compile-cache"),
            &cache,
            &case.plugins,
        );
    }
    eprintln!(
        "  seeding the warm cache of {} ({}) ...",
        case.label, bin.label
    );
    let daemon = Daemon::start(bin, &case.plugins, &case.config, &state);
    daemon.wait_ready();
    let (_, misses) = daemon.cache_counts();
    if misses > 0 {
        eprintln!("  compiled {misses} plugins into {}", cache.display());
    }
    daemon.stop();
    // The seed's own session database is not needed.
    let _ = std::fs::remove_file(state.join("sessions.db"));
    cache
}

fn start_once(case: &Case, bin: &Binary, state: &Path, seed: Option<&Path>) -> Sample {
    if let Some(seed) = seed {
        copy_entries(seed, &state.join("cache"), &case.plugins);
    }
    let daemon = Daemon::start(bin, &case.plugins, &case.config, state);
    let client = Client::new(&daemon.url);
    let session = client.session("coder");
    // A daemon that listens first answers 503 `loading` once a step has waited 30 s for the
    // plugins: a client tries again, and so does this one.
    let (status, text) = loop {
        let (status, text) = client.step(&session, &small_step(0));
        if status != 503 || !text.contains("\"loading\"") {
            break (status, text);
        }
    };
    let first_step = daemon.spawned.elapsed();
    assert_eq!(status, 200, "{}: first step: {text}", bin.label);
    let (hits, misses) = daemon.cache_counts();
    let listening = daemon.listening;
    daemon.stop();
    Sample {
        listening,
        first_step,
        hits,
        misses,
    }
}

fn main() {
    support::print_machine();
    let bins = binaries();
    let runs: usize = env_or("STARTUP_RUNS", 5);
    let cold_all = std::env::var("STARTUP_COLD_ALL").is_ok_and(|v| v == "1");
    let work = scratch("startup");
    let rust = work.path().join("plugins");
    let rust_config = rust_plugin_folder(&rust);
    let root = repo_root();
    let shipped = root.join("target/plugins");

    let mut cases = vec![
        Case {
            label: "4 Rust plugins, empty cache",
            plugins: rust.clone(),
            config: rust_config.clone(),
            warm: false,
            runs,
            seed_name: "rust4",
        },
        Case {
            label: "4 Rust plugins, warm cache",
            plugins: rust.clone(),
            config: rust_config.clone(),
            warm: true,
            runs,
            seed_name: "rust4",
        },
    ];
    let all = ["skills", "documents", "datetime"]
        .iter()
        .all(|p| shipped.join(format!("{p}.wasm")).is_file());
    if all {
        cases.push(Case {
            label: "7 plugins (JS, Python, C too), warm cache",
            plugins: shipped.clone(),
            config: root.join("promptd.toml"),
            warm: true,
            runs,
            seed_name: "all7",
        });
        if cold_all {
            cases.push(Case {
                label: "7 plugins (JS, Python, C too), empty cache",
                plugins: shipped.clone(),
                config: root.join("promptd.toml"),
                warm: false,
                runs: env_or("STARTUP_COLD_RUNS", 1),
                seed_name: "all7",
            });
        } else {
            println!("(STARTUP_COLD_ALL=1 adds the seven plugins with an empty cache)");
        }
    } else {
        println!(
            "target/plugins lacks skills/documents/datetime.wasm (`cargo xtask plugins`): \
             only the Rust cases run"
        );
    }

    let mut table = Table::new(&[
        "case",
        "binary",
        "starts",
        "to listening, median (min–max)",
        "to first step, median (min–max)",
        "cache hits/misses",
    ]);
    let mut n = 0;
    for case in &cases {
        let seeds: Vec<Option<PathBuf>> = bins
            .iter()
            .map(|b| case.warm.then(|| seed(case, b)))
            .collect();
        let mut samples: Vec<Vec<Sample>> = bins.iter().map(|_| Vec::new()).collect();
        for run in 0..case.runs {
            for i in 0..bins.len() {
                // Alternate who goes first.
                let i = if run % 2 == 0 { i } else { bins.len() - 1 - i };
                eprintln!(
                    "{} against {} (start {}) ...",
                    case.label,
                    bins[i].label,
                    run + 1
                );
                n += 1;
                let state = work.path().join(format!("state-{n}"));
                let s = start_once(case, &bins[i], &state, seeds[i].as_deref());
                eprintln!(
                    "  listening {}, first step {}",
                    fmt_duration(s.listening),
                    fmt_duration(s.first_step)
                );
                samples[i].push(s);
                let _ = std::fs::remove_dir_all(&state);
            }
        }
        let summary = |s: &[Sample], f: fn(&Sample) -> Duration| {
            let mut v: Vec<Duration> = s.iter().map(f).collect();
            v.sort();
            (percentile(&v, 0.5), v[0], *v.last().unwrap())
        };
        let mut medians = Vec::new();
        for (bin, s) in bins.iter().zip(&samples) {
            let l = summary(&s[..], |x| x.listening);
            let f = summary(&s[..], |x| x.first_step);
            medians.push((l.0, f.0));
            let (hits, misses) = (
                s.iter().map(|x| x.hits).sum::<u64>() / s.len() as u64,
                s.iter().map(|x| x.misses).sum::<u64>() / s.len() as u64,
            );
            table.row(vec![
                case.label.to_string(),
                bin.label.to_string(),
                s.len().to_string(),
                format!(
                    "{} ({}–{})",
                    fmt_duration(l.0),
                    fmt_duration(l.1),
                    fmt_duration(l.2)
                ),
                format!(
                    "{} ({}–{})",
                    fmt_duration(f.0),
                    fmt_duration(f.1),
                    fmt_duration(f.2)
                ),
                format!("{hits}/{misses}"),
            ]);
        }
        if let [cur, base] = &medians[..] {
            table.row(vec![
                case.label.to_string(),
                "current / baseline".into(),
                String::new(),
                ratio(cur.0.as_secs_f64(), base.0.as_secs_f64()),
                ratio(cur.1.as_secs_f64(), base.1.as_secs_f64()),
                String::new(),
            ]);
        }
    }
    println!();
    table.print();
}
