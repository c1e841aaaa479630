//! The daemon on native providers and an in-memory store: sessions, restarts and the HTTP
//! edge without wasmtime or SQLite. A plugin "file" holds the name of the native plugin the
//! test engine builds for it, so reloads and swaps are file changes as in production.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use promptd_core::config::Config;
use promptd_core::conversation::{Message, ToolCall};
use promptd_core::formats::{self, Format};
use promptd_core::load::{Engine, Instantiated, LoadRequest};
use promptd_core::plugin::provider::NativePlugin;
use promptd_core::plugin::state::{ChangeKind, PluginState};
use promptd_core::store::{MemoryStore, SessionStore};
use promptd_core::Error;
use promptd_daemon::events::HISTORY;
use promptd_daemon::{Daemon, RecordRequest, StepInput, StepRequest};
use serde_json::{json, Value};

/// Builds the native plugin a file names.
struct NativeEngine;

impl Engine for NativeEngine {
    fn instantiate(&self, r: LoadRequest<'_>) -> promptd_core::Result<Instantiated> {
        let plugin = match std::str::from_utf8(r.bytes).unwrap_or("").trim() {
            "persona-v1" => NativePlugin::new().section("persona", 0, "You are v1."),
            "persona-v2" => NativePlugin::new().section("persona", 0, "You are v2."),
            // Its context declares what it reads (world 0.3.0): kept while `cwd` is unchanged.
            "reading" => NativePlugin::new()
                .section("persona", 0, "You read.")
                .dynamic_context("cwd", 10, |step| {
                    Ok(format!(
                        "cwd {}",
                        step.facts.get("cwd").cloned().unwrap_or_default()
                    ))
                })
                .reads(promptd_core::plugin::model::Reads {
                    facts: ["cwd".to_string()].into(),
                    ..Default::default()
                }),
            // A dynamic context that declares nothing it reads (worlds 0.1.0, 0.2.0).
            "clock" => NativePlugin::new()
                .dynamic_context("clock", 20, |step| Ok(format!("step {}", step.step_number))),
            "tools" => NativePlugin::new()
                .tool("read", "Reads a file.", r#"{"type":"object"}"#)
                .dynamic_context("cwd", 10, |step| {
                    Ok(step
                        .facts
                        .get("cwd")
                        .map(|c| format!("cwd {c}"))
                        .unwrap_or_default())
                }),
            other => {
                return Err(Error::NotAComponent {
                    plugin: r.id.to_string(),
                    cause: format!("no native plugin `{other}`"),
                    source: None,
                })
            }
        };
        let (declaration, provider) = plugin.build();
        Ok(Instantiated {
            declaration,
            provider,
            cache: None,
        })
    }
}

/// The OpenAI and Anthropic formats need model settings (`missing_model_setting` otherwise).
const MODEL: &str = "[model]\nmodel = \"test-model\"\nmax_tokens = 256\n";

/// The daemon's step and record boundaries, as the step number and body (and the seq) these
/// tests compare.
trait Boundaries {
    fn step_body(
        &self,
        id: &str,
        input: &StepInput,
        format: Format,
    ) -> promptd_daemon::Result<(u64, String)>;
    fn record_message(&self, id: &str, message: &Message) -> promptd_daemon::Result<u64>;
}

impl Boundaries for Daemon {
    fn step_body(
        &self,
        id: &str,
        input: &StepInput,
        format: Format,
    ) -> promptd_daemon::Result<(u64, String)> {
        let step = self.step(StepRequest::new(id, input.clone(), format))?;
        Ok((step.step, step.body.into_string()))
    }

    fn record_message(&self, id: &str, message: &Message) -> promptd_daemon::Result<u64> {
        Ok(self
            .record(RecordRequest::message(id, message.clone()))?
            .seq)
    }
}

fn put(dir: &Path, name: &str, body: &str) {
    std::fs::write(dir.join(format!("{name}.wasm")), body).unwrap();
}

fn daemon(store: Arc<dyn SessionStore>, dir: &Path) -> Daemon {
    Daemon::new(
        store,
        Arc::new(NativeEngine),
        Config::parse(MODEL, "test").unwrap(),
        dir,
    )
    .unwrap()
}

/// A daemon whose session cache holds nothing: every step rebuilds its session from the log.
fn uncached(store: Arc<dyn SessionStore>, dir: &Path) -> Daemon {
    let config =
        Config::parse(&format!("[limits]\nsession_cache_mb = 0\n{MODEL}"), "test").unwrap();
    Daemon::new(store, Arc::new(NativeEngine), config, dir).unwrap()
}

fn calling(id: &str) -> Message {
    Message::Assistant {
        content: "Let me look.".into(),
        tool_calls: vec![ToolCall {
            id: id.into(),
            name: "read".into(),
            arguments: json!({"path": "a.txt"}),
            arguments_text: None,
        }],
        blocks: Vec::new(),
        native: None,
    }
}

fn answering(id: &str) -> Message {
    Message::Tool {
        tool_call_id: id.into(),
        content: format!("contents for {id}").into(),
        is_error: false,
    }
}

/// Drives a session through user turns, tool calls and context changes in `format`; returns
/// every step's body.
fn conversation(d: &Daemon, format: Format) -> Vec<String> {
    let id = d.create_session("coder").unwrap();
    let mut bodies = Vec::new();
    for i in 0..6 {
        let cwd = format!("/w{}", i / 2);
        let messages = if i % 2 == 0 {
            vec![Message::user(format!("turn {i}"))]
        } else {
            vec![answering(&format!("c{i}"))]
        };
        if i % 2 == 1 {
            d.record_message(&id, &calling(&format!("c{i}"))).unwrap();
        }
        let (n, body) = d
            .step_body(&id, &input(messages, &[("cwd", &cwd)]), format)
            .unwrap();
        let rebuilt = formats::render(&d.request(&id, n).unwrap(), format).to_string();
        assert_eq!(body, rebuilt, "{format:?} step {n}");
        bodies.push(body);
    }
    bodies
}

#[test]
fn q4_q10_bodies_spliced_from_the_session_cache_are_the_rebuilt_bytes_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    put(dir.path(), "tools", "tools");
    for format in Format::ALL {
        let cached = conversation(&daemon(Arc::new(MemoryStore::new()), dir.path()), format);
        let cold = conversation(&uncached(Arc::new(MemoryStore::new()), dir.path()), format);
        assert_eq!(
            cached, cold,
            "{format:?}: cached and rebuilt-every-step differ"
        );
    }
}

#[test]
fn q10_an_evicted_session_is_rebuilt_from_the_log_identically() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "tools", "tools");
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    // A budget of 1 MiB and sessions of a few KiB: pushing 400 others out evicts the first.
    let config =
        Config::parse(&format!("[limits]\nsession_cache_mb = 1\n{MODEL}"), "test").unwrap();
    let d = Daemon::new(store, Arc::new(NativeEngine), config, dir.path()).unwrap();
    let first = d.create_session("coder").unwrap();
    let big = "x".repeat(4096);
    let (_, before) = d
        .step_body(
            &first,
            &input(vec![Message::user(&big)], &[("cwd", "/a")]),
            Format::Anthropic,
        )
        .unwrap();
    for _ in 0..400 {
        let other = d.create_session("coder").unwrap();
        d.step_body(
            &other,
            &input(vec![Message::user(&big)], &[]),
            Format::Neutral,
        )
        .unwrap();
    }
    let (sessions, bytes) = d.session_cache_usage();
    assert!(bytes <= 1 << 20, "{sessions} sessions, {bytes} bytes");
    assert!(sessions < 400, "{sessions} sessions kept");
    let (n, after) = d
        .step_body(
            &first,
            &input(vec![Message::user("again")], &[("cwd", "/a")]),
            Format::Anthropic,
        )
        .unwrap();
    assert_eq!(n, 2);
    let rebuilt =
        |n| formats::render(&d.request(&first, n).unwrap(), Format::Anthropic).to_string();
    assert_eq!(before, rebuilt(1));
    assert_eq!(after, rebuilt(2));
}

#[test]
fn q10_a_second_writer_is_detected_and_the_stale_state_dropped() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let (one, two) = (
        daemon(store.clone(), dir.path()),
        daemon(store.clone(), dir.path()),
    );
    let id = one.create_session("default").unwrap();
    step(&one, &id, &input(vec![Message::user("a")], &[]));
    step(&two, &id, &input(vec![Message::user("b")], &[]));
    // `one` still holds the state from before `two` wrote.
    let err = one
        .step_body(&id, &input(vec![Message::user("c")], &[]), Format::Neutral)
        .unwrap_err();
    assert_eq!(err.code(), "store_conflict", "{err}");
    // The stale state is gone: the next step rebuilds from the log and continues it.
    let (n, body) = step(&one, &id, &input(vec![Message::user("c")], &[]));
    assert_eq!(n, 3);
    let users: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["a", "b", "c"]);
    let seqs: Vec<u64> = store.events(&id).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
}

fn input(messages: Vec<Message>, facts: &[(&str, &str)]) -> StepInput {
    StepInput {
        messages,
        facts: facts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        sent_at: None,
        client_tools: None,
    }
}

/// One step in every format; asserts each body is what a rebuild of the step from the log
/// renders, and returns the step number and the neutral body.
fn step(d: &Daemon, id: &str, input: &StepInput) -> (u64, Value) {
    let (n, neutral) = d.step_body(id, input, Format::Neutral).unwrap();
    let rebuilt = d.request(id, n).unwrap();
    assert_eq!(
        neutral,
        formats::render(&rebuilt, Format::Neutral).to_string()
    );
    (n, serde_json::from_str(&neutral).unwrap())
}

fn system(d: &Daemon, id: &str) -> String {
    let (_, v) = step(d, id, &StepInput::default());
    v["system"].as_str().unwrap().to_string()
}

fn kinds(d: &Daemon, id: &str) -> Vec<String> {
    d.session_events(id)
        .unwrap()
        .iter()
        .map(|e| match e.body_value().unwrap().get("reason") {
            Some(reason) => format!("{}:{}", e.kind, reason.as_str().unwrap()),
            None => e.kind.to_string(),
        })
        .collect()
}

#[test]
fn q1_to_q5_a_session_through_a_tool_call_rebuilds_identically() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    put(dir.path(), "tools", "tools");
    let d = daemon(Arc::new(MemoryStore::new()), dir.path());
    let id = d.create_session("coder").unwrap();
    let (n1, r1) = step(&d, &id, &input(vec![Message::user("hi")], &[("cwd", "/a")]));
    assert_eq!((n1, r1["system"].as_str().unwrap()), (1, "You are v1."));
    d.record_message(
        &id,
        &Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "read".into(),
                arguments: json!({}),
                arguments_text: None,
            }],
            blocks: Vec::new(),
            native: None,
        },
    )
    .unwrap();
    let result = Message::Tool {
        tool_call_id: "c1".into(),
        content: "text".into(),
        is_error: false,
    };
    let (n2, r2) = step(&d, &id, &input(vec![result], &[("cwd", "/a")]));
    assert_eq!(n2, 2);
    assert_eq!(r2["messages"].as_array().unwrap().len(), 4, "{r2}");
    assert_eq!(d.request(&id, 1).unwrap().messages.len(), 2);
    assert_eq!(
        kinds(&d, &id),
        [
            "session/created",
            "user/message",
            "context/snapshot",
            "request/header:initial",
            "step",
            "assistant/message",
            "tool/result",
            "step"
        ]
    );
    let err = d.request(&id, 3).unwrap_err();
    assert_eq!(err.code(), "unknown_step");
}

fn headers(d: &Daemon, id: &str) -> Vec<String> {
    kinds(d, id)
        .into_iter()
        .filter(|k| k.starts_with("request/header"))
        .collect()
}

#[test]
fn q3_a_new_daemon_over_the_same_store_records_resume_only_when_the_header_changed() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let first = daemon(store.clone(), dir.path());
    let id = first.create_session("default").unwrap();
    step(&first, &id, &StepInput::default());
    step(&first, &id, &StepInput::default());
    drop(first);
    // A restart with the same plugins: the header is the same, nothing to record.
    let second = daemon(store.clone(), dir.path());
    step(&second, &id, &StepInput::default());
    assert_eq!(headers(&second, &id), ["request/header:initial"]);
    drop(second);
    // A restart with another persona: the header changed since another run wrote it.
    put(dir.path(), "persona", "persona-v2");
    let third = daemon(store, dir.path());
    step(&third, &id, &StepInput::default());
    step(&third, &id, &StepInput::default());
    assert_eq!(
        headers(&third, &id),
        ["request/header:initial", "request/header:resume"]
    );
}

/// The memory store as another kind of store: `Shared` as one other daemons append to (Q17),
/// `Deferring` as one that writes appends on a thread of its own and answers later, as
/// SQLite's writer does (`SessionStore::defers`).
struct Like(Arc<MemoryStore>, Kind, AtomicUsize);

impl Like {
    fn new(kind: Kind) -> Self {
        Like(Arc::new(MemoryStore::default()), kind, AtomicUsize::new(0))
    }

    /// How many times the log was read (`events`, `events_after`, `session_agent`).
    fn reads(&self) -> usize {
        self.2.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Shared,
    Deferring,
}

impl SessionStore for Like {
    fn create_session(
        &self,
        agent: &str,
        first: promptd_core::store::NewEvent,
    ) -> Result<String, promptd_core::store::StoreError> {
        self.0.create_session(agent, first)
    }
    fn session_agent(&self, id: &str) -> Result<Option<String>, promptd_core::store::StoreError> {
        self.2.fetch_add(1, Ordering::SeqCst);
        self.0.session_agent(id)
    }
    fn events(
        &self,
        id: &str,
    ) -> Result<Vec<promptd_core::store::Event>, promptd_core::store::StoreError> {
        self.2.fetch_add(1, Ordering::SeqCst);
        self.0.events(id)
    }
    fn events_after(
        &self,
        id: &str,
        seq: u64,
    ) -> Result<Vec<promptd_core::store::Event>, promptd_core::store::StoreError> {
        self.2.fetch_add(1, Ordering::SeqCst);
        self.0.events_after(id, seq)
    }
    fn append(
        &self,
        id: &str,
        next_seq: u64,
        events: Vec<promptd_core::store::NewEvent>,
    ) -> Result<(), promptd_core::store::StoreError> {
        self.0.append(id, next_seq, events)
    }
    fn append_then(
        &self,
        id: &str,
        next_seq: u64,
        events: Vec<promptd_core::store::NewEvent>,
        then: promptd_core::store::AppendDone,
    ) {
        match self.1 {
            Kind::Deferring => {
                let (store, id) = (self.0.clone(), id.to_string());
                std::thread::spawn(move || then(store.append(&id, next_seq, events)));
            }
            Kind::Shared => then(self.0.append(id, next_seq, events)),
        }
    }
    fn defers(&self) -> bool {
        self.1 == Kind::Deferring
    }
    fn sessions(
        &self,
        filter: &str,
        limit: usize,
    ) -> Result<Vec<promptd_core::store::SessionSummary>, promptd_core::store::StoreError> {
        self.0.sessions(filter, limit)
    }
    fn is_shared(&self) -> bool {
        self.1 == Kind::Shared
    }
}

#[test]
fn q17_daemons_on_a_shared_store_alternate_without_conflicts_and_record_their_plugin_sets() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    put(a_dir.path(), "persona", "persona-v1");
    // The same plugin from another file: the same header, another plugin set (sha256).
    put(b_dir.path(), "persona", "persona-v1\n");
    let store: Arc<dyn SessionStore> = Arc::new(Like::new(Kind::Shared));
    let (a, b) = (
        daemon(store.clone(), a_dir.path()),
        daemon(store, b_dir.path()),
    );
    let id = a.create_session("default").unwrap();
    for n in 1..=6u64 {
        let d = if n % 2 == 1 { &a } else { &b };
        let said = input(vec![Message::user(format!("step {n}"))], &[]);
        assert_eq!(
            step(d, &id, &said).0,
            n,
            "each daemon sees the other's steps"
        );
    }
    assert_eq!(headers(&a, &id), ["request/header:initial"]);
    // Every step rebuilds the same from either daemon, and says which plugin set served it.
    let served = |n: u64| {
        let explained = b.explain(&id, n, Format::Neutral).unwrap();
        explained.provenance.unwrap().plugins["persona"].clone()
    };
    for n in 1..=6 {
        assert_eq!(
            formats::render(&a.request(&id, n).unwrap(), Format::Openai),
            formats::render(&b.request(&id, n).unwrap(), Format::Openai)
        );
    }
    assert_ne!(served(1), served(2), "the two folders' files differ");
    assert_eq!(
        [served(3), served(5)],
        [served(1), served(1)],
        "a's steps name a's set"
    );
    assert_eq!(
        [served(4), served(6)],
        [served(2), served(2)],
        "b's steps name b's set"
    );
}

#[test]
fn q17_a_store_that_is_not_shared_is_not_checked_before_a_step() {
    // Why `is_shared` matters: over a store that does not say so, a daemon trusts its cache,
    // and a step after another daemon's is refused rather than planned on a stale state.
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let (a, b) = (daemon(store.clone(), dir.path()), daemon(store, dir.path()));
    let id = a.create_session("default").unwrap();
    step(&a, &id, &StepInput::default());
    step(&b, &id, &StepInput::default());
    let err = a
        .step_body(&id, &StepInput::default(), Format::Neutral)
        .unwrap_err();
    assert_eq!(err.code(), "store_conflict", "{err}");
    // The stale state was dropped: the next step rebuilds it and goes through.
    assert_eq!(step(&a, &id, &StepInput::default()).0, 3);
}

#[test]
fn h3_r4_a_swap_serves_the_new_version_and_a_broken_one_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    let d = daemon(Arc::new(MemoryStore::new()), dir.path());
    let id = d.create_session("default").unwrap();
    put(dir.path(), "persona", "persona-v2");
    let applied = d.reload().unwrap();
    assert_eq!(applied[0].kind, ChangeKind::Reload);
    assert_eq!(system(&d, &id), "You are v2.");
    put(dir.path(), "persona", "garbage");
    let applied = d.reload().unwrap();
    assert_eq!(applied[0].kind, ChangeKind::Refused);
    assert_eq!(d.plugins()[0].state, PluginState::Stale);
    assert_eq!(
        d.plugins()[0].last_error.as_ref().unwrap().code,
        "not_a_component"
    );
    assert_eq!(system(&d, &id), "You are v2.");
    d.unload("persona").unwrap();
    assert_eq!(system(&d, &id), "");
}

/// Serves `daemon` over real HTTP on a free loopback port, on a runtime of its own.
fn serve(daemon: Daemon) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let app = promptd_daemon::http::router(Arc::new(daemon), None);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum_serve(listener, app).await;
        });
    });
    addr.to_string()
}

async fn axum_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    axum::serve(listener, app).await.unwrap();
}

/// One HTTP/1.1 request; returns the status and everything the server sent after the
/// headers until it closed the connection or `until` appeared.
fn http(addr: &str, method: &str, path: &str, until: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 2 {
        line.clear();
    }
    let mut body = String::new();
    match until {
        None => {
            reader.read_to_string(&mut body).unwrap();
        }
        Some(marker) => {
            while !body.contains(marker) {
                let mut chunk = String::new();
                if reader.read_line(&mut chunk).unwrap() == 0 {
                    break;
                }
                body.push_str(&chunk);
            }
        }
    }
    (status, body)
}

#[test]
fn l5_every_error_response_is_the_json_error_405_and_404_included() {
    let dir = tempfile::tempdir().unwrap();
    let addr = serve(daemon(Arc::new(MemoryStore::new()), dir.path()));
    for (method, path, status, code) in [
        ("DELETE", "/v1/sessions", 405, "method_not_allowed"),
        ("POST", "/v1/health", 405, "method_not_allowed"),
        ("PUT", "/v1/plugins", 405, "method_not_allowed"),
        ("GET", "/v9/nothing", 404, "not_found"),
        ("POST", "/v1/sessions/nope/steps", 400, "bad_request"),
    ] {
        let (got, body) = http(&addr, method, path, None);
        assert_eq!(got, status, "{method} {path}: {body}");
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body}"));
        assert_eq!(v["error"]["code"], code, "{method} {path}: {body}");
        let message = v["error"]["message"].as_str().unwrap();
        if status != 400 {
            assert!(message.contains(path), "{method} {path}: {message}");
        } else {
            assert!(message.contains("invalid JSON body"), "{message}");
        }
    }
}

#[test]
fn r5_a_client_resuming_from_before_the_kept_history_is_told_it_lagged() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(Arc::new(MemoryStore::new()), dir.path());
    for i in 0..HISTORY + 5 {
        d.plugins
            .events
            .push(ChangeKind::Load, &format!("p{i}"), "f.wasm", "00", None);
    }
    let addr = serve(d);
    let (status, body) = http(&addr, "GET", "/v1/events?since=0", Some("\n\n"));
    assert_eq!(status, 200);
    assert!(body.contains("event: lagged"), "{body}");
    assert!(body.contains(r#"{"missed":5}"#), "{body}");
    // From inside the kept history the replay is whole, with no lagged event.
    let since = 5 + HISTORY as u64 - 2;
    let (_, body) = http(
        &addr,
        "GET",
        &format!("/v1/events?since={since}"),
        Some(&format!("id: {}", HISTORY + 5)),
    );
    assert!(!body.contains("lagged"), "{body}");
    assert!(body.contains(&format!("id: {}", HISTORY + 4)), "{body}");
}

/// Runs `Daemon::step_inline` to its end on a runtime of this thread: the step's number and
/// body, or `None` when the step was given back for the blocking pool.
fn inline(d: &Daemon, id: &str, input: &StepInput) -> Option<(u64, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let request = StepRequest::new(id, input.clone(), Format::Neutral);
    match runtime.block_on(d.step_inline(request)) {
        Ok(outcome) => {
            let outcome = outcome.unwrap();
            Some((outcome.step, outcome.body.into_string()))
        }
        Err(back) => {
            // Given back as it came.
            assert_eq!(&*back.session, id);
            assert_eq!(back.input.messages, input.messages);
            assert_eq!(back.input.facts, input.facts);
            None
        }
    }
}

#[test]
fn q22_a_short_step_runs_inline_with_the_bytes_and_log_of_one_on_the_blocking_pool() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "reading", "reading");
    let d = daemon(Arc::new(Like::new(Kind::Deferring)), dir.path());
    let (inline_id, pooled_id) = (
        d.create_session("coder").unwrap(),
        d.create_session("coder").unwrap(),
    );
    let mut inline_bodies = Vec::new();
    let mut pooled_bodies = Vec::new();
    let mut ran_inline = Vec::new();
    for (i, cwd) in ["/a", "/a", "/a", "/b", "/b"].iter().enumerate() {
        let input = input(vec![Message::user(format!("turn {i}"))], &[("cwd", cwd)]);
        let body = match inline(&d, &inline_id, &input) {
            Some(body) => {
                ran_inline.push(true);
                body
            }
            None => {
                ran_inline.push(false);
                d.step_body(&inline_id, &input, Format::Neutral).unwrap()
            }
        };
        let rebuilt = formats::render(&d.request(&inline_id, body.0).unwrap(), Format::Neutral);
        assert_eq!(body.1, rebuilt.to_string(), "step {} rebuilt", body.0);
        inline_bodies.push(body);
        pooled_bodies.push(d.step_body(&pooled_id, &input, Format::Neutral).unwrap());
    }
    // The first step has no kept answer, and `cwd` changed at the fourth: those call the
    // plugin, so they are given back; the others keep its answer and run inline.
    assert_eq!(ran_inline, [false, true, true, false, true]);
    // The same bytes and the same log whichever way a step ran (the sessions differ only by
    // their ids and data secrets, which no body here shows).
    assert_eq!(inline_bodies, pooled_bodies);
    let kinds = |id: &str| -> Vec<String> {
        d.session_events(id)
            .unwrap()
            .iter()
            .map(|e| e.kind.to_string())
            .collect()
    };
    assert_eq!(kinds(&inline_id), kinds(&pooled_id));

    // A loaded plugin with an item asked at every step (no `reads`): every step goes to the
    // blocking pool, the second and later ones too.
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "reading", "reading");
    put(dir.path(), "clock", "clock");
    let d = daemon(Arc::new(Like::new(Kind::Deferring)), dir.path());
    let id = d.create_session("coder").unwrap();
    for i in 0..3 {
        let input = input(vec![Message::user(format!("turn {i}"))], &[("cwd", "/a")]);
        assert_eq!(inline(&d, &id, &input), None, "step {}", i + 1);
        let (_, body) = d.step_body(&id, &input, Format::Neutral).unwrap();
        assert!(body.contains(&format!("step {}", i + 1)), "{body}");
    }
}

/// Q10: a session is cached from its creation, so its first step reads nothing from the log,
/// and its body is the one a daemon that rebuilds the session from the log plans.
#[test]
fn q10_a_new_sessions_first_step_reads_nothing_from_the_log_and_plans_what_the_log_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    let store = Arc::new(Like::new(Kind::Deferring));
    let d = daemon(store.clone(), dir.path());
    let id = d.create_session("coder").unwrap();
    let input = input(vec![Message::user("hello")], &[("cwd", "/a")]);
    let body = d.step_body(&id, &input, Format::Neutral).unwrap();
    assert_eq!(store.reads(), 0, "the first step read the log");
    // The same first step on a daemon that rebuilds the session from the log.
    let other = Arc::new(Like::new(Kind::Deferring));
    let cold = uncached(other.clone(), dir.path());
    let cold_id = cold.create_session("coder").unwrap();
    let cold_body = cold.step_body(&cold_id, &input, Format::Neutral).unwrap();
    assert!(other.reads() > 0, "an uncached daemon reads the log");
    assert_eq!(body, cold_body);
    let rebuilt = formats::render(&d.request(&id, body.0).unwrap(), Format::Neutral);
    assert_eq!(body.1, rebuilt.to_string());
}
