//! End-to-end: misbehaving plugins cost their own contributions at most (SPEC L1–L5, A9, A10).
//! Real components (the `scripted` fixture, built from Rust source) in the real daemon.

use promptd_testkit as common;

use std::time::{Duration, Instant};

use common::daemon::{state_dir, Served};
use common::{eventually, Folder};
use serde_json::{json, Value};

#[test]
fn l2_an_infinite_loop_is_stopped_at_its_deadline() {
    let folder = Folder::new().scripted("looper");
    let (d, _s) = folder
        .serve("[plugins.looper]\ntimeout_ms = 300\nconfig = { \"loop_section.spin\" = \"0\" }\n");
    let id = d.session("default");
    let started = Instant::now();
    let (status, v) = d.step(&id);
    let took = started.elapsed();
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "plugin_trap");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("plugin `looper`, section `spin`")
            && message.contains("deadline exceeded"),
        "{message}"
    );
    assert!(
        took < Duration::from_secs(5),
        "stopped near its 300 ms deadline, took {took:?}"
    );
    assert_eq!(d.get("/v1/health").0, 200, "the daemon stays up");
}

#[test]
fn l2_memory_growth_past_the_cap_fails_inside_the_guest() {
    let folder = Folder::new().scripted("hog");
    let (d, _s) =
        folder.serve("[plugins.hog]\nmemory_mb = 64\nconfig = { \"grow_section.eat\" = \"0\" }\n");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "plugin_trap");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugin `hog`, section `eat`"),
        "{v}"
    );
    assert_eq!(d.get("/v1/health").0, 200);
}

#[test]
fn l3_after_a_trap_a_fresh_instance_serves_the_next_call() {
    let folder = Folder::new().scripted("flaky");
    let (d, _s) = folder.serve("[plugins.flaky]\nconfig = { \"flaky_section.f\" = \"0\" }\n");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(
        (status, v["request"]["system"].clone()),
        (200, json!("flaky ok (call 1)"))
    );
    let (status, v) = d.step(&id);
    assert_eq!(status, 502);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("flaky: call 2 of this instance"),
        "{v}"
    );
    // The trapped instance was dropped: the next call is call 1 of a fresh one.
    let (status, v) = d.step(&id);
    assert_eq!(
        (status, v["request"]["system"].clone()),
        (200, json!("flaky ok (call 1)"))
    );
}

#[test]
fn output_checks_bound_returned_text() {
    let folder = Folder::new().scripted("big");
    let (d, _s) = folder.serve("[plugins.big]\nconfig = { \"huge_section.h\" = \"0\" }\n");
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "plugin_error");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("10485760 bytes, over the limit of 1048576 bytes"),
        "{message}"
    );

    // A schema that is not an object is refused at load.
    let folder = Folder::new().scripted("schema");
    let (d, _s) =
        folder.serve("[plugins.schema]\nconfig = { \"tool.t\" = '[\"not\", \"an object\"]' }\n");
    assert_eq!(d.plugin("schema")["last_error"]["code"], "invalid_schema");
}

#[test]
fn l1_no_files_or_environment_without_a_grant() {
    std::env::set_var("PROMPTD_SANDBOX_PROBE", "visible");
    let folder = Folder::new().scripted("probe");
    let (d, _s) = folder.serve("[plugins.probe]\nconfig = { \"probe_section.p\" = \"0\", probe_read = \"/etc/passwd\", probe_write = \"/tmp/promptd-probe\", probe_env = \"HOME\" }\n",
    );
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["request"]["system"],
        "read /etc/passwd: denied\nwrite /tmp/promptd-probe: denied\nenv HOME: absent"
    );
}

#[test]
fn l1_a_granted_directory_is_readable_not_writable_and_nothing_else_is() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("notes.txt"), "granted content\n").unwrap();
    let folder = Folder::new().scripted("probe");
    let config = format!(
        "[plugins.probe]\ndirs = {{ {:?} = \"/data\" }}\nenv = [\"PROMPTD_SANDBOX_GRANTED\"]\n\
         config = {{ \"probe_section.p\" = \"0\", probe_read = \"/data/notes.txt,/etc/passwd\", probe_write = \"/data/new.txt\", probe_env = \"PROMPTD_SANDBOX_GRANTED\" }}\n",
        data.path().display().to_string()
    );
    let config = folder.config(&config);
    let (_tmp, state) = state_dir();
    let d = Served::start_with(
        folder.path(),
        &config,
        &state,
        &[],
        &[("PROMPTD_SANDBOX_GRANTED", "yes")],
    );
    let id = d.session("default");
    let (status, v) = d.step(&id);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["request"]["system"],
        "read /data/notes.txt: ok granted content\nread /etc/passwd: denied\nwrite /data/new.txt: denied\nenv PROMPTD_SANDBOX_GRANTED: yes"
    );
    assert!(!data.path().join("new.txt").exists());
}

#[test]
fn l3_repeated_failure_quarantines_and_enable_or_a_file_change_revives() {
    let folder = Folder::new().scripted("bad").scripted("good");
    let (d, _s) = folder.serve(
        "[limits]\nquarantine_after = 3\n\
         [plugins.bad]\nconfig = { \"trap_section.b\" = \"1\" }\n\
         [plugins.good]\nconfig = { \"section.g\" = \"0|good\" }\n",
    );
    let id = d.session("default");
    for _ in 0..3 {
        assert_eq!(d.step(&id).0, 502);
    }
    let p = d.plugin("bad");
    assert_eq!(p["state"], "quarantined", "{p}");
    assert!(
        p["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("quarantined after 3 consecutive failed calls"),
        "{p}"
    );
    // Its contributions are gone: the next step works without it.
    let (status, v) = d.step(&id);
    assert_eq!(
        (status, v["request"]["system"].clone()),
        (200, json!("good"))
    );

    // An operator re-enables it: it serves (and fails) again.
    let v = d.ok("POST", "/v1/plugins/bad/enable", None);
    assert_eq!(v["applied"][0]["kind"], "load");
    assert_eq!(d.plugin("bad")["state"], "loaded");
    assert_eq!(d.step(&id).0, 502);

    for _ in 0..2 {
        d.step(&id);
    }
    assert_eq!(d.plugin("bad")["state"], "quarantined");
    // A changed file revives it too.
    let bytes = std::fs::read(folder.path().join("bad.wasm")).unwrap();
    common::put(
        folder.path(),
        "bad",
        &common::with_custom_section(&bytes, 1),
    );
    eventually("revived by a file change", || {
        d.plugin("bad")["state"] == "loaded"
    });
}

#[test]
fn a9_an_optional_plugin_failure_becomes_a_recorded_omission() {
    let folder = Folder::new().scripted("extra").scripted("good");
    let (d, _s) = folder.serve("[limits]\nquarantine_after = 0\n\
         [plugins.extra]\noptional = true\nconfig = { \"loop_section.slow\" = \"1\", \"tool.extra_tool\" = '{\"type\":\"object\"}' }\ntimeout_ms = 100\n\
         [plugins.good]\nconfig = { \"section.g\" = \"0|good\" }\n",
    );
    let id = d.session("default");
    for _ in 0..2 {
        let (status, v) = d.step(&id);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["request"]["system"], "good");
        assert_eq!(v["request"]["tools"], json!([]));
    }
    let v = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    let omissions: Vec<&Value> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "plugin/omitted")
        .collect();
    assert_eq!(omissions.len(), 2);
    assert_eq!(omissions[0]["body"]["plugin"], "extra");
    assert_eq!(omissions[0]["body"]["contribution"], "section `slow`");
    assert!(omissions[0]["body"]["cause"]
        .as_str()
        .unwrap()
        .contains("deadline exceeded"));
    assert_eq!(
        d.event_kinds(&id).iter().filter(|k| *k == "step").count(),
        2
    );
}

#[test]
fn l1_stdout_and_stderr_go_to_the_host_log_or_nowhere() {
    let folder = Folder::new().scripted("printer").scripted("quiet");
    let config = folder.config(
        "[plugins.printer]\nconfig = { \"print_section.p\" = \"0|hello from printer\" }\n\
         [plugins.quiet]\nstdio = \"none\"\nconfig = { \"print_section.q\" = \"1|hello from quiet\" }\n",
    );
    let (tmp, state) = state_dir();
    let log = tmp.path().join("daemon.log");
    let d = Served::start_logged(folder.path(), &config, &state, &log);
    let id = d.session("default");
    assert_eq!(d.step(&id).0, 200);
    d.stop();
    let log = std::fs::read_to_string(&log).unwrap();
    let line = |stream: &str| {
        log.lines()
            .find(|l| l.contains(&format!("hello from printer ({stream})")))
            .unwrap_or_else(|| panic!("no {stream} line in the log:\n{log}"))
            .to_string()
    };
    for stream in ["stdout", "stderr"] {
        let l = line(stream);
        assert!(
            l.contains("plugin=printer") && l.contains(&format!("stream=\"{stream}\"")),
            "{l}"
        );
    }
    assert!(
        !log.contains("hello from quiet"),
        "stdio = \"none\" discards output:\n{log}"
    );
}

/// K8: a plugin quarantined with `keep_tools = true` leaves the registry, but a warm session
/// keeps its tools and sections where they were (the same system prompt and tools as before,
/// no new header, the explain saying they are kept and why), while a new session goes
/// without them.
#[test]
fn k8_a_quarantined_plugin_with_keep_tools_keeps_its_slots_in_warm_sessions() {
    let folder = Folder::new().scripted("flaky").scripted("good");
    let (d, _s) = folder.serve(
        "[limits]\nquarantine_after = 1\n\
         [plugins.flaky]\nkeep_tools = true\n\
         config = { \"flaky_section.f\" = \"0\", \"tool.flaky_tool\" = '{\"type\":\"object\"}' }\n\
         [plugins.good]\nconfig = { \"section.g\" = \"1|good\" }\n",
    );
    let id = d.session("default");
    let (status, first) = d.step(&id);
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["request"]["system"], "flaky ok (call 1)\n\ngood");
    assert_eq!(d.step(&id).0, 502, "the second call traps");
    assert_eq!(d.plugin("flaky")["state"], "quarantined");

    let (status, kept) = d.step(&id);
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["request"]["system"], first["request"]["system"]);
    assert_eq!(kept["request"]["tools"], first["request"]["tools"]);
    let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    let headers = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "request/header")
        .count();
    assert_eq!(headers, 1, "no new header while the slots are kept");
    let n = kept["step"].as_u64().unwrap();
    let explain = d.ok("GET", &format!("/v1/sessions/{id}/steps/{n}/explain"), None);
    let said = explain["said"].to_string();
    assert!(
        said.contains("tool `flaky_tool` of plugin `flaky` kept (unavailable: quarantined after 1 consecutive failed calls"),
        "{said}"
    );

    let fresh = d.session("default");
    let (status, cold) = d.step(&fresh);
    assert_eq!(status, 200, "{cold}");
    assert_eq!(cold["request"]["system"], "good");
    assert!(
        cold["request"]["tools"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{cold}"
    );
}

/// K8: an optional plugin with `keep_tools` whose call fails is left out of the step (A9) but
/// keeps its slots in a warm session: the request is the step before's, no header is
/// recorded, the explain says why; once its calls succeed with the same text, nothing moved.
#[test]
fn k8_an_optional_plugin_that_fails_a_call_keeps_its_slots_with_keep_tools() {
    let folder = Folder::new().scripted("flaky").scripted("good");
    let (d, _s) = folder.serve(
        "[limits]\nquarantine_after = 0\n\
         [plugins.flaky]\noptional = true\nkeep_tools = true\n\
         config = { \"flaky_section.f\" = \"0\", \"tool.flaky_tool\" = '{\"type\":\"object\"}' }\n\
         [plugins.good]\nconfig = { \"section.g\" = \"1|good\" }\n",
    );
    let id = d.session("default");
    let mut requests = Vec::new();
    for _ in 0..3 {
        let (status, v) = d.step(&id);
        assert_eq!(status, 200, "{v}");
        requests.push(v["request"].clone());
    }
    // Step 2's call trapped (every second call of an instance does); step 3 ran on a fresh
    // instance, whose first call gives step 1's text again.
    assert_eq!(requests[0]["system"], "flaky ok (call 1)\n\ngood");
    for r in &requests[1..] {
        assert_eq!(r["system"], requests[0]["system"]);
        assert_eq!(r["tools"], requests[0]["tools"]);
    }
    let kinds = d.event_kinds(&id);
    assert_eq!(kinds.iter().filter(|k| *k == "request/header").count(), 1);
    assert_eq!(kinds.iter().filter(|k| *k == "plugin/omitted").count(), 1);
    let explain = d.ok("GET", &format!("/v1/sessions/{id}/steps/2/explain"), None);
    let said = explain["said"].to_string();
    assert!(
        said.contains(
            "tool `flaky_tool` of plugin `flaky` kept (unavailable: section `f` failed: "
        ),
        "{said}"
    );
}
