//! The web inspector (`/ui/`, issue 17) in a real browser: Debian's `chromium`, driven through
//! `chromium-driver` by Python `selenium` (`tests/inspector/inspector.py`), against a real
//! `promptd serve` on the bundled plugins and the `versioned` fixture.
//!
//! The test makes two sessions, one of three steps: a first step, a step that only adds
//! messages (the cached prefix is kept), then — after `versioned.wasm` is swapped for its second
//! build, which changes its tool and its section — a step whose prefix breaks at that tool, and
//! after swapping back, a step with step 2's header again.
//! The script then checks, as a person clicking through the page would: the session list shows
//! both sessions (and its search filters them), the timeline shows the log with its header
//! reasons, a step's view shows the system text and every tool with its plugin and scope, the
//! bodies in all four formats are byte for byte what the API rebuilds, the diff of step 3 names
//! the changed tool as cache-breaking and step 4's names step 2's header, the plugins page follows a live unload over SSE, and a
//! daemon with a token asks for it. The screenshot of step 3 goes to
//! `target/test-artifacts/inspector.png` (and to `docs/inspector.png` with `PROMPTD_SCREENSHOT=1`).
//!
//! Needs `tests/inspector/install.sh` (chromium, chromium-driver and the pinned selenium venv).

use promptd_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{request, Served};
use common::{eventually, fixture, put, repo_root, Folder};
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The whole browser run takes 10–20 s; the bound only stops a hung browser.
const SCRIPT_BOUND: Duration = Duration::from_secs(240);

const CONFIG: &str = r#"
[model]
max_tokens = 1024
[model.openai]
model = "gpt-4.1"
[model.anthropic]
model = "claude-sonnet-4-5"

[agents.coder]

[plugins.identity]
config = { name = "Ada", model = "example-model" }

[plugins.persona]
config = { text = "You are {{agent_name}}'s {{role}} side: {{style}}.", role = "engineering", style = "precise" }

# Only the coder sees the tools: their labels show that scope.
[plugins.tools]
scope = "coder"
"#;

const TOKEN: &str = "inspector-test-token";

fn dir() -> PathBuf {
    repo_root().join("tests/inspector")
}

/// The venv's python, once chromium, its driver and selenium are all there.
fn prerequisites() -> PathBuf {
    let python = dir().join(".venv/bin/python");
    let how = "run `bash tests/inspector/install.sh` (it installs Debian's chromium and \
               chromium-driver and the pinned selenium into tests/inspector/.venv)";
    for path in [
        Path::new(CHROMIUM),
        Path::new(CHROMEDRIVER),
        python.as_path(),
    ] {
        assert!(path.exists(), "{} is missing: {how}", path.display());
    }
    let ok = Command::new(&python)
        .args(["-c", "import selenium"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "selenium does not import in {}: {how}",
        python.display()
    );
    python
}

fn step(d: &Served, id: &str, messages: &Value) -> Value {
    let body = json!({"messages": messages, "facts": {"cwd": "/src/app", "git_branch": "main"}});
    d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body))
}

/// Runs `tests/inspector/inspector.py` on `spec` and returns the checks it passed (bounded by
/// [`SCRIPT_BOUND`]; a failure panics with the script's report).
fn run_browser(python: &Path, spec: &Value) -> Vec<String> {
    let spec_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(spec_file.path(), spec.to_string()).unwrap();

    let started = Instant::now();
    let mut child = Command::new(python)
        .arg(dir().join("inspector.py"))
        .arg(spec_file.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tests/inspector/inspector.py");
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > SCRIPT_BOUND {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser run failed after {:.1} s ({}):\n{}\n{stdout}",
        started.elapsed().as_secs_f64(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the script's report: {e}: {stdout}"));
    eprintln!(
        "inspector: {} checks in the browser in {:.1} s",
        report["checks"].as_array().map_or(0, Vec::len),
        started.elapsed().as_secs_f64()
    );
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect()
}

#[test]
fn the_inspector_shows_sessions_steps_origins_and_why_the_cache_broke() {
    let python = prerequisites();
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    let v1 = std::fs::read(fixture("versioned_v1")).unwrap();
    let v2 = std::fs::read(fixture("versioned_v2")).unwrap();
    put(folder.path(), "versioned", &v1);
    let (d, _state) = folder.serve(CONFIG);

    // The coder's session: a step, a tool round that only adds messages, a plugin swap, a step.
    let coder = d.session("coder");
    step(
        &d,
        &coder,
        &json!([{"role": "user", "content": "List the files."}]),
    );
    // Recorded with the usage an Anthropic reply reports: the step gets a cache outcome.
    let reply = json!({"role": "assistant", "content": "Looking.",
        "tool_calls": [{"id": "call_1", "name": "list_dir", "arguments": {"path": "."}}],
        "usage": {"input_tokens": 0, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 5000, "output_tokens": 20}});
    d.ok(
        "POST",
        &format!("/v1/sessions/{coder}/messages?format=anthropic&sent_at=1000"),
        Some(&reply),
    );
    step(
        &d,
        &coder,
        &json!([{"role": "tool", "tool_call_id": "call_1", "content": "Cargo.toml\nsrc"}]),
    );
    let before = d.plugin("versioned")["sha256"].clone();
    put(folder.path(), "versioned", &v2);
    eventually("versioned v2 to serve", || {
        let p = d.plugin("versioned");
        p["sha256"] != before && p["state"] == "loaded"
    });
    step(&d, &coder, &json!([{"role": "user", "content": "Thanks."}]));
    // And back: step 4 has step 2's header again, which a provider may still have cached.
    let v2_sha = d.plugin("versioned")["sha256"].clone();
    put(folder.path(), "versioned", &v1);
    eventually("versioned v1 to serve again", || {
        let p = d.plugin("versioned");
        p["sha256"] != v2_sha && p["state"] == "loaded"
    });
    step(
        &d,
        &coder,
        &json!([{"role": "user", "content": "Undo that."}]),
    );
    let other = d.session("default");
    step(&d, &other, &json!([{"role": "user", "content": "Hello."}]));

    // What the page must show, from the setup (plugins) and the API (scopes, hashes).
    let explain = d.ok(
        "GET",
        &format!("/v1/sessions/{coder}/steps/1/explain?format=neutral"),
        None,
    );
    let mut tools = serde_json::Map::new();
    for t in explain["provenance"]["tools"].as_array().expect("tools") {
        let name = t["name"].as_str().unwrap();
        let plugin = if name == "versioned_tool" {
            "versioned"
        } else {
            "tools"
        };
        assert_eq!(t["plugin"], plugin, "{t}");
        tools.insert(name.into(), json!({"plugin": plugin, "scope": t["scope"]}));
    }
    assert_eq!(tools.len(), 5, "{explain}");
    let plugins: serde_json::Map<String, Value> = d.ok("GET", "/v1/plugins", None)["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["sha256"].clone()))
        .collect();

    // A second daemon, with a token: the page must ask for it.
    let locked = Folder::new().bundled("persona");
    let (l, _locked_state) = locked.serve(&format!("token = \"{TOKEN}\"\n"));
    let (status, body) = request(
        &l.url,
        "POST",
        "/v1/sessions",
        Some(r#"{"agent":"default"}"#),
        Some(TOKEN),
    );
    assert_eq!(status, 201, "{body}");
    let locked_session = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // A third daemon whose `versioned` plugin waits for a cold point: step 2 holds its swap.
    let holding = Folder::new().bundled("persona");
    put(holding.path(), "versioned", &v1);
    let (hd, _held_state) = holding.serve("[plugins.versioned]\nrefresh = \"boundary\"\n");
    let held_session = hd.session("default");
    step(
        &hd,
        &held_session,
        &json!([{"role": "user", "content": "Hi."}]),
    );
    let v1_sha = hd.plugin("versioned")["sha256"].clone();
    put(holding.path(), "versioned", &v2);
    eventually("versioned v2 to serve on the holding daemon", || {
        let p = hd.plugin("versioned");
        p["sha256"] != v1_sha && p["state"] == "loaded"
    });
    step(
        &hd,
        &held_session,
        &json!([{"role": "user", "content": "Again."}]),
    );
    let held_said = hd.ok(
        "GET",
        &format!("/v1/sessions/{held_session}/steps/2/explain"),
        None,
    )["said"]
        .clone();
    assert_eq!(held_said.as_array().map(Vec::len), Some(2), "{held_said}");

    // A gateway step (G4): the step page shows what the client sent, what promptd added and
    // what went upstream.
    let stub = crate::gateway::Stub::start();
    let gw_folder = Folder::new().bundled("identity").bundled("persona");
    let (gd, _gw_state) = gw_folder.serve(&format!(
        "[plugins.identity]\nconfig = {{ name = \"Ada\", model = \"example-model\" }}\n[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{}\"\n[agents.coder.gateway]\n",
        stub.url
    ));
    let gateway_body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"Inspect me."}]}"#;
    let (head, _) = crate::gateway::raw_post(
        &gd.url,
        "/gateway/coder/v1/messages",
        &[],
        gateway_body.as_bytes(),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let gateway_session = crate::gateway::header_of(&head, "x-promptd-session")
        .unwrap()
        .to_string();
    let gateway_upstream = String::from_utf8(stub.requests().pop().unwrap().2).unwrap();
    crate::gateway::newest_session(&gd); // its reply recorded

    let artifacts = repo_root().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("inspector.png");
    let _ = std::fs::remove_file(&screenshot);
    let spec = json!({
        "url": d.url,
        "chromium": CHROMIUM,
        "chromedriver": CHROMEDRIVER,
        "sessions": [
            {"id": coder, "agent": "coder", "steps": 4},
            {"id": other, "agent": "default", "steps": 1},
        ],
        "search_agent": "coder",
        "session": coder,
        "steps": 4,
        "header_reasons": ["initial", "change", "change"],
        "cache": {"1": "cold"},
        "system_phrases": [
            "You are Ada running on the model example-model.",
            "You are Ada's engineering side: precise.",
            "version 1",
        ],
        "sections": {
            "identity": "identity",
            "persona": "persona",
            "versioned": "versioned",
            "tools:guidance": "tools",
        },
        "tools": tools,
        "changed_step": 3,
        "changed_tool": "versioned_tool",
        "same_header": {"step": 4, "as": 2},
        "plugins": plugins,
        "unload": "versioned",
        "held_url": hd.url,
        "held_session": held_session,
        "held_said": held_said,
        "token_url": l.url,
        "token": TOKEN,
        "token_session": locked_session,
        "screenshot": screenshot,
        "gateway_url": gd.url,
        "gateway_session": gateway_session,
        "gateway_client": gateway_body,
        "gateway_upstream": gateway_upstream,
    });
    let checks = run_browser(&python, &spec);
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    // Every part of the brief was seen in the page, not only reached.
    for needed in [
        format!("session list: {coder} shows agent coder and 4 steps"),
        "session search: `coder` leaves only its sessions".into(),
        "timeline: header events marked with their reason".into(),
        "step view: the system text shows \"You are Ada's engineering side: precise.\"".into(),
        "step view: section `persona` labelled with plugin `persona`".into(),
        "step view: tool `read_file` labelled in the request body".into(),
        "step view: the anthropic body is byte for byte the step's request".into(),
        "diff view: a cause names the changed tool `versioned_tool`".into(),
        "diff view: that cause is highlighted as cache-breaking".into(),
        "diff view: step 4 names step 2 as sending the same header".into(),
        "plugins: a live unload arrives over SSE and updates the table".into(),
        "no script errors or policy violations".into(),
        "gateway: the step page shows what the client sent, byte for byte".into(),
        "gateway: the sections promptd added are listed".into(),
        "gateway: what went upstream is what the upstream received".into(),
        "gateway: the upstream's reply is shown".into(),
        "token: with the token the page reads the API".into(),
        "screenshot saved".into(),
    ] {
        assert!(
            checks.contains(&needed.as_str()),
            "the script did not check `{needed}`: {checks:?}"
        );
    }
    assert!(
        checks
            .iter()
            .any(|c| c.starts_with("step view: tool `versioned_tool` labelled versioned")),
        "{checks:?}"
    );
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "{} is not a screenshot of the page ({} bytes)",
        screenshot.display(),
        png.len()
    );
    if std::env::var("PROMPTD_SCREENSHOT").as_deref() == Ok("1") {
        std::fs::copy(&screenshot, repo_root().join("docs/inspector.png")).unwrap();
    }
    eprintln!("inspector: screenshot {}", screenshot.display());
}

/// The usage page (K13) on `tests/usage.rs`'s fixture (three sessions over three UTC days, a
/// cold start, expired TTLs, a plugin's prefix change and a hit, priced; and a reply of a model
/// without a price): every figure the page shows —
/// tiles, each bar of the spend per day by agent and by key, each point of the cached share,
/// the day table, the misses by cause and by plugin, the top sessions and their step links —
/// equals what `GET /v1/usage` answers, the unpriced model is named, and choosing an agent
/// shows that agent's. The
/// screenshot goes to `target/test-artifacts/usage.png` (and `docs/usage.png` with
/// `PROMPTD_SCREENSHOT=1`).
#[test]
fn k13_the_usage_page_shows_the_apis_numbers_drawn_by_hand() {
    let python = prerequisites();
    let fx = crate::usage::recorded();
    // A reply of a model without a price: the page must say its replies cost nothing it can
    // count.
    let unpriced_session = fx.d.session("haiku");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    crate::usage::step(&fx.d, &unpriced_session, now, "Unpriced.");
    crate::usage::reply(&fx.d, &unpriced_session, now, 0, 3000, 10);
    let usage = fx.d.ok("GET", "/v1/usage?days=3", None);
    assert_eq!(
        usage["total"]["unpriced_models"],
        json!(["claude-haiku-4-5"]),
        "{usage}"
    );
    let mut sessions = fx.sessions.to_vec();
    sessions.push(unpriced_session);
    let artifacts = repo_root().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("usage.png");
    let _ = std::fs::remove_file(&screenshot);
    let spec = json!({
        "mode": "usage",
        "url": fx.d.url,
        "chromium": CHROMIUM,
        "chromedriver": CHROMEDRIVER,
        "usage_days": 3,
        "usage_sessions": sessions,
        "usage_unpriced": ["claude-haiku-4-5"],
        "usage_agent": "default",
        "screenshot": screenshot,
    });
    let checks = run_browser(&python, &spec);
    for needed in [
        "usage: the tiles show the API's spend, replies, cached share and miss cost",
        "usage: each day's spend by agent is the API's, bar by bar",
        "usage: each day's spend by gateway key is the API's, the keyless as such",
        "usage: the share read from cache per day is the API's",
        "usage: the day table is the API's, day by day",
        "usage: misses by cause with their cost are the API's",
        "usage: misses by plugin with their cost are the API's",
        "usage: the most expensive sessions in the API's order, each linked to its costliest step",
        "usage: the agent filter shows default's numbers",
        "usage: a session's costliest step link opens that step",
        "usage: a model without a price is named as such",
        "no script errors or policy violations",
        "screenshot saved",
    ] {
        assert!(
            checks.iter().any(|c| c == needed),
            "the script did not check `{needed}`: {checks:?}"
        );
    }
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "{} is not a screenshot of the page ({} bytes)",
        screenshot.display(),
        png.len()
    );
    if std::env::var("PROMPTD_SCREENSHOT").as_deref() == Ok("1") {
        std::fs::copy(&screenshot, repo_root().join("docs/usage.png")).unwrap();
    }
}
