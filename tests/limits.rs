//! End-to-end: nothing a plugin or a client sends grows without a bound.
//! Hostile components (the `scripted` fixture, built from Rust source, and WAT) in the real
//! daemon; each test names the limit it checks.

mod common;

use std::time::{Duration, Instant};

use common::daemon::{state_dir, Served};
use common::Folder;
use serde_json::{json, Value};

fn serve(folder: &Folder, config: &str) -> (Served, tempfile::TempDir) {
    let config = folder.config(config);
    let (tmp, state) = state_dir();
    (Served::start(folder.path(), &config, &state), tmp)
}

/// Checks on a step's input are linear in the input plus the session's cached state: 10,000
/// tool results after a 10,000-message step used to cost ~25 s of CPU (each result scanned
/// the whole log).
#[test]
fn q5_ten_thousand_tool_results_are_checked_in_linear_time() {
    let folder = Folder::new().scripted("s");
    let (d, _s) = serve(&folder, "[plugins.s]\nconfig = { \"section.a\" = \"0|A\" }\n");
    let id = d.session("default");
    let n = 10_000;
    let users: Vec<Value> = (0..n)
        .map(|i| json!({"role": "user", "content": format!("message {i}")}))
        .collect();
    let started = Instant::now();
    let (status, body) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": users}).to_string(),
    );
    assert_eq!(status, 200, "{}", &body[..body.len().min(400)]);
    let first = started.elapsed();

    let calls: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("call_{i}"), "name": "t", "arguments": {}}))
        .collect();
    let reply = json!({"role": "assistant", "content": "", "tool_calls": calls});
    let started = Instant::now();
    let (status, body) = d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string());
    assert_eq!(status, 201, "{body}");
    let record = started.elapsed();

    let results: Vec<Value> = (0..n)
        .rev()
        .map(|i| json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "ok"}))
        .collect();
    let started = Instant::now();
    let (status, body) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": results}).to_string(),
    );
    let second = started.elapsed();
    assert_eq!(status, 200, "{}", &body[..body.len().min(400)]);
    eprintln!("10,000 user messages: {first:?}; 10,000 tool calls: {record:?}; 10,000 results: {second:?}");
    // Generous for a shared 2-core machine; the measured figure is in the note.
    assert!(
        second < Duration::from_secs(5),
        "10,000 tool results took {second:?}"
    );

    // A result for a call nobody made is still refused, by name.
    let (status, body) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "?"}]})
            .to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("unknown_tool_call") && body.contains("call_x"),
        "{body}"
    );
}
