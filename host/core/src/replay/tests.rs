//! Replays of logs held in memory, with native plugins (no engine, no store).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::scan::{marked_value, values_of};
use super::*;
use crate::cache::outcome::{Kind, Outcome};
use crate::config::{AgentSettings, Config};
use crate::conversation::{FrozenRequest, Message, ToolCall};
use crate::formats::replies::ProviderUsage;
use crate::formats::{self, Format};
use crate::ledger::Pricing;
use crate::plugin::provider::{CallError, NativePlugin};
use crate::plugin::registry::{PluginEntry, PluginOptions, Registry};
use crate::prefix;
use crate::session::log::{Body, Recorded};
use crate::session::SessionState;
use crate::step::StepInput;
use crate::store::{Event, EventKind};

const SESSION: &str = "s1";
const MODEL: &str = "claude-sonnet-4-5";

fn config(extra: &str) -> Config {
    let text = format!(
        "[model]\nmax_tokens = 1024\n[model.anthropic]\nmodel = \"{MODEL}\"\n\
         [model.openai]\nmodel = \"gpt-4.1\"\n\
         [pricing.\"{MODEL}\"]\ninput = 3.0\noutput = 15.0\n\
         [pricing.\"gpt-4.1\"]\ninput = 2.0\noutput = 8.0\n{extra}"
    );
    Config::parse(&text, "promptd.toml").unwrap()
}

fn agent(config: &Config) -> AgentSettings {
    AgentSettings::resolve(config, "default", |_| None).unwrap()
}

fn entry(id: &str, plugin: NativePlugin) -> PluginEntry {
    let (declaration, provider) = plugin.build();
    PluginEntry::new(id, declaration, provider, PluginOptions::default())
        .unwrap()
        .with_sha256(format!("{id}-sha"))
}

/// A persona (whose text says its version), tools, and a runtime context from the `cwd`
/// fact (its words by `context`); `fail_at` makes the context fail on that step.
fn registry(version: &str, context: &'static str, fail_at: Option<u64>) -> Registry {
    let persona = NativePlugin::new().section(
        "persona",
        0,
        &format!(
            "You are a careful engineer (persona {version}). {}",
            "Be brief. ".repeat(40)
        ),
    );
    let tools = NativePlugin::new()
        .section("tools:guidance", 100, "Read before you write.")
        .tool("read_file", "Read a text file.", r#"{"type":"object"}"#)
        .tool("list_dir", "List a directory.", r#"{"type":"object"}"#);
    let workspace = NativePlugin::new().dynamic_context("workspace", 0, move |step| {
        if Some(step.step_number) == fail_at {
            return Err(CallError::Failed("the workspace is gone".into()));
        }
        Ok(step
            .facts
            .get("cwd")
            .map_or(String::new(), |cwd| format!("{context}: {cwd}")))
    });
    let sha = |id: &str, p| {
        let mut e = entry(id, p);
        if id == "persona" {
            e = e.with_sha256(format!("persona-{version}"));
        }
        e
    };
    Registry::new()
        .with_plugin(sha("persona", persona))
        .unwrap()
        .with_plugin(sha("tools", tools))
        .unwrap()
        .with_plugin(sha("workspace", workspace))
        .unwrap()
}

/// A session log built as the daemon builds it: each step planned on the state, appended
/// and applied; replies and tool results recorded between steps; a clock per append.
struct Log {
    events: Vec<Event>,
    state: SessionState,
    clock: u64,
}

impl Log {
    fn new() -> Log {
        let mut log = Log {
            events: Vec::new(),
            state: SessionState::new(SESSION),
            clock: 1_000_000,
        };
        log.append(vec![Body::SessionCreated(
            crate::session::log::SessionCreated {
                agent: "default".into(),
                data_secret: Some("secret".into()),
            },
        )]);
        log
    }

    fn append(&mut self, bodies: Vec<Body>) {
        self.clock += 30_000;
        let first = self.state.last_seq() + 1;
        for (i, b) in bodies.iter().enumerate() {
            let event = crate::step::encode(b).unwrap();
            self.events
                .push(event.recorded(first + i as u64, self.clock));
        }
        self.state.apply_planned(first, bodies).unwrap();
    }

    fn step(
        &mut self,
        registry: &Registry,
        plan: &AgentSettings,
        messages: Vec<Message>,
        cwd: &str,
    ) {
        let facts: BTreeMap<String, String> = [("cwd".to_string(), cwd.to_string())].into();
        let planned = crate::step::plan(
            &mut self.state,
            registry,
            plan,
            SESSION,
            crate::step::Serving::run("run-1"),
            StepInput {
                messages,
                facts,
                sent_at: None,
                client_tools: None,
            },
            Format::Anthropic,
        )
        .unwrap();
        self.append(planned.bodies);
    }

    /// The model's reply to the last step, with a provider usage of a quarter of its bytes.
    fn reply(&mut self, message: Message) {
        let bytes = self.state.render(Format::Anthropic).unwrap().len() as u64;
        let usage = ProviderUsage {
            input_tokens: Some(bytes / 4),
            output_tokens: Some(20),
            cached_tokens: Some(0),
            cache_write_tokens: Some(bytes / 4),
            cache_write_1h_tokens: None,
        };
        let cache = Outcome {
            outcome: Kind::Cold,
            format: Format::Anthropic,
            model: MODEL.into(),
            sent_at_ms: self.clock + 500,
            expected_read: 0,
            lost: 0,
            gap_ms: None,
            part: None,
            plugin: None,
            cause: None,
        };
        self.append(vec![Body::AssistantMessage(Recorded {
            message,
            usage: Some(usage),
            cache: Some(cache),
            partial: None,
        })]);
    }

    fn tool_result(&mut self, id: &str) {
        self.append(vec![Body::message(tool(id), None)]);
    }

    fn compact(&mut self, from: u64, to: u64) {
        let body = self
            .state
            .compaction(from, to, "Earlier: the user looked around.")
            .unwrap();
        self.append(vec![body]);
    }
}

fn calling(id: &str) -> Message {
    Message::Assistant {
        content: "Let me look.".into(),
        tool_calls: vec![ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: json!({"path": "README.md"}),
            arguments_text: None,
        }],
        blocks: Vec::new(),
        native: None,
    }
}

fn tool(id: &str) -> Message {
    Message::Tool {
        tool_call_id: id.into(),
        content: format!("contents of README.md for {id}").into(),
        is_error: false,
    }
}

fn said(text: &str) -> Message {
    Message::Assistant {
        content: text.into(),
        tool_calls: Vec::new(),
        blocks: Vec::new(),
        native: None,
    }
}

/// A workload of `turns` turns, each: a user step, a reply calling a tool, its result (in the
/// next step on even turns, recorded on its own on odd ones), a step, a final reply. Steps of
/// turn `switch` on use `later` instead of `first`.
fn workload(
    turns: usize,
    first: &Registry,
    later: &Registry,
    switch: usize,
    plan: &AgentSettings,
) -> Log {
    let mut log = Log::new();
    for t in 0..turns {
        let registry = if t >= switch { later } else { first };
        let user = Message::user(format!("Turn {t}: what is in this repository?"));
        log.step(registry, plan, vec![user], "/src/app");
        let id = format!("call_{t}");
        log.reply(calling(&id));
        if t % 2 == 1 {
            log.tool_result(&id);
            log.step(registry, plan, Vec::new(), "/src/app");
        } else {
            log.step(registry, plan, vec![tool(&id)], "/src/app");
        }
        log.reply(said(&format!("Turn {t}: a README and the sources.")));
    }
    log
}

fn run(log: &Log, registry: &Registry, config: &Config, format: Option<Format>) -> SessionReplay {
    let plan = agent(config);
    let candidate = Candidate {
        registry,
        agent: &plan,
        pricing: Pricing {
            prices: &config.pricing,
            rules: &config.cache,
        },
        format,
        workers: 2,
    };
    replay(SESSION, &log.events, &candidate).unwrap()
}

fn differing(r: &SessionReplay) -> Vec<u64> {
    r.steps
        .iter()
        .filter(|s| s.differs)
        .map(|s| s.step)
        .collect()
}

/// Q19: the recorded plugins and config give every recorded request again, byte for byte,
/// with the same tokens, cache figures and cost.
#[test]
fn q19_a_replay_with_the_recorded_plugins_and_config_differs_nowhere() {
    // Cached from 256 tokens, so these short requests are.
    let config = config("[cache.anthropic]\nmin_tokens = 256\n[cache.openai]\nmin_tokens = 256\n");
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let log = workload(5, &v1, &v1, 99, &plan);
    for format in [None, Some(Format::Openai), Some(Format::OpenaiResponses)] {
        let r = run(&log, &v1, &config, format);
        assert_eq!(r.steps.len(), 10);
        assert_eq!(
            differing(&r),
            Vec::<u64>::new(),
            "{format:?}: {:#?}",
            r.steps
        );
        for s in &r.steps {
            assert_eq!(s.tokens.delta, 0);
            assert_eq!(s.recorded, s.candidate, "step {}", s.step);
        }
        assert_eq!(r.totals.recorded, r.totals.candidate);
        assert_eq!(r.totals.cost_delta, Some(0.0));
    }
    let r = run(&log, &v1, &config, None);
    assert_eq!(r.format, Format::Anthropic, "the replies' format");
    assert_eq!(r.steps[0].tokens.counted, Counted::Provider);
    // The provider's count of the recorded request, as its reply reported it.
    let first_reply = log
        .events
        .iter()
        .find(|e| e.kind == EventKind::AssistantMessage);
    let reported: Value = serde_json::from_str(&first_reply.unwrap().body).unwrap();
    assert_eq!(
        r.steps[0].tokens.recorded,
        reported["usage"]["input_tokens"].as_u64().unwrap()
    );
    assert!(r.totals.recorded.cost.unwrap() > 0.0);
    // The cache model reads what the requests before it wrote.
    assert!(r.steps[3].recorded.read > 0, "{:?}", r.steps[3]);
}

/// Issue 29's first criterion, the other way round: a plugin's section changed differs
/// exactly in the steps whose recorded request carried the old section, at the system
/// prompt, naming the plugin.
#[test]
fn a_changed_section_differs_exactly_where_the_recorded_request_carried_the_old_one() {
    let config = config("");
    let plan = agent(&config);
    let (v1, v2) = (
        registry("v1", "Working directory", None),
        registry("v2", "Working directory", None),
    );
    let log = workload(4, &v1, &v2, 2, &plan);
    let r = run(&log, &v2, &config, None);
    assert_eq!(differing(&r), vec![1, 2, 3, 4]);
    for s in &r.steps[..4] {
        let d = s.first_difference.as_ref().unwrap();
        assert_eq!(d.part, "system");
        assert_eq!(d.plugin.as_deref(), Some("persona"));
        assert!(
            d.cause.contains("section `persona` text changed")
                && d.cause.contains("plugin `persona`"),
            "{}",
            d.cause
        );
        // After the model and the tools, inside the system block's text.
        assert!(d.offset > 100, "{d:?}");
        assert_eq!(s.tokens.delta, 0, "v1 and v2 are as long");
    }
    for s in &r.steps[4..] {
        assert_eq!(s.recorded, s.candidate);
    }
    // Replayed with the old set, the later steps differ instead.
    let back = run(&log, &v1, &config, None);
    assert_eq!(differing(&back), vec![5, 6, 7, 8]);
}

/// While the candidate's log is the recorded one, one side stands for both; the recorded
/// side's figures are then the same whatever the candidate, and a candidate that parts from
/// the recorded log at any step (a plugin changed, a step it cannot plan) sees its own.
#[test]
fn the_recorded_figures_do_not_depend_on_the_candidate() {
    let config = config("[cache.anthropic]\nmin_tokens = 256\n[cache.openai]\nmin_tokens = 256\n");
    let plan = agent(&config);
    let (v1, v2) = (
        registry("v1", "Working directory", None),
        registry("v2", "Working directory", None),
    );
    let log = workload(6, &v1, &v1, 99, &plan);
    for format in [Format::Anthropic, Format::Openai, Format::OpenaiResponses] {
        let same = run(&log, &v1, &config, Some(format));
        assert_eq!(differing(&same), Vec::<u64>::new());
        for s in &same.steps {
            assert_eq!(s.recorded, s.candidate, "step {}", s.step);
        }
        for candidate in [&v2, &registry("v1", "Working directory", Some(4))] {
            let r = run(&log, candidate, &config, Some(format));
            assert!(!differing(&r).is_empty());
            for (a, b) in same.steps.iter().zip(&r.steps) {
                assert_eq!(a.recorded, b.recorded, "{format:?} step {}", a.step);
                assert_eq!(a.tokens.recorded, b.tokens.recorded);
                assert_eq!(a.reported, b.reported);
            }
        }
    }
    // Parted at step 5 (recorded on v2 from turn 2): the recorded request's new system prompt
    // misses there, the candidate's, still v1's, is read from its cache.
    let parted = run(&workload(6, &v1, &v2, 2, &plan), &v1, &config, None);
    assert_eq!(differing(&parted), vec![5, 6, 7, 8, 9, 10, 11, 12]);
    assert!(parted.steps[4].candidate.read > parted.steps[4].recorded.read);
    assert!(parted.steps[..4]
        .iter()
        .all(|s| s.recorded == s.candidate && s.first_difference.is_none()));
}

/// A step the candidate cannot plan is reported with its error; the recorded step stands in
/// for it, so later steps replay on the recorded history.
#[test]
fn a_step_the_candidate_cannot_plan_is_reported_and_the_replay_goes_on() {
    let config = config("");
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let log = workload(3, &v1, &v1, 99, &plan);
    let failing = registry("v1", "Working directory", Some(3));
    let r = run(&log, &failing, &config, None);
    assert_eq!(differing(&r), vec![3]);
    let failed = &r.steps[2];
    let error = failed.error.as_ref().unwrap();
    assert_eq!(error.code, "plugin_error");
    assert!(
        error.message.contains("the workspace is gone"),
        "{}",
        error.message
    );
    assert_eq!(r.totals.failed_steps, 1);
    assert!(r.steps[3..].iter().all(|s| !s.differs && s.error.is_none()));
}

/// A compaction recorded by seq lands on the same messages of the candidate's log, whose
/// seqs differ (it records one header fewer).
#[test]
fn compactions_are_mapped_to_the_candidates_seqs() {
    let config = config("");
    let plan = agent(&config);
    let (v1, v2) = (
        registry("v1", "Working directory", None),
        registry("v2", "Working directory", None),
    );
    // Turns 0–1 with v1, turns 2–3 with v2 (a second header), then the first two turns
    // compacted, then two more turns.
    let mut log = workload(4, &v1, &v2, 2, &plan);
    let messages: Vec<u64> = log
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::UserMessage | EventKind::AssistantMessage | EventKind::ToolResult
            )
        })
        .map(|e| e.seq)
        .collect();
    // Turn 0 and 1: the first 10 message events (user, call, result, reply; twice; with
    // turn 1's result on its own), up to the last reply of turn 1.
    log.compact(messages[0], messages[7]);
    for t in 4..6 {
        log.step(
            &v2,
            &plan,
            vec![Message::user(format!("Turn {t}."))],
            "/src/app",
        );
        log.reply(said("Done."));
    }
    assert!(log.state.left_out() > 0);
    let r = run(&log, &v2, &config, None);
    assert_eq!(differing(&r), vec![1, 2, 3, 4], "{:#?}", r.steps);
}

/// A runtime context that reads otherwise differs at the first message holding it, naming
/// the context and its plugin.
#[test]
fn a_changed_runtime_context_names_the_context_and_its_plugin() {
    let config = config("");
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let log = workload(2, &v1, &v1, 99, &plan);
    let other = registry("v1", "Current folder", None);
    let r = run(&log, &other, &config, None);
    assert_eq!(differing(&r), vec![1, 2, 3, 4]);
    for s in &r.steps {
        let d = s.first_difference.as_ref().unwrap();
        assert_eq!(
            d.part, "message 1",
            "the first user turn holds the snapshot"
        );
        assert_eq!(d.plugin.as_deref(), Some("workspace"));
        assert!(
            d.cause
                .contains("runtime context changed: context `workspace` (plugin `workspace`)"),
            "{}",
            d.cause
        );
    }
    // "Current folder" is shorter than "Working directory".
    assert!(r.steps.iter().all(|s| s.tokens.delta < 0), "{:?}", r.steps);
}

/// A longer system prompt costs more tokens, and writes the cache again.
#[test]
fn a_longer_system_prompt_costs_more_and_the_cost_is_priced_by_the_config() {
    let config = config("");
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let log = workload(3, &v1, &v1, 99, &plan);
    let longer = {
        let persona = NativePlugin::new().section(
            "persona",
            0,
            &format!(
                "You are a careful engineer. {}",
                "Be very brief. ".repeat(80)
            ),
        );
        let base = registry("v1", "Working directory", None);
        base.without("persona")
            .unwrap()
            .with_plugin(entry("persona", persona))
            .unwrap()
    };
    let r = run(&log, &longer, &config, None);
    assert_eq!(r.totals.differing_steps, 6);
    assert!(r.totals.tokens_delta > 0);
    assert!(r.totals.cost_delta.unwrap() > 0.0, "{:?}", r.totals);
    for s in &r.steps {
        assert!(s.tokens.candidate > s.tokens.recorded);
        // Same tokens per byte on both sides.
        let (rb, cb) = (s.tokens.recorded as f64, s.tokens.candidate as f64);
        assert!(cb / rb > 1.0 && cb / rb < 3.0);
    }
    // Without a price for the model there is no cost, and the model is named.
    let unpriced = Config::parse(
        &format!("[model]\nmax_tokens = 1024\n[model.anthropic]\nmodel = \"{MODEL}\"\n"),
        "promptd.toml",
    )
    .unwrap();
    let r = run(&log, &v1, &unpriced, None);
    assert_eq!(r.totals.recorded.cost, None);
    assert_eq!(r.totals.unpriced_models, vec![MODEL.to_string()]);
}

/// Assembling ahead on several threads gives the report one thread gives, also across the
/// chunks assembled ahead; and a trimmed history (rendered whole) replays alike.
#[test]
fn workers_and_trimming_change_nothing_of_the_report() {
    let config = config(
        "[agents.default.budget]\nwindow = 9000\nreserve = 0\ntokenizer = \"chars\"\nkeep_turns = 2\n",
    );
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let log = workload(80, &v1, &v1, 999, &plan);
    assert!(log.state.left_out() > 0, "the budget trimmed the history");
    let by = |workers| {
        let plan = agent(&config);
        let candidate = Candidate {
            registry: &v1,
            agent: &plan,
            pricing: Pricing {
                prices: &config.pricing,
                rules: &config.cache,
            },
            format: None,
            workers,
        };
        replay(SESSION, &log.events, &candidate).unwrap()
    };
    let one = by(1);
    assert_eq!(one.steps.len(), 160);
    assert_eq!(differing(&one), Vec::<u64>::new());
    assert_eq!(one, by(3));
}

/// The neutral format is no provider's: a replay refuses it.
#[test]
fn the_neutral_format_is_refused() {
    let config = config("");
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let log = workload(1, &v1, &v1, 99, &plan);
    let candidate = Candidate {
        registry: &v1,
        agent: &plan,
        pricing: Pricing {
            prices: &config.pricing,
            rules: &config.cache,
        },
        format: Some(Format::Neutral),
        workers: 1,
    };
    let e = replay(SESSION, &log.events, &candidate).unwrap_err();
    assert_eq!(e.code(), "bad_request");
}

#[test]
fn values_are_split_at_top_level_commas_only() {
    let text = r#"{"a":"x,}","b":[1,2]},{"c":"\"{,"},[3]"#;
    let parts: Vec<&str> = values_of(text)
        .into_iter()
        .map(|(s, e)| &text[s..e])
        .collect();
    assert_eq!(
        parts,
        [r#"{"a":"x,}","b":[1,2]}"#, r#"{"c":"\"{,"}"#, "[3]"]
    );
    assert!(values_of("").is_empty());
}

/// The first difference is where the diff of the two requests finds it: the candidate's
/// requests are those of the same workload recorded with the candidate (the plugins are
/// deterministic), so `prefix::diff` of the rebuilt requests gives the part and the offset.
#[test]
fn q19_the_first_difference_is_the_byte_the_diff_finds() {
    let config = config("");
    let plan = agent(&config);
    let v1 = registry("v1", "Working directory", None);
    let recorded = workload(3, &v1, &v1, 99, &plan);
    for candidate in [
        registry("v2", "Working directory", None),
        registry("v1", "Current folder", None),
    ] {
        let actual = workload(3, &candidate, &candidate, 99, &plan);
        for format in [Format::Anthropic, Format::Openai, Format::OpenaiResponses] {
            let r = run(&recorded, &candidate, &config, Some(format));
            for s in &r.steps {
                let then = crate::session::rebuild(SESSION, &recorded.events, s.step).unwrap();
                let now = crate::session::rebuild(SESSION, &actual.events, s.step).unwrap();
                let d = prefix::diff(&then, None, &now, None, format);
                let at = d.first_divergence.expect("they differ");
                let found = s.first_difference.as_ref().unwrap();
                assert_eq!(
                    (found.part.as_str(), found.offset),
                    (at.part.as_str(), at.offset as u64),
                    "{format:?} step {}",
                    s.step
                );
                let bytes = |r: &FrozenRequest| {
                    prefix::stream(r, format)
                        .iter()
                        .map(|p| p.text.len())
                        .sum::<usize>()
                };
                assert!(bytes(&now) > 0 && bytes(&then) > 0);
            }
        }
    }
}

/// The open turn's marker cut out as text is the turn as the diff reads it, JSON-stripped.
#[test]
fn a_marked_value_reads_as_the_diff_reads_it() {
    let turns = [
        json!({"role": "user", "content": [
            {"type": "text", "text": "a \"cache_control\" in a text"},
            {"type": "text", "text": "last", "cache_control": {"type": "ephemeral"}}]}),
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "ok",
             "cache_control": {"type": "ephemeral"}}]}),
        json!({"role": "user", "content": [
            {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}),
    ];
    for turn in turns {
        let body = json!({"messages": [turn.clone()]});
        let expected = prefix::marked_parts(&body, Format::Anthropic)
            .into_iter()
            .next()
            .map(|(p, m)| (p.text, m));
        assert_eq!(marked_value(&turn.to_string(), Format::Anthropic), expected);
    }
}

/// `[agents.NAME.cache] ttl = "1h"`: the header records the TTL, every Anthropic breakpoint
/// of the body carries it, a rebuild from the log gives the same bytes, and the cache model
/// (so the ledger) writes 1-hour entries; the default records nothing new, so the headers of
/// sessions that keep it are the bytes they were.
#[test]
fn an_agents_cache_ttl_is_recorded_in_the_header_and_sent_on_every_breakpoint() {
    let cached = "[cache.anthropic]\nmin_tokens = 256\n";
    let hour = config(&format!("{cached}[agents.default.cache]\nttl = \"1h\"\n"));
    let five = config(&format!("{cached}[agents.default.cache]\nttl = \"5m\"\n"));
    let v1 = registry("v1", "Working directory", None);
    let log = workload(3, &v1, &v1, 99, &agent(&hour));
    let header_json = |log: &Log| {
        log.events
            .iter()
            .filter(|e| e.kind == EventKind::RequestHeader)
            .map(|e| e.body.clone())
            .collect::<Vec<_>>()
    };
    let headers = header_json(&log);
    assert_eq!(headers.len(), 1, "{headers:?}");
    assert!(headers[0].contains(r#""cache_ttl":"1h""#), "{}", headers[0]);
    // The last step's request, as the state kept up to its marker renders it.
    let marker = log
        .events
        .iter()
        .rposition(|e| e.kind == EventKind::Step)
        .unwrap();
    let mut state = SessionState::from_log(SESSION, &log.events[..=marker]).unwrap();
    let body = state.render(Format::Anthropic).unwrap();
    let marks = body.matches("\"cache_control\"").count();
    assert_eq!(marks, 3, "last tool, system, last message: {body}");
    assert_eq!(body.matches(r#""ttl":"1h""#).count(), marks, "{body}");
    let steps = log.state.steps();
    let rebuilt = crate::session::rebuild(SESSION, &log.events, steps).unwrap();
    assert_eq!(
        formats::render(&rebuilt, Format::Anthropic).to_string(),
        body
    );
    // The OpenAI formats have no breakpoints: the TTL changes none of their bytes.
    let default_log = workload(3, &v1, &v1, 99, &agent(&config(cached)));
    for format in [Format::Openai, Format::OpenaiResponses] {
        assert_eq!(
            state.render(format).unwrap(),
            SessionState::from_log(SESSION, &default_log.events[..=marker])
                .unwrap()
                .render(format)
                .unwrap()
        );
    }
    // "5m" is the default: no field, the header as it was before the setting existed.
    let five_log = workload(3, &v1, &v1, 99, &agent(&five));
    assert_eq!(header_json(&five_log), header_json(&default_log));
    assert!(!header_json(&five_log)[0].contains("cache_ttl"));

    // Replayed with the 5-minute config: every step differs at a breakpoint, and only the
    // recorded requests write 1-hour entries.
    let r = run(&log, &v1, &five, None);
    assert_eq!(differing(&r), (1..=6).collect::<Vec<u64>>());
    assert!(r.totals.recorded.written_1h > 0, "{:?}", r.totals);
    assert_eq!(r.totals.recorded.written, 0, "{:?}", r.totals);
    assert_eq!(r.totals.candidate.written_1h, 0, "{:?}", r.totals);
    assert!(r.totals.candidate.written > 0, "{:?}", r.totals);
    // 1-hour writes cost 2× input, 5-minute ones 1.25×: the same requests cost more to write.
    assert!(
        r.steps[0].recorded.cost > r.steps[0].candidate.cost,
        "{:?}",
        r.steps[0]
    );
}

/// A TTL the provider does not offer is refused with the agent's table and the values
/// allowed.
#[test]
fn an_unknown_cache_ttl_is_refused_naming_it() {
    let text = "[agents.coder.cache]\nttl = \"2h\"\n";
    let err = Config::parse(text, "promptd.toml").unwrap_err().to_string();
    assert!(
        err.contains("2h")
            && err.contains("5m")
            && err.contains("1h")
            && err.contains("promptd.toml"),
        "{err}"
    );
}

/// The header's `prompt_cache_key` of a log's requests, in order.
fn keys(log: &Log) -> Vec<String> {
    log.events
        .iter()
        .filter(|e| e.kind == EventKind::RequestHeader)
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(&e.body).unwrap();
            v["header"]["cache_key"].as_str().unwrap().to_string()
        })
        .collect()
}

/// K6: `cache_key` gives OpenAI's `prompt_cache_key`: the agent's by default, the session's,
/// or the head's hash (the same for any agent and session with that head, another for
/// another head), sharded when the daemon says the key passes the per-key rate.
#[test]
fn k6_the_cache_key_policy_names_the_agent_the_session_or_the_head() {
    let v1 = registry("v1", "Working directory", None);
    let v2 = registry("v2", "Working directory", None);
    let with = |policy: &str| {
        config(&format!(
            "[agents.default.cache]\ncache_key = \"{policy}\"\n"
        ))
    };
    let one = |config: &Config, r: &Registry| keys(&workload(1, r, r, 99, &agent(config)));
    assert_eq!(one(&config(""), &v1), vec!["promptd-default"]);
    assert_eq!(one(&with("agent"), &v1), vec!["promptd-default"]);
    assert_eq!(
        one(&with("session"), &v1),
        vec![format!("promptd-{SESSION}")]
    );
    let (a, b) = (one(&with("prefix"), &v1), one(&with("prefix"), &v2));
    assert!(
        a[0].starts_with("promptd-p") && a[0].len() == "promptd-p".len() + 16,
        "{a:?}"
    );
    assert_ne!(a, b, "another head, another key");
    assert_eq!(a, one(&with("prefix"), &v1), "the same head, the same key");

    // Sharded: the key a new header records takes the session's shard of those the daemon
    // gives; the base is what the rate counts.
    let plan = agent(&with("prefix"));
    let assembled = crate::step::assemble(
        &v1,
        &plan,
        &crate::step::step_for(&plan, SESSION, 1, BTreeMap::new()),
        &Arc::from("secret"),
    )
    .unwrap();
    let shards: BTreeMap<String, u32> = [(a[0].clone(), 4)].into();
    let sharded = crate::step::cache_key(&plan, SESSION, &assembled, Some(&shards));
    let (base, shard) = sharded.split_once('~').unwrap();
    assert_eq!(
        (base, crate::step::key_base(&sharded)),
        (a[0].as_str(), base)
    );
    assert!(shard.parse::<u32>().unwrap() < 4, "{sharded}");
    let other = [(a[0].clone(), 1)].into();
    assert_eq!(
        crate::step::cache_key(&plan, SESSION, &assembled, Some(&other)),
        a[0]
    );
}

/// K6: a session keeps the key its header recorded when the policy changes, until its header
/// changes for another reason: a key change alone would move it off the machine that holds
/// its own messages.
#[test]
fn k6_a_session_keeps_its_key_until_its_header_changes() {
    let v1 = registry("v1", "Working directory", None);
    let v2 = registry("v2", "Working directory", None);
    let session = agent(&config("[agents.default.cache]\ncache_key = \"session\"\n"));
    let by_agent = agent(&config(""));
    let mut log = Log::new();
    log.step(&v1, &session, vec![Message::user("one")], "/src/app");
    log.reply(said("ok"));
    // The policy is now the agent's: the header stands, and with it the session's key.
    log.step(&v1, &by_agent, vec![Message::user("two")], "/src/app");
    log.reply(said("ok"));
    assert_eq!(keys(&log), vec![format!("promptd-{SESSION}")]);
    // The head changes: the new header takes the policy's key.
    log.step(&v2, &by_agent, vec![Message::user("three")], "/src/app");
    assert_eq!(
        keys(&log),
        vec![format!("promptd-{SESSION}"), "promptd-default".into()]
    );
}
