use super::*;
use crate::conversation::{Header, ToolCall};

fn fixture() -> FrozenRequest {
    let mut model = Map::new();
    model.insert("model".into(), json!("test-model"));
    model.insert("max_tokens".into(), json!(1024));
    FrozenRequest {
        shown_tools: None,
        header: Header {
            layout: 0,
            cache_key: None,
            cache_ttl: None,
            model,
            system: "You are Ada.".into(),
            tools: vec![
                ToolSpec {
                    name: "read_file".into(),
                    description: "Read a file.".into(),
                    parameters: json!({
                        "type": "object",
                        "properties": { "path": { "type": "string" } },
                        "required": ["path"],
                    })
                    .into(),
                    defer: None,
                },
                ToolSpec {
                    name: "list-dir".into(),
                    description: "List a directory.".into(),
                    parameters: json!({ "type": "object", "properties": {} }).into(),
                    defer: None,
                },
            ],
        },
        messages: vec![
            Message::user("Show me main.rs"),
            Message::Assistant {
                content: "Reading it.".into(),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: json!({ "path": "src/main.rs" }),
                    arguments_text: None,
                }],
                blocks: Vec::new(),
                native: None,
            },
            Message::Tool {
                tool_call_id: "call_1".into(),
                content: "fn main() {}".into(),
                is_error: false,
            },
            Message::snapshot("cwd: /work"),
        ],
    }
}

/// A fixture exercising the edge cases: tool errors, tool-only and empty assistant turns,
/// consecutive user messages.
fn edge_fixture() -> FrozenRequest {
    let mut request = fixture();
    request.messages = vec![
        Message::user("one"),
        Message::user("two"),
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![
                ToolCall {
                    id: "a".into(),
                    name: "read_file".into(),
                    arguments: json!({ "path": "x" }),
                    arguments_text: None,
                },
                ToolCall {
                    id: "b".into(),
                    name: "list-dir".into(),
                    arguments: json!({}),
                    arguments_text: None,
                },
            ],
            blocks: Vec::new(),
            native: None,
        },
        Message::Tool {
            tool_call_id: "a".into(),
            content: "no such file".into(),
            is_error: true,
        },
        Message::Tool {
            tool_call_id: "b".into(),
            content: "".into(),
            is_error: false,
        },
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![],
            blocks: Vec::new(),
            native: None,
        },
        Message::Assistant {
            content: "Done.".into(),
            tool_calls: vec![],
            blocks: Vec::new(),
            native: None,
        },
        Message::snapshot("cwd: /work"),
    ];
    request
}

fn bare() -> FrozenRequest {
    FrozenRequest {
        shown_tools: None,
        header: Header {
            layout: 0,
            cache_key: None,
            cache_ttl: None,
            model: Map::new(),
            system: String::new(),
            tools: vec![],
        },
        messages: vec![Message::user("hi")],
    }
}

const ALL: [Format; 3] = [Format::Neutral, Format::Openai, Format::Anthropic];

#[test]
fn q8_format_parse_round_trips() {
    for format in ALL {
        assert_eq!(format.as_str().parse(), Ok(format));
        let from_serde: Format =
            serde_json::from_value(json!(format.as_str())).expect("deserializes");
        assert_eq!(from_serde, format);
    }
    assert_eq!(
        "OpenAI".parse::<Format>().unwrap_err().to_string(),
        "unknown format `OpenAI`; use neutral, openai, anthropic, openai-responses, gemini, bedrock"
    );
    assert_eq!("".parse::<Format>(), Err(UnknownFormat(String::new())));
    assert_eq!(Format::default(), Format::Neutral);
}

#[test]
fn q8_neutral_exact() {
    let expected = json!({
        "model": { "model": "test-model", "max_tokens": 1024 },
        "system": "You are Ada.",
        "tools": [
            {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {
                    "type": "object",
                    "properties": { "path": { "type": "string" } },
                    "required": ["path"],
                },
            },
            {
                "name": "list-dir",
                "description": "List a directory.",
                "parameters": { "type": "object", "properties": {} },
            },
        ],
        "messages": [
            { "role": "user", "content": "Show me main.rs" },
            {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [
                    { "id": "call_1", "name": "read_file", "arguments": { "path": "src/main.rs" } },
                ],
            },
            { "role": "tool", "tool_call_id": "call_1", "content": "fn main() {}" },
            { "role": "user", "content": "cwd: /work", "snapshot": true },
        ],
    });
    assert_eq!(render(&fixture(), Format::Neutral), expected);
}

#[test]
fn q8_neutral_messages_round_trip() {
    let request = edge_fixture();
    let body = render(&request, Format::Neutral);
    let messages: Vec<Message> =
        serde_json::from_value(body["messages"].clone()).expect("messages deserialize");
    assert_eq!(messages, request.messages);
}

#[test]
fn q8_openai_exact() {
    let expected = json!({
        "model": "test-model",
        "max_tokens": 1024,
        "messages": [
            { "role": "system", "content": "You are Ada." },
            { "role": "user", "content": "Show me main.rs" },
            {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [{
                    "id": "call_1",
                    "type": "function",
                    "function": { "name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}" },
                }],
            },
            { "role": "tool", "tool_call_id": "call_1", "content": "fn main() {}" },
            { "role": "user", "content": "cwd: /work" },
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": "Read a file.",
                    "parameters": {
                        "type": "object",
                        "properties": { "path": { "type": "string" } },
                        "required": ["path"],
                    },
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "list-dir",
                    "description": "List a directory.",
                    "parameters": { "type": "object", "properties": {} },
                },
            },
        ],
    });
    assert_eq!(render(&fixture(), Format::Openai), expected);
}

#[test]
fn q8_openai_edge_cases() {
    let body = render(&edge_fixture(), Format::Openai);
    let messages = body["messages"].as_array().expect("messages");
    // system, 2 users, tool-call assistant, 2 tools, empty assistant, text assistant, snapshot.
    assert_eq!(messages.len(), 9);
    assert_eq!(messages[3]["content"], Value::Null);
    assert_eq!(messages[3]["tool_calls"][1]["function"]["arguments"], "{}");
    // OpenAI has no is_error on tool messages.
    assert_eq!(
        messages[4],
        json!({ "role": "tool", "tool_call_id": "a", "content": "no such file" })
    );
    assert_eq!(messages[6], json!({ "role": "assistant", "content": null }));
}

#[test]
fn q8_anthropic_exact() {
    let expected = json!({
        "model": "test-model",
        "max_tokens": 1024,
        "system": [
            { "type": "text", "text": "You are Ada.", "cache_control": { "type": "ephemeral" } },
        ],
        "tools": [
            {
                "name": "read_file",
                "description": "Read a file.",
                "input_schema": {
                    "type": "object",
                    "properties": { "path": { "type": "string" } },
                    "required": ["path"],
                },
            },
            {
                "name": "list-dir",
                "description": "List a directory.",
                "input_schema": { "type": "object", "properties": {} },
                "cache_control": { "type": "ephemeral" },
            },
        ],
        "messages": [
            { "role": "user", "content": [{ "type": "text", "text": "Show me main.rs" }] },
            {
                "role": "assistant",
                "content": [
                    { "type": "text", "text": "Reading it." },
                    { "type": "tool_use", "id": "call_1", "name": "read_file", "input": { "path": "src/main.rs" } },
                ],
            },
            {
                "role": "user",
                "content": [
                    { "type": "tool_result", "tool_use_id": "call_1", "content": "fn main() {}" },
                    { "type": "text", "text": "cwd: /work" },
                ],
            },
        ],
    });
    assert_eq!(render(&fixture(), Format::Anthropic), expected);
}

#[test]
fn q8_anthropic_edge_cases() {
    let expected_messages = json!([
        {
            "role": "user",
            "content": [{ "type": "text", "text": "one" }, { "type": "text", "text": "two" }],
        },
        {
            "role": "assistant",
            "content": [
                { "type": "tool_use", "id": "a", "name": "read_file", "input": { "path": "x" } },
                { "type": "tool_use", "id": "b", "name": "list-dir", "input": {} },
            ],
        },
        {
            "role": "user",
            "content": [
                { "type": "tool_result", "tool_use_id": "a", "content": "no such file", "is_error": true },
                { "type": "tool_result", "tool_use_id": "b", "content": "" },
            ],
        },
        // The empty assistant message is skipped; "Done." stands alone.
        { "role": "assistant", "content": [{ "type": "text", "text": "Done." }] },
        { "role": "user", "content": [{ "type": "text", "text": "cwd: /work" }] },
    ]);
    let body = render(&edge_fixture(), Format::Anthropic);
    assert_eq!(body["messages"], expected_messages);
}

#[test]
fn q8_gemini_exact() {
    let expected = json!({
        "model": "test-model",
        "config": {
            "maxOutputTokens": 1024,
            "systemInstruction": { "parts": [{ "text": "You are Ada." }] },
            "tools": [{ "functionDeclarations": [
                {
                    "name": "read_file",
                    "description": "Read a file.",
                    "parametersJsonSchema": {
                        "type": "object",
                        "properties": { "path": { "type": "string" } },
                        "required": ["path"],
                    },
                },
                {
                    "name": "list-dir",
                    "description": "List a directory.",
                    "parametersJsonSchema": { "type": "object", "properties": {} },
                },
            ]}],
        },
        "contents": [
            { "role": "user", "parts": [{ "text": "Show me main.rs" }] },
            { "role": "model", "parts": [
                { "text": "Reading it." },
                // A call Gemini did not write carries the documented dummy signature.
                { "functionCall": { "id": "call_1", "name": "read_file", "args": { "path": "src/main.rs" } },
                  "thoughtSignature": "skip_thought_signature_validator" },
            ]},
            { "role": "user", "parts": [
                { "functionResponse": { "id": "call_1", "name": "read_file", "response": { "output": "fn main() {}" } } },
                { "text": "cwd: /work" },
            ]},
        ],
    });
    assert_eq!(render(&fixture(), Format::Gemini), expected);
}

#[test]
fn q8_bedrock_exact() {
    let point = json!({ "cachePoint": { "type": "default" } });
    let expected = json!({
        "modelId": "test-model",
        "inferenceConfig": { "maxTokens": 1024 },
        "system": [{ "text": "You are Ada." }, point],
        "toolConfig": { "tools": [
            { "toolSpec": {
                "name": "read_file",
                "description": "Read a file.",
                "inputSchema": { "json": {
                    "type": "object",
                    "properties": { "path": { "type": "string" } },
                    "required": ["path"],
                }},
            }},
            { "toolSpec": {
                "name": "list-dir",
                "description": "List a directory.",
                "inputSchema": { "json": { "type": "object", "properties": {} } },
            }},
            point,
        ]},
        "messages": [
            { "role": "user", "content": [{ "text": "Show me main.rs" }] },
            { "role": "assistant", "content": [
                { "text": "Reading it." },
                { "toolUse": { "toolUseId": "call_1", "name": "read_file", "input": { "path": "src/main.rs" } } },
            ]},
            { "role": "user", "content": [
                { "toolResult": { "toolUseId": "call_1", "content": [{ "text": "fn main() {}" }] } },
                { "text": "cwd: /work" },
            ]},
        ],
    });
    assert_eq!(render(&fixture(), Format::Bedrock), expected);
    // Layout 1 adds the rolling cache point at the end of the last turn; an hour's TTL
    // goes on every point.
    let mut request = fixture();
    request.header.layout = crate::conversation::LAYOUT;
    request.header.cache_ttl = Some(crate::conversation::Ttl::Hour1);
    let body = render(&request, Format::Bedrock);
    let hour = json!({ "cachePoint": { "type": "default", "ttl": "1h" } });
    assert_eq!(body["messages"][2]["content"][2], hour);
    assert_eq!(body["system"][1], hour);
    assert_eq!(body["toolConfig"]["tools"][2], hour);
    assert_eq!(
        body.to_string().matches("cachePoint").count(),
        3,
        "at most Bedrock's 4"
    );
}

#[test]
fn q8_bedrock_errors_and_media() {
    let mut request = edge_fixture();
    request.messages.push(Message::User {
        content: crate::conversation::Content::Blocks(vec![
            Block::Image {
                media_type: Some("image/webp".into()),
                data: Some("UklGRg==".into()),
                url: None,
            },
            Block::Document {
                media_type: Some("application/pdf".into()),
                data: Some("JVBERi0=".into()),
                url: None,
                name: Some("Q3 report (final).v2.pdf".into()),
            },
        ]),
        snapshot: false,
    });
    let body = render(&request, Format::Bedrock);
    let messages = body["messages"].as_array().unwrap();
    let result = &messages[2]["content"][0]["toolResult"];
    assert_eq!(result["status"], "error");
    assert_eq!(result["content"], json!([{ "text": "no such file" }]));
    let last = messages.last().unwrap()["content"].as_array().unwrap();
    assert_eq!(
        last[last.len() - 1],
        json!({ "document": { "format": "pdf", "name": "Q3 report (final)-v2", "source": { "bytes": "JVBERi0=" } } })
    );
    assert_eq!(
        last[last.len() - 2],
        json!({ "image": { "format": "webp", "source": { "bytes": "UklGRg==" } } })
    );
    // Roles alternate from user, as Converse wants.
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["role"], if i % 2 == 0 { "user" } else { "assistant" });
    }
    assert_eq!(bedrock::document_name(None), "document");
    assert_eq!(bedrock::document_name(Some("  a  b.pdf")), "a b");
    assert_eq!(bedrock::document_name(Some("../..")), "----");
    let url = Message::User {
        content: crate::conversation::Content::Blocks(vec![Block::Image {
            media_type: None,
            data: None,
            url: Some("https://x/a.png".into()),
        }]),
        snapshot: false,
    };
    assert!(unsupported(Format::Bedrock, &url).is_some());
    assert!(unsupported(Format::Gemini, &url).is_none());
}

/// Gemini 3 refuses earlier function calls without the signature the model returned with
/// them, and a signature does not carry to another model: the recorded parts go back as
/// they came to the model that wrote them, and with the documented dummy to another.
#[test]
fn q8_gemini_signatures_go_back_exactly_to_their_model_only() {
    let response = json!({
        "candidates": [{ "content": { "role": "model", "parts": [
            { "text": "thinking...", "thought": true, "thoughtSignature": "dGhvdWdodA==" },
            { "function_call": { "name": "read_file", "args": { "path": "a" } }, "thought_signature": "c2lnLTE=" },
            { "functionCall": { "name": "list-dir", "args": {} } },
        ]}, "finishReason": "STOP" }],
        "modelVersion": "gemini-3-pro-preview",
        "usageMetadata": { "promptTokenCount": 5000, "cachedContentTokenCount": 4096,
            "candidatesTokenCount": 20, "thoughtsTokenCount": 30 },
    });
    assert_eq!(replies::format_of(&response), Some(Format::Gemini));
    let (mut reply, usage) = replies::reply_with_usage(response).unwrap();
    let usage = usage.unwrap();
    assert_eq!(
        (usage.input_tokens, usage.cached_tokens, usage.output_tokens),
        (Some(5000), Some(4096), Some(50))
    );
    replies::name_calls(&mut reply, 7);
    let Message::Assistant {
        content,
        tool_calls,
        ..
    } = &reply
    else {
        panic!()
    };
    assert_eq!(content, "", "a thought is not the answer");
    let ids: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_7_0", "call_7_1"]);
    let mut request = fixture();
    request
        .header
        .model
        .insert("model".into(), json!("gemini-3-pro-preview"));
    request.messages = vec![
        Message::user("go"),
        reply,
        Message::Tool {
            tool_call_id: "call_7_0".into(),
            content: "A".into(),
            is_error: false,
        },
        Message::Tool {
            tool_call_id: "call_7_1".into(),
            content: "B".into(),
            is_error: true,
        },
    ];
    let body = render(&request, Format::Gemini);
    assert_eq!(
        body["contents"][1]["parts"],
        json!([
            { "text": "thinking...", "thought": true, "thoughtSignature": "dGhvdWdodA==" },
            { "functionCall": { "name": "read_file", "args": { "path": "a" } }, "thoughtSignature": "c2lnLTE=" },
            { "functionCall": { "name": "list-dir", "args": {} } },
        ]),
        "as recorded, keys in the JSON spelling"
    );
    // The calls had no ids: neither have their responses (Gemini matches them by name).
    assert_eq!(
        body["contents"][2]["parts"],
        json!([
            { "functionResponse": { "name": "read_file", "response": { "output": "A" } } },
            { "functionResponse": { "name": "list-dir", "response": { "error": "B" } } },
        ])
    );
    // Another model: no signature of the first, the dummy on the first call.
    request
        .header
        .model
        .insert("model".into(), json!("gemini-3-flash-preview"));
    let other = render(&request, Format::Gemini);
    assert_eq!(
        other["contents"][1]["parts"],
        json!([
            { "text": "thinking...", "thought": true },
            { "functionCall": { "name": "read_file", "args": { "path": "a" } }, "thoughtSignature": gemini::SKIP_SIGNATURE },
            { "functionCall": { "name": "list-dir", "args": {} } },
        ])
    );
}

#[test]
fn q8_bedrock_replies_keep_their_blocks() {
    let response = json!({
        "ResponseMetadata": { "HTTPStatusCode": 200 },
        "output": { "message": { "role": "assistant", "content": [
            { "reasoningContent": { "reasoningText": { "text": "hm", "signature": "sig" } } },
            { "text": "Reading." },
            { "toolUse": { "toolUseId": "tu1", "name": "read_file", "input": { "path": "a" } } },
        ]}},
        "stopReason": "tool_use",
        "usage": { "inputTokens": 10, "outputTokens": 5, "totalTokens": 3015,
            "cacheReadInputTokens": 2000, "cacheWriteInputTokens": 1000,
            "cacheDetails": [{ "ttl": "1h", "inputTokens": 1000 }] },
        "metrics": { "latencyMs": 12 },
    });
    assert_eq!(replies::format_of(&response), Some(Format::Bedrock));
    let (reply, usage) = replies::reply_with_usage(response).unwrap();
    let usage = usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.cached_tokens,
            usage.cache_write_tokens,
            usage.cache_write_1h_tokens
        ),
        (Some(3010), Some(2000), Some(1000), Some(1000))
    );
    let Message::Assistant {
        content,
        tool_calls,
        ..
    } = &reply
    else {
        panic!()
    };
    assert_eq!(
        (content.as_str(), tool_calls[0].id.as_str()),
        ("Reading.", "tu1")
    );
    let mut request = fixture();
    request.messages = vec![Message::user("go"), reply.clone()];
    let body = render(&request, Format::Bedrock);
    assert_eq!(
        body["messages"][1]["content"][0]["reasoningContent"]["reasoningText"]["signature"],
        "sig"
    );
    // The other formats see the text and the call.
    let anthropic = render(&request, Format::Anthropic);
    assert_eq!(anthropic["messages"][1]["content"][1]["type"], "tool_use");
    // Recorded in the log's neutral shape, it reads back the same.
    let again = replies::reply(neutral_message(&reply)).unwrap();
    assert_eq!(again, reply);
    let server = json!({"role": "assistant", "content": [{"text": "a"}, {"image": {}}]});
    assert!(replies::reply(server)
        .unwrap_err()
        .to_string()
        .contains("image"));
}

/// docs/formats.md, "Model settings": in a Gemini body every key but `model` goes into
/// `config`, camel-cased, `max_tokens` as `maxOutputTokens`, `stop` as `stopSequences`, a
/// key in Gemini's own spelling winning; in a Bedrock body the generic sampling keys go into
/// `inferenceConfig`, whose own table wins, and the rest at the top as written.
#[test]
fn q8_gemini_and_bedrock_settings_are_mapped_as_documented() {
    let mut request = bare();
    let model = &mut request.header.model;
    for (k, v) in [
        ("model", json!("m")),
        ("max_tokens", json!(100)),
        ("top_p", json!(0.5)),
        ("stop", json!("END")),
        ("temperature", json!(0.2)),
    ] {
        model.insert(k.into(), v);
    }
    model.insert(
        "gemini".into(),
        json!({"maxOutputTokens": 9, "thinkingConfig": {"thinkingLevel": "low"}}),
    );
    model.insert(
        "bedrock".into(),
        json!({"inferenceConfig": {"maxTokens": 7}, "performanceConfig": {"latency": "optimized"}}),
    );
    let gemini = render(&request, Format::Gemini);
    assert_eq!(gemini["model"], "m");
    assert_eq!(
        gemini["config"],
        json!({"maxOutputTokens": 9, "topP": 0.5, "stopSequences": ["END"], "temperature": 0.2,
            "thinkingConfig": {"thinkingLevel": "low"}})
    );
    let bedrock = render(&request, Format::Bedrock);
    assert_eq!(bedrock["modelId"], "m");
    assert_eq!(
        bedrock["inferenceConfig"],
        json!({"maxTokens": 7, "topP": 0.5, "stopSequences": ["END"], "temperature": 0.2})
    );
    assert_eq!(
        bedrock["performanceConfig"],
        json!({"latency": "optimized"})
    );
    // One key read in place is the key of the merged settings.
    for format in Format::ALL {
        for key in [
            "model",
            "top_p",
            "maxOutputTokens",
            "inferenceConfig",
            "gemini",
        ] {
            assert_eq!(
                setting(&request.header.model, format, key),
                settings(&request.header.model, format).get(key),
                "{} {key}",
                format.as_str()
            );
        }
    }
}

/// Issue 33: a server that speaks Chat Completions gets what its docs say it takes.
#[test]
fn q8_openai_dialects_adjust_what_their_servers_refuse() {
    let mut request = fixture();
    request.header.cache_key = Some("promptd-coder".into());
    request.shown_tools = Some(vec!["list-dir".into()]);
    request
        .header
        .model
        .insert("max_completion_tokens".into(), json!(99));
    let openai = render(&request, Format::Openai);
    assert_eq!(openai["prompt_cache_key"], "promptd-coder");
    assert_eq!(openai["tool_choice"]["type"], "allowed_tools");
    assert_eq!(openai["tools"].as_array().unwrap().len(), 2);
    for (name, max) in [
        ("vllm", "max_completion_tokens"),
        ("llamacpp", "max_tokens"),
        ("ollama", "max_tokens"),
    ] {
        let mut r = request.clone();
        r.header.model.remove("max_tokens");
        r.header
            .model
            .insert("openai".into(), json!({"dialect": name}));
        let body = render(&r, Format::Openai);
        assert!(
            body.get("dialect").is_none() && body.get("prompt_cache_key").is_none(),
            "{body}"
        );
        assert!(
            body.get("tool_choice").is_none(),
            "{name}: no allowed_tools: {body}"
        );
        let tools: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(tools, ["list-dir"], "{name}: the shown tools only");
        assert_eq!(body[max], 99, "{name}: {body}");
        // The Responses body never carries the key.
        assert!(render(&r, Format::OpenaiResponses).get("dialect").is_none());
    }
    let mut model = Map::new();
    model.insert("model".into(), json!("m"));
    model.insert("openai".into(), json!({"dialect": "tgi"}));
    let e = check_settings(&model, Format::Openai).unwrap_err();
    assert_eq!(e.code(), "config_invalid");
    assert!(
        e.to_string()
            .contains("unknown dialect `tgi`; use openai, vllm, llamacpp, ollama"),
        "{e}"
    );
}

// --- Shape checks, written from the providers' public API docs. ---

fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_openai_shape(body: &Value) {
    let messages = body["messages"].as_array().expect("messages is a list");
    for message in messages {
        let role = message["role"].as_str().expect("role is a string");
        assert!(
            ["system", "user", "assistant", "tool"].contains(&role),
            "unknown role {role}"
        );
        if role == "tool" {
            assert!(
                message["tool_call_id"].is_string(),
                "tool message without tool_call_id"
            );
        }
        if let Some(calls) = message.get("tool_calls") {
            assert_eq!(role, "assistant");
            for call in calls.as_array().expect("tool_calls is a list") {
                assert!(call["id"].is_string());
                assert_eq!(call["type"], "function");
                let arguments = call["function"]["arguments"]
                    .as_str()
                    .expect("arguments is a string");
                serde_json::from_str::<Value>(arguments).expect("arguments parse as JSON");
            }
        }
    }
    if let Some(tools) = body.get("tools") {
        for tool in tools.as_array().expect("tools is a list") {
            assert_eq!(tool["type"], "function");
            let name = tool["function"]["name"].as_str().expect("name is a string");
            assert!(valid_function_name(name), "bad function name {name:?}");
            assert!(tool["function"]["parameters"].is_object());
        }
    }
}

fn count_cache_control(value: &Value) -> usize {
    match value {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| usize::from(k == "cache_control") + count_cache_control(v))
            .sum(),
        Value::Array(items) => items.iter().map(count_cache_control).sum(),
        _ => 0,
    }
}

fn check_anthropic_shape(body: &Value) {
    let messages = body["messages"].as_array().expect("messages is a list");
    let mut previous_tool_uses: Vec<&str> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let expected_role = if i % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(
            message["role"], expected_role,
            "roles must alternate from user"
        );
        let blocks = message["content"].as_array().expect("content is a list");
        assert!(!blocks.is_empty(), "content must not be empty");
        let mut tool_uses = Vec::new();
        for block in blocks {
            match block["type"].as_str() {
                Some("text") => assert!(block["text"].is_string()),
                Some("tool_use") => {
                    assert_eq!(expected_role, "assistant");
                    assert!(block["input"].is_object());
                    assert!(block["name"].is_string());
                    tool_uses.push(block["id"].as_str().expect("tool_use id"));
                }
                Some("tool_result") => {
                    assert_eq!(expected_role, "user");
                    let id = block["tool_use_id"].as_str().expect("tool_use_id");
                    assert!(
                        previous_tool_uses.contains(&id),
                        "tool_result {id} answers no tool_use in the preceding message"
                    );
                }
                other => panic!("unknown block type {other:?}"),
            }
        }
        previous_tool_uses = tool_uses;
    }
    assert!(
        count_cache_control(body) <= 4,
        "too many cache_control markers"
    );
    if let Some(system) = body.get("system") {
        for block in system.as_array().expect("system is a list") {
            assert_eq!(block["type"], "text");
        }
    }
    if let Some(tools) = body.get("tools") {
        for tool in tools.as_array().expect("tools is a list") {
            assert!(tool["name"].is_string());
            assert!(tool["description"].is_string());
            assert!(tool["input_schema"].is_object());
        }
    }
}

#[test]
fn q8_openai_shape() {
    for request in [fixture(), edge_fixture(), bare()] {
        check_openai_shape(&render(&request, Format::Openai));
    }
}

#[test]
fn q8_anthropic_shape() {
    for request in [fixture(), edge_fixture(), bare()] {
        check_anthropic_shape(&render(&request, Format::Anthropic));
    }
}

#[test]
fn q8_anthropic_cache_control_only_on_system_and_last_tool() {
    let body = render(&fixture(), Format::Anthropic);
    assert_eq!(count_cache_control(&body), 2);
    assert_eq!(count_cache_control(&body["messages"]), 0);
    assert!(body["tools"][0].get("cache_control").is_none());
    assert!(body["tools"][1].get("cache_control").is_some());
}

#[test]
fn q8_empty_system_and_no_tools_are_omitted() {
    let request = bare();
    let openai = render(&request, Format::Openai);
    assert!(openai.get("tools").is_none());
    assert_eq!(
        openai["messages"],
        json!([{ "role": "user", "content": "hi" }])
    );
    let anthropic = render(&request, Format::Anthropic);
    assert!(anthropic.get("system").is_none());
    assert!(anthropic.get("tools").is_none());
    assert_eq!(
        anthropic,
        json!({ "messages": [{ "role": "user", "content": [{ "type": "text", "text": "hi" }] }] })
    );
    assert_eq!(
        render(&request, Format::Neutral),
        json!({
            "model": {},
            "system": "",
            "tools": [],
            "messages": [{ "role": "user", "content": "hi" }],
        })
    );
}

#[test]
fn q8_deterministic() {
    for request in [fixture(), edge_fixture(), bare()] {
        for format in ALL {
            let first = serde_json::to_string(&render(&request, format)).expect("serializes");
            let second = serde_json::to_string(&render(&request, format)).expect("serializes");
            assert_eq!(first, second, "{} not deterministic", format.as_str());
        }
    }
    // Keys come out sorted (no preserve_order), independent of insertion order.
    let text = serde_json::to_string(&render(&bare(), Format::Neutral)).expect("serializes");
    assert_eq!(
        text,
        r#"{"messages":[{"content":"hi","role":"user"}],"model":{},"system":"","tools":[]}"#
    );
}

#[test]
fn q8_model_keys_at_top_level() {
    let request = fixture();
    for format in [Format::Openai, Format::Anthropic] {
        let body = render(&request, format);
        assert_eq!(body["model"], "test-model", "{}", format.as_str());
        assert_eq!(body["max_tokens"], 1024, "{}", format.as_str());
    }
    let neutral = render(&request, Format::Neutral);
    assert_eq!(neutral["model"]["model"], "test-model");
    assert_eq!(neutral["model"]["max_tokens"], 1024);
}

#[test]
fn q8_never_panics_on_odd_input() {
    // Non-object arguments/parameters, empty names, assistant-first conversations.
    let request = FrozenRequest {
        shown_tools: None,
        header: Header {
            layout: 0,
            cache_key: None,
            cache_ttl: None,
            model: Map::new(),
            system: String::new(),
            tools: vec![ToolSpec {
                name: String::new(),
                description: String::new(),
                parameters: Value::Null.into(),
                defer: None,
            }],
        },
        messages: vec![
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: json!([1, "two", null]),
                    arguments_text: None,
                }],
                blocks: Vec::new(),
                native: None,
            },
            Message::Tool {
                tool_call_id: "missing".into(),
                content: String::new().into(),
                is_error: true,
            },
        ],
    };
    for format in ALL {
        let body = render(&request, format);
        assert!(serde_json::to_string(&body).is_ok());
    }
    let openai = render(&request, Format::Openai);
    assert_eq!(
        openai["messages"][0]["tool_calls"][0]["function"]["arguments"],
        r#"[1,"two",null]"#
    );
    assert_eq!(
        render(&FrozenRequest::default(), Format::Anthropic),
        json!({ "messages": [] })
    );
}
