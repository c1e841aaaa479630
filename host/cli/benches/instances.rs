//! wasmtime's instance allocators side by side: the default on-demand allocator (what promptd
//! ships) and the pooling allocator (issue 11 asked whether it helps).
//!
//! Run: `cargo bench -p promptd --features pooling --bench instances` (criterion; builds the
//! test fixtures first). The `pooling` feature only exists for this bench.
//!
//! Method: one `WasmEngine` per allocator, each with its own warm compile cache, in one run.
//! - `load`: `WasmEngine::load` of the `bench` fixture (compiled code from the cache, so this is
//!   deserialize + instantiate + declare), what a hot swap or a restart pays per plugin;
//! - `replace`: the `scripted` fixture's `flaky_section` traps on every second call of an
//!   instance, so one iteration (two calls) drops a trapped instance and instantiates and
//!   declares a fresh one, what a trap costs the next step;
//! - `assembly`: one assembly over 10 copies of the `bench` fixture, 30% dynamic (warm
//!   instances), what every step pays.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use promptd_core::assembly;
use promptd_core::config::{AgentSettings, Config};
use promptd_core::load::{self, PluginFile};
use promptd_core::plugin::model::{Scope, Step};
use promptd_core::plugin::provider::Provider;
use promptd_core::plugin::sandbox::Sandbox;
use promptd_engine::{cache, WasmEngine};
use promptd_testkit::bench as support;
use sha2::{Digest, Sha256};

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
        facts: BTreeMap::from([("cwd".to_string(), "/src/app".to_string())]),
    }
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn engines(work: &Path) -> Vec<(&'static str, WasmEngine)> {
    let cached = |engine: WasmEngine, name: &str| {
        engine
            .with_cache(&work.join(name), cache::DEFAULT_MAX_BYTES)
            .expect("compile cache")
    };
    vec![
        (
            "on-demand",
            cached(WasmEngine::new().expect("engine"), "on-demand"),
        ),
        (
            "pooling",
            cached(
                WasmEngine::with_pooling_allocator().expect("pooling engine"),
                "pooling",
            ),
        ),
    ]
}

/// Ten copies of the bench fixture, 30% dynamic, through the same loader `promptd serve` uses.
fn registry(engine: &WasmEngine, bytes: &[u8]) -> promptd_core::plugin::registry::Registry {
    let mut config = String::new();
    let files = (0..10)
        .map(|i| {
            let p = format!("b{i:02}");
            config.push_str(&format!(
                "[plugins.{p}]\nconfig = {{ prefix = \"{p}\", dynamic_every = \"3\" }}\n"
            ));
            PluginFile {
                path: format!("{p}.wasm").into(),
                stem: p,
                bytes: bytes.to_vec(),
                sha256: sha(bytes),
            }
        })
        .collect::<Vec<_>>();
    let config = promptd_core::config::Config::parse(&config, "instances bench").expect("config");
    let loaded = load::load_all(engine, files, &config);
    assert!(loaded.refused.is_empty(), "a bench plugin was refused");
    loaded.registry
}

fn main() {
    support::print_machine();
    let out = promptd_testkit::build_wasm_workspace("tests/fixtures");
    let bench = std::fs::read(out.join("bench.wasm")).expect("bench.wasm");
    let scripted = std::fs::read(out.join("scripted.wasm")).expect("scripted.wasm");
    let (bench_sha, scripted_sha) = (sha(&bench), sha(&scripted));
    let work = support::scratch("instances");
    let engines = engines(work.path());
    let bench_config = vec![
        ("prefix".to_string(), "b00".to_string()),
        ("dynamic_every".to_string(), "3".to_string()),
    ];
    let flaky = vec![("flaky_section.f".to_string(), "1".to_string())];
    let step = step();
    let scope = Scope::Global;

    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .output_directory(&promptd_testkit::repo_root().join("target/criterion"))
        .configure_from_args();
    let mut g = c.benchmark_group("load");
    for (name, engine) in &engines {
        // First load compiles into the cache; measured loads read it.
        engine
            .load(
                "b00",
                &bench,
                &bench_sha,
                bench_config.clone(),
                Sandbox::default(),
            )
            .expect("load");
        g.bench_function(BenchmarkId::new(*name, "bench"), |b| {
            b.iter(|| {
                engine
                    .load(
                        "b00",
                        &bench,
                        &bench_sha,
                        bench_config.clone(),
                        Sandbox::default(),
                    )
                    .expect("load")
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("replace");
    for (name, engine) in &engines {
        let (_, provider, _) = engine
            .load(
                "f",
                &scripted,
                &scripted_sha,
                flaky.clone(),
                Sandbox::default(),
            )
            .expect("load");
        g.bench_function(BenchmarkId::new(*name, "trap"), |b| {
            b.iter(|| {
                let ok = provider.section_text("f", &scope, &step);
                let trapped = provider.section_text("f", &scope, &step);
                assert!(ok.is_ok() && trapped.is_err(), "flaky_section alternates");
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("assembly");
    let options = plan().options_for("bench".into());
    for (name, engine) in &engines {
        let registry = registry(engine, &bench);
        g.bench_function(BenchmarkId::new(*name, "10 plugins, 30% dynamic"), |b| {
            b.iter(|| assembly::assemble(&registry, &step, &options).expect("assemble"))
        });
    }
    g.finish();
    c.final_summary();
}
