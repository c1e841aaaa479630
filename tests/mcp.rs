//! End-to-end: MCP servers as contributors (contract M1–M5), against a real `promptd serve`
//! and real MCP servers from package registries: PyPI's `mcp-server-time` and npm's
//! `@modelcontextprotocol/server-everything`, both installed (pinned) by tests/mcp/install.sh.
//! The misbehaving servers (tests/mcp/*.py) are small fixtures speaking JSON-RPC over stdio.

use promptd_testkit as common;

use std::path::PathBuf;

use common::daemon::Served;
use common::{eventually_within, repo_root, Folder};
use serde_json::{json, Value};

fn installed(path: &str) -> PathBuf {
    let path = repo_root().join("tests/mcp").join(path);
    assert!(
        path.exists(),
        "{} is missing: run tests/mcp/install.sh (it installs the MCP servers these tests run)",
        path.display()
    );
    path
}

/// PyPI's `mcp-server-time`, as a `[mcp.NAME]` command.
pub(crate) fn time_server() -> String {
    installed(".venv/bin/mcp-server-time").display().to_string()
}

/// A fixture server in tests/mcp, run with the venv's Python.
pub(crate) fn fixture_server(name: &str) -> (String, String) {
    (
        installed(".venv/bin/python").display().to_string(),
        repo_root()
            .join("tests/mcp")
            .join(name)
            .display()
            .to_string(),
    )
}

/// Waits until `GET /v1/plugins` shows `id` in `state`; returns its entry.
pub(crate) fn wait_state(d: &Served, id: &str, state: &str) -> Value {
    let mut last = Value::Null;
    eventually_within(60, &format!("{id} to be {state}"), || {
        last = d.plugin(id);
        last["state"] == state
    });
    last
}

/// One step's request body (neutral format).
fn step(d: &Served, id: &str, messages: &Value) -> Value {
    d.ok(
        "POST",
        &format!("/v1/sessions/{id}/steps"),
        Some(&json!({ "messages": messages })),
    )["request"]
        .clone()
}

fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {request}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Two plugin tools that sort before and after the MCP server's.
fn plugin_tools(folder: Folder) -> Folder {
    folder.scripted("local")
}

const LOCAL: &str = r#"
[plugins.local.config]
"tool.alpha_tool" = '{"type":"object","properties":{}}'
"tool.zeta_tool" = '{"type":"object","properties":{}}'
"#;

fn time_config(name: &str) -> String {
    format!(
        "[mcp.{name}]\ncommand = {:?}\nargs = [\"--local-timezone\", \"UTC\"]\ntool_prefix = \"time_\"\n",
        time_server()
    )
}

/// M1, M2: a stdio server's tools join the plugins' tools in canonical (name) order under
/// mapped names, with their schemas and descriptions; its status shows as `mcp:NAME`.
#[test]
fn stdio_server_tools_join_the_plugin_tools_in_canonical_order() {
    let folder = plugin_tools(Folder::new());
    let (d, _state) = folder.serve(&format!("{LOCAL}{}", time_config("time")));
    let status = wait_state(&d, "mcp:time", "loaded");
    assert!(
        status["file"]
            .as_str()
            .unwrap()
            .ends_with("mcp-server-time --local-timezone UTC"),
        "{status}"
    );
    let id = d.session("default");
    let request = step(
        &d,
        &id,
        &json!([{"role": "user", "content": "what time is it?"}]),
    );
    assert_eq!(
        tool_names(&request),
        [
            "alpha_tool",
            "time_convert_time",
            "time_get_current_time",
            "zeta_tool"
        ]
    );
    let tool = &request["tools"][2];
    assert!(
        tool["description"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("time"),
        "{tool}"
    );
    assert_eq!(tool["parameters"]["type"], "object", "{tool}");
    assert!(
        tool["parameters"]["properties"]["timezone"].is_object(),
        "{tool}"
    );
    // Provenance names the server as the tool's contributor (M2).
    let explain = d.ok("GET", &format!("/v1/sessions/{id}/steps/1/explain"), None);
    assert!(
        explain.to_string().contains("mcp:time"),
        "explain names mcp:time: {explain}"
    );
}

/// M4: an open tool call of an MCP tool runs through promptd; the result is recorded as the
/// call's tool result and is in the next step's messages. A closed or unknown call is refused.
#[test]
fn a_tool_call_runs_through_promptd_and_is_recorded() {
    let folder = plugin_tools(Folder::new());
    let (d, _state) = folder.serve(&format!("{LOCAL}{}", time_config("time")));
    wait_state(&d, "mcp:time", "loaded");
    let id = d.session("default");
    step(
        &d,
        &id,
        &json!([{"role": "user", "content": "time in Tokyo at 12:00 UTC?"}]),
    );
    let reply = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "name": "time_convert_time",
         "arguments": {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}},
        {"id": "call_2", "name": "time_get_current_time", "arguments": {"timezone": "Not/AZone"}},
        {"id": "call_3", "name": "alpha_tool", "arguments": {}},
    ]});
    d.ok("POST", &format!("/v1/sessions/{id}/messages"), Some(&reply));
    let run = d.ok(
        "POST",
        &format!("/v1/sessions/{id}/tool-calls/call_1/run"),
        None,
    );
    assert_eq!(run["plugin"], "mcp:time");
    assert_eq!(run["message"]["is_error"], false, "{run}");
    let text = run["message"]["content"].as_str().unwrap();
    assert!(
        text.contains("Asia/Tokyo") && text.contains("21:00"),
        "{text}"
    );
    // The server's own error is a tool error the model reads, not a daemon failure.
    let bad = d.ok(
        "POST",
        &format!("/v1/sessions/{id}/tool-calls/call_2/run"),
        None,
    );
    assert_eq!(bad["message"]["is_error"], true, "{bad}");
    assert!(
        bad["message"]["content"]
            .as_str()
            .unwrap()
            .contains("Not/AZone"),
        "{bad}"
    );
    // Answered, unknown, and not an MCP server's tool.
    let (status, body) = d.post(&format!("/v1/sessions/{id}/tool-calls/call_1/run"), "");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("tool_call_answered"), "{body}");
    let (status, body) = d.post(&format!("/v1/sessions/{id}/tool-calls/nope/run"), "");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown_tool_call"), "{body}");
    let (status, body) = d.post(&format!("/v1/sessions/{id}/tool-calls/call_3/run"), "");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("tool_not_runnable"), "{body}");
    let answer = json!({"role": "tool", "tool_call_id": "call_3", "content": "alpha done"});
    d.ok(
        "POST",
        &format!("/v1/sessions/{id}/messages"),
        Some(&answer),
    );
    let next = step(&d, &id, &json!([]));
    let tool_messages: Vec<&Value> = next["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tool_messages.len(), 3, "{next}");
    assert_eq!(tool_messages[0]["tool_call_id"], "call_1");
    assert_eq!(tool_messages[0]["content"], text);
    assert_eq!(tool_messages[1]["is_error"], true);
}

/// M2: two daemons with the servers in opposite config order (and the server's tools listed
/// in whatever order it lists them) give byte-identical requests.
#[test]
fn servers_in_opposite_config_order_give_identical_requests() {
    let one = format!(
        "{}{}",
        time_config("a"),
        time_config("b").replace("time_", "other_")
    );
    let two = format!(
        "{}{}",
        time_config("b").replace("time_", "other_"),
        time_config("a")
    );
    let mut bodies = Vec::new();
    for config in [one, two] {
        let folder = plugin_tools(Folder::new());
        let (d, _state) = folder.serve(&format!("{LOCAL}{config}"));
        wait_state(&d, "mcp:a", "loaded");
        wait_state(&d, "mcp:b", "loaded");
        let id = d.session("default");
        let (status, text) = d.post(
            &format!("/v1/sessions/{id}/steps"),
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert_eq!(status, 200, "{text}");
        // The raw bytes of the request, not a re-serialized value that would sort its keys.
        let request = text
            .strip_prefix("{\"request\":")
            .and_then(|t| t.rsplit_once(",\"step\":"))
            .map(|(request, _)| request.to_string())
            .expect("a step body");
        bodies.push(request);
    }
    assert_eq!(bodies[0], bodies[1]);
    assert!(
        bodies[0].contains("other_get_current_time") && bodies[0].contains("time_get_current_time")
    );
}

fn fixture_config(name: &str, mode: &str, extra: &str) -> String {
    let (python, script) = fixture_server("fixture_server.py");
    format!("[mcp.{name}]\ncommand = {python:?}\nargs = [{script:?}, {mode:?}]\n{extra}\n")
}

/// A daemon serving the fixture server `s` in mode `same` with `extra` config, once it is
/// loaded, and a session that took one step.
fn fixture_session(folder: &Folder, extra: &str) -> (Served, tempfile::TempDir, String) {
    let (d, state) = folder.serve(&fixture_config("s", "same", extra));
    wait_state(&d, "mcp:s", "loaded");
    let id = d.session("default");
    step(&d, &id, &json!([{"role": "user", "content": "go"}]));
    (d, state, id)
}

fn header_reasons(d: &Served, id: &str) -> Vec<String> {
    let v = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "request/header")
        .map(|e| e["body"]["reason"].as_str().unwrap().to_string())
        .collect()
}

fn call(d: &Served, id: &str, call_id: &str, name: &str) -> Value {
    let reply = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "name": name, "arguments": {}}]});
    d.ok("POST", &format!("/v1/sessions/{id}/messages"), Some(&reply));
    d.ok(
        "POST",
        &format!("/v1/sessions/{id}/tool-calls/{call_id}/run"),
        None,
    )
}

/// M3: a list change the server announces is applied at the next step boundary, as a header
/// `change`; the server's instructions are a section (M2).
#[test]
fn an_announced_list_change_reaches_the_next_header() {
    let folder = Folder::new();
    let (d, _state) = folder.serve(&fixture_config("g", "grow", ""));
    wait_state(&d, "mcp:g", "loaded");
    let id = d.session("default");
    let first = step(&d, &id, &json!([{"role": "user", "content": "grow"}]));
    assert_eq!(tool_names(&first), ["grow"]);
    assert_eq!(first["system"], "Fixture server in mode grow.");
    assert_eq!(
        call(&d, &id, "c1", "grow")["message"]["content"],
        "grow done"
    );
    eventually_within(30, "the re-listed tools to be published", || {
        d.plugin("mcp:g")["declares"].to_string().contains("grown")
    });
    let second = step(&d, &id, &json!([]));
    assert_eq!(tool_names(&second), ["grow", "grown"]);
    assert_eq!(header_reasons(&d, &id), ["initial", "change"]);
}

/// M3, M5: an announced but unchanged list, and a crashed server restarted with the same list,
/// record no header; the call the crash interrupted is recorded as a tool error.
#[test]
fn an_unchanged_list_and_a_restart_record_no_header() {
    let folder = Folder::new();
    let starts = folder.path().join("starts");
    let extra = format!(
        "env = {{ FIXTURE_STARTS = {:?} }}",
        starts.display().to_string()
    );
    let (d, _state, id) = fixture_session(&folder, &extra);
    assert_eq!(call(&d, &id, "c1", "same")["message"]["is_error"], false);
    let crashed = call(&d, &id, "c2", "crash");
    assert_eq!(crashed["message"]["is_error"], true, "{crashed}");
    eventually_within(
        30,
        "the crashed server to be restarted and serve again",
        || {
            let started = std::fs::read_to_string(&starts).unwrap_or_default();
            started.lines().count() >= 2 && d.plugin("mcp:s")["state"] == "loaded"
        },
    );
    let after = step(&d, &id, &json!([]));
    assert_eq!(tool_names(&after), ["crash", "same"]);
    assert_eq!(header_reasons(&d, &id), ["initial"]);
}

/// K8: while a server is down its tools keep their place in a warm session's requests (no new
/// header; the step's explain says which are kept and why), a call to one is recorded as an
/// error the model can read, naming the server and since when, and a session started
/// meanwhile goes without them; once the server is back, calls run again and the warm
/// session's header never moved.
#[test]
fn k8_a_lost_servers_tools_keep_their_place_and_a_call_says_since_when() {
    let folder = Folder::new();
    let (starts, down) = (folder.path().join("starts"), folder.path().join("down"));
    let extra = format!(
        "env = {{ FIXTURE_STARTS = {:?}, FIXTURE_DOWN = {:?} }}",
        starts.display().to_string(),
        down.display().to_string()
    );
    let (d, state, id) = fixture_session(&folder, &extra);
    std::fs::write(&down, "").unwrap();
    assert_eq!(call(&d, &id, "c1", "crash")["message"]["is_error"], true);
    wait_state(&d, "mcp:s", "stale");
    let answered = call(&d, &id, "c2", "same");
    let content = answered["message"]["content"].as_str().unwrap();
    assert_eq!(answered["message"]["is_error"], true, "{answered}");
    assert!(
        content.starts_with("MCP server `s` is unavailable since 20")
            && content.contains("keep their place"),
        "{content}"
    );
    // Why, in words (the crash closed its stdio), never Rust's debug output (issue 45).
    assert!(
        content.contains("(MCP server `s`: the server closed its connection)"),
        "{content}"
    );
    for debug in ["Ok(", "Err(", "Closed)"] {
        assert!(!content.contains(debug), "{content}");
    }
    let during = step(&d, &id, &json!([]));
    assert_eq!(tool_names(&during), ["crash", "same"]);
    assert_eq!(header_reasons(&d, &id), ["initial"]);
    let n = d.ok("GET", &format!("/v1/sessions/{id}/events"), None)["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "step")
        .count();
    let explain = d.ok("GET", &format!("/v1/sessions/{id}/steps/{n}/explain"), None);
    let said: Vec<&str> = explain["said"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    // Its instructions (a section) and its two tools, and who gave them.
    assert_eq!(said.len(), 3, "{explain}");
    assert!(
        said[1].starts_with(
            "tool `crash` of plugin `mcp:s` kept (unavailable: MCP server `s`: the server closed \
             its connection) since step"
        ),
        "{said:?}"
    );
    for debug in ["Ok(", "Err(", "Closed)"] {
        assert!(!said[1].contains(debug), "{said:?}");
    }
    assert_eq!(
        explain["provenance"]["tools"][0]["plugin"], "mcp:s",
        "{explain}"
    );
    // A session that starts while the server is down goes without its tools.
    let cold = d.session("default");
    let without = step(&d, &cold, &json!([{"role": "user", "content": "go"}]));
    assert!(
        without["tools"].as_array().is_none_or(Vec::is_empty),
        "{without}"
    );
    std::fs::remove_file(&down).unwrap();
    wait_state(&d, "mcp:s", "loaded");
    let back = call(&d, &id, "c3", "same");
    assert_eq!(back["message"]["is_error"], false, "{back}");
    let after = step(&d, &id, &json!([]));
    assert_eq!(tool_names(&after), ["crash", "same"]);
    assert_eq!(
        header_reasons(&d, &id),
        ["initial"],
        "the flap cost no header"
    );
    let explain = d.ok(
        "GET",
        &format!("/v1/sessions/{id}/steps/{}/explain", n + 1),
        None,
    );
    assert_eq!(explain["held"], json!([]), "{explain}");
    // The steps that kept the slots, and the one after, rebuild from the log after a restart.
    d.stop();
    let d = Served::start(
        folder.path(),
        &folder.path().join("promptd.toml"),
        &state.path().join("state"),
    );
    for (k, sent) in [(n as u64, &during), (n as u64 + 1, &after)] {
        let rebuilt = d.ok("GET", &format!("/v1/sessions/{id}/steps/{k}/request"), None);
        assert_eq!(&rebuilt, sent, "step {k}");
    }
}

/// K8: `keep_tools = false` drops a down server's tools at the next step; with the default, a
/// cache-cold point (here an idle gap past the TTL since the last reply) drops them, in a
/// header that says why.
#[test]
fn k8_a_down_servers_tools_go_at_a_cold_point_or_at_once_without_keep_tools() {
    for keep in [false, true] {
        let folder = Folder::new();
        let down = folder.path().join("down");
        let extra = format!(
            "env = {{ FIXTURE_DOWN = {:?} }}\nkeep_tools = {keep}",
            down.display().to_string()
        );
        let (d, _state, id) = fixture_session(&folder, &extra);
        std::fs::write(&down, "").unwrap();
        assert_eq!(call(&d, &id, "c1", "crash")["message"]["is_error"], true);
        wait_state(&d, "mcp:s", "stale");
        if keep {
            let during = step(&d, &id, &json!([]));
            assert_eq!(tool_names(&during), ["crash", "same"]);
            // A reply sent ten minutes ago: the cache is cold now.
            let long_ago = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                - 10 * 60_000;
            let reply = json!({"role": "assistant", "content": "ok",
                "usage": {"input_tokens": 2000, "output_tokens": 2}});
            d.ok(
                "POST",
                &format!("/v1/sessions/{id}/messages?format=anthropic&sent_at={long_ago}"),
                Some(&reply),
            );
        }
        let request = step(&d, &id, &json!([{"role": "user", "content": "again"}]));
        assert!(
            request["tools"].as_array().is_none_or(Vec::is_empty),
            "keep_tools = {keep}: {request}"
        );
        assert_eq!(header_reasons(&d, &id), ["initial", "change"]);
        let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
        let header = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|e| e["kind"] == "request/header")
            .unwrap()["body"]
            .clone();
        if keep {
            let cause = header["released"]["cause"].as_str().unwrap();
            assert!(cause.starts_with("idle "), "{cause}");
        } else {
            assert!(header.get("released").is_none(), "{header}");
        }
    }
}

/// M5: a server that exits at start, one that hangs on tools/list, one that lists an invalid
/// schema and one whose tool names collide once mapped (M1) are each refused with their cause;
/// the plugins and the other server keep serving.
#[test]
fn misbehaving_servers_are_refused_and_the_rest_serve() {
    let folder = plugin_tools(Folder::new());
    let config = format!(
        "{LOCAL}{}{}{}{}{}",
        fixture_config("exits", "exit", ""),
        fixture_config("hangs", "hang_list", "timeout_ms = 1000"),
        fixture_config("garbage", "bad_schema", ""),
        fixture_config("collide", "collide", ""),
        time_config("time"),
    );
    let (d, _state) = folder.serve(&config);
    wait_state(&d, "mcp:time", "loaded");
    for (id, cause) in [
        ("mcp:exits", "initialize"),
        ("mcp:hangs", "no answer to tools/list within 1000 ms"),
        ("mcp:garbage", "tools/list failed"),
        (
            "mcp:collide",
            "tools `a.b` and `a_b` both map to the tool name `a_b`",
        ),
    ] {
        let status = wait_state(&d, id, "refused");
        let message = status["last_error"]["message"].as_str().unwrap_or("");
        assert_eq!(status["last_error"]["code"], "mcp_server", "{status}");
        assert!(message.contains(cause), "{id}: {message}");
    }
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "hi"}]));
    assert_eq!(
        tool_names(&request),
        [
            "alpha_tool",
            "time_convert_time",
            "time_get_current_time",
            "zeta_tool"
        ]
    );
}

/// npm's `@modelcontextprotocol/server-everything`'s entry point.
fn everything() -> String {
    installed("js/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string()
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// server-everything over Streamable HTTP, killed when dropped.
struct HttpEverything(std::process::Child);

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tools and the `echo` call of one server-everything connection, with `config`.
fn everything_request(config: &str) -> (Vec<String>, String, Value) {
    let folder = plugin_tools(Folder::new());
    let (d, _state) = folder.serve(&format!("{LOCAL}{config}"));
    let status = wait_state(&d, "mcp:everything", "loaded");
    let id = d.session("default");
    let (code, text) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        r#"{"messages":[{"role":"user","content":"echo hi"}]}"#,
    );
    assert_eq!(code, 200, "{text}");
    let request: Value = serde_json::from_str(&text).unwrap();
    let names = tool_names(&request["request"]);
    let reply = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "e1", "name": "ev_echo", "arguments": {"message": "hi there"}}]});
    d.ok("POST", &format!("/v1/sessions/{id}/messages"), Some(&reply));
    let run = d.ok(
        "POST",
        &format!("/v1/sessions/{id}/tool-calls/e1/run"),
        None,
    );
    let tools = request["request"]["tools"].to_string();
    (names, tools, json!({"run": run, "status": status}))
}

/// M1, M2, M4: server-everything over stdio and over Streamable HTTP contributes the same tools,
/// sorted with the plugins' under the prefix, and runs its `echo` through promptd either way.
#[test]
fn server_everything_over_stdio_and_streamable_http() {
    let stdio = format!(
        "[mcp.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\ntool_prefix = \"ev_\"\n",
        everything()
    );
    let (names, stdio_tools, seen) = everything_request(&stdio);
    assert_eq!(seen["run"]["message"]["is_error"], false, "{seen}");
    assert!(
        seen["run"]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("hi there"),
        "{seen}"
    );
    assert_eq!(names.first().map(String::as_str), Some("alpha_tool"));
    assert_eq!(names.last().map(String::as_str), Some("zeta_tool"));
    let mine: Vec<&String> = names.iter().filter(|n| n.starts_with("ev_")).collect();
    assert!(mine.len() >= 5, "{names:?}");
    assert!(names.contains(&"ev_get-sum".to_string()), "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "canonical (name) order");

    let port = free_port();
    let server = HttpEverything(
        std::process::Command::new("node")
            .args([everything().as_str(), "streamableHttp"])
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start node"),
    );
    eventually_within(30, "server-everything to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let http = format!(
        "[mcp.everything]\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ X-Test = \"promptd\" }}\ntool_prefix = \"ev_\"\n"
    );
    let (_, http_tools, seen) = everything_request(&http);
    assert_eq!(
        seen["status"]["file"],
        format!("http://127.0.0.1:{port}/mcp")
    );
    assert!(
        seen["run"]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("hi there"),
        "{seen}"
    );
    // One server, two transports: the same tools, byte for byte.
    assert_eq!(stdio_tools, http_tools);
    drop(server);
}

/// The example config of `docs/mcp.md` ("MCP servers") is valid (R6, M1), and its stdio server,
/// with the installed command, serves the tools the page shows.
#[test]
fn the_docs_example_config_serves() {
    let page = std::fs::read_to_string(repo_root().join("docs/mcp.md")).unwrap();
    let section = &page[page.find("# MCP servers").expect("an MCP servers section")..];
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a toml example");
    promptd_core::config::Config::parse(block, "docs/mcp.md").expect("the example parses");
    let config = block
        .replace("plugin_dir = \"plugins\"\n", "")
        .replace("\"mcp-server-time\"", &format!("{:?}", time_server()));
    let (d, _state) = Folder::new().serve(&config);
    wait_state(&d, "mcp:time", "loaded");
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "time?"}]));
    assert_eq!(
        tool_names(&request),
        ["time_convert_time", "time_get_current_time"]
    );
}

/// M2: a configured resource is a runtime context, read at the step; the header keeps only
/// the tools and instructions, so a resource's text never changes it.
#[test]
fn a_configured_resource_is_a_runtime_context() {
    let doc = "js/node_modules/@modelcontextprotocol/server-everything/dist/docs/startup.md";
    let text = std::fs::read_to_string(installed(doc)).unwrap();
    // The document's title, free of characters JSON would escape.
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap()
        .trim_start_matches('#')
        .trim();
    let config = format!(
        "[mcp.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\ntool_prefix = \"ev_\"\nresources = [\"demo://resource/static/document/startup.md\"]\n",
        everything()
    );
    let (d, _state) = Folder::new().serve(&config);
    wait_state(&d, "mcp:everything", "loaded");
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "hi"}]));
    let messages = request["messages"].to_string();
    assert!(
        messages.contains(first),
        "the resource's text in {messages}"
    );
    assert!(!request["system"].to_string().contains(first));
}

/// M2, A9 (issue 26): an `optional` server whose configured resource fails to read keeps its
/// tools — the header, and so the provider's cache, is untouched — and loses only that
/// context, which the step records as one `plugin/omitted` event naming it.
#[test]
fn an_optional_server_whose_resource_fails_keeps_its_tools() {
    let good = "demo://resource/static/document/startup.md";
    let bad = "demo://resource/static/document/no-such-document.md";
    let config = |resources: &str| {
        format!(
            "[mcp.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\ntool_prefix = \"ev_\"\noptional = true\nresources = [{resources}]\n",
            everything()
        )
    };
    let (healthy, _a) = Folder::new().serve(&config(&format!("{good:?}")));
    wait_state(&healthy, "mcp:everything", "loaded");
    let id = healthy.session("default");
    let expected = step(&healthy, &id, &json!([{"role": "user", "content": "hi"}]));

    let (d, _b) = Folder::new().serve(&config(&format!("{good:?}, {bad:?}")));
    wait_state(&d, "mcp:everything", "loaded");
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "hi"}]));
    assert!(!tool_names(&request).is_empty());
    assert_eq!(
        request["tools"], expected["tools"],
        "the tools are those of a server whose reads all succeed"
    );
    assert_eq!(request["system"], expected["system"]);
    assert_eq!(
        request["messages"], expected["messages"],
        "the readable resource is still sent; the failed one is left out"
    );
    let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None)["events"].clone();
    let omitted: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "plugin/omitted")
        .collect();
    assert_eq!(omitted.len(), 1, "{events}");
    assert_eq!(omitted[0]["body"]["plugin"], "mcp:everything");
    assert_eq!(
        omitted[0]["body"]["contribution"],
        format!("context `mcp:everything:{bad}`"),
        "{}",
        omitted[0]
    );
    assert!(
        omitted[0]["body"]["cause"].as_str().unwrap().contains(bad),
        "{}",
        omitted[0]
    );
}

/// The kinds of the registry events about `plugin` the daemon holds now (`GET /v1/events`
/// replays its history; read until the stream goes quiet).
fn event_kinds(d: &Served, plugin: &str) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let addr = d.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    write!(
        stream,
        "GET /v1/events?since=0 HTTP/1.1\r\nHost: promptd\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut kinds = Vec::new();
    let mut kind = String::new();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        if let Some(k) = line.strip_prefix("event: ") {
            kind = k.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            if v["plugin"] == plugin {
                kinds.push(kind.clone());
            }
        }
    }
    kinds
}

/// A server that fails `max_failures` times in a row is given up on: state `failed` with a
/// `failed` event naming the count and the last cause, no more restarts (the daemon serves on
/// without it), until `POST /v1/plugins/mcp:NAME/enable` tries it again.
#[test]
fn m5_a_server_that_keeps_failing_is_given_up_after_max_failures() {
    let folder = plugin_tools(Folder::new());
    let config = format!(
        "{LOCAL}{}",
        fixture_config("exits", "exit", "max_failures = 3")
    );
    let (d, _state) = folder.serve(&config);
    let status = wait_state(&d, "mcp:exits", "failed");
    let message = status["last_error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("gave up after 3 failures in a row (max_failures)")
            && message.contains("POST /v1/plugins/mcp:exits/enable"),
        "{status}"
    );
    let kinds = event_kinds(&d, "mcp:exits");
    assert_eq!(
        kinds.iter().filter(|k| *k == "failed").count(),
        1,
        "{kinds:?}"
    );
    // Given up: no more attempts, so no more events. An absence, so a window to watch rather
    // than a fact to wait for: without the give-up the next attempt would start 800 ms after
    // the third failure (backoff 200, 400, 800 ms).
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(
        event_kinds(&d, "mcp:exits"),
        kinds,
        "no restart after failed"
    );
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "hi"}]));
    assert_eq!(tool_names(&request), ["alpha_tool", "zeta_tool"]);

    // Enabled: tried again, and given up again after three more.
    d.ok("POST", "/v1/plugins/mcp:exits/enable", None);
    eventually_within(60, "a second failed event", || {
        event_kinds(&d, "mcp:exits")
            .iter()
            .filter(|k| *k == "failed")
            .count()
            == 2
    });
}

/// `[mcp.*]` changes apply on a config reload, as plugins' settings do: a server added starts
/// and serves, a server removed leaves (an `unload` event), without a restart.
#[test]
fn m5_mcp_config_changes_apply_on_a_reload() {
    let folder = plugin_tools(Folder::new());
    let (d, _state) = folder.serve(&format!("{LOCAL}{}", time_config("time")));
    wait_state(&d, "mcp:time", "loaded");
    let id = d.session("default");
    let first = step(&d, &id, &json!([{"role": "user", "content": "one"}]));
    assert!(tool_names(&first).contains(&"time_get_current_time".to_string()));

    folder.config(&format!("{LOCAL}{}", fixture_config("s", "same", "")));
    wait_state(&d, "mcp:s", "loaded");
    eventually_within(60, "mcp:time to leave", || {
        d.ok("GET", "/v1/plugins", None)["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["id"] != "mcp:time")
    });
    assert!(event_kinds(&d, "mcp:time").contains(&"unload".to_string()));
    let second = step(&d, &id, &json!([{"role": "user", "content": "two"}]));
    let names = tool_names(&second);
    assert!(
        !names.iter().any(|n| n.starts_with("time_")),
        "the removed server's tools are gone: {names:?}"
    );
    assert!(names.len() > 2, "the added server's tools serve: {names:?}");

    // A changed table restarts the server under it: here, its tools get a prefix.
    folder.config(&format!(
        "{LOCAL}{}",
        fixture_config("s", "same", "tool_prefix = \"p_\"")
    ));
    eventually_within(60, "mcp:s to serve under its new prefix", || {
        d.plugin("mcp:s").to_string().contains("p_same")
    });
    let third = step(&d, &id, &json!([{"role": "user", "content": "three"}]));
    let names = tool_names(&third);
    assert!(
        names.contains(&"p_same".to_string()) && !names.contains(&"same".to_string()),
        "the changed server's tools: {names:?}"
    );
}

/// docs/mcp.md, "The first list": past the 30 s a step waits for the first load, it goes on
/// without a server still silent (one that never answers `tools/list`, with a `timeout_ms`
/// longer than that bound), and the plugins' tools serve.
#[test]
fn m5_a_step_goes_on_without_a_server_silent_past_the_bound() {
    let folder = plugin_tools(Folder::new());
    let (d, _state) = folder.serve(&format!(
        "{LOCAL}{}",
        fixture_config("mute", "hang_list", "timeout_ms = 120000")
    ));
    let id = d.session("default");
    let started = std::time::Instant::now();
    let request = step(&d, &id, &json!([{"role": "user", "content": "now"}]));
    let waited = started.elapsed();
    assert_eq!(tool_names(&request), ["alpha_tool", "zeta_tool"]);
    assert!(
        (std::time::Duration::from_secs(25)..std::time::Duration::from_secs(60)).contains(&waited),
        "the step waited {waited:?} for the silent server (the bound is 30 s)"
    );
}

/// docs/mcp.md, "Config reloads" and "The first list": on a reload, unchanged servers keep
/// their connection (started once), and a server the reload added is waited for the same way
/// as at start: the next step carries its tools although it lists them 2 s after it is asked.
#[test]
fn m5_a_reload_keeps_unchanged_servers_and_a_step_waits_for_an_added_one() {
    let folder = plugin_tools(Folder::new());
    let starts = folder.path().join("starts");
    let kept = fixture_config(
        "s",
        "same",
        &format!(
            "env = {{ FIXTURE_STARTS = {:?} }}",
            starts.display().to_string()
        ),
    );
    let (d, _state) = folder.serve(&format!("{LOCAL}{kept}"));
    wait_state(&d, "mcp:s", "loaded");
    let id = d.session("default");
    step(&d, &id, &json!([{"role": "user", "content": "one"}]));

    folder.config(&format!(
        "{LOCAL}{kept}{}",
        fixture_config("slow", "slow_list", "")
    ));
    // The reload has been read once the added server shows; it has not listed yet.
    eventually_within(60, "the reload to add mcp:slow", || {
        !d.plugin("mcp:slow").is_null()
    });
    let request = step(&d, &id, &json!([{"role": "user", "content": "two"}]));
    let names = tool_names(&request);
    assert!(
        names.contains(&"slow_tool".to_string()) && names.contains(&"same".to_string()),
        "the step waited for the added server's first list: {names:?}"
    );
    let started = std::fs::read_to_string(&starts).unwrap_or_default();
    assert_eq!(
        started.lines().count(),
        1,
        "the unchanged server kept its connection across the reload: {started:?}"
    );
}

/// A step taken before a slow server's first list waits for it (within the step's bound for
/// the first load) instead of going without the server's tools.
#[test]
fn m5_a_step_waits_for_a_slow_servers_first_list() {
    let folder = plugin_tools(Folder::new());
    let (d, _state) = folder.serve(&format!(
        "{LOCAL}{}",
        fixture_config("slow", "slow_list", "")
    ));
    let id = d.session("default");
    let started = std::time::Instant::now();
    let request = step(&d, &id, &json!([{"role": "user", "content": "now"}]));
    assert_eq!(
        tool_names(&request),
        ["alpha_tool", "slow_tool", "zeta_tool"],
        "waited {:?}",
        started.elapsed()
    );
}

/// R7/T8 for a server: `trust = "data"` makes its instructions (and resources) contexts fenced
/// as data, never part of the system prompt; its tools serve as before.
#[test]
fn r7_a_data_server_s_instructions_are_fenced_as_data() {
    let folder = Folder::new();
    let (d, _state) = folder.serve(&fixture_config("g", "grow", "trust = \"data\""));
    wait_state(&d, "mcp:g", "loaded");
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "hi"}]));
    assert_eq!(tool_names(&request), ["grow"]);
    let system = request["system"].to_string();
    assert!(!system.contains("Fixture server in mode grow."), "{system}");
    let text = request.to_string();
    assert!(
        text.contains("<data plugin=\\\"mcp:g\\\" key=")
            && text.contains("Fixture server in mode grow."),
        "{text}"
    );
    // Without it, the instructions are a section of the system prompt.
    let folder = Folder::new();
    let (d, _state) = folder.serve(&fixture_config("g", "grow", ""));
    wait_state(&d, "mcp:g", "loaded");
    let id = d.session("default");
    let request = step(&d, &id, &json!([{"role": "user", "content": "hi"}]));
    assert!(request["system"]
        .to_string()
        .contains("Fixture server in mode grow."));
    assert!(!request.to_string().contains("<data plugin"), "{request}");
}
