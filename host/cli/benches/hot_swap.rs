//! Hot-swap latency: from the atomic rename of a new plugin file into the watched folder to the
//! first assembly that sees it (p50, p99), for a plugin whose compiled code is cached and for
//! one that must be compiled. Also the slowest step that ran meanwhile, to show that no step
//! waits for a compile.
//!
//! Run: `cargo bench -p promptd --bench hot_swap [-- rust|js|python|c]...` (builds the test
//! fixtures, and the JavaScript, Python and C versions with their SDKs, first; `cargo xtask sdks`
//! installs those toolchains).
//! Method: an in-process daemon (the same `Daemon` + watcher `promptd serve` uses) on a temp
//! folder; a stepping thread assembles continuously; the main thread renames version N into
//! place and polls steps until the version marker flips. Uncached swaps append a unique custom
//! section to the component, so its SHA-256 (the cache key) is new while behaviour is the same.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use promptd_core::config::Config;
use promptd_core::formats::Format;
use promptd_daemon::{Daemon, StepInput, StepRequest};
use promptd_engine::{cache, WasmEngine};
use promptd_testkit::with_custom_section;

/// Versions 1 and 2 of a one-section plugin ("version N") in `lang`, built with its SDK.
fn sdk_versions(root: &Path, lang: &str) -> (Vec<u8>, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let build = |n: u32| {
        let (file, source) = match lang {
            "js" => ("plugin.js", format!(
                "import {{ Plugin, exportPlugin }} from \"promptd-sdk\";\n\
                 export const {{ declare, sectionText, contextText, variableValue, shownTools }} =\n\
                 \x20 exportPlugin(() => new Plugin().section(\"version\", 0, \"version {n}\"));\n"
            )),
            "python" => ("app.py", format!(
                "from promptd_sdk import Plugin, export_plugin\n\n\
                 WitWorld = export_plugin(lambda config: Plugin().section(\"version\", 0, \"version {n}\"))\n"
            )),
            "c" => ("plugin.c", format!(
                "#include \"promptd.h\"\n\
                 static void declare(const promptd_config *c, promptd_plugin *p) {{\n\
                 \x20   (void)c;\n    promptd_section(p, \"version\", 0, \"version {n}\");\n}}\n\
                 PROMPTD_EXPORT_PLUGIN(declare)\n"
            )),
            other => panic!("no SDK for {other}"),
        };
        let src = tmp.path().join(format!("v{n}"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join(file), source).unwrap();
        let out = tmp.path().join(format!("v{n}.wasm"));
        let status = Command::new("bash")
            .arg(root.join("sdk").join(lang).join("build.sh"))
            .arg(&src)
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("bash");
        assert!(status.success(), "building the {lang} version failed");
        std::fs::read(out).unwrap()
    };
    (build(1), build(2))
}

fn put(dir: &Path, bytes: &[u8]) {
    let tmp = dir.join(".versioned.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, dir.join("versioned.wasm")).unwrap();
}

fn marker(daemon: &Daemon, session: &str) -> String {
    let step = StepRequest::new(session, StepInput::default(), Format::Neutral);
    let body = daemon.step(step).expect("step").body.into_string();
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    body["system"].as_str().unwrap_or_default().to_string()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn run(label: &str, iterations: usize, cached: bool, v1: &[u8], v2: &[u8]) {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    put(&plugins, v1);
    let daemon = Arc::new(start(&plugins, &tmp.path().join("state")));
    let _watch = promptd_daemon::watch::watch(daemon.clone(), None).unwrap();
    let session = daemon.create_session("default").unwrap();
    if cached {
        // Put both versions in the compile cache first.
        put(&plugins, v2);
        while marker(&daemon, &session) != "version 2" {}
        put(&plugins, v1);
        while marker(&daemon, &session) != "version 1" {}
    }

    // A background stepper: the slowest step while swaps and compiles happen.
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(AtomicU64::new(0));
    let background = {
        let (daemon, stop, slowest) = (daemon.clone(), stop.clone(), slowest.clone());
        let session = daemon.create_session("default").unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                daemon
                    .step(StepRequest::new(
                        &*session,
                        StepInput::default(),
                        Format::Neutral,
                    ))
                    .unwrap();
                slowest.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };

    let mut latencies = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let (bytes, want) = if i % 2 == 0 {
            (v2, "version 2")
        } else {
            (v1, "version 1")
        };
        let bytes = if cached {
            bytes.to_vec()
        } else {
            with_custom_section(bytes, i as u64)
        };
        let started = Instant::now();
        put(&plugins, &bytes);
        while marker(&daemon, &session) != want {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "swap {i} never applied"
            );
        }
        latencies.push(started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    background.join().unwrap();
    latencies.sort();
    println!(
        "{label:<28} n={iterations:<3} p50 {:>7.1} ms   p99 {:>7.1} ms   max {:>7.1} ms   slowest concurrent step {:>6.1} ms",
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3,
        slowest.load(Ordering::Relaxed) as f64 / 1e3,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; other arguments choose languages.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |lang: &str| args.is_empty() || args.iter().any(|a| a == lang);
    let dir = promptd_testkit::build_wasm_workspace("tests/fixtures");
    let root = promptd_testkit::repo_root();
    println!(
        "hot-swap latency: rename into the folder -> first assembly that sees the new version"
    );
    if wanted("rust") {
        let v1 = std::fs::read(dir.join("versioned_v1.wasm")).unwrap();
        let v2 = std::fs::read(dir.join("versioned_v2.wasm")).unwrap();
        run("Rust plugin, cached", 60, true, &v1, &v2);
        run("Rust plugin, uncached", 30, false, &v1, &v2);
    }
    // Fewer uncached rounds for the 12-18 MB components: each compile takes seconds.
    for (lang, label, cached_n, uncached_n) in [
        ("c", "C", 60, 30),
        ("js", "JavaScript", 30, 6),
        ("python", "Python", 30, 6),
    ] {
        if wanted(lang) {
            let (v1, v2) = sdk_versions(&root, lang);
            println!("{label}: component {} KB", v1.len() / 1024);
            run(&format!("{label} plugin, cached"), cached_n, true, &v1, &v2);
            run(
                &format!("{label} plugin, uncached"),
                uncached_n,
                false,
                &v1,
                &v2,
            );
        }
    }
}

/// A daemon as `promptd serve` builds it: SQLite sessions and a compile cache in `state`.
fn start(plugins: &Path, state: &Path) -> Daemon {
    std::fs::create_dir_all(state).unwrap();
    let store = promptd_store::SqliteStore::open(&state.join("sessions.db")).unwrap();
    let engine = WasmEngine::new()
        .unwrap()
        .with_cache(&state.join("cache"), cache::DEFAULT_MAX_BYTES)
        .unwrap();
    Daemon::new(
        Arc::new(store),
        Arc::new(engine),
        Config::default(),
        plugins,
    )
    .unwrap()
}
