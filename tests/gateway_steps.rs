//! The gateway's steps beyond the splice: a review hook's redactions in the upstream bytes
//! (G6), a token count that counts the splice (G6), replay of a gateway session (G6), and
//! joining by prefix after a restart (G3).

use promptd_testkit as common;

use common::daemon::Served;
use common::Folder;
use promptd_core::gateway::record::JoinedBy;
use serde_json::Value;

use crate::gateway::{header_of, raw_post, records, Stub};
use crate::gateway_edges::{events_of, json, serve, MESSAGES};

/// G6: a review hook's redaction reaches the bytes that go upstream, not only the log: the
/// hook's rule is applied to the client's user and tool texts in every request of the session
/// (the client resends its history unredacted), the log holds the redacted body
/// (`redacted`), the upstream body still rebuilds from it byte for byte, and a redacted turn
/// is the same bytes in the next request, so the cached prefix holds.
#[test]
fn g6_a_review_redaction_reaches_the_upstream_bytes_and_the_log_never_holds_the_secret() {
    let stub = Stub::start();
    let folder = Folder::new().scripted("guard");
    let rest = r#"
[plugins.guard.config]
review_order = "1"
review_redact = "hunter2|[redacted]"
"section.persona" = "10|be brief"
[agents.coder.gateway]
"#;
    let (served, _tmp) = serve(&folder, &stub.url, "", rest);
    let first =
        r#"{"model":"gpt-4.1","messages":[{"role":"user","content":"my password is hunter2"}]}"#;
    let (head, reply) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[],
        first.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let session = header_of(&head, "x-promptd-session").unwrap().to_string();
    let answer = json(&reply)["choices"][0]["message"].clone();
    let second = format!(
        r#"{{"model":"gpt-4.1","messages":[{{"role":"user","content":"my password is hunter2"}},{},{{"role":"user","content":"and \u0068unter2 again"}}]}}"#,
        answer
    );
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("x-promptd-session", session.as_str())],
        second.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let sent: Vec<String> = stub.requests()[..]
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(|r| String::from_utf8(r.2.clone()).unwrap())
        .collect();
    for body in &sent {
        assert!(!body.contains("hunter2"), "no secret upstream: {body}");
        assert!(body.contains("[redacted]"), "{body}");
    }
    // The first turn is the same bytes in both requests: the prefix holds.
    let turn = r#"{"role":"user","content":"my password is [redacted]"}"#;
    let at = |body: &str| body.find(turn).expect("the redacted turn");
    assert_eq!(sent[0][..at(&sent[0])], sent[1][..at(&sent[1])]);

    let mut events = Vec::new();
    common::eventually("both replies recorded", || {
        events = events_of(&served, &session);
        events
            .iter()
            .filter(|e| e["kind"] == "assistant/message")
            .count()
            == 2
    });
    let log = serde_json::to_string(&events).unwrap();
    assert!(!log.contains("hunter2"), "the log never holds the secret");
    let recorded = records(&events);
    assert_eq!(
        recorded.iter().map(|r| r.redacted).collect::<Vec<_>>(),
        [1, 2]
    );
    for (n, (record, body)) in recorded.iter().zip(&sent).enumerate() {
        assert_eq!(record.upstream_body(), body.as_bytes());
        let (status, rebuilt) =
            served.get(&format!("/v1/sessions/{session}/steps/{}/upstream", n + 1));
        assert_eq!(status, 200, "{rebuilt}");
        assert_eq!(&rebuilt, body, "step {} rebuilds from the log", n + 1);
    }
}

/// G6: a gateway session replays like any other: with its own config no step differs; with a
/// candidate config whose section text changed, every step differs at the system prompt, by
/// the plugin that gives it.
#[test]
fn g6_a_gateway_session_replays_and_names_the_plugin_a_candidate_changes() {
    let stub = Stub::start();
    let folder = Folder::new().scripted("persona");
    let plugin = |text: &str| {
        format!("[plugins.persona.config]\n\"section.persona\" = \"10|{text}\"\n[agents.coder.gateway]\n")
    };
    let (served, tmp) = serve(&folder, &stub.url, "", &plugin("be brief"));
    let mut body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#.to_string();
    let mut session: Option<String> = None;
    for turn in 0..2 {
        let mut headers = Vec::new();
        if let Some(id) = &session {
            headers.push(("x-promptd-session", id));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (head, reply) = raw_post(
            &served.url,
            "/gateway/coder/v1/messages",
            &headers,
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        session = header_of(&head, "x-promptd-session").map(str::to_string);
        let content = json(&reply)["content"].clone();
        body = body.replace(
            "]}",
            &format!(r#",{{"role":"assistant","content":{content}}},{{"role":"user","content":"turn {turn}"}}]}}"#),
        );
    }
    let session = session.unwrap();
    common::eventually("both replies recorded", || {
        events_of(&served, &session)
            .iter()
            .filter(|e| e["kind"] == "assistant/message")
            .count()
            == 2
    });
    let differing = |config: Option<&std::path::Path>| {
        let mut request = serde_json::json!({"sessions": [session]});
        if let Some(config) = config {
            request["config"] = config.display().to_string().into();
        }
        let report = served.ok("POST", "/v1/replay", Some(&request));
        let steps = report["sessions"][0]["steps"].as_array().unwrap().clone();
        assert_eq!(steps.len(), 2, "{report:#}");
        steps
            .into_iter()
            .filter(|s| s["differs"] == true)
            .map(|s| s["first_difference"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        differing(None),
        Vec::<Value>::new(),
        "its own config: no difference"
    );
    let candidate = tmp.path().join("candidate.toml");
    let config = std::fs::read_to_string(folder.config(&format!(
        "[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n{}",
        stub.url,
        plugin("be very brief")
    )))
    .unwrap();
    std::fs::write(&candidate, config).unwrap();
    let changed = differing(Some(&candidate));
    assert_eq!(changed.len(), 2, "{changed:#?}");
    for d in changed {
        assert_eq!(d["plugin"], "persona", "{d}");
    }
}

/// G3: a daemon that restarted reads back the conversation each recent gateway session
/// reached, so a client that goes on after the restart, naming nothing, joins its session by
/// prefix.
#[test]
fn g3_after_a_restart_a_conversation_joins_its_session_by_prefix() {
    let stub = Stub::start();
    let folder = Folder::new();
    let config = folder.config(&format!(
        "[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n[agents.coder.gateway]\n",
        stub.url
    ));
    let (tmp, state) = common::daemon::state_dir();
    let log = tmp.path().join("daemon.log");
    let served = Served::start_logged(folder.path(), &config, &state, &log);
    let (head, reply) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        &[],
        MESSAGES.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let session = header_of(&head, "x-promptd-session").unwrap().to_string();
    common::eventually("the reply recorded", || {
        events_of(&served, &session)
            .iter()
            .any(|e| e["kind"] == "assistant/message")
    });
    served.stop();

    let log = tmp.path().join("daemon-2.log");
    let served = Served::start_logged(folder.path(), &config, &state, &log);
    common::eventually("the index read back", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("index read back"))
    });
    let content = json(&reply)["content"].clone();
    let next = MESSAGES.replace(
        "]}",
        &format!(
            r#",{{"role":"assistant","content":{content}}},{{"role":"user","content":"go on"}}]}}"#
        ),
    );
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        &[],
        next.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-session"),
        Some(session.as_str()),
        "{head}"
    );
    let events = events_of(&served, &session);
    assert_eq!(records(&events).pop().unwrap().joined_by, JoinedBy::Prefix);
}

/// G6: a token count counts what a step would send: the agent's sections and runtime context
/// are spliced into the client's body as a step's would be, the upstream's count comes back
/// as it answered, and nothing is recorded; when a plugin fails, the body goes as it came,
/// marked degraded.
#[test]
fn g6_a_token_count_counts_the_splice_and_records_nothing() {
    let stub = Stub::start();
    let folder = Folder::new().scripted("persona");
    let rest = r#"
[plugins.persona.config]
"section.persona" = "10|be brief, always, whatever the user asks of you"
[agents.coder.gateway]
"#;
    let (served, _tmp) = serve(&folder, &stub.url, "", rest);
    let count = r#"{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}"#;
    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages/count_tokens",
        &[],
        count.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(header_of(&head, "server-timing").is_some(), "{head}");
    assert_eq!(header_of(&head, "x-promptd-degraded"), None, "{head}");
    let counted = json(&body)["input_tokens"].as_u64().expect("a count");
    let sent = stub.requests().pop().unwrap();
    assert_eq!(sent.0, "/v1/messages/count_tokens");
    let upstream = String::from_utf8(sent.2).unwrap();
    assert!(
        upstream.contains(r#""text":"be brief, always, whatever the user asks of you""#),
        "{upstream}"
    );
    assert!(
        upstream.ends_with(r#""messages":[{"role":"user","content":"hi"}]}"#),
        "the client's bytes after the system it gained: {upstream}"
    );

    // The same body counted straight at the stub: fewer tokens, by the sections'.
    let (status, direct) = common::daemon::request(
        &stub.url,
        "POST",
        "/v1/messages/count_tokens",
        Some(count),
        None,
    );
    assert_eq!(status, 200, "{direct}");
    let direct: Value = serde_json::from_str(&direct).unwrap();
    assert!(
        counted > direct["input_tokens"].as_u64().unwrap(),
        "{counted} against {direct}"
    );
    let list = served.ok("GET", "/v1/sessions", None);
    assert_eq!(list["sessions"], serde_json::json!([]), "nothing recorded");
    drop(served);

    // When the plugins cannot say, the count goes as the client sent it, marked degraded.
    let folder = Folder::new().scripted("flaky");
    let rest = "[plugins.flaky.config]\n\"trap_section.broken\" = \"1\"\n[agents.coder.gateway]\n";
    let (served, _tmp) = serve(&folder, &stub.url, "", rest);
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages/count_tokens",
        &[],
        count.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(header_of(&head, "x-promptd-degraded"), Some("plugin_trap"));
    assert_eq!(stub.requests().pop().unwrap().2, count.as_bytes());
}

/// W4 through the gateway: a plugin that reads the request inputs is shown what the client's
/// own request says — its model, its tools' names, the user's last message — and the turns
/// the session holds, with no fact header sent.
#[test]
fn w4_a_plugin_reads_the_model_tools_and_last_message_of_the_clients_request() {
    let stub = Stub::start();
    let folder = Folder::new().scripted("inputs");
    let rest = r#"
[plugins.inputs.config]
"input_section.inputs:seen" = "5"
[agents.coder.gateway]
"#;
    let (served, _tmp) = serve(&folder, &stub.url, "", rest);
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"tools":[{"name":"read_file","input_schema":{"type":"object"}},{"name":"bash","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"list the files"}]}"#;
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        &[],
        body.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let sent = String::from_utf8(stub.requests().pop().unwrap().2).unwrap();
    // `turn-count` is what the session holds: a new session records the turn after the
    // client's last reply only (G3), so one user message.
    assert!(
        sent.contains(
            "model=claude-sonnet-4-5; tools=read_file,bash; turns=1; last=list the files"
        ),
        "{sent}"
    );
}
