//! Issue 30's cache policies through a real daemon (the bundled Rust plugins) and the stub
//! provider, whose cache follows Anthropic's documented rules on the time the test gives it.

use crate::cache_workload::{persona, tool_calls, Stub};
use promptd_testkit as common;

use common::daemon::Served;
use common::Folder;
use serde_json::{json, Value};

const MIN_MS: u64 = 60_000;

fn config() -> String {
    format!(
        r#"
[model]
max_tokens = 1024
[model.anthropic]
model = "claude-sonnet-4-5"
[model.openai]
model = "gpt-4.1"

[agents.coder]
[agents.coder.cache]
ttl = "auto"
[agents.reviewer]
[agents.reviewer.cache]
ttl = "1h"
[agents.plain]
[agents.headed]
[agents.headed.cache]
cache_key = "prefix"
[agents.headed_too]
[agents.headed_too.cache]
cache_key = "prefix"
[agents.own]
[agents.own.cache]
cache_key = "session"
[agents.zdr]
[agents.zdr.model.openai]
prompt_cache_retention = "in_memory"
[agents.extended]
[agents.extended.model.openai]
model = "gpt-4o"

[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.persona]
config = {{ text = {persona:?} }}

[pricing."claude-sonnet-4-5"]
input = 3.0
output = 15.0
"#,
        persona = persona(),
    )
}

fn folder() -> Folder {
    Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace")
}

/// One turn of session `id` at `now`: a step, the stub's reply recorded with its send time,
/// and, when the reply called tools, a step with their results and its reply a second later.
/// Returns each step's number and the request promptd sent, with the stub's usage.
pub(crate) fn turn(d: &Served, stub: &Stub, id: &str, now: u64) -> Vec<(u64, Value, Value)> {
    turn_in(d, stub, id, now, "anthropic")
}

/// [`turn`] in `format` (`anthropic` or `openai`).
fn turn_in(d: &Served, stub: &Stub, id: &str, now: u64, format: &str) -> Vec<(u64, Value, Value)> {
    let path = match format {
        "anthropic" => "/v1/messages",
        _ => "/v1/chat/completions",
    };
    let mut out = Vec::new();
    let mut messages = vec![json!({"role": "user", "content": format!("{id}: task at {now}")})];
    let mut at = now;
    loop {
        let body = json!({"format": format, "messages": messages, "facts": {"cwd": "/src/app"}});
        let step = d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body));
        let reply = stub.call(path, &step["request"], at);
        d.ok(
            "POST",
            &format!("/v1/sessions/{id}/messages?sent_at={at}"),
            Some(&reply),
        );
        let n = step["step"].as_u64().unwrap();
        out.push((n, step["request"].clone(), reply["usage"].clone()));
        let calls = tool_calls(&reply);
        if calls.is_empty() {
            return out;
        }
        messages = calls
            .iter()
            .map(|c| json!({"role": "tool", "tool_call_id": c, "content": "done"}))
            .collect();
        at += 1_000;
    }
}

/// The TTL of every `cache_control` in a body (`5m` where none is given).
fn ttls(request: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(c) = m.get("cache_control") {
                    out.push(c["ttl"].as_str().unwrap_or("5m").to_string());
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(request, &mut out);
    out
}

pub(crate) fn headers(d: &Served, id: &str) -> Vec<Value> {
    let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "request/header")
        .map(|e| e["body"].clone())
        .collect()
}

/// Each (session, step, body) of `sent`, rebuilt from the log in `format`, is that body.
pub(crate) fn rebuilt_as_sent(d: &Served, sent: &[(String, u64, Value)], format: &str) {
    for (id, n, request) in sent {
        let rebuilt = d.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/request?format={format}"),
            None,
        );
        assert_eq!(rebuilt.to_string(), request.to_string(), "{id} step {n}");
    }
}

/// K5: `ttl = "1h"` sends every breakpoint with the hour, the stub bills the writes as 1-hour
/// ones and still serves the prefix after 30 idle minutes, where the 5-minute agent's
/// expired; `"auto"` starts at 5 minutes and records a header with the hour once the
/// session's replies show idle gaps the hour pays for; every step rebuilds from the log,
/// after a restart, to the bytes that were sent.
#[test]
fn k5_an_agents_ttl_is_sent_on_every_breakpoint_billed_and_rebuilt() {
    let folder = folder();
    let config = folder.config(&config());
    let (_tmp, state) = common::daemon::state_dir();
    let stub = Stub::start();
    let d = Served::start(folder.path(), &config, &state);
    let t0 = 1_900_000_000_000u64;
    let mut sent: Vec<(String, u64, Value)> = Vec::new();

    // "1h" and the default, side by side (each with a provider of its own: a cache entry
    // serves any request with its prefix): a turn, 30 idle minutes, a turn.
    for (agent, ttl) in [("reviewer", "1h"), ("plain", "5m")] {
        let stub = Stub::start();
        let id = d.session(agent);
        let first = turn(&d, &stub, &id, t0);
        for (_, request, usage) in &first {
            let marks = ttls(request);
            assert!(marks.len() >= 3, "{request}");
            assert!(marks.iter().all(|t| t == ttl), "{agent}: {marks:?}");
            // Every write is of the request's TTL.
            let written = |k: &str| usage["cache_creation"][k].as_u64().unwrap();
            let (w5, w1h) = (
                written("ephemeral_5m_input_tokens"),
                written("ephemeral_1h_input_tokens"),
            );
            assert!(w5 + w1h > 0, "each request writes its new tail: {usage}");
            assert_eq!((w5 > 0, w1h > 0), (ttl == "5m", ttl == "1h"), "{usage}");
        }
        let later = turn(&d, &stub, &id, t0 + 30 * MIN_MS);
        let read = later[0].2["cache_read_input_tokens"].as_u64().unwrap();
        if ttl == "1h" {
            assert!(
                read > 1_000,
                "the hour-long entry serves after 30 minutes: {}",
                later[0].2
            );
        } else {
            assert_eq!(read, 0, "the 5-minute entry expired: {}", later[0].2);
        }
        let h = headers(&d, &id);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(
            h[0]["header"].get("cache_ttl").and_then(Value::as_str),
            (ttl == "1h").then_some("1h")
        );
        let usage = d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
        let outcome = usage["steps"][first.len()]["cache"]["outcome"].clone();
        assert_eq!(
            outcome,
            if ttl == "1h" { "hit" } else { "ttl_expired" },
            "{usage}"
        );
        sent.extend(
            first
                .into_iter()
                .chain(later)
                .map(|(n, r, _)| (id.clone(), n, r)),
        );
    }

    // "auto": quick turns keep 5 minutes; two gaps of 10 and 20 minutes make it the hour.
    let id = d.session("coder");
    let mut at = t0;
    let mut chosen = Vec::new();
    for gap in [0, MIN_MS / 2, MIN_MS / 2, 10 * MIN_MS, 20 * MIN_MS, MIN_MS] {
        at += gap;
        for (n, request, _) in turn(&d, &stub, &id, at) {
            let marks = ttls(&request);
            assert!(
                marks.windows(2).all(|w| w[0] == w[1]),
                "one TTL a request: {marks:?}"
            );
            chosen.push(marks[0].clone());
            sent.push((id.clone(), n, request));
        }
    }
    assert_eq!(chosen.first().map(String::as_str), Some("5m"), "{chosen:?}");
    assert_eq!(chosen.last().map(String::as_str), Some("1h"), "{chosen:?}");
    let switched = chosen.iter().position(|t| t == "1h").unwrap();
    assert!(chosen[switched..].iter().all(|t| t == "1h"), "{chosen:?}");
    let h = headers(&d, &id);
    assert_eq!(h.len(), 2, "one header, one change to the hour: {h:?}");
    assert_eq!(h[1]["reason"], "change");
    assert_eq!(h[1]["header"]["cache_ttl"], "1h");

    // Every step, rebuilt from the log by a restarted daemon, is the body that was sent.
    d.stop();
    let d = Served::start(folder.path(), &config, &state);
    rebuilt_as_sent(&d, &sent, "anthropic");
}

/// A TTL no provider offers is refused, naming the value and the file.
#[test]
fn k5_an_unknown_ttl_is_a_config_error_naming_it() {
    let folder = folder();
    let config = folder.config("[agents.coder.cache]\nttl = \"2h\"\n");
    let line = folder.assemble_fails(&config, &["--agent", "coder"], "config_parse");
    assert!(
        line.contains("2h") && line.contains("promptd.toml"),
        "{line}"
    );
}

/// K6: OpenAI bodies carry the agent's key by default, the session's or the head's as the
/// agent says (two agents with one head share it); past the per-key rate a new session's key
/// is a shard of the agent's while a running session keeps its own; every body rebuilds after
/// a restart.
#[test]
fn k6_openai_keys_name_the_agent_the_session_or_the_head_and_shard_past_the_rate() {
    let folder = folder();
    let config = folder.config(&config());
    let (_tmp, state) = common::daemon::state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let mut sent: Vec<(String, u64, Value)> = Vec::new();
    let mut step = |d: &Served, id: &str, text: &str| -> String {
        let body = json!({"format": "openai", "messages": [{"role": "user", "content": text}]});
        let out = d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body));
        let request = out["request"].clone();
        sent.push((
            id.to_string(),
            out["step"].as_u64().unwrap(),
            request.clone(),
        ));
        request["prompt_cache_key"].as_str().unwrap().to_string()
    };
    let (a, b) = (d.session("plain"), d.session("plain"));
    assert_eq!(step(&d, &a, "hi"), "promptd-plain");
    assert_eq!(step(&d, &b, "hi"), "promptd-plain");
    let own = d.session("own");
    assert_eq!(step(&d, &own, "hi"), format!("promptd-{own}"));
    let (h1, h2) = (d.session("headed"), d.session("headed_too"));
    let (k1, k2) = (step(&d, &h1, "hi"), step(&d, &h2, "hi"));
    assert!(
        k1.starts_with("promptd-p") && k1.len() == "promptd-p".len() + 16,
        "{k1}"
    );
    assert_eq!(k1, k2, "one head, one key, whichever the agent");

    // Past 15 requests a minute on `promptd-plain`: a new session takes a shard of it.
    for i in 0..15 {
        assert_eq!(step(&d, &a, &format!("m{i}")), "promptd-plain");
    }
    let c = d.session("plain");
    let sharded = step(&d, &c, "hi");
    let shard = sharded
        .strip_prefix("promptd-plain~")
        .unwrap_or_else(|| panic!("{sharded}"));
    assert!(shard.parse::<u32>().unwrap() < 2, "{sharded}");
    assert_eq!(
        step(&d, &a, "again"),
        "promptd-plain",
        "a running session keeps its key"
    );

    d.stop();
    let d = Served::start(folder.path(), &config, &state);
    rebuilt_as_sent(&d, &sent, "openai");
}

/// K11: OpenAI's retention. An agent on gpt-4.1 that does not say gets the organisation's
/// default (24 hours), so after 20 idle minutes the stub still serves its prefix and promptd
/// judges the step a hit; the agent whose model settings say `in_memory` sends it, loses the
/// prefix and is judged `ttl_expired`; an agent on gpt-4o (in-memory only) sends nothing and
/// expires too. Every body rebuilds after a restart.
#[test]
fn k11_openai_retention_is_sent_as_configured_and_judged_by_the_models_offer() {
    let folder = folder();
    let config = folder.config(&config());
    let (_tmp, state) = common::daemon::state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let t0 = 1_900_000_000_000u64;
    let mut sent: Vec<(String, u64, Value)> = Vec::new();
    for (agent, said, outcome) in [
        ("plain", None, "hit"),
        ("zdr", Some("in_memory"), "ttl_expired"),
        ("extended", None, "ttl_expired"),
    ] {
        let stub = Stub::start();
        let id = d.session(agent);
        let first = turn_in(&d, &stub, &id, t0, "openai");
        let later = turn_in(&d, &stub, &id, t0 + 20 * MIN_MS, "openai");
        for (_, request, _) in first.iter().chain(&later) {
            assert_eq!(
                request
                    .get("prompt_cache_retention")
                    .and_then(Value::as_str),
                said,
                "{agent}: {request}"
            );
        }
        let read = later[0].2["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(read > 0, outcome == "hit", "{agent}: {}", later[0].2);
        let usage = d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
        let cache = &usage["steps"][first.len()]["cache"];
        assert_eq!(cache["outcome"], outcome, "{agent}: {usage}");
        // promptd's model of the cache expected what the stub did: a read after 20 minutes
        // only under 24 hours' retention.
        let expected = cache["expected_read"].as_u64().unwrap();
        assert_eq!(expected > 0, outcome == "hit", "{agent}: {cache}");
        sent.extend(
            first
                .into_iter()
                .chain(later)
                .map(|(n, r, _)| (id.clone(), n, r)),
        );
    }
    d.stop();
    let d = Served::start(folder.path(), &config, &state);
    rebuilt_as_sent(&d, &sent, "openai");
}

/// K11: a retention the agent's model does not offer is refused at load, naming the setting
/// and the model.
#[test]
fn k11_a_retention_the_model_does_not_offer_is_a_config_error_naming_it() {
    let folder = folder();
    let config =
        folder.config("[model.openai]\nmodel = \"gpt-4o\"\nprompt_cache_retention = \"24h\"\n");
    let line = folder.assemble_fails(&config, &["--agent", "coder"], "config_invalid");
    assert!(
        line.contains("prompt_cache_retention") && line.contains("gpt-4o"),
        "{line}"
    );
}
