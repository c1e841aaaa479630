//! The gateway's edges (docs/gateway.md): how requests join sessions, what a failing plugin
//! does under each `on_plugin_failure`, an upstream that hangs, and a golden corpus of odd
//! bodies whose bytes must reach the upstream as the client sent them. Shares the harness of
//! `tests/gateway.rs`.

use promptd_testkit as common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::Served;
use common::Folder;
use promptd_core::gateway::record::JoinedBy;
use serde_json::Value;

use crate::gateway::{header_of, newest_session, raw_post, records, without_insertions, Stub};

/// A daemon on `folder` whose config is `body`, with the gateway on and both upstreams at
/// `url`: `gateway_keys` go into `[gateway]`, `rest` after the upstreams.
pub(crate) fn serve(
    folder: &Folder,
    url: &str,
    gateway_keys: &str,
    rest: &str,
) -> (Served, tempfile::TempDir) {
    let config = folder.config(&format!(
        "[gateway]\nenabled = true\n{gateway_keys}\n[gateway.upstream.openai]\nprovider = \"openai\"\nbase_url = \"{url}\"\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{url}\"\n{rest}\n"
    ));
    let (tmp, state) = common::daemon::state_dir();
    let log = tmp.path().join("daemon.log");
    (
        Served::start_logged(folder.path(), &config, &state, &log),
        tmp,
    )
}

pub(crate) fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

const CHAT: &str = r#"{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}"#;
pub(crate) const MESSAGES: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;

/// G3: a request joins the session its `x-promptd-session` names (404 for one that does not
/// exist), a Responses request the session of its `previous_response_id`; a client that
/// rewrote its history is recorded as such in the session it names, never refused.
#[test]
fn g3_requests_join_by_header_and_previous_response_and_a_rewrite_is_recorded() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    let (served, _tmp) = serve(&folder, &stub.url, "", "[agents.coder.gateway]");

    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[],
        CHAT.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let session = header_of(&head, "x-promptd-session")
        .expect("the session is named")
        .to_string();

    // The same session, named, with a history that does not continue what it holds.
    let rewritten = r#"{"model":"gpt-4.1","messages":[{"role":"user","content":"a different start"},{"role":"assistant","content":"ok"},{"role":"user","content":"go on"}]}"#;
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("x-promptd-session", &session)],
        rewritten.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-session"),
        Some(session.as_str())
    );
    let events = newest_session(&served);
    let last = records(&events).pop().unwrap();
    assert_eq!(last.joined_by, JoinedBy::Header);
    assert!(
        last.rewrote_at.is_some(),
        "the rewrite is recorded: {last:?}"
    );

    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("x-promptd-session", "no-such-session")],
        CHAT.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("no session `no-such-session`"));

    // Responses: the reply's id joins the next request that continues from it.
    let first = r#"{"model":"gpt-4.1","input":"hello there"}"#;
    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/v1/responses",
        &[],
        first.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let resumed_session = header_of(&head, "x-promptd-session").unwrap().to_string();
    let id = json(&body)["id"]
        .as_str()
        .expect("a response id")
        .to_string();
    let next =
        format!(r#"{{"model":"gpt-4.1","previous_response_id":"{id}","input":"and then?"}}"#);
    let started = Instant::now();
    let (head, _) = loop {
        // The reply is recorded just after it is answered.
        let (head, body) = raw_post(
            &served.url,
            "/gateway/coder/v1/responses",
            &[],
            next.as_bytes(),
        );
        if header_of(&head, "x-promptd-session") == Some(resumed_session.as_str())
            || started.elapsed() > Duration::from_secs(10)
        {
            break (head, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        header_of(&head, "x-promptd-session"),
        Some(resumed_session.as_str()),
        "{head}"
    );
    let events = newest_session(&served);
    assert_eq!(
        records(&events).pop().unwrap().joined_by,
        JoinedBy::PreviousResponse
    );
}

/// G6: a plugin that fails follows the agent's `on_plugin_failure` — `forward` sends the
/// client's body as it came, marked degraded; `refuse` answers a provider-shaped 500 naming
/// the plugin — while a review hook's rejection and plugin tools are refused whatever it says.
#[test]
fn g6_a_failing_plugin_follows_on_plugin_failure_and_a_rejection_is_never_forwarded() {
    let stub = Stub::start();
    let folder = Folder::new().scripted("flaky");
    let rest = r#"
[plugins.flaky.config]
"trap_section.broken" = "1"
[agents.fwd.gateway]
[agents.strict.gateway]
on_plugin_failure = "refuse"
"#;
    let (served, _tmp) = serve(&folder, &stub.url, "", rest);
    let before = stub.requests().len();
    let (head, _) = raw_post(
        &served.url,
        "/gateway/fwd/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-degraded"),
        Some("plugin_trap"),
        "{head}"
    );
    let sent = stub.requests();
    assert_eq!(sent.len(), before + 1);
    assert_eq!(
        sent.last().unwrap().2,
        MESSAGES.as_bytes(),
        "the client's body, as it came"
    );
    // Recorded as degraded: the step with the client's messages, no edit, the reason, and
    // the reply.
    let session = header_of(&head, "x-promptd-session")
        .expect("a session")
        .to_string();
    let mut events = Vec::new();
    common::eventually("the degraded exchange's reply recorded", || {
        events = events_of(&served, &session);
        events.iter().any(|e| e["kind"] == "assistant/message")
    });
    let record = records(&events).pop().expect("a gateway/request");
    assert_eq!(record.degraded.as_deref(), Some("plugin_trap"));
    assert!(record.splice.edits.is_empty(), "{record:?}");
    assert_eq!(record.client_body, MESSAGES);
    assert_eq!(record.upstream_body(), MESSAGES.as_bytes());
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    for kind in [
        "user/message",
        "step",
        "gateway/request",
        "assistant/message",
    ] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }

    let (head, body) = raw_post(
        &served.url,
        "/gateway/strict/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    let v = json(&body);
    assert_eq!(v["type"], "error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugin `flaky`"),
        "{v}"
    );
    assert_eq!(
        stub.requests().len(),
        before + 1,
        "nothing more went upstream"
    );
    // A forwarded failure counts towards quarantine as any step's does: the third failed
    // call (default `quarantine_after`) takes the plugin out, and the next request is a
    // whole step again, not degraded.
    let (head, _) = raw_post(
        &served.url,
        "/gateway/fwd/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert_eq!(header_of(&head, "x-promptd-degraded"), Some("plugin_trap"));
    common::eventually("flaky quarantined", || {
        served.plugin("flaky")["state"] == "quarantined"
    });
    let (head, _) = raw_post(
        &served.url,
        "/gateway/fwd/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(header_of(&head, "x-promptd-degraded"), None, "{head}");
    drop(served);

    let folder = Folder::new().scripted("guard");
    let rest = r#"
[plugins.guard.config]
review_order = "1"
review_reject_if = "secret|no secrets upstream"
"tool.run_tests" = '{"type":"object"}'
[agents.fwd.gateway]
"#;
    let (served, _tmp) = serve(&folder, &stub.url, "", rest);
    let (head, body) = raw_post(
        &served.url,
        "/gateway/fwd/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    let text = String::from_utf8_lossy(&body);
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("gateway_plugin_tools"),
        "{head}"
    );
    assert!(
        text.contains("run_tests"),
        "the plugin tools are named: {text}"
    );
    // The same daemon: a review hook's rejection comes first, and stands.
    let before = stub.requests().len();
    let secret = MESSAGES.replace("\"hi\"", "\"the secret is 42\"");
    let (head, body) = raw_post(
        &served.url,
        "/gateway/fwd/v1/messages",
        &[],
        secret.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("no secrets upstream"));
    assert_eq!(
        stub.requests().len(),
        before,
        "a rejected request never goes upstream"
    );
}

/// G2: an upstream that sends no status line within `response_timeout_ms` is a 504 naming
/// the setting, and the daemon keeps serving; the request's missing reply is recorded with why,
/// as is an upstream's own refusal.
#[test]
fn g2_an_upstream_that_hangs_is_a_504_after_the_response_timeout() {
    let stub = Stub::start();
    let folder = Folder::new().bundled("identity");
    let (served, _tmp) = serve(
        &folder,
        &stub.url,
        "response_timeout_ms = 1000",
        "[agents.coder.gateway]",
    );
    let started = Instant::now();
    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("x-stub-fault", "hang")],
        CHAT.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let v = json(&body);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("response_timeout_ms"),
        "{v}"
    );
    // The request is in the log; its missing reply is recorded with why.
    let events = newest_session(&served);
    let reply = events
        .iter()
        .find(|e| e["kind"] == "assistant/message")
        .expect("the missing reply is recorded");
    let partial = reply["body"]["partial"].as_str().unwrap_or_default();
    assert!(partial.contains("response_timeout_ms"), "{reply}");

    // So is an upstream's own refusal.
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("x-stub-fault", "status-429")],
        CHAT.replace("hi", "again").as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    let events = newest_session(&served);
    let reply = events
        .iter()
        .find(|e| e["kind"] == "assistant/message")
        .expect("the refused reply is recorded");
    let partial = reply["body"]["partial"].as_str().unwrap_or_default();
    // The status and the error's type, never the upstream's message (it may quote a key).
    assert_eq!(partial, "the upstream answered 429 (requests)", "{reply}");
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[],
        CHAT.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// The body of the next request on a connection (by its content-length); `None` once the
/// connection ends.
fn read_body(reader: &mut BufReader<std::net::TcpStream>) -> Option<Vec<u8>> {
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

/// An upstream that takes any body and answers a fixed reply, keeping what it got.
struct Echo {
    url: String,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

fn echo(reply: &'static str) -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let kept = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut out = conn;
                while let Some(body) = read_body(&mut reader) {
                    kept.lock().unwrap().push(body);
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", reply.len());
                    if out
                        .write_all(head.as_bytes())
                        .and_then(|()| out.write_all(reply.as_bytes()))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Echo { url, got }
}

const ANTHROPIC_REPLY: &str = r#"{"id":"msg_echo","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;

/// G4, the golden corpus: odd bodies — unknown fields, numbers no float holds, escapes,
/// `cache_control` with a TTL and unknown keys on every kind of block, an image, a 20 MiB
/// message — reach the upstream as the client's bytes plus the recorded insertions, nothing
/// else; the client's breakpoints and TTLs come through as they were.
#[test]
fn g4_a_golden_corpus_of_odd_bodies_reaches_the_upstream_as_the_clients_bytes_plus_the_splice() {
    let upstream = echo(ANTHROPIC_REPLY);
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("workspace");
    let rest = r#"
[plugins.identity]
config = { name = "Ada", model = "example-model" }
[plugins.persona]
config = { text = "You are {{agent_name}}'s {{role}} side.", role = "engineering" }
[agents.coder.gateway]
"#;
    let (served, _tmp) = serve(&folder, &upstream.url, "", rest);
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let mark = r#"{"type":"ephemeral","ttl":"1h","x-future":{"n":1e400}}"#;
    let big = "z".repeat(20 << 20);
    let corpus = [
        r#"{ "model" : "claude" , "max_tokens" : 10 , "x-unknown": [1.0, -0.0, 123456789012345678901234567890, 1e400], "metadata": {"user_id": "u\u00e9\ud83d\ude00"}, "messages" : [ { "role" : "user" , "content" : "q" } ] }"#.to_string(),
        format!(
            r#"{{"model":"claude","max_tokens":10,"tools":[{{"name":"t","input_schema":{{"type":"object"}},"cache_control":{mark}}}],"system":[{{"type":"text","text":"S","cache_control":{mark}}}],"messages":[{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{png}"}},"cache_control":{mark}}},{{"type":"text","text":"what is this?"}}]}},{{"role":"assistant","content":[{{"type":"tool_use","id":"tu_1","name":"t","input":{{}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"tu_1","content":[{{"type":"text","text":"r","cache_control":{mark}}}]}}]}}]}}"#
        ),
        format!(
            r#"{{"model":"claude","max_tokens":10,"system":"plain \"quoted\" \\ system","messages":[{{"role":"user","content":"{big}"}}]}}"#
        ),
    ];
    for (i, body) in corpus.iter().enumerate() {
        let (head, _) = raw_post(
            &served.url,
            "/gateway/coder/v1/messages",
            &[("x-promptd-fact-cwd", "/corpus")],
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "body {i}: {head}");
        let got = upstream
            .got
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the upstream got it");
        // Read over a raw connection: a 20 MiB body's log is past the test client's limit.
        let id = header_of(&head, "x-promptd-session").unwrap().to_string();
        let events = events_of(&served, &id);
        let record = records(&events).pop().unwrap();
        assert_eq!(
            record.client_body.as_bytes(),
            body.as_bytes(),
            "body {i}: recorded as sent"
        );
        assert_eq!(
            record.upstream_body(),
            got,
            "body {i}: rebuilds byte for byte"
        );
        assert_eq!(
            without_insertions(&record, &got),
            body.as_bytes(),
            "body {i}: only insertions"
        );
        let sent = String::from_utf8_lossy(&got);
        assert!(sent.contains("You are Ada's engineering side"), "body {i}");
        // Every breakpoint the client set, TTL and unknown keys included, is there as it was.
        assert_eq!(
            sent.matches(mark).count(),
            body.matches(mark).count(),
            "body {i}"
        );
        assert!(
            sent.matches("cache_control").count() <= 4,
            "body {i}: at most four breakpoints"
        );
    }
    let list = served.ok("GET", "/v1/sessions", None);
    assert_eq!(
        list["sessions"].as_array().unwrap().len(),
        corpus.len(),
        "a session each"
    );
}

/// G4, the client's tools: `deny_tools` takes the named ones out, `defer_tools` marks the
/// named ones `"defer_loading":true` (inserted as each one's first member, nothing else of
/// the tool touched); the upstream gets exactly that, and the step's `gateway/request` names
/// them (`splice.denied`, `splice.deferred`).
#[test]
fn g4_deny_and_defer_tools_reach_the_upstream_and_the_record_names_them() {
    let upstream = echo(ANTHROPIC_REPLY);
    let folder = Folder::new().bundled("identity");
    let rest = r#"
[plugins.identity]
config = { name = "Ada", model = "example-model" }
[agents.base.gateway]
defer_tools = ["lookup", "own"]
[agents.coder]
parent = "base"
[agents.coder.gateway]
deny_tools = ["drop_me"]
"#;
    let (served, _tmp) = serve(&folder, &upstream.url, "", rest);
    let body = r#"{"model":"claude","max_tokens":10,"tools":[{"name":"keep","input_schema":{"type":"object"}},{ "name" : "lookup" , "input_schema":{"type":"object","x":1.50E+2}},{"name":"drop_me","input_schema":{}},{"name":"own","defer_loading":false,"input_schema":{}},{"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"}],"messages":[{"role":"user","content":"hi"}]}"#;
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        &[],
        body.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let got = upstream.got.lock().unwrap().last().cloned().unwrap();
    let sent = String::from_utf8(got.clone()).unwrap();
    assert!(
        sent.contains(r#"{"defer_loading":true, "name" : "lookup" , "input_schema":{"type":"object","x":1.50E+2}}"#),
        "{sent}"
    );
    assert!(!sent.contains("drop_me"), "{sent}");
    assert!(
        sent.contains(r#"{"name":"own","defer_loading":false,"input_schema":{}}"#),
        "the client's own defer_loading is left as it wrote it: {sent}"
    );
    assert_eq!(sent.matches("defer_loading").count(), 2, "{sent}");
    let id = header_of(&head, "x-promptd-session").unwrap().to_string();
    let record = records(&events_of(&served, &id)).pop().unwrap();
    assert_eq!(record.splice.deferred, ["lookup"]);
    assert_eq!(record.splice.denied, ["drop_me"]);
    assert!(record.splice.skipped.is_empty(), "{:?}", record.splice);
    assert_eq!(record.client_body, body, "recorded as sent");
    assert_eq!(record.upstream_body(), got, "rebuilds byte for byte");
    let (status, text) = common::daemon::request(
        &served.url,
        "GET",
        &format!("/v1/sessions/{id}/steps/1/upstream"),
        None,
        None,
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(text.as_bytes(), got, "the body API gives the same bytes");
}

/// A session's events, read over a raw connection (no body limit).
pub(crate) fn events_of(served: &Served, id: &str) -> Vec<Value> {
    let addr = served.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /v1/sessions/{id}/events HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).to_ascii_lowercase();
    let body = &out[split + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        crate::gateway::dechunk(body)
    } else {
        body.to_vec()
    };
    json(&body)["events"].as_array().unwrap().clone()
}

/// An Anthropic upstream that streams `message_start`, then `count` text deltas of `text`,
/// one every `every`.
fn slow_stream(every: Duration, text: &'static str, count: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut out = conn;
                if read_body(&mut reader).is_none() {
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                if out.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut send = |event: &str, data: &str| {
                    let frame = format!("event: {event}\ndata: {data}\n\n");
                    let chunk = format!("{:x}\r\n{frame}\r\n", frame.len());
                    out.write_all(chunk.as_bytes()).and_then(|()| out.flush())
                };
                let start = r#"{"type":"message_start","message":{"id":"msg_slow","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":7,"output_tokens":1}}}"#;
                let block = r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
                if send("message_start", start)
                    .and_then(|()| send("content_block_start", block))
                    .is_err()
                {
                    return;
                }
                let delta = format!(
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#
                );
                for _ in 0..count {
                    std::thread::sleep(every);
                    if send("content_block_delta", &delta).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// A streamed Messages request for agent `coder` sent over a raw connection, left open to
/// read (or not) as the test wants.
fn streamed_messages(served: &Served) -> std::net::TcpStream {
    let body = r#"{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let addr = served.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /gateway/coder/v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// G5: a client that goes away in the middle of a stream leaves the reply recorded as far as
/// it came, with why it ended; the daemon keeps serving.
#[test]
fn g5_a_client_that_leaves_mid_stream_leaves_a_partial_reply_recorded() {
    // A delta every 300 ms for 20 s: long enough to leave in the middle.
    let upstream = slow_stream(Duration::from_millis(300), "more ", 66);
    let folder = Folder::new().bundled("identity");
    let (served, _tmp) = serve(&folder, &upstream, "", "[agents.coder.gateway]");
    let mut stream = streamed_messages(&served);
    // Read until a text delta has come, then leave.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("content_block_delta") {
        let n = stream.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&seen).to_string();
    let session = header_of(&head, "x-promptd-session").unwrap().to_string();
    drop(stream);
    let started = Instant::now();
    let mut reply = Value::Null;
    common::eventually("the partial reply recorded", || {
        let events = served.ok("GET", &format!("/v1/sessions/{session}/events"), None);
        match events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "assistant/message")
        {
            Some(e) => {
                reply = e["body"].clone();
                true
            }
            None => false,
        }
    });
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "recorded once the client was gone"
    );
    assert_eq!(reply["partial"], "the client disconnected", "{reply}");
    assert!(
        reply["content"].as_str().unwrap().starts_with("more"),
        "as far as it came: {reply}"
    );
    assert_eq!(served.health()["status"], "ok");
}

/// G5: a client that keeps its connection but stops reading is cut after `client_stall_ms`,
/// and the reply is recorded as far as it came, with why.
#[test]
fn g5_a_client_that_stops_reading_is_cut_after_the_stall_bound() {
    // 64 KiB deltas as fast as they go: the socket buffers fill soon after the client stops.
    let text: &'static str = Box::leak("x".repeat(64 << 10).into_boxed_str());
    let upstream = slow_stream(Duration::ZERO, text, 2000);
    let folder = Folder::new().bundled("identity");
    let (served, _tmp) = serve(
        &folder,
        &upstream,
        "client_stall_ms = 500",
        "[agents.coder.gateway]",
    );
    let mut stream = streamed_messages(&served);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0);
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let session = header_of(&head, "x-promptd-session").unwrap().to_string();
    // Read nothing more, keep the connection open.
    let mut reply = Value::Null;
    common::eventually_within(60, "the stalled stream cut and its reply recorded", || {
        let events = events_of(&served, &session);
        match events.iter().find(|e| e["kind"] == "assistant/message") {
            Some(e) => {
                reply = e["body"].clone();
                true
            }
            None => false,
        }
    });
    let partial = reply["partial"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", &reply.to_string()[..200]));
    assert!(partial.contains("read nothing for 500 ms"), "{partial}");
    assert!(partial.contains("client_stall_ms"), "{partial}");
    drop(stream);
    assert_eq!(served.health()["status"], "ok");
}
