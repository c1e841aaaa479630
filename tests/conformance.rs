//! End-to-end: every body is one the providers accept (Q5, Q8). Inputs that would break a
//! provider's documented rules are refused with 422 and record nothing; replies are recorded
//! in the SDKs' own shapes and replay exactly; model settings are merged and checked; cache
//! breakpoints sit where they pay. The real daemon over HTTP, the `scripted` fixture built from
//! Rust source.

use promptd_testkit as common;

use common::daemon::{state_dir, Served};
use common::Folder;
use serde_json::{json, Value};

const PLUGIN: &str = "[plugins.s]\nconfig = { \"section.a\" = \"0|You are a test.\", \"tool.read\" = \"{\\\"type\\\":\\\"object\\\"}\", \"tool.write\" = \"{\\\"type\\\":\\\"object\\\"}\" }\n";
const MODEL: &str = "[model]\nmax_tokens = 512\n[model.openai]\nmodel = \"gpt-test\"\n\
                     [model.openai-responses]\nmodel = \"gpt-test\"\n[model.anthropic]\nmodel = \"claude-test\"\n";

fn serve(config: &str) -> (Served, tempfile::TempDir, Folder) {
    let folder = Folder::new().scripted("s");
    let (d, tmp) = folder.serve(config);
    (d, tmp, folder)
}

fn step(d: &Served, id: &str, format: &str, messages: &Value) -> (u16, Value) {
    let (status, text) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"format": format, "messages": messages, "facts": {"cwd": "/w"}}).to_string(),
    );
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn record(d: &Served, id: &str, reply: &Value) -> (u16, Value) {
    let (status, text) = d.post(&format!("/v1/sessions/{id}/messages"), &reply.to_string());
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn events(d: &Served, id: &str) -> Value {
    d.ok("GET", &format!("/v1/sessions/{id}/events"), None)["events"].clone()
}

/// The first message of `role` in a body's `messages`.
fn first<'a>(body: &'a Value, role: &str) -> &'a Value {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == role))
        .unwrap_or_else(|| panic!("no {role} message in {body}"))
}

fn call(id: &str) -> Value {
    json!({"id": id, "name": "read", "arguments": {}})
}

fn result(id: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": format!("result of {id}")})
}

/// Asserts a 422 with `code`, and that the session's log did not change.
fn refused(d: &Served, id: &str, code: &str, (status, body): (u16, Value)) {
    let before = events(d, id);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(events(d, id), before, "a refused input records nothing");
}

#[test]
fn q5_inputs_that_break_a_providers_rules_are_refused_and_record_nothing() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}"));
    let id = d.session("default");
    // The model's reply answers a request: none before the first step.
    let before = events(&d, &id);
    let (status, body) = record(&d, &id, &json!({"role": "assistant", "content": "hi"}));
    assert_eq!(
        (status, &body["error"]["code"]),
        (422, &json!("reply_before_step"))
    );
    assert_eq!(events(&d, &id), before);
    // Empty user text.
    let out = step(
        &d,
        &id,
        "openai",
        &json!([{"role": "user", "content": "  "}]),
    );
    refused(&d, &id, "empty_message", out);
    assert_eq!(
        step(
            &d,
            &id,
            "openai",
            &json!([{"role": "user", "content": "go"}])
        )
        .0,
        200
    );
    // An empty reply, and arguments that are not an object.
    let out = record(&d, &id, &json!({"role": "assistant", "content": ""}));
    refused(&d, &id, "empty_message", out);
    let out = record(
        &d,
        &id,
        &json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "name": "read", "arguments": "[1, 2]"}]}),
    );
    refused(&d, &id, "invalid_arguments", out);
    // Two calls are open.
    let reply = json!({"role": "assistant", "content": "", "tool_calls": [call("c1"), call("c2")]});
    assert_eq!(record(&d, &id, &reply).0, 201);
    let out = step(
        &d,
        &id,
        "openai",
        &json!([{"role": "user", "content": "and?"}]),
    );
    // The error body names the open calls in a field, not only in its message.
    assert_eq!(out.1["error"]["call_ids"], json!(["c1", "c2"]), "{}", out.1);
    refused(&d, &id, "open_tool_calls", out);
    let out = step(&d, &id, "openai", &json!([result("c1")]));
    assert_eq!(out.1["error"]["call_ids"], json!(["c2"]), "{}", out.1);
    refused(&d, &id, "open_tool_calls", out);
    let out = step(
        &d,
        &id,
        "anthropic",
        &json!([result("c1"), {"role": "user", "content": "also"}, result("c2")]),
    );
    refused(&d, &id, "tool_results_first", out);
    let out = step(&d, &id, "openai", &json!([result("c1"), result("c1")]));
    refused(&d, &id, "tool_call_answered", out);
    let out = record(&d, &id, &json!({"role": "assistant", "content": "done"}));
    refused(&d, &id, "open_tool_calls", out);
    // Both answered, results first: accepted, and the turn is valid in both formats.
    let (status, body) = step(
        &d,
        &id,
        "anthropic",
        &json!([result("c2"), result("c1"), {"role": "user", "content": "thanks"}]),
    );
    assert_eq!(status, 200, "{body}");
    let turns = body["request"]["messages"].as_array().unwrap();
    let last = turns.last().unwrap();
    let kinds: Vec<&str> = last["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["tool_result", "tool_result", "text"], "{last}");
    let out = step(&d, &id, "openai", &json!([result("c1")]));
    refused(&d, &id, "tool_call_answered", out);
}

#[test]
fn q5_a_string_of_arguments_is_kept_for_openai_and_an_object_for_anthropic() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}"));
    let id = d.session("default");
    step(
        &d,
        &id,
        "openai",
        &json!([{"role": "user", "content": "go"}]),
    );
    // As the OpenAI SDK returns it (model_dump).
    let reply = json!({"role": "assistant", "content": null, "refusal": null, "annotations": [],
        "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "read", "arguments": "{\"path\": \"a.txt\"}"}}]});
    assert_eq!(record(&d, &id, &reply).0, 201);
    let (status, openai) = step(&d, &id, "openai", &json!([result("call_1")]));
    assert_eq!(status, 200, "{openai}");
    let assistant = first(&openai["request"], "assistant");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"], "{\"path\": \"a.txt\"}",
        "sent back as the model wrote it: {assistant}"
    );
    assert!(assistant["content"].is_null(), "{assistant}");
    let n = openai["step"].as_u64().unwrap();
    let anthropic = d.ok(
        "GET",
        &format!("/v1/sessions/{id}/steps/{n}/request?format=anthropic"),
        None,
    );
    let tool_use = &first(&anthropic, "assistant")["content"][0];
    assert_eq!(tool_use["input"], json!({"path": "a.txt"}), "{anthropic}");
}

/// Anthropic `thinking` and `redacted_thinking` blocks, with their signatures, go back
/// unchanged, in their order, in every later step and in every rebuild.
#[test]
fn q4_thinking_blocks_round_trip_byte_exact() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}"));
    let id = d.session("default");
    step(
        &d,
        &id,
        "anthropic",
        &json!([{"role": "user", "content": "go"}]),
    );
    let blocks = json!([
        {"type": "thinking", "thinking": "The user wants \"a\"…\nLet me read it.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxQ+/Sig=="},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
        {"type": "text", "text": "Reading a.", "citations": null},
        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}}
    ]);
    // The whole Messages response object, as the SDK's model_dump() gives it.
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-test", "content": blocks, "stop_reason": "tool_use",
        "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 5}});
    assert_eq!(record(&d, &id, &message).0, 201);
    let expected = json!([
        blocks[0], blocks[1], {"type": "text", "text": "Reading a."}, blocks[3]
    ]);
    let (status, body) = step(&d, &id, "anthropic", &json!([result("toolu_1")]));
    assert_eq!(status, 200, "{body}");
    assert_eq!(first(&body["request"], "assistant")["content"], expected);
    let (_, later) = step(
        &d,
        &id,
        "anthropic",
        &json!([{"role": "user", "content": "ok"}]),
    );
    assert_eq!(first(&later["request"], "assistant")["content"], expected);
    for n in [2, 3] {
        let (status, text) = d.get(&format!(
            "/v1/sessions/{id}/steps/{n}/request?format=anthropic"
        ));
        assert_eq!(status, 200);
        let rebuilt: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            first(&rebuilt, "assistant")["content"],
            expected,
            "step {n}"
        );
    }
    let (_, text) = d.get(&format!(
        "/v1/sessions/{id}/steps/3/request?format=anthropic"
    ));
    let (_, raw) = d.post(
        &format!("/v1/sessions/{id}/steps"),
        &json!({"format": "anthropic", "messages": [{"role": "user", "content": "again"}]})
            .to_string(),
    );
    assert!(
        raw.contains(&serde_json::to_string(&expected[0]).unwrap()) && !text.is_empty(),
        "the thinking block's bytes are in the body"
    );
    // The OpenAI formats see the text and the call, not the thinking.
    let (_, openai) = step(
        &d,
        &id,
        "openai",
        &json!([{"role": "user", "content": "more"}]),
    );
    let assistant = first(&openai["request"], "assistant");
    assert_eq!(assistant["content"], "Reading a.", "{assistant}");
    assert!(!openai.to_string().contains("signature"), "{openai}");
}

/// Model settings: merged global → agent, per provider; a format whose required keys are
/// missing is refused at the step (422 `missing_model_setting`), never rendered.
#[test]
fn q8_model_settings_are_merged_per_provider_and_required_keys_checked() {
    let (d, _s, _f) = serve(&format!(
        "{PLUGIN}[model]\nmax_tokens = 100\n[model.openai]\nmodel = \"gpt\"\n\
         [agents.coder.model.openai]\nmodel = \"gpt-coder\"\n"
    ));
    let id = d.session("coder");
    let out = step(
        &d,
        &id,
        "anthropic",
        &json!([{"role": "user", "content": "go"}]),
    );
    refused(&d, &id, "missing_model_setting", out.clone());
    assert!(
        out.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`model`"),
        "{}",
        out.1
    );
    let (status, body) = step(
        &d,
        &id,
        "openai",
        &json!([{"role": "user", "content": "go"}]),
    );
    assert_eq!(status, 200, "{body}");
    let request = &body["request"];
    assert_eq!(request["model"], "gpt-coder");
    assert_eq!(
        request["max_tokens"], 100,
        "merged from [model], not replaced"
    );
    // K6: the agent's key by default.
    assert_eq!(request["prompt_cache_key"], "promptd-coder");
    // The Responses format: instructions, flat tools, input items.
    let (status, body) = step(
        &d,
        &id,
        "openai-responses",
        &json!([{"role": "user", "content": "again"}]),
    );
    assert_eq!(status, 200, "{body}");
    let r = &body["request"];
    assert_eq!(r["instructions"], "You are a test.");
    assert_eq!(
        r["model"], "gpt-coder",
        "Responses takes the openai table: {r}"
    );
    assert_eq!(r["max_output_tokens"], 100, "{r}");
    assert!(
        r.get("max_tokens").is_none(),
        "Responses refuses max_tokens: {r}"
    );
    assert_eq!(
        r["tools"][0],
        json!({"type": "function", "name": "read", "description": "The read tool.", "parameters": {"type": "object"}, "strict": false})
    );
    assert_eq!(
        r["input"][0],
        json!({"type": "message", "role": "user", "content": "go"})
    );
    assert!(r.get("messages").is_none(), "{r}");
}

/// Anthropic cache breakpoints: the last tool, the system block and the last block of the last
/// message; never more than four.
#[test]
fn q8_anthropic_breakpoints_sit_after_the_stable_prefix_and_on_the_last_message() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}"));
    let id = d.session("default");
    let (_, body) = step(
        &d,
        &id,
        "anthropic",
        &json!([{"role": "user", "content": "go"}]),
    );
    let r = &body["request"];
    let count = r.to_string().matches("cache_control").count();
    assert_eq!(count, 3, "{r}");
    assert!(r["tools"].as_array().unwrap().last().unwrap()["cache_control"].is_object());
    assert!(r["system"][0]["cache_control"].is_object());
    let last = r["messages"].as_array().unwrap().last().unwrap();
    let blocks = last["content"].as_array().unwrap();
    assert!(
        blocks.last().unwrap()["cache_control"].is_object(),
        "{last}"
    );
    assert_eq!(
        blocks
            .iter()
            .filter(|b| b.get("cache_control").is_some())
            .count(),
        1
    );
    // A client cannot add a fifth: a content block with a `cache_control` of its own is
    // refused, naming the field, and nothing is recorded.
    let before = d.event_kinds(&id).len();
    let (status, body) = step(
        &d,
        &id,
        "anthropic",
        &json!([{"role": "user", "content": [
            {"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]}]),
    );
    assert!(
        (400..500).contains(&status) && body.to_string().contains("cache_control"),
        "{status} {body}"
    );
    assert_eq!(d.event_kinds(&id).len(), before);
}

/// `tool_subset = "allowed_tools"`: toggling the bundled `tools` plugin's read-only mode for
/// ten steps keeps one header and byte-identical OpenAI tools; only `tool_choice` changes.
/// Anthropic, which has no such field, gets the shown tools as its array.
#[test]
fn a6_allowed_tools_keep_the_tool_array_and_one_header() {
    let folder = Folder::new().bundled("tools");
    let config = folder.config(&format!(
        "{MODEL}[agents.coder]\ntool_subset = \"allowed_tools\"\n"
    ));
    let (_tmp, state) = state_dir();
    let d = Served::start(folder.path(), &config, &state);
    let id = d.session("coder");
    let mut tools = Vec::new();
    let mut choices = Vec::new();
    for i in 0..10 {
        let read_only = if i % 2 == 0 { "true" } else { "false" };
        let (status, text) = d.post(
            &format!("/v1/sessions/{id}/steps"),
            &json!({"format": "openai", "facts": {"read_only": read_only},
                "messages": [{"role": "user", "content": format!("turn {i}")}]})
            .to_string(),
        );
        assert_eq!(status, 200, "{text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        tools.push(body["request"]["tools"].to_string());
        choices.push(body["request"]["tool_choice"].clone());
    }
    assert!(
        tools.iter().all(|t| *t == tools[0]),
        "the tools array never changes"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&tools[0])
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let names = |choice: &Value| -> Vec<String> {
        choice["allowed_tools"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(choices[0]["type"], "allowed_tools", "{}", choices[0]);
    assert_eq!(choices[0]["allowed_tools"]["mode"], "auto");
    assert_eq!(names(&choices[0]), ["list_dir", "read_file"]);
    assert_eq!(
        names(&choices[1]),
        ["bash", "list_dir", "read_file", "write_file"]
    );
    let headers = events(&d, &id)
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "request/header")
        .count();
    assert_eq!(headers, 1, "visibility alone records no new header");
    // Rebuilt in the other formats: Responses narrows the call too, Anthropic the array.
    let rebuilt = |n: u64, format: &str| {
        d.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/request?format={format}"),
            None,
        )
    };
    let responses = rebuilt(1, "openai-responses");
    assert_eq!(responses["tool_choice"]["type"], "allowed_tools");
    assert_eq!(
        responses["tool_choice"]["tools"][0],
        json!({"type": "function", "name": "list_dir"})
    );
    assert_eq!(responses["tools"].as_array().unwrap().len(), 4);
    assert_eq!(
        rebuilt(1, "anthropic")["tools"].as_array().unwrap().len(),
        2
    );
    assert_eq!(
        rebuilt(2, "anthropic")["tools"].as_array().unwrap().len(),
        4
    );
    assert_eq!(
        rebuilt(1, "openai")["tool_choice"],
        choices[0],
        "a rebuild is identical"
    );
}

/// A 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==";

/// Images and documents in a user turn and a screenshot in a tool result, in every format as
/// the providers document them; refused blocks are 422s that record nothing.
#[test]
fn q13_images_and_documents_render_in_every_format() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}[limits]\nmax_block_kb = 64\n"));
    let id = d.session("default");
    let user = json!({"role": "user", "content": [
        {"type": "text", "text": "What is on this?"},
        {"type": "image", "media_type": "image/png", "data": PNG},
        {"type": "image", "url": "https://example.com/a.jpg"},
        {"type": "document", "media_type": "application/pdf", "data": "JVBERi0xLjQK", "name": "spec.pdf"}]});
    let (status, body) = step(&d, &id, "anthropic", &json!([user]));
    assert_eq!(status, 200, "{body}");
    let blocks = &first(&body["request"], "user")["content"];
    assert_eq!(
        blocks[1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}})
    );
    assert_eq!(
        blocks[2],
        json!({"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}})
    );
    assert_eq!(blocks[3]["type"], "document");
    assert_eq!(blocks[3]["title"], "spec.pdf");
    assert_eq!(blocks[3]["source"]["media_type"], "application/pdf");
    assert_eq!(
        record(
            &d,
            &id,
            &json!({"role": "assistant", "content": "", "tool_calls": [call("s1")]})
        )
        .0,
        201
    );
    let shot = json!({"role": "tool", "tool_call_id": "s1", "content": [
        {"type": "text", "text": "the screen:"},
        {"type": "image", "media_type": "image/png", "data": PNG}]});
    let (status, body) = step(&d, &id, "openai", &json!([shot]));
    assert_eq!(status, 200, "{body}");
    let messages = body["request"]["messages"].as_array().unwrap();
    let user_parts = &first(&body["request"], "user")["content"];
    assert_eq!(
        user_parts[1],
        json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}")}})
    );
    assert_eq!(user_parts[3]["file"]["filename"], "spec.pdf");
    let tool_at = messages.iter().position(|m| m["role"] == "tool").unwrap();
    assert_eq!(
        messages[tool_at]["content"],
        json!([{"type": "text", "text": "the screen:"}])
    );
    let attached = &messages[tool_at + 1];
    assert_eq!(
        attached["role"], "user",
        "the screenshot follows the tool message"
    );
    assert_eq!(attached["content"][1]["type"], "image_url", "{attached}");
    let n = body["step"].as_u64().unwrap();
    let get = |format: &str| {
        d.ok(
            "GET",
            &format!("/v1/sessions/{id}/steps/{n}/request?format={format}"),
            None,
        )
    };
    let anthropic = get("anthropic");
    let result = anthropic["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    assert_eq!(result["content"][0]["type"], "tool_result");
    assert_eq!(
        result["content"][0]["content"][1]["type"], "image",
        "{result}"
    );
    let responses = get("openai-responses");
    let input = responses["input"].as_array().unwrap();
    assert_eq!(
        input[0]["content"][1],
        json!({"type": "input_image", "image_url": format!("data:image/png;base64,{PNG}"), "detail": "auto"})
    );
    assert_eq!(input[0]["content"][3]["type"], "input_file");
    let output = input
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .unwrap();
    assert_eq!(output["output"][1]["type"], "input_image", "{output}");
    let neutral = get("neutral");
    assert_eq!(
        first(&neutral, "user")["content"],
        user["content"],
        "stored as sent"
    );

    // Refused: a bad media type, a block over max_block_kb, bad base64, a document by URL in
    // Chat Completions.
    let image = |media: &str, data: &str| {
        json!([{"role": "user", "content": [
        {"type": "image", "media_type": media, "data": data}]}])
    };
    refused(
        &d,
        &id,
        "invalid_block",
        step(&d, &id, "anthropic", &image("image/bmp", PNG)),
    );
    let big = "A".repeat(70 << 10);
    let out = step(&d, &id, "anthropic", &image("image/png", &big));
    assert!(
        out.1.to_string().contains("limits.max_block_kb"),
        "{}",
        out.1
    );
    refused(&d, &id, "invalid_block", out);
    refused(
        &d,
        &id,
        "invalid_block",
        step(&d, &id, "anthropic", &image("image/png", "!!!")),
    );
    let url_doc =
        json!([{"role": "user", "content": [{"type": "document", "url": "https://x/s.pdf"}]}]);
    let out = step(&d, &id, "openai", &url_doc);
    assert!(
        out.1.to_string().contains("openai format cannot carry"),
        "{}",
        out.1
    );
    refused(&d, &id, "unsupported_block", out);
    assert_eq!(
        step(&d, &id, "anthropic", &url_doc).0,
        200,
        "Anthropic takes PDFs by URL"
    );
    refused(
        &d,
        &id,
        "unsupported_block",
        step(
            &d,
            &id,
            "openai",
            &json!([{"role": "user", "content": "more"}]),
        ),
    );
}

const GEMINI: &str = "[model.gemini]\nmodel = \"gemini-3-pro-preview\"\n\
                      [model.bedrock]\nmodel = \"anthropic.claude-sonnet-4-5-20250929-v1:0\"\n";

/// A Gemini response as google-genai's `GenerateContentResponse` dumps it: two calls without
/// ids, the first carrying a signature whose standard and URL-safe base64 differ.
fn gemini_calls(model: &str) -> Value {
    json!({
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": "Looking.", "thoughtSignature": "+/8AdGV4dA=="},
            {"functionCall": {"name": "read", "args": {"path": "a"}}, "thoughtSignature": "+/8Ac2lnLTE="},
            {"functionCall": {"name": "write", "args": {}}},
        ]}, "finishReason": "STOP", "index": 0}],
        "modelVersion": model,
        "usageMetadata": {"promptTokenCount": 5000, "cachedContentTokenCount": 4096,
            "candidatesTokenCount": 20, "totalTokenCount": 5020},
    })
}

/// Issue 33: the Gemini format sends a reply's parts back as recorded (thought signatures to
/// the byte), names calls that came without ids, answers them by name, and rebuilds exactly.
#[test]
fn q5_q8_gemini_replies_go_back_exactly_and_calls_without_ids_are_named() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}{GEMINI}"));
    let id = d.session("default");
    let (status, body) = step(
        &d,
        &id,
        "gemini",
        &json!([{"role": "user", "content": "go"}]),
    );
    assert_eq!(status, 200, "{body}");
    let request = &body["request"];
    assert_eq!(request["model"], "gemini-3-pro-preview");
    assert_eq!(request["config"]["maxOutputTokens"], 512);
    assert_eq!(
        request["config"]["systemInstruction"]["parts"][0]["text"]
            .as_str()
            .map(|s| s.contains("You are a test.")),
        Some(true),
        "{request}"
    );
    let names: Vec<&str> = request["config"]["tools"][0]["functionDeclarations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read", "write"]);
    assert_eq!(request["contents"][0]["role"], "user");

    let (status, recorded) = record(&d, &id, &gemini_calls("gemini-3-pro-preview"));
    assert_eq!(status, 201, "{recorded}");
    let seq = recorded["seq"].as_u64().unwrap();
    let ids: Vec<String> = recorded["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, [format!("call_{seq}_0"), format!("call_{seq}_1")]);
    let out = step(&d, &id, "gemini", &json!([result(&ids[0])]));
    refused(&d, &id, "open_tool_calls", out);
    let (status, body) = step(
        &d,
        &id,
        "gemini",
        &json!([result(&ids[0]), result(&ids[1])]),
    );
    assert_eq!(status, 200, "{body}");
    let contents = body["request"]["contents"].as_array().unwrap();
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": gemini_calls("x")["candidates"][0]["content"]["parts"]}),
        "the parts as recorded, signatures to the byte"
    );
    assert_eq!(
        contents[2]["parts"].as_array().unwrap()[..2],
        [
            json!({"functionResponse": {"name": "read", "response": {"output": format!("result of {}", ids[0])}}}),
            json!({"functionResponse": {"name": "write", "response": {"output": format!("result of {}", ids[1])}}}),
        ],
        "answered by name, without ids the model never gave"
    );
    let (status, text) = d.get(&format!("/v1/sessions/{id}/steps/2/request?format=gemini"));
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        body["request"],
        "step 2 rebuilds to what it returned"
    );
    // The usage went into the ledger in one shape.
    let usage = d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
    let reported = &usage["steps"][0]["actual"];
    assert_eq!(
        (&reported["input_tokens"], &reported["cached_tokens"]),
        (&json!(5000), &json!(4096)),
        "{usage}"
    );

    // The same history in Bedrock's shape: the calls by the names the daemon gave them.
    let (status, body) = step(
        &d,
        &id,
        "bedrock",
        &json!([{"role": "user", "content": "and?"}]),
    );
    assert_eq!(status, 200, "{body}");
    let request = &body["request"];
    assert_eq!(
        request["modelId"],
        "anthropic.claude-sonnet-4-5-20250929-v1:0"
    );
    assert_eq!(request["inferenceConfig"], json!({"maxTokens": 512}));
    assert_eq!(
        request["messages"][1]["content"][1]["toolUse"]["toolUseId"],
        ids[0].as_str()
    );
    assert_eq!(
        request.to_string().matches("\"cachePoint\"").count(),
        3,
        "after the system, the tools and the last turn: {request}"
    );
}

/// Issue 33: a Gemini signature does not carry to another model. After the agent's model
/// changes mid-session, the recorded calls go with the dummy signature Gemini documents for
/// calls it did not write, and without the other model's signatures.
#[test]
fn q8_a_gemini_model_change_mid_session_sends_no_signature_of_the_other_model() {
    let folder = Folder::new().scripted("s");
    let config = format!("{PLUGIN}{MODEL}{GEMINI}");
    let (d, _s) = folder.serve(&config);
    let id = d.session("default");
    assert_eq!(
        step(
            &d,
            &id,
            "gemini",
            &json!([{"role": "user", "content": "go"}])
        )
        .0,
        200
    );
    let (_, recorded) = record(&d, &id, &gemini_calls("gemini-3-pro-preview"));
    let ids: Vec<&str> = recorded["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    let results = json!([result(ids[0]), result(ids[1])]);
    let (status, same) = step(&d, &id, "gemini", &results);
    assert_eq!(status, 200, "{same}");
    assert!(same["request"].to_string().contains("+/8Ac2lnLTE="));
    folder.config(&config.replace("gemini-3-pro-preview", "gemini-3-flash-preview"));
    // The watcher applies the config: a probe session's step shows when it has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let probe = d.session("default");
        let go = json!([{"role": "user", "content": "probe"}]);
        let (_, body) = step(&d, &probe, "gemini", &go);
        if body["request"]["model"] == "gemini-3-flash-preview" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the config was not reloaded"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (status, other) = step(
        &d,
        &id,
        "gemini",
        &json!([{"role": "user", "content": "more"}]),
    );
    assert_eq!(status, 200, "{other}");
    let request = &other["request"];
    assert_eq!(
        request["model"], "gemini-3-flash-preview",
        "the config was reloaded"
    );
    assert_eq!(
        request["contents"][1]["parts"],
        json!([
            {"text": "Looking."},
            {"functionCall": {"name": "read", "args": {"path": "a"}},
             "thoughtSignature": "skip_thought_signature_validator"},
            {"functionCall": {"name": "write", "args": {}}},
        ])
    );
    // And every step still rebuilds to the bytes it returned.
    let (_, text) = d.get(&format!("/v1/sessions/{id}/steps/3/request?format=gemini"));
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        other["request"]
    );
    let (_, text) = d.get(&format!("/v1/sessions/{id}/steps/2/request?format=gemini"));
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        same["request"]
    );
}

/// Issue 33: Bedrock takes media as bytes (or S3), so an image or document by URL is refused
/// in its format before anything is recorded; a Converse reply keeps its reasoning block.
#[test]
fn q5_q8_bedrock_refuses_media_by_url_and_keeps_reasoning() {
    let (d, _s, _f) = serve(&format!("{PLUGIN}{MODEL}{GEMINI}"));
    let id = d.session("default");
    let url = json!([{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image", "url": "https://x/a.png"}]}]);
    let out = step(&d, &id, "bedrock", &url);
    assert!(
        out.1.to_string().contains("bedrock format cannot carry"),
        "{}",
        out.1
    );
    refused(&d, &id, "unsupported_block", out);
    assert_eq!(
        step(&d, &id, "gemini", &url).0,
        200,
        "Gemini takes a file by URL"
    );
    // That session cannot go on in Bedrock's format now; a new one records a Converse reply.
    let id = d.session("default");
    let go = json!([{"role": "user", "content": "go"}]);
    assert_eq!(step(&d, &id, "bedrock", &go).0, 200);
    let converse = json!({
        "ResponseMetadata": {"HTTPStatusCode": 200},
        "output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "Let me read.", "signature": "c2ln"}}},
            {"toolUse": {"toolUseId": "tooluse_1", "name": "read", "input": {"path": "a"}}},
        ]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 1015,
            "cacheReadInputTokens": 1000, "cacheWriteInputTokens": 0},
        "metrics": {"latencyMs": 9},
    });
    let (status, recorded) = record(&d, &id, &converse);
    assert_eq!(status, 201, "{recorded}");
    assert_eq!(recorded["tool_calls"][0]["id"], "tooluse_1");
    let (status, body) = step(&d, &id, "bedrock", &json!([result("tooluse_1")]));
    assert_eq!(status, 200, "{body}");
    let messages = body["request"]["messages"].as_array().unwrap();
    assert_eq!(
        messages[1]["content"], converse["output"]["message"]["content"],
        "the reply's blocks as they came"
    );
    assert_eq!(
        messages[2]["content"][0],
        json!({"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "result of tooluse_1"}]}})
    );
    // Explained, diffed and replayed in Bedrock's format like the others.
    for what in ["explain", "diff"] {
        let (status, text) = d.get(&format!("/v1/sessions/{id}/steps/2/{what}?format=bedrock"));
        assert_eq!(status, 200, "{what}: {text}");
    }
    let replay = d.ok(
        "POST",
        "/v1/replay",
        Some(&json!({"sessions": [id], "format": "bedrock"})),
    );
    assert!(replay.to_string().contains(&id), "{replay}");
    let usage = d.ok("GET", &format!("/v1/sessions/{id}/usage"), None);
    let reported = &usage["steps"][0]["actual"];
    assert_eq!(
        reported["input_tokens"], 1010,
        "Bedrock's input leaves out the cache: {usage}"
    );
    assert_eq!(reported["cached_tokens"], 1000, "{usage}");
}

/// Issue 33: `[model.openai] dialect` adjusts the Chat Completions body to the server's docs:
/// no `prompt_cache_key`, no `allowed_tools`; a PDF, which only OpenAI takes as a `file` part,
/// is refused before anything is recorded; an unknown dialect does not load.
#[test]
fn q8_a_dialect_of_chat_completions_sends_what_its_server_takes() {
    let config = format!(
        "{PLUGIN}[model]\nmax_tokens = 64\n[model.openai]\nmodel = \"qwen\"\ndialect = \"ollama\"\n"
    );
    let (d, _s, _f) = serve(&config);
    let id = d.session("default");
    let (status, body) = step(
        &d,
        &id,
        "openai",
        &json!([{"role": "user", "content": "go"}]),
    );
    assert_eq!(status, 200, "{body}");
    let request = &body["request"];
    assert_eq!(request["model"], "qwen");
    assert!(request.get("dialect").is_none(), "{request}");
    assert!(request.get("prompt_cache_key").is_none(), "{request}");
    let pdf = json!([{"role": "user", "content": [
        {"type": "document", "media_type": "application/pdf", "data": "JVBERi0xLjQK", "name": "a.pdf"}]}]);
    let out = step(&d, &id, "openai", &pdf);
    assert!(out.1.to_string().contains("`ollama` dialect"), "{}", out.1);
    refused(&d, &id, "unsupported_block", out);
    assert_eq!(
        step(&d, &id, "anthropic", &pdf).0,
        422,
        "no anthropic model configured"
    );

    let folder = Folder::new().scripted("s");
    let path = folder.config(&config.replace("ollama", "tgi"));
    let line = folder.assemble_fails(&path, &[], "config_invalid");
    assert!(line.contains("unknown dialect `tgi`"), "{line}");
}

/// Issue 33: Gemini's function names start with a letter or an underscore; promptd's may start
/// with a digit, so such a tool is refused in the Gemini format (422 `unsupported_tool`, naming
/// it and the rule), before anything is recorded, and taken by the others.
#[test]
fn q8_gemini_refuses_a_tool_whose_name_it_would_refuse() {
    let plugin = "[plugins.s]\nconfig = { \"section.a\" = \"0|You are a test.\", \"tool.9lives\" = \"{\\\"type\\\":\\\"object\\\"}\" }\n";
    let (d, _s, _f) = serve(&format!("{plugin}{MODEL}{GEMINI}"));
    let id = d.session("default");
    let go = json!([{"role": "user", "content": "go"}]);
    let out = step(&d, &id, "gemini", &go);
    assert!(out.1.to_string().contains("tool `9lives`"), "{}", out.1);
    refused(&d, &id, "unsupported_tool", out);
    assert_eq!(step(&d, &id, "bedrock", &go).0, 200);
}
