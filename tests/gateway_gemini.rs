//! The gateway's Gemini ingress (docs/gateway.md): the pinned google-genai reaches
//! `generateContent` and `streamGenerateContent?alt=sse` by its `http_options.base_url` alone, in
//! a tool-calling loop against the stub upstream (which checks Gemini 3's thought signatures),
//! and every byte the stub received is the client's body plus the recorded splice.

use promptd_testkit as common;

use std::process::Command;
use std::time::Duration;

use common::daemon::{request, Served};
use common::{repo_root, Folder};
use promptd_core::gateway::record::{GatewayRecord, JoinedBy};
use promptd_core::gateway::splice::Part;
use promptd_core::gateway::Ingress;
use serde_json::{json, Value};

use crate::gateway::{
    dechunk, header_of, newest_session, python, raw_post, records, without_insertions, Stub,
};

const LOOP_BOUND: Duration = Duration::from_secs(120);
const PERSONA: &str = "You are Ada's engineering side";
const FLASH: &str = "gemini-3-flash-preview";

/// A daemon whose agent `coder` is served by the gateway with sections and a runtime context
/// (the `cwd` fact), its Gemini upstream the stub.
fn gateway(
    stub: &Stub,
    extra: &str,
    upstream_extra: &str,
    env: &[(&str, &str)],
) -> (Served, tempfile::TempDir, Folder) {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("workspace");
    let config = format!(
        r#"
[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.persona]
config = {{ text = "You are {{{{agent_name}}}}'s {{{{role}}}} side.", role = "engineering" }}

[gateway]
enabled = true
[gateway.upstream.google]
provider = "gemini"
base_url = "{url}"
{upstream_extra}

[agents.coder.gateway]
{extra}
"#,
        url = stub.url
    );
    let config = folder.config(&config);
    let (tmp, state) = common::daemon::state_dir();
    let log = tmp.path().join("daemon.log");
    let served = Served::start_logged_with_env(folder.path(), &config, &state, env, &log);
    (served, tmp, folder)
}

/// tests/sdk_loops/gateway_loop.py's Gemini loop against the gateway; its JSON line.
fn gemini_loop(served: &Served, stream: bool, extra: &[&str]) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/sdk_loops/gateway_loop.py"))
        .arg("gemini")
        .arg(format!("{}/gateway/coder", served.url))
        .args(extra);
    if stream {
        cmd.arg("--stream");
    }
    let (code, out, err) = common::process::run_bounded(cmd, LOOP_BOUND);
    assert_eq!(
        code,
        Some(0),
        "gemini (stream {stream}) failed:\n{err}\n{out}"
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Where the runtime context went in the upstream body: the bytes before it are what the next
/// step must start with (the cached prefix).
fn context_at(record: &GatewayRecord) -> Option<usize> {
    let mut shift = 0;
    for edit in &record.splice.edits {
        if edit.part == Part::RuntimeContext {
            return Some(edit.at + shift);
        }
        shift += edit.insert.len();
    }
    None
}

/// G1–G5 with google-genai, streamed and not, on the path version the SDK sends by default
/// (`/v1/`) and on `/v1beta/`: the loop finishes (the stub refused nothing: signatures came
/// back byte for byte); all its requests are one session joined by prefix; the stub received
/// exactly the client's body plus the recorded splice, sections in `systemInstruction`, the
/// runtime context closing the last user content, the client's key header and its own headers
/// passed on, promptd's not; every reply is recorded with its usage; each step's upstream body
/// starts with the previous one up to where its runtime context went (the prefix is kept).
#[test]
fn g1_google_genai_reaches_the_gateway_by_base_url_alone_streamed_and_not() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "", "", &[]);
    let mut seen = 0;
    for (stream, version) in [(false, "v1"), (true, "v1"), (true, "v1beta")] {
        let what = format!("gemini (stream {stream}, {version})");
        let mut extra = vec![
            "--header",
            "x-promptd-fact-cwd=/repo",
            "--header",
            "x-client-extra=kept",
        ];
        if version != "v1" {
            extra.extend(["--gemini-api-version", version]);
        }
        let out = gemini_loop(&served, stream, &extra);
        assert_eq!(out["turns"], 2, "{what}: {out}");
        let requests = out["requests"].as_u64().unwrap() as usize;
        assert!(requests >= 4, "{what}: a tool round per turn: {out}");
        for usage in out["usage"].as_array().unwrap() {
            assert!(usage["prompt_token_count"].is_u64(), "{what}: {out}");
        }

        let newest = newest_session(&served);
        let records = records(&newest);
        assert_eq!(
            records.len(),
            requests,
            "{what}: one session holds every request"
        );
        assert_eq!(records[0].joined_by, JoinedBy::New, "{what}");
        for r in &records[1..] {
            assert_eq!(r.joined_by, JoinedBy::Prefix, "{what}");
        }
        let ingress = match stream {
            true => Ingress::StreamGenerateContent,
            false => Ingress::GenerateContent,
        };
        assert!(records.iter().all(|r| r.ingress == ingress), "{what}");
        let replies: Vec<&Value> = (newest.iter())
            .filter(|e| e["kind"] == "assistant/message")
            .collect();
        assert_eq!(replies.len(), requests, "{what}: every reply recorded");
        for reply in &replies {
            assert!(
                reply["body"]["usage"]["input_tokens"].is_u64(),
                "{what}: {reply}"
            );
            assert!(reply["body"]["partial"].is_null(), "{what}: {reply}");
        }
        // Each tool result answered the call the log named: a session with no call left open.
        let tool_results = newest.iter().filter(|e| e["kind"] == "tool/result").count();
        assert_eq!(
            tool_results,
            out["calls"].as_array().unwrap().len(),
            "{what}: {newest:?}"
        );

        let received = stub.requests();
        let mine = &received[seen..];
        seen = received.len();
        assert_eq!(
            mine.len(),
            requests,
            "{what}: the stub got each request once"
        );
        let id = served.ok("GET", "/v1/sessions", None)["sessions"][0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let method = match stream {
            true => "streamGenerateContent?alt=sse",
            false => "generateContent",
        };
        for (n, (record, (path, headers, body))) in records.iter().zip(mine).enumerate() {
            let (status, text) = served.get(&format!("/v1/sessions/{id}/steps/{}/upstream", n + 1));
            assert_eq!(status, 200, "{what}: {text}");
            assert_eq!(text.as_bytes(), &body[..], "{what}: step {}", n + 1);
            assert_eq!(
                &record.upstream_body(),
                body,
                "{what}: rebuilds from the log"
            );
            assert_eq!(
                without_insertions(record, body),
                record.client_body.as_bytes(),
                "{what}: every other byte is the client's"
            );
            assert_eq!(
                path,
                &format!("/{version}/models/{FLASH}:{method}"),
                "{what}"
            );
            let v: Value = serde_json::from_slice(body).unwrap();
            let system = v["systemInstruction"]["parts"].to_string();
            assert!(system.contains(PERSONA), "{what}: {system}");
            assert!(
                system.contains("You are the client's own agent."),
                "{what}: {system}"
            );
            let last = &v["contents"].as_array().unwrap().last().unwrap()["parts"];
            let closing = last.as_array().unwrap().last().unwrap()["text"].to_string();
            assert!(
                closing.contains("/repo"),
                "{what}: the runtime context closes: {last}"
            );
            let header = |name: &str| {
                (headers.iter())
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(
                header("x-goog-api-key"),
                Some("client-key-gemini"),
                "{what}"
            );
            assert_eq!(header("x-client-extra"), Some("kept"), "{what}");
            assert!(
                !(headers.iter()).any(|(k, _)| k.to_ascii_lowercase().starts_with("x-promptd-")),
                "{what}: {headers:?}"
            );
        }
        for (n, pair) in mine.windows(2).enumerate() {
            let at = context_at(&records[n]).expect("a runtime context");
            assert!(
                pair[1].2.starts_with(&pair[0].2[..at]),
                "{what}: step {} does not start with step {}'s bytes",
                n + 2,
                n + 1
            );
        }
    }
}

/// `data:` frames of an event stream's body (dechunked), split at their CRLF blank lines.
fn frames(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(&dechunk(body)).to_string();
    text.split_inclusive("\r\n\r\n")
        .map(str::to_string)
        .collect()
}

/// G5: a Gemini stream reaches the client frame by frame as the upstream sent it, and the
/// recorded reply is the one `generateContent` gives for the same bytes; its usage is the last
/// chunk's cumulative `usageMetadata`, never the chunks' sum.
#[test]
fn g5_a_gemini_stream_is_recorded_as_the_unstreamed_reply_with_the_last_chunks_usage() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "", "", &[]);
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"read_file","parametersJsonSchema":{"type":"object","properties":{"path":{"type":"string"}}}}]}]}"#;
    for text in ["look", "answer"] {
        let body = match text {
            "look" => body.to_string(),
            // A function response: the reply is final text, its signature on the last piece.
            _ => body.replace(
                r#"[{"text":"hi"}]"#,
                r#"[{"text":"hi"}]},{"role":"model","parts":[{"functionCall":{"name":"read_file","args":{}},"thoughtSignature":"skip_thought_signature_validator"}]},{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"x"}}}]"#,
            ),
        };
        let path = format!("/v1beta/models/{FLASH}:streamGenerateContent?alt=sse");
        request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
        let (head, got) = raw_post(
            &served.url,
            &format!("/gateway/coder{path}"),
            &[("x-goog-api-key", "stream-key")],
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{text}: {head}");
        assert!(header_of(&head, "server-timing").is_some(), "{head}");
        let got = frames(&got);
        // A call comes whole in one chunk; a text word by word.
        let chunked = text == "answer";
        assert_eq!(got.len() > 1, chunked, "{text}: {got:?}");
        let events = newest_session(&served);
        let record = records(&events).pop().expect("a gateway/request");
        let reply = (events.iter().rev())
            .find(|e| e["kind"] == "assistant/message")
            .expect("a recorded reply")
            .clone();
        assert!(reply["body"]["partial"].is_null(), "{text}: {reply}");

        // The upstream's own frames for the same bytes.
        request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
        let upstream = record.upstream_body();
        let (head, direct) = raw_post(&stub.url, &path, &[], &upstream);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(
            got,
            frames(&direct),
            "{text}: the client got the upstream's frames"
        );

        // Cumulative usage: the last chunk's, which the chunks' sum is not.
        let chunks: Vec<Value> = (got.iter())
            .map(|f| serde_json::from_str(f.trim().trim_start_matches("data: ")).unwrap())
            .collect();
        let last = &chunks.last().unwrap()["usageMetadata"];
        let sum: u64 = (chunks.iter())
            .map(|c| c["usageMetadata"]["candidatesTokenCount"].as_u64().unwrap())
            .sum();
        let output = reply["body"]["usage"]["output_tokens"].as_u64().unwrap();
        assert_eq!(
            output,
            last["candidatesTokenCount"].as_u64().unwrap(),
            "{reply}"
        );
        if chunked {
            assert_ne!(output, sum, "{text}: more than one chunk counted output");
        }
        assert_eq!(
            reply["body"]["usage"]["input_tokens"],
            last["promptTokenCount"]
        );

        // The unstreamed call of the same bytes, read as promptd reads replies.
        request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
        let whole_path = format!("/v1beta/models/{FLASH}:generateContent");
        let (status, whole) = request(
            &stub.url,
            "POST",
            &whole_path,
            Some(std::str::from_utf8(&upstream).unwrap()),
            None,
        );
        assert_eq!(status, 200, "{whole}");
        let whole: Value = serde_json::from_str(&whole).unwrap();
        let (message, usage) = promptd_core::formats::replies::reply_with_usage(whole).unwrap();
        let mut recorded = reply["body"].clone();
        for key in ["usage", "cache", "partial"] {
            recorded.as_object_mut().unwrap().remove(key);
        }
        let mut expected = serde_json::to_value(&message).unwrap();
        // Calls without ids are named by the log, as the unstreamed reply's would be.
        if let (Some(a), Some(b)) = (recorded.get("tool_calls"), expected.get_mut("tool_calls")) {
            for (ours, theirs) in a.as_array().unwrap().iter().zip(b.as_array_mut().unwrap()) {
                theirs["id"] = ours["id"].clone();
            }
        }
        assert_eq!(
            recorded, expected,
            "{text}: the recorded reply is the unstreamed one"
        );
        assert_eq!(reply["body"]["usage"], serde_json::to_value(usage).unwrap());
    }
}

/// G1: what the gateway refuses itself on a Gemini path is answered in Google's error shape
/// (`{"error":{"code","message","status"}}`), naming the cause, with promptd's code in
/// `x-promptd-error`; the upstream's own refusal reaches the client as it sent it and the
/// reply is recorded missing with its status; G4: `deny_tools` takes a declaration out and
/// `defer_tools` says it has nothing to defer; G2: a configured key replaces the client's
/// `x-goog-api-key`.
#[test]
fn g1_bad_gemini_bodies_get_googles_error_shape_naming_the_cause() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(
        &stub,
        r#"deny_tools = ["shell"]
defer_tools = ["read_file"]"#,
        r#"api_key_env = "PROMPTD_TEST_GEMINI_KEY""#,
        &[("PROMPTD_TEST_GEMINI_KEY", "configured-gemini-key")],
    );
    let generate = format!("/gateway/coder/v1beta/models/{FLASH}:generateContent");
    let stream = format!("/gateway/coder/v1beta/models/{FLASH}:streamGenerateContent");
    let cases: [(&str, &[u8], u16, &str, &str); 5] = [
        (&generate, br#"{"contents":"hi"}"#, 400, "invalid_body", "`contents` must be an array"),
        (&generate, br#"{"contents":[}"#, 400, "invalid_body", "not a JSON object"),
        (
            &generate,
            br#"{"systemInstruction":"Be brief.","contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#,
            400,
            "invalid_body",
            "`systemInstruction` must be a Content object",
        ),
        (&stream, br#"{"contents":[]}"#, 400, "stream_not_sse", "add `?alt=sse`"),
        (
            "/gateway/coder/v1beta/models/m:countTokens",
            b"{}",
            404,
            "gateway_path",
            "is not served",
        ),
    ];
    for (path, body, status, code, says) in cases {
        let (head, got) = raw_post(&served.url, path, &[("x-goog-api-key", "k")], body);
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status}")),
            "{path}: {head}"
        );
        assert_eq!(
            header_of(&head, "x-promptd-error"),
            Some(code),
            "{path}: {head}"
        );
        let error: Value = serde_json::from_slice(&got).unwrap_or_else(|e| panic!("{e}: {got:?}"));
        assert_eq!(error["error"]["code"], status, "{path}: {error}");
        let google = if status == 400 {
            "INVALID_ARGUMENT"
        } else {
            "NOT_FOUND"
        };
        assert_eq!(error["error"]["status"], google, "{path}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
    }

    // The upstream's own 400 (a role Gemini does not know) as it sent it; the reply missing.
    let bad_role = br#"{"contents":[{"role":"system","parts":[{"text":"hi"}]}]}"#;
    let (head, got) = raw_post(&served.url, &generate, &[("x-goog-api-key", "k")], bad_role);
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert_eq!(
        header_of(&head, "x-promptd-error"),
        None,
        "the upstream's, not promptd's"
    );
    let error: Value = serde_json::from_slice(&got).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[gemini.role]"),
        "{error}"
    );
    let events = newest_session(&served);
    let reply = (events.iter().rev())
        .find(|e| e["kind"] == "assistant/message")
        .unwrap();
    assert_eq!(
        reply["body"]["partial"], "the upstream answered 400 (INVALID_ARGUMENT)",
        "{reply}"
    );

    // deny_tools and defer_tools on Gemini, and the configured key upstream.
    request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
    let tools = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"shell","parametersJsonSchema":{"type":"object"}},{"name":"read_file","parametersJsonSchema":{"type":"object"}}]}]}"#;
    let (head, _) = raw_post(
        &served.url,
        &generate,
        &[("x-goog-api-key", "client-key")],
        tools.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let events = newest_session(&served);
    let record = records(&events).pop().unwrap();
    assert_eq!(record.splice.denied, ["shell"]);
    assert_eq!(
        record.splice.skipped,
        ["defer_tools: Gemini has no deferred loading, so these stay loaded: read_file"]
    );
    let (_, headers, body) = stub.requests().pop().unwrap();
    let sent: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        sent["tools"],
        json!([{"functionDeclarations":[{"name":"read_file","parametersJsonSchema":{"type":"object"}}]}])
    );
    let keys: Vec<&str> = (headers.iter())
        .filter(|(k, _)| k.eq_ignore_ascii_case("x-goog-api-key"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(keys, ["configured-gemini-key"]);
    // G8: neither key is in the session's log.
    let log = newest_session(&served);
    let text = serde_json::to_string(&log).unwrap();
    assert!(!text.contains("configured-gemini-key") && !text.contains("client-key"));
    assert_eq!(served.health()["status"], "ok");
}

/// G5: a Gemini stream the upstream cuts before a chunk with `finishReason` (there is no end
/// event) reaches the client as far as it came and is recorded partial, with why, the text as
/// far as it came kept.
#[test]
fn g5_a_gemini_stream_cut_before_its_finish_reason_is_recorded_partial() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "", "", &[]);
    // A function response: the reply is final text, word by word, more than the stub's four
    // frames before the cut.
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]},{"role":"model","parts":[{"functionCall":{"name":"read_file","args":{}},"thoughtSignature":"skip_thought_signature_validator"}]},{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"x"}}}]}],"tools":[{"functionDeclarations":[{"name":"read_file","parametersJsonSchema":{"type":"object"}}]}]}"#;
    let path = format!("/gateway/coder/v1beta/models/{FLASH}:streamGenerateContent?alt=sse");
    for (fault, says) in [
        ("midstream-error", "stream"),
        ("invalid-sse", "no server-sent event field"),
    ] {
        let (head, got) = raw_post(
            &served.url,
            &path,
            &[("x-stub-fault", fault)],
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{fault}: {head}");
        let got = String::from_utf8_lossy(&dechunk(&got)).to_string();
        assert_eq!(got.matches("data: ").count(), 4, "{fault}: {got}");
        assert!(!got.contains("finishReason"), "{fault}: {got}");
        let events = newest_session(&served);
        let reply = (events.iter().rev())
            .find(|e| e["kind"] == "assistant/message")
            .unwrap_or_else(|| panic!("{fault}: no reply recorded: {events:?}"));
        let partial = reply["body"]["partial"]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}"));
        assert!(partial.contains(says), "{fault}: {partial}");
        let text = reply["body"]["content"].as_str().unwrap();
        assert_eq!(
            text, "Read the results of",
            "{fault}: four words came: {reply}"
        );
    }
    assert_eq!(served.health()["status"], "ok");
}

/// G4's cache rule on Gemini (implicit caching): the sections are the same bytes at every
/// step, so the next step of a conversation whose system text passes the model's minimum reads
/// that prefix from the stub's cache, and the recorded reply carries the read.
#[test]
fn g4_a_gemini_conversation_reads_its_stable_prefix_from_the_cache() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "", "", &[]);
    let long = "You are the client's own agent. ".repeat(200); // over 1,024 tokens
    let path = format!("/gateway/coder/v1beta/models/{FLASH}:generateContent");
    let tools = r#"[{"functionDeclarations":[{"name":"read_file","parametersJsonSchema":{"type":"object"}}]}]"#;
    let user = r#"{"role":"user","parts":[{"text":"Read a file."}]}"#;
    let post = |contents: &str| -> Value {
        let body = format!(
            r#"{{"systemInstruction":{{"parts":[{{"text":"{long}"}}]}},"contents":[{contents}],"tools":{tools}}}"#
        );
        let (head, got) = raw_post(
            &served.url,
            &path,
            &[("x-promptd-fact-cwd", "/repo")],
            body.as_bytes(),
        );
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{head}: {}",
            String::from_utf8_lossy(&got)
        );
        serde_json::from_slice(&got).unwrap()
    };
    let first = post(user);
    assert!(
        first["usageMetadata"]["cachedContentTokenCount"].is_null(),
        "{first}"
    );
    let call = first["candidates"][0]["content"].to_string();
    let answer = r#"{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"x"}}}]}"#;
    let second = post(&format!("{user},{call},{answer}"));
    let read = second["usageMetadata"]["cachedContentTokenCount"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        read >= 1024,
        "the second step reads the first one's prefix: {second}"
    );
    let events = newest_session(&served);
    assert_eq!(records(&events).len(), 2, "one session: {events:?}");
    let reply = (events.iter().rev())
        .find(|e| e["kind"] == "assistant/message")
        .unwrap();
    assert_eq!(reply["body"]["usage"]["cached_tokens"], read, "{reply}");
}
