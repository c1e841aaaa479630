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

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{request, state_dir, Served};
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

/// A child process that is killed when dropped, so a failing test leaves nothing running.
struct Bounded(Child);

impl Drop for Bounded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stub provider on a free loopback port. It also exits when its stdin (held here) closes.
struct Stub {
    _child: Bounded,
    url: String,
}

impl Stub {
    fn start() -> Stub {
        let mut child = Command::new(python())
            .arg(loops_dir().join("stub_provider.py"))
            .args(["--max-seconds", STUB_BOUND_S])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start stub_provider.py");
        let stdout = child.stdout.take().expect("stdout");
        let child = Bounded(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the stub's port");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the stub's first line is not a port: {line:?}"));
        Stub {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = request(&self.url, "POST", path, Some(&body.to_string()), None);
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("stub {path} -> {status}: not JSON ({e}): {text}"));
        (status, value)
    }
}

/// Runs `cmd` to completion within [`LOOP_BOUND`]; returns (exit code, stdout, stderr).
fn run_bounded(mut cmd: Command) -> (Option<i32>, String, String) {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    // Both pipes are drained while the child runs, so a chatty child cannot block on them.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let mut child = Bounded(child);
    let deadline = Instant::now() + LOOP_BOUND;
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            drop(child);
            panic!("{what} did not finish within {LOOP_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
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

enum Runtime {
    Python,
    Node,
}

/// One SDK loop: which script, with which arguments, asking promptd for which format.
struct Client {
    runtime: Runtime,
    script: &'static str,
    args: &'static [&'static str],
    format: &'static str,
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
        let mut cmd = match client.runtime {
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
        };
        cmd.arg(&daemon.url)
            .arg(&stub.url)
            .arg(&agent)
            .args(["--steps", &STEPS.to_string()])
            .args(client.args);
        let (code, out, err) = run_bounded(cmd);
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
        format: "openai",
    });
}

#[test]
fn openai_python_responses() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "openai_responses.py",
        args: &[],
        format: "openai-responses",
    });
}

#[test]
fn anthropic_python_reply_as_content_blocks() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "anthropic_messages.py",
        args: &["--reply", "blocks"],
        format: "anthropic",
    });
}

#[test]
fn anthropic_python_reply_as_whole_message() {
    conforms(Client {
        runtime: Runtime::Python,
        script: "anthropic_messages.py",
        args: &["--reply", "message"],
        format: "anthropic",
    });
}

#[test]
fn openai_js_chat_completions() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "openai_chat.mjs",
        args: &[],
        format: "openai",
    });
}

#[test]
fn openai_js_responses() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "openai_responses.mjs",
        args: &[],
        format: "openai-responses",
    });
}

#[test]
fn anthropic_js_reply_as_content_blocks() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "anthropic_messages.mjs",
        args: &["--reply", "blocks"],
        format: "anthropic",
    });
}

#[test]
fn anthropic_js_reply_as_whole_message() {
    conforms(Client {
        runtime: Runtime::Node,
        script: "anthropic_messages.mjs",
        args: &["--reply", "message"],
        format: "anthropic",
    });
}

// --- The stub's own checks -----------------------------------------------------------------------

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

fn call_chat(id: &str, arguments: Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}]})
}

fn chat(messages: Value) -> Value {
    json!({"model": "m", "tools": [tool_chat("read_file")], "messages": messages})
}

fn anthropic(messages: Value) -> Value {
    json!({"model": "m", "max_tokens": 64, "tools": [tool_anthropic("read_file")],
           "messages": messages})
}

fn responses(input: Value) -> Value {
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
        json!([user("hi"), call_chat("a", json!("{\"path\":\"x\"}")),
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
    let reply = accepted(&stub, chat_path, &chat(json!([user("hi")])));
    assert_eq!(
        reply["choices"][0]["finish_reason"], "tool_calls",
        "{reply}"
    );
    accepted(
        &stub,
        resp_path,
        &responses(json!([
            user("hi"),
            function_call("c"),
            function_output("c")
        ])),
    );
    accepted(
        &stub,
        msg_path,
        &anthropic(json!([user("hi"), tool_use("t"), tool_result("t")])),
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
            json!([user("hi"), call_chat("a", json!("{}")), user("wait"),
            {"role": "tool", "tool_call_id": "a", "content": "r"}]),
        ),
    );
    check(
        chat_path,
        "chat.tool_results_follow_calls",
        chat(json!([user("hi"), call_chat("a", json!("{}"))])),
    );
    check(
        chat_path,
        "chat.tool_result_orphan",
        chat(json!([user("hi"), {"role": "tool", "tool_call_id": "nobody", "content": "r"}])),
    );
    check(
        chat_path,
        "chat.arguments_json",
        chat(json!([user("hi"), call_chat("a", json!({"path": "x"})),
            {"role": "tool", "tool_call_id": "a", "content": "r"}])),
    );
    check(
        chat_path,
        "chat.arguments_json",
        chat(json!([user("hi"), call_chat("a", json!("[1]")),
            {"role": "tool", "tool_call_id": "a", "content": "r"}])),
    );
    check(
        chat_path,
        "chat.assistant_empty",
        chat(json!([user("hi"), {"role": "assistant", "content": ""}, user("and?")])),
    );
    check(
        chat_path,
        "chat.role",
        chat(json!([{"role": "model", "content": "hi"}])),
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
        anthropic(json!([{"role": "assistant", "content": "hi"}, user("hi")])),
    );
    check(
        msg_path,
        "messages.roles",
        anthropic(json!([user("a"), user("b")])),
    );
    check(
        msg_path,
        "messages.roles",
        anthropic(json!([{"role": "system", "content": "s"}, user("hi")])),
    );
    check(
        msg_path,
        "messages.tool_result_next_turn",
        anthropic(json!([user("hi"), tool_use("t"), user("wait"),
            {"role": "assistant", "content": "ok"}, tool_result("t")])),
    );
    check(
        msg_path,
        "messages.tool_result_orphan",
        anthropic(
            json!([user("hi"), {"role": "assistant", "content": "no tools"},
            tool_result("t")]),
        ),
    );
    check(
        msg_path,
        "messages.tool_results_first",
        anthropic(
            json!([user("hi"), tool_use("t"), {"role": "user", "content": [
            {"type": "text", "text": "here:"},
            {"type": "tool_result", "tool_use_id": "t", "content": "r"}]}]),
        ),
    );
    check(
        msg_path,
        "messages.empty_text",
        anthropic(json!([{"role": "user", "content": [{"type": "text", "text": ""}]}])),
    );
    check(
        msg_path,
        "messages.tool_use_input",
        anthropic(json!([user("hi"), {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "read_file", "input": "{\"path\":\"x\"}"}]},
            tool_result("t")])),
    );
    check(
        msg_path,
        "messages.block_keys",
        anthropic(json!([{"role": "user", "content": [
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
        let mut body = anthropic(messages);
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
        responses(json!([user("hi"), function_output("nobody")])),
    );
    check(
        resp_path,
        "responses.output_orphan",
        responses(json!([
            user("hi"),
            function_output("c"),
            function_call("c")
        ])),
    );
    check(
        resp_path,
        "responses.call_unanswered",
        responses(json!([user("hi"), function_call("c"), user("and?")])),
    );
    check(
        resp_path,
        "responses.item_type",
        responses(json!([user("hi"), {"type": "tool_result", "call_id": "c", "output": "r"}])),
    );
    check(
        resp_path,
        "responses.message",
        responses(json!([user("hi"), function_call("c"),
            {"role": "tool", "tool_call_id": "c", "content": "r"}])),
    );
    check(
        resp_path,
        "responses.arguments_json",
        responses(json!([user("hi"),
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

    assert!(
        wrong.is_empty(),
        "the stub let bad bodies through:\n{wrong}"
    );
}
