//! The Python client (`sdk/clients/python`, package `promptd_client`) against real daemons.
//!
//! Everything Python here runs with `sdk/clients/python/.venv-test/bin/python`, the fresh venv
//! `sdk/clients/python/install.sh` makes from the built wheel (never the source tree) plus the
//! pinned official `openai` and `anthropic` clients; Python runs isolated (`-I`), so nothing
//! of the checkout is importable but through the installed wheel. The provider is
//! `tests/sdk_loops/stub_provider.py`, a local stand-in for the OpenAI and Anthropic APIs that
//! refuses bodies breaking their rules and logs every body it got.
//!
//! - the two example loops (`examples/openai_loop.py`, `examples/anthropic_loop.py`), each two
//!   questions with tool calls through `promptd serve` with the bundled plugins and the
//!   repository's `promptd.toml`: the bodies the stub received are exactly the daemon's
//!   requests for those steps, and the session log afterwards is exactly the loop's;
//! - the README's Python loop, extracted from README.md and run as written;
//! - the client's own tests (`sdk/clients/python/tests`, pytest) against a daemon with a token,
//!   a plugin that is still loading, a body limit, an agent whose assembly fails and an MCP
//!   server whose tools the daemon runs (`tests/mcp_stub.py`), plus one whose database is
//!   deleted under it; then `tests/openapi_coverage.py` checks that those tests had every
//!   operation of `docs/openapi.json` answer 2xx and saw every top-level field of its answers.

use promptd_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::{request, state_dir, Served};
use common::process::Bounded;
use common::{repo_root, Folder};
use serde_json::{json, Value};

/// A loop takes a few seconds and the client's tests about half a minute; the bound only stops
/// a hung run.
const RUN_BOUND: Duration = Duration::from_secs(300);
/// How long the `slow` plugin's looping declare keeps the test daemon loading: long enough for
/// pytest to start and look (a few seconds on a busy machine), short enough not to cost much.
const SLOW_DECLARE_MS: u64 = 8000;
const TOKEN: &str = "client-tests-token";

fn client_dir() -> PathBuf {
    repo_root().join("sdk/clients/python")
}

/// The test venv's python, with the wheel installed.
fn python() -> PathBuf {
    let python = client_dir().join(".venv-test/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run sdk/clients/python/install.sh (it builds the client's wheel and \
         installs it, with the pinned openai, anthropic and pytest, into a fresh venv; \
         `cargo xtask test` runs it)",
        python.display()
    );
    assert_installed_is_current();
    python
}

/// The venv's promptd_client holds the same files as src/promptd_client: a wheel built from
/// an older tree would test old code.
fn assert_installed_is_current() {
    let lib = client_dir().join(".venv-test/lib");
    let site = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/promptd_client"))
        .find(|p| p.is_dir())
        .expect("promptd_client in the test venv's site-packages");
    let src = client_dir().join("src/promptd_client");
    for entry in std::fs::read_dir(&src).expect("read src/promptd_client") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "py" || e == "typed") {
            let installed = site.join(path.file_name().unwrap());
            assert!(
                std::fs::read(&installed).ok() == std::fs::read(&path).ok(),
                "{} differs from the installed wheel's: run sdk/clients/python/install.sh",
                path.display()
            );
        }
    }
}

/// `python -I`, without the caller's promptd and provider settings (each test sets its own).
fn python_command() -> Command {
    let mut cmd = Command::new(python());
    // -I ignores PYTHON* variables, so -B (not PYTHONDONTWRITEBYTECODE) keeps the checkout
    // free of __pycache__.
    cmd.args(["-I", "-B"]);
    for var in [
        "PROMPTD_URL",
        "PROMPTD_TOKEN",
        "PROMPTD_AGENT",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The stub provider on a free loopback port, logging every request to `log`. It also exits
/// when its stdin (held here) closes.
struct Stub {
    _child: Bounded,
    url: String,
    log: PathBuf,
}

impl Stub {
    fn start(log: &Path) -> Stub {
        let (child, url) = common::process::start_stub_provider(&python(), "900", Some(log));
        Stub {
            _child: child,
            url,
            log: log.to_path_buf(),
        }
    }

    /// Every request the stub got, in order, as (path, body); each must have been accepted.
    fn bodies(&self) -> Vec<(String, Value)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|line| {
                let entry: Value = serde_json::from_str(line).expect("a stub log line");
                assert_eq!(entry["status"], 200, "the stub refused a body: {entry}");
                let body = entry["body"].as_str().expect("body");
                let path = entry["path"].as_str().expect("path").to_string();
                (path, serde_json::from_str(body).expect("a JSON body"))
            })
            .collect()
    }
}

/// Runs `cmd` to completion within [`RUN_BOUND`]; returns (exit code, stdout, stderr).
fn run_bounded(cmd: Command) -> (Option<i32>, String, String) {
    common::process::run_bounded(cmd, RUN_BOUND)
}

/// Runs `cmd` and expects exit 0; returns stdout.
fn run_ok(cmd: Command, what: &str) -> String {
    let (code, out, err) = run_bounded(cmd);
    assert_eq!(
        code,
        Some(0),
        "{what} failed:\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    out
}

/// The bundled Rust plugins the example config serves.
fn bundled_folder() -> Folder {
    Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace")
}

/// `promptd.toml` of the repository with `top` before it (top-level keys) and `extra` after
/// (tables), written into `dir`.
fn example_config(dir: &Path, top: &str, extra: &str) -> PathBuf {
    let example = std::fs::read_to_string(repo_root().join("promptd.toml")).expect("read");
    let path = dir.join("promptd.toml");
    std::fs::write(&path, format!("{top}\n{example}\n{extra}")).expect("write config");
    path
}

/// A folder to run a loop in, with what its `list_dir` tool will find; returns the listing
/// the example tools give for it (sorted, directories with a slash).
fn workspace() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("README.md"),
        "# app\n\nBuild with `make`.\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("Makefile"), "all:\n\tcc main.c\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    (dir, "Makefile\nREADME.md\nsrc/".to_string())
}

/// A path as a TOML basic string.
fn toml_string(path: &Path) -> String {
    let text = path.to_str().expect("a UTF-8 path");
    assert!(
        !text.contains(['"', '\\']),
        "a path TOML would need escaped: {text}"
    );
    format!("\"{text}\"")
}

fn get_json(daemon: &Served, path: &str) -> Value {
    daemon.ok("GET", path, None)
}

fn events(daemon: &Served, session: &str) -> Vec<Value> {
    get_json(daemon, &format!("/v1/sessions/{session}/events"))["events"]
        .as_array()
        .expect("events")
        .clone()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["kind"].as_str().expect("kind"))
        .collect()
}

/// The session log of a loop whose user turns each run one round of tool calls (`calls[i]`
/// of them) and then get the answer: what the stub does with every question (a tool call
/// while the newest turn holds no tool result; one call, then two in parallel; then text).
fn loop_log(calls: &[usize]) -> Vec<&'static str> {
    let mut log = vec!["session/created"];
    for (i, &n) in calls.iter().enumerate() {
        log.push("user/message");
        if i == 0 {
            // The first step records the runtime context and the header; later ones have
            // the same facts, so neither changes.
            log.extend(["context/snapshot", "request/header"]);
        }
        log.extend(["step", "assistant/message"]);
        log.extend(std::iter::repeat_n("tool/result", n));
        log.extend(["step", "assistant/message"]);
    }
    log
}

/// The checks every loop run shares: the stub got exactly the daemon's requests, one per
/// step, in order (so the SDK sent promptd's body unchanged), and the log is exactly the loop's.
/// Returns the log.
fn check_loop(
    daemon: &Served,
    stub: &Stub,
    session: &str,
    format: &str,
    route: &str,
    calls: &[usize],
) -> Vec<Value> {
    let bodies = stub.bodies();
    let log = events(daemon, session);
    assert_eq!(kinds(&log), loop_log(calls), "the session log");
    let steps = kinds(&log).iter().filter(|k| **k == "step").count();
    assert_eq!(bodies.len(), steps, "one provider request per step");
    for (n, (path, body)) in bodies.iter().enumerate() {
        let n = n + 1;
        assert_eq!(path, route, "request {n}");
        let rebuilt = get_json(
            daemon,
            &format!("/v1/sessions/{session}/steps/{n}/request?format={format}"),
        );
        assert_eq!(
            wire(format, body.clone()),
            wire(format, rebuilt),
            "step {n}: the stub did not get the body promptd returned"
        );
    }
    // Every tool call's arguments are an object, kept with the text the model wrote (when it
    // wrote one), which is that object's JSON: encoded once, never twice.
    for e in log.iter().filter(|e| e["kind"] == "assistant/message") {
        for call in e["body"]["tool_calls"].as_array().into_iter().flatten() {
            assert!(call["arguments"].is_object(), "{call}");
            if let Some(text) = call["arguments_text"].as_str() {
                let parsed: Value = serde_json::from_str(text).expect("arguments_text is JSON");
                assert_eq!(parsed, call["arguments"], "{call}");
            }
        }
    }
    // The replies were recorded as the SDK returned them, usage included.
    let usage = get_json(daemon, &format!("/v1/sessions/{session}/usage"));
    assert_eq!(usage["totals"]["compared_steps"], steps, "{usage}");
    log
}

/// A body as the provider's endpoint reads it, whether promptd's (in `format`) or what the SDK
/// sent of it. google-genai lays `config` out as the REST body does (an empty
/// `generationConfig` included, the system instruction with role `user`), writes some keys
/// snake_cased (the API reads both spellings) and re-encodes bytes (thought signatures, inline
/// data) as URL-safe base64, so keys are compared camel-cased and bytes decoded; boto3 puts
/// `modelId` in the URL. The other SDKs send promptd's body as it is.
fn wire(format: &str, body: Value) -> Value {
    /// Keys camel-cased, but not inside data (call arguments, responses, schemas).
    fn camel_keys(value: Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| {
                        let mut camel = String::new();
                        let mut upper = false;
                        for c in k.chars() {
                            match c {
                                '_' if !camel.is_empty() => upper = true,
                                c if upper => {
                                    camel.extend(c.to_uppercase());
                                    upper = false;
                                }
                                c => camel.push(c),
                            }
                        }
                        let data = ["args", "response", "parametersJsonSchema", "parameters"];
                        let v = if data.contains(&camel.as_str()) {
                            v
                        } else {
                            camel_keys(v)
                        };
                        (camel, v)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.into_iter().map(camel_keys).collect()),
            other => other,
        }
    }
    fn decoded(text: &str) -> Value {
        let standard: String = text
            .chars()
            .map(|c| match c {
                '-' => '+',
                '_' => '/',
                c => c,
            })
            .collect();
        let bytes = promptd_core::conversation::content::base64_decode(&standard)
            .unwrap_or_else(|| panic!("not base64: {text}"));
        Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
    fn bytes_decoded(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    match (k.as_str(), &v) {
                        ("thoughtSignature", Value::String(t)) => *v = decoded(t),
                        ("inlineData", Value::Object(d)) => {
                            let mut d = d.clone();
                            if let Some(Value::String(t)) = d.get("data") {
                                let data = decoded(t);
                                d.insert("data".into(), data);
                            }
                            *v = Value::Object(d);
                        }
                        _ => bytes_decoded(v),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(bytes_decoded),
            _ => {}
        }
    }
    let Value::Object(mut map) = body else {
        return body;
    };
    match format {
        "gemini" if map.contains_key("config") || map.contains_key("model") => {
            map.remove("model");
            if let Some(Value::Object(config)) = map.remove("config") {
                let mut generation = serde_json::Map::new();
                for (k, v) in config {
                    match k.as_str() {
                        "systemInstruction" | "tools" | "toolConfig" | "cachedContent"
                        | "safetySettings" => {
                            map.insert(k, v);
                        }
                        _ => {
                            generation.insert(k, v);
                        }
                    }
                }
                map.insert("generationConfig".into(), Value::Object(generation));
            }
        }
        "gemini" => {}
        "bedrock" => {
            map.remove("modelId");
        }
        _ => {}
    }
    let mut out = Value::Object(map);
    if format == "gemini" {
        out = camel_keys(out);
        if let Some(Value::Object(system)) = out.get_mut("systemInstruction") {
            system.entry("role").or_insert(Value::String("user".into()));
        }
        if let Value::Object(map) = &mut out {
            map.entry("generationConfig")
                .or_insert(Value::Object(serde_json::Map::new()));
        }
        bytes_decoded(&mut out);
    }
    out
}

/// The tool results of a log, in order: (call id, content, is_error).
fn tool_results(log: &[Value]) -> Vec<(String, String, bool)> {
    log.iter()
        .filter(|e| e["kind"] == "tool/result")
        .map(|e| {
            let b = &e["body"];
            (
                b["tool_call_id"].as_str().unwrap().to_string(),
                b["content"].as_str().unwrap().to_string(),
                b["is_error"] == true,
            )
        })
        .collect()
}

/// The tool calls of a log, in order: (call id, name).
fn tool_calls(log: &[Value]) -> Vec<(String, String)> {
    log.iter()
        .filter(|e| e["kind"] == "assistant/message")
        .flat_map(|e| {
            e["body"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Runs an example loop (two questions) and checks it end to end.
fn example_loop(script: &str, format: &str, route: &str, base_url: (&str, &str)) {
    example_loop_naming(script, format, route, base_url, true)
}

/// [`example_loop`]; `names_ids`: the provider's answers name the call ids it read (Gemini
/// matches responses by name: its answers name the functions).
fn example_loop_naming(
    script: &str,
    format: &str,
    route: &str,
    base_url: (&str, &str),
    names_ids: bool,
) {
    python();
    let folder = bundled_folder();
    let (_state_dir, state) = state_dir();
    let daemon = Served::start(folder.path(), &repo_root().join("promptd.toml"), &state);
    let scratch = tempfile::tempdir().expect("tempdir");
    let stub = Stub::start(&scratch.path().join("stub.jsonl"));
    let (work, listing) = workspace();
    let mut cmd = python_command();
    cmd.arg(client_dir().join("examples").join(script))
        .current_dir(work.path())
        .env("PROMPTD_URL", &daemon.url)
        .env(base_url.0, format!("{}{}", stub.url, base_url.1))
        .env("OPENAI_API_KEY", "sk-stub")
        .env("ANTHROPIC_API_KEY", "sk-ant-stub")
        .env("GEMINI_API_KEY", "gemini-stub")
        .env("AWS_ACCESS_KEY_ID", "stub")
        .env("AWS_SECRET_ACCESS_KEY", "stub")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let out = run_ok(cmd, script);

    let session = out
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .unwrap_or_else(|| panic!("{script} printed no session line: {out}"))
        .to_string();
    let log = check_loop(&daemon, &stub, &session, format, route, &[1, 2]);
    // The stub calls the first tool it may (list_dir: the steps are read-only), then both; the
    // example's tools ran in the workspace, and read_file's failure went back as an error.
    let calls = tool_calls(&log);
    let names: Vec<&str> = calls.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["list_dir", "list_dir", "read_file"], "{calls:?}");
    let results = tool_results(&log);
    let ids: Vec<&str> = results.iter().map(|(id, _, _)| id.as_str()).collect();
    let call_ids: Vec<&str> = calls.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, call_ids, "one result per call, in order");
    assert_eq!(results[0].1, listing);
    assert_eq!(results[1].1, listing);
    assert!(!results[0].2 && !results[1].2, "{results:?}");
    assert_eq!(
        (results[2].1.as_str(), results[2].2),
        (
            "FileNotFoundError: [Errno 2] No such file or directory: 'stub'",
            true
        ),
        "read_file of the stub's path fails, and says so"
    );
    // Each answer names the calls whose results the provider read, and the example prints it.
    let answers: Vec<&str> = out.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(answers.len(), 2, "{out}");
    let named: Vec<&str> = if names_ids {
        call_ids.clone()
    } else {
        names.clone()
    };
    assert!(
        answers[0].starts_with("step 2: ") && answers[0].contains(named[0]),
        "{out}"
    );
    assert!(answers[1].starts_with("step 4: "));
    assert!(named[1..].iter().all(|id| answers[1].contains(id)), "{out}");
    // Every step was read-only: the model never saw write_file or bash.
    for (_, body) in stub.bodies() {
        let text = [&body["tools"], &body["toolConfig"]]
            .map(Value::to_string)
            .concat();
        assert!(
            !text.contains("write_file") && !text.contains("\"bash\""),
            "{text}"
        );
    }
}

#[test]
fn the_openai_example_loop() {
    example_loop(
        "openai_loop.py",
        "openai",
        "/v1/chat/completions",
        ("OPENAI_BASE_URL", "/v1"),
    );
}

#[test]
fn the_anthropic_example_loop() {
    example_loop(
        "anthropic_loop.py",
        "anthropic",
        "/v1/messages",
        ("ANTHROPIC_BASE_URL", ""),
    );
}

/// Issue 33: the Gemini example through the official `google-genai` client: the body goes to
/// `generate_content` unchanged, every thought signature comes back (the stub refuses a call
/// without the signature it issued), and calls Gemini sent without ids are answered by the
/// names the daemon gave them.
#[test]
fn the_gemini_example_loop() {
    example_loop_naming(
        "gemini_loop.py",
        "gemini",
        "/v1/models/gemini-3-pro-preview:generateContent",
        ("GOOGLE_GEMINI_BASE_URL", ""),
        false,
    );
}

/// Issue 33: the Bedrock example through the official `boto3` client (`bedrock-runtime`,
/// `converse(**step.sdk_kwargs())`), botocore validating every parameter before it sends.
#[test]
fn the_bedrock_example_loop() {
    example_loop(
        "bedrock_loop.py",
        "bedrock",
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse",
        ("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", ""),
    );
}

// --- The README's loop ----------------------------------------------------------------------

const README_MARKER: &str = "<!-- python-client:";

/// The README's Python section: the text from the marker to the next heading.
fn readme_section() -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("read README");
    let start = readme
        .find(README_MARKER)
        .expect("README.md has the python-client marker");
    let rest = &readme[start..];
    // The next heading ends it (a `#` comment inside the code block does not).
    let end = ["\n### ", "\n## "]
        .iter()
        .filter_map(|h| rest.find(h))
        .min()
        .unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The one ```python block of the section, and the text after it.
fn readme_loop() -> (String, String) {
    let section = readme_section();
    let blocks: Vec<&str> = section.split("```python\n").skip(1).collect();
    assert_eq!(
        blocks.len(),
        1,
        "the README's Python section must hold one ```python block"
    );
    let (code, after) = blocks[0]
        .split_once("\n```")
        .expect("the python block ends");
    (format!("{code}\n"), after.to_string())
}

/// Lines of the snippet that are promptd's: they name the client, a session or the package.
fn promptd_lines(code: &str) -> Vec<&str> {
    code.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.contains("promptd_client") || l.contains("Client(") || l.contains("session."))
        .collect()
}

#[test]
fn the_readme_loop_runs_as_written() {
    python();
    let (code, after) = readme_loop();
    // The README states how many lines are promptd's, right below the block; it must be true.
    let lines = promptd_lines(&code);
    let stated: usize = after
        .split("**")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no **N** count of promptd lines below the block: {after}"));
    assert_eq!(
        lines.len(),
        stated,
        "the README says {stated} promptd lines; these are: {lines:#?}"
    );

    let folder = bundled_folder();
    let (_state_dir, state) = state_dir();
    let daemon = Served::start(folder.path(), &repo_root().join("promptd.toml"), &state);
    let scratch = tempfile::tempdir().expect("tempdir");
    let stub = Stub::start(&scratch.path().join("stub.jsonl"));
    let script = scratch.path().join("readme_loop.py");
    std::fs::write(&script, &code).expect("write the snippet");
    let (work, listing) = workspace();
    let mut cmd = python_command();
    cmd.arg(&script)
        .current_dir(work.path())
        .env("PROMPTD_URL", &daemon.url)
        .env("OPENAI_BASE_URL", format!("{}/v1", stub.url))
        .env("OPENAI_API_KEY", "sk-stub");
    let out = run_ok(cmd, "the README's Python loop");

    // The snippet prints no id: the daemon's one session with steps is the loop's, and its
    // OpenAI body carries the agent's cache key (K6).
    let bodies = stub.bodies();
    let key = bodies.first().expect("the stub got a request").1["prompt_cache_key"]
        .as_str()
        .expect("prompt_cache_key")
        .to_string();
    let (session, agent) = daemon.stepped_session();
    assert_eq!(key, format!("promptd-{agent}"));
    let log = check_loop(
        &daemon,
        &stub,
        &session,
        "openai",
        "/v1/chat/completions",
        &[1],
    );
    let results = tool_results(&log);
    let [(id, content, false)] = results.as_slice() else {
        panic!("one successful tool result: {results:?}");
    };
    assert_eq!(content, &listing, "list_dir ran in the working directory");
    assert_eq!(out.trim(), format!("Read the results of {id}."), "{out}");
}

// --- The client's own tests and the OpenAPI document -------------------------------------

#[test]
fn the_client_tests_cover_every_operation_of_the_openapi_document() {
    python();
    let document = repo_root().join("docs/openapi.json");
    assert!(document.is_file(), "{} is missing", document.display());

    // The main daemon: a token, a 1 MiB body limit, an agent whose persona names a variable
    // nobody gives (its steps fail assembly), a plugin whose declare loops, so the daemon is
    // still loading when the first test looks (started unready for that), and an MCP server
    // (tests/mcp_stub.py) whose tools the daemon runs for agent `runner`.
    let folder = bundled_folder().scripted("slow");
    std::fs::copy(
        folder.path().join("persona.wasm"),
        folder.path().join("persona_broken.wasm"),
    )
    .expect("copy persona");
    let scratch = tempfile::tempdir().expect("tempdir");
    let config = example_config(
        scratch.path(),
        &format!("token = \"{TOKEN}\""),
        &format!(
            "[limits]\nmax_body_mb = 1\n\n[agents.broken]\n\n\
             [plugins.persona_broken]\nscope = \"broken\"\n\
             config = {{ text = \"You are {{{{nobody}}}}.\" }}\n\n\
             [plugins.slow]\ntimeout_ms = {SLOW_DECLARE_MS}\n\
             config = {{ loop_in_declare = \"true\" }}\n\n\
             [agents.runner]\n\n\
             [mcp.stub]\ncommand = {}\nargs = [\"-I\", \"-B\", {}]\nscope = \"runner\"\n",
            toml_string(&python()),
            toml_string(&client_dir().join("tests/mcp_stub.py")),
        ),
    );
    let (_state_dir, state) = state_dir();
    let daemon = Served::start_unready(folder.path(), &config, &state);
    // A daemon whose database the store-failure test deletes.
    let doomed_folder = bundled_folder();
    let (_doomed_dir, doomed_state) = state_dir();
    let doomed = Served::start(
        doomed_folder.path(),
        &repo_root().join("promptd.toml"),
        &doomed_state,
    );
    let stub = Stub::start(&scratch.path().join("stub.jsonl"));
    // A daemon with the gateway on (no plugin tools: the gateway serves no agent that has
    // them), for the gateway's route of the API.
    let gateway_folder = Folder::new().bundled("identity").bundled("persona");
    let gateway_config = gateway_folder.config(&format!(
        "[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n[agents.gw.gateway]\n",
        stub.url
    ));
    let (_gateway_dir, gateway_state) = state_dir();
    let gateway = Served::start(gateway_folder.path(), &gateway_config, &gateway_state);
    let calls = scratch.path().join("calls.jsonl");
    // A replay candidate that loads: the bundled plugins, without `slow` (which the main
    // daemon refused; a replay refuses a candidate with a plugin that does not load).
    let candidate = bundled_folder();

    std::fs::write(&calls, "").expect("create the calls log");
    let pytest = |target: &Path| {
        let mut cmd = python_command();
        cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"])
            .arg(target)
            .current_dir(scratch.path())
            .env("PROMPTD_TEST_URL", &daemon.url)
            .env("PROMPTD_TEST_TOKEN", TOKEN)
            .env("PROMPTD_DOOMED_URL", &doomed.url)
            .env("PROMPTD_DOOMED_STATE", &doomed_state)
            .env("STUB_URL", &stub.url)
            .env("PROMPTD_GATEWAY_URL", &gateway.url)
            .env("PROMPTD_REPLAY_PLUGINS", candidate.path())
            .env("PROMPTD_CALLS_LOG", &calls);
        let out = run_ok(cmd, &format!("pytest {}", target.display()));
        assert!(
            out.lines()
                .any(|l| l.contains(" passed") && !l.contains("failed")),
            "{out}"
        );
    };
    // First, while the daemon is still loading (light imports only), then everything else.
    pytest(&client_dir().join("tests/loading_check.py"));
    pytest(&client_dir().join("tests"));

    let coverage = |log: &Path| {
        let mut cmd = python_command();
        cmd.arg(client_dir().join("tests/openapi_coverage.py"))
            .arg(log)
            .arg(&document);
        run_bounded(cmd)
    };
    let (code, out, err) = coverage(&calls);
    assert_eq!(code, Some(0), "{out}\n{err}");

    // The check fails when an operation goes unexercised: without the calls of one route.
    let text = std::fs::read_to_string(&calls).expect("read the calls");
    let fewer: String = text
        .lines()
        .filter(|l| {
            let call: Value = serde_json::from_str(l).unwrap();
            !call["path"].as_str().unwrap().ends_with("/compact")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(fewer.len() < text.len(), "the tests compacted a session");
    let partial = scratch.path().join("partial.jsonl");
    std::fs::write(&partial, fewer).expect("write");
    let (code, _, err) = coverage(&partial);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("POST /v1/sessions/{id}/compact: never answered 2xx"),
        "{err}"
    );
    // An unexercised field is a gap too: a `sessions` answer seen without its `agent`.
    let trimmed: String = text
        .lines()
        .map(|l| {
            let mut call: Value = serde_json::from_str(l).unwrap();
            if call["path"] == "/v1/sessions" {
                call["fields"] = json!(["id"]);
            }
            format!("{call}\n")
        })
        .collect();
    std::fs::write(&partial, trimmed).expect("write");
    let (code, _, err) = coverage(&partial);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("POST /v1/sessions: response fields never seen: agent"),
        "{err}"
    );
    // The daemon the tests talked to needed the token: without it, 401.
    let (status, _) = request(&daemon.url, "GET", "/v1/plugins", None, None);
    assert_eq!(status, 401);
}
