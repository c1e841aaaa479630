//! The gateway (docs/gateway.md): the official SDKs reach promptd by their base URL alone, in
//! tool-calling loops, streamed and not, against the local stub upstream
//! (`tests/sdk_loops/stub_provider.py`), and everything promptd knows applies to what they sent.
//! Each check compares bytes: what the stub received against the client's body plus the
//! recorded splice, what the client received against what the stub sent.

use promptd_testkit as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::daemon::{request, Served};
use common::process::Bounded;
use common::{repo_root, Folder};
use promptd_core::gateway::record::{GatewayRecord, JoinedBy};
use serde_json::Value;

const LOOP_BOUND: Duration = Duration::from_secs(120);
const PERSONA: &str = "You are Ada's engineering side";

pub(crate) fn python() -> PathBuf {
    let python = repo_root().join("tests/sdk_loops/.venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: `cargo xtask test` installs the provider SDKs (tests/sdk_loops/install.sh)",
        python.display()
    );
    python
}

/// A request the stub received: its path, headers and body bytes.
pub(crate) type Received = (String, Vec<(String, String)>, Vec<u8>);

/// The stub upstream on a free loopback port.
pub(crate) struct Stub {
    _child: Bounded,
    pub(crate) url: String,
}

impl Stub {
    pub(crate) fn start() -> Stub {
        let (child, url) = common::process::start_stub_provider(&python(), "900", None);
        Stub { _child: child, url }
    }

    /// The requests it received, in order.
    pub(crate) fn requests(&self) -> Vec<Received> {
        let (status, text) = request(&self.url, "GET", "/stub/requests", None, None);
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let headers = r["headers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| {
                        (
                            h[0].as_str().unwrap().to_string(),
                            h[1].as_str().unwrap().to_string(),
                        )
                    })
                    .collect();
                (
                    r["path"].as_str().unwrap().to_string(),
                    headers,
                    base64(r["body_b64"].as_str().unwrap()),
                )
            })
            .collect()
    }
}

fn base64(text: &str) -> Vec<u8> {
    let out = Command::new(python())
        .args([
            "-c",
            "import base64,sys; sys.stdout.buffer.write(base64.b64decode(sys.argv[1]))",
            text,
        ])
        .output()
        .expect("python");
    out.stdout
}

/// A daemon whose agent `coder` is served by the gateway, with sections (identity, persona)
/// and a runtime context (workspace, from the `cwd` fact), forwarding to `stub`.
fn gateway(stub: &Stub, extra: &str) -> (Served, tempfile::TempDir, Folder) {
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
[gateway.upstream.openai]
provider = "openai"
base_url = "{url}"
[gateway.upstream.anthropic]
provider = "anthropic"
base_url = "{url}"

[agents.coder.gateway]
{extra}
"#,
        url = stub.url
    );
    let config = folder.config(&config);
    let (tmp, state) = common::daemon::state_dir();
    let log = tmp.path().join("daemon.log");
    let served = Served::start_logged(folder.path(), &config, &state, &log);
    (served, tmp, folder)
}

/// `node`, with the pinned `openai` and `@anthropic-ai/sdk` npm packages next to the scripts.
fn node() -> Command {
    for package in ["openai", "@anthropic-ai/sdk"] {
        let dir = repo_root()
            .join("tests/sdk_loops/js/node_modules")
            .join(package);
        assert!(
            dir.join("package.json").is_file(),
            "{} is missing: `cargo xtask test` installs the provider SDKs (tests/sdk_loops/install.sh)",
            dir.display()
        );
    }
    Command::new("node")
}

/// Which official SDKs a gateway loop runs on: the Python packages or the npm ones.
#[derive(Clone, Copy, Debug)]
enum Runtime {
    /// tests/sdk_loops/gateway_loop.py
    Python,
    /// tests/sdk_loops/js/gateway_loop.mjs
    Node,
}

impl Runtime {
    /// The command running this runtime's gateway loop (its arguments follow).
    fn command(self) -> Command {
        match self {
            Runtime::Python => {
                let mut cmd = Command::new(python());
                cmd.arg(repo_root().join("tests/sdk_loops/gateway_loop.py"));
                cmd
            }
            Runtime::Node => {
                let mut cmd = node();
                cmd.arg(repo_root().join("tests/sdk_loops/js/gateway_loop.mjs"));
                cmd
            }
        }
    }
}

/// Runs `runtime`'s gateway loop (tests/sdk_loops/gateway_loop.py or js/gateway_loop.mjs);
/// returns its JSON line.
fn sdk_loop(served: &Served, runtime: Runtime, sdk: &str, stream: bool, extra: &[&str]) -> Value {
    let mut cmd = runtime.command();
    cmd.arg(sdk)
        .arg(format!("{}/gateway/coder", served.url))
        .args(extra);
    if stream {
        cmd.arg("--stream");
    }
    let (code, out, err) = common::process::run_bounded(cmd, LOOP_BOUND);
    assert_eq!(
        code,
        Some(0),
        "{runtime:?} {sdk} (stream {stream}) failed:\n{err}\n{out}"
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Every session's events, by session.
pub(crate) fn sessions(served: &Served) -> Vec<Vec<Value>> {
    let list = served.ok("GET", "/v1/sessions", None);
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let id = s["id"].as_str().unwrap();
            served.ok("GET", &format!("/v1/sessions/{id}/events"), None)["events"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect()
}

pub(crate) fn records(events: &[Value]) -> Vec<GatewayRecord> {
    events
        .iter()
        .filter(|e| e["kind"] == "gateway/request")
        .map(|e| serde_json::from_value(e["body"].clone()).expect("a gateway/request body"))
        .collect()
}

/// The client's bytes back from an upstream body by taking out each insertion.
pub(crate) fn without_insertions(record: &GatewayRecord, upstream: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut at, mut client_at) = (0, 0);
    for edit in &record.splice.edits {
        assert_eq!(edit.remove, 0, "only insertions in these bodies: {edit:?}");
        let len = edit.at - client_at;
        out.extend_from_slice(&upstream[at..at + len]);
        at += len + edit.insert.len();
        client_at = edit.at;
    }
    out.extend_from_slice(&upstream[at..]);
    out
}

/// G1–G5 with each official Python SDK, streamed and not: see [`every_sdk_reaches_the_gateway`].
#[test]
fn g1_the_official_sdks_reach_the_gateway_by_base_url_alone_and_each_body_rebuilds_from_the_log() {
    every_sdk_reaches_the_gateway(Runtime::Python);
}

/// G1–G5 with each official npm SDK (`openai`, `@anthropic-ai/sdk`), streamed and not: the
/// same loop and the same checks as the Python SDKs'.
#[test]
fn g1_the_typescript_sdks_reach_the_gateway_too() {
    // Missing clients fail here, before a daemon is started for nothing.
    node();
    every_sdk_reaches_the_gateway(Runtime::Node);
}

/// G1–G5 with each official SDK of `runtime`, streamed and not, against one daemon and one
/// stub: the loop finishes; all its requests are one session; the stub received exactly the
/// client's body plus the recorded splice, with the sections in it and every other byte the
/// client's; the client's headers reached it and promptd's did not; every reply is recorded
/// with its usage.
fn every_sdk_reaches_the_gateway(runtime: Runtime) {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "");
    let mut seen = 0;
    for sdk in ["openai-chat", "openai-responses", "anthropic"] {
        for stream in [false, true] {
            let what = format!("{runtime:?} {sdk} (stream {stream})");
            let out = sdk_loop(
                &served,
                runtime,
                sdk,
                stream,
                &[
                    "--header",
                    "x-promptd-fact-cwd=/repo",
                    "--header",
                    "x-client-extra=kept",
                ],
            );
            assert_eq!(out["turns"], 2, "{what}: {out}");
            let requests = out["requests"].as_u64().unwrap() as usize;
            assert!(requests >= 4, "{what}: a tool round per turn: {out}");
            for usage in out["usage"].as_array().unwrap() {
                // G5: promptd asks a streamed chat reply for its usage; a client that did not
                // ask is not shown it.
                if sdk == "openai-chat" && stream {
                    assert!(
                        usage.is_null(),
                        "{what}: usage the client did not ask for: {out}"
                    );
                } else {
                    assert!(usage.is_object(), "{what}: the client sees usage: {out}");
                }
            }

            let newest = &newest_session(&served);
            let records = records(newest);
            assert_eq!(
                records.len(),
                requests,
                "{what}: one session holds every request"
            );
            assert_eq!(records[0].joined_by, JoinedBy::New, "{what}");
            for r in &records[1..] {
                assert!(
                    matches!(r.joined_by, JoinedBy::Prefix | JoinedBy::PreviousResponse),
                    "{what}: {:?}",
                    r.joined_by
                );
            }
            let replies: Vec<&Value> = newest
                .iter()
                .filter(|e| e["kind"] == "assistant/message")
                .collect();
            assert_eq!(replies.len(), requests, "{what}: every reply recorded");
            for reply in &replies {
                assert!(
                    reply["body"]["usage"].is_object(),
                    "{what}: a reply without usage: {reply}"
                );
            }

            let received = stub.requests();
            let mine = &received[seen..];
            assert_eq!(
                mine.len(),
                requests,
                "{what}: the stub got each request once"
            );
            seen = received.len();
            let id = served.ok("GET", "/v1/sessions", None)["sessions"][0]["id"]
                .as_str()
                .unwrap()
                .to_string();
            for (n, (_, _, body)) in mine.iter().enumerate() {
                // Both paths, the same bytes: the body API's view of a gateway step is what
                // went upstream.
                let (status, text) =
                    served.get(&format!("/v1/sessions/{id}/steps/{}/upstream", n + 1));
                assert_eq!(status, 200, "{what}: {text}");
                assert_eq!(text.as_bytes(), &body[..], "{what}: step {}", n + 1);
            }
            for (record, (path, headers, body)) in records.iter().zip(mine) {
                assert_eq!(
                    &record.upstream_body(),
                    body,
                    "{what}: the stub's body rebuilds from the log"
                );
                assert_eq!(
                    without_insertions(record, body),
                    record.client_body.as_bytes(),
                    "{what}"
                );
                let text = String::from_utf8_lossy(body);
                assert!(
                    text.contains(PERSONA),
                    "{what}: the sections went upstream: {text}"
                );
                assert!(
                    text.contains("/repo"),
                    "{what}: the runtime context went upstream"
                );
                assert!(path.ends_with(record.ingress_path()), "{what}: {path}");
                let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
                assert!(
                    has("x-client-extra"),
                    "{what}: a client's own header reached the upstream"
                );
                assert!(
                    !headers
                        .iter()
                        .any(|(k, _)| k.to_ascii_lowercase().starts_with("x-promptd-")),
                    "{what}: {headers:?}"
                );
                let key = headers.iter().find(|(k, _)| {
                    k.eq_ignore_ascii_case("x-api-key") || k.eq_ignore_ascii_case("authorization")
                });
                assert!(
                    key.is_some_and(|(_, v)| v.contains("client-key")),
                    "{what}: the client's credential passed through: {headers:?}"
                );
            }
        }
    }
}

trait IngressPath {
    fn ingress_path(&self) -> &'static str;
}

impl IngressPath for GatewayRecord {
    fn ingress_path(&self) -> &'static str {
        self.ingress.path()
    }
}

/// One raw HTTP/1.1 exchange: the status line and headers, and the body as it came.
pub(crate) fn raw_post(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (String, Vec<u8>) {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    (head, out[split + 4..].to_vec())
}

/// Bad input gets a provider-shaped error naming the cause, and the daemon keeps serving: an
/// unknown agent, a path the gateway does not serve, malformed JSON, a body over the limit, an
/// upstream that refuses, resets, or hangs past the timeout.
#[test]
fn g1_bad_input_is_refused_in_the_providers_shape_naming_the_cause() {
    let stub = Stub::start();
    // An https:// upstream that speaks plain HTTP: the TLS handshake fails, named.
    let tls = format!(
        "anthropic = \"anthropic\"\nopenai = \"openai\"\n[gateway.upstream.tls]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n[agents.secure.gateway]\nanthropic = \"tls\"\n",
        stub.url.replace("http://", "https://")
    );
    let (served, _tmp, _folder) = gateway(&stub, &tls);
    let post = |path: &str, body: &str, headers: &[(&str, &str)]| {
        let (head, body) = raw_post(&served.url, path, headers, body.as_bytes());
        (head, String::from_utf8_lossy(&body).to_string())
    };
    let ok_anthropic = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;

    let (head, body) = post("/gateway/nobody/v1/messages", ok_anthropic, &[]);
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "not_found_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no agent `nobody`"),
        "{body}"
    );

    let (head, body) = post("/gateway/coder/v1/embeddings", "{}", &[]);
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(
        body.contains("/v1/embeddings") && body.contains("is not served"),
        "{body}"
    );

    let (head, body) = post(
        "/gateway/coder/v1/chat/completions",
        "{\"messages\": [",
        &[],
    );
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(v["error"]["code"], "promptd_invalid_body", "{body}");

    let big = format!("{{\"pad\":\"{}\",\"messages\":[]}}", "x".repeat(33 << 20));
    let (head, body) = post("/gateway/coder/v1/messages", &big, &[]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(body.contains("max_body_bytes"), "{body}");

    // The upstream's own refusal is passed through as it came.
    let (head, body) = post(
        "/gateway/coder/v1/messages",
        ok_anthropic,
        &[("x-stub-fault", "status-429")],
    );
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
    assert!(body.contains("rate_limit_error"), "{body}");

    let (head, body) = post(
        "/gateway/coder/v1/messages",
        ok_anthropic,
        &[("x-stub-fault", "reset")],
    );
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(
        body.contains("upstream `anthropic` gave no reply"),
        "{body}"
    );

    let (head, body) = post("/gateway/secure/v1/messages", ok_anthropic, &[]);
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(body.contains("upstream `tls` gave no reply"), "{body}");
    // rustls's own words: the handshake met a server that does not speak TLS.
    assert!(body.contains("received corrupt message"), "{body}");

    // Still serving.
    let (head, _) = post("/gateway/coder/v1/messages", ok_anthropic, &[]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(served.health()["status"], "ok");
}

/// The frames of an event stream's body, split at blank lines.
fn frames(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(&dechunk(body)).to_string();
    text.split_inclusive("\n\n").map(str::to_string).collect()
}

/// An HTTP/1.1 chunked body, decoded.
pub(crate) fn dechunk(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&rest[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = end + 2;
        out.extend_from_slice(&rest[start..(start + size).min(rest.len())]);
        rest = &rest[(start + size + 2).min(rest.len())..];
    }
    out
}

pub(crate) fn header_of<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The newest session's events once each of its gateway requests has its reply recorded (a
/// reply is recorded after it is answered, before the session's next step).
pub(crate) fn newest_session(served: &Served) -> Vec<Value> {
    let mut events = Vec::new();
    common::eventually("every gateway request's reply recorded", || {
        events = sessions(served).remove(0);
        let count = |kind: &str| events.iter().filter(|e| e["kind"] == kind).count();
        count("gateway/request") == count("assistant/message")
    });
    events
}

/// G5, G7: a streamed reply reaches the client as the upstream sent it — the frames a direct
/// call with the same upstream body gets, less only the usage promptd asked a chat stream for —
/// and the recorded reply is the one the unstreamed call of the same turn gives; every reply
/// carries promptd's `server-timing`.
#[test]
fn g5_a_stream_reaches_the_client_as_sent_and_is_recorded_as_the_unstreamed_reply() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "");
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]}"#,
        ),
        (
            "/v1/messages",
            r#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"read_file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}]}"#,
        ),
        (
            "/v1/responses",
            r#"{"model":"gpt-4.1","stream":true,"input":"hi","tools":[{"type":"function","name":"read_file","strict":false,"parameters":{"type":"object","properties":{"path":{"type":"string"}}}}]}"#,
        ),
    ];
    for (path, body) in cases {
        request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
        let (head, got) = raw_post(
            &served.url,
            &format!("/gateway/coder{path}"),
            &[("x-api-key", "sk-ant-stream-key")],
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
        let timing = header_of(&head, "server-timing")
            .unwrap_or_else(|| panic!("{path}: no server-timing: {head}"));
        for part in ["parse;dur=", "step;dur=", "record;dur=", "promptd;dur="] {
            assert!(timing.contains(part), "{path}: {timing}");
        }
        let got = frames(&got);
        let events = newest_session(&served);
        let record = records(&events).pop().expect("a gateway/request");
        let reply = events
            .iter()
            .rev()
            .find(|e| e["kind"] == "assistant/message")
            .expect("a recorded reply")
            .clone();
        assert!(reply["body"]["partial"].is_null(), "{path}: {reply}");

        // What the upstream sends for the same bytes, less what promptd asked for and the
        // client did not.
        let mut asked = record.clone();
        asked
            .splice
            .edits
            .retain(|e| e.part != promptd_core::gateway::splice::Part::IncludeUsage);
        let direct_body = asked.splice.apply(record.client_body.as_bytes());
        request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
        let (head, direct) = raw_post(
            &stub.url,
            path,
            &[("x-api-key", "sk-ant-stream-key")],
            &direct_body,
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
        assert_eq!(
            got,
            frames(&direct),
            "{path}: the client got the upstream's frames"
        );

        // The unstreamed reply of the same turn, read as promptd reads replies.
        let mut unstreamed: Value = serde_json::from_slice(&record.upstream_body()).unwrap();
        unstreamed.as_object_mut().unwrap().remove("stream");
        unstreamed.as_object_mut().unwrap().remove("stream_options");
        request(&stub.url, "POST", "/stub/reset", Some("{}"), None);
        let (status, text) = request(&stub.url, "POST", path, Some(&unstreamed.to_string()), None);
        assert_eq!(status, 200, "{text}");
        let whole: Value = serde_json::from_str(&text).unwrap();
        let (message, usage) = promptd_core::formats::replies::reply_with_usage(whole).unwrap();
        let mut recorded = reply["body"].clone();
        for key in ["usage", "cache", "partial"] {
            recorded.as_object_mut().unwrap().remove(key);
        }
        assert_eq!(
            recorded,
            serde_json::to_value(&message).unwrap(),
            "{path}: the recorded reply is the unstreamed one"
        );
        assert_eq!(
            reply["body"]["usage"],
            serde_json::to_value(usage).unwrap(),
            "{path}: its usage too"
        );
    }
}

/// G5: a stream that breaks midway reaches the client as far as it came, and the reply is
/// recorded as far as it came, with why it ended.
#[test]
fn g5_a_stream_that_breaks_midway_is_recorded_partial_with_its_reason() {
    let stub = Stub::start();
    let (served, _tmp, _folder) = gateway(&stub, "");
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    for (fault, says) in [
        ("midstream-error", "the upstream sent an error"),
        ("invalid-sse", "no server-sent event field"),
    ] {
        let (head, got) = raw_post(
            &served.url,
            "/gateway/coder/v1/messages",
            &[("x-stub-fault", fault)],
            body.as_bytes(),
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{fault}: {head}");
        let got = frames(&got);
        assert!(
            got.iter().any(|f| f.contains("message_start")),
            "{fault}: {got:?}"
        );
        let events = newest_session(&served);
        let reply = events
            .iter()
            .rev()
            .find(|e| e["kind"] == "assistant/message")
            .unwrap_or_else(|| panic!("{fault}: no reply recorded: {events:?}"));
        let partial = reply["body"]["partial"]
            .as_str()
            .unwrap_or_else(|| panic!("{fault}: {reply}"));
        assert!(partial.contains(says), "{fault}: {partial}");
    }
    // A chat stream the upstream cuts.
    let chat = r#"{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let (_, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/chat/completions",
        &[("x-stub-fault", "midstream-error")],
        chat.as_bytes(),
    );
    let events = newest_session(&served);
    let reply = events
        .iter()
        .rev()
        .find(|e| e["kind"] == "assistant/message")
        .expect("a reply");
    assert!(
        reply["body"]["partial"]
            .as_str()
            .is_some_and(|p| p.contains("stream")),
        "{reply}"
    );
    assert_eq!(served.health()["status"], "ok");
}

/// G6: the budget refuses an overflowing request before anything is sent, in the provider's
/// shape; G2/G8: a configured key replaces the client's on the way upstream, and neither key
/// reaches the log, the events, the inspector's reads or /metrics.
#[test]
fn g6_g8_the_budget_refuses_before_sending_and_no_key_is_kept_anywhere() {
    let stub = Stub::start();
    let (served, tmp, _folder) = gateway(&stub, "");
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        &[("x-api-key", "sk-ant-client-secret-1")],
        body.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(served);

    // A configured key, and a budget too small for any request.
    let folder = Folder::new().bundled("identity").bundled("persona");
    let config = folder.config(&format!(
        r#"
[gateway]
enabled = true
[gateway.upstream.anthropic]
provider = "anthropic"
base_url = "{url}"
api_key_env = "PROMPTD_TEST_UPSTREAM_KEY"
[agents.coder.gateway]
[agents.tight.gateway]
[agents.tight.budget]
window = 20
"#,
        url = stub.url
    ));
    let (tmp2, state) = common::daemon::state_dir();
    let log2 = tmp2.path().join("daemon.log");
    let env = [("PROMPTD_TEST_UPSTREAM_KEY", "sk-ant-configured-secret-2")];
    let served = Served::start_logged_with_env(folder.path(), &config, &state, &env, &log2);
    let (head, _) = raw_post(
        &served.url,
        "/gateway/coder/v1/messages",
        &[("x-api-key", "sk-ant-client-secret-1")],
        body.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let last = stub.requests().pop().unwrap();
    let key: Vec<&String> = last
        .1
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("x-api-key"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        key,
        ["sk-ant-configured-secret-2"],
        "the configured key replaced the client's"
    );

    let long = format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "word ".repeat(50)
    );
    let before = stub.requests().len();
    let (head, text) = raw_post(
        &served.url,
        "/gateway/tight/v1/messages",
        &[],
        long.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let v: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context overflow"),
        "{v}"
    );
    assert_eq!(stub.requests().len(), before, "nothing went upstream");

    // Nowhere: the events of every session, the usage report, /metrics, the daemon's logs.
    let mut seen = String::new();
    for events in sessions(&served) {
        seen.push_str(&serde_json::to_string(&events).unwrap());
    }
    seen.push_str(&served.get("/metrics").1);
    seen.push_str(&served.get("/v1/usage").1);
    for log in [tmp.path().join("daemon.log"), log2] {
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("loaded"),
            "the log is read: {}",
            log.display()
        );
        seen.push_str(&text);
    }
    for secret in ["sk-ant-client-secret-1", "sk-ant-configured-secret-2"] {
        assert!(!seen.contains(secret), "{secret} leaked");
    }
}

/// The README's gateway section, run as written: its config (the upstream's URL pointed at the
/// stub) and its Python loop (the daemon's address in place of 127.0.0.1:8417).
#[test]
fn g1_the_readme_gateway_section_runs_as_written() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section = readme
        .split("<!-- gateway: ")
        .nth(1)
        .expect("the README's gateway marker");
    let block = |lang: &str| {
        let start = section.find(&format!("```{lang}\n")).unwrap() + lang.len() + 4;
        section[start..start + section[start..].find("```").unwrap()].to_string()
    };
    let (toml, loop_code) = (block("toml"), block("python"));
    let stub = Stub::start();
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("workspace");
    let config = folder.config(&format!(
        "[agents.coder]\n[plugins.identity]\nconfig = {{ name = \"Ada\", model = \"example-model\" }}\n{}",
        toml.replace("https://api.anthropic.com", &stub.url)
    ));
    let (_tmp, state) = common::daemon::state_dir();
    let served = Served::start(folder.path(), &config, &state);
    let script = loop_code.replace("http://127.0.0.1:8417", &served.url);
    let mut cmd = Command::new(python());
    cmd.args(["-c", &script])
        .env("ANTHROPIC_API_KEY", "sk-ant-readme");
    let (code, out, err) = common::process::run_bounded(cmd, LOOP_BOUND);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.trim().is_empty(), "the reply's text is printed");
    let events = newest_session(&served);
    let record = records(&events).pop().expect("the request is recorded");
    let upstream = String::from_utf8(record.upstream_body()).unwrap();
    assert!(
        upstream.contains("Ada"),
        "the plugins' sections went upstream: {upstream}"
    );
    assert!(
        upstream.contains("/src/app"),
        "the fact reached the runtime context"
    );
}
