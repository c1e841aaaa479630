//! The TypeScript client (`sdk/clients/typescript`, npm package `promptd-client`) against a real
//! `promptd serve` and, for the loops, `tests/sdk_loops/stub_provider.py` — the local stand-in
//! for the OpenAI and Anthropic APIs that refuses bodies breaking their rules.
//!
//! Everything runs from the packed artifact: `sdk/clients/typescript/install.sh` builds the
//! client with tsc, packs it with `npm pack`, and installs the tarball with the pinned official
//! SDKs into the fresh folder `sdk/clients/typescript/.test-install/`, where the examples and
//! tests are copied; their `import "promptd-client"` resolves there, not to the sources. A
//! stamp of every input tells a stale install from a fresh one.
//!
//! - each example loop (`openai` Chat Completions and Responses, `@anthropic-ai/sdk` with the
//!   whole message or its content blocks), two turns with tool calls: the stub accepted every
//!   body, each body it received is byte for byte step n's request as the daemon rebuilds it,
//!   the tool calls and results sit in the bodies as the model wrote and the loop sent them,
//!   and the session log holds exactly the loop's turns in order;
//! - the client's own `node:test` suites (`test/*.test.mjs`), each against its own daemon;
//! - the TypeScript loop of `docs/clients.md`, extracted from it and run as written, with its
//!   count of promptd lines checked.

use promptd_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::{state_dir, Served};
use common::process::Bounded;
use common::{repo_root, Folder};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A loop takes a few seconds and a test suite up to ~15 s (tsc type-checks consumers); the
/// bound only stops a hung run.
const RUN_BOUND: Duration = Duration::from_secs(180);
/// The stub's own bound; a test stops it long before.
const STUB_BOUND_S: &str = "900";
/// Turns of each example loop: the stub answers a turn's question with a tool call (one in
/// odd rounds, two in parallel in even ones), then the results with text, so a turn is 2 steps.
const TURNS: u64 = 2;

fn client_dir() -> PathBuf {
    repo_root().join("sdk/clients/typescript")
}

fn install_dir() -> PathBuf {
    client_dir().join(".test-install")
}

fn reinstall(why: &str) -> String {
    format!("{why}: run sdk/clients/typescript/install.sh (it builds promptd-client, packs it with npm pack and installs the tarball with the pinned provider SDKs into sdk/clients/typescript/.test-install; `cargo xtask test` runs it)")
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    format!("{:x}", Sha256::digest(&bytes))
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The install folder, once it is known to hold the artifact built from the sources as they
/// are now: every file install.sh stamped has the stamped hash, and no source, example or test
/// was added since.
fn installed() -> PathBuf {
    let dir = install_dir();
    for needed in [
        "node_modules/promptd-client/package.json",
        "node_modules/openai/package.json",
        "node_modules/@anthropic-ai/sdk/package.json",
        ".stamp",
    ] {
        let path = dir.join(needed);
        assert!(
            path.is_file(),
            "{}",
            reinstall(&format!("{} is missing", path.display()))
        );
    }
    let stamp = std::fs::read_to_string(dir.join(".stamp")).expect("read the stamp");
    let mut stamped = Vec::new();
    for line in stamp.lines() {
        let (hash, path) = line
            .split_once("  ")
            .unwrap_or_else(|| panic!("{}", reinstall(&format!("a bad stamp line {line:?}"))));
        let file = client_dir().join(path);
        assert!(
            file.is_file() && sha256_hex(&file) == hash,
            "{}",
            reinstall(&format!(
                "sdk/clients/typescript/{path} changed since the install"
            ))
        );
        stamped.push(file);
    }
    let mut sources = Vec::new();
    for sub in ["src", "examples", "test"] {
        files_under(&client_dir().join(sub), &mut sources);
    }
    for file in sources {
        assert!(
            stamped.contains(&file),
            "{}",
            reinstall(&format!("{} is newer than the install", file.display()))
        );
    }
    dir
}

/// The stub provider on a free loopback port, logging every request it gets (path, status,
/// error, raw body) to `log`. It also exits when its stdin (held here) closes.
struct Stub {
    _child: Bounded,
    url: String,
    log: PathBuf,
}

impl Stub {
    fn start(log: PathBuf) -> Stub {
        let python = repo_root().join("tests/sdk_loops/.venv/bin/python");
        assert!(
            python.is_file(),
            "{} is missing: tests/sdk_loops/install.sh makes the venv the stub provider runs in \
             (`cargo xtask test` runs it)",
            python.display()
        );
        let (child, url) = common::process::start_stub_provider(&python, STUB_BOUND_S, Some(&log));
        Stub {
            _child: child,
            url,
            log,
        }
    }

    /// Every body the stub received, raw, in order; each must have been accepted at `path`.
    fn bodies(&self, path: &str) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|line| {
                let entry: Value = serde_json::from_str(line).expect("a stub log line");
                assert_eq!(entry["status"], 200, "the stub refused a body: {entry}");
                assert_eq!(entry["path"], path, "{entry}");
                entry["body"].as_str().expect("body").to_string()
            })
            .collect()
    }
}

/// Runs `cmd` to completion within [`RUN_BOUND`]; returns (exit code, stdout, stderr).
fn run_bounded(cmd: Command) -> (Option<i32>, String, String) {
    common::process::run_bounded(cmd, RUN_BOUND)
}

/// `node ARGS` in the install folder, with only the environment given here for promptd.
fn node(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("node");
    cmd.current_dir(dir).args(args);
    for key in [
        "PROMPTD_URL",
        "PROMPTD_TOKEN",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "NODE_OPTIONS",
    ] {
        cmd.env_remove(key);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// A daemon on the bundled Rust plugins with the repository's example config, and a logging
/// stub. Fields drop in order: the processes first.
struct Rig {
    daemon: Served,
    stub: Stub,
    _work: tempfile::TempDir,
    _state: tempfile::TempDir,
    _folder: Folder,
}

impl Rig {
    fn start() -> Rig {
        let folder = Folder::new()
            .bundled("identity")
            .bundled("persona")
            .bundled("tools")
            .bundled("workspace");
        let (state_tmp, state) = state_dir();
        let daemon = Served::start(folder.path(), &repo_root().join("promptd.toml"), &state);
        let work = tempfile::tempdir().expect("tempdir");
        let stub = Stub::start(work.path().join("stub.jsonl"));
        Rig {
            daemon,
            stub,
            _work: work,
            _state: state_tmp,
            _folder: folder,
        }
    }

    /// Step `n`'s request in `format`, rebuilt from the log: the raw bytes.
    fn rebuilt(&self, session: &str, n: usize, format: &str) -> String {
        let (status, text) = self.daemon.get(&format!(
            "/v1/sessions/{session}/steps/{n}/request?format={format}"
        ));
        assert_eq!(status, 200, "rebuild step {n}: {text}");
        text
    }

    fn events(&self, session: &str) -> Vec<Value> {
        let v = self
            .daemon
            .ok("GET", &format!("/v1/sessions/{session}/events"), None);
        v["events"].as_array().expect("events").clone()
    }
}

fn list(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// A tool call as it sits in a body: id, arguments (parsed), and the raw arguments string for
/// the OpenAI formats (None for Anthropic, whose `input` is an object).
#[derive(Debug, PartialEq)]
struct SentCall {
    id: String,
    arguments: Value,
    raw: Option<String>,
}

/// The arguments string of an OpenAI call: it must parse to an object (a string would mean
/// they were encoded twice).
fn openai_arguments(raw: &Value, id: &str) -> (Value, Option<String>) {
    let raw = raw
        .as_str()
        .unwrap_or_else(|| panic!("call {id}: arguments must be a JSON string, got {raw}"));
    let parsed: Value = serde_json::from_str(raw)
        .unwrap_or_else(|e| panic!("call {id}: arguments {raw:?} are not JSON: {e}"));
    assert!(
        parsed.is_object(),
        "call {id}: arguments {raw:?} must be the JSON text of an object (not encoded twice)"
    );
    (parsed, Some(raw.to_string()))
}

/// Every tool call in a body, and every tool result (call id, text), in order.
fn calls_and_results(format: &str, body: &Value) -> (Vec<SentCall>, Vec<(String, String)>) {
    let (mut calls, mut results) = (Vec::new(), Vec::new());
    let id = |v: &Value| v.as_str().expect("an id").to_string();
    match format {
        "openai" => {
            for m in list(&body["messages"]) {
                for c in list(&m["tool_calls"]) {
                    let (arguments, raw) =
                        openai_arguments(&c["function"]["arguments"], &id(&c["id"]));
                    calls.push(SentCall {
                        id: id(&c["id"]),
                        arguments,
                        raw,
                    });
                }
                if m["role"] == "tool" {
                    results.push((
                        id(&m["tool_call_id"]),
                        m["content"].as_str().expect("text").to_string(),
                    ));
                }
            }
        }
        "openai-responses" => {
            for item in list(&body["input"]) {
                if item["type"] == "function_call" {
                    let (arguments, raw) =
                        openai_arguments(&item["arguments"], &id(&item["call_id"]));
                    calls.push(SentCall {
                        id: id(&item["call_id"]),
                        arguments,
                        raw,
                    });
                }
                if item["type"] == "function_call_output" {
                    results.push((
                        id(&item["call_id"]),
                        item["output"].as_str().expect("text").to_string(),
                    ));
                }
            }
        }
        _ => {
            for m in list(&body["messages"]) {
                for b in list(&m["content"]) {
                    if b["type"] == "tool_use" {
                        assert!(
                            b["input"].is_object(),
                            "tool_use input must be an object: {b}"
                        );
                        calls.push(SentCall {
                            id: id(&b["id"]),
                            arguments: b["input"].clone(),
                            raw: None,
                        });
                    }
                    if b["type"] == "tool_result" {
                        let text = match &b["content"] {
                            Value::String(s) => s.clone(),
                            blocks => list(blocks)
                                .iter()
                                .filter_map(|x| x["text"].as_str())
                                .collect::<String>(),
                        };
                        results.push((id(&b["tool_use_id"]), text));
                    }
                }
            }
        }
    }
    (calls, results)
}

/// The log of a loop's session, checked turn by turn: step n's reply is the next event after
/// step n's marker; its tool calls are answered right after it, in order, by the results the
/// loop sent; a step follows a reply with calls without user text, and a reply without calls
/// with exactly one user message (the next turn). Returns the calls in the log, in order, as
/// (id, arguments, the model's raw arguments string when it wrote one).
fn check_log(
    events: &[Value],
    steps: usize,
    summary: &Value,
) -> Vec<(String, Value, Option<String>)> {
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("?"))
        .collect();
    let markers: Vec<usize> = (0..events.len()).filter(|&i| kinds[i] == "step").collect();
    assert_eq!(markers.len(), steps, "one step marker per step: {kinds:?}");
    assert_eq!(kinds[0], "session/created", "{kinds:?}");
    let results = list(&summary["results"]);
    let mut answered = 0;
    let mut calls = Vec::new();
    let mut users = 0;
    // Each stretch: the events from just after the previous marker up to this one.
    let mut from = 1;
    let mut previous_calls = 0; // calls of the reply before this stretch's step (0 for step 1)
    for (n, &marker) in markers.iter().enumerate() {
        let stretch = &events[from..marker];
        let mut i = 0;
        if n > 0 {
            // The previous step's reply, then its results, in order.
            assert_eq!(
                stretch[0]["kind"],
                "assistant/message",
                "step {}: {stretch:?}",
                n + 1
            );
            let reply = &stretch[0]["body"];
            let reply_calls = list(&reply["tool_calls"]);
            previous_calls = reply_calls.len();
            for c in &reply_calls {
                calls.push((
                    c["id"].as_str().expect("id").to_string(),
                    c["arguments"].clone(),
                    c["arguments_text"].as_str().map(str::to_string),
                ));
            }
            i = 1;
            for c in &reply_calls {
                let e = &stretch[i];
                assert_eq!(e["kind"], "tool/result", "step {}: {stretch:?}", n + 1);
                assert_eq!(
                    e["body"]["tool_call_id"], c["id"],
                    "results answer the calls in order"
                );
                let sent = &results[answered];
                assert_eq!(e["body"]["tool_call_id"], sent["call_id"], "{sent}");
                assert_eq!(
                    e["body"]["content"], sent["content"],
                    "the result as the loop sent it"
                );
                answered += 1;
                i += 1;
            }
        }
        let rest: Vec<&str> = stretch[i..]
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or("?"))
            .collect();
        let user = rest.iter().filter(|k| **k == "user/message").count();
        users += user;
        if n == 0 || previous_calls == 0 {
            assert_eq!(
                user,
                1,
                "step {} starts a turn with the user's message: {rest:?}",
                n + 1
            );
        } else {
            assert_eq!(user, 0, "step {} carries only the results: {rest:?}", n + 1);
        }
        for k in &rest {
            assert!(
                ["user/message", "context/snapshot", "request/header"].contains(k),
                "step {}: unexpected {k} before the marker: {rest:?}",
                n + 1
            );
        }
        from = marker + 1;
    }
    // The last step's reply ends the loop: text, no calls.
    let tail = &events[from..];
    assert_eq!(
        tail.len(),
        1,
        "only the last reply after the last step: {tail:?}"
    );
    assert_eq!(tail[0]["kind"], "assistant/message");
    assert!(
        list(&tail[0]["body"]["tool_calls"]).is_empty(),
        "{}",
        tail[0]
    );
    assert_eq!(
        answered,
        results.len(),
        "every result the loop sent is in the log"
    );
    assert_eq!(users as u64, TURNS, "one user message per turn");
    calls
}

/// Runs an example loop and checks the bodies the stub received and the session log.
fn example_loop(script: &str, extra: &[&str], format: &str, stub_path: &str) {
    let dir = installed();
    let rig = Rig::start();
    let turns = TURNS.to_string();
    let mut args = vec![script, "--agent", "coder", "--turns", &turns];
    args.extend_from_slice(extra);
    let openai_base = format!("{}/v1", rig.stub.url);
    let env = [
        ("PROMPTD_URL", rig.daemon.url.as_str()),
        ("OPENAI_BASE_URL", openai_base.as_str()),
        ("OPENAI_API_KEY", "sk-stub"),
        ("ANTHROPIC_BASE_URL", rig.stub.url.as_str()),
        ("ANTHROPIC_API_KEY", "sk-ant-stub"),
    ];
    let (code, out, err) = run_bounded(node(&dir, &args, &env));
    assert_eq!(code, Some(0), "{script} {extra:?}: {}", err.trim());
    let summary: Value = out
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("{script}: no JSON summary line in {out:?}"));
    assert_eq!(summary["format"], format, "{summary}");
    let session = summary["session"].as_str().expect("session").to_string();
    let steps = summary["steps"].as_u64().expect("steps") as usize;
    assert_eq!(
        steps as u64,
        2 * TURNS,
        "a tool round and an answer per turn: {summary}"
    );

    // What the provider received: exactly what the daemon returned for each step, byte for byte.
    let bodies = rig.stub.bodies(stub_path);
    assert_eq!(bodies.len(), steps, "one request per step");
    for (i, body) in bodies.iter().enumerate() {
        assert!(
            *body == rig.rebuilt(&session, i + 1, format),
            "step {}: the SDK sent a body other than promptd's:\n{body}",
            i + 1
        );
    }

    // The log: the loop's turns, replies, calls and results, in order.
    let logged = check_log(&rig.events(&session), steps, &summary);
    let reported = list(&summary["tool_calls"]);
    assert!(
        reported.len() >= 3,
        "two tool rounds (one call, then two): {summary}"
    );
    let ids = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        logged.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
        ids(&reported),
        "the calls record() handed the loop are the calls in the log"
    );
    for (c, r) in logged.iter().zip(&reported) {
        assert_eq!(
            c.1, r["arguments"],
            "{}: arguments parsed once, as the log holds them",
            c.0
        );
    }

    // The last body carries every call as the model made it and every result as the loop sent it.
    let last: Value = serde_json::from_str(bodies.last().unwrap()).expect("JSON");
    let (sent_calls, sent_results) = calls_and_results(format, &last);
    let expected: Vec<SentCall> = logged
        .iter()
        .map(|(id, arguments, raw)| SentCall {
            id: id.clone(),
            arguments: arguments.clone(),
            // The OpenAI formats send the model's own string back unchanged.
            raw: if format == "anthropic" {
                None
            } else {
                Some(raw.clone().expect("the model's arguments string"))
            },
        })
        .collect();
    assert_eq!(sent_calls, expected, "the calls in the last body");
    let results: Vec<(String, String)> = list(&summary["results"])
        .iter()
        .map(|r| {
            (
                r["call_id"].as_str().unwrap().to_string(),
                r["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(sent_results, results, "the results in the last body");
    if format == "anthropic" {
        // Thinking blocks and signatures go back exactly as the reply brought them.
        let replies: Vec<Value> = rig
            .events(&session)
            .iter()
            .filter(|e| e["kind"] == "assistant/message")
            .map(|e| e["body"]["blocks"].clone())
            .collect();
        let turns: Vec<Value> = list(&last["messages"])
            .into_iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| m["content"].clone())
            .collect();
        assert_eq!(turns.len(), steps - 1, "the replies before the last step");
        for (turn, blocks) in turns.iter().zip(&replies) {
            assert_eq!(
                turn, blocks,
                "an assistant turn is the reply's blocks, unchanged"
            );
            // The stub thinks before each tool call: its signed blocks are in the turn.
            let has = |t: &str| list(blocks).iter().any(|b| b["type"] == t);
            assert_eq!(has("tool_use"), has("thinking"), "{blocks}");
        }
    }
    // The provider saw the results: each final answer names the calls it read.
    let answers = summary["answers"].to_string();
    for id in ids(&reported) {
        assert!(answers.contains(&id), "no answer names {id}: {answers}");
    }
}

#[test]
fn openai_chat_completions_example_loop() {
    example_loop(
        "examples/openai_loop.mjs",
        &["--api", "chat"],
        "openai",
        "/v1/chat/completions",
    );
}

#[test]
fn openai_responses_example_loop() {
    example_loop(
        "examples/openai_loop.mjs",
        &["--api", "responses"],
        "openai-responses",
        "/v1/responses",
    );
}

#[test]
fn anthropic_example_loop_recording_the_whole_message() {
    example_loop(
        "examples/anthropic_loop.mjs",
        &["--reply", "message"],
        "anthropic",
        "/v1/messages",
    );
}

#[test]
fn anthropic_example_loop_recording_the_content_blocks() {
    example_loop(
        "examples/anthropic_loop.mjs",
        &["--reply", "blocks"],
        "anthropic",
        "/v1/messages",
    );
}

/// The config of the client tests' daemon (see test/daemon.mjs): two copies of the scripted
/// fixture, a token, model settings for every format and a 1 MiB body limit.
fn client_test_config(token: &str) -> String {
    format!(
        r#"token = "{token}"
model = {{ model = "gpt-test", max_tokens = 64 }}

[limits]
max_body_mb = 1

[plugins.echo]
config = {{ "fact_section.text" = "0", "variable.name" = "Ada", "tool.read_file" = '{{"type":"object","properties":{{"path":{{"type":"string"}}}}}}' }}

[plugins.trapper]
scope = "crashy"
config = {{ "trap_section.boom" = "1" }}
"#
    )
}

/// The client's own suites, each file against a fresh daemon: routes, bookkeeping, typed
/// errors (an unknown session, a 422 from assembly, a daemon not running, ...), the event
/// stream, and the installed package's shape and types.
#[test]
fn the_client_test_suites() {
    let dir = installed();
    let mut files = Vec::new();
    files_under(&dir.join("test"), &mut files);
    let mut suites: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_name()?.to_str())
        .filter(|n| n.ends_with(".test.mjs"))
        .map(|n| format!("test/{n}"))
        .collect();
    suites.sort();
    assert!(suites.len() >= 4, "the client's test suites: {suites:?}");
    let mut failures = Vec::new();
    for suite in &suites {
        let token = format!("ts-client-{}", std::process::id());
        let folder = Folder::new().scripted("echo").scripted("trapper");
        let (daemon, _state) = folder.serve(&client_test_config(&token));
        let env = [
            ("PROMPTD_URL", daemon.url.as_str()),
            ("PROMPTD_TOKEN", token.as_str()),
        ];
        let (code, out, err) = run_bounded(node(&dir, &["--test", suite], &env));
        let passed = out
            .lines()
            .find_map(|l| l.strip_prefix("# pass "))
            .unwrap_or("0");
        if code != Some(0) || passed == "0" {
            failures.push(format!("{suite}: exit {code:?}\n{out}\n{err}"));
        }
        daemon.stop();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The `js` block right under the TypeScript marker of `docs/clients.md`, and the number of
/// promptd lines the page states below it.
fn docs_loop() -> (String, usize) {
    let readme =
        std::fs::read_to_string(repo_root().join("docs/clients.md")).expect("read docs/clients.md");
    let marker = readme
        .find("<!-- typescript-client:")
        .expect("docs/clients.md has the typescript-client marker");
    let section = &readme[marker..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let open = section
        .find("```js\n")
        .expect("a ```js block in the TypeScript section")
        + 6;
    let close = open
        + section[open..]
            .find("\n```\n")
            .expect("the block's closing fence");
    let code = section[open..=close].to_string();
    let after = &section[close..];
    let stated = after
        .split("**")
        .nth(1)
        .and_then(|s| s.strip_suffix(" lines of promptd code"))
        .and_then(|n| n.parse().ok())
        .expect("docs/clients.md states `**N lines of promptd code**` right below the loop");
    (code, stated)
}

/// The TypeScript loop of `docs/clients.md`, as written, against the daemon and the stub: it
/// runs, every body reached the provider as promptd built it, every call got its result, and
/// the page's count of promptd lines is the count of lines in it that use the client.
#[test]
fn the_docs_loop_runs_as_written() {
    let dir = installed();
    let (code, stated) = docs_loop();
    let promptd_lines: Vec<&str> = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| l.contains("promptd") || l.contains("session"))
        .collect();
    assert_eq!(
        promptd_lines.len(),
        stated,
        "docs/clients.md says {stated} promptd lines; these use the client: {promptd_lines:#?}"
    );

    let rig = Rig::start();
    // In the install folder, so `promptd-client` and `openai` resolve to the installed packages.
    let script = tempfile::Builder::new()
        .prefix("readme-loop-")
        .suffix(".mjs")
        .tempfile_in(&dir)
        .expect("a file in the install folder");
    std::fs::write(script.path(), &code).expect("write the docs/clients.md loop");
    let openai_base = format!("{}/v1", rig.stub.url);
    let env = [
        ("PROMPTD_URL", rig.daemon.url.as_str()),
        ("OPENAI_BASE_URL", openai_base.as_str()),
        ("OPENAI_API_KEY", "sk-stub"),
    ];
    let path = script.path().to_str().expect("utf-8 path");
    let (status, out, err) = run_bounded(node(&dir, &[path], &env));
    assert_eq!(
        status,
        Some(0),
        "the docs/clients.md loop failed:\n{}",
        err.trim()
    );

    let bodies = rig.stub.bodies("/v1/chat/completions");
    assert!(
        !bodies.is_empty(),
        "the docs/clients.md loop sent nothing to the provider"
    );
    let first: Value = serde_json::from_str(&bodies[0]).expect("JSON");
    // The daemon's one session with steps is the loop's; its body carries the agent's cache
    // key (K6).
    let (session, agent) = rig.daemon.stepped_session();
    assert_eq!(first["prompt_cache_key"], format!("promptd-{agent}"));
    for (i, body) in bodies.iter().enumerate() {
        assert!(
            *body == rig.rebuilt(&session, i + 1, "openai"),
            "step {}: the SDK sent a body other than promptd's:\n{body}",
            i + 1
        );
    }
    let events = rig.events(&session);
    let count = |kind: &str| events.iter().filter(|e| e["kind"] == kind).count();
    assert_eq!(count("step"), bodies.len(), "one step per provider request");
    assert_eq!(
        count("assistant/message"),
        bodies.len(),
        "each reply recorded"
    );
    let questions = count("user/message");
    assert!(questions >= 2, "the loop asks its questions: {events:?}");
    assert_eq!(
        bodies.len(),
        2 * questions,
        "a tool round and an answer per question"
    );
    let calls: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "assistant/message")
        .flat_map(|e| e["body"]["tool_calls"].as_array().into_iter().flatten())
        .map(|c| c["id"].as_str().expect("id"))
        .collect();
    let results: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool/result")
        .map(|e| e["body"]["tool_call_id"].as_str().expect("id"))
        .collect();
    assert!(!calls.is_empty(), "the stub makes tool calls");
    assert_eq!(results, calls, "every call answered once, in order");
    // It prints one answer per question, naming the results the provider read.
    assert_eq!(out.lines().count(), questions, "{out}");
    for id in &calls {
        assert!(out.contains(id), "no printed answer names {id}: {out}");
    }
}
