//! Gemini through the gateway: the path, the splice (G4), the conversation read (G3) and the
//! streamed reply folded (G5).

use serde_json::{json, Value};

use super::body::ClientBody;
use super::gemini::{GeminiPath, UNNAMED_CALL};
use super::messages::{conversation, step_messages, Held};
use super::splice::{self, ClientSystem, Contributions, Part, Splice, SpliceSettings};
use super::stream::{Frames, Reassembly};
use super::Ingress;
use crate::conversation::Message;

const SIG: &str = r#"CiQB0e2Kb\u002b9x/+Ab=="#;

fn client(system: &str, tools: &str, last: &str) -> String {
    format!(
        r#"{{"contents": [{{"role":"user","parts":[{{"text":"hi \u00e9"}}]}},{{"role":"model","parts":[{{"functionCall":{{"name":"get_time","args":{{"tz":"UTC"}}}},"thoughtSignature":"{SIG}"}}]}},{last}]{system}{tools}, "generationConfig":{{"temperature":1.50E+0}}}}"#
    )
}

const ANSWER: &str = r#"{"role":"user","parts":[{"functionResponse":{"name":"get_time","response":{"output":"12:00"}}}]}"#;

fn spliced(client: &str, c: &Contributions, s: &SpliceSettings) -> (Splice, String) {
    let body = ClientBody::parse(client.as_bytes()).unwrap();
    let plan = splice::plan(Ingress::GenerateContent, &body, c, s).unwrap();
    let out = String::from_utf8(plan.apply(client.as_bytes())).unwrap();
    serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (plan, out)
}

fn added(system: &str, context: Option<&str>) -> Contributions {
    Contributions {
        system: system.into(),
        runtime_context: context.map(str::to_string),
        tools: Vec::new(),
    }
}

/// The client's bytes back from the upstream body, every insertion taken out.
fn without_insertions(plan: &Splice, upstream: &str) -> String {
    let mut out = String::new();
    let (mut at, mut client_at) = (0, 0);
    for edit in &plan.edits {
        assert_eq!(edit.remove, 0, "an insertion only: {edit:?}");
        let len = edit.at - client_at;
        out.push_str(&upstream[at..at + len]);
        at += len + edit.insert.len();
        client_at = edit.at;
    }
    out.push_str(&upstream[at..]);
    out
}

#[test]
fn g1_gemini_paths_name_the_model_and_the_method() {
    let p = GeminiPath::parse("/v1beta/models/gemini-3-flash:streamGenerateContent").unwrap();
    assert_eq!(p.model, "gemini-3-flash");
    assert_eq!(p.version, "v1beta");
    assert_eq!(p.ingress, Ingress::StreamGenerateContent);
    let p = GeminiPath::parse("/v1/models/gemini-2.5-pro:generateContent").unwrap();
    assert_eq!(
        (p.version.as_str(), p.ingress),
        ("v1", Ingress::GenerateContent)
    );
    for bad in [
        "/v1beta/models/m:countTokens",
        "/v2/models/m:generateContent",
        "/v1beta/models/:generateContent",
        "/v1beta/tunedModels/m:generateContent",
        "/v1beta/models/a/b:generateContent",
        "/v1/chat/completions",
    ] {
        assert_eq!(GeminiPath::parse(bad), None, "{bad}");
    }
    assert!(Ingress::GenerateContent.format() == crate::formats::Format::Gemini);
    assert!(Ingress::StreamGenerateContent.streams() && !Ingress::GenerateContent.streams());
}

#[test]
fn g4_gemini_sections_make_a_system_instruction_and_every_other_byte_is_the_clients() {
    let body = client("", "", ANSWER);
    let (plan, out) = spliced(&body, &added("SECTIONS", Some("CTX")), &Default::default());
    assert_eq!(without_insertions(&plan, &out), body);
    assert!(out.starts_with(r#"{"systemInstruction":{"parts":[{"text":"SECTIONS"}]},"contents""#));
    // The thought signature and the number spelling go as the client wrote them.
    assert!(out.contains(&format!(r#""thoughtSignature":"{SIG}""#)));
    assert!(out.contains("1.50E+0"));
    let v: Value = serde_json::from_str(&out).unwrap();
    // The runtime context closes the last user content, after its function response.
    assert_eq!(v["contents"][2]["parts"][1], json!({"text": "CTX"}));
    let parts: Vec<Part> = plan.edits.iter().map(|e| e.part).collect();
    assert_eq!(parts, [Part::Sections, Part::RuntimeContext]);
}

#[test]
fn g4_gemini_sections_join_the_clients_system_instruction_in_the_order_client_system_says() {
    let own = r#","systemInstruction":{"role":"system","parts":[{"text":"Be brief."}]}"#;
    let body = client(own, "", ANSWER);
    let (plan, out) = spliced(&body, &added("SECTIONS", None), &Default::default());
    assert_eq!(without_insertions(&plan, &out), body);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["systemInstruction"],
        json!({"role":"system","parts":[{"text":"SECTIONS"},{"text":"Be brief."}]})
    );
    let first = SpliceSettings {
        client_system: ClientSystem::First,
        ..Default::default()
    };
    let (_, out) = spliced(&body, &added("SECTIONS", None), &first);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["systemInstruction"]["parts"],
        json!([{"text":"Be brief."},{"text":"SECTIONS"}])
    );
    // The proto spelling is the same field: joined, not doubled.
    let snake = client(r#","system_instruction":{"parts":[]}"#, "", ANSWER);
    let (_, out) = spliced(&snake, &added("S", None), &Default::default());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["system_instruction"], json!({"parts":[{"text":"S"}]}));
    assert!(v.get("systemInstruction").is_none());
    // A string is not a Content: refused, naming the field.
    let bad = client(r#","systemInstruction":"Be brief.""#, "", ANSWER);
    let parsed = ClientBody::parse(bad.as_bytes()).unwrap();
    let e = splice::plan(
        Ingress::GenerateContent,
        &parsed,
        &added("S", None),
        &Default::default(),
    )
    .unwrap_err();
    assert_eq!(e.code(), "invalid_body");
    assert!(e.to_string().contains("systemInstruction"), "{e}");
}

#[test]
fn g4_gemini_runtime_context_is_left_out_after_a_model_content() {
    let model_last = r#"{"role":"model","parts":[{"text":"It is"}]}"#;
    let body = client("", "", &format!("{ANSWER},{model_last}"));
    let (plan, out) = spliced(&body, &added("", Some("CTX")), &Default::default());
    assert_eq!(out, body);
    assert_eq!(
        plan.skipped,
        ["runtime context: the last content is not the user's"]
    );
}

#[test]
fn g4_gemini_deny_tools_takes_declarations_out_and_defer_tools_is_skipped() {
    let tools = r#","tools":[{"functionDeclarations":[{"name":"get_time","parameters":{}},{"name":"shell"}]},{"function_declarations":[{"name":"rm"}]},{"googleSearch":{}}]"#;
    let body = client("", tools, ANSWER);
    let settings = SpliceSettings {
        deny_tools: vec!["shell".into(), "rm".into()],
        defer_tools: vec!["get_time".into(), "rm".into()],
        ..Default::default()
    };
    let (plan, out) = spliced(&body, &added("", None), &settings);
    let v: Value = serde_json::from_str(&out).unwrap();
    // A tool left with no declaration goes whole; another tool's kind stays.
    assert_eq!(
        v["tools"],
        json!([{"functionDeclarations":[{"name":"get_time","parameters":{}}]},{"googleSearch":{}}])
    );
    assert_eq!(plan.denied, ["shell", "rm"]);
    assert!(plan.deferred.is_empty());
    assert_eq!(
        plan.skipped,
        ["defer_tools: Gemini has no deferred loading, so these stay loaded: get_time"]
    );
    let parsed = ClientBody::parse(body.as_bytes()).unwrap();
    assert_eq!(
        splice::tool_names(Ingress::GenerateContent, &parsed),
        ["get_time", "shell", "rm"]
    );
}

#[test]
fn g3_gemini_contents_read_as_messages_and_an_unnamed_call_is_answered_by_its_logged_name() {
    let body = client("", "", ANSWER);
    let parsed = ClientBody::parse(body.as_bytes()).unwrap();
    let read = conversation(Ingress::GenerateContent, &parsed);
    assert_eq!(read.messages.len(), 3);
    let Message::Assistant { tool_calls, .. } = &read.messages[1] else {
        panic!("{:?}", read.messages[1])
    };
    assert_eq!(
        (tool_calls[0].name.as_str(), tool_calls[0].id.as_str()),
        ("get_time", "")
    );
    let Message::Tool { tool_call_id, .. } = &read.messages[2] else {
        panic!("{:?}", read.messages[2])
    };
    assert_eq!(tool_call_id, &format!("{UNNAMED_CALL}0"));
    // The session's last reply, at seq 7, named the call `call_7_0`: the result answers it.
    let open = |id: &str| id == "call_7_0";
    let held = Held {
        last: Some((1, read.digest(1))),
        call_open: &open,
        reply_seq: Some(7),
    };
    let joined = step_messages(&held, &read);
    let Some(Message::Tool { tool_call_id, .. }) = joined.messages.first() else {
        panic!("{joined:?}")
    };
    assert_eq!(tool_call_id, "call_7_0");
    // A call that carried its id is answered by it.
    let with_id = body.replace(
        r#""name":"get_time","args""#,
        r#""id":"c1","name":"get_time","args""#,
    );
    let parsed = ClientBody::parse(with_id.as_bytes()).unwrap();
    let read = conversation(Ingress::GenerateContent, &parsed);
    assert!(
        matches!(&read.messages[2], Message::Tool { tool_call_id, .. } if tool_call_id == "c1")
    );
}

fn sse(chunks: &[Value]) -> Vec<u8> {
    chunks
        .iter()
        .flat_map(|c| format!("data: {c}\r\n\r\n").into_bytes())
        .collect()
}

#[test]
fn g5_gemini_chunks_fold_per_candidate_and_usage_is_the_last_chunks() {
    let usage = |p: u64, c: u64| json!({"promptTokenCount": p, "cachedContentTokenCount": 4, "candidatesTokenCount": c, "totalTokenCount": p + c});
    let chunks = [
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":"Let me"}]},"index":0}],"usageMetadata":usage(10, 1),"modelVersion":"gemini-3-flash","responseId":"r1"}),
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":" check.","thoughtSignature":"U0lH"}]},"index":0}],"usageMetadata":usage(10, 3)}),
        json!({"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_time","args":{"tz":"UTC"}}}]},"index":0}],"usageMetadata":usage(10, 9)}),
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"usageMetadata":usage(10, 12)}),
    ];
    let bytes = sse(&chunks);
    let mut frames = Frames::default();
    let mut folded = Reassembly::new(Ingress::StreamGenerateContent);
    // Cut anywhere: frames are whole once their blank line came.
    for piece in bytes.chunks(7) {
        for frame in frames.push(piece).unwrap() {
            folded.push(&frame);
        }
    }
    let out = folded.finish();
    assert!(out.complete, "a finishReason ends the stream");
    assert_eq!(
        out.reply["candidates"][0]["content"]["parts"],
        json!([{"text":"Let me check.","thoughtSignature":"U0lH"},{"functionCall":{"name":"get_time","args":{"tz":"UTC"}}},{"text":""}])
    );
    assert_eq!(out.reply["candidates"][0]["finishReason"], "STOP");
    // Cumulative: the last chunk's totals, never their sum.
    assert_eq!(out.reply["usageMetadata"], usage(10, 12));
    assert_eq!(out.reply["responseId"], "r1");
    // Read back as the reply it stands for, with its usage.
    let (reply, usage) = crate::formats::replies::reply_with_usage(out.reply.clone()).unwrap();
    assert!(
        matches!(&reply, Message::Assistant { content, tool_calls, .. }
        if content == "Let me check." && tool_calls.len() == 1)
    );
    let usage = usage.unwrap();
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (Some(10), Some(12))
    );
    assert_eq!(usage.cached_tokens, Some(4));
}

#[test]
fn g5_gemini_a_stream_without_a_finish_reason_or_with_an_error_is_not_complete() {
    let chunk =
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":"Hal"}]},"index":0}]});
    let mut frames = Frames::default();
    let mut folded = Reassembly::new(Ingress::StreamGenerateContent);
    for frame in frames.push(&sse(std::slice::from_ref(&chunk))).unwrap() {
        folded.push(&frame);
    }
    let out = folded.finish();
    assert!(!out.complete);
    assert_eq!(
        out.reply["candidates"][0]["content"]["parts"][0]["text"],
        "Hal"
    );
    let error =
        json!({"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}});
    let mut folded = Reassembly::new(Ingress::StreamGenerateContent);
    for frame in Frames::default().push(&sse(&[chunk, error])).unwrap() {
        folded.push(&frame);
    }
    let out = folded.finish();
    assert_eq!(out.error.as_deref(), Some("The model is overloaded."));
    assert!(!out.complete);
}
