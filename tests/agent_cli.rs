//! A real coding agent CLI through the gateway (issue 47): Claude Code 2.1.332 (pinned in
//! tests/agents, installed by `cargo xtask test`), run headless with only its base URL pointed
//! at `/gateway/coder`, does a scripted tool-using task — Read a file, Edit it, Write another,
//! run a Bash command — against a local stand-in for the Messages API
//! (`tests/agents/probe_server.py`, which logs every request it gets, raw body included).
//! Its one extra setting is `ANTHROPIC_CUSTOM_HEADERS` with the step's `cwd` fact
//! (`x-promptd-fact-cwd`), Claude Code's own way to add a header to its calls.
//!
//! Between the CLI and the daemon sits a tap: a loopback TCP relay that passes every byte on
//! and keeps a copy of each request, so the test knows exactly what the CLI sent (headers and
//! body) and can compare it with what the upstream received and what the log recorded.

use promptd_testkit as common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::daemon::{request, Served};
use common::process::Bounded;
use common::{repo_root, Folder};
use promptd_core::gateway::record::{GatewayRecord, JoinedBy};
use promptd_core::gateway::splice::Part;
use promptd_core::gateway::Ingress;
use serde_json::Value;

const CLI_BOUND: Duration = Duration::from_secs(180);
const KEY: &str = "sk-ant-cli-test-key-0001";
const PERSONA: &str = "You are Ada's engineering side";
const MODEL: &str = "claude-sonnet-4-5";
const FINAL_TEXT: &str = "All four steps are done.";

/// Headers of one connection (RFC 9110 §7.6.1) plus `host` and `content-length`, which each
/// hop sets for itself: the ones a proxy does not pass on.
const HOP_BY_HOP: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

fn claude() -> PathBuf {
    let bin = repo_root().join("tests/agents/node_modules/.bin/claude");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask test`, which installs Claude Code (tests/agents/install.sh)",
        bin.display()
    );
    bin
}

/// One HTTP request as seen on the wire: the path with its query, the headers in the order
/// they came (name case kept), the body bytes.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    /// The headers a proxy passes on, lower-cased names, sorted (a proxy may regroup them).
    fn end_to_end(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .filter(|(k, _)| !HOP_BY_HOP.contains(&k.as_str()) && !k.starts_with("x-promptd-"))
            .collect();
        out.sort();
        out
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// The tap: a relay on a free loopback port in front of `target`, keeping every request.
struct Tap {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Tap {
    fn start(target: &str) -> Tap {
        let target = target.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the tap");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (keep, halt) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let (target, keep) = (target.clone(), keep.clone());
                std::thread::spawn(move || relay(client, &target, &keep));
            }
        });
        Tap { url, seen, stop }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

/// One client connection: each request read whole (Content-Length bodies; the CLI sends no
/// chunked ones), kept, and written to the daemon; the daemon's bytes go back as they come.
fn relay(client: TcpStream, target: &str, keep: &Mutex<Vec<Seen>>) {
    let Ok(mut upstream) = TcpStream::connect(target) else {
        return;
    };
    let (Ok(mut back), Ok(mut reply)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let replies = std::thread::spawn(move || {
        let _ = std::io::copy(&mut reply, &mut back);
        let _ = back.shutdown(Shutdown::Write);
    });
    let mut reader = BufReader::new(client);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let end = line == b"\r\n" || line == b"\n";
            head.extend_from_slice(&line);
            if end {
                break;
            }
        }
        if !head.ends_with(b"\n\r\n") && !head.ends_with(b"\n\n") {
            break; // the client closed the connection
        }
        let text = String::from_utf8_lossy(&head).to_string();
        let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
        let start: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect();
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        assert!(!chunked, "the tap reads Content-Length bodies only: {text}");
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().expect("a Content-Length"))
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            break;
        }
        keep.lock().unwrap().push(Seen {
            method: start.first().unwrap_or(&"").to_string(),
            path: start.get(1).unwrap_or(&"").to_string(),
            headers,
            body: body.clone(),
        });
        if upstream.write_all(&head).is_err() || upstream.write_all(&body).is_err() {
            break;
        }
    }
    let _ = upstream.shutdown(Shutdown::Write);
    let _ = replies.join();
}

/// `tests/agents/probe_server.py` on a free loopback port, scripted with `tools` (name, input)
/// and the final text, logging every request to `log`.
struct Probe {
    _child: Bounded,
    url: String,
    log: PathBuf,
}

impl Probe {
    fn start(log: &Path, tools: &[(&str, Value)]) -> Probe {
        let mut cmd = Command::new("python3");
        cmd.arg(repo_root().join("tests/agents/probe_server.py"))
            .arg("--log")
            .arg(log)
            .args(["--text", FINAL_TEXT]);
        for (name, input) in tools {
            cmd.args(["--tool", name, "--tool-input", &input.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tests/agents/probe_server.py with python3");
        let stdout = child.stdout.take().expect("stdout");
        let child = Bounded(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the probe's port");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the probe's first line is not a port: {line:?}"));
        Probe {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
            log: log.to_path_buf(),
        }
    }

    /// Every request it received, in order.
    fn requests(&self) -> Vec<Seen> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|line| {
                let e: Value = serde_json::from_str(line).expect("a probe log line");
                Seen {
                    method: e["method"].as_str().unwrap().to_string(),
                    path: e["path"].as_str().unwrap().to_string(),
                    headers: e["headers"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| {
                            (
                                h[0].as_str().unwrap().to_string(),
                                h[1].as_str().unwrap().to_string(),
                            )
                        })
                        .collect(),
                    body: base64(e["body_b64"].as_str().unwrap()),
                }
            })
            .collect()
    }
}

/// Standard base64 (with padding) to bytes.
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for quad in text.as_bytes().chunks(4) {
        let digits: Vec<u8> = quad
            .iter()
            .copied()
            .filter(|&c| c != b'=')
            .map(value)
            .collect();
        let n = digits
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | (d as u32) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..digits.len()]);
    }
    out
}

/// A daemon whose agent `coder` is served by the gateway with sections (identity, persona) and
/// a runtime context (workspace), forwarding Messages to the probe; its log in `log`.
fn gateway(probe: &Probe, log: &Path) -> (Served, tempfile::TempDir, Folder) {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("workspace");
    let config = folder.config(&format!(
        r#"
[plugins.identity]
config = {{ name = "Ada", model = "example-model" }}
[plugins.persona]
config = {{ text = "You are {{{{agent_name}}}}'s {{{{role}}}} side.", role = "engineering" }}

[gateway]
enabled = true
[gateway.upstream.anthropic]
provider = "anthropic"
base_url = "{url}"

[agents.coder.gateway]
"#,
        url = probe.url
    ));
    let (tmp, state) = common::daemon::state_dir();
    let served = Served::start_logged(folder.path(), &config, &state, log);
    (served, tmp, folder)
}

/// Every `cache_control` value in `v`, in a fixed walk order.
fn breakpoints(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "cache_control" {
                    out.push(v.clone());
                } else {
                    breakpoints(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| breakpoints(v, out)),
        _ => {}
    }
}

/// Whether `small` is `big` with some items left out, in order.
fn subsequence(small: &[Value], big: &[Value]) -> bool {
    let mut rest = big.iter();
    small.iter().all(|s| rest.any(|b| b == s))
}

/// The text of the last tool_result of a Messages body.
fn last_tool_result(body: &Value) -> String {
    let mut blocks = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result");
    let last = blocks.next_back().expect("a tool_result");
    match &last["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Claude Code, pointed at the gateway by its base URL (plus a fact header), does a Read →
/// Edit → Write → Bash task through it: it finishes and its tools really ran; every request the upstream received is
/// one `gateway/request` of one session (new, then joined by prefix), in order, rebuilt from
/// the log byte for byte, whose client body is what the CLI sent byte for byte; every
/// end-to-end header the CLI sent reached the upstream unchanged and nothing else did; the
/// breakpoints stay within Anthropic's 4 with the client's own kept as sent; every reply is
/// recorded; the client's API key is in no log, event or metric.
#[test]
fn claude_code_runs_a_tool_using_task_through_the_gateway_with_its_bytes_and_headers_kept() {
    let claude = claude();
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().unwrap();
    let (home, work) = (root.join("home"), root.join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let notes = work.join("notes.txt");
    let summary = work.join("summary.txt");
    std::fs::write(&notes, "hello from the probe\n").unwrap();

    let script = [
        ("Read", serde_json::json!({ "file_path": notes })),
        (
            "Edit",
            serde_json::json!({
                "file_path": notes,
                "old_string": "hello from the probe",
                "new_string": "edited through the gateway",
            }),
        ),
        (
            "Write",
            serde_json::json!({ "file_path": summary, "content": "written through the gateway\n" }),
        ),
        (
            "Bash",
            serde_json::json!({
                "command": "cat notes.txt summary.txt | tee seen.txt",
                "description": "show both files",
            }),
        ),
    ];
    let probe = Probe::start(&root.join("probe.jsonl"), &script);
    let daemon_log = root.join("daemon.log");
    let (served, state_tmp, _folder) = gateway(&probe, &daemon_log);
    let tap = Tap::start(&served.url);

    let mut cmd = Command::new(&claude);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("TERM", "dumb")
        .env("ANTHROPIC_BASE_URL", format!("{}/gateway/coder", tap.url))
        .env("ANTHROPIC_API_KEY", KEY)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        // Claude Code's own way to add a header to each call: the step's `cwd` fact, so the
        // workspace plugin has a runtime context to splice, and an x-promptd-* header the
        // gateway must keep from the upstream.
        .env(
            "ANTHROPIC_CUSTOM_HEADERS",
            format!("x-promptd-fact-cwd: {}", work.display()),
        )
        .current_dir(&work)
        .args([
            "-p",
            "Read notes.txt, replace its greeting, write summary.txt, then show both with cat.",
            "--output-format",
            "json",
            "--model",
            MODEL,
            "--allowedTools",
            "Read",
            "Write",
            "Edit",
            "Bash",
        ]);
    let started = std::time::Instant::now();
    let (code, out, err) = common::process::run_bounded(cmd, CLI_BOUND);
    let daemon_text = std::fs::read_to_string(&daemon_log).unwrap_or_default();
    let context = format!(
        "claude exited {code:?} after {:?}\nstdout: {out}\nstderr: {err}\ndaemon log:\n{daemon_text}",
        started.elapsed()
    );
    assert_eq!(code, Some(0), "{context}");
    let result: Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {context}"));
    assert_eq!(result["is_error"], false, "{context}");
    assert_eq!(result["result"], FINAL_TEXT, "{context}");
    assert_eq!(result["num_turns"], script.len() + 1, "{context}");
    assert_eq!(
        result["permission_denials"],
        serde_json::json!([]),
        "{context}"
    );

    // The tools really ran, in the working directory.
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "edited through the gateway\n",
        "Edit"
    );
    assert_eq!(
        std::fs::read_to_string(&summary).unwrap(),
        "written through the gateway\n",
        "Write"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("seen.txt")).unwrap(),
        "edited through the gateway\nwritten through the gateway\n",
        "Bash"
    );

    // What the CLI sent, what the upstream received, what the log holds.
    let sent = tap.seen();
    let received = probe.requests();
    assert_eq!(
        received.len(),
        script.len() + 1,
        "one Messages call per tool and one for the final text: {:?}",
        received.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    assert_eq!(
        sent.len(),
        received.len(),
        "each request went upstream once"
    );
    let sessions = served.ok("GET", "/v1/sessions", None);
    let sessions = sessions["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "one session: {sessions:?}");
    let id = sessions[0]["id"].as_str().unwrap();
    // A reply is recorded after it is answered (before the session's next step): the last
    // one may still be on its way when the CLI exits.
    let mut events_text = String::new();
    common::eventually("the last reply recorded", || {
        let (status, text) = request(
            &served.url,
            "GET",
            &format!("/v1/sessions/{id}/events"),
            None,
            None,
        );
        assert_eq!(status, 200, "{text}");
        events_text = text;
        events_text.matches("\"assistant/message\"").count() == received.len()
    });
    let events: Value = serde_json::from_str(&events_text).unwrap();
    let events = events["events"].as_array().unwrap();
    let records: Vec<GatewayRecord> = events
        .iter()
        .filter(|e| e["kind"] == "gateway/request")
        .map(|e| serde_json::from_value(e["body"].clone()).expect("a gateway/request body"))
        .collect();
    assert_eq!(records.len(), received.len(), "one record per request");
    let replies: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "assistant/message")
        .collect();
    assert_eq!(replies.len(), received.len(), "every reply recorded");
    for reply in &replies {
        assert!(reply["body"]["usage"].is_object(), "{reply}");
    }

    for (i, ((record, cli), upstream)) in records.iter().zip(&sent).zip(&received).enumerate() {
        let what = format!("request #{i}");
        assert_eq!(
            record.joined_by,
            if i == 0 {
                JoinedBy::New
            } else {
                JoinedBy::Prefix
            },
            "{what}"
        );
        assert_eq!(record.ingress, Ingress::Messages, "{what}");
        assert_eq!(record.upstream, "anthropic", "{what}");

        // Bodies: the CLI's bytes are the record's client body; the upstream's bytes are the
        // record rebuilt, and they carry the agent's sections.
        assert_eq!(
            record.client_body.as_bytes(),
            cli.body.as_slice(),
            "{what}: the recorded client body is what the CLI sent"
        );
        assert!(
            record.upstream_body() == upstream.body,
            "{what}: the upstream body does not rebuild from the log ({} bytes recorded, {} received)",
            record.upstream_body().len(),
            upstream.body.len()
        );
        let text = String::from_utf8_lossy(&upstream.body);
        assert!(text.contains(PERSONA), "{what}: the sections went upstream");
        let parts: Vec<Part> = record.splice.edits.iter().map(|e| e.part).collect();
        assert!(
            parts.contains(&Part::Sections) && parts.contains(&Part::RuntimeContext),
            "{what}: {parts:?} {:?}",
            record.splice.skipped
        );
        assert!(
            text.contains(&format!("Working directory: {}", work.display())),
            "{what}: the runtime context (from the cwd fact) went upstream"
        );

        // Paths and headers.
        assert_eq!(cli.method, "POST", "{what}");
        assert_eq!(upstream.method, "POST", "{what}");
        assert_eq!(cli.path, "/gateway/coder/v1/messages?beta=true", "{what}");
        assert_eq!(upstream.path, "/v1/messages?beta=true", "{what}");
        assert_eq!(
            upstream.end_to_end(),
            cli.end_to_end(),
            "{what}: the upstream got the CLI's end-to-end headers, unchanged, and no others"
        );
        assert_eq!(
            cli.header("x-promptd-fact-cwd"),
            Some(work.to_str().unwrap()),
            "{what}: the CLI sent the fact header"
        );
        assert!(
            !upstream
                .headers
                .iter()
                .any(|(k, _)| k.to_ascii_lowercase().starts_with("x-promptd-")),
            "{what}: promptd's headers stay with promptd: {:?}",
            upstream.headers
        );
        assert_eq!(upstream.header("x-api-key"), Some(KEY), "{what}");
        assert_eq!(
            upstream.header("anthropic-version"),
            Some("2023-06-01"),
            "{what}"
        );
        assert_eq!(upstream.header("x-app"), Some("cli"), "{what}");
        assert!(
            upstream
                .header("anthropic-beta")
                .is_some_and(|b| b.contains("claude-code-20250219")),
            "{what}: {:?}",
            upstream.headers
        );
        assert!(
            upstream
                .header("user-agent")
                .is_some_and(|u| u.starts_with("claude-cli/2.1.332 ")),
            "{what}: {:?}",
            upstream.headers
        );
        // Breakpoints: at most Anthropic's 4; the client's kept as it sent them (ttl
        // included), in order; one of promptd's own only where the record says so.
        let client: Value = serde_json::from_str(&record.client_body).unwrap();
        let (mut theirs, mut sent_up) = (Vec::new(), Vec::new());
        breakpoints(&client, &mut theirs);
        breakpoints(&upstream.json(), &mut sent_up);
        assert!(!theirs.is_empty(), "{what}: Claude Code sets breakpoints");
        assert!(
            sent_up.len() <= 4,
            "{what}: {} breakpoints upstream",
            sent_up.len()
        );
        assert_eq!(record.splice.client_breakpoints, theirs.len(), "{what}");
        assert_eq!(
            sent_up.len(),
            theirs.len() + usize::from(record.splice.breakpoint_added),
            "{what}: {sent_up:?}"
        );
        assert!(
            !record.splice.breakpoint_added,
            "{what}: the client has breakpoints in its system, so promptd adds none"
        );
        assert!(
            subsequence(&theirs, &sent_up),
            "{what}: the client's breakpoints changed: {theirs:?} -> {sent_up:?}"
        );
    }

    // The command ran and its output went back to the model.
    let last = received.last().unwrap().json();
    assert!(
        last_tool_result(&last).contains("edited through the gateway\nwritten through the gateway"),
        "{}",
        last_tool_result(&last)
    );

    // The client's key is nowhere promptd writes or shows.
    let metrics = request(&served.url, "GET", "/metrics", None, None);
    assert_eq!(metrics.0, 200, "{}", metrics.1);
    let daemon_text = std::fs::read_to_string(&daemon_log).unwrap();
    assert!(!daemon_text.is_empty(), "the daemon logged");
    for (what, text) in [
        ("the daemon's log", daemon_text.as_str()),
        ("the session's events", events_text.as_str()),
        ("GET /metrics", metrics.1.as_str()),
    ] {
        assert!(!text.contains(KEY), "the client's API key is in {what}");
    }
    let mut stored = Vec::new();
    files_under(state_tmp.path(), &mut stored);
    assert!(!stored.is_empty(), "the daemon stored its state");
    for file in stored {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "the client's API key is in {}",
            file.display()
        );
    }
}
