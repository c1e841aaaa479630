//! A step's body in parts (contract Q21, issue 31): a client that keeps the body asks each step
//! for what changed since the step it holds; the parts joined are the body's bytes, and a
//! long session's step sends what it added, not its history. The real daemon over HTTP, the
//! bundled Rust plugins.

use promptd_testkit as common;

use common::daemon::{state_dir, Served};
use common::Folder;
use serde_json::{json, Value};

/// The body a client keeps, from the parts it is sent.
#[derive(Default)]
struct Kept {
    step: u64,
    open: String,
    close: String,
    items: Vec<String>,
}

impl Kept {
    fn apply(&mut self, parts: &Value, step: u64) {
        let since = parts["since"].as_u64().unwrap();
        let keep = parts["keep"].as_u64().unwrap() as usize;
        assert!(since == 0 || since == self.step, "{parts}");
        assert!(keep <= self.items.len(), "{parts}");
        self.items.truncate(keep);
        if let Some(open) = parts["open"].as_str() {
            self.open = open.to_string();
        }
        if let Some(close) = parts["close"].as_str() {
            self.close = close.to_string();
        }
        let items = parts["items"].as_array().unwrap();
        self.items
            .extend(items.iter().map(|i| i.as_str().unwrap().to_string()));
        self.step = step;
    }

    fn body(&self) -> String {
        format!("{}{}{}", self.open, self.items.join(","), self.close)
    }
}

fn step(d: &Served, id: &str, format: &str, since: u64, messages: &Value) -> (Value, usize) {
    let body = json!({"format": format, "since": since, "messages": messages,
                      "facts": {"cwd": "/src/app"}});
    let (status, text) = d.post(&format!("/v1/sessions/{id}/steps"), &body.to_string());
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert!(
        answer.get("request").is_none(),
        "parts instead of the body: {text}"
    );
    (answer, text.len())
}

fn rebuilt(d: &Served, id: &str, n: u64, format: &str) -> String {
    let (status, text) = d.get(&format!(
        "/v1/sessions/{id}/steps/{n}/request?format={format}"
    ));
    assert_eq!(status, 200, "{text}");
    text
}

/// Q21: in every format, over a growing session with tool rounds, a restart and a compaction,
/// the kept body is the rebuilt body's bytes at every step; once the session is long, a step
/// is sent what it added (the answer stays small while the body grows), and a restart or a
/// compaction starts the parts from nothing.
#[test]
fn q21_parts_since_the_held_step_join_to_the_bodys_bytes_and_stay_small() {
    let folder = Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace");
    let config = folder.config(
        "[model]\nmax_tokens = 512\n[model.openai]\nmodel = \"gpt-test\"\n\
         [model.openai-responses]\nmodel = \"gpt-test\"\n[model.anthropic]\nmodel = \"claude-test\"\n\
         [plugins.identity]\nconfig = { name = \"Ada\", model = \"example-model\" }\n",
    );
    let (_tmp, state) = state_dir();
    let mut d = Served::start(folder.path(), &config, &state);
    let big = "x".repeat(4_000);
    for format in ["neutral", "openai", "anthropic", "openai-responses"] {
        let id = d.session("default");
        let mut kept = Kept::default();
        let mut sizes = Vec::new();
        for turn in 0..24u64 {
            if turn == 12 {
                // A restart forgets what this daemon wrote: the parts start from nothing.
                d.stop();
                d = Served::start(folder.path(), &config, &state);
            }
            let call = format!("c{turn}");
            let (answer, _) = step(
                &d,
                &id,
                format,
                kept.step,
                &json!([{"role": "user", "content": format!("turn {turn}: read \"é\"")}]),
            );
            let n = answer["step"].as_u64().unwrap();
            let parts = &answer["parts"];
            assert_eq!(
                parts["since"].as_u64().unwrap() == 0,
                turn == 0 || turn == 12,
                "{format} turn {turn}: {parts}"
            );
            kept.apply(parts, n);
            assert_eq!(
                kept.body(),
                rebuilt(&d, &id, n, format),
                "{format} step {n}"
            );
            let reply = json!({"role": "assistant", "content": "",
                "tool_calls": [{"id": call, "name": "read_file", "arguments": {"path": "a"}}]});
            d.ok("POST", &format!("/v1/sessions/{id}/messages"), Some(&reply));
            let (answer, size) = step(
                &d,
                &id,
                format,
                kept.step,
                &json!([{"role": "tool", "tool_call_id": call, "content": big}]),
            );
            let n = answer["step"].as_u64().unwrap();
            kept.apply(&answer["parts"], n);
            assert_eq!(
                kept.body(),
                rebuilt(&d, &id, n, format),
                "{format} step {n}"
            );
            sizes.push((size, kept.body().len()));
            let done = json!({"role": "assistant", "content": format!("done {turn}")});
            d.ok("POST", &format!("/v1/sessions/{id}/messages"), Some(&done));
        }
        // The body grew past 24 × 4 kB; a late step's answer holds one tool result.
        let (answer, body) = sizes[23];
        assert!(body > 24 * 4_000, "{format}: {body}");
        assert!(
            answer < 4_000 * 2 + 2_000,
            "{format}: {answer} bytes for a {body}-byte body"
        );

        // A compaction trims the history: the next parts are whole, and still the body.
        let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
        let seqs: Vec<u64> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "user/message")
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        let compact = json!({"from": seqs[0], "to": seqs[3] - 1, "summary": "Earlier turns."});
        d.ok(
            "POST",
            &format!("/v1/sessions/{id}/compact"),
            Some(&compact),
        );
        let (answer, _) = step(
            &d,
            &id,
            format,
            kept.step,
            &json!([{"role": "user", "content": "on"}]),
        );
        let n = answer["step"].as_u64().unwrap();
        assert_eq!(answer["parts"]["since"], 0, "{format}");
        kept.apply(&answer["parts"], n);
        assert_eq!(
            kept.body(),
            rebuilt(&d, &id, n, format),
            "{format} step {n}"
        );
        assert!(kept.body().contains("Earlier turns."), "{format}");
    }
}

/// Q21: `since` is an integer; anything else is a 400 naming it, and nothing is recorded.
#[test]
fn q21_a_since_that_is_not_a_step_number_is_refused() {
    let folder = Folder::new().bundled("identity");
    let config = folder.config("");
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = d.session("default");
    for since in [json!(-1), json!("3"), json!(1.5)] {
        let body = json!({"since": since, "messages": [{"role": "user", "content": "hi"}]});
        let (status, text) = d.post(&format!("/v1/sessions/{id}/steps"), &body.to_string());
        assert_eq!(status, 400, "{since}: {text}");
        assert!(text.contains("since"), "{text}");
    }
    let events = d.ok("GET", &format!("/v1/sessions/{id}/events"), None);
    assert_eq!(events["events"].as_array().unwrap().len(), 1, "{events}");
}
