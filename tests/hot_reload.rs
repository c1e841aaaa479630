//! End-to-end: plugins swapped while sessions run (SPEC H1–H4, R4, R5), against the real daemon
//! watching a real folder.

use promptd_testkit as common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::daemon::{state_dir, Served};
use common::{eventually, eventually_within, fixture, put, Folder};
use serde_json::{json, Value};

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    promptd_daemon::plugin_dir::hex(&Sha256::digest(bytes))
}

fn step(d: &Served, id: &str) -> Value {
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body))
}

/// The version marker a request carries in its section and in its tool, if any.
fn markers(request: &Value) -> (Option<String>, Option<String>) {
    let system = request["system"].as_str().unwrap_or("");
    let section = system
        .split("\n\n")
        .find(|p| p.starts_with("version "))
        .map(str::to_string);
    let tool = request["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "versioned_tool"))
        .map(|t| t["description"].as_str().unwrap().to_string());
    (section, tool)
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

fn start(folder: &Folder) -> (Served, tempfile::TempDir) {
    let config = folder.config("");
    let (tmp, state) = state_dir();
    (Served::start(folder.path(), &config, &state), tmp)
}

#[test]
fn h1_replace_delete_and_restore_a_plugin_during_a_session() {
    let folder = Folder::new().bundled("persona");
    let (v1, v2) = (read("versioned_v1"), read("versioned_v2"));
    put(folder.path(), "versioned", &v1);
    let (d, _state) = start(&folder);
    let id = d.session("default");
    let v = |n: u8| Some(format!("version {n}"));

    assert_eq!(markers(&step(&d, &id)["request"]), (v(1), v(1)));

    put(folder.path(), "versioned", &v2);
    eventually("v2 loaded", || {
        d.plugin("versioned")["sha256"] == sha256(&v2)
    });
    assert_eq!(markers(&step(&d, &id)["request"]), (v(2), v(2)));
    assert_eq!(header_reasons(&d, &id), ["initial", "change"]);

    std::fs::remove_file(folder.path().join("versioned.wasm")).unwrap();
    eventually("unloaded", || d.plugin("versioned").is_null());
    let request = step(&d, &id)["request"].clone();
    assert_eq!(markers(&request), (None, None));
    assert_eq!(request["tools"], json!([]));
    assert!(
        request["system"].as_str().unwrap().contains("Be direct"),
        "persona still serves"
    );

    put(folder.path(), "versioned", &v1);
    eventually("back", || d.plugin("versioned")["state"] == "loaded");
    assert_eq!(markers(&step(&d, &id)["request"]), (v(1), v(1)));
    assert_eq!(
        header_reasons(&d, &id),
        ["initial", "change", "change", "change"]
    );

    // Every change was an event, in order (R5).
    let events: Vec<(String, String)> = sse(&d.url)
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().into(),
                e["plugin"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("load", "persona"),
        ("load", "versioned"),
        ("reload", "versioned"),
        ("unload", "versioned"),
        ("load", "versioned"),
    ]
    .iter()
    .map(|(k, p)| (k.to_string(), p.to_string()))
    .collect();
    assert_eq!(events, expected);
}

#[test]
fn h3_a_broken_new_version_leaves_the_old_one_serving() {
    let folder = Folder::new().bundled("persona");
    let (v1, v2) = (read("versioned_v1"), read("versioned_v2"));
    put(folder.path(), "versioned", &v1);
    let (d, _state) = start(&folder);
    let id = d.session("default");
    let persona = std::fs::read(common::bundled().join("persona.wasm")).unwrap();
    let wrong_world = wat::parse_str("(component)").unwrap();
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("truncated", v2[..v2.len() / 3].to_vec(), "not_a_component"),
        (
            "garbage",
            b"\0asm garbage garbage".to_vec(),
            "not_a_component",
        ),
        ("wrong world", wrong_world, "wrong_world"),
        ("conflict", persona, "section_conflict"),
    ];
    for (what, bytes, code) in cases {
        put(folder.path(), "versioned", &bytes);
        let sha = sha256(&bytes);
        eventually(what, || {
            let p = d.plugin("versioned");
            p["sha256"] == sha && p["last_error"]["code"] == code
        });
        let p = d.plugin("versioned");
        assert_eq!(p["state"], "stale", "{what}: {p}");
        assert_eq!(p["serving_sha256"], sha256(&v1), "{what}: {p}");
        assert_eq!(
            p["declares"]["sections"][0]["name"], "versioned",
            "{what}: the old declaration"
        );
        let request = step(&d, &id)["request"].clone();
        let v1_marker = Some("version 1".to_string());
        assert_eq!(
            markers(&request),
            (v1_marker.clone(), v1_marker),
            "{what}: old version serves"
        );
    }
    // Each failure is on the event stream with its code.
    let refused: Vec<String> = sse(&d.url)
        .iter()
        .filter(|e| e["kind"] == "refused")
        .map(|e| e["error"]["code"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        refused,
        [
            "not_a_component",
            "not_a_component",
            "wrong_world",
            "section_conflict"
        ]
    );

    // Fixed: the next change loads it.
    put(folder.path(), "versioned", &v2);
    eventually("fixed", || d.plugin("versioned")["state"] == "loaded");
    let v2_marker = Some("version 2".to_string());
    assert_eq!(
        markers(&step(&d, &id)["request"]),
        (v2_marker.clone(), v2_marker)
    );
}

#[test]
fn h2_swap_under_load_every_request_is_entirely_old_or_entirely_new() {
    let folder = Folder::new().bundled("persona").bundled("workspace");
    let (v1, v2) = (read("versioned_v1"), read("versioned_v2"));
    put(folder.path(), "versioned", &v1);
    let (d, _state) = start(&folder);
    let url = d.url.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (seen1, seen2, steps) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (url, stop) = (url.clone(), stop.clone());
            let (seen1, seen2, steps) = (seen1.clone(), seen2.clone(), steps.clone());
            let id = d.session("default");
            std::thread::spawn(move || {
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                    let body = json!({"messages": [{"role": "user", "content": "go"}], "facts": {"cwd": format!("/c{c}")}});
                    let (status, text) = common::daemon::request(&url, "POST", &format!("/v1/sessions/{id}/steps"), Some(&body.to_string()), None);
                    assert_eq!(status, 200, "a step failed during swaps: {text}");
                    let v: Value = serde_json::from_str(&text).unwrap();
                    let (section, tool) = markers(&v["request"]);
                    assert_eq!(section, tool, "a mixed request: {text}");
                    match section.as_deref() {
                        Some("version 1") => seen1.fetch_add(1, Ordering::Relaxed),
                        Some("version 2") => seen2.fetch_add(1, Ordering::Relaxed),
                        other => panic!("no version in a step: {other:?}"),
                    };
                    steps.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let swaps = 200;
    for i in 0..swaps {
        let (bytes, sha) = if i % 2 == 0 {
            (&v2, sha256(&v2))
        } else {
            (&v1, sha256(&v1))
        };
        put(folder.path(), "versioned", bytes);
        eventually("swap applied", || d.plugin("versioned")["sha256"] == sha);
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client saw an error or a mixed request");
    }
    let (s1, s2, n) = (
        seen1.load(Ordering::Relaxed),
        seen2.load(Ordering::Relaxed),
        steps.load(Ordering::Relaxed),
    );
    eprintln!("{swaps} swaps under {n} steps: {s1} saw version 1, {s2} saw version 2");
    assert!(s1 > 0 && s2 > 0, "both versions served: v1 {s1}, v2 {s2}");
    let v = d.ok("GET", "/v1/plugins", None);
    assert_eq!(v["plugins"].as_array().unwrap().len(), 3);
}

#[test]
fn h4_a_restart_with_an_unchanged_folder_compiles_nothing() {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools");
    let config = folder.config("");
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let (_, metrics) = d.get("/metrics");
    assert!(
        metrics.contains("promptd_compile_cache_total{result=\"miss\"} 3"),
        "{metrics}"
    );
    d.stop();
    let d = Served::start(folder.path(), &config, &state);
    let (_, metrics) = d.get("/metrics");
    assert!(
        metrics.contains("promptd_compile_cache_total{result=\"hit\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("promptd_compile_cache_total{result=\"miss\"} 0"),
        "{metrics}"
    );
    let entries = std::fs::read_dir(state.join("cache")).unwrap().count();
    assert_eq!(entries, 3);
}

#[test]
fn a_config_change_is_validated_then_applied() {
    let folder = Folder::new().bundled("persona");
    let config = folder.config("[plugins.persona]\nconfig = { text = \"First.\" }\n");
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = d.session("default");
    assert_eq!(step(&d, &id)["request"]["system"], "First.");

    folder.config("[plugins.persona]\nconfig = { text = \"Second.\" }\n");
    eventually("new config applied", || {
        step(&d, &id)["request"]["system"] == "Second."
    });

    // A broken config is refused with an event; the running one stays.
    folder.config("[plugins.persona]\nconfgi = 1\n");
    eventually("refused config event", || {
        sse(&d.url)
            .iter()
            .any(|e| e["kind"] == "refused" && e["error"]["code"] == "config_parse")
    });
    assert_eq!(step(&d, &id)["request"]["system"], "Second.");
}

#[test]
fn dev_mode_rebuilds_a_rust_plugin_when_its_source_changes() {
    // A one-plugin cargo workspace, as `promptd plugin new` will scaffold.
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("hello/src")).unwrap();
    let sdk = common::repo_root().join("sdk/rust");
    std::fs::write(
        ws.join("Cargo.toml"),
        "[workspace]\nresolver = \"2\"\nmembers = [\"hello\"]\n",
    )
    .unwrap();
    std::fs::write(
        ws.join("hello/Cargo.toml"),
        format!(
            "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\npromptd-sdk = {{ path = {:?} }}\n",
            sdk.display().to_string()
        ),
    )
    .unwrap();
    let source = |text: &str| {
        format!(
            "use promptd_sdk::{{export_plugin, Config, Plugin}};\n\nfn declare(_: &Config) -> Result<Plugin, String> {{\n    Ok(Plugin::new().section(\"hello\", 0, {text:?}))\n}}\n\nexport_plugin!(declare);\n"
        )
    };
    std::fs::write(ws.join("hello/src/lib.rs"), source("hello, first build")).unwrap();

    let folder = Folder::new();
    let config = folder.config("");
    let (_state_tmp, state) = state_dir();
    let ws_arg = ws.display().to_string();
    let d = Served::start_with(folder.path(), &config, &state, &["--dev", &ws_arg], &[]);
    // The first build compiles the SDK: allow it time on a cold machine.
    eventually_within(300, "first dev build loaded", || {
        d.plugin("hello")["state"] == "loaded"
    });
    let id = d.session("default");
    assert_eq!(step(&d, &id)["request"]["system"], "hello, first build");

    std::fs::write(ws.join("hello/src/lib.rs"), source("hello, edited")).unwrap();
    eventually_within(120, "rebuilt and reloaded", || {
        step(&d, &id)["request"]["system"] == "hello, edited"
    });
}

#[test]
fn dev_mode_rebuilds_a_c_plugin_folder_when_its_source_changes() {
    // A plugin folder as `promptd plugin new --lang c` makes it; C builds in under a second.
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().to_str().unwrap();
    common::ok(&["plugin", "new", "greeter", "--lang", "c", "--dir", parent]);
    let src = tmp.path().join("greeter");
    let folder = Folder::new();
    let config = folder.config("");
    let (state_tmp, state) = state_dir();
    let log = state_tmp.path().join("daemon.log");
    let src_arg = src.display().to_string();
    // Served from the plugin folder itself, as docs/operations.md suggests (`--plugins . --dev .`): the
    // build must never show the daemon a half-written component.
    let d = Served::start_with_logged(&src, &config, &state, &["--dev", &src_arg], &log);
    eventually_within(120, "first dev build loaded", || {
        d.plugin("greeter")["state"] == "loaded"
    });
    let id = d.session("default");
    assert_eq!(
        step(&d, &id)["request"]["system"],
        "Answer as briefly as you can."
    );

    let path = src.join("plugin.c");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("Answer as {{", "Reply as {{")).unwrap();
    eventually_within(120, "rebuilt and reloaded", || {
        step(&d, &id)["request"]["system"] == "Reply as briefly as you can."
    });

    // A build error is logged; the last good version keeps serving. Checked once the daemon
    // has logged the failed build of the broken source, not merely after some time.
    let failed_builds = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("dev: build failed"))
            .count()
    };
    let before = failed_builds();
    std::fs::write(&path, "this is not C").unwrap();
    eventually_within(
        120,
        "the dev build of the broken plugin.c to fail in the log",
        || failed_builds() > before,
    );
    assert_eq!(
        step(&d, &id)["request"]["system"],
        "Reply as briefly as you can."
    );
    assert_eq!(d.plugin("greeter")["state"], "loaded");
}

/// Every registry event so far, from the SSE stream (it replays the history at once; the read
/// ends when the stream has been quiet for a moment).
fn sse(base: &str) -> Vec<Value> {
    use std::io::{BufRead, BufReader, Write};
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    write!(stream, "GET /v1/events HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut events = Vec::new();
    for line in BufReader::new(&mut stream).lines() {
        let Ok(line) = line else { break };
        if let Some(data) = line.strip_prefix("data: ") {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    events
}
