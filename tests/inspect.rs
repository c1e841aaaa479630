//! End-to-end: provenance per step (Q15) and the prefix diff (Q16), against the real daemon
//! watching a real folder. Between steps a tool schema changes (its plugin's config), a section
//! changes (its plugin's file), only messages are added, and a plugin is swapped for a
//! byte-different file with an equal declaration; the test computes each shared prefix itself
//! from the rebuilt requests and checks the daemon's figure and cause against it.

use promptd_testkit as common;

use common::{eventually, fixture, put, Folder};
use serde_json::{json, Value};

fn config(schema: &str) -> String {
    format!(
        "[plugins.s]\nconfig = {{ \"section.persona\" = \"0|You are brief.\", \
         \"tool.bash\" = {schema:?} }}\n[model]\nmodel = \"gpt-test\"\n\
         [agents.coder.budget]\ntokenizer = \"o200k\"\n"
    )
}

/// The provider's reading order, computed here independently of the daemon: model, each tool,
/// the system prompt, each message; compact JSON, `cache_control` left out.
fn stream(body: &Value) -> String {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("cache_control");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut body = body.clone();
    strip(&mut body);
    let mut out = body["model"].to_string();
    for t in body["tools"].as_array().into_iter().flatten() {
        out.push_str(&t.to_string());
    }
    for m in body["messages"].as_array().into_iter().flatten() {
        out.push_str(&m.to_string());
    }
    out
}

fn shared(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// A copy of a component with a custom section appended: other bytes, the same plugin.
fn with_custom_section(bytes: &[u8]) -> Vec<u8> {
    let (name, payload) = (b"promptd-test", b"padding");
    let mut out = bytes.to_vec();
    out.push(0); // custom section id
    out.push((1 + name.len() + payload.len()) as u8);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(payload);
    out
}

#[test]
fn diff_names_each_cause_and_agrees_with_an_independent_prefix() {
    let folder = Folder::new().scripted("s").bytes(
        "versioned",
        &std::fs::read(fixture("versioned_v1")).unwrap(),
    );
    let (d, _state) = folder.serve(&config(r#"{"type":"object"}"#));
    let id = d.session("coder");
    let step = |text: &str| {
        let body = json!({"format": "openai", "messages": [{"role": "user", "content": text}]});
        d.ok("POST", &format!("/v1/sessions/{id}/steps"), Some(&body))["step"]
            .as_u64()
            .unwrap()
    };
    let sha = |plugin: &str| d.plugin(plugin)["sha256"].as_str().unwrap().to_string();
    let diff = |n: u64| {
        d.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/diff?format=openai"),
            None,
        )
    };
    let request = |n: u64| {
        d.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/request?format=openai"),
            None,
        )
    };
    let check_prefix = |n: u64, diff: &Value| {
        let (before, after) = (stream(&request(n - 1)), stream(&request(n)));
        assert_eq!(
            diff["previous"]["shared_bytes"].as_u64().unwrap() as usize,
            shared(&before, &after),
            "step {n}: {diff}"
        );
        assert_eq!(
            diff["bytes"].as_u64().unwrap() as usize,
            after.len(),
            "{diff}"
        );
        assert_eq!(
            diff["previous"]["prefix_kept"],
            after.starts_with(&before),
            "{diff}"
        );
    };

    assert_eq!(step("one"), 1);
    let first = diff(1);
    assert!(first["previous"].is_null(), "{first}");
    assert_eq!(
        first["breaks_cache"], false,
        "a first step breaks nothing: {first}"
    );

    // Only messages added.
    assert_eq!(step("two"), 2);
    let d2 = diff(2);
    check_prefix(2, &d2);
    assert_eq!(
        d2["causes"],
        json!(["only new messages: prefix kept"]),
        "{d2}"
    );
    assert_eq!(d2["breaks_cache"], false, "{d2}");

    // A tool schema changes: the plugin's config, the same file.
    std::fs::write(
        folder.path().join("promptd.toml"),
        format!(
            "plugin_dir = \".\"\n{}",
            config(r#"{"type":"object","required":["cmd"]}"#)
        ),
    )
    .unwrap();
    eventually("the new schema serves", || {
        d.ok("GET", "/v1/plugins", None)
            .to_string()
            .contains("required")
    });
    assert_eq!(step("three"), 3);
    let d3 = diff(3);
    check_prefix(3, &d3);
    assert_eq!(d3["previous"]["prefix_kept"], false, "{d3}");
    assert_eq!(d3["breaks_cache"], true, "{d3}");
    assert_eq!(
        d3["previous"]["first_divergence"]["part"], "tool `bash`",
        "{d3}"
    );
    let causes = d3["causes"].to_string();
    assert!(
        causes.contains("tool `bash` schema changed: plugin `s` (same file; its config changed)"),
        "the cause names the config, not a dynamic value: {causes}"
    );

    // A section changes with its plugin's file: the cause names both sha256s.
    let v1 = sha("versioned");
    put(
        folder.path(),
        "versioned",
        &std::fs::read(fixture("versioned_v2")).unwrap(),
    );
    eventually("v2 serves", || sha("versioned") != v1);
    let v2 = sha("versioned");
    assert_eq!(step("four"), 4);
    let d4 = diff(4);
    check_prefix(4, &d4);
    let causes = d4["causes"].to_string();
    assert!(
        causes.contains(&format!(
            "section `versioned` text changed: plugin `versioned` sha256 {}→{}",
            &v1[..8],
            &v2[..8]
        )),
        "{causes}"
    );
    assert!(
        causes.contains("tool `versioned_tool` description changed"),
        "{causes}"
    );

    // A byte-different file with an equal declaration: the prefix is kept, the swap is noted.
    let s1 = sha("s");
    put(
        folder.path(),
        "s",
        &with_custom_section(&std::fs::read(common::scripted()).unwrap()),
    );
    eventually("the padded copy serves", || sha("s") != s1);
    let s2 = sha("s");
    assert_eq!(step("five"), 5);
    let d5 = diff(5);
    check_prefix(5, &d5);
    assert_eq!(
        d5["causes"],
        json!(["only new messages: prefix kept"]),
        "{d5}"
    );
    assert!(
        d5["notes"].to_string().contains(&format!(
            "plugin `s` changed (sha256 {}→{})",
            &s1[..8],
            &s2[..8]
        )),
        "{d5}"
    );
    // The cached share counts tokens with the agent's tokenizer.
    let tokens = &d5["cached_share"]["tokens"];
    assert_eq!(tokens["tokenizer"], "o200k", "{d5}");
    assert!(tokens["shared"].as_u64().unwrap() < tokens["total"].as_u64().unwrap());

    // Provenance survives the change: step 4 names the old `s`, step 5 the new one, and
    // step 3 the old `versioned`.
    let explain = |n: u64| {
        d.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/explain?format=openai"),
            None,
        )
    };
    let e3 = explain(3);
    assert_eq!(
        e3["provenance"]["plugins"]["versioned"],
        v1.as_str(),
        "{e3}"
    );
    assert_eq!(explain(4)["provenance"]["plugins"]["s"], s1.as_str());
    let e5 = explain(5);
    assert_eq!(e5["provenance"]["plugins"]["s"], s2.as_str(), "{e5}");
    let tools = e5["provenance"]["tools"].as_array().unwrap();
    let bash = tools.iter().find(|t| t["name"] == "bash").unwrap();
    assert_eq!(
        (bash["plugin"].as_str(), bash["scope"].as_str()),
        (Some("s"), Some("global"))
    );
    assert_eq!(
        e5["request"],
        request(5),
        "explain shows the request as the step returned it"
    );

    // The session-wide figure, and the per-agent metric: steps 2 and 5 kept the prefix, 3
    // and 4 did not.
    let metrics = d.get("/metrics").1;
    assert!(
        metrics.contains("promptd_prefix_kept_steps_total{agent=\"coder\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("promptd_prefix_compared_steps_total{agent=\"coder\"} 4"),
        "{metrics}"
    );
    let out = common::promptd(&["session", "log", &id, "--server", &d.url]);
    let log = common::stdout(&out);
    assert!(log.contains("prefix kept: 2 of 4 steps (50%)"), "{log}");
    let out = common::promptd(&["session", "diff", &id, "3", "--server", &d.url]);
    let text = common::stdout(&out);
    assert!(text.contains("cause: tool `bash` schema changed"), "{text}");
    let out = common::promptd(&["session", "show", &id, "--server", &d.url]);
    let text = common::stdout(&out);
    assert!(
        text.contains("plugin versioned") && text.contains("\"messages\""),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "no colour when stdout is not a terminal"
    );

    // The session list finds it by agent.
    let list = d.ok("GET", "/v1/sessions?q=cod", None);
    let found = &list["sessions"][0];
    assert_eq!(
        (found["id"].as_str(), found["steps"].as_u64()),
        (Some(id.as_str()), Some(5))
    );
    assert!(d.ok("GET", "/v1/sessions?q=nobody", None)["sessions"]
        .as_array()
        .unwrap()
        .is_empty());
}
