//! K7 through a real daemon: a plugin marked `refresh = "boundary"` is swapped mid-session;
//! its change waits for a cache-cold point (an idle gap past the TTL, a compaction, a new
//! session, its `max_stale_s`), the stub provider keeps serving the prefix from cache
//! meanwhile, and every step rebuilds from the log, after a restart, to the body sent.

use crate::cache_policy::{headers, rebuilt_as_sent, turn};
use crate::cache_workload::{persona, Stub};
use promptd_testkit as common;

use common::daemon::Served;
use common::{eventually, fixture, put, Folder};
use serde_json::{json, Value};

fn config_with(refresh: &str) -> String {
    format!(
        r#"
[model]
max_tokens = 1024
[model.anthropic]
model = "claude-sonnet-4-5"

[agents.coder]

[plugins.persona]
config = {{ text = {persona:?} }}
[plugins.versioned]
{refresh}
"#,
        persona = persona(),
    )
}

fn folder() -> Folder {
    let folder = Folder::new().bundled("persona").bundled("tools");
    put(folder.path(), "versioned", &version(1));
    folder
}

fn version(n: u8) -> Vec<u8> {
    std::fs::read(fixture(&format!("versioned_v{n}"))).unwrap()
}

fn swap_to(d: &Served, folder: &Folder, n: u8) {
    let bytes = version(n);
    put(folder.path(), "versioned", &bytes);
    let sha = {
        use sha2::{Digest, Sha256};
        promptd_daemon::plugin_dir::hex(&Sha256::digest(&bytes))
    };
    eventually("the new version serves", || {
        d.plugin("versioned")["serving_sha256"] == sha
    });
}

/// The version a request's system prompt carries.
fn version_sent(request: &Value) -> String {
    let system = request["system"].to_string();
    ["version 1", "version 2"]
        .into_iter()
        .find(|v| system.contains(v))
        .unwrap_or("none")
        .to_string()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn explain(d: &Served, id: &str, n: u64) -> Value {
    d.ok(
        "GET",
        &format!("/v1/sessions/{id}/steps/{n}/explain?format=anthropic"),
        None,
    )
}

fn step(d: &Served, id: &str, text: &str) -> (u64, Value) {
    let body = json!({"format": "anthropic", "messages": [{"role": "user", "content": text}]});
    let v = d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body));
    (v["step"].as_u64().unwrap(), v["request"].clone())
}

/// K7: a swap of a `boundary` plugin is held while the cache is warm — the same header, the
/// stub reading the prefix from cache, the explain and `GET /v1/plugins` saying what waits —
/// and applied at an idle gap past the TTL (one session) and at a compaction (another), in
/// a header that says what it released and why; a session started after the swap takes the
/// new version at once; every step rebuilds byte-identically after a restart.
#[test]
fn k7_a_boundary_plugins_change_waits_for_a_cold_point_and_every_step_rebuilds() {
    boundary_change_waits_for_a_cold_point(r#"refresh = "boundary""#, "config");
}

/// W4 and K7: the same, the plugin declaring `refresh = boundary` on its section and tool
/// itself (world 0.3.0) with nothing in the operator's config.
#[test]
fn w4_a_boundary_declared_by_the_plugin_holds_exactly_as_one_set_in_config() {
    boundary_change_waits_for_a_cold_point(
        r#"config = { declare_refresh = "boundary" }"#,
        "plugin",
    );
}

/// The K7 walk of a `versioned` plugin made `boundary` by `marked` (its `[plugins.versioned]`
/// table), which `GET /v1/plugins` says `by` set.
fn boundary_change_waits_for_a_cold_point(marked: &str, by: &str) {
    let folder = folder();
    let config = folder.config(&config_with(marked));
    let (_tmp, state) = common::daemon::state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let stub = Stub::start();
    let mut sent: Vec<(String, u64, Value)> = Vec::new();
    let keep = |sent: &mut Vec<(String, u64, Value)>, id: &str, turn: Vec<(u64, Value, Value)>| {
        for (n, request, _) in &turn {
            sent.push((id.to_string(), *n, request.clone()));
        }
        turn
    };
    let plugin = d.plugin("versioned");
    let mode = if by == "config" { "boundary" } else { "parts" };
    assert_eq!(plugin["refresh"]["mode"], mode, "{plugin}");
    assert_eq!(plugin["refresh"]["by"], by, "{plugin}");
    assert_eq!(plugin["refresh"]["max_stale_s"], 3600, "{plugin}");

    let t0 = now_ms();
    let (idle, compacted) = (d.session("coder"), d.session("coder"));
    for id in [&idle, &compacted] {
        let first = keep(&mut sent, id, turn(&d, &stub, id, t0));
        assert_eq!(version_sent(&first[0].1), "version 1");
    }

    swap_to(&d, &folder, 2);
    let fresh = d.session("coder");
    let (n, request) = step(&d, &fresh, "a new session");
    sent.push((fresh.clone(), n, request.clone()));
    assert_eq!(version_sent(&request), "version 2", "a new session is cold");

    // Held: the same header, served from the stub's cache.
    for id in [&idle, &compacted] {
        let at = now_ms().max(t0 + 1_000);
        let later = keep(&mut sent, id, turn(&d, &stub, id, at));
        let (n, request, usage) = &later[0];
        assert_eq!(version_sent(request), "version 1", "{id} step {n} held");
        assert!(
            usage["cache_read_input_tokens"].as_u64().unwrap() > 1024,
            "the held prefix is read from cache: {usage}"
        );
        assert_eq!(headers(&d, id).len(), 1, "no new header while held");
        let e = explain(&d, id, *n);
        let held = e["held"].as_array().unwrap();
        let parts: Vec<(&str, &str)> = held
            .iter()
            .map(|h| (h["kind"].as_str().unwrap(), h["name"].as_str().unwrap()))
            .collect();
        assert_eq!(
            parts,
            [("section", "versioned"), ("tool", "versioned_tool")],
            "{e}"
        );
        assert!(held
            .iter()
            .all(|h| h["since_step"] == *n && h["plugin"] == "versioned"));
        let said = e["said"][0].as_str().unwrap();
        assert!(
            said.starts_with(&format!(
                "section `versioned` of plugin `versioned` held since step {n}, "
            )) && said.ends_with(" kB of cached prefix kept"),
            "{said}"
        );
    }
    let listed = d.plugin("versioned")["held"].clone();
    let sessions: std::collections::BTreeSet<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["session"].as_str().unwrap())
        .collect();
    assert_eq!(
        sessions,
        [idle.as_str(), compacted.as_str()].into(),
        "{listed}"
    );

    // An idle gap past the 5-minute TTL since the last reply: applied. (The reply says it was
    // sent six minutes ago, rather than the test waiting.)
    let (n, request) = step(&d, &idle, "one more");
    sent.push((idle.clone(), n, request.clone()));
    assert_eq!(version_sent(&request), "version 1", "still held");
    let reply = json!({"role": "assistant", "content": "done", "usage": {"input_tokens": 2000, "output_tokens": 5}});
    let long_ago = now_ms() - 6 * 60_000;
    d.ok(
        "POST",
        &format!("/v1/sessions/{idle}/messages?format=anthropic&sent_at={long_ago}"),
        Some(&reply),
    );
    let (n, request) = step(&d, &idle, "after a break");
    sent.push((idle.clone(), n, request.clone()));
    assert_eq!(version_sent(&request), "version 2");
    let h = headers(&d, &idle);
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(h[1]["reason"], "change");
    let cause = h[1]["released"]["cause"].as_str().unwrap();
    assert!(
        cause.starts_with("idle ") && cause.ends_with(" s passed the 300 s TTL"),
        "{cause}"
    );
    assert_eq!(h[1]["released"]["held"].as_array().unwrap().len(), 2);
    let said = explain(&d, &idle, n)["said"].clone();
    assert_eq!(said, json!([format!("applied 2 held changes ({cause})")]));

    // A compaction: applied at the next step.
    let events = d.ok("GET", &format!("/v1/sessions/{compacted}/events"), None);
    // The first turn: its messages up to the second user message.
    let messages: Vec<(u64, &str)> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            ["user/message", "assistant/message", "tool/result"]
                .contains(&e["kind"].as_str().unwrap())
        })
        .map(|e| (e["seq"].as_u64().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    let second = messages
        .iter()
        .skip(1)
        .position(|(_, k)| *k == "user/message")
        .unwrap()
        + 1;
    d.ok(
        "POST",
        &format!("/v1/sessions/{compacted}/compact"),
        Some(&json!({"from": messages[0].0, "to": messages[second - 1].0, "summary": "Earlier: a task."})),
    );
    let (n, request) = step(&d, &compacted, "after the compaction");
    sent.push((compacted.clone(), n, request.clone()));
    assert_eq!(version_sent(&request), "version 2");
    let h = headers(&d, &compacted);
    assert_eq!(h[1]["released"]["cause"], "compaction", "{h:?}");
    assert_eq!(
        d.plugin("versioned")["held"],
        json!([]),
        "nothing waits any more"
    );

    // Every step, rebuilt from the log by a restarted daemon, is the body that was sent.
    d.stop();
    let d = Served::start(folder.path(), &config, &state);
    rebuilt_as_sent(&d, &sent, "anthropic");
}

/// K7: a change held for the plugin's `max_stale_s` is applied, whatever the cache; a change
/// to a part not marked is applied at once; a plugin marking only its tool holds nothing
/// when its section changes too.
#[test]
fn k7_max_stale_and_an_unmarked_part_apply_the_change() {
    let folder = folder();
    let config = folder.config(&config_with(
        "refresh = { tools = [\"versioned_tool\"] }\nmax_stale_s = 1",
    ));
    let (_tmp, state) = common::daemon::state_dir();
    let d = Served::start(folder.path(), &config, &state);
    assert_eq!(
        d.plugin("versioned")["refresh"],
        json!({"mode": "parts", "sections": [], "tools": ["versioned_tool"], "session": [],
               "max_stale_s": 1, "by": "config",
               "defer": {"all": false, "tools": [], "by": "default"}})
    );
    let id = d.session("coder");
    step(&d, &id, "first");
    swap_to(&d, &folder, 2);
    // The section changed too, and it is not marked: applied at once.
    let (n, request) = step(&d, &id, "second");
    assert_eq!(version_sent(&request), "version 2");
    let h = headers(&d, &id);
    assert_eq!(h.len(), 2);
    assert!(h[1].get("released").is_none(), "nothing was held: {h:?}");
    assert_eq!(explain(&d, &id, n)["held"], json!([]));
    d.stop();

    // Every part marked, max_stale_s = 1: held, then applied after a second.
    let folder = Folder::new().bundled("persona");
    put(folder.path(), "versioned", &version(1));
    let config = folder.config(&config_with("refresh = \"boundary\"\nmax_stale_s = 1"));
    let (_tmp, state) = common::daemon::state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = d.session("coder");
    step(&d, &id, "first");
    swap_to(&d, &folder, 2);
    let (_, request) = step(&d, &id, "second");
    assert_eq!(version_sent(&request), "version 1", "held");
    // The next step says it is sent 1.1 s from now (`sent_at`), rather than the test waiting:
    // the change has been held since the step above, so more than max_stale_s by then.
    let body = json!({"format": "anthropic", "sent_at": now_ms() + 1_100,
                      "messages": [{"role": "user", "content": "third"}]});
    let v = d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body));
    let request = v["request"].clone();
    assert_eq!(version_sent(&request), "version 2", "past max_stale_s");
    let h = headers(&d, &id);
    let cause = h[1]["released"]["cause"].as_str().unwrap();
    assert!(
        cause.starts_with("held ") && cause.ends_with("its max_stale_s is 1"),
        "{cause}"
    );
}

/// K7: a `refresh` naming a part the plugin does not declare refuses the plugin, naming it;
/// contexts, which no change of makes the cache cold, are refused in the config.
#[test]
fn k7_refresh_names_only_what_the_plugin_declares() {
    let folder = folder();
    let config = folder.config(&config_with("refresh = { sections = [\"nope\"] }"));
    let (_tmp, state) = common::daemon::state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let plugin = d.plugin("versioned");
    assert_eq!(plugin["state"], "refused", "{plugin}");
    assert_eq!(plugin["last_error"]["code"], "refresh_unknown", "{plugin}");
    let message = plugin["last_error"]["message"].as_str().unwrap();
    assert!(message.contains("section `nope`"), "{message}");
    d.stop();

    for (refresh, says) in [
        (
            "refresh = { contexts = [\"x\"] }",
            "contexts are never held",
        ),
        (
            "refresh = \"sometimes\"",
            "plugins.versioned.refresh = \"sometimes\"",
        ),
        (
            "refresh = \"boundary\"\nmax_stale_s = 0",
            "max_stale_s must be greater than 0",
        ),
    ] {
        let config = folder.config(&config_with(refresh));
        let out = common::promptd(&[
            "assemble",
            "--plugins",
            folder.path().to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ]);
        let err = common::stderr(&out);
        assert!(
            !out.status.success() && err.contains(says),
            "{refresh}: {err}"
        );
    }
}

/// W4 and K9: a tool the plugin declares deferred (world 0.3.0) is deferred exactly as one
/// the operator's `defer` names — the same request bytes in every format, the search tool
/// and `defer_loading` in Anthropic's — and the config overrides the plugin (`defer = false`).
#[test]
fn w4_a_tool_deferred_by_the_plugin_is_deferred_exactly_as_one_set_in_config() {
    let request = |marked: &str| {
        let folder = folder();
        let config = folder.config(&config_with(marked));
        let (_tmp, state) = common::daemon::state_dir();
        let d = Served::start(folder.path(), &config, &state);
        let id = d.session("coder");
        step(&d, &id, "hello");
        let bodies: Vec<Value> = ["anthropic", "openai-responses", "neutral"]
            .iter()
            .map(|f| {
                d.ok(
                    "GET",
                    &format!("/v1/sessions/{id}/steps/1/request?format={f}"),
                    None,
                )
            })
            .collect();
        // `promptd plugins` says which setting is in force and who set it.
        let out = common::promptd_command()
            .env("PROMPTD_URL", &d.url)
            .arg("plugins")
            .output()
            .expect("run promptd plugins");
        let listed = common::stdout(&out);
        let line = listed
            .lines()
            .find(|l| l.starts_with("versioned "))
            .unwrap_or_else(|| panic!("{listed}"))
            .to_string();
        (
            bodies,
            d.plugin("versioned")["refresh"]["defer"].clone(),
            line,
        )
    };
    let (by_config, said, line) = request(r#"defer = ["versioned_tool"]"#);
    assert_eq!(said["by"], "config", "{said}");
    assert!(
        line.contains("refresh step (default), 1 tool(s) deferred (config)"),
        "{line}"
    );
    let (by_plugin, said, line) = request(r#"config = { declare_defer = "true" }"#);
    assert_eq!(said["by"], "plugin", "{said}");
    assert!(
        line.contains("refresh step (default), 1 tool(s) deferred (plugin)"),
        "{line}"
    );
    assert_eq!(said["tools"], json!(["versioned_tool"]));
    assert_eq!(by_plugin, by_config, "the same requests either way");
    let tools = by_plugin[0]["tools"].as_array().unwrap();
    let deferred = tools
        .iter()
        .find(|t| t["name"] == "versioned_tool")
        .unwrap();
    assert_eq!(deferred["defer_loading"], true, "{tools:?}");
    assert!(tools.iter().any(|t| t["name"] == "tool_search_tool_regex"));

    let (overridden, said, line) = request("defer = false\nconfig = { declare_defer = \"true\" }");
    assert_eq!(said["by"], "config", "{said}");
    assert!(!line.contains("deferred"), "{line}");
    let tools = overridden[0]["tools"].as_array().unwrap();
    let tool = tools
        .iter()
        .find(|t| t["name"] == "versioned_tool")
        .unwrap();
    assert!(tool.get("defer_loading").is_none(), "{tools:?}");
}
