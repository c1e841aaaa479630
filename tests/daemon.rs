//! End-to-end: the real daemon over real HTTP with a real SQLite file (SPEC Q1–Q8, R4, R5, L5).

use promptd_testkit as common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::{request, state_dir, Served};
use common::Folder;
use serde_json::{json, Value};

const CONFIG: &str = r#"
model = { model = "test-model", max_tokens = 512 }

[plugins.identity]
config = { name = "Ada" }
"#;

fn bundled() -> Folder {
    Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace")
}

fn new_session(d: &Served, agent: &str) -> String {
    let (status, body) = d.post("/v1/sessions", &json!({"agent": agent}).to_string());
    assert_eq!(status, 201, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["id"].as_str().unwrap().to_string()
}

/// POSTs a step; returns (step number, the exact bytes of `request`).
fn step(d: &Served, id: &str, messages: &Value, facts: &Value, format: &str) -> (u64, String) {
    let body = json!({"messages": messages, "facts": facts, "format": format}).to_string();
    let (status, text) = d.post(&format!("/v1/sessions/{id}/steps"), &body);
    assert_eq!(status, 200, "{text}");
    let prefix = "{\"request\":";
    assert!(text.starts_with(prefix), "{text}");
    let (request, step) = text[prefix.len()..]
        .rsplit_once(",\"step\":")
        .expect("step field");
    // `step` is followed by the step's `usage`.
    let n = step
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap_or("");
    (n.parse().unwrap(), request.to_string())
}

fn events(d: &Served, id: &str) -> Vec<Value> {
    let v = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    v["events"].as_array().unwrap().clone()
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

fn headers(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["kind"] == "request/header")
        .map(|e| e["body"]["reason"].as_str().unwrap().to_string())
        .collect()
}

fn rebuilt(d: &Served, id: &str, n: u64, format: &str) -> String {
    let (status, text) = d.get(&format!(
        "/v1/sessions/{id}/steps/{n}/request?format={format}"
    ));
    assert_eq!(status, 200, "{text}");
    text
}

#[test]
fn q1_to_q5_a_scripted_session_through_a_tool_call() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = new_session(&d, "default");
    let cwd = json!({"cwd": "/repo"});

    // Step 1: user input; the runtime context snapshot follows it (Q2); header `initial` (Q3).
    let (n1, r1) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "What is here?"}]),
        &cwd,
        "neutral",
    );
    assert_eq!(n1, 1);
    let v1: Value = serde_json::from_str(&r1).unwrap();
    assert_eq!(v1["messages"].as_array().unwrap().len(), 2);
    assert_eq!(
        v1["messages"][0],
        json!({"role": "user", "content": "What is here?"})
    );
    assert_eq!(v1["messages"][1]["snapshot"], true);
    assert!(v1["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("Working directory: /repo"));
    assert_eq!(
        v1["model"],
        json!({"model": "test-model", "max_tokens": 512})
    );

    // The model calls a tool (Q5).
    let reply = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "name": "list_dir", "arguments": {"path": "."}}]});
    let (status, body) = d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string());
    assert_eq!(status, 201, "{body}");

    // Step 2: the tool result; same context, so no new snapshot and no new header.
    let result = json!([{"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}]);
    let (n2, r2) = step(&d, &id, &result, &cwd, "openai");
    assert_eq!(n2, 2);
    let v2: Value = serde_json::from_str(&r2).unwrap();
    let roles: Vec<&str> = v2["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "user", "assistant", "tool"]);

    let (status, _) = d.post(
        &format!("/v1/sessions/{id}/messages"),
        &json!({"role": "assistant", "content": "Two files: a.txt and b.txt."}).to_string(),
    );
    assert_eq!(status, 201);

    // Step 3: the context changed: a new snapshot after the step's message.
    let (_, r3) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "And in /other?"}]),
        &json!({"cwd": "/other"}),
        "neutral",
    );
    let v3: Value = serde_json::from_str(&r3).unwrap();
    let last = v3["messages"].as_array().unwrap().last().unwrap().clone();
    assert!(last["content"]
        .as_str()
        .unwrap()
        .contains("Working directory: /other"));

    // Step 4: no context any more: one "no runtime context" snapshot. Step 5: nothing more.
    let (_, r4) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "Forget it."}]),
        &json!({}),
        "neutral",
    );
    let v4: Value = serde_json::from_str(&r4).unwrap();
    let last = v4["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["snapshot"], true);
    assert!(last["content"]
        .as_str()
        .unwrap()
        .contains("no runtime context any more"));
    let (_, r5) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "Bye."}]),
        &json!({}),
        "anthropic",
    );
    let v5: Value = serde_json::from_str(&r5).unwrap();
    let messages = v5["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap()["content"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["text"],
        "Bye."
    );

    let log = events(&d, &id);
    assert_eq!(
        kinds(&log)
            .iter()
            .filter(|k| *k == "context/snapshot")
            .count(),
        3,
        "snapshots only when the context changed, and once when it disappeared"
    );
    assert_eq!(
        headers(&log),
        ["initial"],
        "exactly one header while nothing changed"
    );
    assert_eq!(kinds(&log).iter().filter(|k| *k == "step").count(), 5);

    // Q4: every step's request rebuilds byte-identically from the log.
    for (n, bytes, format) in [
        (1, &r1, "neutral"),
        (2, &r2, "openai"),
        (3, &r3, "neutral"),
        (4, &r4, "neutral"),
        (5, &r5, "anthropic"),
    ] {
        assert_eq!(&rebuilt(&d, &id, n, format), bytes, "step {n}");
    }

    // R4 + Q3: unloading a plugin changes the header: recorded again with reason `change`.
    let v = d.ok("DELETE", "/v1/plugins/tools", None);
    assert_eq!(v["applied"][0]["kind"], "unload");
    let (_, r6) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "Tools?"}]),
        &json!({}),
        "neutral",
    );
    let v6: Value = serde_json::from_str(&r6).unwrap();
    assert_eq!(v6["tools"], json!([]));
    assert!(!v6["system"].as_str().unwrap().contains("read_file"));
    assert_eq!(headers(&events(&d, &id)), ["initial", "change"]);
    // Earlier steps still rebuild as they were.
    assert_eq!(&rebuilt(&d, &id, 1, "neutral"), &r1);
}

#[test]
fn q3_q4_a_restart_records_no_header_when_unchanged_and_past_steps_rebuild_byte_identically() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = new_session(&d, "default");
    let mut returned = Vec::new();
    for (i, cwd) in ["/a", "/b"].iter().enumerate() {
        let msg = json!([{"role": "user", "content": format!("step {i}")}]);
        returned.push(step(&d, &id, &msg, &json!({"cwd": cwd}), "neutral"));
    }
    let before: Vec<String> = ["openai", "anthropic"]
        .iter()
        .flat_map(|f| (1..=2).map(|n| rebuilt(&d, &id, n, f)).collect::<Vec<_>>())
        .collect();
    d.stop();

    let d = Served::start(folder.path(), &config, &state);
    let (n, _) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "after restart"}]),
        &json!({"cwd": "/b"}),
        "neutral",
    );
    assert_eq!(n, 3, "the conversation continues");
    // The plugins and config are the same, so is the header: nothing to record again.
    assert_eq!(headers(&events(&d, &id)), ["initial"]);
    for (n, bytes) in &returned {
        assert_eq!(&rebuilt(&d, &id, *n, "neutral"), bytes);
    }
    let after: Vec<String> = ["openai", "anthropic"]
        .iter()
        .flat_map(|f| (1..=2).map(|n| rebuilt(&d, &id, n, f)).collect::<Vec<_>>())
        .collect();
    assert_eq!(after, before);
}

#[test]
fn q7_kill_9_under_load_loses_no_acknowledged_step() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let url = d.url.clone();
    let sessions: Vec<String> = (0..4).map(|_| new_session(&d, "default")).collect();
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = sessions
        .iter()
        .cloned()
        .map(|id| {
            let (url, acked, stop) = (url.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                // Bounded in count and time; the daemon dies under it.
                for i in 0..500 {
                    if stop.load(Ordering::Relaxed) || started.elapsed() > Duration::from_secs(20) {
                        break;
                    }
                    let body = json!({"messages": [{"role": "user", "content": format!("m{i}")}],
                                      "facts": {"cwd": format!("/d{}", i % 3)}})
                    .to_string();
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .into();
                    let resp = agent
                        .post(format!("{url}/v1/sessions/{id}/steps"))
                        .header("Content-Type", "application/json")
                        .send(body);
                    let Ok(mut resp) = resp else { break };
                    if resp.status() != 200 {
                        break;
                    }
                    let text = resp.body_mut().read_to_string().unwrap_or_default();
                    if let Some((_, n)) = text.rsplit_once(",\"step\":") {
                        let n = n.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("");
                        let n: u64 = n.parse().unwrap();
                        acked.lock().unwrap().insert(id.clone(), n);
                    }
                }
            })
        })
        .collect();
    // Let the clients run, then kill the daemon mid-flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while acked.lock().unwrap().values().sum::<u64>() < 40 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    d.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.values().sum::<u64>() >= 4,
        "the load generator made progress: {acked:?}"
    );
    eprintln!("acknowledged steps before kill -9: {acked:?}");

    let d = Served::start(folder.path(), &config, &state);
    for id in &sessions {
        let log = events(&d, id);
        // Gapless sequence numbers and whole records: nothing torn.
        for (i, e) in log.iter().enumerate() {
            assert_eq!(e["seq"], i as u64 + 1);
            assert!(e["body"].is_object(), "{e}");
        }
        let steps = kinds(&log).iter().filter(|k| *k == "step").count() as u64;
        let acked_n = acked.get(id).copied().unwrap_or(0);
        assert!(
            steps >= acked_n,
            "session {id}: {steps} steps in the log, {acked_n} acknowledged"
        );
        // The log ends on a step boundary: a step is all or nothing.
        assert_eq!(
            kinds(&log).last().unwrap(),
            if steps == 0 {
                "session/created"
            } else {
                "step"
            }
        );
        // And every recorded step still rebuilds.
        for n in 1..=steps {
            rebuilt(&d, id, n, "neutral");
        }
    }
}

#[test]
fn q6_an_assembly_error_records_nothing_and_the_session_goes_on() {
    let folder = Folder::new().scripted("echo");
    let config = folder.config(
        "[plugins.echo]\nconfig = { \"fact_section.text\" = \"0\", \"variable.name\" = \"Ada\" }\n",
    );
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = new_session(&d, "default");
    let before = events(&d, &id);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "facts": {"text": "Hi {{nobody}}"}});
    let (status, text) = d.post(&format!("/v1/sessions/{id}/steps"), &body.to_string());
    assert_eq!(status, 422, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "unknown_variable");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`nobody`") && message.contains("section `text` (plugin `echo`)"),
        "{message}"
    );
    assert_eq!(events(&d, &id), before, "nothing recorded");

    let (n, r) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "hi"}]),
        &json!({"text": "Hi {{name}}"}),
        "neutral",
    );
    assert_eq!(n, 1);
    let v: Value = serde_json::from_str(&r).unwrap();
    assert_eq!(v["system"], "Hi Ada");
}

#[test]
fn l5_bad_input_gets_a_clear_4xx_and_records_nothing() {
    let folder = bundled();
    // A 1 MiB body limit (the default is 32 MiB, for images), so the 2 MiB body is over it.
    let config = folder.config(&format!("{CONFIG}\n[limits]\nmax_body_mb = 1\n"));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = new_session(&d, "default");
    let steps = format!("/v1/sessions/{id}/steps");
    let before = events(&d, &id);
    let cases: Vec<(&str, String, String, u16, &str)> = vec![
        (
            "malformed JSON",
            "POST".into(),
            steps.clone(),
            400,
            "bad_request",
        ),
        (
            "unknown session",
            "POST".into(),
            "/v1/sessions/nope/steps".into(),
            404,
            "unknown_session",
        ),
        (
            "unknown field",
            "POST".into(),
            steps.clone(),
            400,
            "bad_request",
        ),
        (
            "wrong field type",
            "POST".into(),
            "/v1/sessions".into(),
            400,
            "bad_request",
        ),
        (
            "unknown tool call",
            "POST".into(),
            steps.clone(),
            422,
            "unknown_tool_call",
        ),
        (
            "assistant in a step",
            "POST".into(),
            steps.clone(),
            400,
            "bad_request",
        ),
        (
            "oversized body",
            "POST".into(),
            steps.clone(),
            413,
            "body_too_large",
        ),
        (
            "unknown format",
            "POST".into(),
            steps.clone(),
            400,
            "bad_request",
        ),
        (
            "bad agent name",
            "POST".into(),
            "/v1/sessions".into(),
            400,
            "invalid_agent",
        ),
        (
            "unknown step",
            "GET".into(),
            format!("/v1/sessions/{id}/steps/9/request"),
            404,
            "unknown_step",
        ),
        (
            "unknown route",
            "GET".into(),
            "/v2/nothing".into(),
            404,
            "not_found",
        ),
        (
            "unknown plugin",
            "DELETE".into(),
            "/v1/plugins/nope".into(),
            404,
            "unknown_plugin",
        ),
        (
            "wrong method on a known route",
            "DELETE".into(),
            steps.clone(),
            405,
            "method_not_allowed",
        ),
        (
            "GET where only POST is served",
            "GET".into(),
            // (Not /v1/sessions: GET lists sessions since the inspector.)
            "/v1/sessions/any/steps".into(),
            405,
            "method_not_allowed",
        ),
        (
            "POST to an unknown route",
            "POST".into(),
            "/nothing/here".into(),
            404,
            "not_found",
        ),
    ];
    let bodies = [
        "{\"messages\": [".to_string(),
        "{}".to_string(),
        "{\"mesages\": []}".to_string(),
        "{\"agent\": 5}".to_string(),
        json!({"messages": [{"role": "tool", "tool_call_id": "ghost", "content": "x"}]})
            .to_string(),
        json!({"messages": [{"role": "assistant", "content": "I am the model"}]}).to_string(),
        json!({"messages": [{"role": "user", "content": "x".repeat(2 << 20)}]}).to_string(),
        json!({"format": "cohere"}).to_string(),
        json!({"agent": "has space"}).to_string(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        "{}".to_string(),
    ];
    for ((what, method, path, status, code), body) in cases.into_iter().zip(bodies) {
        let (got, text) = match method.as_str() {
            "GET" => d.get(&path),
            "DELETE" => d.delete(&path),
            _ => d.post(&path, &body),
        };
        assert_eq!(got, status, "{what}: {text}");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
        assert_eq!(v["error"]["code"], code, "{what}: {text}");
        assert!(
            !v["error"]["message"].as_str().unwrap().is_empty(),
            "{what}"
        );
    }
    // A tool result for an unknown call through /messages too.
    let (status, _) = d.post(
        &format!("/v1/sessions/{id}/messages"),
        &json!({"role": "tool", "tool_call_id": "ghost", "content": "x"}).to_string(),
    );
    assert_eq!(status, 422);
    assert_eq!(events(&d, &id), before, "nothing was recorded");
}

#[test]
fn q8_provider_bodies_from_the_daemon_have_the_documented_shapes() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = new_session(&d, "default");
    let (_, openai) = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "hi"}]),
        &json!({"cwd": "/r"}),
        "openai",
    );
    let o: Value = serde_json::from_str(&openai).unwrap();
    assert_eq!(o["model"], "test-model");
    assert_eq!(o["messages"][0]["role"], "system");
    assert_eq!(
        o["messages"][2],
        json!({"role": "user", "content": o["messages"][2]["content"]})
    );
    for t in o["tools"].as_array().unwrap() {
        assert_eq!(t["type"], "function");
        assert!(t["function"]["parameters"].is_object());
    }
    let a: Value = serde_json::from_str(&rebuilt(&d, &id, 1, "anthropic")).unwrap();
    assert_eq!(a["max_tokens"], 512);
    assert_eq!(a["system"][0]["type"], "text");
    assert_eq!(
        a["system"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    let tools = a["tools"].as_array().unwrap();
    assert!(tools.iter().all(|t| t["input_schema"].is_object()));
    assert_eq!(
        tools.last().unwrap()["cache_control"],
        json!({"type": "ephemeral"})
    );
    assert!(tools[..tools.len() - 1]
        .iter()
        .all(|t| t.get("cache_control").is_none()));
    // Tools come before the system prompt, which comes before the volatile runtime context,
    // and the user's message and the snapshot merge into one user turn.
    assert_eq!(a["messages"].as_array().unwrap().len(), 1);
    assert_eq!(a["messages"][0]["role"], "user");
}

#[test]
fn r5_plugins_events_and_metrics_are_visible() {
    let folder = bundled().bytes("broken", b"not wasm");
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);

    let v = d.ok("GET", "/v1/plugins", None);
    let plugins = v["plugins"].as_array().unwrap();
    let broken = plugins.iter().find(|p| p["id"] == "broken").unwrap();
    assert_eq!(broken["state"], "refused");
    assert_eq!(broken["last_error"]["code"], "not_a_component");
    let tools = plugins.iter().find(|p| p["id"] == "tools").unwrap();
    assert_eq!(tools["state"], "loaded");
    assert_eq!(tools["sha256"].as_str().unwrap().len(), 64);
    assert!(tools["file"].as_str().unwrap().ends_with("tools.wasm"));
    assert_eq!(tools["declares"]["filters_tools"], true);

    // The event stream replays history with sequence numbers (SSE), from Last-Event-ID.
    let events = sse_events(&d.url, 5, None);
    let seen: Vec<(u64, String, String)> = events
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["kind"].as_str().unwrap().into(),
                e["plugin"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (1, "refused".into(), "broken".into()),
            (2, "load".into(), "identity".into()),
            (3, "load".into(), "persona".into()),
            (4, "load".into(), "tools".into()),
            (5, "load".into(), "workspace".into()),
        ]
    );
    assert_eq!(sse_events(&d.url, 1, Some(4))[0]["seq"], 5);
    // A live change arrives on an open stream. The daemon takes a stream's replay and its live
    // subscription together, so once this stream has replayed the history it is subscribed:
    // the unload made after that can only reach it live, never as replayed history.
    let mut stream = SseStream::open(&d.url, None);
    let replayed: Vec<u64> = (0..5)
        .map(|_| stream.next("the replayed history")["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(replayed, [1, 2, 3, 4, 5]);
    let applied = d.ok("DELETE", "/v1/plugins/persona", None)["applied"][0].clone();
    let live = stream.next("the live unload of persona");
    assert_eq!(live["kind"], "unload");
    assert_eq!(live["seq"], 6);
    assert_eq!(live["plugin"], "persona");
    assert_eq!(
        live, applied,
        "the stream carries the change the DELETE applied"
    );

    // `since=now` replays nothing: the first event such a stream reads is the next change.
    let mut from_now = SseStream::from_now(&d.url);
    let applied = d.ok("DELETE", "/v1/plugins/tools", None)["applied"][0].clone();
    let first = from_now.next("the unload of tools, the first event after now");
    assert_eq!(
        (&first["seq"], &first["kind"]),
        (&json!(7), &json!("unload"))
    );
    assert_eq!(first, applied);
    let (status, body) = d.get("/v1/events?since=later");
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("since `later` is not an event's seq"),
        "{body}"
    );

    let id = new_session(&d, "default");
    step(&d, &id, &json!([]), &json!({}), "neutral");
    let (status, text) = d.get("/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains("promptd_steps_total{outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("promptd_step_duration_seconds_count 1"),
        "{text}"
    );
    assert!(text.contains("promptd_plugins_loaded 2"), "{text}");
}

/// Reads `count` events from `GET /v1/events`.
fn sse_events(base: &str, count: usize, last_id: Option<u64>) -> Vec<Value> {
    let mut stream = SseStream::open(base, last_id);
    (0..count)
        .map(|i| stream.next(&format!("event {} of {count}", i + 1)))
        .collect()
}

/// An open `GET /v1/events` stream, read one event at a time.
struct SseStream {
    lines: std::io::Lines<std::io::BufReader<std::net::TcpStream>>,
}

impl SseStream {
    /// `GET /v1/events?since=now`, once the daemon answered (so it is subscribed).
    fn from_now(base: &str) -> SseStream {
        use std::io::{BufRead, BufReader, Write};
        let addr = base.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET /v1/events?since=now HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        let mut lines = BufReader::new(stream).lines();
        let status = lines.next().expect("a status line").expect("read");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        SseStream { lines }
    }

    fn open(base: &str, last_id: Option<u64>) -> SseStream {
        use std::io::{BufRead, BufReader, Write};
        let addr = base.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let last = last_id
            .map(|n| format!("Last-Event-ID: {n}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET /v1/events HTTP/1.1\r\nHost: {addr}\r\n{last}Accept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        SseStream {
            lines: BufReader::new(stream).lines(),
        }
    }

    /// The next event's data; panics naming `what` when none comes within 10 s.
    fn next(&mut self, what: &str) -> Value {
        for line in &mut self.lines {
            let line = line.unwrap_or_else(|e| panic!("SSE: {what} never arrived: {e}"));
            if let Some(data) = line.strip_prefix("data: ") {
                return serde_json::from_str(data).unwrap();
            }
        }
        panic!("SSE: the stream ended before {what}")
    }
}

#[test]
fn l5_non_loopback_needs_a_token_and_the_token_is_enforced() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promptd"))
        .args(["serve", "--listen", "0.0.0.0:0", "--plugins"])
        .arg(folder.path())
        .arg("--config")
        .arg(&config)
        .arg("--state")
        .arg(&state)
        .env_remove("PROMPTD_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error[token_required]") && err.contains("requires a token"),
        "{err}"
    );

    let d = Served::start_with(
        folder.path(),
        &config,
        &state,
        &[],
        &[("PROMPTD_TOKEN", "s3cret")],
    );
    let (status, text) = d.get("/v1/plugins");
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("\"unauthorized\""));
    assert_eq!(
        request(&d.url, "GET", "/v1/plugins", None, Some("wrong")).0,
        401
    );
    assert_eq!(
        request(&d.url, "GET", "/v1/plugins", None, Some("s3cret")).0,
        200
    );
    assert_eq!(d.get("/v1/health").0, 200, "health needs no token");
}

#[test]
fn serves_on_a_unix_socket_when_asked() {
    use std::io::{Read, Write};
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (tmp, state) = state_dir();
    let socket = tmp.path().join("promptd.sock");
    let listen = format!("unix:{}", socket.display());
    let d = Served::start_with(folder.path(), &config, &state, &["--listen", &listen], &[]);
    assert_eq!(d.url, listen);
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: promptd\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"status\":\"ok\""), "{reply}");
}

#[test]
fn the_cli_client_drives_a_session() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let server = ["--server", d.url.as_str()];
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&server);
        common::promptd(&all)
    };
    let out = run(&["session", "new", "coder"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let id = common::stdout(&out).trim().to_string();
    assert_eq!(id.len(), 24, "{id}");

    let out = run(&[
        "session", "step", &id, "--user", "hello", "--fact", "cwd=/cli", "--format", "openai",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let v: Value = serde_json::from_str(&common::stdout(&out)).unwrap();
    assert_eq!(v["step"], 1);
    assert_eq!(
        v["request"]["messages"][1],
        json!({"role": "user", "content": "hello"})
    );

    let log = common::stdout(&run(&["session", "log", &id]));
    let step_line = log.lines().find(|l| l.contains(" step ")).unwrap_or("");
    assert!(
        step_line.contains("[usage: ") && step_line.contains("(chars)"),
        "the step's measurement is in the log: {step_line}"
    );
    let kinds: Vec<&str> = log
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "session/created",
            "user/message",
            "context/snapshot",
            "request/header",
            "step"
        ]
    );

    let plugins = common::stdout(&run(&["plugins"]));
    assert_eq!(plugins.lines().count(), 4, "{plugins}");
    assert!(plugins.lines().all(|l| l.contains(" loaded ")), "{plugins}");

    let out = run(&["session", "step", "nope", "--user", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let err = common::stderr(&out);
    assert!(
        err.starts_with("error[unknown_session]: no session `nope`"),
        "{err}"
    );
}

#[test]
fn the_example_agent_loop_runs_through_a_tool_call() {
    // `cargo test` builds examples next to the test binaries' folder.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("agent_loop");
    assert!(example.exists(), "{} was not built", example.display());
    let folder = bundled();
    let config = folder.config(&format!("{CONFIG}\n[agents.coder]\n"));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let out = std::process::Command::new(example)
        .env("PROMPTD_URL", &d.url)
        .current_dir(folder.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("tool list_dir ."), "{text}");
    // The folder holds the 4 plugins and promptd.toml.
    assert!(text.contains("model: This folder has 5 entries."), "{text}");
    assert!(text.contains("done after 2 steps"), "{text}");
}

/// `promptd assemble` and a daemon step speak one neutral shape: for the same plugins, config
/// and facts, the first step of a session without messages is the one-shot request, key for
/// key (model settings included).
#[test]
fn assemble_and_a_first_step_give_the_same_neutral_request() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let facts = [
        ("cwd", "/src/app"),
        ("git_branch", "main"),
        ("read_only", "true"),
    ];
    let mut args = vec![];
    for (k, v) in facts {
        args.extend(["--fact".to_string(), format!("{k}={v}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let one_shot: Value = serde_json::from_str(&folder.assemble(&config, &args)).unwrap();
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = new_session(&d, "default");
    let facts: serde_json::Map<String, Value> = facts
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let (_, request) = step(&d, &id, &json!([]), &Value::Object(facts), "neutral");
    let stepped: Value = serde_json::from_str(&request).unwrap();
    assert_eq!(stepped, one_shot);
    assert_eq!(
        one_shot["model"],
        json!({"model": "test-model", "max_tokens": 512})
    );
    assert_eq!(one_shot["messages"][0]["snapshot"], true);
}

/// The daemon listens before it loads its plugins: a plugin whose declare loops until its
/// deadline delays neither listening nor health; a step waits for the first registry.
#[test]
fn h5_it_listens_first_and_loads_in_the_background() {
    let folder = bundled().scripted("slow");
    let config = folder
        .config("[plugins.slow]\ntimeout_ms = 3000\nconfig = { loop_in_declare = \"true\" }\n");
    let (_tmp, state) = state_dir();
    let started = Instant::now();
    let d = Served::start_unready(folder.path(), &config, &state);
    let listening = started.elapsed();
    let health = d.health();
    assert_eq!(health["status"], "loading", "{health}");
    // Progress: the loader counts the five files; the four others load while the fifth sits
    // in its looping declare (loads run in parallel).
    common::eventually("loading progress", || {
        let h = d.health();
        h["status"] == "loading" && h["total"] == 5 && h["loaded"] == 4
    });
    assert!(
        listening < Duration::from_millis(2500),
        "listened after {listening:?}, before the looping declare's 3 s deadline"
    );
    let id = new_session(&d, "default");
    let (n, request) = step(&d, &id, &json!([]), &json!({}), "neutral");
    assert_eq!(n, 1);
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "the step waited for the first load"
    );
    assert!(request.contains("You are an AI assistant"), "{request}");
    assert_eq!(d.health()["status"], "ok");
    let slow = d.plugin("slow");
    assert_eq!(slow["state"], "refused", "{slow}");
    assert_eq!(slow["last_error"]["code"], "declare_failed", "{slow}");
}

/// Q12: `rm sessions.db*` under a running daemon. SQLite would keep writing into the deleted
/// files; the daemon refuses instead (500 `store`), says so in health and in its log, and keeps
/// answering HTTP.
#[test]
fn q12_a_database_deleted_under_the_daemon_is_refused_loudly() {
    let folder = bundled();
    let config = folder.config(CONFIG);
    let (tmp, state) = state_dir();
    let log = tmp.path().join("daemon.log");
    let d = Served::start_logged(folder.path(), &config, &state, &log);
    let id = new_session(&d, "default");
    step(&d, &id, &json!([]), &json!({}), "neutral");
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(state.join(format!("sessions.db{suffix}"))).unwrap();
    }

    let (status, text) = d.post(&format!("/v1/sessions/{id}/steps"), "{}");
    assert_eq!(status, 500, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "store", "{text}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sessions.db was deleted while open"),
        "{text}"
    );
    let (status, text) = d.post("/v1/sessions", "{}");
    assert_eq!(status, 500, "no new session either: {text}");
    assert!(text.contains("\"store\""), "{text}");
    let (status, text) = d.get(&format!("/v1/sessions/{id}/events"));
    assert_eq!(status, 500, "reads do not show what is gone: {text}");

    let (status, text) = d.get("/v1/health");
    assert_eq!(status, 503, "{text}");
    let health: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(health["status"], "error", "{health}");
    assert_eq!(health["error"]["code"], "store", "{health}");
    assert!(
        health["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deleted"),
        "{health}"
    );
    // Still answering HTTP.
    assert_eq!(d.get("/v1/plugins").0, 200);
    assert!(
        !state.join("sessions.db").exists(),
        "no empty database made"
    );
    d.stop();
    let log = std::fs::read_to_string(&log).unwrap();
    let lost: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("session store lost"))
        .collect();
    assert_eq!(lost.len(), 1, "one log line: {log}");
    assert!(
        lost[0].contains(&state.join("sessions.db").display().to_string()),
        "names the path: {log}"
    );
}

/// How long until the server closes `stream`, sending it one more byte of `dribble` every
/// 50 ms meanwhile (nothing when it is empty); `None` if still open after `bound`.
fn closed_after(
    stream: &mut std::net::TcpStream,
    dribble: &[u8],
    bound: Duration,
) -> Option<Duration> {
    use std::io::{Read, Write};
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut bytes = dribble.iter();
    while started.elapsed() < bound {
        if let Some(b) = bytes.next() {
            let _ = stream.write_all(&[*b]);
        }
        let mut buf = [0u8; 4096];
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

/// One keep-alive request on `stream`; returns the response head and body.
fn keep_alive_get(stream: &mut std::net::TcpStream, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    write!(stream, "GET {path} HTTP/1.1\r\nHost: promptd\r\n\r\n").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed mid-response");
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("content-length");
            if body.len() >= length {
                return (head.to_string(), body.to_string());
            }
        }
    }
}

const SHORT_TIMEOUTS: &str = "[limits]\nheader_timeout_ms = 500\nidle_timeout_ms = 800\n";

/// H6: connections dribbling a request head, or sending nothing, are closed at the header
/// timeout, while a normal client is served meanwhile.
#[test]
fn h6_slow_request_heads_are_closed_and_others_are_served() {
    let folder = bundled();
    let config = folder.config(&format!("{CONFIG}{SHORT_TIMEOUTS}"));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let addr = d.url.trim_start_matches("http://").to_string();
    let id = new_session(&d, "default");
    // 50 connections dribbling a request head (one byte every 50 ms would take 2.5 s for the
    // first line alone), and one that sends nothing at all.
    let head = b"GET /v1/health HTTP/1.1\r\nHost: promptd\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let slow: Vec<_> = (0..51)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut stream = std::net::TcpStream::connect(&addr).unwrap();
                let dribble: &[u8] = if i == 0 { b"" } else { head };
                closed_after(&mut stream, dribble, Duration::from_secs(8))
            })
        })
        .collect();
    // Meanwhile a normal client is served, steps included.
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_millis(400) {
        step(&d, &id, &json!([]), &json!({}), "neutral");
        assert_eq!(d.get("/v1/health").0, 200);
        served += 1;
    }
    assert!(served > 0);
    for (i, t) in slow.into_iter().enumerate() {
        let after = t.join().unwrap();
        let after = after.unwrap_or_else(|| panic!("connection {i} still open after 8 s"));
        assert!(
            after >= Duration::from_millis(400) && after < Duration::from_secs(5),
            "connection {i} closed after {after:?}, expected about 500 ms"
        );
    }
    assert_eq!(d.get("/v1/health").0, 200);
}

/// H6: a keep-alive connection is served request after request, closed once idle longer than
/// the idle timeout; an SSE stream that sends nothing for longer is not cut.
#[test]
fn h6_idle_connections_are_closed_but_streams_are_not() {
    use std::io::{BufRead, BufReader, Write};
    let folder = bundled();
    let config = folder.config(&format!("{CONFIG}{SHORT_TIMEOUTS}"));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let addr = d.url.trim_start_matches("http://").to_string();

    let mut events = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        events,
        "GET /v1/events?since=999999 HTTP/1.1\r\nHost: promptd\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();

    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    for _ in 0..3 {
        let (head, body) = keep_alive_get(&mut stream, "/v1/health");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body.contains("\"ok\""), "{body}");
        // Idle for less than the idle timeout (and longer than the header timeout): kept.
        std::thread::sleep(Duration::from_millis(600));
    }
    let after = closed_after(&mut stream, b"", Duration::from_secs(8))
        .expect("an idle connection is closed");
    assert!(
        after >= Duration::from_millis(100) && after < Duration::from_secs(5),
        "closed after {after:?} more, expected at 800 ms idle"
    );

    // The event stream has been open for about 2.6 s, three idle timeouts, with nothing to
    // send (its keep-alive comment comes every 15 s): an unload still reaches it.
    assert_eq!(d.delete("/v1/plugins/persona").0, 200);
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut kinds = Vec::new();
    for line in BufReader::new(&mut events).lines() {
        let line = line.expect("the stream is still open");
        if let Some(kind) = line.strip_prefix("event: ") {
            kinds.push(kind.to_string());
            break;
        }
    }
    assert_eq!(kinds, ["unload"]);
}

/// H6: beyond `max_connections`, a client waits for a free slot instead of being refused; the
/// header timeout frees slots held by silent connections.
#[test]
fn h6_connections_beyond_the_bound_wait_for_a_free_slot() {
    let folder = bundled();
    let config = folder.config(&format!(
        "{CONFIG}[limits]\nheader_timeout_ms = 1000\nmax_connections = 4\n"
    ));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let addr = d.url.trim_start_matches("http://").to_string();
    // Wait until the daemon has closed the connections the start-up polling may have left.
    std::thread::sleep(Duration::from_millis(1200));
    let silent: Vec<_> = (0..4)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let started = Instant::now();
    assert_eq!(d.get("/v1/health").0, 200);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(700),
        "served after {waited:?}: it should have waited for a silent connection's timeout"
    );
    drop(silent);
    let started = Instant::now();
    assert_eq!(d.get("/v1/health").0, 200);
    assert!(started.elapsed() < Duration::from_millis(700));
}

/// H6: a request body sent slowly is cut at `body_timeout_ms` from the end of its head (a
/// byte every 50 ms still counts as late): the client gets 408 `body_timeout`, the connection
/// closes, nothing is recorded, and the daemon serves others meanwhile.
#[test]
fn h6_a_body_sent_slowly_is_answered_408_at_the_body_timeout() {
    use std::io::{Read, Write};
    let folder = bundled();
    let config = folder.config(&format!(
        "{CONFIG}[limits]\nbody_timeout_ms = 600\nheader_timeout_ms = 200\n"
    ));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let addr = d.url.trim_start_matches("http://").to_string();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    let body = r#"{"agent":"default"}"#;
    write!(
        slow,
        "POST /v1/sessions HTTP/1.1\r\nHost: promptd\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut sent = 0;
    let closed = loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no answer after 10 s: {:?}",
            String::from_utf8_lossy(&answer)
        );
        // One byte every 50 ms, never the last: 19 bytes would take 950 ms.
        if sent + 1 < body.len() {
            let _ = slow.write_all(&body.as_bytes()[sent..=sent]);
            sent += 1;
        }
        let mut buf = [0u8; 4096];
        match slow.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break started.elapsed(),
        }
        // A normal client is served while the slow body is pending.
        if sent == 4 {
            assert_eq!(d.get("/v1/health").0, 200);
        }
    };
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert!(
        answer.contains("did not arrive within 600 ms (limits.body_timeout_ms)"),
        "{answer}"
    );
    assert!(
        closed >= Duration::from_millis(500) && closed < Duration::from_secs(5),
        "closed after {closed:?}, expected at about 600 ms"
    );
    let sessions = d.ok("GET", "/v1/sessions", None);
    assert_eq!(sessions["sessions"], json!([]), "nothing was recorded");
}

/// A daemon whose `bodies_in_flight_mb` and `max_body_mb` are 1 MiB, and a connection that
/// sent `head` (a request head and the start of its body) and stalls, holding its share of
/// the budget until its 1.5 s body timeout.
fn stalled_body(head: &str) -> (Served, tempfile::TempDir, std::net::TcpStream) {
    use std::io::Write;
    let folder = bundled();
    let config = folder.config(&format!(
        "{CONFIG}[limits]\nmax_body_mb = 1\nbodies_in_flight_mb = 1\nbody_timeout_ms = 1500\n"
    ));
    let (tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let addr = d.url.trim_start_matches("http://").to_string();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    (d, tmp, slow)
}

/// Creating a session (a 19-byte body) waits for the stalled body's share, and is then
/// served; the stalled body is answered 408.
fn waits_for_the_stalled_body(d: &Served, mut slow: std::net::TcpStream, why: &str) {
    use std::io::Read;
    let started = Instant::now();
    let (status, body) = d.post("/v1/sessions", r#"{"agent":"default"}"#);
    let waited = started.elapsed();
    assert_eq!(status, 201, "{body}");
    assert!(
        waited >= Duration::from_millis(900),
        "served after {waited:?}: {why}"
    );
    let mut answer = String::new();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

/// H6: `bodies_in_flight_mb` bounds the bytes of request bodies in flight across connections:
/// while one client holds the whole budget with a slow 1 MiB body, another request with a body
/// waits for it (and is then served), and a request without a body is served at once.
#[test]
fn h6_bodies_in_flight_are_bounded_across_connections() {
    let (d, _tmp, slow) = stalled_body(&format!(
        "POST /v1/sessions HTTP/1.1\r\nHost: promptd\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"agent\"",
        1 << 20
    ));
    let started = Instant::now();
    assert_eq!(d.get("/v1/health").0, 200);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a request without a body does not wait"
    );
    waits_for_the_stalled_body(&d, slow, "it should have waited for the slow body's share");
}

/// H6, configuration.md's limits table: a body of unknown length (chunked) counts as
/// `max_body_mb` against `bodies_in_flight_mb`, so with both at 1 MiB a slow chunked body
/// holds the whole budget: another body waits until it ends (at its body timeout).
#[test]
fn h6_a_chunked_body_counts_as_max_body_mb_in_flight() {
    let (d, _tmp, slow) = stalled_body(
        "POST /v1/sessions HTTP/1.1\r\nHost: promptd\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n{\"agent\"\r\n",
    );
    waits_for_the_stalled_body(
        &d,
        slow,
        "a 19-byte body waited for the chunked body's max_body_mb",
    );
}

/// Q22: short steps of one session sent by several clients at once, a quarter of whose
/// clients hang up before the reply, never meet a conflict: every step answered is 200, and
/// the log holds every recorded step in order, with no gap. (A short step runs to its end
/// and holds its session until its append is applied, whether or not its client waits.)
#[test]
fn q22_short_steps_of_one_session_from_clients_that_hang_up_never_conflict() {
    use std::io::Write;
    let folder = Folder::new().scripted("s");
    let config = folder.config("[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n");
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = d.session("default");
    assert_eq!(d.step(&id).0, 200);
    let addr = d.url.trim_start_matches("http://").to_string();
    let answered = std::sync::atomic::AtomicU64::new(1);
    std::thread::scope(|s| {
        for t in 0..6 {
            let (d, id, addr, answered) = (&d, &id, &addr, &answered);
            s.spawn(move || {
                for i in 0..40 {
                    if (i + t) % 4 == 0 {
                        let mut c = std::net::TcpStream::connect(addr).unwrap();
                        write!(
                            c,
                            "POST /v1/sessions/{id}/steps HTTP/1.1\r\nHost: x\r\n\
                             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
                        )
                        .unwrap();
                        drop(c);
                        continue;
                    }
                    let (status, v) = d.step(id);
                    assert_eq!(status, 200, "thread {t} step {i}: {v}");
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    // One more step after all: its number counts every step recorded before it.
    let (status, last) = d.step(&id);
    assert_eq!(status, 200, "{last}");
    let last = last["step"].as_u64().unwrap();
    let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    let events = events["events"].as_array().unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "no gap");
    let steps = events.iter().filter(|e| e["kind"] == "step").count() as u64;
    assert_eq!(steps, last, "every recorded step counted");
    let answered = answered.load(Ordering::Relaxed) + 1;
    assert!(
        (answered..=answered + 60).contains(&steps),
        "{steps} steps recorded, {answered} answered"
    );
}
