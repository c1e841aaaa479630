//! A whole agent loop against a running daemon, with a stub model:
//!
//! ```sh
//! cargo xtask run                       # terminal 1: the daemon on 127.0.0.1:8417
//! cargo run -p promptd --example agent_loop   # terminal 2
//! ```
//!
//! Each turn: send the step's new messages (user input or tool results) and facts, get the
//! frozen request, "call the model" with it, record the model's reply, run any tool it asked
//! for, and go round again until the model answers in text.

use serde_json::{json, Value};

/// A stand-in for a model: asks for `list_dir` once, then summarises the tool's output.
fn stub_model(request: &Value) -> Value {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last_tool = messages.iter().rev().find(|m| m["role"] == "tool");
    match last_tool {
        None => json!({"role": "assistant", "content": "Let me look.",
                       "tool_calls": [{"id": "call_1", "name": "list_dir", "arguments": {"path": "."}}]}),
        Some(result) => {
            let n = result["content"].as_str().unwrap_or("").lines().count();
            json!({"role": "assistant", "content": format!("This folder has {n} entries.")})
        }
    }
}

/// The one tool this example implements for real.
fn list_dir(path: &str) -> String {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.join("\n")
}

fn call(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let response = match body {
        None => agent.get(url).call(),
        Some(b) => agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(b.to_string()),
    };
    let mut response =
        response.map_err(|e| format!("{method} {url}: {e} (is `promptd serve` running?)"))?;
    let status = response.status();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{method} {url}: HTTP {status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

fn main() -> Result<(), String> {
    let base = std::env::var("PROMPTD_URL").unwrap_or_else(|_| "http://127.0.0.1:8417".into());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let cwd = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .display()
        .to_string();

    let session = call(
        &agent,
        "POST",
        &format!("{base}/v1/sessions"),
        Some(json!({"agent": "coder"})),
    )?;
    let id = session["id"].as_str().ok_or("no session id")?.to_string();
    println!("session {id}");

    let mut new_messages = vec![json!({"role": "user", "content": "What is in this folder?"})];
    for turn in 1..=5 {
        let step =
            json!({"messages": new_messages, "facts": {"cwd": cwd, "os": std::env::consts::OS}});
        let reply = call(
            &agent,
            "POST",
            &format!("{base}/v1/sessions/{id}/steps"),
            Some(step),
        )?;
        let request = &reply["request"];
        println!(
            "step {}: {} messages, {} tools, system prompt {} bytes",
            reply["step"],
            request["messages"].as_array().map_or(0, Vec::len),
            request["tools"].as_array().map_or(0, Vec::len),
            request["system"].as_str().map_or(0, str::len)
        );
        let answer = stub_model(request);
        call(
            &agent,
            "POST",
            &format!("{base}/v1/sessions/{id}/messages"),
            Some(answer.clone()),
        )?;
        let calls = answer["tool_calls"].as_array().cloned().unwrap_or_default();
        if calls.is_empty() {
            println!("model: {}", answer["content"].as_str().unwrap_or(""));
            println!("done after {turn} steps; the log: {base}/v1/sessions/{id}/events");
            return Ok(());
        }
        new_messages = calls
            .iter()
            .map(|c| {
                let path = c["arguments"]["path"].as_str().unwrap_or(".");
                println!("tool {} {path}", c["name"].as_str().unwrap_or("?"));
                json!({"role": "tool", "tool_call_id": c["id"], "content": list_dir(path)})
            })
            .collect();
    }
    Err("the model did not finish in 5 steps".into())
}
