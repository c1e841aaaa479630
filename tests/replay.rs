//! End-to-end: counterfactual replay (issue 29; Q19, Q20) against real daemons over HTTP, with
//! the bundled Rust plugins and the `versioned` fixture built from source, and a workload
//! whose requests go to the stub provider (`tests/sdk_loops/stub_provider.py`, standard
//! library only) at scripted times, so the stub's cache and its charges are the truth a
//! replay's projection is checked against.

use promptd_testkit as common;

use std::path::Path;

use common::daemon::{request, Served};
use common::process::{start_stub_provider, Bounded};
use common::{eventually, fixture, put, Folder};
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5";
/// US dollars per million tokens, as the config's `[pricing]` says.
const INPUT: f64 = 3.0;
const OUTPUT: f64 = 15.0;
/// Steps of the workload: five turns of two steps.
const TURNS: usize = 5;
const START_MS: u64 = 1_800_000_000_000;

fn config() -> String {
    format!(
        "[model]\nmax_tokens = 1024\n[model.anthropic]\nmodel = \"{MODEL}\"\n\
         [pricing.\"{MODEL}\"]\ninput = {INPUT}\noutput = {OUTPUT}\n"
    )
}

/// The bundled Rust plugins and the `versioned` fixture at version `v` (as `versioned.wasm`).
fn folder(v: u8) -> Folder {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    put(folder.path(), "versioned", &versioned(v));
    folder.config(&config());
    folder
}

fn versioned(v: u8) -> Vec<u8> {
    std::fs::read(fixture(&format!("versioned_v{v}"))).expect("the versioned fixture")
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    promptd_daemon::plugin_dir::hex(&Sha256::digest(bytes))
}

struct Stub {
    _child: Bounded,
    url: String,
}

impl Stub {
    fn start() -> Stub {
        let (child, url) = start_stub_provider(Path::new("python3"), "600", None);
        Stub { _child: child, url }
    }

    /// Sends a request body to the Anthropic route at the scripted time `now`.
    fn messages(&self, body: &Value, now: u64) -> Value {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent
            .post(&format!("{}/v1/messages", self.url))
            .header("Content-Type", "application/json")
            .header("X-Stub-Now-Ms", &now.to_string())
            .send(body.to_string())
            .expect("reach the stub");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(status, 200, "the stub refused the body: {text}");
        serde_json::from_str(&text).expect("the stub's reply is JSON")
    }

    fn reset(&self) {
        let (status, text) = request(&self.url, "POST", "/stub/reset", Some("{}"), None);
        assert_eq!(status, 200, "{text}");
    }

    /// What the stub charged for each request since its last reset, priced by the config.
    fn charged(&self) -> Vec<f64> {
        let (_, text) = request(&self.url, "GET", "/stub/ledger", None, None);
        let ledger: Value = serde_json::from_str(&text).expect("the ledger");
        ledger["requests"]
            .as_array()
            .expect("requests")
            .iter()
            .map(|r| {
                let n = |k: &str| r[k].as_f64().unwrap_or(0.0);
                (n("uncached") * INPUT
                    + n("read") * INPUT * 0.1
                    + n("written_5m") * INPUT * 1.25
                    + n("written_1h") * INPUT * 2.0
                    + n("output_tokens") * OUTPUT)
                    / 1e6
            })
            .collect()
    }
}

/// The workload: TURNS turns of a user step and a tool-result step, each request sent to the
/// stub a minute after the one before and its reply recorded with that time. The tool
/// results go in the step on even turns and are recorded on their own on odd ones. Before
/// turn `swap_at`, `swap` runs (a plugin swapped under the daemon). Returns the session.
fn drive(d: &Served, stub: &Stub, swap_at: usize, swap: &mut dyn FnMut()) -> String {
    let id = d.session("default");
    let facts = json!({"cwd": "/src/app", "git_branch": "main"});
    let mut now = START_MS;
    let mut exchange = |messages: Value| -> Vec<String> {
        let step = d.ok(
            "POST",
            &format!("/v1/sessions/{id}/steps"),
            Some(&json!({"messages": messages, "facts": facts, "format": "anthropic"})),
        );
        let reply = stub.messages(&step["request"], now);
        d.ok(
            "POST",
            &format!("/v1/sessions/{id}/messages?sent_at={now}"),
            Some(&reply),
        );
        now += 60_000;
        reply["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| b["id"].as_str().unwrap().to_string())
            .collect()
    };
    for turn in 0..TURNS {
        if turn == swap_at {
            swap();
        }
        let user = format!(
            "Turn {turn}: look at the repository and tell me what the build does, file by file. {}",
            "Be thorough. ".repeat(20)
        );
        let calls = exchange(json!([{"role": "user", "content": user}]));
        assert!(
            !calls.is_empty(),
            "the stub calls a tool while none was answered"
        );
        let results: Vec<Value> = calls
            .iter()
            .map(
                |c| json!({"role": "tool", "tool_call_id": c, "content": format!("output of {c}")}),
            )
            .collect();
        if turn % 2 == 1 {
            for r in &results {
                d.ok("POST", &format!("/v1/sessions/{id}/messages"), Some(r));
            }
            exchange(json!([]));
        } else {
            exchange(Value::Array(results));
        }
    }
    id
}

fn events(d: &Served, id: &str) -> Value {
    d.ok("GET", &format!("/v1/sessions/{id}/events"), None)
}

fn replay(d: &Served, body: &Value) -> Value {
    d.ok("POST", "/v1/replay", Some(body))
}

fn differing(session: &Value) -> Vec<u64> {
    session["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["differs"] == true)
        .map(|s| s["step"].as_u64().unwrap())
        .collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Q19 and issue 29's criteria: a workload replayed with its own recorded plugins differs
/// nowhere and projects what was recorded; with one plugin swapped for its other version it
/// differs exactly in the steps whose recorded request carried the old version, naming the
/// part and the plugin, and its projected cost is what the stub charged when that candidate
/// actually ran; `promptd plugin check NEW.wasm --against SESSION` prints the same report.
#[test]
fn q19_replay_differs_exactly_where_the_candidate_does_and_projects_what_it_costs() {
    let stub = Stub::start();
    let a = folder(1);
    let (da, _state_a) = a.serve(&config());

    // Session 1: version 1 throughout; replayed with the folder it was recorded with.
    stub.reset();
    let s1 = drive(&da, &stub, usize::MAX, &mut || {});
    let same = replay(&da, &json!({"sessions": [s1], "plugins": path(a.path())}));
    let r1 = &same["sessions"][0];
    assert_eq!(r1["totals"]["steps"], 2 * TURNS as u64);
    assert_eq!(differing(r1), Vec::<u64>::new(), "{r1:#}");
    for s in r1["steps"].as_array().unwrap() {
        assert_eq!(s["recorded"], s["candidate"], "step {}", s["step"]);
        assert_eq!(s["tokens"]["delta"], 0);
        assert_eq!(s["tokens"]["counted"], "provider");
    }
    assert_eq!(
        r1["format"], "anthropic",
        "the format of the recorded replies"
    );
    assert_eq!(r1["totals"]["cost_delta"], 0.0);
    // The cache model fed the recorded requests projects what the stub charged for them.
    let charged: f64 = stub.charged().iter().sum();
    let projected = r1["totals"]["recorded"]["cost"].as_f64().unwrap();
    eprintln!("session 1: projected {projected:.6} $ against charged {charged:.6} $");
    assert!(
        (projected - charged).abs() <= 0.01 * charged,
        "projected {projected} against charged {charged}"
    );
    assert!(
        r1["totals"]["recorded"]["read"].as_u64().unwrap() > 0,
        "the cache served"
    );

    // Session 2: version 1 for two turns, then version 2 swapped in under the daemon.
    stub.reset();
    let s2 = drive(&da, &stub, 2, &mut || {
        put(a.path(), "versioned", &versioned(2));
        eventually("version 2 loaded", || {
            da.plugin("versioned")["sha256"] == sha256(&versioned(2))
        });
    });
    let before = (
        events(&da, &s1),
        events(&da, &s2),
        da.ok("GET", "/v1/plugins", None),
    );

    // Replayed with version 2 throughout: steps 1–4 differ (they carried version 1), at the
    // first part version 2 changes (its tool, read before the system prompt), by `versioned`.
    let b = folder(2);
    let swapped = replay(&da, &json!({"sessions": [s2], "plugins": path(b.path())}));
    let r2 = &swapped["sessions"][0];
    assert_eq!(differing(r2), vec![1, 2, 3, 4], "{r2:#}");
    for s in &r2["steps"].as_array().unwrap()[..4] {
        let d = &s["first_difference"];
        assert_eq!(d["part"], "tool `versioned_tool`", "{d}");
        assert_eq!(d["plugin"], "versioned");
        let cause = d["cause"].as_str().unwrap();
        assert!(
            cause.starts_with("tool `versioned_tool` description changed: plugin `versioned`"),
            "{cause}"
        );
        assert!(d["offset"].as_u64().unwrap() > 0);
    }
    for s in &r2["steps"].as_array().unwrap()[4..] {
        assert!(s["first_difference"].is_null());
        assert_eq!(s["tokens"]["delta"], 0);
    }
    // The same requests from step 5 on, but the recorded ones found the cache cold where
    // the swap broke their prefix, while the candidate's prefix had been cached from step 1.
    let step5 = &r2["steps"][4];
    assert_eq!(step5["recorded"]["read"], 0, "{step5}");
    assert!(step5["candidate"]["read"].as_u64().unwrap() > 0, "{step5}");
    assert_eq!(r2["steps"][9]["recorded"], r2["steps"][9]["candidate"]);

    // Version 2 run for real, at the same times, on its own daemon: what the stub charged is
    // the replay's projection for the candidate.
    stub.reset();
    let (db, _state_b) = b.serve(&config());
    drive(&db, &stub, usize::MAX, &mut || {});
    let charged: Vec<f64> = stub.charged();
    let projected: Vec<f64> = r2["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["candidate"]["cost"].as_f64().unwrap())
        .collect();
    assert_eq!(charged.len(), projected.len());
    let (total_charged, total_projected): (f64, f64) =
        (charged.iter().sum(), projected.iter().sum());
    assert!(
        (total_projected - total_charged).abs() <= 0.01 * total_charged,
        "projected {total_projected} against charged {total_charged}: {projected:?} {charged:?}"
    );
    for (p, c) in projected.iter().zip(&charged) {
        assert!(
            (p - c).abs() <= 0.05 * c,
            "per step: {projected:?} against {charged:?}"
        );
    }

    eprintln!("projected {total_projected:.6} $ against charged {total_charged:.6} $: {projected:?} {charged:?}");
    let table = common::ok(&[
        "replay",
        &s2,
        "--plugins",
        b.path().to_str().unwrap(),
        "--server",
        &da.url,
    ]);
    assert!(table.contains("10 steps, 4 differ, 0 failed"), "{table}");
    eprintln!("{table}");

    // `promptd plugin check NEW.wasm --against SESSION`: version 1 in place of the daemon's
    // version 2 differs in the steps recorded with version 2.
    let new = tempfile::tempdir().unwrap();
    put(new.path(), "versioned", &versioned(1));
    let out = common::ok(&[
        "plugin",
        "check",
        new.path().join("versioned.wasm").to_str().unwrap(),
        "--against",
        &s2,
        "--server",
        &da.url,
    ]);
    assert!(
        out.contains(&format!(
            "session {s2} (agent default, anthropic): 10 steps, 6 differ, 0 failed"
        )),
        "{out}"
    );
    assert!(
        out.contains("first difference: tool `versioned_tool` at byte"),
        "{out}"
    );
    assert!(out.contains("(plugin `versioned`)"), "{out}");
    assert!(
        out.contains("totals: 10 steps, 6 differ, 0 failed"),
        "{out}"
    );
    let json_out = common::ok(&[
        "replay",
        &s1,
        "--plugins",
        b.path().to_str().unwrap(),
        "--json",
        "--server",
        &da.url,
    ]);
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(differing(&v["sessions"][0]), (1..=10).collect::<Vec<u64>>());

    // Q20: none of it wrote to a log or changed what the daemon serves.
    let after = (
        events(&da, &s1),
        events(&da, &s2),
        da.ok("GET", "/v1/plugins", None),
    );
    assert_eq!(before, after);
}

/// Q20: a replay writes nothing — the sessions' logs are as they were, event for event, and
/// the daemon serves the plugins it served — also when the candidate is selected by agent
/// and time; and a candidate that cannot be read is refused (422) naming it.
#[test]
fn q20_replay_never_writes_and_refuses_a_candidate_it_cannot_read() {
    let a = folder(1);
    let (d, _state) = a.serve(&config());
    let id = d.session("default");
    for text in ["What is here?", "And there?"] {
        d.ok(
            "POST",
            &format!("/v1/sessions/{id}/steps"),
            Some(&json!({"messages": [{"role": "user", "content": text}],
                         "facts": {"cwd": "/src"}, "format": "anthropic"})),
        );
        d.ok(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            Some(&json!({"role": "assistant", "content": "Sources."})),
        );
    }
    let before = (events(&d, &id), d.ok("GET", "/v1/plugins", None));
    let b = folder(2);
    let v = replay(
        &d,
        &json!({"agent": "default", "since": 0, "plugins": path(b.path())}),
    );
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(differing(&v["sessions"][0]), vec![1, 2]);
    assert_eq!(
        replay(&d, &json!({"agent": "reviewer"}))["sessions"],
        json!([]),
        "no session of that agent"
    );
    assert_eq!(before, (events(&d, &id), d.ok("GET", "/v1/plugins", None)));
    // The daemon still steps on its own plugins (version 1).
    let step = d.ok(
        "POST",
        &format!("/v1/sessions/{id}/steps"),
        Some(&json!({"messages": [{"role": "user", "content": "Again."}]})),
    );
    assert!(step["request"]["system"]
        .as_str()
        .unwrap()
        .contains("version 1"));

    let refused = |body: Value, code: &str, names: &str| {
        let (status, text) = d.post("/v1/replay", &body.to_string());
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(status, 422, "{text}");
        assert_eq!(v["error"]["code"], code, "{text}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{message}");
    };
    let missing = a.path().join("no-such-folder");
    refused(
        json!({"sessions": [id], "plugins": path(&missing)}),
        "replay_candidate",
        &path(&missing),
    );
    refused(
        json!({"sessions": [id], "plugins": "plugins"}),
        "replay_candidate",
        "must be an absolute path",
    );
    let config = a.path().join("promptd.toml");
    refused(
        json!({"sessions": [id], "plugins": path(&config)}),
        "replay_candidate",
        "is not a folder",
    );
    let bad = a.path().join("bad.toml");
    std::fs::write(&bad, "unknown_key = 1\n").unwrap();
    refused(
        json!({"sessions": [id], "config": path(&bad)}),
        "replay_candidate",
        &format!("config {}: ", path(&bad)),
    );
    refused(
        json!({"sessions": [id], "swap": [path(&a.path().join("nothing.wasm"))]}),
        "replay_candidate",
        "nothing.wasm",
    );
    let (status, _) = d.post("/v1/replay", &json!({"sessions": ["nope"]}).to_string());
    assert_eq!(status, 404);
}
