//! The gateway's Bedrock ingress (docs/gateway.md): the pinned boto3 reaches `converse` and
//! `converse-stream` by its `endpoint_url` alone, in a tool-calling loop against the stub
//! upstream; every byte the stub received is the client's body plus the recorded splice; the
//! client's SigV4 signature never goes upstream — the gateway re-signs with its configured
//! credentials, or refuses.

use promptd_testkit as common;

use std::process::Command;
use std::time::Duration;

use common::daemon::{request, Served};
use common::{repo_root, Folder};
use promptd_core::gateway::eventstream::Decoder;
use promptd_core::gateway::record::JoinedBy;
use promptd_core::gateway::sigv4;
use promptd_core::gateway::Ingress;
use serde_json::Value;

use crate::gateway::{
    dechunk, header_of, newest_session, python, raw_post, records, without_insertions, Stub,
};

const LOOP_BOUND: Duration = Duration::from_secs(120);
const PERSONA: &str = "You are Ada's engineering side";
const KEY_ID: &str = "AKIDGATEWAYEXAMPLE";
const SECRET: &str = "gateway/secret+EXAMPLEKEY";
const SIGNED: &str = r#"
aws_access_key_id_env = "PROMPTD_TEST_AWS_KEY_ID"
aws_secret_access_key_env = "PROMPTD_TEST_AWS_SECRET"
aws_region = "us-west-2"
"#;
const ENV: [(&str, &str); 2] = [
    ("PROMPTD_TEST_AWS_KEY_ID", KEY_ID),
    ("PROMPTD_TEST_AWS_SECRET", SECRET),
];
const BODY: &str = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"system":[{"text":"mine"},{"cachePoint":{"type":"default"}}],"toolConfig":{"tools":[{"toolSpec":{"name":"read_file","inputSchema":{"json":{"type":"object","properties":{"path":{"type":"string"}}}}}}]}}"#;

/// A daemon whose agent `coder` is served by the gateway with sections and a runtime context
/// (the `cwd` fact), its Bedrock upstream the stub with `upstream_extra` in its table.
fn gateway(
    stub: &Stub,
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
[gateway.upstream.aws]
provider = "bedrock"
base_url = "{url}"
{upstream_extra}

[agents.coder.gateway]
"#,
        url = stub.url
    );
    let config = folder.config(&config);
    let (tmp, state) = common::daemon::state_dir();
    let log = tmp.path().join("daemon.log");
    let served = Served::start_logged_with_env(folder.path(), &config, &state, env, &log);
    (served, tmp, folder)
}

/// tests/sdk_loops/gateway_loop.py's boto3 loop against the gateway: its exit code, JSON line
/// and stderr.
fn bedrock_loop(served: &Served, stream: bool) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/sdk_loops/gateway_loop.py"))
        .arg("bedrock")
        .arg(format!("{}/gateway/coder", served.url))
        .args(["--header", "x-promptd-fact-cwd=/repo"]);
    if stream {
        cmd.arg("--stream");
    }
    common::process::run_bounded(cmd, LOOP_BOUND)
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    (headers.iter())
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// G1, G4, G5, G9 with boto3, streamed and not: the loop finishes; its requests are one
/// session; the stub received the client's body plus the recorded splice (the sections first
/// in `system`, the client's own block after them, the runtime context closing the last user
/// message); the request went signed by the gateway's credentials (the signature checks
/// against the bytes the stub received), never the client's; every reply is recorded with the
/// usage of its `metadata` event.
#[test]
fn g1_boto3_reaches_the_gateway_by_endpoint_url_alone_streamed_and_not() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, SIGNED, &ENV);
    let mut seen = 0;
    for stream in [false, true] {
        let what = format!("bedrock (stream {stream})");
        let (code, out, err) = bedrock_loop(&served, stream);
        assert_eq!(code, Some(0), "{what} failed:\n{err}\n{out}");
        let out: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(out["turns"], 2, "{what}: {out}");
        let requests = out["requests"].as_u64().unwrap() as usize;
        assert!(requests >= 4, "{what}: a tool round per turn: {out}");
        for usage in out["usage"].as_array().unwrap() {
            assert!(usage["inputTokens"].is_u64(), "{what}: {out}");
        }

        let newest = newest_session(&served);
        let records = records(&newest);
        assert_eq!(
            records.len(),
            requests,
            "{what}: one session holds every request"
        );
        assert_eq!(records[0].joined_by, JoinedBy::New, "{what}");
        let ingress = match stream {
            true => Ingress::ConverseStream,
            false => Ingress::Converse,
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

        let received = stub.requests();
        let mine = &received[seen..];
        seen = received.len();
        assert_eq!(
            mine.len(),
            requests,
            "{what}: the stub got each request once"
        );
        let method = if stream {
            "converse-stream"
        } else {
            "converse"
        };
        for (record, (path, headers, body)) in records.iter().zip(mine) {
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
            // boto3 percent-encodes the model id's `:`; it goes upstream as the client sent it.
            assert_eq!(
                path,
                &format!("/model/amazon.nova-lite-v1%3A0/{method}"),
                "{what}"
            );
            let v: Value = serde_json::from_slice(body).unwrap();
            let system = v["system"].as_array().unwrap();
            assert!(
                system[0]["text"].as_str().unwrap().contains(PERSONA),
                "{what}"
            );
            assert_eq!(
                system[1]["text"], "You are the client's own agent.",
                "{what}"
            );
            let last = v["messages"].as_array().unwrap().last().unwrap()["content"].clone();
            let closing = last.as_array().unwrap().last().unwrap()["text"].to_string();
            assert!(
                closing.contains("/repo"),
                "{what}: the runtime context closes: {last}"
            );

            // The gateway's signature, over what the stub received; the client's is gone.
            let authorization = header(headers, "authorization").expect("signed");
            assert!(
                authorization.contains(&format!("Credential={KEY_ID}/")),
                "{what}: {authorization}"
            );
            assert!(!authorization.contains("AKIDCLIENTEXAMPLE"), "{what}");
            assert!(
                authorization.contains("/us-west-2/bedrock/aws4_request"),
                "{what}"
            );
            let host = header(headers, "host").unwrap();
            let mut signed = vec![("host".to_string(), host.to_string())];
            if let Some(kind) = header(headers, "content-type") {
                signed.push(("content-type".into(), kind.to_string()));
            }
            let date = header(headers, "x-amz-date").unwrap();
            let expected = sigv4::sign(
                &sigv4::Request {
                    method: "POST",
                    path,
                    query: "",
                    headers: signed,
                    body,
                },
                &sigv4::Credentials {
                    access_key_id: KEY_ID.into(),
                    secret_access_key: SECRET.into(),
                    session_token: None,
                },
                "us-west-2",
                "bedrock",
                date,
            );
            assert_eq!(authorization, expected.authorization, "{what}");
            assert!(header(headers, "x-promptd-fact-cwd").is_none(), "{what}");
        }
    }
    let log = std::fs::read_to_string(_tmp.path().join("daemon.log")).unwrap_or_default();
    assert!(
        !log.contains(SECRET),
        "the secret never reaches the daemon's log"
    );
    // G8: neither credential, the client's nor the gateway's, is in the session log.
    let events = serde_json::to_string(&newest_session(&served)).unwrap();
    for secret in [SECRET, KEY_ID, "AKIDCLIENTEXAMPLE", "client-secret-example"] {
        assert!(!events.contains(secret), "{secret} in the log");
    }
}

/// G9: with no credentials to re-sign with, a Bedrock request is refused before anything is
/// recorded or sent, in Bedrock's error shape, naming the keys to set; boto3 raises it as the
/// `AccessDeniedException` it is.
#[test]
fn g9_without_credentials_a_signed_request_is_refused_never_forwarded() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "", &[]);
    let (head, body) = raw_post(
        &served.url,
        "/gateway/coder/model/amazon.nova-lite-v1%3A0/converse",
        &[("authorization", "AWS4-HMAC-SHA256 Credential=AKIDCLIENT/x")],
        BODY.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert_eq!(
        header_of(&head, "x-amzn-errortype"),
        Some("AccessDeniedException"),
        "{head}"
    );
    let v: Value = serde_json::from_slice(&body_of(&head, &body)).unwrap();
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("aws_access_key_id_env"), "{message}");
    assert!(message.contains("never forwarded"), "{message}");
    assert!(stub.requests().is_empty(), "nothing reached the upstream");
    assert!(served.ok("GET", "/v1/sessions", None)["sessions"]
        .as_array()
        .unwrap()
        .is_empty());

    let (code, _, err) = bedrock_loop(&served, false);
    assert_eq!(code, Some(1));
    assert!(err.contains("AccessDeniedException"), "{err}");
}

/// G1: a body Converse cannot take gets Bedrock's own error shape (`{"message"}` and
/// `x-amzn-ErrorType: ValidationException`), naming the cause.
#[test]
fn g1_a_bad_body_gets_bedrocks_error_shape() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, SIGNED, &ENV);
    for (body, says) in [
        (r#"{"messages":3}"#, "`messages` must be an array"),
        (
            r#"{"messages":[],"system":"x"}"#,
            "`system` must be an array",
        ),
        ("not json", "invalid request body"),
    ] {
        let (head, got) = raw_post(
            &served.url,
            "/gateway/coder/model/amazon.nova-lite-v1%3A0/converse",
            &[],
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 400"), "{body}: {head}");
        assert_eq!(
            header_of(&head, "x-amzn-errortype"),
            Some("ValidationException")
        );
        let v: Value = serde_json::from_slice(&body_of(&head, &got)).unwrap();
        assert!(v["message"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    // A Bedrock method the gateway does not serve: 404 in the same shape.
    let (head, got) = raw_post(
        &served.url,
        "/gateway/coder/model/amazon.nova-lite-v1%3A0/invoke",
        &[],
        b"{}",
    );
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert_eq!(
        header_of(&head, "x-amzn-errortype"),
        Some("ResourceNotFoundException")
    );
    let v: Value = serde_json::from_slice(&body_of(&head, &got)).unwrap();
    assert!(
        v["message"].as_str().unwrap().contains("is not served"),
        "{v}"
    );
    assert!(stub.requests().is_empty());
}

/// A reply's body: dechunked when it came chunked.
fn body_of(head: &str, body: &[u8]) -> Vec<u8> {
    match header_of(head, "transfer-encoding") {
        Some(te) if te.eq_ignore_ascii_case("chunked") => dechunk(body),
        _ => body.to_vec(),
    }
}

/// The newest session's recorded reply, once it is recorded (off the answer's path).
fn recorded_reply(served: &Served) -> Value {
    for _ in 0..50 {
        let events = newest_session(served);
        let reply = (events.iter().rev()).find(|e| e["kind"] == "assistant/message");
        if let Some(reply) = reply {
            return reply.clone();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no reply recorded within 5 s")
}

fn stream_frames(body: &[u8]) -> Vec<Vec<u8>> {
    let mut decoder = Decoder::default();
    let frames = decoder.push(&dechunk(body)).expect("a valid event stream");
    assert!(decoder.rest().is_empty());
    frames.into_iter().map(|f| f.raw).collect()
}

/// G5: a converse-stream reply reaches the client frame by frame as the upstream sent it, each
/// frame's CRCs checked; the recorded reply is the Converse reply the frames stand for, its
/// usage the `metadata` event's.
#[test]
fn g5_a_converse_stream_is_teed_and_recorded_with_usage_from_metadata() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, SIGNED, &ENV);
    let path = "/model/amazon.nova-lite-v1%3A0/converse-stream";
    let (head, got) = raw_post(
        &served.url,
        &format!("/gateway/coder{path}"),
        &[],
        BODY.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(header_of(&head, "server-timing").is_some(), "{head}");
    let got = stream_frames(&got);
    assert!(got.len() > 5, "{got:?}");

    let events = newest_session(&served);
    let record = records(&events).pop().expect("a gateway/request");
    let reply = (events.iter().rev())
        .find(|e| e["kind"] == "assistant/message")
        .expect("a recorded reply")
        .clone();
    assert!(reply["body"]["partial"].is_null(), "{reply}");
    assert!(reply["body"]["usage"]["input_tokens"].is_u64(), "{reply}");
    assert_eq!(
        reply["body"]["tool_calls"][0]["name"], "read_file",
        "{reply}"
    );
    // The usage is the metadata event's (the last frame).
    let mut decoder = Decoder::default();
    let last = decoder.push(got.last().unwrap()).unwrap().remove(0);
    assert_eq!(last.header(":event-type"), Some("metadata"));
    let metadata: Value = serde_json::from_slice(&last.payload).unwrap();
    let usage = &metadata["usage"];
    assert_eq!(
        reply["body"]["usage"]["output_tokens"], usage["outputTokens"],
        "{reply}"
    );
    let input = usage["inputTokens"].as_u64().unwrap()
        + usage["cacheReadInputTokens"].as_u64().unwrap_or(0)
        + usage["cacheWriteInputTokens"].as_u64().unwrap_or(0);
    assert_eq!(reply["body"]["usage"]["input_tokens"], input, "{reply}");

    request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
    let (head, direct) = raw_post(&stub.url, path, &[], &record.upstream_body());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        got,
        stream_frames(&direct),
        "the client got the upstream's frames"
    );
}

/// G5: a frame whose CRC does not match its bytes ends the stream there: the client gets the
/// frames before it and never the bad one, and the reply is recorded partial, naming the CRC.
#[test]
fn g5_a_frame_with_a_bad_crc_is_refused_and_recorded_partial_naming_it() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, SIGNED, &ENV);
    let (head, got) = raw_post(
        &served.url,
        "/gateway/coder/model/amazon.nova-lite-v1%3A0/converse-stream",
        &[("x-stub-fault", "invalid-sse")],
        BODY.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let frames = stream_frames(&got);
    assert_eq!(
        frames.len(),
        4,
        "the frames before the bad one, which never went"
    );
    let reply = recorded_reply(&served);
    let partial = reply["body"]["partial"].as_str().unwrap_or_default();
    assert!(partial.contains("message CRC32"), "{reply}");
    assert!(partial.contains("event-stream frame 4"), "{reply}");
}

/// G1: a model id with an encoded `/` (an inference profile's ARN) reaches the gateway's
/// Bedrock route and goes upstream exactly as the client encoded it.
#[test]
fn g1_an_arn_model_id_goes_upstream_as_the_client_encoded_it() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, SIGNED, &ENV);
    let path = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.amazon.nova-lite-v1%3A0/converse";
    let (head, _) = raw_post(
        &served.url,
        &format!("/gateway/coder{path}"),
        &[],
        BODY.as_bytes(),
    );
    assert!(!head.contains("gateway_path"), "{head}");
    let received = stub.requests();
    assert_eq!(received.len(), 1, "{head}");
    assert_eq!(received[0].0, path);
}

/// G5: an upstream stream that ends inside a frame gives the client the whole frames before it
/// (never the half frame) and is recorded partial, never complete.
#[test]
fn g5_a_converse_stream_cut_inside_a_frame_is_recorded_partial() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, SIGNED, &ENV);
    let (head, got) = raw_post(
        &served.url,
        "/gateway/coder/model/amazon.nova-lite-v1%3A0/converse-stream",
        &[("x-stub-fault", "midstream-error")],
        BODY.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut decoder = Decoder::default();
    let frames = decoder.push(&dechunk(&got)).expect("whole frames only");
    assert_eq!(frames.len(), 4, "the frames before the cut one");
    assert!(decoder.rest().is_empty(), "no byte of the cut frame");
    let reply = recorded_reply(&served);
    let partial = reply["body"]["partial"].as_str().unwrap_or_default();
    assert!(partial.contains("the upstream's stream broke"), "{reply}");
}
