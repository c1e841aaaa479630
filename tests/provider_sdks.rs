//! Conformance with the real provider clients (Q8): every body the daemon returns is handed,
//! unchanged, to the official OpenAI and Anthropic SDKs (Python and JavaScript), whose replies
//! are recorded back in the SDKs' own shapes, for a few steps of a real agent loop with tool
//! calls. The SDKs talk to `tests/sdk_loops/stub_provider.py`, a local stand-in for both APIs
//! that refuses any body breaking the providers' documented rules (400 naming the rule), so a
//! run passes only when every body of the loop is one the providers accept.
//!
//! The daemon runs on the bundled Rust plugins with the repository's example config
//! (`promptd.toml`), for every agent it names. The loops are `tests/sdk_loops/*.py` and
//! `tests/sdk_loops/js/*.mjs`; the clients are installed, pinned, by `cargo xtask test`
//! (`tests/sdk_loops/install.sh`). The last test checks the stub itself refuses known-bad
//! bodies, so its checks cannot silently pass everything.
//!
//! Richer requests: loops whose user message carries a PNG, an image by URL and a PDF, and whose
//! tool results carry a PNG, through every SDK, with each medium checked where its format puts
//! it; an agent with `tool_subset = "allowed_tools"` whose `tools` stay byte-identical while
//! read-only mode toggles (the subset goes into `tool_choice`; Anthropic gets it as `tools`);
//! and one image sent in 50 steps stored once in the session database.

use promptd_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::{request, state_dir, Served};
use common::process::Bounded;
use common::{repo_root, Folder};
use serde_json::{json, Value};

/// Steps per loop: two tool rounds (one call, then two in parallel), each answered.
const STEPS: u64 = 4;
/// One loop takes 1–3 s; the bound only stops a hung client.
const LOOP_BOUND: Duration = Duration::from_secs(120);
/// The stub's own bound; a test stops it long before.
const STUB_BOUND_S: &str = "900";

fn loops_dir() -> PathBuf {
    repo_root().join("tests/sdk_loops")
}

fn missing(what: &Path) -> String {
    format!(
        "{} is missing: `cargo xtask test` installs the provider SDKs these tests drive \
         (it runs tests/sdk_loops/install.sh)",
        what.display()
    )
}

/// The venv holding the pinned `openai` and `anthropic` Python packages.
fn python() -> PathBuf {
    let python = loops_dir().join(".venv/bin/python");
    assert!(python.is_file(), "{}", missing(&python));
    python
}

/// `node`, with the pinned `openai` and `@anthropic-ai/sdk` npm packages next to the scripts.
fn node() -> Command {
    for package in ["openai", "@anthropic-ai/sdk"] {
        let dir = loops_dir().join("js/node_modules").join(package);
        assert!(dir.join("package.json").is_file(), "{}", missing(&dir));
    }
    Command::new("node")
}

/// The stub provider on a free loopback port. It also exits when its stdin (held here) closes.
struct Stub {
    _child: Bounded,
    url: String,
}

impl Stub {
    fn start() -> Stub {
        Self::launch(None)
    }

    /// With every request it gets appended to `log` (one JSON line: path, status, error, body).
    fn start_logged(log: &Path) -> Stub {
        Self::launch(Some(log))
    }

    fn launch(log: Option<&Path>) -> Stub {
        let (child, url) = common::process::start_stub_provider(&python(), STUB_BOUND_S, log);
        Stub { _child: child, url }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = request(&self.url, "POST", path, Some(&body.to_string()), None);
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("stub {path} -> {status}: not JSON ({e}): {text}"));
        (status, value)
    }
}

/// Runs `cmd` to completion within [`LOOP_BOUND`]; returns (exit code, stdout, stderr).
fn run_bounded(cmd: Command) -> (Option<i32>, String, String) {
    common::process::run_bounded(cmd, LOOP_BOUND)
}

/// The agents the example config names (`[agents.NAME]` headers, not their sub-tables).
fn example_agents() -> Vec<String> {
    let path = repo_root().join("promptd.toml");
    let text = std::fs::read_to_string(&path).expect("read promptd.toml");
    let agents: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("[agents.")?.strip_suffix(']'))
        .filter(|name| !name.contains('.'))
        .map(str::to_string)
        .collect();
    assert!(!agents.is_empty(), "{} names no agent", path.display());
    agents
}

#[derive(Clone, Copy)]
enum Runtime {
    Python,
    Node,
}

/// One SDK loop: which script, with which arguments, asking promptd for which format.
#[derive(Clone, Copy)]
struct Client {
    runtime: Runtime,
    script: &'static str,
    args: &'static [&'static str],
    format: &'static str,
    /// Whether the loop records its replies with their usage (so each has a cache outcome).
    records_usage: bool,
}

/// The command running `client`'s loop script (its arguments follow).
fn loop_command(client: &Client) -> Command {
    match client.runtime {
        Runtime::Python => {
            let mut cmd = Command::new(python());
            cmd.env("PYTHONDONTWRITEBYTECODE", "1")
                .arg(loops_dir().join(client.script));
            cmd
        }
        Runtime::Node => {
            let mut cmd = node();
            cmd.arg(loops_dir().join("js").join(client.script));
            cmd
        }
    }
}

/// Runs `client`'s loop of [`STEPS`] steps for `agent` against the daemon and the stub.
fn run_loop(
    client: &Client,
    daemon: &str,
    stub: &str,
    agent: &str,
) -> (Option<i32>, String, String) {
    let mut cmd = loop_command(client);
    cmd.arg(daemon)
        .arg(stub)
        .arg(agent)
        .args(["--steps", &STEPS.to_string()])
        .args(client.args);
    run_bounded(cmd)
}

/// Runs `client`'s loop for every agent of the example config against a fresh daemon and stub;
/// fails listing every agent whose loop failed, with the loop's own error.
fn conforms(client: Client) {
    // Missing clients fail here, before a daemon is started for nothing.
    python();
    if let Runtime::Node = client.runtime {
        node();
    }
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    let (_dir, state) = state_dir();
    let daemon = Served::start(folder.path(), &repo_root().join("promptd.toml"), &state);
    let stub = Stub::start();
    let mut failures = Vec::new();
    for agent in example_agents() {
        let (code, out, err) = run_loop(&client, &daemon.url, &stub.url, &agent);
        if code != Some(0) {
            failures.push(format!("agent {agent}: exit {code:?}: {}", err.trim()));
            continue;
        }
        let summary: Value = out
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("agent {agent}: no JSON summary line in {out:?}"));
        let calls = summary["tool_calls"].as_u64().unwrap_or(0);
        let fine = summary["steps"] == STEPS
            && summary["format"] == client.format
            && summary["agent"] == agent.as_str()
            && calls >= 1
            && summary["tool_results"] == calls;
        if !fine {
            failures.push(format!(
                "agent {agent}: want {STEPS} steps in format {} with at least one tool call, \
                 each answered; got {summary}",
                client.format
            ));
        }
        // Each reply recorded with its usage has a cache outcome the log explains: the
        // session's first `cold` (or `uncacheable`, below the minimum), never `unexplained`.
        let outcomes: Vec<Option<&str>> = summary["cache"]
            .as_array()
            .map(|a| a.iter().map(Value::as_str).collect())
            .unwrap_or_default();
        let with_usage = client.records_usage;
        let explained = outcomes.len() as u64 == STEPS
            && outcomes
                .iter()
                .all(|o| o.is_some() == with_usage && *o != Some("unexplained"))
            && (!with_usage || matches!(outcomes[0], Some("cold" | "uncacheable")));
        if !explained {
            failures.push(format!(
                "agent {agent}: cache outcomes {outcomes:?} (usage recorded: {with_usage})"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} {:?} (format {}):\n{}",
        client.script,
        client.args,
        client.format,
        failures.join("\n")
    );
}

#[test]
fn openai_python_chat_completions() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "openai_chat.py",
        args: &[],
        records_usage: true,
        format: "openai",
    });
}

#[test]
fn openai_python_responses() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "openai_responses.py",
        args: &[],
        records_usage: true,
        format: "openai-responses",
    });
}

#[test]
fn anthropic_python_reply_as_content_blocks() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "anthropic_messages.py",
        args: &["--reply", "blocks"],
        records_usage: false,
        format: "anthropic",
    });
}

#[test]
fn anthropic_python_reply_as_whole_message() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "anthropic_messages.py",
        args: &["--reply", "message"],
        records_usage: true,
        format: "anthropic",
    });
}

#[test]
fn openai_js_chat_completions() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "openai_chat.mjs",
        args: &[],
        records_usage: true,
        format: "openai",
    });
}

#[test]
fn openai_js_responses() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "openai_responses.mjs",
        args: &[],
        records_usage: true,
        format: "openai-responses",
    });
}

#[test]
fn anthropic_js_reply_as_content_blocks() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "anthropic_messages.mjs",
        args: &["--reply", "blocks"],
        records_usage: false,
        format: "anthropic",
    });
}

#[test]
fn anthropic_js_reply_as_whole_message() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "anthropic_messages.mjs",
        args: &["--reply", "message"],
        records_usage: true,
        format: "anthropic",
    });
}

// --- Richer requests: images and documents, tool subsets that keep the cache ---------------------

/// A daemon on the bundled Rust plugins with `config`, a stub logging every body, and a scratch
/// folder for the stub's log and the loops' dumps. Fields drop in order: the processes first.
struct Rig {
    daemon: Served,
    stub: Stub,
    state: PathBuf,
    work: tempfile::TempDir,
    _state_dir: tempfile::TempDir,
    _folder: Folder,
}

impl Rig {
    /// `extra` is appended to the repository's `promptd.toml`.
    fn start(extra: &str) -> Rig {
        python();
        let folder = Folder::new()
            .bundled("identity")
            .bundled("persona")
            .bundled("tools")
            .bundled("workspace");
        let work = tempfile::tempdir().expect("tempdir");
        let example = std::fs::read_to_string(repo_root().join("promptd.toml")).expect("read");
        let config = work.path().join("promptd.toml");
        std::fs::write(&config, format!("{example}\n{extra}")).expect("write config");
        let (state_dir, state) = state_dir();
        let log = work.path().join("promptd.log");
        let daemon = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Served::start_logged(folder.path(), &config, &state, &log)
        }))
        .unwrap_or_else(|_| {
            panic!(
                "promptd serve did not start with this config:\n{extra}\nits log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        let stub = Stub::start_logged(&work.path().join("stub.jsonl"));
        Rig {
            daemon,
            stub,
            state,
            work,
            _state_dir: state_dir,
            _folder: folder,
        }
    }

    fn dump_dir(&self) -> PathBuf {
        self.work.path().join("dump")
    }

    /// Runs `client`'s loop for `agent` with `args`; returns its JSON summary, or fails with
    /// the loop's own error.
    fn run(&self, client: &Client, agent: &str, args: &[&str]) -> Value {
        let mut cmd = loop_command(client);
        cmd.arg(&self.daemon.url)
            .arg(&self.stub.url)
            .arg(agent)
            .args(client.args)
            .args(args);
        let (code, out, err) = run_bounded(cmd);
        assert_eq!(
            code,
            Some(0),
            "{} {:?} {args:?} (format {}), agent {agent}: {}",
            client.script,
            client.args,
            client.format,
            err.trim()
        );
        let summary: Value = out
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no JSON summary line in {out:?}"));
        assert_eq!(summary["format"], client.format, "{summary}");
        summary
    }

    /// Every request the stub got, in order: (status, raw body). All must have been accepted.
    fn stub_bodies(&self) -> Vec<String> {
        let log = self.work.path().join("stub.jsonl");
        let text = std::fs::read_to_string(&log).expect("read the stub's log");
        text.lines()
            .map(|line| {
                let entry: Value = serde_json::from_str(line).expect("stub log line");
                assert_eq!(entry["status"], 200, "the stub refused a body: {entry}");
                entry["body"].as_str().expect("body").to_string()
            })
            .collect()
    }

    /// Step `n`'s reply as promptd sent it to the loop (`--dump`), byte for byte.
    fn dumped_step(&self, n: u64) -> String {
        let path = self.dump_dir().join(format!("step-{n}.json"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// The raw text of the value of member `key` of the JSON object `text` (top level), so bytes,
/// not just values, can be compared. Checked against the parsed value.
fn raw_member<'a>(text: &'a str, key: &str) -> &'a str {
    let b = text.as_bytes();
    let (mut depth, mut i, mut expect_key) = (0usize, 0usize, false);
    let mut start = None;
    let found = loop {
        assert!(i < b.len(), "no member {key:?} at the top of {text}");
        match b[i] {
            b'"' => {
                let from = i + 1;
                i += 1;
                while b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if depth == 1 && expect_key {
                    expect_key = false;
                    if &text[from..i] == key {
                        let after = &text[i + 1..];
                        let rest = &after[after.find(':').expect("a colon after a key") + 1..];
                        start = Some(text.len() - rest.trim_start().len());
                    }
                }
            }
            b'{' | b'[' => {
                depth += 1;
                expect_key = depth == 1;
            }
            b'}' | b']' if depth == 1 => {
                if let Some(s) = start {
                    break &text[s..i];
                }
                depth -= 1;
            }
            b'}' | b']' => depth -= 1,
            b',' if depth == 1 => {
                if let Some(s) = start {
                    break &text[s..i];
                }
                expect_key = true;
            }
            _ => {}
        }
        i += 1;
    };
    let found = found.trim_end();
    let whole: Value = serde_json::from_str(text).expect("JSON");
    let part: Value = serde_json::from_str(found).expect("the member's JSON");
    assert_eq!(
        part, whole[key],
        "raw_member({key:?}) picked the wrong span"
    );
    found
}

fn python_client(script: &'static str, format: &'static str) -> Client {
    Client {
        runtime: Runtime::Python,
        script,
        args: &[],
        records_usage: false,
        format,
    }
}

fn media<'a>(summary: &'a Value, name: &str) -> &'a str {
    summary["media"][name]
        .as_str()
        .unwrap_or_else(|| panic!("the loop's summary names no {name}: {summary}"))
}

const IMAGE_URL: &str = "https://example.com/diagram.png";

/// The runs of consecutive items of `items` for which `is` holds (tool rounds).
fn runs(items: &[Value], is: impl Fn(&Value) -> bool) -> Vec<(usize, &[Value])> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < items.len() {
        if is(&items[i]) {
            let from = i;
            while i < items.len() && is(&items[i]) {
                i += 1;
            }
            out.push((from, &items[from..i]));
        } else {
            i += 1;
        }
    }
    out
}

/// Which medium a content part is, by the fields that carry it in each format (`None` for
/// plain text and anything else).
fn medium_of(part: &Value, summary: &Value) -> Option<&'static str> {
    let (photo, shot, pdf) = (
        media(summary, "photo"),
        media(summary, "screenshot"),
        media(summary, "pdf"),
    );
    let png_url = |b64: &str| format!("data:image/png;base64,{b64}");
    let pdf_url = format!("data:application/pdf;base64,{pdf}");
    let url = part["image_url"]["url"]
        .as_str()
        .or(part["image_url"].as_str())
        .or(part["source"]["url"].as_str());
    let data = part["source"]["data"].as_str();
    let file_data = part["file"]["file_data"]
        .as_str()
        .or(part["file_data"].as_str());
    if url == Some(&png_url(photo)) || data == Some(photo) {
        Some("photo")
    } else if url == Some(&png_url(shot)) || data == Some(shot) {
        Some("screenshot")
    } else if url == Some(IMAGE_URL) {
        Some("url")
    } else if file_data == Some(&pdf_url) || (data == Some(pdf) && part["type"] == "document") {
        Some("pdf")
    } else {
        None
    }
}

/// Checks the last body of a `--media first` run of 4 steps (two tool rounds, the first result
/// of each carrying the screenshot): step 1's user message has its text, the photo, the image
/// by URL and the PDF in that order, in the format's own part shapes; each round's screenshot
/// is where the format puts a tool's images; no medium is sent twice.
fn check_media_placement(format: &str, body: &Value, summary: &Value) {
    let text = body.to_string();
    for (name, times) in [("photo", 1), ("pdf", 1), ("screenshot", 2)] {
        let found = text.matches(media(summary, name)).count();
        assert_eq!(
            found, times,
            "the {name} should be in the body {times} time(s): {body}"
        );
    }
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let items = if format == "openai-responses" {
        list(&body["input"])
    } else {
        list(&body["messages"])
    };
    // Step 1's user message.
    let first = items
        .iter()
        .find(|m| {
            m["role"] == "user"
                && list(&m["content"])
                    .iter()
                    .any(|p| medium_of(p, summary) == Some("photo"))
        })
        .unwrap_or_else(|| panic!("no user message holds the photo: {body}"));
    let parts = list(&first["content"]);
    let kinds: Vec<String> = parts
        .iter()
        .map(|p| match medium_of(p, summary) {
            Some(m) => m.to_string(),
            None => p["type"].as_str().unwrap_or("?").to_string(),
        })
        .collect();
    let text_type = if format == "openai-responses" {
        "input_text"
    } else {
        "text"
    };
    assert_eq!(
        kinds.iter().take(4).map(String::as_str).collect::<Vec<_>>(),
        [text_type, "photo", "url", "pdf"],
        "step 1's user message: text, photo, image URL, PDF in order: {first}"
    );
    let expected_types: [&str; 3] = match format {
        "openai" => ["image_url", "image_url", "file"],
        "anthropic" => ["image", "image", "document"],
        _ => ["input_image", "input_image", "input_file"],
    };
    for (part, want) in parts[1..4].iter().zip(expected_types) {
        assert_eq!(part["type"], want, "{part}");
    }
    match format {
        "openai" => {
            assert_eq!(parts[3]["file"]["filename"], "spec.pdf", "{}", parts[3]);
            let rounds = runs(&items, |m| m["role"] == "tool");
            assert_eq!(rounds.len(), 2, "two tool rounds: {body}");
            for (from, tools) in rounds {
                let id = tools[0]["tool_call_id"].as_str().expect("tool_call_id");
                for tool in tools {
                    assert!(
                        tool["content"].is_string()
                            || list(&tool["content"]).iter().all(|p| p["type"] == "text"),
                        "a tool message carries text only: {tool}"
                    );
                }
                assert!(
                    tools[0]["content"].to_string().contains("output 0"),
                    "the tool message keeps the result's text: {}",
                    tools[0]
                );
                let next = &items[from + tools.len()];
                let images = list(&next["content"]);
                assert!(
                    next["role"] == "user"
                        && images.len() == 2
                        && images[0] == json!({"type": "text", "text": attachments_label(id)})
                        && images[1]["type"] == "image_url"
                        && medium_of(&images[1], summary) == Some("screenshot"),
                    "after the tool messages of a round, one user message with \
                     {:?} and the screenshot; got {next}",
                    attachments_label(id)
                );
            }
        }
        "anthropic" => {
            assert_eq!(parts[3]["title"], "spec.pdf", "{}", parts[3]);
            assert_eq!(parts[3]["source"]["media_type"], "application/pdf");
            assert_eq!(parts[1]["source"]["type"], "base64", "{}", parts[1]);
            assert_eq!(parts[2]["source"]["type"], "url", "{}", parts[2]);
            let turns: Vec<&Value> = items
                .iter()
                .filter(|m| {
                    list(&m["content"])
                        .iter()
                        .any(|b| b["type"] == "tool_result")
                })
                .collect();
            assert_eq!(turns.len(), 2, "two tool rounds: {body}");
            for turn in turns {
                let result = &list(&turn["content"])[0];
                let content = list(&result["content"]);
                assert!(
                    content.len() == 2
                        && content[0]["type"] == "text"
                        && content[0]["text"]
                            .as_str()
                            .is_some_and(|t| t.contains("output 0"))
                        && content[1]["type"] == "image"
                        && content[1]["source"]["type"] == "base64"
                        && content[1]["source"]["media_type"] == "image/png"
                        && medium_of(&content[1], summary) == Some("screenshot"),
                    "the first tool_result of a round holds its text and the screenshot: {result}"
                );
            }
        }
        _ => {
            assert_eq!(parts[3]["filename"], "spec.pdf", "{}", parts[3]);
            for image in &parts[1..3] {
                assert_eq!(image["detail"], "auto", "{image}");
            }
            let rounds = runs(&items, |i| i["type"] == "function_call_output");
            assert_eq!(rounds.len(), 2, "two tool rounds: {body}");
            for (_, outputs) in rounds {
                let output = list(&outputs[0]["output"]);
                assert!(
                    output.len() == 2
                        && output[0]["type"] == "input_text"
                        && output[0]["text"]
                            .as_str()
                            .is_some_and(|t| t.contains("output 0"))
                        && output[1]["type"] == "input_image"
                        && medium_of(&output[1], summary) == Some("screenshot"),
                    "the first function_call_output of a round is its text and the screenshot: \
                     {}",
                    outputs[0]
                );
                for other in &outputs[1..] {
                    assert!(other["output"].is_string(), "a text-only result: {other}");
                }
            }
        }
    }
}

/// The text before a tool result's media in the user message that carries them for Chat
/// Completions (docs/formats.md, "Images and documents": tool messages carry only text).
fn attachments_label(call_id: &str) -> String {
    format!("Attachments of the result of tool call {call_id}:")
}

/// A `--media first` loop of four steps for agent `coder`: every body the SDK sends is
/// accepted, and the last one holds every medium where its format puts it.
fn media_loop(client: Client) {
    let rig = Rig::start("");
    let summary = rig.run(&client, "coder", &["--steps", "4", "--media", "first"]);
    assert!(
        summary["steps"] == 4
            && summary["tool_calls"] == 3
            && summary["tool_results"] == summary["tool_calls"],
        "four steps, two tool rounds (one call, then two), each answered: {summary}"
    );
    let bodies = rig.stub_bodies();
    assert_eq!(bodies.len(), 4, "one request per step");
    let last: Value = serde_json::from_str(bodies.last().unwrap()).expect("JSON");
    check_media_placement(client.format, &last, &summary);
}

#[test]
fn openai_python_chat_completions_with_images_and_a_pdf() {
    media_loop(python_client("openai_chat.py", "openai"));
}

#[test]
fn openai_python_responses_with_images_and_a_pdf() {
    media_loop(python_client("openai_responses.py", "openai-responses"));
}

#[test]
fn anthropic_python_with_images_and_a_pdf() {
    media_loop(python_client("anthropic_messages.py", "anthropic"));
}

#[test]
fn openai_js_chat_completions_with_images_and_a_pdf() {
    media_loop(Client {
        runtime: Runtime::Node,
        script: "openai_chat.mjs",
        args: &[],
        records_usage: false,
        format: "openai",
    });
}

#[test]
fn openai_js_responses_with_images_and_a_pdf() {
    media_loop(Client {
        runtime: Runtime::Node,
        script: "openai_responses.mjs",
        args: &[],
        records_usage: false,
        format: "openai-responses",
    });
}

#[test]
fn anthropic_js_with_images_and_a_pdf() {
    media_loop(Client {
        runtime: Runtime::Node,
        script: "anthropic_messages.mjs",
        args: &[],
        records_usage: false,
        format: "anthropic",
    });
}

/// An agent that keeps every tool in `tools` and says the step's subset in `tool_choice`.
const SUBSET_AGENT: &str = "[agents.subset]\ntool_subset = \"allowed_tools\"\n";
const ALL_TOOLS: [&str; 4] = ["bash", "list_dir", "read_file", "write_file"];
const READ_ONLY_TOOLS: [&str; 2] = ["list_dir", "read_file"];
const SUBSET_STEPS: u64 = 10;

/// The tools shown in step `n` of a `--toggle-read-only` loop: odd steps are read-only.
fn shown(n: u64) -> Vec<&'static str> {
    if n % 2 == 1 {
        READ_ONLY_TOOLS.to_vec()
    } else {
        ALL_TOOLS.to_vec()
    }
}

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
}

/// The tool names of a body's `tools`, in any format.
fn tool_names(body: &Value) -> Vec<String> {
    let tools = body["tools"].as_array().cloned().unwrap_or_default();
    tools
        .iter()
        .map(|t| {
            t["function"]["name"]
                .as_str()
                .or(t["name"].as_str())
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

/// The names an `allowed_tools` tool_choice allows, checking its shape for `format`.
fn allowed_names(format: &str, choice: &Value) -> Vec<String> {
    assert_eq!(choice["type"], "allowed_tools", "tool_choice: {choice}");
    let (mode, tools) = if format == "openai" {
        (
            &choice["allowed_tools"]["mode"],
            &choice["allowed_tools"]["tools"],
        )
    } else {
        (&choice["mode"], &choice["tools"])
    };
    assert_eq!(mode, "auto", "tool_choice: {choice}");
    tools
        .as_array()
        .unwrap_or_else(|| panic!("tool_choice names no tools: {choice}"))
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function", "{choice}");
            let name = if format == "openai" {
                &t["function"]["name"]
            } else {
                &t["name"]
            };
            name.as_str().expect("a tool name").to_string()
        })
        .collect()
}

/// Ten steps toggling read-only mode for an `allowed_tools` agent through an OpenAI client:
/// every body is accepted; `tools` (all four tools) is byte-identical in every body promptd
/// returned and in every body the SDK sent; `tool_choice` names the step's shown tools; the
/// session records one `request/header`.
fn allowed_tools_keep_the_tools(client: Client) {
    let rig = Rig::start(SUBSET_AGENT);
    let dump = rig.dump_dir();
    let summary = rig.run(
        &client,
        "subset",
        &[
            "--steps",
            &SUBSET_STEPS.to_string(),
            "--toggle-read-only",
            "--dump",
            dump.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(summary["steps"], SUBSET_STEPS, "{summary}");
    assert!(
        summary["tool_calls"].as_u64() >= Some(1),
        "the stub calls the allowed tools: {summary}"
    );
    let mut first_tools: Option<String> = None;
    let mut choices = Vec::new();
    for n in 1..=SUBSET_STEPS {
        let raw = rig.dumped_step(n);
        let request = raw_member(&raw, "request");
        let tools = raw_member(request, "tools");
        match &first_tools {
            None => first_tools = Some(tools.to_string()),
            Some(first) => assert_eq!(
                tools, first,
                "step {n}: `tools` must be byte-identical in every step"
            ),
        }
        let body: Value = serde_json::from_str(request).expect("JSON");
        assert_eq!(
            sorted(tool_names(&body)),
            ALL_TOOLS,
            "step {n}: tools keeps every tool the agent can see"
        );
        let allowed = allowed_names(client.format, &body["tool_choice"]);
        assert_eq!(
            sorted(allowed),
            shown(n),
            "step {n} ({}): tool_choice names the shown tools: {}",
            if n % 2 == 1 { "read-only" } else { "writable" },
            body["tool_choice"]
        );
        choices.push(body["tool_choice"].clone());
    }
    assert_ne!(choices[0], choices[1], "tool_choice changes with the mode");
    // What the provider got: the SDK's own serialization keeps `tools` byte-stable too.
    let sent = rig.stub_bodies();
    assert_eq!(sent.len() as u64, SUBSET_STEPS, "one request per step");
    let sent_tools: Vec<&str> = sent.iter().map(|b| raw_member(b, "tools")).collect();
    assert!(
        sent_tools.iter().all(|t| *t == sent_tools[0]),
        "the SDK sent `tools` byte-identical in every request: {sent_tools:#?}"
    );
    let session = summary["session"]
        .as_str()
        .expect("the loop names its session");
    let events = rig
        .daemon
        .ok("GET", &format!("/v1/sessions/{session}/events"), None);
    let headers: Vec<&Value> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "request/header")
        .collect();
    assert_eq!(
        headers.len(),
        1,
        "one request/header for the whole session (the header does not change with the \
         subset): {headers:?}"
    );
}

#[test]
fn allowed_tools_openai_python_chat_completions() {
    allowed_tools_keep_the_tools(python_client("openai_chat.py", "openai"));
}

#[test]
fn allowed_tools_openai_python_responses() {
    allowed_tools_keep_the_tools(python_client("openai_responses.py", "openai-responses"));
}

/// Messages has no allowed-tools field: the same agent's Anthropic bodies carry the shown
/// subset as `tools`, and no `tool_choice` naming tools the body lacks (the stub checks).
#[test]
fn allowed_tools_anthropic_python_gets_the_shown_subset_as_tools() {
    let rig = Rig::start(SUBSET_AGENT);
    let client = python_client("anthropic_messages.py", "anthropic");
    let summary = rig.run(
        &client,
        "subset",
        &["--steps", &SUBSET_STEPS.to_string(), "--toggle-read-only"],
    );
    assert_eq!(summary["steps"], SUBSET_STEPS, "{summary}");
    let sent = rig.stub_bodies();
    assert_eq!(sent.len() as u64, SUBSET_STEPS, "one request per step");
    for (i, raw) in sent.iter().enumerate() {
        let n = i as u64 + 1;
        let body: Value = serde_json::from_str(raw).expect("JSON");
        assert_eq!(
            sorted(tool_names(&body)),
            shown(n),
            "step {n}: an Anthropic body's tools are the shown ones"
        );
    }
}

/// The same PNG screenshot (over the 1 KiB below which media stay inline) in every user message
/// and tool result of 50 steps is stored once: one row in `blobs` (content-addressed), no event
/// body holding its base64; every step's request still rebuilds byte-identical from the log.
#[test]
fn the_same_image_in_50_steps_is_stored_once() {
    const STEPS: u64 = 50;
    let rig = Rig::start("");
    let dump = rig.dump_dir();
    let summary = rig.run(
        &python_client("openai_chat.py", "openai"),
        "coder",
        &[
            "--steps",
            &STEPS.to_string(),
            "--media",
            "every",
            "--dump",
            dump.to_str().expect("utf-8 path"),
        ],
    );
    assert_eq!(summary["steps"], STEPS, "{summary}");
    let shot = media(&summary, "screenshot").to_string();
    assert!(shot.len() > 1024, "the screenshot is over 1 KiB of base64");
    let session = summary["session"].as_str().expect("session").to_string();
    for n in 1..=STEPS {
        let (status, rebuilt) = rig.daemon.get(&format!(
            "/v1/sessions/{session}/steps/{n}/request?format=openai"
        ));
        assert_eq!(status, 200, "rebuild step {n}: {rebuilt}");
        let returned = rig.dumped_step(n);
        assert!(
            rebuilt == raw_member(&returned, "request"),
            "step {n} rebuilds byte-identical to what it returned"
        );
    }
    let last: Value = serde_json::from_str(&rig.dumped_step(STEPS)).expect("JSON");
    assert!(
        last["request"].to_string().matches(&shot).count() as u64 >= STEPS,
        "the last request holds the screenshot once per message that carried it"
    );
    // Read-only, next to the running daemon (a WAL reader does not disturb the writer).
    let db = rig.state.join("sessions.db");
    let mut cmd = Command::new(python());
    cmd.arg(loops_dir().join("db_media.py")).arg(&db).arg(&shot);
    let (code, out, err) = run_bounded(cmd);
    assert_eq!(code, Some(0), "db_media.py {}: {err}", db.display());
    let found: Value = serde_json::from_str(out.trim()).expect("db_media.py's JSON");
    assert_eq!(
        found["blobs"], 1,
        "one row in blobs for the one image sent {} times: {found}",
        STEPS
    );
    assert_eq!(
        found["blob_rows"][0]["matches"], true,
        "the blob is the image (decoded, or its base64), keyed by its SHA-256: {found}"
    );
    assert_eq!(
        found["events_holding_base64"], 0,
        "no event body holds the image's base64: {found}"
    );
}

// --- The stub's own checks -----------------------------------------------------------------------

/// A 4x3 PNG and a (minimal) PDF, base64, for the media checks.
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGM4oaEBRww4OQAHpg0hlLAT/AAAAABJRU5ErkJggg==";
const PDF_B64: &str = "JVBERi0xLjQKJSVFT0YK";

fn tool_chat(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": "d",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}})
}

fn tool_anthropic(name: &str) -> Value {
    json!({"name": name, "description": "d",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]}})
}

fn tool_responses(name: &str) -> Value {
    json!({"type": "function", "name": name, "description": "d", "strict": false,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}})
}

fn call_chat(id: &str, arguments: &Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}]})
}

fn chat(messages: &Value) -> Value {
    json!({"model": "m", "tools": [tool_chat("read_file")], "messages": messages})
}

fn anthropic(messages: &Value) -> Value {
    json!({"model": "m", "max_tokens": 64, "tools": [tool_anthropic("read_file")],
           "messages": messages})
}

fn responses(input: &Value) -> Value {
    json!({"model": "m", "tools": [tool_responses("read_file")], "input": input})
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn tool_use(id: &str) -> Value {
    json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": "read_file", "input": {"path": "x"}}]})
}

fn tool_result(id: &str) -> Value {
    json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "r"}]})
}

fn function_call(id: &str) -> Value {
    json!({"type": "function_call", "call_id": id, "name": "read_file",
           "arguments": "{\"path\":\"x\"}"})
}

fn function_output(id: &str) -> Value {
    json!({"type": "function_call_output", "call_id": id, "output": "r"})
}

/// The error message of a refused body, in either provider's error shape.
fn refusal(reply: &Value) -> &str {
    reply["error"]["message"].as_str().unwrap_or("")
}

/// POSTs `body` and expects 400 naming `rule` (the stub's messages start with `[rule]`).
fn refused(stub: &Stub, path: &str, rule: &str, body: &Value) -> String {
    let (status, reply) = stub.post(path, body);
    let message = refusal(&reply);
    if status == 400 && message.starts_with(&format!("[{rule}]")) {
        return String::new();
    }
    format!("{path} should be refused with [{rule}], got {status}: {reply}\n  body: {body}\n")
}

/// POSTs `body` and expects it accepted; returns the reply.
fn accepted(stub: &Stub, path: &str, body: &Value) -> Value {
    let (status, reply) = stub.post(path, body);
    assert_eq!(status, 200, "{path} should accept {body}, got {reply}");
    reply
}

#[test]
fn the_stub_refuses_bodies_that_break_provider_rules() {
    let stub = Stub::start();
    let chat_path = "/v1/chat/completions";
    let msg_path = "/v1/messages";
    let resp_path = "/v1/responses";

    // Controls first: valid conversations pass, so the refusals below are the rules' doing.
    let ok_chat = chat(
        &json!([user("hi"), call_chat("a", &json!("{\"path\":\"x\"}")),
        {"role": "tool", "tool_call_id": "a", "content": "r"}]),
    );
    let reply = accepted(&stub, chat_path, &ok_chat);
    assert_eq!(reply["object"], "chat.completion", "{reply}");
    assert!(
        reply["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|t| t.contains('a')),
        "after the tool result the stub answers with text naming the call: {reply}"
    );
    let reply = accepted(&stub, chat_path, &chat(&json!([user("hi")])));
    assert_eq!(
        reply["choices"][0]["finish_reason"], "tool_calls",
        "{reply}"
    );
    accepted(
        &stub,
        resp_path,
        &responses(&json!([
            user("hi"),
            function_call("c"),
            function_output("c")
        ])),
    );
    accepted(
        &stub,
        msg_path,
        &anthropic(&json!([user("hi"), tool_use("t"), tool_result("t")])),
    );

    let mut wrong = String::new();
    let mut check = |path: &str, rule: &str, body: Value| {
        wrong += &refused(&stub, path, rule, &body);
    };

    // OpenAI Chat Completions.
    check(chat_path, "param.model", json!({"messages": [user("hi")]}));
    check(
        chat_path,
        "chat.tool_results_follow_calls",
        chat(
            &json!([user("hi"), call_chat("a", &json!("{}")), user("wait"),
            {"role": "tool", "tool_call_id": "a", "content": "r"}]),
        ),
    );
    check(
        chat_path,
        "chat.tool_results_follow_calls",
        chat(&json!([user("hi"), call_chat("a", &json!("{}"))])),
    );
    check(
        chat_path,
        "chat.tool_result_orphan",
        chat(&json!([user("hi"), {"role": "tool", "tool_call_id": "nobody", "content": "r"}])),
    );
    check(
        chat_path,
        "chat.arguments_json",
        chat(&json!([user("hi"), call_chat("a", &json!({"path": "x"})),
            {"role": "tool", "tool_call_id": "a", "content": "r"}])),
    );
    check(
        chat_path,
        "chat.arguments_json",
        chat(&json!([user("hi"), call_chat("a", &json!("[1]")),
            {"role": "tool", "tool_call_id": "a", "content": "r"}])),
    );
    check(
        chat_path,
        "chat.assistant_empty",
        chat(&json!([user("hi"), {"role": "assistant", "content": ""}, user("and?")])),
    );
    check(
        chat_path,
        "chat.role",
        chat(&json!([{"role": "model", "content": "hi"}])),
    );
    check(
        chat_path,
        "chat.tool_shape",
        json!({"model": "m", "tools": [tool_anthropic("read_file")], "messages": [user("hi")]}),
    );
    check(
        chat_path,
        "tool.name",
        json!({"model": "m", "tools": [tool_chat("fs.read")], "messages": [user("hi")]}),
    );
    check(
        chat_path,
        "param.unknown",
        json!({"model": "m", "system": "s", "messages": [user("hi")]}),
    );

    // Anthropic Messages.
    check(
        msg_path,
        "param.max_tokens",
        json!({"model": "m", "messages": [user("hi")]}),
    );
    check(
        msg_path,
        "messages.roles",
        anthropic(&json!([{"role": "assistant", "content": "hi"}, user("hi")])),
    );
    check(
        msg_path,
        "messages.roles",
        anthropic(&json!([user("a"), user("b")])),
    );
    check(
        msg_path,
        "messages.roles",
        anthropic(&json!([{"role": "system", "content": "s"}, user("hi")])),
    );
    check(
        msg_path,
        "messages.tool_result_next_turn",
        anthropic(&json!([user("hi"), tool_use("t"), user("wait"),
            {"role": "assistant", "content": "ok"}, tool_result("t")])),
    );
    check(
        msg_path,
        "messages.tool_result_orphan",
        anthropic(
            &json!([user("hi"), {"role": "assistant", "content": "no tools"},
            tool_result("t")]),
        ),
    );
    check(
        msg_path,
        "messages.tool_results_first",
        anthropic(
            &json!([user("hi"), tool_use("t"), {"role": "user", "content": [
            {"type": "text", "text": "here:"},
            {"type": "tool_result", "tool_use_id": "t", "content": "r"}]}]),
        ),
    );
    check(
        msg_path,
        "messages.empty_text",
        anthropic(&json!([{"role": "user", "content": [{"type": "text", "text": ""}]}])),
    );
    check(
        msg_path,
        "messages.tool_use_input",
        anthropic(&json!([user("hi"), {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "read_file", "input": "{\"path\":\"x\"}"}]},
            tool_result("t")])),
    );
    check(
        msg_path,
        "messages.block_keys",
        anthropic(&json!([{"role": "user", "content": [
            {"type": "text", "text": "hi", "id": "extra"}]}])),
    );
    check(
        msg_path,
        "messages.system",
        json!({"model": "m", "max_tokens": 64, "system": [{"type": "image", "source": {}}],
               "messages": [user("hi")]}),
    );
    check(
        msg_path,
        "messages.tool_shape",
        json!({"model": "m", "max_tokens": 64, "tools": [tool_chat("read_file")],
               "messages": [user("hi")]}),
    );
    let mark = json!({"type": "ephemeral"});
    let five_breakpoints = json!({
        "model": "m", "max_tokens": 64,
        "tools": [
            {"name": "a", "input_schema": {"type": "object"}, "cache_control": mark},
            {"name": "b", "input_schema": {"type": "object"}, "cache_control": mark}],
        "system": [{"type": "text", "text": "s", "cache_control": mark}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "one", "cache_control": mark},
            {"type": "text", "text": "two", "cache_control": mark}]}]});
    check(
        msg_path,
        "messages.cache_breakpoints",
        five_breakpoints.clone(),
    );
    let mut four = five_breakpoints;
    four["messages"][0]["content"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    accepted(&stub, msg_path, &four);

    // Thinking blocks must come back exactly as returned, and stay in the turn awaiting results.
    let two_tools = |messages: Value| {
        let mut body = anthropic(&messages);
        body["tools"] = json!([tool_anthropic("list_dir"), tool_anthropic("read_file")]);
        body
    };
    let first = accepted(&stub, msg_path, &two_tools(json!([user("hi")])));
    let content = first["content"].as_array().expect("content");
    assert_eq!(content[0]["type"], "thinking", "{first}");
    assert!(content[0]["signature"].is_string(), "{first}");
    let uses: Vec<&Value> = content.iter().filter(|b| b["type"] == "tool_use").collect();
    assert_eq!(uses.len(), 1, "the first round calls one tool: {first}");
    let use_id = uses[0]["id"].as_str().unwrap();
    let answered = |assistant: Value| {
        two_tools(
            json!([user("hi"), {"role": "assistant", "content": assistant},
            tool_result(use_id)]),
        )
    };
    let reply = accepted(&stub, msg_path, &answered(json!(content)));
    assert!(
        reply["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains(use_id)),
        "after the tool result the stub answers with text naming the call: {reply}"
    );
    let mut resigned = json!(content);
    resigned[0]["signature"] = json!("sig_forged");
    check(msg_path, "messages.thinking_unchanged", answered(resigned));
    let mut rethought = json!(content);
    rethought[0]["thinking"] = json!("something else");
    check(msg_path, "messages.thinking_unchanged", answered(rethought));
    check(
        msg_path,
        "messages.thinking_unchanged",
        answered(json!(content[1..])),
    );
    // The second round: thinking, redacted_thinking, text, two parallel calls.
    let history = json!([user("hi"), {"role": "assistant", "content": content},
        tool_result(use_id), {"role": "assistant", "content": reply["content"]}, user("again")]);
    let second = accepted(&stub, msg_path, &two_tools(history.clone()));
    let blocks = second["content"].as_array().expect("content");
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "thinking",
            "redacted_thinking",
            "text",
            "tool_use",
            "tool_use"
        ],
        "{second}"
    );
    let results: Vec<Value> = blocks[3..]
        .iter()
        .map(|b| json!({"type": "tool_result", "tool_use_id": b["id"], "content": "r"}))
        .collect();
    let with_turn = |assistant: Value| {
        let mut messages = history.as_array().unwrap().clone();
        messages.push(json!({"role": "assistant", "content": assistant}));
        messages.push(json!({"role": "user", "content": results}));
        two_tools(Value::Array(messages))
    };
    accepted(&stub, msg_path, &with_turn(json!(blocks)));
    let mut redacted = json!(blocks);
    redacted[1]["data"] = json!("redacted_other");
    check(msg_path, "messages.thinking_unchanged", with_turn(redacted));
    let mut one_result = with_turn(json!(blocks));
    let last = one_result["messages"]
        .as_array_mut()
        .unwrap()
        .last_mut()
        .unwrap();
    last["content"].as_array_mut().unwrap().pop();
    check(msg_path, "messages.tool_result_next_turn", one_result);

    // OpenAI Responses.
    check(
        resp_path,
        "responses.output_orphan",
        responses(&json!([user("hi"), function_output("nobody")])),
    );
    check(
        resp_path,
        "responses.output_orphan",
        responses(&json!([
            user("hi"),
            function_output("c"),
            function_call("c")
        ])),
    );
    check(
        resp_path,
        "responses.call_unanswered",
        responses(&json!([user("hi"), function_call("c"), user("and?")])),
    );
    check(
        resp_path,
        "responses.item_type",
        responses(&json!([user("hi"), {"type": "tool_result", "call_id": "c", "output": "r"}])),
    );
    check(
        resp_path,
        "responses.message",
        responses(&json!([user("hi"), function_call("c"),
            {"role": "tool", "tool_call_id": "c", "content": "r"}])),
    );
    check(
        resp_path,
        "responses.arguments_json",
        responses(&json!([user("hi"),
            {"type": "function_call", "call_id": "c", "name": "read_file", "arguments": {}},
            function_output("c")])),
    );
    check(
        resp_path,
        "responses.tool_shape",
        json!({"model": "m", "tools": [tool_chat("read_file")], "input": "hi"}),
    );
    check(
        resp_path,
        "param.unknown",
        json!({"model": "m", "max_tokens": 64, "input": "hi"}),
    );
    let optional = json!({"type": "object", "additionalProperties": false,
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["path"]});
    check(
        resp_path,
        "tool.strict_schema",
        json!({"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "f", "strict": true, "parameters": optional}]}),
    );
    check(
        resp_path,
        "responses.strict_default",
        json!({"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "f", "parameters": optional}]}),
    );
    accepted(
        &stub,
        resp_path,
        &json!({"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "f", "strict": false, "parameters": optional}]}),
    );

    // Images and documents, in each API's own shapes.
    let png = format!("data:image/png;base64,{PNG_B64}");
    let pdf = format!("data:application/pdf;base64,{PDF_B64}");
    let image_url = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    let chat_user = |parts: Value| chat(&json!([{"role": "user", "content": parts}]));
    accepted(
        &stub,
        chat_path,
        &chat(&json!([
            {"role": "user", "content": [{"type": "text", "text": "look"}, image_url(&png),
                image_url("https://example.com/a.png"),
                {"type": "file", "file": {"filename": "spec.pdf", "file_data": pdf}}]},
            call_chat("a", &json!("{}")),
            {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "r"}]},
            {"role": "user", "content": [{"type": "text",
                "text": "Attachments of the result of tool call a:"},
                image_url(&png)]}])),
    );
    check(
        chat_path,
        "chat.image_part",
        chat_user(json!([image_url(PNG_B64)])),
    );
    check(
        chat_path,
        "chat.image_part",
        chat_user(json!([image_url(&format!(
            "data:image/png;base64,{}",
            &PNG_B64[1..]
        ))])),
    );
    check(
        chat_path,
        "chat.image_part",
        chat_user(json!([image_url(&format!(
            "data:image/bmp;base64,{PNG_B64}"
        ))])),
    );
    check(
        chat_path,
        "chat.image_part",
        chat_user(json!([image_url(&format!(
            "data:image/png;base64,{PDF_B64}"
        ))])),
    );
    check(
        chat_path,
        "chat.image_part",
        chat_user(json!([image_url("file:///tmp/a.png")])),
    );
    check(
        chat_path,
        "chat.image_part",
        chat_user(json!([{"type": "image_url", "image_url": {"url": png},
            "media_type": "image/png"}])),
    );
    check(
        chat_path,
        "chat.file_part",
        chat_user(json!([{"type": "file", "file": {"file_data": pdf}}])),
    );
    check(
        chat_path,
        "chat.file_part",
        chat_user(
            json!([{"type": "file", "file": {"filename": "spec.pdf", "file_data": PDF_B64}}]),
        ),
    );
    check(
        chat_path,
        "chat.content",
        chat_user(json!([{"type": "image", "source": {"type": "base64",
            "media_type": "image/png", "data": PNG_B64}}])),
    );
    check(
        chat_path,
        "chat.content",
        chat(&json!([{"role": "system", "content": [image_url(&png)]}, user("hi")])),
    );
    check(
        chat_path,
        "chat.tool_content_text",
        chat(&json!([user("hi"), call_chat("a", &json!("{}")),
            {"role": "tool", "tool_call_id": "a", "content": [
                {"type": "text", "text": "r"}, image_url(&png)]}])),
    );

    let png_source = json!({"type": "base64", "media_type": "image/png", "data": PNG_B64});
    let image = |source: Value| json!({"type": "image", "source": source});
    let document = json!({"type": "document", "title": "spec.pdf",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64}});
    let msg_user = |blocks: Value| anthropic(&json!([{"role": "user", "content": blocks}]));
    accepted(
        &stub,
        msg_path,
        &anthropic(&json!([
            {"role": "user", "content": [{"type": "text", "text": "look"}, image(png_source.clone()),
                image(json!({"type": "url", "url": "https://example.com/a.png"})), document]},
            tool_use("t"),
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "r"}, image(png_source.clone())]}]}])),
    );
    check(
        msg_path,
        "messages.image_source",
        msg_user(json!([image(
            json!({"type": "base64", "media_type": "image/png", "data": png})
        )])),
    );
    check(
        msg_path,
        "messages.image_source",
        msg_user(json!([image(
            json!({"type": "base64", "media_type": "image/bmp", "data": PNG_B64})
        )])),
    );
    check(
        msg_path,
        "messages.image_source",
        msg_user(json!([image(
            json!({"type": "base64", "media_type": "image/jpeg", "data": PNG_B64})
        )])),
    );
    check(
        msg_path,
        "messages.image_source",
        msg_user(json!([image(
            json!({"type": "base64", "media_type": "image/png", "data": "not base64!"})
        )])),
    );
    check(
        msg_path,
        "messages.image_source",
        msg_user(json!([image(
            json!({"type": "url", "url": "file:///tmp/a.png"})
        )])),
    );
    check(
        msg_path,
        "messages.document_source",
        msg_user(json!([{"type": "document", "source": png_source}])),
    );
    check(
        msg_path,
        "messages.document_source",
        msg_user(json!([{"type": "document", "source": {"type": "base64",
            "media_type": "application/pdf", "data": PNG_B64}}])),
    );
    check(
        msg_path,
        "messages.block_keys",
        msg_user(
            json!([{"type": "document", "name": "spec.pdf", "source": {"type": "base64",
            "media_type": "application/pdf", "data": PDF_B64}}]),
        ),
    );
    check(
        msg_path,
        "messages.block_type",
        msg_user(json!([image_url(&png)])),
    );
    check(
        msg_path,
        "messages.block_type",
        anthropic(
            &json!([user("hi"), {"role": "assistant", "content": [image(png_source.clone())]},
            user("and?")]),
        ),
    );
    check(
        msg_path,
        "messages.image_source",
        anthropic(
            &json!([user("hi"), tool_use("t"), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [image(
                json!({"type": "base64", "media_type": "image/png", "data": "%%%"}))]}]}]),
        ),
    );
    check(
        msg_path,
        "messages.block_type",
        anthropic(
            &json!([user("hi"), tool_use("t"), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "tool_use", "id": "u", "name": "read_file", "input": {}}]}]}]),
        ),
    );

    let input_image =
        |url: &str| json!({"type": "input_image", "image_url": url, "detail": "auto"});
    let resp_user = |parts: Value| {
        responses(&json!([{"type": "message", "role": "user",
        "content": parts}]))
    };
    let output = |parts: Value| {
        responses(&json!([user("hi"), function_call("c"),
            {"type": "function_call_output", "call_id": "c", "output": parts}]))
    };
    accepted(
        &stub,
        resp_path,
        &responses(&json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                input_image(&png), input_image("https://example.com/a.png"),
                {"type": "input_file", "filename": "spec.pdf", "file_data": pdf}]},
            function_call("c"),
            {"type": "function_call_output", "call_id": "c", "output": [
                {"type": "input_text", "text": "r"}, {"type": "input_image", "image_url": png}]}])),
    );
    check(
        resp_path,
        "responses.input_image",
        resp_user(json!([{"type": "input_image", "image_url": png}])),
    );
    check(
        resp_path,
        "responses.input_image",
        resp_user(json!([input_image(PNG_B64)])),
    );
    check(
        resp_path,
        "responses.input_image",
        resp_user(json!([input_image(&format!(
            "data:image/gif;base64,{PNG_B64}"
        ))])),
    );
    check(
        resp_path,
        "responses.input_file",
        resp_user(json!([{"type": "input_file", "filename": "spec.pdf", "file_data": PDF_B64}])),
    );
    check(
        resp_path,
        "responses.input_file",
        resp_user(json!([{"type": "input_file", "file_data": pdf}])),
    );
    check(
        resp_path,
        "responses.message",
        resp_user(json!([image_url(&png)])),
    );
    check(
        resp_path,
        "responses.message",
        responses(&json!([user("hi"), {"type": "message", "role": "assistant",
            "content": [input_image(&png)]}])),
    );
    check(
        resp_path,
        "responses.function_call_output",
        output(json!([{"type": "output_text", "text": "r"}])),
    );
    check(
        resp_path,
        "responses.input_image",
        output(json!([{"type": "input_image", "image_url": "data:image/png;base64,@@"}])),
    );

    // tool_choice names only tools the body has, in the API's own shape; the stub calls only
    // what it allows (without it, the first tool by name: bash).
    let chat_allowed = |names: &[&str]| {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| json!({"type": "function", "function": {"name": n}}))
            .collect();
        json!({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": tools}})
    };
    let resp_allowed = |names: &[&str]| {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| json!({"type": "function", "name": n}))
            .collect();
        json!({"type": "allowed_tools", "mode": "auto", "tools": tools})
    };
    let chat_choice = |choice: Value| {
        json!({"model": "m", "tools": [tool_chat("bash"), tool_chat("read_file")],
            "tool_choice": choice, "messages": [user("hi")]})
    };
    let resp_choice = |choice: Value| {
        json!({"model": "m", "tools": [tool_responses("bash"), tool_responses("read_file")],
            "tool_choice": choice, "input": "hi"})
    };
    let reply = accepted(&stub, chat_path, &chat_choice(json!("auto")));
    assert_eq!(
        reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "bash",
        "{reply}"
    );
    let reply = accepted(&stub, chat_path, &chat_choice(chat_allowed(&["read_file"])));
    let calls = reply["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert!(
        calls.iter().all(|c| c["function"]["name"] == "read_file") && !calls.is_empty(),
        "the stub calls only the allowed tools: {reply}"
    );
    check(
        chat_path,
        "chat.tool_choice",
        chat_choice(chat_allowed(&["write_file"])),
    );
    check(
        chat_path,
        "chat.tool_choice",
        chat_choice(resp_allowed(&["read_file"])),
    );
    check(
        chat_path,
        "chat.tool_choice",
        chat_choice(
            json!({"type": "allowed_tools", "allowed_tools": {"mode": "sometimes",
            "tools": [{"type": "function", "function": {"name": "bash"}}]}}),
        ),
    );
    check(
        chat_path,
        "chat.tool_choice",
        json!({"model": "m", "tool_choice": chat_allowed(&["read_file"]),
            "messages": [user("hi")]}),
    );
    let reply = accepted(&stub, resp_path, &resp_choice(resp_allowed(&["read_file"])));
    let calls: Vec<&Value> = reply["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert!(
        calls.iter().all(|c| c["name"] == "read_file") && !calls.is_empty(),
        "the stub calls only the allowed tools: {reply}"
    );
    check(
        resp_path,
        "responses.tool_choice",
        resp_choice(resp_allowed(&["write_file"])),
    );
    check(
        resp_path,
        "responses.tool_choice",
        resp_choice(chat_allowed(&["read_file"])),
    );
    check(
        resp_path,
        "responses.tool_choice",
        resp_choice(json!({"type": "function", "function": {"name": "read_file"}})),
    );
    let msg_choice = |choice: Value| {
        let mut body = anthropic(&json!([user("hi")]));
        body["tool_choice"] = choice;
        body
    };
    accepted(&stub, msg_path, &msg_choice(json!({"type": "auto"})));
    check(
        msg_path,
        "messages.tool_choice",
        msg_choice(json!({"type": "tool", "name": "bash"})),
    );
    check(
        msg_path,
        "messages.tool_choice",
        msg_choice(chat_allowed(&["read_file"])),
    );

    assert!(
        wrong.is_empty(),
        "the stub let bad bodies through:\n{wrong}"
    );
}

/// The stub's cache follows the providers' documented rules on the time a test gives it
/// (tests/sdk_loops/test_stub_cache.py: writes, hits, the 5-minute and 1-hour TTLs, the
/// minimums, OpenAI's 128-token steps and per-key rate), so the cached-token figures the loops
/// and the workload see are the ones a provider would report; and its Gemini and Bedrock
/// routes refuse what those APIs refuse, driven through google-genai and boto3
/// (test_stub_gemini_bedrock.py: thought signatures missing or of another model, images passed
/// to boto3 as base64 text, too many cache points, unanswered tool uses).
#[test]
fn the_stub_caches_by_the_documented_rules() {
    let mut cmd = Command::new(python());
    cmd.env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(loops_dir())
        .args([
            "-m",
            "unittest",
            "-v",
            "test_stub_cache",
            "test_stub_gemini_bedrock",
            "test_stub_stream",
        ]);
    let (code, out, err) = run_bounded(cmd);
    assert_eq!(
        code,
        Some(0),
        "the stub's cache self-test failed:\n{out}\n{err}"
    );
    assert!(err.contains("OK"), "{err}");
}

/// K9: with the `tools` plugin's `write_file` deferred, the official Anthropic and OpenAI
/// (Responses) SDKs send promptd's bodies to the stub, which applies the providers' tool-search
/// rules (a deferred tool needs the search tool, the search tool is not deferred, a deferred
/// tool carries no breakpoint, a namespace is not deferred): the Anthropic body holds the
/// regex search tool and `write_file` with `defer_loading`, the Responses body `tool_search`
/// and a `tools` namespace; each step's usage shows the deferred tools apart; every step
/// rebuilds byte-identically after a restart.
#[test]
fn k9_deferred_tools_official_sdks_accept_the_bodies_and_they_rebuild() {
    python();
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    let example = std::fs::read_to_string(repo_root().join("promptd.toml")).unwrap();
    let config = folder.config(&format!(
        "{}\n[plugins.tools]\ndefer = [\"write_file\"]\n",
        example.replace("plugin_dir = \"target/plugins\"\n", "")
    ));
    let (_dir, state) = state_dir();
    let daemon = Served::start(folder.path(), &config, &state);
    let stub = Stub::start();
    let clients = [
        (
            "anthropic_messages.py",
            &["--reply", "message"][..],
            "anthropic",
        ),
        ("openai_responses.py", &[][..], "openai-responses"),
    ];
    for (script, args, format) in clients {
        let client = Client {
            runtime: Runtime::Python,
            script,
            args,
            format,
            records_usage: true,
        };
        let (code, out, err) = run_loop(&client, &daemon.url, &stub.url, "coder");
        assert_eq!(code, Some(0), "{script}: {err}\n{out}");
    }
    let sessions = daemon.ok("GET", "/v1/sessions", None)["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert_eq!(sessions.len(), 2, "one session per loop");
    let mut sent = Vec::new();
    for id in &sessions {
        let events = daemon.ok("GET", &format!("/v1/sessions/{id}/events"), None);
        let markers: Vec<Value> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "step")
            .map(|e| e["body"].clone())
            .collect();
        assert_eq!(markers.len() as u64, STEPS, "{id}");
        for m in &markers {
            let deferred = m["usage"]["deferred_tools"]["chars"].as_u64().unwrap_or(0);
            assert!(
                deferred > 0,
                "the usage shows the deferred tools apart: {m}"
            );
        }
        for format in ["anthropic", "openai-responses"] {
            for n in 1..=STEPS {
                let body = daemon.ok(
                    "GET",
                    &format!("/v1/sessions/{id}/steps/{n}/request?format={format}"),
                    None,
                );
                let tools = body["tools"].as_array().unwrap();
                if format == "anthropic" {
                    let search = tools
                        .iter()
                        .position(|t| t["name"] == "tool_search_tool_regex")
                        .expect("the search tool");
                    assert!(tools[search].get("cache_control").is_some(), "{body}");
                    let write = tools.iter().find(|t| t["name"] == "write_file").unwrap();
                    assert_eq!(write["defer_loading"], true);
                    assert!(write.get("cache_control").is_none());
                } else {
                    assert!(tools.iter().any(|t| t["type"] == "tool_search"), "{body}");
                    let space = tools.iter().find(|t| t["type"] == "namespace").unwrap();
                    assert_eq!(space["name"], "tools");
                    assert_eq!(space["tools"][0]["name"], "write_file");
                    assert_eq!(space["tools"][0]["defer_loading"], true);
                    assert!(!tools.iter().any(|t| t["name"] == "write_file"));
                }
                sent.push((id.clone(), n, format, body));
            }
        }
        // The neutral body and the explanation show every tool, each deferred one with
        // `defer`: its plugin (K9).
        for n in 1..=STEPS {
            let neutral = daemon.ok(
                "GET",
                &format!("/v1/sessions/{id}/steps/{n}/request?format=neutral"),
                None,
            );
            let explained = daemon.ok("GET", &format!("/v1/sessions/{id}/steps/{n}/explain"), None);
            for tools in [&neutral["tools"], &explained["request"]["tools"]] {
                let tools = tools.as_array().unwrap_or_else(|| panic!("{neutral}"));
                let write = tools.iter().find(|t| t["name"] == "write_file").unwrap();
                assert_eq!(write["defer"], "tools", "{write}");
                assert!(
                    tools
                        .iter()
                        .filter(|t| t["name"] != "write_file")
                        .all(|t| t.get("defer").is_none()),
                    "only the deferred tool says defer: {tools:?}"
                );
            }
        }
    }
    daemon.stop();
    let daemon = Served::start(folder.path(), &config, &state);
    for (id, n, format, body) in &sent {
        let rebuilt = daemon.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/request?format={format}"),
            None,
        );
        assert_eq!(
            rebuilt.to_string(),
            body.to_string(),
            "{id} step {n} {format}"
        );
    }
}

// --- Gemini and Bedrock, through the Python client package (issue 33) -----------------------

/// The Python of the client package's test venv (sdk/clients/python/install.sh): the
/// promptd_client wheel with the official `google-genai` and `boto3`.
fn client_python() -> PathBuf {
    let python = repo_root().join("sdk/clients/python/.venv-test/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run `bash sdk/clients/python/install.sh` (cargo xtask test runs it)",
        python.display()
    );
    python
}

/// Bytes of standard or URL-safe base64 text.
fn base64_bytes(text: &str) -> Vec<u8> {
    let standard: String = text
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    promptd_core::conversation::content::base64_decode(&standard)
        .unwrap_or_else(|| panic!("not base64: {text}"))
}

/// Every value of key `key` anywhere in `value`.
fn all_of<'a>(value: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == key {
                    out.push(v);
                }
                all_of(v, key, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| all_of(v, key, out)),
        _ => {}
    }
}

/// Runs tests/sdk_loops/client_loop.py in `format` for every agent of the example config, with
/// an image and a document in step 1 and a screenshot in every tool round: each body goes to
/// the official SDK through the client package, each step rebuilds byte-identically from the
/// log (the script checks it), and every body reached the stub, which applies the provider's
/// rules. Returns the summaries and the bodies the stub got.
fn client_package_loops(format: &str) -> (Vec<Value>, Vec<Value>) {
    let rig = Rig::start("");
    let mut summaries = Vec::new();
    for agent in example_agents() {
        let mut cmd = Command::new(client_python());
        cmd.env("PYTHONDONTWRITEBYTECODE", "1")
            .arg(loops_dir().join("client_loop.py"))
            .arg(format)
            .arg(&rig.daemon.url)
            .arg(&rig.stub.url)
            .arg(&agent)
            .args(["--steps", "4", "--media", "first"]);
        let (code, out, err) = run_bounded(cmd);
        assert_eq!(code, Some(0), "{format}, agent {agent}: {}", err.trim());
        let summary: Value = out
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no JSON summary line in {out:?}"));
        assert!(
            summary["steps"] == 4
                && summary["rebuilt"] == 4
                && summary["tool_calls"] == 3
                && summary["tool_results"] == 3
                && summary["agent"] == agent.as_str(),
            "{format}, agent {agent}: four steps, two tool rounds (one call, then two), each \
             answered, each rebuilt byte for byte: {summary}"
        );
        summaries.push(summary);
    }
    let bodies: Vec<Value> = rig
        .stub_bodies()
        .iter()
        .map(|b| serde_json::from_str(b).expect("JSON"))
        .collect();
    assert_eq!(bodies.len(), 4 * summaries.len(), "one request per step");
    (summaries, bodies)
}

/// Issue 33: every agent's Gemini loop through the client package and `google-genai`: the
/// stub refuses a function call without the signature it issued for the model, so every
/// signature went back; promptd's bodies carry them as recorded (standard base64, the API's
/// text) while google-genai sent them URL-safe: the same bytes.
#[test]
fn gemini_python_client_loops_with_media_for_every_agent() {
    let (summaries, bodies) = client_package_loops("gemini");
    let sent: Vec<Vec<u8>> = {
        let mut found = Vec::new();
        bodies
            .iter()
            .for_each(|b| all_of(b, "thoughtSignature", &mut found));
        found
            .iter()
            .map(|s| base64_bytes(s.as_str().unwrap()))
            .collect()
    };
    for summary in &summaries {
        let kept: Vec<&str> = summary["signatures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(kept.len() >= 2, "two model turns with calls: {summary}");
        for text in kept {
            assert!(
                text.contains('+') || text.contains('/'),
                "promptd keeps the standard base64 the API wrote: {text}"
            );
            assert!(
                sent.contains(&base64_bytes(text)),
                "the SDK sent this signature's bytes back: {text}"
            );
        }
    }
    // The photo and the PDF went as inline data, byte for byte.
    let media = &summaries[0]["media"];
    let mut inline = Vec::new();
    bodies.iter().for_each(|b| all_of(b, "data", &mut inline));
    let inline: Vec<Vec<u8>> = inline
        .iter()
        .filter_map(|d| d.as_str().map(base64_bytes))
        .collect();
    for name in ["photo", "screenshot", "pdf"] {
        let want = base64_bytes(media[name].as_str().unwrap());
        assert!(
            inline.contains(&want),
            "the {name} reached the stub as sent"
        );
    }
}

/// Issue 33: every agent's Bedrock loop through the client package and `boto3`
/// (`converse(**step.sdk_kwargs())`, botocore validating every parameter): the image and the
/// document reach the endpoint as the bytes sent — boto3 encoded the raw bytes the client
/// handed it once, where base64 text would have been encoded twice (the stub refuses that).
#[test]
fn bedrock_python_client_loops_with_media_for_every_agent() {
    let (summaries, bodies) = client_package_loops("bedrock");
    let media = &summaries[0]["media"];
    let mut sources = Vec::new();
    bodies.iter().for_each(|b| all_of(b, "bytes", &mut sources));
    let sources: Vec<&str> = sources.iter().filter_map(|s| s.as_str()).collect();
    for name in ["photo", "screenshot", "pdf"] {
        let want = media[name].as_str().unwrap();
        assert!(
            sources.contains(&want),
            "the {name} reached the stub as sent: {sources:?}"
        );
    }
    for body in &bodies {
        let text = body.to_string();
        assert_eq!(
            text.matches("\"cachePoint\"").count(),
            3,
            "system, tools and the last turn carry a cache point: {text}"
        );
        assert!(
            body.get("modelId").is_none(),
            "boto3 puts the model in the URL"
        );
    }
}

/// Issue 33: the agent's Gemini model changes in the middle of a turn (a call of the old model
/// still waiting for its result): the stub, like Gemini, refuses a signature the old model
/// issued and a call of the turn without one; promptd sends the recorded call with the dummy
/// signature Gemini documents instead, and the loop goes on through google-genai.
#[test]
fn gemini_a_model_change_mid_turn_is_accepted_by_the_stub() {
    let rig = Rig::start("");
    let config = rig.work.path().join("promptd.toml");
    let mut cmd = Command::new(client_python());
    cmd.env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(loops_dir().join("client_loop.py"))
        .args([
            "gemini",
            &rig.daemon.url,
            &rig.stub.url,
            "coder",
            "--steps",
            "4",
        ])
        .arg("--switch-model")
        .arg(&config)
        .args(["gemini-3-pro-preview", "gemini-3-flash-preview"]);
    let (code, out, err) = run_bounded(cmd);
    assert_eq!(code, Some(0), "{}", err.trim());
    let summary: Value = serde_json::from_str(out.lines().last().unwrap_or("")).expect("summary");
    assert_eq!(
        (&summary["steps"], &summary["rebuilt"]),
        (&json!(4), &json!(4)),
        "{summary}"
    );
    let bodies: Vec<Value> = rig
        .stub_bodies()
        .iter()
        .map(|b| serde_json::from_str(b).expect("JSON"))
        .collect();
    // Step 2 went to the new model with the old model's call: the dummy, no old signature.
    let step2 = bodies
        .iter()
        .filter(|b| !b.to_string().contains("\"probe\""))
        .nth(1)
        .expect("step 2's body");
    let mut found = Vec::new();
    all_of(step2, "thoughtSignature", &mut found);
    let dummy = base64_bytes("skip_thought_signature_validator");
    let decoded: Vec<Vec<u8>> = found
        .iter()
        .map(|s| base64_bytes(s.as_str().unwrap()))
        .collect();
    assert_eq!(
        decoded,
        [dummy],
        "only the dummy on the old model's call: {step2}"
    );
}
