//! The daemon on native providers and an in-memory store: sessions, restarts and the HTTP
//! edge without wasmtime or SQLite. A plugin "file" holds the name of the native plugin the
//! test engine builds for it, so reloads and swaps are file changes as in production.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use promptd_core::config::Config;
use promptd_core::conversation::{Message, ToolCall};
use promptd_core::load::{Engine, Instantiated, LoadRequest};
use promptd_core::plugin_state::{ChangeKind, PluginState};
use promptd_core::provider::NativePlugin;
use promptd_core::store::{MemoryStore, SessionStore};
use promptd_core::Error;
use promptd_daemon::events::HISTORY;
use promptd_daemon::{Daemon, StepInput};
use serde_json::{json, Value};

/// Builds the native plugin a file names.
struct NativeEngine;

impl Engine for NativeEngine {
    fn instantiate(&self, r: LoadRequest<'_>) -> promptd_core::Result<Instantiated> {
        let plugin = match std::str::from_utf8(r.bytes).unwrap_or("").trim() {
            "persona-v1" => NativePlugin::new().section("persona", 0, "You are v1."),
            "persona-v2" => NativePlugin::new().section("persona", 0, "You are v2."),
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

fn put(dir: &Path, name: &str, body: &str) {
    std::fs::write(dir.join(format!("{name}.wasm")), body).unwrap();
}

fn daemon(store: Arc<dyn SessionStore>, dir: &Path) -> Daemon {
    Daemon::new(store, Arc::new(NativeEngine), Config::default(), dir).unwrap()
}

fn input(messages: Vec<Message>, facts: &[(&str, &str)]) -> StepInput {
    StepInput {
        messages,
        facts: facts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn kinds(d: &Daemon, id: &str) -> Vec<String> {
    d.session_events(id)
        .unwrap()
        .iter()
        .map(|e| match e.body.get("reason") {
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
    let (n1, r1) = d
        .step(&id, &input(vec![Message::user("hi")], &[("cwd", "/a")]))
        .unwrap();
    assert_eq!((n1, r1.header.system.as_str()), (1, "You are v1."));
    d.record_message(
        &id,
        &Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "read".into(),
                arguments: json!({}),
            }],
        },
    )
    .unwrap();
    let result = Message::Tool {
        tool_call_id: "c1".into(),
        content: "text".into(),
        is_error: false,
    };
    let (n2, r2) = d.step(&id, &input(vec![result], &[("cwd", "/a")])).unwrap();
    assert_eq!(n2, 2);
    assert_eq!(r2.messages.len(), 4, "{:?}", r2.messages);
    assert_eq!(d.request(&id, 1).unwrap(), r1);
    assert_eq!(d.request(&id, 2).unwrap(), r2);
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

#[test]
fn q3_a_new_daemon_over_the_same_store_records_resume_once() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "persona", "persona-v1");
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let first = daemon(store.clone(), dir.path());
    let id = first.create_session("default").unwrap();
    first.step(&id, &StepInput::default()).unwrap();
    first.step(&id, &StepInput::default()).unwrap();
    drop(first);
    let second = daemon(store, dir.path());
    second.step(&id, &StepInput::default()).unwrap();
    second.step(&id, &StepInput::default()).unwrap();
    let headers: Vec<String> = kinds(&second, &id)
        .into_iter()
        .filter(|k| k.starts_with("request/header"))
        .collect();
    assert_eq!(headers, ["request/header:initial", "request/header:resume"]);
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
    assert_eq!(
        d.step(&id, &StepInput::default()).unwrap().1.header.system,
        "You are v2."
    );
    put(dir.path(), "persona", "garbage");
    let applied = d.reload().unwrap();
    assert_eq!(applied[0].kind, ChangeKind::Refused);
    assert_eq!(d.plugins()[0].state, PluginState::Stale);
    assert_eq!(
        d.plugins()[0].last_error.as_ref().unwrap().code,
        "not_a_component"
    );
    assert_eq!(
        d.step(&id, &StepInput::default()).unwrap().1.header.system,
        "You are v2."
    );
    d.unload("persona").unwrap();
    assert_eq!(
        d.step(&id, &StepInput::default()).unwrap().1.header.system,
        ""
    );
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
        d.events
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
