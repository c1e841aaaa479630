//! Tools promptd runs itself through the gateway (docs/gateway.md, G13): an official SDK's
//! tool-calling loop against the real daemon and the stub upstream, the model calling the
//! real `mcp-server-time`'s tools (and the client's own), and the bounds, each refusal naming
//! the tool. Each check compares bytes: what the stub received against the recorded bodies.

use promptd_testkit as common;

use std::process::Command;
use std::time::Duration;

use common::daemon::Served;
use common::{repo_root, Folder};
use promptd_core::gateway::record::GatewayRecord;
use serde_json::{json, Value};

use crate::gateway::{header_of, newest_session, python, raw_post, records, Stub};
use crate::gateway_edges::{json as parse, serve};
use crate::mcp::{fixture_server, time_server, wait_state};

const LOOP_BOUND: Duration = Duration::from_secs(120);

/// A daemon whose agent `coder` is served by the gateway, with `[mcp.NAME]` servers in
/// `mcp` and `[agents.coder.gateway]` keys in `agent`, once every server in `ids` is loaded.
fn daemon(stub: &Stub, mcp: &str, agent: &str, ids: &[&str]) -> (Served, tempfile::TempDir) {
    let rest = format!("{mcp}\n[agents.coder.gateway]\n{agent}\n");
    let (served, tmp) = serve(&Folder::new(), &stub.url, "", &rest);
    for id in ids {
        wait_state(&served, id, "loaded");
    }
    (served, tmp)
}

fn time_config(name: &str, prefix: &str) -> String {
    format!(
        "[mcp.{name}]\ncommand = {:?}\nargs = [\"--local-timezone\", \"UTC\"]\ntool_prefix = \"{prefix}\"\n",
        time_server()
    )
}

/// tests/sdk_loops/gateway_loop.py on `sdk` for `turns` user turns (streamed with
/// `stream`); its JSON line.
fn sdk_loop(served: &Served, sdk: &str, turns: u32, stream: bool) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/sdk_loops/gateway_loop.py"))
        .arg(sdk)
        .arg(format!("{}/gateway/coder", served.url))
        .args(["--turns", &turns.to_string()]);
    if stream {
        cmd.arg("--stream");
    }
    let (code, out, err) = common::process::run_bounded(cmd, LOOP_BOUND);
    assert_eq!(code, Some(0), "{sdk} failed:\n{err}\n{out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The recorded tool results of a session's events: (call id, content, is_error).
/// What a client's two-turn loop saw through a mixed reply (turn 2's reply calls the
/// client's tool and promptd's at once, so no round of promptd's goes upstream): its output,
/// the four bodies the stub received (each rebuilt byte for byte from its record), the
/// session's events and its gateway records.
struct Mixed {
    out: Value,
    received: Vec<Vec<u8>>,
    events: Vec<Value>,
    records: Vec<GatewayRecord>,
}

fn mixed_loop(stub: &Stub, served: &Served, sdk: &str, stream: bool) -> Mixed {
    let out = sdk_loop(served, sdk, 2, stream);
    assert_eq!(out["requests"], 4, "{out}");
    let received: Vec<Vec<u8>> = stub.requests().into_iter().map(|r| r.2).collect();
    assert_eq!(
        received.len(),
        4,
        "no round of promptd's: the reply was mixed"
    );
    let events = newest_session(served);
    let records = records(&events);
    bodies_rebuild(&records, &received);
    Mixed {
        out,
        received,
        events,
        records,
    }
}

/// The id of promptd's own call in a mixed reply (the one result not among the client's
/// `calls`), recorded and answered once, whose result the model read beside the client's.
fn own_call_answered(events: &[Value], calls: &[Value], out: &Value) -> String {
    let results = tool_results(events);
    let own: Vec<&(String, String, bool)> = (results.iter())
        .filter(|(id, _, _)| !calls.contains(&json!(id)))
        .collect();
    assert_eq!(
        own.len(),
        1,
        "promptd's call answered and recorded: {results:?}"
    );
    let own_id = own[0].0.clone();
    let text = out["texts"][1].as_str().unwrap();
    assert!(
        text.contains(&own_id) && text.contains(calls[1].as_str().unwrap()),
        "the model read both results: {text}"
    );
    own_id
}

fn tool_results(events: &[Value]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter(|e| e["kind"] == "tool/result")
        .map(|e| {
            let b = &e["body"];
            let content = match &b["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (
                b["tool_call_id"].as_str().unwrap_or("").to_string(),
                content,
                b["is_error"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// Each record's upstream body is the bytes the stub received, in order (G4, G13).
fn bodies_rebuild(records: &[GatewayRecord], received: &[Vec<u8>]) {
    assert_eq!(
        records.len(),
        received.len(),
        "one record per upstream request"
    );
    for (i, (record, got)) in records.iter().zip(received).enumerate() {
        assert_eq!(
            String::from_utf8_lossy(&record.upstream_body()),
            String::from_utf8_lossy(got),
            "request {i}: the log rebuilds the upstream bytes"
        );
    }
}

/// The client's own bytes of a record: its `client_body` with promptd's restored insertions
/// taken out (each at `at` in the client's own bytes).
fn client_sent(record: &GatewayRecord) -> String {
    let body = &record.client_body;
    let (mut out, mut at, mut inserted) = (String::new(), 0, 0);
    for edit in &record.restored {
        let start = edit.at + inserted;
        out.push_str(&body[at..start]);
        assert_eq!(&body[start..start + edit.insert.len()], edit.insert);
        at = start + edit.insert.len();
        inserted += edit.insert.len();
    }
    out.push_str(&body[at..]);
    out
}

/// Where `body`'s last message ends (the byte after it).
fn end_of_last_message(body: &[u8]) -> usize {
    let text = std::str::from_utf8(body).unwrap();
    let parsed = promptd_core::gateway::body::ClientBody::parse(body).unwrap();
    let range = parsed.member("messages").unwrap().value.clone();
    let items = promptd_core::gateway::body::elements(text, range).unwrap();
    items.last().unwrap().end
}

/// G13: the model calls only `mcp-server-time`'s tools; promptd runs them (the real server),
/// records call and result, and asks the upstream again, so the anthropic SDK's streamed loop
/// sees one reply per request (the final round's frames), and never a call it cannot run. On
/// its next turn the client's history lacks promptd's round: promptd puts it back at its
/// place, so the upstream sees every byte it saw before, and the session's log rebuilds each
/// upstream body.
#[test]
fn g13_promptd_runs_its_mcp_tools_and_puts_its_rounds_back_byte_stable() {
    let stub = Stub::start();
    let (served, _tmp) = daemon(&stub, &time_config("clock", "clock_"), "", &["mcp:clock"]);
    // The stub calls the first tool by name (clock_convert_time), then, in its second round,
    // the first two (both promptd's): read_file, the client's, is never called.
    let out = sdk_loop(&served, "anthropic", 2, true);
    assert_eq!(out["requests"], 2, "one reply per client request: {out}");
    assert_eq!(out["calls"], json!([]), "the client saw no call: {out}");
    for text in out["texts"].as_array().unwrap() {
        assert!(
            text.as_str()
                .unwrap()
                .starts_with("Read the results of toolu_"),
            "the final text follows promptd's results: {out}"
        );
    }
    let received: Vec<Vec<u8>> = stub.requests().into_iter().map(|r| r.2).collect();
    assert_eq!(received.len(), 4, "two rounds per client request");
    let events = newest_session(&served);
    let records = records(&events);
    assert_eq!(
        records.iter().map(|r| r.round).collect::<Vec<_>>(),
        vec![0, 1, 0, 1],
        "each round a step of the one session"
    );
    bodies_rebuild(&records, &received);
    for body in &received {
        let tools = parse(body)["tools"].clone();
        let names: Vec<&str> = (tools.as_array().unwrap().iter())
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["clock_convert_time", "clock_get_current_time", "read_file"],
            "promptd's tools before the client's"
        );
    }
    // Turn 2's first request holds turn 1's whole conversation as the upstream saw it, byte
    // for byte: the client's history lacked promptd's round, put back at its place.
    let end = end_of_last_message(&received[1]);
    assert_eq!(
        String::from_utf8_lossy(&received[2][..end]),
        String::from_utf8_lossy(&received[1][..end]),
        "the upstream's conversation is byte-stable across the client's requests"
    );
    assert!(records[0].restored.is_empty());
    assert!(!records[2].restored.is_empty(), "turn 2 got the round back");
    let client = client_sent(&records[2]);
    assert!(
        !client.contains("tool_use") && !client.contains("clock_"),
        "the client sent none of promptd's calls: {client}"
    );
    // Every call the model made has its result in the log, from the real server.
    let results = tool_results(&events);
    assert_eq!(results.len(), 3, "{results:?}");
    for (id, content, _) in &results {
        assert!(id.starts_with("toolu_"), "{id}");
        assert!(
            content.contains("stub"),
            "mcp-server-time answered the stub's arguments: {content}"
        );
    }
    let second = parse(&received[3]);
    let last = second["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"].as_array().unwrap().len(),
        2,
        "two calls answered in one turn: {last}"
    );
}

/// G13: one reply mixes a call to promptd's tool with a call to the client's: promptd answers
/// its own, the Chat Completions client is shown only its call, and its next request goes
/// upstream with promptd's call back in the assistant message at its index and its result
/// right after it, so the upstream sees a valid conversation.
#[test]
fn g13_a_mixed_reply_shows_the_client_its_call_and_puts_promptds_back_at_its_place() {
    let stub = Stub::start();
    let (served, _tmp) = daemon(&stub, &time_config("time", "time_"), "", &["mcp:time"]);
    // read_file sorts first: in turn 1 the stub calls it alone; in turn 2 (its second round
    // of calls) read_file and time_convert_time in one reply.
    let Mixed {
        out,
        received,
        events,
        records,
    } = mixed_loop(&stub, &served, "openai-chat", false);
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(
        calls.len(),
        2,
        "the client saw its own two calls only: {out}"
    );
    let own_id = own_call_answered(&events, calls, &out);
    // The last request: the client's body, promptd's call and result inserted at their place.
    let last = parse(&received[3]);
    let messages = last["messages"].as_array().unwrap();
    let n = messages.len();
    let assistant = &messages[n - 3];
    let names: Vec<&str> = (assistant["tool_calls"].as_array().unwrap().iter())
        .map(|c| c["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", "time_convert_time"], "{assistant}");
    assert_eq!(messages[n - 2]["tool_call_id"], json!(own_id));
    assert_eq!(messages[n - 1]["tool_call_id"], calls[1]);
    let record = &records[3];
    assert_eq!(record.restored.len(), 2, "{:?}", record.restored);
    let client = client_sent(record);
    assert!(
        !client.contains(&own_id),
        "the client's own body lacks promptd's call: {client}"
    );
    // The restored bytes are the bytes of the model's call as the upstream sent it.
    let mixed = (events.iter())
        .filter(|e| e["kind"] == "assistant/message")
        .nth(2)
        .map(|e| e["body"].clone());
    assert!(mixed.is_some(), "the mixed reply is recorded whole");
    assert!(record.restored[0].insert.contains(&own_id));
}

/// G13 bad input: a model that never stops calling promptd's tools is refused at
/// `max_tool_rounds`; a tool that answers 2 MiB at `max_tool_output_bytes`; one that answers
/// 100 MiB (dropped by the MCP client) or runs long at `tool_timeout_ms`; a round whose body
/// grows past `max_body_bytes` as a client's would: each in the provider's shape, naming the
/// tool,
/// every round recorded, and the daemon still serving.
#[test]
fn g13_bad_input_a_loop_a_huge_output_a_slow_tool_are_refused_naming_the_tool() {
    let stub = Stub::start();
    let (python_bin, script) = fixture_server("fixture_server.py");
    let mcp = format!(
        "{}[mcp.bounds]\ncommand = {python_bin:?}\nargs = [{script:?}, \"bounds\"]\ntool_prefix = \"b_\"\n",
        time_config("clock", "clock_")
    );
    let agent = "max_tool_rounds = 3\ntool_timeout_ms = 2000\n";
    // A client's body and each round's are bounded alike.
    let rest = format!("{mcp}\n[agents.coder.gateway]\n{agent}\n");
    let (served, _tmp) = serve(&Folder::new(), &stub.url, "max_body_bytes = 4096", &rest);
    for id in ["mcp:clock", "mcp:bounds"] {
        wait_state(&served, id, "loaded");
    }
    let path = "/gateway/coder/v1/messages";
    let body = |choice: &str| {
        format!(
            r#"{{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{{"role":"user","content":"go {choice}"}}],"tool_choice":{{"type":"tool","name":"{choice}"}}}}"#
        )
    };

    // A loop that never ends: 3 rounds run, the 4th reply refused.
    let (head, answer) = raw_post(
        &served.url,
        path,
        &[("x-stub-fault", "tool-loop")],
        body("clock_get_current_time").as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("own_tool_rounds"));
    let message = parse(&answer)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("clock_get_current_time") && message.contains("max_tool_rounds = 3"),
        "{message}"
    );
    assert_eq!(stub.requests().len(), 4, "rounds 0–3 went upstream");
    let events = newest_session(&served);
    assert_eq!(
        records(&events).len(),
        4,
        "every round's request is in the log"
    );
    let replies = events
        .iter()
        .filter(|e| e["kind"] == "assistant/message")
        .count();
    assert_eq!(replies, 4, "and every reply");
    assert_eq!(tool_results(&events).len(), 3, "and every result run");

    // A tool that answers 2 MiB: refused at max_tool_output_bytes, its call closed in the log
    // with why.
    let (head, answer) = raw_post(&served.url, path, &[], body("b_big").as_bytes());
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("own_tool_output"));
    let message = parse(&answer)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("b_big")
            && message.contains(&format!("{} bytes", 2 << 20))
            && message.contains("max_tool_output_bytes = 1048576"),
        "{message}"
    );
    let results = tool_results(&newest_session(&served));
    assert_eq!(results.len(), 1);
    assert!(
        results[0].2 && results[0].1.contains("max_tool_output_bytes"),
        "{results:?}"
    );

    // A round whose body, with a result, passes max_body_bytes.
    let (head, answer) = raw_post(&served.url, path, &[], body("b_medium").as_bytes());
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert_eq!(header_of(&head, "x-promptd-error"), Some("body_too_large"));
    let message = parse(&answer)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("b_medium") && message.contains("max_body_bytes"),
        "{message}"
    );

    // A tool that answers 100 MiB over stdio: the MCP client drops a message that long, so no
    // answer comes; refused at tool_timeout_ms, saying so, and the daemon's memory never holds
    // it. (Last but the slow one: the server's next answer waits behind those bytes.)
    let (head, answer) = raw_post(&served.url, path, &[], body("b_huge").as_bytes());
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("own_tool_timeout")
    );
    let message = parse(&answer)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("b_huge")
            && message.contains("tool_timeout_ms = 2000")
            && message.contains("over 16 MiB"),
        "{message}"
    );
    let results = tool_results(&newest_session(&served));
    assert!(
        results.len() == 1 && results[0].2,
        "its call closed: {results:?}"
    );

    // A token count counts promptd's tools as a step sends them.
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages/count_tokens",
        &[],
        br#"{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(header_of(&head, "x-promptd-degraded"), None, "{head}");
    let counted = parse(&stub.requests().last().unwrap().2);
    let names: Vec<&str> = (counted["tools"].as_array().unwrap().iter())
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "b_big",
            "b_huge",
            "b_medium",
            "b_slow",
            "clock_convert_time",
            "clock_get_current_time"
        ]
    );

    // A tool past tool_timeout_ms.
    let (head, answer) = raw_post(&served.url, path, &[], body("b_slow").as_bytes());
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("own_tool_timeout")
    );
    let message = parse(&answer)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("b_slow") && message.contains("tool_timeout_ms = 2000"),
        "{message}"
    );

    // Still serving: a request whose model calls nothing is answered.
    let (head, answer) = raw_post(
        &served.url,
        path,
        &[],
        br#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"none"}}"#,
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(parse(&answer)["stop_reason"], "end_turn");
}

/// G13, G5: the mixed reply streamed: the Chat Completions client is shown the round's frames
/// without promptd's call (the indexes after it renumbered, the usage it did not ask for left
/// out), and its next request gets promptd's call and result back at their place.
#[test]
fn g13_g5_a_mixed_streamed_reply_shows_the_client_its_calls_frames_only() {
    let stub = Stub::start();
    let (served, _tmp) = daemon(&stub, &time_config("time", "time_"), "", &["mcp:time"]);
    let Mixed {
        out,
        received,
        records,
        ..
    } = mixed_loop(&stub, &served, "openai-chat", true);
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(
        calls.len(),
        2,
        "the client folded its own two calls only: {out}"
    );
    assert!(
        out["usage"].as_array().unwrap().iter().all(Value::is_null),
        "no usage shown to a client that did not ask: {out}"
    );
    let last = parse(&received[3]);
    let messages = last["messages"].as_array().unwrap();
    let n = messages.len();
    let names: Vec<&str> = (messages[n - 3]["tool_calls"].as_array().unwrap().iter())
        .map(|c| c["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", "time_convert_time"]);
    assert_eq!(messages[n - 1]["tool_call_id"], calls[1]);
    assert_eq!(records[3].restored.len(), 2, "{:?}", records[3].restored);
    let own = messages[n - 2]["tool_call_id"].as_str().unwrap();
    assert!(out["texts"][1].as_str().unwrap().contains(own), "{out}");
}

/// G13, G5: the mixed reply streamed to the anthropic SDK: the content block frames of
/// promptd's call are taken out (the SDK's own stream helper folds the rest), its thinking
/// blocks come back unchanged, and the next request gets promptd's `tool_use` back in the
/// reply at its index and its `tool_result` first in the next turn.
#[test]
fn g13_g5_a_mixed_streamed_messages_reply_folds_without_promptds_block() {
    let stub = Stub::start();
    let (served, _tmp) = daemon(&stub, &time_config("time", "time_"), "", &["mcp:time"]);
    let Mixed { out, received, .. } = mixed_loop(&stub, &served, "anthropic", true);
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{out}");
    let last = parse(&received[3]);
    let messages = last["messages"].as_array().unwrap();
    let n = messages.len();
    let uses: Vec<&str> = (messages[n - 2]["content"].as_array().unwrap().iter())
        .filter(|b| b["type"] == "tool_use")
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(uses, ["read_file", "time_convert_time"]);
    let results = messages[n - 1]["content"].as_array().unwrap();
    assert_eq!(results[1]["tool_use_id"], calls[1]);
    assert!(out["texts"][1]
        .as_str()
        .unwrap()
        .contains(results[0]["tool_use_id"].as_str().unwrap()));
}

/// G13, G9: on Bedrock Converse (boto3, unstreamed), promptd runs the model's calls to
/// `mcp-server-time`'s tools, each round re-signed and recorded, and puts its rounds back into
/// the client's next body byte for byte.
#[test]
fn g13_g9_bedrock_converse_runs_promptds_tools_and_puts_its_rounds_back() {
    let stub = Stub::start();
    let config = format!(
        "[gateway]\nenabled = true\n[gateway.upstream.aws]\nprovider = \"bedrock\"\nbase_url = \"{}\"\naws_access_key_id_env = \"PROMPTD_TEST_AWS_KEY_ID\"\naws_secret_access_key_env = \"PROMPTD_TEST_AWS_SECRET\"\naws_region = \"us-west-2\"\n{}\n[agents.coder.gateway]\n",
        stub.url,
        time_config("clock", "clock_")
    );
    let folder = Folder::new();
    let config = folder.config(&config);
    let (tmp, state) = common::daemon::state_dir();
    let env = [
        ("PROMPTD_TEST_AWS_KEY_ID", "AKIDGATEWAYEXAMPLE"),
        ("PROMPTD_TEST_AWS_SECRET", "gateway/secret+EXAMPLEKEY"),
    ];
    let log = tmp.path().join("daemon.log");
    let served = Served::start_logged_with_env(folder.path(), &config, &state, &env, &log);
    wait_state(&served, "mcp:clock", "loaded");
    let out = sdk_loop(&served, "bedrock", 2, false);
    assert_eq!(out["requests"], 2, "one reply per client request: {out}");
    assert_eq!(out["calls"], json!([]), "the client saw no call: {out}");
    let received: Vec<Vec<u8>> = stub.requests().into_iter().map(|r| r.2).collect();
    assert_eq!(received.len(), 4, "two rounds per client request");
    let events = newest_session(&served);
    let records = records(&events);
    assert_eq!(
        records.iter().map(|r| r.round).collect::<Vec<_>>(),
        vec![0, 1, 0, 1]
    );
    bodies_rebuild(&records, &received);
    let end = end_of_last_message(&received[1]);
    assert_eq!(
        String::from_utf8_lossy(&received[2][..end]),
        String::from_utf8_lossy(&received[1][..end]),
        "the upstream's conversation is byte-stable across the client's requests"
    );
    let tools = parse(&received[0])["toolConfig"]["tools"].clone();
    let names: Vec<&str> = (tools.as_array().unwrap().iter())
        .map(|t| t["toolSpec"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["clock_convert_time", "clock_get_current_time", "read_file"]
    );
    assert_eq!(tool_results(&events).len(), 3);

    // converse-stream: not covered yet, refused before anything goes upstream, naming the
    // tools and the endpoint.
    let before = stub.requests().len();
    let (head, answer) = raw_post(
        &served.url,
        "/gateway/coder/model/amazon.nova-lite-v1%3A0/converse-stream",
        &[],
        br#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#,
    );
    assert!(head.starts_with("HTTP/1.1 500"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        Some("gateway_plugin_tools")
    );
    let message = String::from_utf8_lossy(&answer);
    assert!(
        message.contains("clock_convert_time") && message.contains("ConverseStream"),
        "{message}"
    );
    assert_eq!(stub.requests().len(), before, "nothing went upstream");
}

/// The names of a Responses or Gemini body's `tools`, in order (Gemini's declarations
/// flattened).
fn names_of(tools: &Value) -> Vec<String> {
    (tools.as_array().unwrap().iter())
        .flat_map(|t| match t.get("functionDeclarations") {
            Some(d) => d.as_array().unwrap().clone(),
            None => vec![t.clone()],
        })
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// G13: on OpenAI Responses (the openai SDK's `responses.create`), a reply mixing a call to
/// `mcp-server-time`'s tool with the client's: promptd runs its own (the real server), the
/// client is shown its call only, and its next `input` goes upstream with promptd's call back
/// among the reply's items and its output right after them. promptd's tools go first, flat,
/// `strict` false. Streamed (G5), the client folds `response.completed` without promptd's
/// item. A request whose model calls only promptd's tool goes a round, and the client gets the
/// text after it (streamed: the final round's frames only).
#[test]
fn g13_g5_responses_a_mixed_reply_shows_the_client_its_call_and_puts_promptds_back() {
    responses_mixed(false);
    responses_mixed(true);
}

fn responses_mixed(stream: bool) {
    let stub = Stub::start();
    let (served, _tmp) = daemon(&stub, &time_config("time", "time_"), "", &["mcp:time"]);
    // read_file sorts first: in turn 1 the stub calls it alone; in turn 2 (its second round
    // of calls) read_file and time_convert_time in one reply.
    let Mixed {
        out,
        received,
        events,
        records,
    } = mixed_loop(&stub, &served, "openai-responses", stream);
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(
        calls.len(),
        2,
        "the client saw its own two calls only: {out}"
    );
    let tools = parse(&received[0])["tools"].clone();
    assert_eq!(
        names_of(&tools),
        ["time_convert_time", "time_get_current_time", "read_file"]
    );
    assert_eq!(tools[0]["strict"], json!(false), "{tools}");
    let own_id = own_call_answered(&events, calls, &out);
    // The last request: the client's input, promptd's call and output at their place.
    let last = parse(&received[3]);
    let input = last["input"].as_array().unwrap();
    let n = input.len();
    assert_eq!(input[n - 4]["name"], "read_file", "{last}");
    assert_eq!(input[n - 3]["name"], "time_convert_time");
    assert_eq!(input[n - 3]["call_id"], json!(own_id));
    assert_eq!(input[n - 2]["type"], "function_call_output");
    assert_eq!(input[n - 2]["call_id"], json!(own_id));
    assert_eq!(input[n - 1]["call_id"], calls[1]);
    assert_eq!(records[3].restored.len(), 2, "{:?}", records[3].restored);
    let client = client_sent(&records[3]);
    assert!(
        !client.contains(&own_id),
        "the client's own body lacks promptd's call: {client}"
    );

    // Only promptd's tool called (tool_choice names it): one round, then the text; streamed,
    // the client gets the final round's frames only.
    let before = stub.requests().len();
    let body = format!(
        r#"{{"model":"gpt-4.1","input":"What time is it?","stream":{stream},"tool_choice":{{"type":"function","name":"time_get_current_time"}}}}"#
    );
    let (head, answer) = raw_post(
        &served.url,
        "/gateway/coder/v1/responses",
        &[],
        body.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.contains("Read the results of call_"), "{answer}");
    assert!(
        !answer.contains("function_call"),
        "no round shown: {answer}"
    );
    let round = parse(&stub.requests()[before + 1].2);
    let input = round["input"].as_array().unwrap();
    assert_eq!(
        input[0],
        json!({"role": "user", "content": "What time is it?"})
    );
    assert_eq!(input[1]["name"], "time_get_current_time");
    assert_eq!(input[2]["type"], "function_call_output");
    assert_eq!(stub.requests().len(), before + 2);
}

/// G13: on Gemini (google-genai's `generate_content`), whose calls come without ids, a reply
/// mixing a call to `mcp-server-time`'s tool with the client's: promptd runs its own (its
/// result recorded under the name the log gave the call), the client is shown its call only,
/// and its next `contents` go upstream with promptd's call back among the reply's parts (the
/// thought signature as it came) and its function response first in the next content.
/// Streamed (`generate_content_stream`, G5), the chunk of promptd's call reaches the client
/// without it, and the call goes back after the client's among the pieces it folded. A request
/// whose model calls only promptd's tool goes a round, streamed and not.
#[test]
fn g13_g5_gemini_a_mixed_reply_shows_the_client_its_call_and_puts_promptds_back() {
    gemini_mixed(false);
    gemini_mixed(true);
}

fn gemini_mixed(stream: bool) {
    let stub = Stub::start();
    let mcp = format!(
        "[gateway.upstream.google]\nprovider = \"gemini\"\nbase_url = \"{}\"\n{}",
        stub.url,
        time_config("time", "time_")
    );
    let (served, _tmp) = daemon(&stub, &mcp, "", &["mcp:time"]);
    let Mixed {
        out,
        received,
        events,
        records,
    } = mixed_loop(&stub, &served, "gemini", stream);
    assert_eq!(
        out["calls"],
        json!(["read_file", "read_file"]),
        "the client saw its own calls only: {out}"
    );
    let tools = parse(&received[0])["tools"].clone();
    assert_eq!(
        names_of(&tools),
        ["time_convert_time", "time_get_current_time", "read_file"]
    );
    assert!(
        tools[0]["functionDeclarations"][0]["parametersJsonSchema"].is_object(),
        "{tools}"
    );
    let text = out["texts"][1].as_str().unwrap();
    assert!(
        text.contains("time_convert_time") && text.contains("read_file"),
        "the model read both results: {text}"
    );
    let last = parse(&received[3]);
    let contents = last["contents"].as_array().unwrap();
    let n = contents.len();
    let called: Vec<&str> = (contents[n - 2]["parts"].as_array().unwrap().iter())
        .filter_map(|p| p["functionCall"]["name"].as_str())
        .collect();
    assert_eq!(called, ["read_file", "time_convert_time"], "{last}");
    let answered: Vec<&str> = (contents[n - 1]["parts"].as_array().unwrap().iter())
        .filter_map(|p| p["functionResponse"]["name"].as_str())
        .collect();
    assert_eq!(answered, ["time_convert_time", "read_file"]);
    assert_eq!(records[3].restored.len(), 2, "{:?}", records[3].restored);
    let client = client_sent(&records[3]);
    assert!(
        !client.contains("time_convert_time"),
        "the client's own body lacks promptd's call: {client}"
    );
    // promptd's result is in the log under the id the log gave its call, and only once.
    let results = tool_results(&events);
    let own: Vec<_> = (results.iter())
        .filter(|(_, content, _)| !content.starts_with("contents of"))
        .collect();
    assert_eq!(own.len(), 1, "{results:?}");
    assert!(own[0].0.starts_with("call_"), "{results:?}");

    // Only promptd's tool called (the config allows it alone): one round, its content as it
    // came (the signature kept), then the text; the result is in the log once. Streamed, the
    // client gets the final round's chunks only.
    let before = stub.requests().len();
    let method = match stream {
        true => "streamGenerateContent?alt=sse",
        false => "generateContent",
    };
    let (head, answer) = raw_post(
        &served.url,
        &format!("/gateway/coder/v1beta/models/gemini-3-flash-preview:{method}"),
        &[],
        br#"{"contents":[{"role":"user","parts":[{"text":"What time is it?"}]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["time_get_current_time"]}}}"#,
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answer = String::from_utf8_lossy(&answer).to_string();
    // (A stream carries the text word by word.)
    assert!(answer.contains("time_get_current_time."), "{answer}");
    assert!(!answer.contains("functionCall"), "no round shown: {answer}");
    assert_eq!(stub.requests().len(), before + 2);
    let round = parse(&stub.requests()[before + 1].2);
    let contents = round["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3, "{round}");
    let call = &contents[1]["parts"][0];
    assert_eq!(call["functionCall"]["name"], "time_get_current_time");
    assert!(call["thoughtSignature"].is_string(), "{round}");
    let response = &contents[2]["parts"][0]["functionResponse"];
    assert_eq!(response["name"], "time_get_current_time", "{round}");
    assert!(response.get("id").is_none(), "the call had no id: {round}");
    let results = tool_results(&newest_session(&served));
    assert_eq!(
        results.len(),
        1,
        "recorded once, under the log's name: {results:?}"
    );
    assert!(results[0].0.starts_with("call_"), "{results:?}");
}
