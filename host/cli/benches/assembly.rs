//! Assembly alone (no HTTP, no store): the same contributions served by N WebAssembly plugins
//! built against each plugin world (0.3.0 and 0.2.0: one `evaluate` per plugin per step; 0.1.0:
//! one call per dynamic contribution) and by N native providers, so the table shows what the
//! component boundary costs in each world; and, for world 0.3.0, consecutive steps of one
//! session when every dynamic item declares what it reads (`cwd`), which changes nothing
//! between them, so no plugin is asked again.
//!
//! Run: `cargo bench -p promptd --bench assembly` (criterion; builds the test fixtures first).
//! Criterion's own arguments work after `--`, e.g. `-- static` to run one group.
//!
//! Method: the `bench` fixture (tests/fixtures/bench) declares, from its config, 6 sections,
//! 2 contexts, 2 variables and 2 tools named after its `prefix`; with `dynamic_every = 3`,
//! 3 of its 10 sections, contexts and variables are dynamic (30%), else all are static. It is
//! copied under N file names (b00.wasm, b01.wasm, …) and loaded with `WasmEngine` through
//! `promptd_core::load::load_all`, each copy with its own prefix. `wasm 0.3.0` is the fixture
//! built now; `wasm 0.2.0` and `wasm 0.1.0` are the same source built against those worlds
//! before they moved (tests/fixtures/plugin-0.2.0/bench.wasm.gz, plugin-0.1.0/bench.wasm.gz). The native side builds the same declarations with
//! `NativePlugin` from the same shape (tests/fixtures/bench-shape), and the bench first checks that
//! all three assemble to the same system prompt, runtime context and tools. One
//! `promptd_core::assembly::assemble` per iteration, for agent `default` at step 7 with the
//! facts `cwd` and `git_branch` (and `ASSEMBLY_EXTRA_FACTS` more, 0 by default: what lowering
//! facts no plugin reads costs). The table is criterion's median time per assembly.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use promptd_core::assembly;
use promptd_core::config::{AgentSettings, Config};
use promptd_core::load;
use promptd_core::plugin::model::Step;
use promptd_core::plugin::provider::NativePlugin;
use promptd_core::plugin::registry::{PluginEntry, PluginOptions, Registry};
use promptd_daemon::plugin_dir;
use promptd_engine::{cache, WasmEngine};
use promptd_testkit::bench as support;
use promptd_testkit::shape::{dynamic_text, Item, ItemKind, Shape, TOOL_PARAMETERS};

const COUNTS: [usize; 3] = [1, 10, 50];
/// (criterion group, label, dynamic_every)
const MODES: [(&str, &str, usize); 2] =
    [("static", "all static", 0), ("dynamic30", "30% dynamic", 3)];

fn prefix(i: usize) -> String {
    format!("b{i:02}")
}

/// The default agent's plan, as the daemon resolves it (no config: chain `global → default`).
fn plan() -> AgentSettings {
    AgentSettings::resolve(&Config::default(), "default", |_| None).expect("the default agent")
}

fn step() -> Step {
    let plan = plan();
    Step {
        agent: plan.agent.clone(),
        scope_chain: plan.scope_chain.clone(),
        session_id: "bench".into(),
        step_number: 7,
        facts: BTreeMap::from([
            ("cwd".to_string(), "/src/app".to_string()),
            ("git_branch".to_string(), "main".to_string()),
        ])
        .into_iter()
        .chain(
            (0..support::env_or("ASSEMBLY_EXTRA_FACTS", 0usize)).map(|i| {
                (
                    format!("extra_{i:03}"),
                    format!("a value of fact {i:03} ......"),
                )
            }),
        )
        .collect(),
        inputs: Default::default(),
    }
}

/// The text of a dynamic item, from the step (the plugin computes the same).
fn text(item: &Item, s: &Step) -> String {
    dynamic_text(
        item,
        s.step_number,
        s.facts.get("cwd").map_or("", String::as_str),
    )
}

/// What every dynamic item reads in the `reads` case (world 0.3.0): the fact `cwd` only.
fn reads_cwd() -> promptd_core::plugin::model::Reads {
    promptd_core::plugin::model::Reads {
        facts: ["cwd".to_string()].into(),
        ..Default::default()
    }
}

/// N native providers, each declaring what the fixture declares under its prefix (and, with
/// `reads`, that its dynamic items read `cwd` only).
fn native_registry(n: usize, dynamic_every: usize, reads: bool) -> Registry {
    let mut registry = Registry::new();
    for i in 0..n {
        let mut plugin = NativePlugin::new();
        for item in Shape::new(&prefix(i), dynamic_every).items() {
            let (name, order) = (item.name.clone(), item.order);
            plugin = match (item.kind, item.dynamic) {
                (ItemKind::Section, false) => plugin.section(&name, order, &item.text),
                (ItemKind::Section, true) => {
                    plugin.dynamic_section(&name, order, move |s| Ok(text(&item, s)))
                }
                (ItemKind::Context, false) => plugin.context(&name, order, &item.text),
                (ItemKind::Context, true) => {
                    plugin.dynamic_context(&name, order, move |s| Ok(text(&item, s)))
                }
                (ItemKind::Variable, false) => plugin.variable(&name, &item.text),
                (ItemKind::Variable, true) => {
                    plugin.dynamic_variable(&name, move |s| Ok(Some(text(&item, s))))
                }
                (ItemKind::Tool, _) => plugin.tool(&name, &item.text, TOOL_PARAMETERS),
            };
        }
        let (mut declaration, provider) = plugin.build();
        declaration.reads = reads.then(reads_cwd);
        let entry = PluginEntry::new(&prefix(i), declaration, provider, PluginOptions::default())
            .expect("native plugin");
        registry = registry.with_plugin(entry).expect("no conflicts");
    }
    registry
}

/// N copies of the fixture in `dir`, loaded as `promptd serve` loads a plugin folder.
fn wasm_registry(
    engine: &WasmEngine,
    wasm: &Path,
    dir: &Path,
    n: usize,
    dynamic_every: usize,
    reads: bool,
) -> Registry {
    std::fs::create_dir_all(dir).expect("plugin folder");
    let mut config = String::from("plugin_dir = \".\"\n");
    let reads = if reads { ", reads = \"cwd\"" } else { "" };
    for i in 0..n {
        let p = prefix(i);
        std::fs::copy(wasm, dir.join(format!("{p}.wasm"))).expect("copy the fixture");
        config.push_str(&format!(
            "[plugins.{p}]\nconfig = {{ prefix = \"{p}\", dynamic_every = \"{dynamic_every}\"{reads} }}\n"
        ));
    }
    let path = dir.join("promptd.toml");
    std::fs::write(&path, config).expect("write config");
    let config = plugin_dir::read_config(&path).expect("config");
    let files = plugin_dir::read_all(dir).expect("read plugins");
    let loaded = load::load_all(engine, files, &config);
    assert!(
        loaded.refused.is_empty(),
        "refused: {:?}",
        loaded
            .refused
            .iter()
            .map(|r| r.error.to_string())
            .collect::<Vec<_>>()
    );
    loaded.registry
}

/// The `world` (0.1.0 or 0.2.0) build of the fixture, unpacked into `dir`.
fn old_world_bench(dir: &Path, world: &str) -> std::path::PathBuf {
    let packed =
        promptd_testkit::repo_root().join(format!("tests/fixtures/plugin-{world}/bench.wasm.gz"));
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(&packed)
        .output()
        .expect("run gzip");
    assert!(out.status.success(), "gzip -dc {}", packed.display());
    let path = dir.join(format!("bench-{world}.wasm"));
    std::fs::write(&path, out.stdout).expect("write the old fixture");
    path
}

/// Criterion's median estimate for `group/function/n` from this run, if there is one.
fn median(
    dir: &Path,
    group: &str,
    function: &str,
    n: usize,
    since: std::time::SystemTime,
) -> Option<Duration> {
    let path = dir
        .join(group)
        .join(function)
        .join(n.to_string())
        .join("new/estimates.json");
    let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
    if modified < since {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
    Some(Duration::from_secs_f64(
        v["median"]["point_estimate"].as_f64()? / 1e9,
    ))
}

/// Times the three registries of one size in turn, round after round, so a noisy neighbour
/// slows all three alike: the median per-assembly time of each, and the median of the
/// per-round ratios against native.
fn interleaved(
    registries: &[&Registry; 3],
    step: &Step,
    options: &assembly::Options,
) -> [(Duration, f64); 3] {
    const ROUNDS: usize = 41;
    let batch = {
        // About 2 ms of the slowest per batch.
        let t = std::time::Instant::now();
        assembly::assemble(registries[1], step, options).expect("assemble");
        (Duration::from_millis(2).as_nanos() / t.elapsed().as_nanos().max(1)).clamp(1, 2000) as u32
    };
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mut ratios: [Vec<f64>; 3] = Default::default();
    for round in 0..ROUNDS {
        let mut this = [Duration::ZERO; 3];
        for k in 0..3 {
            let i = (k + round) % 3; // rotate who goes first
            let t = std::time::Instant::now();
            for _ in 0..batch {
                std::hint::black_box(
                    assembly::assemble(registries[i], step, options).expect("assemble"),
                );
            }
            this[i] = t.elapsed() / batch;
        }
        for i in 0..3 {
            times[i].push(this[i]);
            ratios[i].push(this[i].as_secs_f64() / this[2].as_secs_f64());
        }
    }
    let mut out = [(Duration::ZERO, 0.0); 3];
    for i in 0..3 {
        times[i].sort();
        ratios[i].sort_by(f64::total_cmp);
        out[i] = (times[i][ROUNDS / 2], ratios[i][ROUNDS / 2]);
    }
    out
}

fn main() {
    let started = std::time::SystemTime::now();
    support::print_machine();
    let profile = support::env_or("ASSEMBLY_PROFILE_SECS", 0u64);
    if profile > 0 {
        // For `perf record`: native assembly only (10 plugins, 30% dynamic), nothing else.
        let (options, step, registry) = (
            plan().options_for("bench".into()),
            step(),
            native_registry(10, 3, false),
        );
        let until = std::time::Instant::now() + Duration::from_secs(profile);
        let mut n = 0u64;
        while std::time::Instant::now() < until {
            for _ in 0..1000 {
                std::hint::black_box(
                    assembly::assemble(&registry, &step, &options).expect("assemble"),
                );
            }
            n += 1000;
        }
        println!(
            "native, 10 plugins, 30% dynamic: {:.2} µs per assembly",
            profile as f64 * 1e6 / n as f64
        );
        return;
    }
    let wasm = promptd_testkit::build_wasm_workspace("tests/fixtures").join("bench.wasm");
    let work = support::scratch("assembly");
    let old = old_world_bench(work.path(), "0.1.0");
    let v2 = old_world_bench(work.path(), "0.2.0");
    let worlds = [
        ("wasm-0.3.0", &wasm),
        ("wasm-0.1.0", &old),
        ("wasm-0.2.0", &v2),
    ];
    let engine = WasmEngine::new()
        .expect("engine")
        .with_cache(&work.path().join("cache"), cache::DEFAULT_MAX_BYTES)
        .expect("compile cache");
    let out = promptd_testkit::repo_root().join("target/criterion");
    let mut c = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .output_directory(&out)
        .configure_from_args();
    let options = plan().options_for("bench".into());
    let step = step();
    let mut side_by_side = Vec::new();
    let mut reads_case = None;
    for (group, _, every) in MODES {
        let mut g = c.benchmark_group(group);
        for n in COUNTS {
            let native_registry = native_registry(n, every, false);
            let b = assembly::assemble(&native_registry, &step, &options).expect("native assembly");
            let mut built = Vec::new();
            for (name, file) in worlds {
                let dir = work.path().join(format!("{group}-{name}-{n}"));
                let registry = wasm_registry(&engine, file, &dir, n, every, false);
                let a = assembly::assemble(&registry, &step, &options).expect("wasm assembly");
                assert_eq!(
                    (&a.system, &a.runtime_context, &a.tools),
                    (&b.system, &b.runtime_context, &b.tools),
                    "{name} and native plugins must assemble the same ({group}, N = {n})"
                );
                g.bench_with_input(BenchmarkId::new(name, n), &registry, |bench, r| {
                    bench.iter(|| assembly::assemble(r, &step, &options).expect("assemble"))
                });
                built.push(registry);
            }
            g.bench_with_input(
                BenchmarkId::new("native", n),
                &native_registry,
                |bench, r| bench.iter(|| assembly::assemble(r, &step, &options).expect("assemble")),
            );
            if every > 0 {
                let new = built.remove(0);
                let old = built.remove(0);
                side_by_side.push((n, new, old, native_registry));
            }
            if every > 0 && n == 10 {
                // World 0.3.0, every dynamic item reading `cwd` only, a session's steps.
                let native_reads = self::native_registry(n, every, true);
                let dir = work.path().join(format!("{group}-reads-{n}"));
                let wasm_reads = wasm_registry(&engine, &wasm, &dir, n, every, true);
                reads_case = Some((n, wasm_reads, native_reads));
            }
        }
        g.finish();
    }
    c.final_summary();

    let mut table = support::Table::new(&[
        "contributions",
        "plugins",
        "calls 0.1.0",
        "calls 0.3.0",
        "0.1.0 p50",
        "0.3.0 p50",
        "native p50",
        "0.1.0 / native",
        "0.3.0 / native",
        "0.1.0 per call",
        "0.3.0 per plugin",
    ]);
    for (group, label, every) in MODES {
        for n in COUNTS {
            let p50 = |f: &str| median(&out, group, f, n, started);
            let (old, new, nat) = (p50("wasm-0.1.0"), p50("wasm-0.3.0"), p50("native"));
            let dynamic = Shape::new("x", every)
                .items()
                .iter()
                .filter(|i| i.dynamic)
                .count();
            // 0.1.0 calls once per dynamic item, 0.2.0 and 0.3.0 once per plugin with any.
            let (old_calls, new_calls) = (dynamic * n, if dynamic > 0 { n } else { 0 });
            let show = |d: Option<Duration>| d.map_or("-".into(), support::fmt_duration);
            let vs = |w: Option<Duration>| match (w, nat) {
                (Some(w), Some(nat)) => support::ratio(w.as_secs_f64(), nat.as_secs_f64()),
                _ => "-".into(),
            };
            // What the boundary adds over native, shared out per call (or per plugin).
            let over = |w: Option<Duration>, calls: usize| match (w, nat) {
                (Some(w), Some(nat)) if calls > 0 => {
                    support::fmt_duration(w.saturating_sub(nat) / calls as u32)
                }
                _ => "-".into(),
            };
            table.row(vec![
                label.to_string(),
                n.to_string(),
                old_calls.to_string(),
                new_calls.to_string(),
                show(old),
                show(new),
                show(nat),
                vs(old),
                vs(new),
                over(old, old_calls),
                over(new, new_calls),
            ]);
        }
    }
    println!();
    table.print();

    // The same dynamic cases again, the three kinds timed in turn (see `interleaved`).
    let mut table = support::Table::new(&[
        "30% dynamic, plugins",
        "0.1.0 p50",
        "0.3.0 p50",
        "native p50",
        "0.1.0 / native",
        "0.3.0 / native",
        "0.3.0 / 0.1.0",
        "0.3.0 per plugin",
    ]);
    for (n, new, old, native) in &side_by_side {
        let [(t_new, r_new), (t_old, r_old), (t_nat, _)] =
            interleaved(&[new, old, native], &step, &options);
        table.row(vec![
            n.to_string(),
            support::fmt_duration(t_old),
            support::fmt_duration(t_new),
            support::fmt_duration(t_nat),
            format!("x{r_old:.2}"),
            format!("x{r_new:.2}"),
            format!("x{:.2}", r_new / r_old),
            support::fmt_duration(t_new.saturating_sub(t_nat) / *n as u32),
        ]);
    }
    println!();
    println!("Interleaved, {} rounds:", 41);
    table.print();

    if let Some((n, wasm_reads, native)) = &reads_case {
        let [(t_wasm, r_wasm, calls), (t_nat, _, _)] =
            session_steps(&[wasm_reads, native], &step, &options);
        let [(t_every, _, _), _] = session_steps(
            &[&built_every(&engine, &wasm, work.path(), *n), native],
            &step,
            &options,
        );
        let mut table = support::Table::new(&[
            "a session's steps, 30% dynamic, plugins",
            "0.3.0 reads p50",
            "native reads p50",
            "0.3.0 / native",
            "calls per step",
            "0.3.0 without reads p50",
        ]);
        table.row(vec![
            n.to_string(),
            support::fmt_duration(t_wasm),
            support::fmt_duration(t_nat),
            format!("x{r_wasm:.2}"),
            format!("{calls:.0}"),
            support::fmt_duration(t_every),
        ]);
        println!();
        println!("World 0.3.0, every dynamic item reading `cwd` only; consecutive steps of one session (the step number changes, `cwd` does not), interleaved, {} rounds:", 41);
        table.print();
    }
}

/// The 0.3.0 fixture without `reads`, N copies: what a session's step costs when every dynamic
/// item is asked every step.
fn built_every(engine: &WasmEngine, wasm: &Path, work: &Path, n: usize) -> Registry {
    wasm_registry(engine, wasm, &work.join(format!("every-{n}")), n, 3, false)
}

/// Consecutive steps of one session on each registry in turn (each with its own kept answers,
/// [`assembly::Reuse`]): the median time per step, the median ratio against the last registry,
/// and the plugin calls per step.
fn session_steps(
    registries: &[&Registry; 2],
    step: &Step,
    options: &assembly::Options,
) -> [(Duration, f64, f64); 2] {
    const ROUNDS: usize = 41;
    const BATCH: u64 = 200;
    let mut reuse: [assembly::Reuse; 2] = Default::default();
    let mut steps = [step.clone(), step.clone()];
    let mut times: [Vec<Duration>; 2] = Default::default();
    let mut ratios: Vec<f64> = Vec::new();
    let mut calls = [0usize; 2];
    for round in 0..ROUNDS {
        let mut this = [Duration::ZERO; 2];
        for k in 0..2 {
            let i = (k + round) % 2;
            let t = std::time::Instant::now();
            for _ in 0..BATCH {
                steps[i].step_number += 1;
                let a = assembly::assemble_reusing(
                    registries[i],
                    &steps[i],
                    options,
                    None,
                    Some(&mut reuse[i]),
                )
                .expect("assemble");
                calls[i] += a.called;
                std::hint::black_box(a);
            }
            this[i] = t.elapsed() / BATCH as u32;
        }
        times[0].push(this[0]);
        times[1].push(this[1]);
        ratios.push(this[0].as_secs_f64() / this[1].as_secs_f64());
    }
    for t in &mut times {
        t.sort();
    }
    ratios.sort_by(f64::total_cmp);
    let per_step = |c: usize| c as f64 / (ROUNDS as u64 * BATCH) as f64;
    [
        (times[0][ROUNDS / 2], ratios[ROUNDS / 2], per_step(calls[0])),
        (times[1][ROUNDS / 2], 1.0, per_step(calls[1])),
    ]
}
