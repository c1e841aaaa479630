//! The gateway in a fleet (G10, docs/gateway.md): two real daemons on one real PostgreSQL
//! database behind a real HAProxy, the official anthropic SDK (tests/sdk_loops/gateway_fleet.py)
//! keeping one conversation through the proxy against the stub upstream. The session goes on
//! whichever daemon a request reaches, byte-stably; the daemon serving a stream is SIGKILLed in
//! its middle, the client sees the cut, the request is never recorded as complete, and the
//! client's retry reaches the survivor and succeeds. Shares the harnesses of tests/postgres.rs
//! (the servers) and tests/gateway.rs (the stub).

use promptd_testkit as common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::daemon::{request, state_dir, Served};
use common::process::Bounded;
use common::Folder;
use serde_json::Value;

use crate::gateway::{python, Stub};
use crate::postgres::{server, Haproxy};

/// A gateway daemon on the database at `url` (read from the environment, `[store] url_env`),
/// serving agent `coder` with the same sections as every other node, forwarding to `stub`.
fn node(url: &str, stub: &str) -> (Served, Folder, tempfile::TempDir) {
    let folder = Folder::new().bundled("identity").bundled("persona");
    let config = folder.config(&format!(
        r#"
[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.persona]
config = {{ text = "You are {{{{agent_name}}}}'s {{{{role}}}} side.", role = "engineering" }}

[store]
url_env = "PROMPTD_TEST_DATABASE_URL"

[gateway]
enabled = true
[gateway.upstream.anthropic]
provider = "anthropic"
base_url = "{stub}"

[agents.coder.gateway]
"#
    ));
    let (tmp, state) = state_dir();
    let log = tmp.path().join("daemon.log");
    let served = Served::start_logged_with_env(
        folder.path(),
        &config,
        &state,
        &[("PROMPTD_TEST_DATABASE_URL", url)],
        &log,
    );
    (served, folder, tmp)
}

/// The client's next JSON line.
fn next_line(out: &mut impl BufRead, what: &str) -> Value {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: {e}: {line:?}"))
}

/// G10: a gateway session continues on any daemon of a fleet, byte-stably, and survives the
/// SIGKILL of the daemon serving its stream: the client sees the cut, the cut request is
/// recorded with no reply or a partial one (never a complete one), the client's retry goes
/// through HAProxy to the survivor and succeeds with the same upstream bytes, and every reply
/// the client was given is in the log.
#[test]
fn g10_a_gateway_session_goes_on_across_a_fleet_and_survives_the_kill_of_its_streams_daemon() {
    let url = server().database();
    let stub = Stub::start();
    let mut nodes: Vec<Option<(Served, Folder, tempfile::TempDir)>> =
        (0..2).map(|_| Some(node(&url, &stub.url))).collect();
    let urls: Vec<String> = nodes.iter().flatten().map(|n| n.0.url.clone()).collect();
    let proxy = Haproxy::start(&[&urls[0], &urls[1]]);
    common::eventually("HAProxy to see both daemons healthy", || {
        request(&proxy.url, "GET", "/v1/health", None, None).0 == 200
    });

    let turns = 4;
    let mut client = Command::new(python());
    client
        .arg(common::repo_root().join("tests/sdk_loops/gateway_fleet.py"))
        .arg(format!("{}/gateway/coder", proxy.url))
        .args(["--turns", &turns.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = Bounded(client.spawn().expect("start the client"));
    let mut stdin = child.0.stdin.take().unwrap();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());

    // Turns alternate between the daemons (round robin) and stay in one session.
    let mut texts = Vec::new();
    let mut backends = Vec::new();
    let mut session = String::new();
    for i in 1..=turns {
        let line = next_line(&mut out, &format!("turn {i}"));
        assert_eq!(line["turn"], i, "{line}");
        if i == 1 {
            session = line["session"].as_str().unwrap().to_string();
        }
        assert_eq!(line["session"], session.as_str(), "one session: {line}");
        backends.push(line["backend"].as_str().unwrap().to_string());
        texts.push(line["text"].as_str().unwrap().to_string());
    }
    assert!(
        backends.iter().any(|b| b == "d0") && backends.iter().any(|b| b == "d1"),
        "both daemons served the session: {backends:?}"
    );

    // The stream: once its first event came, its daemon dies.
    let line = next_line(&mut out, "the stream");
    assert_eq!(line["session"], session.as_str(), "{line}");
    let killed: usize = match line["backend"].as_str() {
        Some("d0") => 0,
        Some("d1") => 1,
        other => panic!("no backend named: {other:?}"),
    };
    let survivor = 1 - killed;
    let (dead, _folder, _tmp) = nodes[killed].take().unwrap();
    dead.kill9();
    writeln!(stdin, "go").unwrap();
    let line = next_line(&mut out, "the cut");
    let cut = line["cut"].as_str().unwrap_or_else(|| {
        panic!("the client saw the stream end cleanly, not cut: {line}");
    });
    assert!(
        line["events"].as_u64().unwrap() >= 1,
        "cut in the middle: {line}"
    );
    // Through HAProxy the chunked body stops unfinished: httpx says so (docs/gateway.md).
    assert!(
        cut.starts_with("RemoteProtocolError") && cut.contains("incomplete chunked read"),
        "{cut}"
    );

    // The retry reaches the survivor and is served in the same session.
    let line = next_line(&mut out, "the retry");
    assert_eq!(line["session"], session.as_str(), "{line}");
    assert_eq!(line["backend"], format!("d{survivor}"), "{line}");
    assert_eq!(line["stop_reason"], "end_turn", "{line}");
    texts.push(line["text"].as_str().unwrap().to_string());
    let line = next_line(&mut out, "the turn after");
    assert_eq!(line["session"], session.as_str(), "{line}");
    texts.push(line["text"].as_str().unwrap().to_string());
    drop(stdin);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "the client failed");

    // What the upstream received: every request of the session.
    let sent: Vec<Vec<u8>> = stub
        .requests()
        .into_iter()
        .filter(|(path, _, _)| path == "/v1/messages")
        .map(|(_, _, body)| body)
        .collect();
    assert_eq!(sent.len(), turns + 3, "each request went upstream once");
    // Byte-stable: the sections (in `system`) are the same bytes on either daemon, and the
    // retry sent exactly what the cut request did.
    let systems: Vec<Value> = sent
        .iter()
        .map(|b| serde_json::from_slice::<Value>(b).unwrap()["system"].clone())
        .collect();
    assert!(
        systems.iter().all(|s| s == &systems[0]) && systems[0].to_string().contains("Ada"),
        "{systems:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&sent[turns + 1]),
        String::from_utf8_lossy(&sent[turns]),
        "the retry's upstream bytes are the cut request's"
    );

    // The log, read from the survivor once the last reply is recorded.
    let (alive, _, _) = nodes[survivor].as_ref().unwrap();
    let events_of = || -> Vec<Value> {
        alive.ok("GET", &format!("/v1/sessions/{session}/events"), None)["events"]
            .as_array()
            .unwrap()
            .clone()
    };
    let replies = |events: &[Value]| -> Vec<Value> {
        (events.iter())
            .filter(|e| e["kind"] == "assistant/message")
            .map(|e| e["body"].clone())
            .collect()
    };
    common::eventually("the last reply recorded", || {
        replies(&events_of()).len() >= texts.len()
    });
    let events = events_of();
    let requests: Vec<&Value> = (events.iter())
        .filter(|e| e["kind"] == "gateway/request")
        .collect();
    assert_eq!(requests.len(), turns + 3, "every request recorded once");
    let joined: Vec<&str> = (requests.iter())
        .map(|e| e["body"]["joined_by"].as_str().unwrap())
        .collect();
    let mut expected = vec!["prefix"; turns + 3];
    expected[0] = "new";
    assert_eq!(joined, expected);
    // Never a complete reply to the cut request: none, or a partial one, before the retry.
    let seq = |e: &Value| e["seq"].as_u64().unwrap();
    let (cut_at, retry_at) = (seq(requests[turns]), seq(requests[turns + 1]));
    let between: Vec<&Value> = (events.iter())
        .filter(|e| e["kind"] == "assistant/message")
        .filter(|e| (cut_at..retry_at).contains(&seq(e)))
        .collect();
    assert!(
        between.iter().all(|e| e["body"]["partial"].is_string()),
        "the cut request is never recorded complete: {between:?}"
    );
    // Each reply right after the request it answers, whichever daemon recorded it: the log
    // never holds a step before the reply it follows (the cut request has none).
    for (i, request) in requests.iter().enumerate().filter(|(i, _)| *i != turns) {
        let next = events.iter().find(|e| seq(e) == seq(request) + 1);
        assert_eq!(
            next.map(|e| &e["kind"]),
            Some(&Value::from("assistant/message")),
            "request {i}'s reply follows it"
        );
    }
    // Each user turn once: the retry appended none again.
    let users: Vec<String> = (events.iter())
        .filter(|e| e["kind"] == "user/message")
        .map(|e| e["body"]["content"].as_str().unwrap_or("").to_string())
        .collect();
    let mut said: Vec<String> = (1..=turns)
        .map(|i| format!("Turn {i}: answer briefly."))
        .collect();
    said.push(format!("Turn {}: stream it.", turns + 1));
    said.push(format!("Turn {}: answer briefly.", turns + 2));
    assert_eq!(users, said);
    // Every reply the client was given is recorded, complete, in order.
    let complete: Vec<String> = (replies(&events).into_iter())
        .filter(|r| r["partial"].is_null())
        .map(|r| r["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(complete, texts, "every acknowledged reply is in the log");
    // Each step's upstream bytes rebuild from the shared log on the survivor.
    for (n, step) in (1..).zip(&sent) {
        let (status, body) = request(
            &alive.url,
            "GET",
            &format!("/v1/sessions/{session}/steps/{n}/upstream"),
            None,
            None,
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body.as_bytes(), step.as_slice(), "step {n}");
    }
}
