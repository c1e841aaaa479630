//! Issue 34: steps as OpenTelemetry traces, read back from a real trace backend.
//!
//! Arize Phoenix (PyPI `arize-phoenix`, pinned in tests/telemetry/requirements.txt and installed
//! by tests/telemetry/install.sh) runs on loopback with its OTLP receivers (HTTP on its web
//! port, gRPC on another). Real `promptd serve` daemons export to it, and the spans are read
//! back through Phoenix's own REST API (`GET /v1/projects/{project}/spans`): each daemon writes
//! to a project of its own (`openinference.project.name`, a `[telemetry.resource]` attribute).
//!
//! The session: a tool call, a hot swap of `versioned` that breaks the prefix, and an idle gap
//! (its `sent_at`) the cache model calls expired; a second session joins a client's trace
//! (`traceparent`). Then Phoenix is stopped, and steps go on at full speed while the spans they
//! make are counted as dropped. A screenshot of the session in Phoenix's UI is taken in
//! headless Chromium (`target/test-artifacts/telemetry-phoenix.png`, and
//! `docs/telemetry-phoenix.png` with `PROMPTD_SCREENSHOT=1`).

use promptd_testkit as common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Served;
use common::process::{run_bounded, Bounded};
use common::{eventually, fixture, put, repo_root, Folder};
use serde_json::{json, Value};

fn dir() -> PathBuf {
    repo_root().join("tests/telemetry")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One HTTP request with extra headers; (status, body).
fn call(url: &str, method: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let result = match method {
        "GET" => {
            let mut r = agent.get(url);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.call()
        }
        _ => {
            let mut r = agent.post(url).header("Content-Type", "application/json");
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.send(body.map(Value::to_string).unwrap_or_default())
        }
    };
    match result {
        Ok(mut response) => {
            let status = response.status().as_u16();
            (
                status,
                response.body_mut().read_to_string().unwrap_or_default(),
            )
        }
        Err(e) => (0, e.to_string()),
    }
}

/// Arize Phoenix on loopback: its UI, REST API and OTLP/HTTP receiver on `http`, its OTLP/gRPC
/// receiver on `grpc`, its database in a temporary folder.
struct Phoenix {
    child: Option<Bounded>,
    http: u16,
    grpc: u16,
    _home: tempfile::TempDir,
}

impl Phoenix {
    fn start() -> Phoenix {
        let phoenix = dir().join(".venv/bin/phoenix");
        assert!(
            phoenix.exists(),
            "{} is missing: run `bash tests/telemetry/install.sh`",
            phoenix.display()
        );
        let home = tempfile::tempdir().expect("tempdir");
        let (http, grpc) = (free_port(), free_port());
        let log = std::fs::File::create(home.path().join("phoenix.log")).expect("log");
        let child = Command::new(&phoenix)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", home.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", http.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env(
                "PHOENIX_SQL_DATABASE_URL",
                format!("sqlite:///{}/phoenix.db", home.path().display()),
            )
            .env("TMPDIR", home.path())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .env("PHOENIX_ENABLE_AUTH", "false")
            .env("PHOENIX_DISABLE_AGENT_ASSISTANT", "true")
            .env("PHOENIX_ENABLE_MCP_SERVER", "false")
            .env("PHOENIX_LOG_MIGRATIONS", "false")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start phoenix");
        let mut p = Phoenix {
            child: Some(Bounded(child)),
            http,
            grpc,
            _home: home,
        };
        let started = Instant::now();
        loop {
            if call(&format!("{}/healthz", p.url()), "GET", None, &[]).0 == 200 {
                break;
            }
            let exited = p.child.as_mut().and_then(|c| c.0.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > Duration::from_secs(180) {
                let log =
                    std::fs::read_to_string(p._home.path().join("phoenix.log")).unwrap_or_default();
                panic!("phoenix did not become ready ({exited:?}); its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        p
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// Every span of `project`, through Phoenix's REST API.
    fn spans(&self, project: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!("{}/v1/projects/{project}/spans?limit=1000", self.url());
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            let (status, body) = call(&url, "GET", None, &[]);
            if status == 404 {
                return all; // no span reached the project yet
            }
            assert_eq!(status, 200, "GET {url}: {body}");
            let page: Value = serde_json::from_str(&body).expect("spans JSON");
            all.extend(page["data"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return all,
            }
        }
    }

    fn stop(&mut self) {
        self.child.take();
    }
}

fn config(phoenix: &Phoenix, project: &str, extra: &str) -> String {
    format!(
        r#"
[model]
max_tokens = 1024
temperature = 0.2
[model.anthropic]
model = "claude-sonnet-4-5"

[agents.coder]

[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.tools]
scope = "coder"
[plugins.documents]
trust = "data"

[pricing."claude-sonnet-4-5"]
input = 3.0
output = 15.0

[telemetry]
enabled = true
endpoint = "http://127.0.0.1:{port}"
batch_delay_ms = 100
timeout_ms = 2000
reply_wait_ms = 60000
resource = {{ "openinference.project.name" = "{project}" }}
{extra}
"#,
        port = phoenix.http
    )
}

fn folder() -> Folder {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .shipped("documents");
    put(
        folder.path(),
        "versioned",
        &std::fs::read(fixture("versioned_v1")).expect("versioned_v1"),
    );
    folder
}

struct Client<'a> {
    d: &'a Served,
    id: String,
    headers: Vec<(&'static str, String)>,
}

impl Client<'_> {
    fn headers(&self) -> Vec<(&str, &str)> {
        self.headers.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    fn step(&self, messages: &Value, sent_at: u64, facts: &Value) -> Value {
        let body = json!({"messages": messages, "format": "anthropic", "sent_at": sent_at, "facts": facts});
        let url = format!("{}/v1/sessions/{}/steps", self.d.url, self.id);
        let (status, text) = call(&url, "POST", Some(&body), &self.headers());
        assert_eq!(status, 200, "step: {text}");
        serde_json::from_str(&text).expect("step JSON")
    }

    /// Records an Anthropic reply to the request sent at `sent_at`.
    fn reply(&self, content: &Value, usage: &Value, sent_at: u64) {
        let reply = json!({"id": format!("msg_{sent_at}"), "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": content, "stop_reason": "end_turn", "usage": usage});
        let url = format!(
            "{}/v1/sessions/{}/messages?format=anthropic&sent_at={sent_at}",
            self.d.url, self.id
        );
        let (status, text) = call(&url, "POST", Some(&reply), &self.headers());
        assert_eq!(status, 201, "record: {text}");
    }
}

fn session<'a>(d: &'a Served, agent: &str, traceparent: Option<&str>) -> Client<'a> {
    let headers: Vec<(&'static str, String)> = traceparent
        .map(|t| vec![("traceparent", t.to_string())])
        .unwrap_or_default();
    let hs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, text) = call(
        &format!("{}/v1/sessions", d.url),
        "POST",
        Some(&json!({"agent": agent})),
        &hs,
    );
    assert_eq!(status, 201, "{text}");
    let id = serde_json::from_str::<Value>(&text).expect("session")["id"]
        .as_str()
        .expect("id")
        .to_string();
    Client { d, id, headers }
}

const SENT: u64 = 1_790_000_000_000;
const SECRET: &str = "ZEBRA-WALRUS-7741";
const DATA_TEXT: &str = "RETRIEVED-QUOKKA-5512";

fn facts() -> Value {
    let docs = json!([{"source": "kb/1", "date": "2026-01-01", "text": format!("Internal note {DATA_TEXT}")}]);
    json!({"cwd": "/src/app", "git_branch": "main", "documents": docs.to_string()})
}

/// The coder's session of the issue: a tool call, a swap that breaks the prefix, an idle gap.
fn run_session(c: &Client<'_>, folder: &Folder) {
    c.step(
        &json!([{"role": "user", "content": format!("List the files. {SECRET}")}]),
        SENT,
        &facts(),
    );
    c.reply(
        &json!([{"type": "text", "text": format!("Looking. {SECRET}")},
               {"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {"path": "."}}]),
        &json!({"input_tokens": 40, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 5000, "output_tokens": 20}),
        SENT,
    );
    c.step(
        &json!([{"role": "tool", "tool_call_id": "toolu_1", "content": format!("Cargo.toml {SECRET}")}]),
        SENT + 10_000,
        &facts(),
    );
    c.reply(
        &json!([{"type": "text", "text": "Two files."}]),
        &json!({"input_tokens": 60, "cache_read_input_tokens": 5000, "cache_creation_input_tokens": 100, "output_tokens": 10}),
        SENT + 10_000,
    );
    let before = c.d.plugin("versioned")["sha256"].clone();
    put(
        folder.path(),
        "versioned",
        &std::fs::read(fixture("versioned_v2")).expect("versioned_v2"),
    );
    eventually("versioned v2 to serve", || {
        let p = c.d.plugin("versioned");
        p["sha256"] != before && p["state"] == "loaded"
    });
    c.step(
        &json!([{"role": "user", "content": "Thanks."}]),
        SENT + 20_000,
        &facts(),
    );
    c.reply(
        &json!([{"type": "text", "text": "You're welcome."}]),
        &json!({"input_tokens": 5200, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 5200, "output_tokens": 5}),
        SENT + 20_000,
    );
    // Ten minutes idle: past the 5-minute TTL.
    let late = SENT + 20_000 + 600_000;
    c.step(
        &json!([{"role": "user", "content": "Still there?"}]),
        late,
        &facts(),
    );
    c.reply(
        &json!([{"type": "text", "text": "Yes."}]),
        &json!({"input_tokens": 5300, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 5300, "output_tokens": 2}),
        late,
    );
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The spans of `project` once `want` of them say `what`.
fn wait_for(
    phoenix: &Phoenix,
    d: &Served,
    project: &str,
    what: &str,
    want: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let spans = phoenix.spans(project);
        if want(&spans) {
            return spans;
        }
        if started.elapsed() > Duration::from_secs(90) {
            let names: Vec<String> = spans
                .iter()
                .map(|s| {
                    format!(
                        "{} {} {}",
                        s["name"],
                        attr(s, "promptd.step"),
                        attr(s, "promptd.reply.recorded")
                    )
                })
                .collect();
            let (_, metrics) = d.get("/metrics");
            let telemetry: Vec<&str> = metrics
                .lines()
                .filter(|l| l.contains("telemetry"))
                .collect();
            panic!(
                "timed out waiting for {what}: {} spans in {project}: {names:#?}\n{telemetry:#?}",
                spans.len()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn chat_steps(spans: &[Value], session: &str) -> BTreeMap<i64, Value> {
    spans
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("chat ")))
        .filter(|s| attr(s, "promptd.session") == session)
        .filter_map(|s| attr(s, "promptd.step").as_i64().map(|n| (n, s.clone())))
        .collect()
}

fn metric(d: &Served, line: &str) -> f64 {
    let (status, text) = d.get("/metrics");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(line).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no `{line}` in /metrics:\n{text}"))
}

#[test]
fn e1_e2_e3_a_session_in_phoenix_carries_each_steps_story_and_a_stopped_backend_costs_nothing() {
    let mut phoenix = Phoenix::start();
    let folder = folder();
    let (d, _state) = folder.serve(&config(&phoenix, "promptd-story", ""));
    let plugins: BTreeMap<String, String> = d.ok("GET", "/v1/plugins", None)["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();

    let a = session(&d, "coder", None);
    run_session(&a, &folder);
    // A client's trace: its steps' spans go under the client's span.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let b = session(
        &d,
        "coder",
        Some(&format!("00-{client_trace}-00f067aa0ba902b7-01")),
    );
    b.step(&json!([{"role": "user", "content": "Hi."}]), SENT, &facts());
    b.reply(
        &json!([{"type": "text", "text": "Hello."}]),
        &json!({"input_tokens": 10, "output_tokens": 2}),
        SENT,
    );

    let spans = wait_for(
        &phoenix,
        &d,
        "promptd-story",
        "four recorded steps of session a",
        |s| {
            let steps = chat_steps(s, &a.id);
            steps.len() == 4
                && steps
                    .values()
                    .all(|c| attr(c, "promptd.reply.recorded") == true)
                && chat_steps(s, &b.id).len() == 1
        },
    );
    let steps = chat_steps(&spans, &a.id);

    // One trace per session: every span of session a shares one trace, rooted at its
    // `invoke_agent` span; session b's are in the client's trace.
    let trace = steps[&1]["context"]["trace_id"]
        .as_str()
        .expect("trace id")
        .to_string();
    let root = named(&spans, "invoke_agent coder")
        .into_iter()
        .find(|s| attr(s, "promptd.session") == a.id.as_str())
        .expect("the session's span");
    assert_eq!(root["context"]["trace_id"], trace.as_str());
    assert_eq!(root["parent_id"], Value::Null);
    for (n, s) in &steps {
        assert_eq!(s["context"]["trace_id"], trace.as_str(), "step {n}");
        assert_eq!(s["parent_id"], root["context"]["span_id"], "step {n}");
    }
    let in_trace: Vec<&Value> = spans
        .iter()
        .filter(|s| s["context"]["trace_id"] == trace.as_str())
        .collect();
    assert!(in_trace.iter().all(
        |s| attr(s, "promptd.session").is_null() || attr(s, "promptd.session") == a.id.as_str()
    ));
    let b_step = &chat_steps(&spans, &b.id)[&1];
    assert_eq!(b_step["context"]["trace_id"], client_trace);
    assert_eq!(b_step["parent_id"], "00f067aa0ba902b7");

    // The second step's facts and user words are the first's: its declared reads kept answers.
    let kept = attr(&steps[&2], "promptd.plugins.reused.count").as_i64();
    assert!(kept > Some(0), "step 2 reused nothing: {}", steps[&2]);
    // Every step's span: the GenAI attributes and promptd's own.
    for (n, s) in &steps {
        let say = |k: &str| format!("step {n}: {k} in {s}");
        assert_eq!(s["name"], "chat claude-sonnet-4-5", "{}", say("name"));
        assert_eq!(
            attr(s, "gen_ai.operation.name"),
            "chat",
            "{}",
            say("operation")
        );
        assert_eq!(
            attr(s, "gen_ai.provider.name"),
            "anthropic",
            "{}",
            say("provider")
        );
        assert_eq!(
            attr(s, "gen_ai.request.model"),
            "claude-sonnet-4-5",
            "{}",
            say("model")
        );
        assert_eq!(
            attr(s, "gen_ai.request.max_tokens"),
            1024,
            "{}",
            say("max_tokens")
        );
        assert_eq!(
            attr(s, "gen_ai.request.temperature"),
            0.2,
            "{}",
            say("temperature")
        );
        assert_eq!(
            attr(s, "gen_ai.conversation.id"),
            a.id.as_str(),
            "{}",
            say("conversation")
        );
        assert_eq!(attr(s, "promptd.agent"), "coder", "{}", say("agent"));
        assert_eq!(
            attr(s, "promptd.session"),
            a.id.as_str(),
            "{}",
            say("session")
        );
        assert!(
            attr(s, "gen_ai.usage.input_tokens").as_i64().is_some(),
            "{}",
            say("input tokens")
        );
        assert!(
            attr(s, "gen_ai.usage.output_tokens").as_i64().is_some(),
            "{}",
            say("output tokens")
        );
        assert!(
            attr(s, "gen_ai.usage.cache_read_input_tokens")
                .as_i64()
                .is_some(),
            "{}",
            say("cache read")
        );
        assert!(
            attr(s, "gen_ai.usage.cache_creation_input_tokens")
                .as_i64()
                .is_some(),
            "{}",
            say("cache write")
        );
        assert!(
            attr(s, "promptd.header.reason").is_string(),
            "{}",
            say("header reason")
        );
        assert!(
            attr(s, "promptd.tokens.total").as_i64().unwrap_or(0) > 0,
            "{}",
            say("tokens")
        );
        assert!(
            attr(s, "promptd.tokens.section.identity")
                .as_i64()
                .unwrap_or(0)
                > 0,
            "{}",
            say("section tokens")
        );
        assert!(
            attr(s, "promptd.tokens.tools").as_i64().unwrap_or(0) > 0,
            "{}",
            say("tool tokens")
        );
        // A tool group: the tools one plugin gives (`tools` gives four, `versioned` one).
        let group = |plugin: &str| {
            attr(s, &format!("promptd.tokens.tool_group.{plugin}"))
                .as_i64()
                .unwrap_or(0)
        };
        assert!(
            group("tools") > group("versioned") && group("versioned") > 0,
            "{}",
            say("tool group tokens")
        );
        assert!(
            attr(s, "promptd.tokens.context.documents:retrieved")
                .as_i64()
                .unwrap_or(0)
                > 0,
            "{}",
            say("context tokens")
        );
        assert!(
            attr(s, "promptd.cache.outcome").is_string(),
            "{}",
            say("cache outcome")
        );
        assert!(
            attr(s, "promptd.cost.usd").as_f64().unwrap_or(0.0) > 0.0,
            "{}",
            say("cost")
        );
        assert_eq!(attr(s, "promptd.held.count"), 0, "{}", say("held"));
        // W4: what each step's contributions kept from an earlier step, named one by one.
        let reused = attr(s, "promptd.plugins.reused.count").as_i64();
        let named = attr(s, "promptd.plugins.reused")
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(reused, Some(named as i64), "{}", say("reused"));
        if *n == 1 {
            assert_eq!(
                reused,
                Some(0),
                "{}",
                say("nothing to reuse on a first step")
            );
        }
        assert!(
            attr(s, "promptd.system.sha256")
                .as_str()
                .is_some_and(|h| h.len() == 64),
            "{}",
            say("system hash")
        );
        let url = attr(s, "promptd.request.url")
            .as_str()
            .expect("rebuild url");
        assert_eq!(
            url,
            format!(
                "{}/v1/sessions/{}/steps/{n}/request?format=anthropic",
                d.url, a.id
            )
        );
        // The link is the rebuild route: it serves the step.
        assert_eq!(call(url, "GET", None, &[]).0, 200, "{url}");
    }
    assert_eq!(attr(&steps[&1], "promptd.header.reason"), "initial");
    assert_eq!(attr(&steps[&1], "promptd.cache.outcome"), "cold");
    assert_eq!(attr(&steps[&2], "promptd.prefix.kept"), true);
    assert_eq!(attr(&steps[&2], "promptd.cache.outcome"), "hit");
    // The swap's step: the prefix broke, and the cause names the plugin.
    let swap = &steps[&3];
    assert_eq!(attr(swap, "promptd.header.reason"), "change", "{swap}");
    assert_eq!(attr(swap, "promptd.prefix.kept"), false, "{swap}");
    let cause = attr(swap, "promptd.prefix.cause")
        .as_str()
        .expect("a prefix cause");
    assert!(cause.contains("versioned"), "{cause}");
    assert!(
        attr(swap, "promptd.prefix.shared_bytes")
            .as_i64()
            .unwrap_or(0)
            > 0,
        "{swap}"
    );
    assert_eq!(
        attr(swap, "promptd.cache.outcome"),
        "prefix_changed",
        "{swap}"
    );
    assert_eq!(attr(swap, "promptd.cache.plugin"), "versioned", "{swap}");
    // The idle gap's step.
    assert_eq!(
        attr(&steps[&4], "promptd.cache.outcome"),
        "ttl_expired",
        "{}",
        steps[&4]
    );
    assert_eq!(attr(&steps[&4], "promptd.cache.gap_ms"), 600_000);

    // Under each step: the assembly span, with one event per plugin call (id, sha256,
    // duration) — none on a step where nothing any plugin reads changed (W4): its marker
    // names what kept its answer instead; the budget and the store append as the step's
    // events; the record of its reply (with its own append).
    let log = call(
        &format!("{}/v1/sessions/{}/events", d.url, a.id),
        "GET",
        None,
        &[],
    );
    let log: Value = serde_json::from_str(&log.1).expect("the session's events");
    let reused = |n: i64| -> usize {
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "step" && e["body"]["step"] == n)
            .and_then(|e| e["body"]["reused"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    for (n, s) in &steps {
        let id = &s["context"]["span_id"];
        let children: Vec<&Value> = spans.iter().filter(|c| &c["parent_id"] == id).collect();
        let names: Vec<&str> = children.iter().filter_map(|c| c["name"].as_str()).collect();
        for want in ["promptd.assemble", "promptd.record assistant"] {
            assert!(names.contains(&want), "step {n}: no {want} among {names:?}");
        }
        let events =
            |span: &Value| -> Vec<Value> { span["events"].as_array().cloned().unwrap_or_default() };
        let step_events: Vec<String> = events(s)
            .iter()
            .filter_map(|e| e["name"].as_str().map(str::to_string))
            .collect();
        for want in ["promptd.budget", "promptd.store.append"] {
            assert!(
                step_events.iter().any(|e| e == want),
                "step {n}: no {want} event in {step_events:?}"
            );
        }
        let append = events(s)
            .into_iter()
            .find(|e| e["name"] == "promptd.store.append")
            .unwrap();
        assert_eq!(append["attributes"]["db.system.name"], "sqlite", "{append}");
        assert!(
            append["attributes"]["promptd.duration_ms"]
                .as_f64()
                .is_some(),
            "{append}"
        );
        let assembly = children
            .iter()
            .find(|c| c["name"] == "promptd.assemble")
            .expect("assembly");
        let calls = events(assembly);
        assert!(
            !calls.is_empty() || reused(*n) > 0,
            "step {n}: no plugin call events in {assembly}, and nothing reused"
        );
        if *n == 1 {
            assert!(!calls.is_empty(), "the first step asks every plugin");
        }
        for c in &calls {
            let plugin = c["attributes"]["promptd.plugin.id"]
                .as_str()
                .expect("plugin id");
            assert_eq!(c["name"], format!("promptd.plugin {plugin}"));
            assert_eq!(
                c["attributes"]["promptd.plugin.sha256"],
                plugins[plugin].as_str(),
                "{c}"
            );
            assert!(
                c["attributes"]["promptd.duration_ms"].as_f64().is_some(),
                "{c}"
            );
        }
    }

    // No message text, no system text, and never a data plugin's, with capture off.
    let all = serde_json::to_string(&spans).unwrap();
    assert!(
        !all.contains(SECRET),
        "message text was exported without capture_content"
    );
    assert!(
        !all.contains(DATA_TEXT),
        "a data plugin's text was exported"
    );
    assert!(!all.contains("gen_ai.input.messages") && !all.contains("gen_ai.system_instructions"));

    // /metrics counts what went out.
    assert!(metric(&d, "promptd_telemetry_spans_exported_total") >= spans.len() as f64);
    assert_eq!(
        metric(
            &d,
            "promptd_telemetry_spans_dropped_total{reason=\"queue_full\"}"
        ),
        0.0
    );

    screenshot(
        &phoenix,
        swap["context"]["span_id"].as_str().expect("span id"),
    );

    // The backend stops: steps go on, answered as fast, and the spans they make are dropped
    // and counted.
    phoenix.stop();
    let c = session(&d, "coder", None);
    let started = Instant::now();
    for i in 0..20 {
        c.step(
            &json!([{"role": "user", "content": format!("step {i}")}]),
            SENT + i,
            &facts(),
        );
        c.reply(
            &json!([{"type": "text", "text": "ok"}]),
            &json!({"input_tokens": 10, "output_tokens": 1}),
            SENT + i,
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "steps slowed: {:?}",
        started.elapsed()
    );
    eventually("the undelivered spans to be counted", || {
        metric(
            &d,
            "promptd_telemetry_spans_dropped_total{reason=\"export_failed\"}",
        ) > 0.0
    });
    assert!(metric(&d, "promptd_telemetry_exports_failed_total") > 0.0);
    assert_eq!(metric(&d, "promptd_steps_total{outcome=\"error\"}"), 0.0);
}

#[test]
fn e4_captured_content_is_exported_but_never_a_data_plugins_and_grpc_and_call_spans_deliver_too() {
    let phoenix = Phoenix::start();
    let folder = folder();
    let grpc = "protocol = \"grpc\"\ncapture_content = true\ncall_spans = true\n";
    // Over gRPC, to Phoenix's gRPC receiver, with content captured.
    let cfg = config(&phoenix, "promptd-content", grpc).replace(
        &format!("endpoint = \"http://127.0.0.1:{}\"", phoenix.http),
        &format!("endpoint = \"http://127.0.0.1:{}\"", phoenix.grpc),
    );
    let (d, _state) = folder.serve(&cfg);
    let c = session(&d, "coder", None);
    c.step(
        &json!([{"role": "user", "content": format!("Read it. {SECRET}")}]),
        SENT,
        &facts(),
    );
    c.reply(
        &json!([{"type": "text", "text": format!("Done {SECRET}-OUT")}]),
        &json!({"input_tokens": 40, "output_tokens": 3}),
        SENT,
    );
    let spans = wait_for(&phoenix, &d, "promptd-content", "the captured step", |s| {
        chat_steps(s, &c.id)
            .get(&1)
            .is_some_and(|s| attr(s, "promptd.reply.recorded") == true)
    });
    let step = &chat_steps(&spans, &c.id)[&1];
    // With `call_spans`, each plugin call is a span under the assembly, the append one under
    // the step.
    let under = |parent: &Value| -> Vec<Value> {
        spans
            .iter()
            .filter(|s| s["parent_id"] == parent["context"]["span_id"])
            .cloned()
            .collect()
    };
    let children = under(step);
    let named = |all: &[Value], name: &str| all.iter().find(|s| s["name"] == name).cloned();
    assert!(
        named(&children, "promptd.store.append").is_some(),
        "{children:?}"
    );
    assert!(named(&children, "promptd.budget").is_some(), "{children:?}");
    let assembly = named(&children, "promptd.assemble").expect("the assembly");
    let calls = under(&assembly);
    assert!(
        calls.iter().any(|c| c["name"] == "promptd.plugin documents"
            && attr(c, "promptd.plugin.sha256")
                .as_str()
                .is_some_and(|h| h.len() == 64)),
        "{calls:?}"
    );
    let input = attr(step, "gen_ai.input.messages")
        .as_str()
        .expect("input messages");
    let input: Value = serde_json::from_str(input).expect("input messages JSON");
    assert_eq!(input[0]["role"], "user");
    assert_eq!(
        input[0]["parts"][0]["content"],
        format!("Read it. {SECRET}")
    );
    let output = attr(step, "gen_ai.output.messages")
        .as_str()
        .expect("output messages");
    assert!(output.contains(&format!("Done {SECRET}-OUT")), "{output}");
    let system = attr(step, "gen_ai.system_instructions")
        .as_str()
        .expect("system instructions");
    assert!(system.contains("Ada"), "{system}");
    // The request holds the data plugin's text (in its runtime context); no span does.
    let request = d.ok(
        "GET",
        &format!("/v1/sessions/{}/steps/1/request?format=anthropic", c.id),
        None,
    );
    assert!(request.to_string().contains(DATA_TEXT));
    let all = serde_json::to_string(&spans).unwrap();
    assert!(
        !all.contains(DATA_TEXT),
        "a data plugin's text was exported with capture on"
    );
}

#[test]
fn e1_bad_telemetry_settings_stop_the_start_naming_them() {
    let folder = Folder::new().bundled("persona");
    for (extra, env, needle) in [
        ("endpoint = \"https://collector.example:4318\"", None, "TLS"),
        ("sample_ratio = 2.0", None, "sample_ratio"),
        (
            "",
            Some(("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")),
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    ] {
        let config = folder.config(&format!("[telemetry]\nenabled = true\n{extra}\n"));
        let (_tmp, state) = common::daemon::state_dir();
        let mut cmd = common::promptd_command();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--plugins")
            .arg(folder.path())
            .arg("--state")
            .arg(&state);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let (code, _out, err) = run_bounded(cmd, Duration::from_secs(60));
        assert_ne!(code, Some(0), "{extra}: started");
        assert!(err.contains(needle), "{extra}: {err}");
    }
}

/// Phoenix's page of the session's trace, with the swap's step selected, in headless Chromium (through the inspector test's
/// selenium venv), saved as an artifact (and in docs/ with `PROMPTD_SCREENSHOT=1`).
fn screenshot(phoenix: &Phoenix, span: &str) {
    let python = repo_root().join("tests/inspector/.venv/bin/python");
    assert!(
        python.exists(),
        "run `bash tests/inspector/install.sh` (chromium and selenium)"
    );
    let out = repo_root().join("target/test-artifacts/telemetry-phoenix.png");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let spec = json!({"url": phoenix.url(), "span": span, "name": "chat claude-sonnet-4-5",
        "screenshot": out});
    let mut cmd = Command::new(python);
    cmd.arg(dir().join("screenshot.py")).arg(spec.to_string());
    let (code, stdout, stderr) = run_bounded(cmd, Duration::from_secs(180));
    assert_eq!(code, Some(0), "screenshot.py failed:\n{stdout}\n{stderr}");
    let png = std::fs::read(&out).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    if std::env::var_os("PROMPTD_SCREENSHOT").is_some() {
        std::fs::copy(&out, repo_root().join("docs/telemetry-phoenix.png")).unwrap();
    }
}
