//! Counterfactual replay speed (issue 29): steps re-assembled and compared per second, on one
//! long recorded session with the four bundled Rust plugins (WebAssembly, wasmtime).
//!
//! Run: `cargo bench -p promptd --bench replay`. Environment: `REPLAY_STEPS` (2000),
//! `REPLAY_RUNS` (5).
//!
//! Method: the bundled Rust plugins (target/plugins, else built from plugins/) are loaded with
//! `WasmEngine` (compile cache in a scratch folder) under a config with Anthropic model settings
//! and a price. A session of `REPLAY_STEPS` steps is recorded in memory the way the daemon
//! records one (`step::plan`, the bodies appended and applied): agent-loop turns of two steps —
//! a user message (~150 bytes) whose reply calls `read_file`, then the step carrying its ~600
//! byte tool result, whose reply is text — each reply with a provider usage and a send time 30 s
//! after the one before, facts `cwd`, `git_branch`, `date`. Then `promptd_core::replay::replay`
//! of the whole log, timed end to end (decoding the log, assembling every step through the
//! plugins, planning, comparing with the recorded request, two cache models, pricing), for:
//! the recorded plugins and config (no step differs) and a candidate whose `persona` config
//! differs (every step differs at the system prompt), each with 1 and 2 assembling threads.
//! The table gives the best and the median of `REPLAY_RUNS` runs, as steps per second.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use promptd_core::cache::outcome::{Kind, Outcome};
use promptd_core::config::{AgentSettings, Config};
use promptd_core::conversation::{Message, ToolCall};
use promptd_core::formats::replies::ProviderUsage;
use promptd_core::formats::Format;
use promptd_core::ledger::Pricing;
use promptd_core::load;
use promptd_core::plugin::registry::Registry;
use promptd_core::replay::{self, Candidate};
use promptd_core::session::log::{Body, Recorded, SessionCreated};
use promptd_core::session::SessionState;
use promptd_core::step::{self, StepInput};
use promptd_core::store::Event;
use promptd_daemon::plugin_dir;
use promptd_engine::{cache, WasmEngine};
use promptd_testkit::bench::{self as support, env_or, rust_plugin_folder, scratch, Table};

const SESSION: &str = "bench-session";
const MODEL: &str = "claude-sonnet-4-5";

fn config_text(style: &str) -> String {
    format!(
        r#"plugin_dir = "."
tool_order = ["read_file", "list_dir", "<unlisted-tools>"]

[model]
max_tokens = 4096

[model.anthropic]
model = "{MODEL}"

[pricing."{MODEL}"]
input = 3.0
output = 15.0

[agents.coder]

[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}

[plugins.persona]
config = {{ text = "You are {{{{agent_name}}}}'s {{{{role}}}} side: {{{{style}}}}.", role = "engineering", style = "{style}" }}
"#
    )
}

fn load_registry(engine: &WasmEngine, dir: &std::path::Path, config: &Config) -> Registry {
    let loaded = load::load_all(
        engine,
        plugin_dir::read_all(dir).expect("read the plugins"),
        config,
    );
    if let Some(r) = loaded.refused.first() {
        panic!("{} refused: {}", r.file.display(), r.error);
    }
    loaded.registry
}

/// A tool result of about 600 bytes, different at every step.
fn tool_output(n: usize) -> String {
    (0..8)
        .map(|l| format!("{n:>5}:{l}  fn handler_{l}(request: &Request) -> Response {{ todo!() }}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Records `steps` steps in memory as the daemon does; returns the log.
fn record(registry: &Registry, plan: &AgentSettings, steps: usize) -> Vec<Event> {
    let mut state = SessionState::new(SESSION);
    let mut events = Vec::new();
    let mut clock = 1_800_000_000_000u64;
    let mut append = |state: &mut SessionState, bodies: Vec<Body>, clock: &mut u64| {
        *clock += 30_000;
        let first = state.last_seq() + 1;
        for (i, b) in bodies.iter().enumerate() {
            events.push(
                step::encode(b)
                    .expect("encode")
                    .recorded(first + i as u64, *clock),
            );
        }
        state.apply_planned(first, bodies).expect("apply");
    };
    append(
        &mut state,
        vec![Body::SessionCreated(SessionCreated {
            agent: "coder".into(),
            data_secret: Some("bench-secret".into()),
        })],
        &mut clock,
    );
    let facts: BTreeMap<String, String> = [
        ("cwd", "/src/app"),
        ("git_branch", "main"),
        ("date", "2026-12-02"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for n in 0..steps {
        let messages = if n % 2 == 0 {
            vec![Message::user(format!(
                "Step {n}: read the handler module and tell me which handlers are still \
                 unfinished, and what each of them should return."
            ))]
        } else {
            vec![Message::Tool {
                tool_call_id: format!("call_{}", n - 1),
                content: tool_output(n).into(),
                is_error: false,
            }]
        };
        let planned = step::plan(
            &mut state,
            registry,
            plan,
            SESSION,
            step::Serving::run("bench"),
            StepInput {
                messages,
                facts: facts.clone(),
                sent_at: None,
                client_tools: None,
            },
            Format::Anthropic,
        )
        .expect("a step");
        append(&mut state, planned.bodies, &mut clock);
        let bytes = state.render(Format::Anthropic).expect("render").len() as u64;
        let message = if n % 2 == 0 {
            Message::Assistant {
                content: "Let me read it.".into(),
                tool_calls: vec![ToolCall {
                    id: format!("call_{n}"),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": "src/handlers.rs"}),
                    arguments_text: None,
                }],
                blocks: Vec::new(),
                native: None,
            }
        } else {
            Message::Assistant {
                content: format!(
                    "Handlers 0 to 7 of step {n} are unfinished: each should return a Response."
                ),
                tool_calls: Vec::new(),
                blocks: Vec::new(),
                native: None,
            }
        };
        let reply = Body::AssistantMessage(Recorded {
            message,
            usage: Some(ProviderUsage {
                input_tokens: Some(bytes / 4),
                output_tokens: Some(40),
                cached_tokens: Some(bytes / 5),
                cache_write_tokens: Some(bytes / 40),
                cache_write_1h_tokens: None,
            }),
            cache: Some(Outcome {
                outcome: Kind::Hit,
                format: Format::Anthropic,
                model: MODEL.into(),
                sent_at_ms: clock + 100,
                expected_read: 0,
                lost: 0,
                gap_ms: None,
                part: None,
                plugin: None,
                cause: None,
            }),
            partial: None,
        });
        append(&mut state, vec![reply], &mut clock);
    }
    events
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    support::print_machine();
    let steps: usize = env_or("REPLAY_STEPS", 2000);
    let runs: usize = env_or("REPLAY_RUNS", 5);
    let work = scratch("replay");
    let dir = work.path().join("plugins");
    rust_plugin_folder(&dir);
    let engine = WasmEngine::new()
        .expect("engine")
        .with_cache(&work.path().join("cache"), cache::DEFAULT_MAX_BYTES)
        .expect("compile cache");
    let recorded_config = Config::parse(
        &config_text("precise, brief, and honest about uncertainty"),
        "promptd.toml",
    )
    .expect("config");
    let other_config =
        Config::parse(&config_text("terse, and blunt"), "promptd.toml").expect("candidate config");
    let recorded = load_registry(&engine, &dir, &recorded_config);
    let other = load_registry(&engine, &dir, &other_config);
    let plan = AgentSettings::resolve(&recorded_config, "coder", |_| None).expect("plan");
    let other_plan = AgentSettings::resolve(&other_config, "coder", |_| None).expect("plan");

    let started = Instant::now();
    let log = record(&recorded, &plan, steps);
    let recording = started.elapsed();
    let last_request = SessionState::from_log(SESSION, &log)
        .and_then(|mut state| state.render(Format::Anthropic))
        .expect("render")
        .len();
    println!(
        "recorded {steps} steps ({} events) in {:.2} s; the last request is {} KB",
        log.len(),
        recording.as_secs_f64(),
        last_request / 1024
    );

    let mut table = Table::new(&[
        "candidate",
        "assembling threads",
        "steps differing",
        "best",
        "median",
        "steps/s (best)",
        "steps/s (median)",
    ]);
    for (label, registry, plan, config) in [
        (
            "recorded plugins and config",
            &recorded,
            &plan,
            &recorded_config,
        ),
        ("persona config changed", &other, &other_plan, &other_config),
    ] {
        for workers in [1, 2] {
            let candidate = Candidate {
                registry,
                agent: plan,
                pricing: Pricing {
                    prices: &config.pricing,
                    rules: &config.cache,
                },
                format: None,
                workers,
            };
            let mut times = Vec::new();
            let mut differing = 0;
            for _ in 0..runs {
                let t = Instant::now();
                let r = replay::replay(SESSION, &log, &candidate).expect("replay");
                times.push(t.elapsed());
                assert_eq!(r.steps.len(), steps);
                differing = r.totals.differing_steps;
            }
            let best = *times.iter().min().expect("runs");
            let med = median(times);
            let rate = |d: Duration| format!("{:.0}", steps as f64 / d.as_secs_f64());
            table.row(vec![
                label.to_string(),
                workers.to_string(),
                differing.to_string(),
                support::fmt_duration(best),
                support::fmt_duration(med),
                rate(best),
                rate(med),
            ]);
        }
    }
    table.print();
}
