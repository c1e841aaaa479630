//! End-to-end: the context window as a budget (Q14). Every step is measured and the
//! measurement comes back beside the request and in the step's log event; a request over the
//! agent's window is `context_overflow`, recording nothing; tool results follow the agent's
//! template. The real daemon over HTTP with the `scripted` fixture.

use promptd_testkit as common;

use common::daemon::Served;
use common::Folder;
use serde_json::{json, Value};

/// The provider formats need model settings.
const MODEL: &str = "[model]\nmodel = \"m\"\nmax_tokens = 100\n";

fn serve(folder: &Folder, config: &str) -> (Served, tempfile::TempDir) {
    folder.serve(&format!("{MODEL}{config}"))
}

fn step(d: &Served, id: &str, body: &Value) -> (u16, Value) {
    let (status, text) = d.post(&format!("/v1/sessions/{id}/steps"), &body.to_string());
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn events(d: &Served, id: &str) -> Vec<Value> {
    d.ok("GET", &format!("/v1/sessions/{id}/events"), None)["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn q14_every_step_is_measured_beside_the_request_and_in_the_log() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.persona\" = \"0|You are brief.\", \
         \"context.cwd\" = \"0|cwd: /w\", \"tool.read\" = \"{\\\"type\\\":\\\"object\\\"}\" }\n\
         [agents.coder.budget]\nwindow = 100000\nreserve = 1000\ntokenizer = \"o200k\"\n",
    );
    let id = d.session("coder");
    let (status, body) = step(
        &d,
        &id,
        &json!({"format": "openai", "messages": [{"role": "user", "content": "日本語で答えて 🙂"}]}),
    );
    assert_eq!(status, 200, "{body}");
    let usage = &body["usage"];
    assert_eq!(usage["tokenizer"], "o200k");
    assert_eq!(
        (usage["window"].as_u64(), usage["reserve"].as_u64()),
        (Some(100000), Some(1000))
    );
    assert_eq!(usage["system"]["chars"], "You are brief.".chars().count());
    assert_eq!(usage["sections"][0]["name"], "persona");
    assert_eq!(usage["contexts"][0]["name"], "cwd");
    assert!(usage["tools"]["tokens"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(
        usage["message_count"], 2,
        "the user message and the snapshot: {usage}"
    );
    let total = usage["total"]["tokens"].as_u64().unwrap();
    let parts = ["tools", "system", "messages"]
        .iter()
        .map(|p| usage[p]["tokens"].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(total, parts);
    let marker = events(&d, &id)
        .into_iter()
        .rev()
        .find(|e| e["kind"] == "step")
        .unwrap();
    assert_eq!(&marker["body"]["usage"], usage, "recorded with the step");
    // Without a budget, steps are measured in chars and never refused.
    let other = d.session("default");
    let (_, body) = step(
        &d,
        &other,
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(body["usage"]["tokenizer"], "chars");
    assert!(body["usage"].get("window").is_none(), "{}", body["usage"]);
}

#[test]
fn q14_a_request_over_the_window_is_context_overflow_and_records_nothing() {
    let folder = Folder::new().scripted("s");
    let long = "word ".repeat(400);
    let (d, _s) = serve(
        &folder,
        &format!(
            "[plugins.s]\nconfig = {{ \"section.persona\" = \"0|{long}\" }}\n\
             [agents.small.budget]\nwindow = 500\n\
             [agents.tight.budget]\nwindow = 5000\nreserve = 2900\n"
        ),
    );
    let id = d.session("small");
    let before = events(&d, &id);
    let (status, body) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "go"}]}),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "context_overflow");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("fixed part alone") && message.contains("system 2000"),
        "{message}"
    );
    assert_eq!(events(&d, &id), before, "nothing recorded");
    // A session whose request fits steps until its messages make it too big.
    let id = d.session("tight");
    let (status, body) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "go"}]}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "x".repeat(200)}]}),
    );
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("the request ("));
    let (status, _) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "ok"}]}),
    );
    assert_eq!(status, 200, "the next valid step works");
}

#[test]
fn q14_tool_results_follow_the_agents_template_and_empty_ones_say_so() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n\
         [agents.coder]\ntool_result_template = \"<observation>{observation}</observation>\"\n\
         empty_tool_result = \"(nothing)\"\n",
    );
    let id = d.session("coder");
    step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "go"}]}),
    );
    let reply = json!({"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "name": "t", "arguments": {}}, {"id": "b", "name": "t", "arguments": {}}]});
    let (status, _) = d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string());
    assert_eq!(status, 201);
    let (status, body) = step(
        &d,
        &id,
        &json!({"messages": [
            {"role": "tool", "tool_call_id": "a", "content": "file list"},
            {"role": "tool", "tool_call_id": "b", "content": ""}]}),
    );
    assert_eq!(status, 200, "{body}");
    let tools: Vec<&Value> = body["request"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tools[0]["content"], "<observation>file list</observation>");
    assert_eq!(tools[1]["content"], "<observation>(nothing)</observation>");
    // The default for an agent without settings: empty output is said, not sent empty.
    let id = d.session("default");
    step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "go"}]}),
    );
    let reply =
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "t"}]});
    d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string());
    let (_, body) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "tool", "tool_call_id": "c", "content": ""}]}),
    );
    let last = body["request"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    assert_eq!(last["content"], "(no output)");
}

/// A plugin whose every contribution is empty changes no byte of the request.
#[test]
fn q14_an_empty_plugin_is_the_same_as_no_plugin() {
    let config = "[plugins.s]\nconfig = { \"section.a\" = \"0|Hello\", \"context.c\" = \"0|cwd\" }\n\
                  [plugins.empty]\nconfig = { \"section.e\" = \"5|\", \"context.e\" = \"5|\", \"dynamic_section.d\" = \"6|\" }\n";
    let bodies: Vec<String> = [true, false]
        .into_iter()
        .map(|with_empty| {
            let mut folder = Folder::new().scripted("s");
            if with_empty {
                folder = folder.scripted("empty");
            }
            let (d, _s) = serve(&folder, config);
            let id = d.session("default");
            let (status, body) = step(
                &d,
                &id,
                &json!({"format": "anthropic", "messages": [{"role": "user", "content": "go"}]}),
            );
            assert_eq!(status, 200, "{body}");
            body["request"].to_string()
        })
        .collect();
    assert_eq!(bodies[0], bodies[1]);
}

/// `promptd assemble --budget` prints the same measurement for one assembly.
#[test]
fn q14_assemble_prints_the_budget_of_one_assembly() {
    let folder = Folder::new().scripted("s");
    let config = folder.config(&format!(
        "{MODEL}[plugins.s]\nconfig = {{ \"section.a\" = \"0|You are brief.\" }}\n\
         [agents.coder.budget]\nwindow = 2000\ntokenizer = \"cl100k\"\n"
    ));
    let out = folder.assemble(&config, &["--agent", "coder", "--budget"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["usage"]["tokenizer"], "cl100k", "{out}");
    assert_eq!(v["usage"]["window"], 2000);
    assert_eq!(v["usage"]["sections"][0]["name"], "a");
    assert!(v["usage"]["system"]["tokens"].as_u64().unwrap() > 0);
}

/// A 200-step session with large tool results under a small window: every request fits, the
/// goal and the latest turns stay, no tool call is ever without its result (or a result
/// without its call), every past step rebuilds byte-identically, and the log's
/// `history/dropped` events say exactly what disappeared.
#[test]
fn q14_a_long_session_is_trimmed_by_the_policy_and_rebuilds_exactly() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.a\" = \"0|You are brief.\", \"tool.read\" = \"{\\\"type\\\":\\\"object\\\"}\" }\n\
         [agents.coder.budget]\nwindow = 6000\nreserve = 500\nkeep_turns = 2\n",
    );
    let id = d.session("coder");
    let result = "r".repeat(600);
    let mut bodies: Vec<(u64, String)> = Vec::new();
    let mut post = |d: &Served, messages: Value| -> Value {
        let (status, text) = d.post(
            &format!("/v1/sessions/{id}/steps"),
            &json!({"format": "openai", "messages": messages}).to_string(),
        );
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        bodies.push((v["step"].as_u64().unwrap(), v["request"].to_string()));
        v
    };
    for turn in 0..100 {
        let v = post(
            &d,
            json!([{"role": "user", "content": format!("goal {turn}")}]),
        );
        let usage = &v["usage"];
        assert!(
            usage["total"]["tokens"].as_u64().unwrap() + 500 <= 6000,
            "step {}: {usage}",
            v["step"]
        );
        let call = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": format!("c{turn}"), "name": "read", "arguments": {}}]});
        assert_eq!(
            d.post(&format!("/v1/sessions/{id}/messages"), &call.to_string())
                .0,
            201
        );
        let v = post(
            &d,
            json!([{"role": "tool", "tool_call_id": format!("c{turn}"), "content": result}]),
        );
        assert!(v["usage"]["total"]["tokens"].as_u64().unwrap() + 500 <= 6000);
        let reply = json!({"role": "assistant", "content": format!("done {turn}")});
        assert_eq!(
            d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string())
                .0,
            201
        );
        // Within the last request: the goal, the latest two turns, and whole tool pairs.
        let request = &v["request"];
        let messages = request["messages"].as_array().unwrap();
        let texts: Vec<&str> = messages
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect();
        assert!(
            texts.contains(&"goal 0"),
            "the goal is kept at step {}",
            v["step"]
        );
        assert!(texts.contains(&format!("goal {turn}").as_str()));
        if turn > 0 {
            assert!(
                texts.contains(&format!("goal {}", turn - 1).as_str()),
                "turn {turn}"
            );
        }
        for (i, m) in messages.iter().enumerate() {
            if m["role"] == "tool" {
                let prev = &messages[i - 1];
                assert!(
                    prev["role"] == "assistant" && prev["tool_calls"][0]["id"] == m["tool_call_id"],
                    "a tool result right after its call: {m}"
                );
            }
            if m["tool_calls"].is_array() {
                assert_eq!(
                    messages[i + 1]["role"],
                    "tool",
                    "a call with its result: {m}"
                );
            }
        }
    }
    assert_eq!(bodies.len(), 200);
    // Every past step rebuilds to the bytes it returned.
    for (n, body) in &bodies {
        let (status, text) = d.get(&format!(
            "/v1/sessions/{id}/steps/{n}/request?format=openai"
        ));
        assert_eq!(status, 200);
        assert_eq!(&text, body, "step {n}");
    }
    // What the log says was dropped is exactly what the last request lacks.
    let events = events(&d, &id);
    let dropped: std::collections::BTreeSet<u64> = events
        .iter()
        .filter(|e| e["kind"] == "history/dropped")
        .flat_map(|e| {
            e["body"]["seqs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap())
        })
        .collect();
    assert!(!dropped.is_empty(), "the window forced trimming");
    let message_events = events
        .iter()
        .filter(|e| {
            [
                "user/message",
                "assistant/message",
                "tool/result",
                "context/snapshot",
            ]
            .contains(&e["kind"].as_str().unwrap())
        })
        .count();
    let last: Value = serde_json::from_str(&bodies.last().unwrap().1).unwrap();
    let shown = last["messages"].as_array().unwrap().len() - 1; // less the system message
    assert_eq!(
        shown,
        message_events - 1 - dropped.len(),
        "the last reply came after the last step"
    );
}

/// Compaction: a summary replaces a range in every later request; the events stay and past
/// steps rebuild unchanged; a range that splits a tool call from its results is refused.
#[test]
fn q14_a_summary_replaces_a_range_and_never_splits_a_tool_pair() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n",
    );
    let id = d.session("default");
    let seq_of = |kind: &str, nth: usize| -> u64 {
        events(&d, &id)
            .iter()
            .filter(|e| e["kind"] == kind)
            .nth(nth)
            .unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    let (_, first) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "first question"}]}),
    );
    let call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "t", "arguments": {}}]});
    d.post(&format!("/v1/sessions/{id}/messages"), &call.to_string());
    step(
        &d,
        &id,
        &json!({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "long output"}]}),
    );
    d.post(
        &format!("/v1/sessions/{id}/messages"),
        &json!({"role": "assistant", "content": "first answer"}).to_string(),
    );
    let (_, before) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "second question"}]}),
    );
    let compact = |from: u64, to: u64| {
        let (status, text) = d.post(
            &format!("/v1/sessions/{id}/compact"),
            &json!({"from": from, "to": to, "summary": "Earlier: one question, one tool call, one answer."}).to_string(),
        );
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
        )
    };
    // Splits: ending at the call (its result is outside), or starting at the result.
    let call_seq = seq_of("assistant/message", 0);
    let result_seq = seq_of("tool/result", 0);
    let log_before = events(&d, &id);
    let (status, body) = compact(seq_of("user/message", 0), call_seq);
    assert_eq!(
        (status, &body["error"]["code"]),
        (422, &json!("invalid_compaction")),
        "{body}"
    );
    let (status, _) = compact(result_seq, seq_of("assistant/message", 1));
    assert_eq!(status, 422);
    assert_eq!(
        events(&d, &id),
        log_before,
        "a refused compaction records nothing"
    );
    // The whole first exchange: the question, the call, its result and the answer.
    let (status, body) = compact(seq_of("user/message", 0), seq_of("assistant/message", 1));
    assert_eq!(status, 201, "{body}");
    let (_, after) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "third"}]}),
    );
    let texts: Vec<String> = after["request"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert!(texts[0].contains("Earlier: one question"), "{texts:?}");
    assert!(
        !texts
            .iter()
            .any(|t| t.contains("first question") || t.contains("long output")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains("second question")));
    // Past steps rebuild as they were.
    for (n, body) in [(1, &first), (3, &before)] {
        let rebuilt = d.ok("GET", &format!("/v1/sessions/{id}/steps/{n}/request"), None);
        assert_eq!(&rebuilt, &body["request"], "step {n}");
    }
    let n = after["step"].as_u64().unwrap();
    let rebuilt = d.ok("GET", &format!("/v1/sessions/{id}/steps/{n}/request"), None);
    assert_eq!(rebuilt, after["request"]);
}

/// Q14 (issue 26): the active runtime context snapshot survives a compaction as it survives
/// trimming. A range that holds it keeps it in place after the summary (the event names it in
/// `kept`), so the next step with the same facts still carries the runtime context, and the
/// usage counts exactly the messages sent. A range of the snapshot alone is refused.
#[test]
fn q14_a_compaction_keeps_the_active_snapshot() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.a\" = \"0|A\", \"fact_context.cwd\" = \"0\" }\n",
    );
    let id = d.session("default");
    let facts = json!({"cwd": "/work"});
    let user =
        |text: &str| json!({"messages": [{"role": "user", "content": text}], "facts": facts});
    let reply = |text: &str| {
        let (status, body) = d.post(
            &format!("/v1/sessions/{id}/messages"),
            &json!({"role": "assistant", "content": text}).to_string(),
        );
        assert_eq!(status, 201, "{body}");
    };
    step(&d, &id, &user("first"));
    reply("ok");
    step(&d, &id, &user("second"));
    reply("ok 2");
    let log = events(&d, &id);
    let seq_of = |kind: &str, nth: usize| -> u64 {
        log.iter().filter(|e| e["kind"] == kind).nth(nth).unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    let snapshot = seq_of("context/snapshot", 0);
    assert_eq!(
        log.iter()
            .filter(|e| e["kind"] == "context/snapshot")
            .count(),
        1,
        "the same facts give one snapshot"
    );
    let compact = |from: u64, to: u64| {
        d.post(
            &format!("/v1/sessions/{id}/compact"),
            &json!({"from": from, "to": to, "summary": "Earlier: a first question."}).to_string(),
        )
    };
    // The snapshot alone: nothing would be replaced.
    let (status, body) = compact(snapshot, snapshot);
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("invalid_compaction") && body.contains("snapshot"),
        "{body}"
    );
    // "first", the snapshot, its header and marker, and "ok".
    let (from, to) = (seq_of("user/message", 0), seq_of("assistant/message", 0));
    assert!(from < snapshot && snapshot < to);
    let (status, body) = compact(from, to);
    assert_eq!(status, 201, "{body}");
    let compacted = events(&d, &id)
        .into_iter()
        .find(|e| e["kind"] == "history/compacted")
        .unwrap();
    assert_eq!(compacted["body"]["kept"], json!([snapshot]), "{compacted}");

    let (status, after) = step(&d, &id, &user("third"));
    assert_eq!(status, 200, "{after}");
    let messages = after["request"]["messages"].as_array().unwrap();
    let texts: Vec<&str> = messages
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(texts.len(), 5, "{texts:?}");
    assert_eq!(texts[0], "Earlier: a first question.");
    assert!(
        texts[1].contains("/work") && messages[1]["snapshot"] == json!(true),
        "the runtime context is still sent: {texts:?}"
    );
    assert_eq!(&texts[2..], ["second", "ok 2", "third"]);
    assert_eq!(
        after["usage"]["message_count"].as_u64(),
        Some(messages.len() as u64),
        "the usage counts what is sent: {}",
        after["usage"]
    );
    // What was sent rebuilds from the log alone.
    let n = after["step"].as_u64().unwrap();
    let rebuilt = d.ok("GET", &format!("/v1/sessions/{id}/steps/{n}/request"), None);
    assert_eq!(rebuilt, after["request"]);
}

/// The provider's usage, attached to a recorded reply in its own shape, is stored and
/// reported per session against promptd's estimate, with the cached share.
#[test]
fn q14_provider_usage_is_compared_with_the_estimate() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.a\" = \"0|You are brief.\" }\n",
    );
    let id = d.session("default");
    let (_, first) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "hello"}]}),
    );
    let estimate = first["usage"]["total"]["tokens"].as_u64().unwrap();
    // A whole Chat Completion, as the OpenAI SDK returns it.
    let completion = json!({"id": "x", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hi", "refusal": null}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22,
            "prompt_tokens_details": {"cached_tokens": 16}}});
    let (status, text) = d.post(
        &format!("/v1/sessions/{id}/messages"),
        &completion.to_string(),
    );
    assert_eq!(status, 201, "{text}");
    step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "again"}]}),
    );
    // An Anthropic message: its input_tokens leave out the cache.
    let message = json!({"type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "hello again"}],
        "usage": {"input_tokens": 4, "output_tokens": 3,
            "cache_read_input_tokens": 20, "cache_creation_input_tokens": 6}});
    assert_eq!(
        d.post(&format!("/v1/sessions/{id}/messages"), &message.to_string())
            .0,
        201
    );
    let report = d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
    assert_eq!(report["steps"][0]["estimate"], estimate);
    assert_eq!(report["steps"][0]["actual"]["input_tokens"], 20);
    assert_eq!(report["steps"][0]["actual"]["cached_tokens"], 16);
    assert_eq!(report["steps"][1]["actual"]["input_tokens"], 30);
    let totals = &report["totals"];
    assert_eq!(totals["compared_steps"], 2);
    assert_eq!(totals["actual"], 50);
    assert_eq!(totals["cached"], 36);
    assert!(
        (totals["cached_share"].as_f64().unwrap() - 0.72).abs() < 1e-9,
        "{totals}"
    );
    // The reply itself is recorded without the usage in the request.
    let (_, third) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "3"}]}),
    );
    assert!(!third["request"].to_string().contains("cached_tokens"));
}

/// Caps below the window: `history_max` trims the messages to it, `context_max` refuses a
/// runtime context over it, naming the contexts.
#[test]
fn q14_history_and_context_caps_hold() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        "[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n\
         [agents.hist.budget]\nhistory_max = 400\nkeep_turns = 1\n",
    );
    let id = d.session("hist");
    for i in 0..20 {
        let text = format!("message {i} {}", "x".repeat(40));
        let (status, body) = step(
            &d,
            &id,
            &json!({"messages": [{"role": "user", "content": text}]}),
        );
        assert_eq!(status, 200, "{body}");
        let tokens = body["usage"]["messages"]["tokens"].as_u64().unwrap();
        assert!(tokens <= 400, "{}", body["usage"]);
    }
    assert!(events(&d, &id)
        .iter()
        .any(|e| e["kind"] == "history/dropped"));

    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(
        &folder,
        &format!(
            "[plugins.s]\nconfig = {{ \"section.a\" = \"0|A\", \"context.big\" = \"0|{}\" }}\n\
             [agents.ctx.budget]\ncontext_max = 100\n",
            "c".repeat(300)
        ),
    );
    let id = d.session("ctx");
    let before = events(&d, &id);
    let (status, body) = step(
        &d,
        &id,
        &json!({"messages": [{"role": "user", "content": "go"}]}),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "context_overflow");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("budget.context_max") && message.contains("big 300"),
        "{message}"
    );
    assert_eq!(events(&d, &id), before);
    let other = d.session("default");
    assert_eq!(
        step(&d, &other, &json!({})).0,
        200,
        "agents without the cap are served"
    );
}
