//! End-to-end: compiling a plugin is bounded (L7). Cranelift's cost grows faster than a
//! plugin's size, so a small hostile component (WAT generated here) could take minutes and
//! gigabytes to compile; the engine compiles in a child process (`promptd compile`) with a
//! deadline and an address-space cap, and refuses what goes over them. The other plugins keep
//! loading and serving, and the daemon never holds the compiler's memory.

use promptd_testkit as common;

use std::time::{Duration, Instant};

use common::daemon::{state_dir, Served};
use common::{fails, Folder};
use promptd_core::load::{self, CacheLookup};
use promptd_core::plugin::model::Scope;
use promptd_daemon::plugin_dir;
use promptd_engine::{cache, Compiler, WasmEngine};

/// A component with one core function of `n` `table.get`s: 100,000 of them (500 KB) take
/// cranelift about a minute and 1.4 GB (measured in-process on 2 cores), 20,000 take 4 s and
/// 310 MB. It is not a plugin (no world), so even compiled it is refused, but only after.
fn bomb(n: usize) -> Vec<u8> {
    let body = "(drop (table.get 0 (local.get 0)))\n".repeat(n);
    let text = format!(
        "(component (core module (table 1 funcref) (func (export \"f\") (param i32) {body})))"
    );
    wat::parse_str(text).expect("the bomb is valid WAT")
}

const GOOD: &str = "[plugins.good]\nconfig = { \"section.persona\" = \"0|still serving\" }\n";

/// Serves `folder` with `config` and checks the bomb is refused with `message` while `good`
/// loads and serves a step.
fn bomb_is_refused(folder: &Folder, config: &str, message: &str) {
    let config = folder.config(config);
    let (_tmp, state) = state_dir();
    let started = Instant::now();
    let d = Served::start(folder.path(), &config, &state);
    let loaded = started.elapsed();

    let bomb = d.plugin("bomb");
    assert_eq!(bomb["state"], "refused", "{bomb}");
    assert_eq!(bomb["last_error"]["code"], "compile_limit", "{bomb}");
    assert_eq!(bomb["last_error"]["message"], message, "{bomb}");
    assert_eq!(d.plugin("good")["state"], "loaded");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["request"]["system"], "still serving");
    // Unbounded, the bomb alone holds the first load for about a minute.
    assert!(
        loaded < Duration::from_secs(30),
        "loading took {loaded:?}: the compiler was not stopped at its bound"
    );
}

#[test]
fn l7_a_compile_over_its_deadline_is_refused_and_the_others_serve() {
    let folder = Folder::new().scripted("good").bytes("bomb", &bomb(100_000));
    bomb_is_refused(
        &folder,
        &format!("{GOOD}[plugins.bomb]\ncompile_timeout_ms = 1000\n"),
        "plugin `bomb`: compiling took longer than 1000 ms (compile_timeout_ms)",
    );
}

#[test]
fn l7_a_compile_over_its_memory_cap_is_refused_and_the_others_serve() {
    let folder = Folder::new().scripted("good").bytes("bomb", &bomb(100_000));
    bomb_is_refused(
        &folder,
        &format!("{GOOD}[plugins.bomb]\ncompile_memory_mb = 150\n"),
        "plugin `bomb`: compiling needed more than 150 MiB of memory (compile_memory_mb)",
    );
}

#[test]
fn l7_the_limits_come_from_limits_and_the_cli_is_bounded_too() {
    let folder = Folder::new().bytes("bomb", &bomb(100_000));
    let config = folder.config("[limits]\ncompile_timeout_ms = 500\n");
    let started = Instant::now();
    let line = fails(
        &[
            "plugin",
            "check",
            folder.path().join("bomb.wasm").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        "compile_limit",
    );
    assert_eq!(
        line,
        "error[compile_limit]: plugin `bomb`: compiling took longer than 500 ms (compile_timeout_ms)"
    );
    assert!(started.elapsed() < Duration::from_secs(20));

    for key in ["compile_timeout_ms", "compile_memory_mb"] {
        let config = folder.config(&format!("[limits]\n{key} = 0\n"));
        let line = folder.assemble_fails(&config, &[], "config_invalid");
        assert!(
            line.contains(&format!("limits.{key} must be greater than 0")),
            "{line}"
        );
        let config = folder.config(&format!("[plugins.bomb]\n{key} = 0\n"));
        let line = folder.assemble_fails(&config, &[], "config_invalid");
        assert!(
            line.contains(&format!("plugins.bomb.{key} must be greater than 0")),
            "{line}"
        );
    }
}

/// The peak resident memory of a process, in KiB (Linux).
fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn l7_the_daemon_never_holds_the_compilers_memory() {
    // 20,000 `table.get`s: within the default bounds, ~310 MB to compile in-process.
    let folder = Folder::new().scripted("good").bytes("bomb", &bomb(20_000));
    let config = folder.config(GOOD);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    // It compiled (in the child), then failed where any non-plugin does.
    assert_eq!(d.plugin("bomb")["last_error"]["code"], "wrong_world");
    let Some(peak) = peak_rss_kb(d.child.id()) else {
        return; // no /proc: nothing to measure
    };
    assert!(
        peak < 200 << 10,
        "the daemon peaked at {} MiB: it held the compiler's memory",
        peak >> 10
    );
}

#[test]
fn l7_the_compiler_child_writes_an_artifact_that_loads_serves_and_is_cached() {
    let folder = Folder::new().scripted("good");
    let config =
        folder.config("[plugins.good]\nconfig = { \"dynamic_section.hi\" = \"0|hi $agent\" }\n");
    let config = plugin_dir::read_config(&config).unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let engine = WasmEngine::new()
        .unwrap()
        .with_cache(cache_dir.path(), cache::DEFAULT_MAX_BYTES)
        .unwrap()
        .with_compiler(Compiler::new(env!("CARGO_BIN_EXE_promptd")));
    let file = plugin_dir::read(&folder.path().join("good.wasm")).unwrap();
    let (entry, lookup) = load::load(&engine, &file, &config).unwrap();
    assert_eq!(lookup, Some(CacheLookup::Miss));
    let step = promptd_core::plugin::model::Step {
        agent: "coder".into(),
        ..Default::default()
    };
    let text = entry
        .provider
        .section_text("hi", &Scope::Global, &step)
        .unwrap();
    assert_eq!(text, "hi coder");
    // The artifact went into the cache under its real name, and nothing was left beside it.
    let names: Vec<String> = std::fs::read_dir(cache_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].starts_with(&file.sha256) && names[0].ends_with(".cwasm"),
        "{names:?}"
    );
    let (_, lookup) = load::load(&engine, &file, &config).unwrap();
    assert_eq!(lookup, Some(CacheLookup::Hit));

    // Without a cache the child's artifact is loaded from a private temporary folder.
    let engine = WasmEngine::new()
        .unwrap()
        .with_compiler(Compiler::new(env!("CARGO_BIN_EXE_promptd")));
    let (entry, lookup) = load::load(&engine, &file, &config).unwrap();
    assert_eq!(lookup, None);
    let text = entry
        .provider
        .section_text("hi", &Scope::Global, &step)
        .unwrap();
    assert_eq!(text, "hi coder");

    // Bytes wasmtime refuses are `not_a_component`, as in-process.
    let folder = Folder::new().bytes("bad", b"\0asm\x0d\0\x01\0garbage");
    let file = plugin_dir::read(&folder.path().join("bad.wasm")).unwrap();
    let err = load::load(&engine, &file, &config).err().unwrap();
    assert_eq!(err.code(), "not_a_component", "{err}");
    assert!(err.to_string().starts_with("plugin `bad`: "), "{err}");
}
