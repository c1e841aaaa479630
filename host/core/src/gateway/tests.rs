use proptest::prelude::*;
use serde_json::{json, Value};

use super::body::ClientBody;
use super::splice::{self, ClientSystem, Contributions, Part, Splice, SpliceSettings};
use super::stream::{unasked_usage, Frames, Reassembly};
use super::Ingress;

fn added(system: &str, context: Option<&str>) -> Contributions {
    Contributions {
        system: system.into(),
        runtime_context: context.map(str::to_string),
        tools: Vec::new(),
    }
}

fn spliced(
    ingress: Ingress,
    client: &str,
    c: &Contributions,
    s: &SpliceSettings,
) -> (Splice, String) {
    let body = ClientBody::parse(client.as_bytes()).unwrap();
    let plan = splice::plan(ingress, &body, c, s).unwrap();
    let out = String::from_utf8(plan.apply(client.as_bytes())).unwrap();
    serde_json::from_str::<serde::de::IgnoredAny>(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (plan, out)
}

/// The client's bytes, got back from the upstream body by taking out every insertion: the
/// splice changes nothing of the client's body but where it adds (G4).
fn without_insertions(plan: &Splice, upstream: &str) -> String {
    let mut out = String::new();
    let mut at = 0; // in the upstream body
    let mut client_at = 0;
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

const ODD: &str = r#""x-unknown":{"n":1.50E+2,"big":123456789012345678901234567890,"s":"\u00e9\ud83d\ude00"},"prompt_cache_key":"k","store":false"#;

#[test]
fn g4_messages_sections_join_a_string_system_and_every_other_byte_is_the_clients() {
    let client = format!(
        r#"{{ "model" : "claude", {ODD}, "system":"Be brief.","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let (plan, out) = spliced(
        Ingress::Messages,
        &client,
        &added("SECTIONS", Some("CTX")),
        &SpliceSettings::default(),
    );
    assert_eq!(without_insertions(&plan, &out), client);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["system"][0]["text"], "SECTIONS");
    assert_eq!(
        v["system"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    assert_eq!(v["system"][1], json!({"type": "text", "text": "Be brief."}));
    assert_eq!(
        v["messages"][0]["content"],
        json!([{"type":"text","text":"hi"},{"type":"text","text":"CTX"}])
    );
    assert!(plan.breakpoint_added);
    assert!(plan.edits.iter().any(|e| e.part == Part::RuntimeContext));
}

#[test]
fn g4_messages_client_system_first_puts_the_sections_after_its_blocks() {
    let client = r#"{"system":[{"type":"text","text":"A"},{"type":"text","text":"B","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":[{"type":"text","text":"q","cache_control":{"type":"ephemeral"}}]}]}"#;
    let settings = SpliceSettings {
        client_system: ClientSystem::First,
        ..SpliceSettings::default()
    };
    let (plan, out) = spliced(Ingress::Messages, client, &added("S", Some("C")), &settings);
    assert_eq!(without_insertions(&plan, &out), client);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["system"][2],
        json!({"type":"text","text":"S"}),
        "the client set one in its system: none added"
    );
    assert_eq!(plan.client_breakpoints, 2);
    assert!(!plan.breakpoint_added);
    // The runtime context goes after the client's last breakpoint, which keeps its TTL.
    assert_eq!(
        v["messages"][0]["content"][1],
        json!({"type":"text","text":"C"})
    );
    assert_eq!(v["system"][1]["cache_control"]["ttl"], "1h");
}

#[test]
fn g4_messages_never_passes_four_breakpoints_and_matches_a_later_hour_ttl() {
    let mark = r#","cache_control":{"type":"ephemeral","ttl":"1h"}"#;
    let tools: Vec<String> = (0..3)
        .map(|i| format!(r#"{{"name":"t{i}","input_schema":{{}}{mark}}}"#))
        .collect();
    let four = format!(
        r#"{{"tools":[{}],"messages":[{{"role":"user","content":[{{"type":"text","text":"q"{mark}}}]}}]}}"#,
        tools.join(",")
    );
    let (plan, out) = spliced(
        Ingress::Messages,
        &four,
        &added("S", None),
        &SpliceSettings::default(),
    );
    assert_eq!(plan.client_breakpoints, 4);
    assert!(!plan.breakpoint_added);
    assert_eq!(out.matches("cache_control").count(), 4);
    let three = four.replacen(mark, "", 1);
    let (plan, out) = spliced(
        Ingress::Messages,
        &three,
        &added("S", None),
        &SpliceSettings::default(),
    );
    assert!(plan.breakpoint_added);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["system"][0]["cache_control"]["ttl"], "1h");
}

#[test]
fn g4_messages_leaves_a_prefill_alone_and_says_so() {
    let client =
        r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"{"}]}"#;
    let (plan, out) = spliced(
        Ingress::Messages,
        client,
        &added("", Some("C")),
        &SpliceSettings::default(),
    );
    assert_eq!(out, client);
    assert_eq!(plan.skipped.len(), 1);
}

#[test]
fn g4_chat_sections_first_context_last_and_usage_asked_for_a_stream() {
    let client = format!(
        r#"{{"model":"gpt",{ODD},"messages":[{{"role":"developer","content":"D"}},{{"role":"user","content":"q"}}],"stream":true}}"#
    );
    let (plan, out) = spliced(
        Ingress::ChatCompletions,
        &client,
        &added("S", Some("C")),
        &SpliceSettings::default(),
    );
    assert_eq!(without_insertions(&plan, &out), client);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["messages"][0], json!({"role":"system","content":"S"}));
    assert_eq!(v["messages"][3], json!({"role":"user","content":"C"}));
    assert_eq!(v["stream_options"], json!({"include_usage": true}));
    assert!(plan.usage_added);

    let first = SpliceSettings {
        client_system: ClientSystem::First,
        ..SpliceSettings::default()
    };
    let (_, out) = spliced(Ingress::ChatCompletions, &client, &added("S", None), &first);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["messages"][1], json!({"role":"system","content":"S"}));
}

#[test]
fn g5_a_client_that_asked_for_usage_keeps_its_stream_options_extras() {
    let client =
        r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true,"x-extra":[1]}}"#;
    let (plan, out) = spliced(
        Ingress::ChatCompletions,
        client,
        &added("", None),
        &SpliceSettings::default(),
    );
    assert_eq!(out, client);
    assert!(!plan.usage_added);
    let client = r#"{"messages":[],"stream":true,"stream_options":{"x-extra":[1]}}"#;
    let (plan, out) = spliced(
        Ingress::ChatCompletions,
        client,
        &added("", None),
        &SpliceSettings::default(),
    );
    assert!(plan.usage_added);
    assert_eq!(without_insertions(&plan, &out), client);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["stream_options"],
        json!({"include_usage":true,"x-extra":[1]})
    );
}

#[test]
fn g4_responses_sections_join_instructions_and_context_follows_the_input() {
    let client = r#"{"model":"gpt","instructions":"Be \"brief\".","input":"hello","previous_response_id":"resp_1"}"#;
    let (plan, out) = spliced(
        Ingress::Responses,
        client,
        &added("S\n1", Some("C")),
        &SpliceSettings::default(),
    );
    assert_eq!(without_insertions(&plan, &out), client);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["instructions"], "S\n1\n\nBe \"brief\".");
    assert_eq!(
        v["input"],
        json!([{"role":"user","content":"hello"},{"role":"user","content":"C"}])
    );
    let client = r#"{"input":[{"role":"user","content":"q"}]}"#;
    let (_, out) = spliced(
        Ingress::Responses,
        client,
        &added("S", Some("C")),
        &SpliceSettings::default(),
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["instructions"], "S");
    assert_eq!(v["input"][1], json!({"role":"user","content":"C"}));
}

#[test]
fn g2_a_body_that_is_no_object_or_repeats_a_key_is_refused_by_name() {
    for (body, says) in [
        (&b"[1]"[..], "not a JSON object"),
        (b"{\"a\":1,\"a\":2}", "`a` twice"),
        (b"{\"messages\":", "not a JSON object"),
        (b"\xff", "not UTF-8"),
    ] {
        let e = ClientBody::parse(body).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(says), "{body:?}: {e}");
    }
    let body = ClientBody::parse(br#"{"messages":{}}"#).unwrap();
    let e = splice::plan(
        Ingress::Messages,
        &body,
        &added("S", None),
        &SpliceSettings::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("`messages` must be an array"), "{e}");
}

fn frames(text: &str) -> Vec<super::stream::Frame> {
    let mut f = Frames::default();
    // Byte by byte: a frame is whole only at its blank line, wherever the reads cut it.
    text.as_bytes()
        .iter()
        .flat_map(|b| f.push(&[*b]).unwrap())
        .collect()
}

#[test]
fn g5_chat_tool_call_fragments_by_index_and_usage_from_the_last_chunk() {
    let stream = [
        json!({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}),
        json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":""}}]}}],"usage":null}),
        json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"ls","arguments":"{\"p\":"}}]}}],"usage":null}),
        json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"f\":1}"}}]}}],"usage":null}),
        json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"2}"}}]}}],"usage":null}),
        json!({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":null}),
        json!({"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}),
    ];
    let mut text: String = stream.iter().map(|c| format!("data: {c}\n\n")).collect();
    text.push_str("data: [DONE]\n\n");
    let frames = frames(&text);
    let mut r = Reassembly::new(Ingress::ChatCompletions);
    frames.iter().for_each(|f| r.push(f));
    let out = r.finish();
    assert!(out.complete);
    let message = &out.reply["choices"][0]["message"];
    assert_eq!(message["tool_calls"][0]["id"], "call_a");
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        "{\"f\":1}"
    );
    assert_eq!(
        message["tool_calls"][1]["function"]["arguments"],
        "{\"p\":2}"
    );
    assert_eq!(out.reply["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(out.reply["usage"]["total_tokens"], 12);
    // The parser that reads unstreamed replies reads it.
    let (m, usage) = crate::formats::replies::reply_with_usage(out.reply.clone()).unwrap();
    assert!(
        matches!(m, crate::conversation::Message::Assistant { ref tool_calls, .. } if tool_calls.len() == 2)
    );
    assert!(usage.is_some());

    // A client that did not ask: the usage chunk goes, `usage: null` is cut from the others,
    // every other byte as the upstream sent it.
    let seen: Vec<Vec<u8>> = frames.iter().filter_map(unasked_usage).collect();
    assert_eq!(seen.len(), frames.len() - 1);
    let first = String::from_utf8(seen[0].clone()).unwrap();
    assert_eq!(
        first,
        format!(
            "data: {}\n\n",
            stream[0].to_string().replace(",\"usage\":null", "")
        )
    );
    assert_eq!(seen.last().unwrap(), b"data: [DONE]\n\n");
}

#[test]
fn g5_anthropic_usage_is_assigned_never_added() {
    let events = [
        (
            "message_start",
            json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"usage":{"input_tokens":10,"cache_read_input_tokens":1000,"cache_creation_input_tokens":0,"output_tokens":1}}}),
        ),
        (
            "content_block_start",
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        ),
        (
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}),
        ),
        ("ping", json!({"type":"ping"})),
        (
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}),
        ),
        (
            "content_block_stop",
            json!({"type":"content_block_stop","index":0}),
        ),
        (
            "content_block_start",
            json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"tu_1","name":"Read","input":{}}}),
        ),
        (
            "content_block_delta",
            json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\":"}}),
        ),
        (
            "content_block_delta",
            json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"a.txt\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type":"content_block_stop","index":1}),
        ),
        (
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}),
        ),
        (
            "message_delta",
            json!({"type":"message_delta","delta":{},"usage":{"output_tokens":25,"input_tokens":10,"cache_read_input_tokens":1000}}),
        ),
        ("message_stop", json!({"type":"message_stop"})),
    ];
    let text: String = events
        .iter()
        .map(|(e, d)| format!("event: {e}\r\ndata: {d}\r\n\r\n"))
        .collect();
    let mut r = Reassembly::new(Ingress::Messages);
    frames(&text).iter().for_each(|f| r.push(f));
    let out = r.finish();
    assert!(out.complete);
    assert_eq!(
        out.reply["usage"]["output_tokens"], 25,
        "the last cumulative figure, not 46"
    );
    assert_eq!(
        out.reply["usage"]["cache_read_input_tokens"], 1000,
        "not 2000"
    );
    assert_eq!(out.reply["content"][0]["text"], "Hello");
    assert_eq!(out.reply["content"][1]["input"], json!({"path":"a.txt"}));
    assert_eq!(out.reply["stop_reason"], "tool_use");
    crate::formats::replies::reply_with_usage(out.reply).unwrap();
}

#[test]
fn g5_a_stream_cut_short_is_incomplete_and_an_error_event_is_kept() {
    let text = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":3}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let mut r = Reassembly::new(Ingress::Messages);
    frames(text).iter().for_each(|f| r.push(f));
    let out = r.finish();
    assert!(!out.complete);
    assert_eq!(out.error.as_deref(), Some("Overloaded"));
    let mut f = Frames::default();
    let e = f.push(b"data: {}\ngarbage here\n\n").unwrap_err();
    assert!(e.to_string().contains("garbage here"), "{e}");
}

#[test]
fn g5_responses_takes_the_completed_response() {
    let done = json!({"type":"response.completed","response":{"id":"resp_1","object":"response","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":5,"output_tokens":1,"total_tokens":6}}});
    let text = format!("event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"id\":\"resp_1\"}}}}\n\nevent: response.completed\ndata: {done}\n\n");
    let mut r = Reassembly::new(Ingress::Responses);
    frames(&text).iter().for_each(|f| r.push(f));
    let out = r.finish();
    assert!(out.complete);
    assert_eq!(out.reply, done["response"]);
}

fn odd_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1.0e400".to_string()),
        Just("-0.000".to_string()),
        Just("123456789012345678901234567890".to_string()),
        Just(r#""\ud83d\ude00\u0000\n""#.to_string()),
        Just(r#"{"cache_control":{"type":"ephemeral","ttl":"1h","future":1}}"#.to_string()),
        Just("[ 1 , 2 ]".to_string()),
        Just("null".to_string()),
    ]
}

proptest! {
    /// G4: whatever else a body holds, and however it is spaced, the upstream body is the
    /// client's body with promptd's insertions, nothing else.
    #[test]
    fn g4_the_splice_only_inserts(
        extras in proptest::collection::vec(odd_value(), 0..4),
        space in prop_oneof![Just(""), Just(" "), Just("\n  ")],
        system in proptest::option::of(prop_oneof![Just("\"sys\"".to_string()), Just("[{\"type\":\"text\",\"text\":\"a\"}]".to_string()), Just("[]".to_string())]),
        which in 0..3usize,
        context in proptest::option::of("[a-z\"\\\\]{0,6}"),
    ) {
        let mut members: Vec<String> = extras.iter().enumerate().map(|(i, v)| format!("\"x{i}\"{space}:{space}{v}")).collect();
        let ingress = [Ingress::Messages, Ingress::ChatCompletions, Ingress::Responses][which];
        let list = if ingress == Ingress::Responses { "input" } else { "messages" };
        members.push(format!("\"{list}\":{space}[{space}{{\"role\":\"user\",\"content\":{space}\"q\"}}{space}]"));
        if let Some(system) = system.filter(|_| ingress == Ingress::Messages) {
            members.push(format!("\"system\":{space}{system}"));
        }
        let client = format!("{{{space}{}{space}}}", members.join(&format!(",{space}")));
        let c = added("SECTIONS \u{e9}", context.as_deref());
        let (plan, out) = spliced(ingress, &client, &c, &SpliceSettings::default());
        prop_assert_eq!(without_insertions(&plan, &out), client);
    }
}

#[test]
fn g3_a_moved_breakpoint_or_a_block_resent_as_a_string_is_the_same_message() {
    let first = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"fix a.txt","cache_control":{"type":"ephemeral"}}]}]}"#;
    let second = br#"{"messages":[{"role":"user","content":"fix a.txt"},{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"tu_1","name":"Read","input":{"p":"a"},"cache_control":{"type":"ephemeral"}}]},{"role":"user","content":[{"tool_use_id":"tu_1","type":"tool_result","content":"A","cache_control":{"type":"ephemeral"}}]}]}"#;
    let read =
        |b: &[u8]| super::messages::conversation(Ingress::Messages, &ClientBody::parse(b).unwrap());
    let (a, b) = (read(first), read(second));
    assert_eq!(a.messages.len(), 1);
    assert_eq!(b.messages.len(), 3);
    assert_eq!(a.digest(1), b.digest(1));
    assert_ne!(b.digest(2), b.digest(3));
    assert!(
        matches!(&b.messages[2], crate::conversation::Message::Tool { tool_call_id, .. } if tool_call_id == "tu_1")
    );

    let chat = br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c1","content":"r"}]}"#;
    let c =
        super::messages::conversation(Ingress::ChatCompletions, &ClientBody::parse(chat).unwrap());
    assert_eq!(
        c.messages.len(),
        3,
        "the system message is the client's system text"
    );
    let responses = br#"{"input":[{"role":"user","content":"q"},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"r"}]}"#;
    let r =
        super::messages::conversation(Ingress::Responses, &ClientBody::parse(responses).unwrap());
    assert_eq!(r.messages.len(), 3, "parallel calls are one reply");
}

#[test]
fn g4_deny_tools_takes_the_named_client_tools_out_with_their_commas() {
    let tool = |n: &str| format!(r#"{{"name":"{n}","input_schema":{{}}}}"#);
    let all = ["a", "b", "c", "d"];
    for deny in [
        vec!["a"],
        vec!["b"],
        vec!["d"],
        vec!["c", "d"],
        vec!["a", "b"],
        vec!["a", "b", "c", "d"],
        vec!["b", "d"],
    ] {
        let client = format!(
            r#"{{"tools":[ {} ],"messages":[{{"role":"user","content":"q"}}]}}"#,
            all.map(tool).join(" , ")
        );
        let settings = SpliceSettings {
            deny_tools: deny.iter().map(|d| d.to_string()).collect(),
            ..SpliceSettings::default()
        };
        let (plan, out) = spliced(Ingress::Messages, &client, &added("", None), &settings);
        let v: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{deny:?}: {e}: {out}"));
        let kept: Vec<&str> = v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        let expected: Vec<&str> = all.into_iter().filter(|n| !deny.contains(n)).collect();
        assert_eq!(kept, expected, "{deny:?}: {out}");
        assert_eq!(plan.denied, deny, "the record says which");
        assert!(plan
            .edits
            .iter()
            .all(|e| e.part == Part::DenyTool && e.insert.is_empty()));
    }
    let chat = r#"{"tools":[{"type":"function","function":{"name":"keep"}},{"type":"function","function":{"name":"drop"}}],"messages":[]}"#;
    let settings = SpliceSettings {
        deny_tools: vec!["drop".into()],
        ..SpliceSettings::default()
    };
    let (_, out) = spliced(Ingress::ChatCompletions, chat, &added("", None), &settings);
    assert_eq!(
        out,
        r#"{"tools":[{"type":"function","function":{"name":"keep"}}],"messages":[]}"#
    );
}

fn deferring(names: &[&str]) -> SpliceSettings {
    SpliceSettings {
        defer_tools: names.iter().map(|n| n.to_string()).collect(),
        ..SpliceSettings::default()
    }
}

#[test]
fn g4_defer_tools_inserts_defer_loading_first_in_each_named_messages_tool() {
    let client = format!(
        r#"{{"model":"claude",{ODD},"tools":[ {{"name":"keep","input_schema":{{"type":"object"}}}} , {{ "name" : "search" , "input_schema":{{"n":1.50E+2}},"cache_control":{{"type":"ephemeral","ttl":"1h"}}}},{{"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"}},{{"name":"fetch","description":"\u00e9"}} ],"messages":[{{"role":"user","content":"q"}}]}}"#
    );
    let (plan, out) = spliced(
        Ingress::Messages,
        &client,
        &added("S", Some("C")),
        &deferring(&["fetch", "search", "absent"]),
    );
    assert_eq!(without_insertions(&plan, &out), client);
    assert_eq!(plan.deferred, ["search", "fetch"], "in the client's order");
    let inserted: Vec<&str> = plan
        .edits
        .iter()
        .filter(|e| e.part == Part::DeferTool)
        .map(|e| e.insert.as_str())
        .collect();
    assert_eq!(inserted, [r#""defer_loading":true,"#; 2]);
    assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
    // The member goes right after each tool's `{`, before its own first member.
    assert!(
        out.contains(r#"{"defer_loading":true, "name" : "search" ,"#),
        "{out}"
    );
    assert!(
        out.contains(r#"{"defer_loading":true,"name":"fetch","#),
        "{out}"
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let deferred: Vec<bool> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["defer_loading"] == json!(true))
        .collect();
    assert_eq!(deferred, [false, true, false, true]);
    // Sorted by position, the sections' edit first.
    assert!(plan.edits.windows(2).all(|w| w[0].at <= w[1].at));
    assert_eq!(plan.client_breakpoints, 1, "the tool's breakpoint is kept");
}

#[test]
fn g4_defer_tools_marks_responses_function_tools_only() {
    let client = r#"{"model":"gpt","tools":[{"type":"function","name":"lookup","parameters":{}},{"type":"custom","name":"grammar"},{"type":"tool_search"},{"name":"fn2","type":"function"}],"input":"hi"}"#;
    let (plan, out) = spliced(
        Ingress::Responses,
        client,
        &added("S", None),
        &deferring(&["lookup", "grammar", "fn2"]),
    );
    assert_eq!(without_insertions(&plan, &out), client);
    assert_eq!(plan.deferred, ["lookup", "fn2"]);
    assert!(out.contains(r#"[{"defer_loading":true,"type":"function","name":"lookup""#));
    assert!(out.contains(r#"{"defer_loading":true,"name":"fn2","type":"function"}"#));
    assert_eq!(plan.skipped.len(), 1, "{:?}", plan.skipped);
    assert!(plan.skipped[0].contains("grammar"), "{:?}", plan.skipped);
}

#[test]
fn g4_defer_tools_leaves_a_tool_the_client_deferred_and_a_denied_tool_alone() {
    let client = r#"{"tools":[{"name":"a","defer_loading":false},{"name":"b","defer_loading":true},{"name":"c"},{"name":"d"}],"messages":[{"role":"user","content":"q"}]}"#;
    let settings = SpliceSettings {
        deny_tools: vec!["c".into()],
        ..deferring(&["a", "b", "c", "d"])
    };
    let (plan, out) = spliced(Ingress::Messages, client, &added("", None), &settings);
    assert_eq!(plan.denied, ["c"]);
    assert_eq!(plan.deferred, ["d"], "only the tools promptd changed");
    assert_eq!(
        out,
        r#"{"tools":[{"name":"a","defer_loading":false},{"name":"b","defer_loading":true},{"defer_loading":true,"name":"d"}],"messages":[{"role":"user","content":"q"}]}"#
    );
    assert!(plan.edits.windows(2).all(|w| w[0].at <= w[1].at));
    assert_eq!(
        plan.edits.iter().map(|e| e.part).collect::<Vec<_>>(),
        [Part::DenyTool, Part::DeferTool]
    );
    assert_eq!(Splice::apply(&plan, client.as_bytes()), out.as_bytes());
}

#[test]
fn g4_defer_tools_on_chat_and_token_counts_inserts_nothing_and_says_so() {
    let chat = r#"{"tools":[{"type":"function","function":{"name":"lookup"}},{"type":"function","function":{"name":"other"}}],"messages":[{"role":"user","content":"q"}]}"#;
    let (plan, out) = spliced(
        Ingress::ChatCompletions,
        chat,
        &added("", None),
        &deferring(&["lookup", "missing"]),
    );
    assert_eq!(out, chat);
    assert!(plan.deferred.is_empty());
    assert_eq!(plan.skipped.len(), 1, "{:?}", plan.skipped);
    assert!(
        plan.skipped[0].contains("Chat Completions") && plan.skipped[0].contains("lookup"),
        "{:?}",
        plan.skipped
    );
    let count = r#"{"tools":[{"name":"lookup"}],"messages":[{"role":"user","content":"q"}]}"#;
    let (plan, out) = spliced(
        Ingress::CountTokens,
        count,
        &added("", None),
        &deferring(&["lookup"]),
    );
    assert_eq!(out, count);
    assert!(plan.deferred.is_empty());
    assert_eq!(plan.skipped.len(), 1, "{:?}", plan.skipped);
    // A tool list the setting names nothing of says nothing.
    let (plan, _) = spliced(
        Ingress::ChatCompletions,
        chat,
        &added("", None),
        &deferring(&["missing"]),
    );
    assert!(plan.skipped.is_empty());
}

#[test]
fn g4_defer_tools_takes_empty_objects_and_odd_spacing() {
    let client = "{\"tools\" : [ {} , {\"name\":\"only\"} ,{ \n\"name\"\n:\n\"x\" }, [], \"s\" ],\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}";
    let (plan, out) = spliced(
        Ingress::Messages,
        client,
        &added("", None),
        &deferring(&["only", "x"]),
    );
    assert_eq!(without_insertions(&plan, &out), client);
    assert_eq!(plan.deferred, ["only", "x"]);
    assert!(out.contains(
        "[ {} , {\"defer_loading\":true,\"name\":\"only\"} ,{\"defer_loading\":true, \n\"name\""
    ));
    let (plan, out) = spliced(
        Ingress::Messages,
        r#"{"tools":[{}],"messages":[]}"#,
        &added("", None),
        &deferring(&["x"]),
    );
    assert_eq!(out, r#"{"tools":[{}],"messages":[]}"#);
    assert_eq!(plan, Splice::default());
}

/// G10: a request that carries back the reply to the session's last gateway request waits for
/// that reply's record when the log does not hold it yet; a resent request (a retry after a
/// cut) carries no reply and waits for nothing, nor does a conversation that does not continue
/// the last one, nor one whose reply is recorded.
#[test]
fn g10_a_request_waits_only_for_a_reply_it_carries_that_the_log_lacks() {
    use super::messages::{awaits_reply, conversation};
    let read = |b: &str| conversation(Ingress::Messages, &ClientBody::parse(b.as_bytes()).unwrap());
    let first = read(r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    let next = read(
        r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}"#,
    );
    let other = read(
        r#"{"messages":[{"role":"user","content":"bye"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}"#,
    );
    let held = Some((1, first.digest(1)));
    assert!(
        awaits_reply(held, false, &next),
        "the reply is not recorded yet"
    );
    assert!(!awaits_reply(held, true, &next), "the reply is recorded");
    assert!(
        !awaits_reply(held, false, &first),
        "a retry carries no reply"
    );
    assert!(
        !awaits_reply(held, false, &other),
        "not the held conversation"
    );
    assert!(!awaits_reply(None, false, &next), "no gateway request yet");
}
