//! Bedrock Converse through the gateway: the path, the splice, the event-stream framing, the
//! stream's fold, and SigV4 against AWS's documented vectors.

use serde_json::{json, Value};

use super::bedrock::BedrockPath;
use super::body::ClientBody;
use super::eventstream::{self, Decoder, FrameError};
use super::sigv4;
use super::splice::{plan, Contributions, SpliceSettings};
use super::stream::Reassembly;
use super::Ingress;
use crate::conversation::Message;

fn spliced(
    client: &str,
    added: &Contributions,
    settings: &SpliceSettings,
) -> (String, Vec<String>) {
    let body = ClientBody::parse(client.as_bytes()).unwrap();
    let splice = plan(Ingress::Converse, &body, added, settings).unwrap();
    let out = String::from_utf8(splice.apply(client.as_bytes())).unwrap();
    (out, splice.skipped)
}

fn sections(context: Option<&str>) -> Contributions {
    Contributions {
        system: "You are Ada.".into(),
        runtime_context: context.map(str::to_string),
        tools: Vec::new(),
    }
}

#[test]
fn g1_the_path_names_the_model_percent_decoded() {
    let p = BedrockPath::parse("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse").unwrap();
    assert_eq!(p.model, "anthropic.claude-3-haiku-20240307-v1:0");
    assert_eq!(p.ingress, Ingress::Converse);
    let arn =
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.m/converse-stream";
    let p = BedrockPath::parse(arn).unwrap();
    assert_eq!(
        p.model,
        "arn:aws:bedrock:us-east-1:1:inference-profile/us.m"
    );
    assert_eq!(p.ingress, Ingress::ConverseStream);
    assert!(BedrockPath::parse("/model/m/invoke").is_none());
    assert!(BedrockPath::parse("/model/a/b/converse").is_none());
    assert!(BedrockPath::parse("/model/%zz/converse").is_none());
    assert!(BedrockPath::parse("/model//converse").is_none());
}

#[test]
fn g4_the_sections_go_first_in_system_and_the_client_bytes_stay() {
    let client = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"system":[{"text":"mine"},{"cachePoint":{"type":"default"}}]}"#;
    let (out, _) = spliced(client, &sections(None), &SpliceSettings::default());
    assert_eq!(
        out,
        r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"system":[{"text":"You are Ada."},{"text":"mine"},{"cachePoint":{"type":"default"}}]}"#
    );
    let first = SpliceSettings {
        client_system: super::splice::ClientSystem::First,
        ..Default::default()
    };
    let (out, _) = spliced(client, &sections(None), &first);
    assert!(out.ends_with(r#"{"cachePoint":{"type":"default"}},{"text":"You are Ada."}]}"#));
}

#[test]
fn g4_a_body_without_system_gets_one() {
    let client = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
    let (out, _) = spliced(client, &sections(None), &SpliceSettings::default());
    assert_eq!(
        out,
        r#"{"system":[{"text":"You are Ada."}],"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#
    );
}

#[test]
fn g4_the_runtime_context_closes_the_last_user_message_or_is_skipped() {
    let client = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
    let (out, skipped) = spliced(
        client,
        &sections(Some("now: 9")),
        &SpliceSettings::default(),
    );
    assert!(
        out.ends_with(r#"[{"text":"hi"},{"text":"now: 9"}]}]}"#),
        "{out}"
    );
    assert!(skipped.is_empty());
    let prefill = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]},{"role":"assistant","content":[{"text":"Sure"}]}]}"#;
    let (out, skipped) = spliced(
        prefill,
        &sections(Some("now: 9")),
        &SpliceSettings::default(),
    );
    assert!(!out.contains("now: 9"));
    assert_eq!(
        skipped,
        ["runtime context: the last message is not the user's"]
    );
}

#[test]
fn g4_deny_tools_takes_tool_specs_out_and_keeps_cache_points() {
    let client = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"toolConfig":{"tools":[{"toolSpec":{"name":"rm"}},{"toolSpec":{"name":"ls"}},{"cachePoint":{"type":"default"}}]}}"#;
    let settings = SpliceSettings {
        deny_tools: vec!["rm".into()],
        defer_tools: vec!["ls".into()],
        ..Default::default()
    };
    let body = ClientBody::parse(client.as_bytes()).unwrap();
    let splice = plan(
        Ingress::Converse,
        &body,
        &Contributions::default(),
        &settings,
    )
    .unwrap();
    let out = String::from_utf8(splice.apply(client.as_bytes())).unwrap();
    assert!(
        out.ends_with(
            r#""tools":[{"toolSpec":{"name":"ls"}},{"cachePoint":{"type":"default"}}]}}"#
        ),
        "{out}"
    );
    assert_eq!(splice.denied, ["rm"]);
    assert!(splice.skipped[0].contains("Bedrock Converse has no deferred loading"));
    assert_eq!(
        super::splice::tool_names(Ingress::Converse, &body),
        ["rm", "ls"]
    );
}

#[test]
fn g1_a_body_without_messages_or_a_bad_system_is_refused() {
    let body = ClientBody::parse(br#"{"system":[]}"#).unwrap();
    assert!(body.check(Ingress::Converse).is_err());
    let bad = r#"{"messages":[],"system":"x"}"#;
    let body = ClientBody::parse(bad.as_bytes()).unwrap();
    let e = plan(
        Ingress::Converse,
        &body,
        &sections(None),
        &Default::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("`system` must be an array"), "{e}");
}

#[test]
fn g3_the_conversation_pairs_tool_results_with_their_uses() {
    let client = r#"{"messages":[{"role":"user","content":[{"text":"time?"}]},{"role":"assistant","content":[{"toolUse":{"toolUseId":"t1","name":"now","input":{}}}]},{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"json":{"h":9}}],"status":"error"}}]}]}"#;
    let body = ClientBody::parse(client.as_bytes()).unwrap();
    let c = super::messages::conversation(Ingress::Converse, &body);
    assert_eq!(c.messages.len(), 3);
    match &c.messages[2] {
        Message::Tool {
            tool_call_id,
            is_error,
            ..
        } => {
            assert_eq!(tool_call_id, "t1");
            assert!(is_error);
        }
        other => panic!("{other:?}"),
    }
}

fn stream() -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, payload) in [
        ("messageStart", r#"{"role":"assistant"}"#),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"Let me "}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"look."}}"#,
        ),
        ("contentBlockStop", r#"{"contentBlockIndex":0}"#),
        (
            "contentBlockStart",
            r#"{"contentBlockIndex":1,"start":{"toolUse":{"toolUseId":"t1","name":"now"}}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\"tz\":"}}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"\"UTC\"}"}}}"#,
        ),
        ("contentBlockStop", r#"{"contentBlockIndex":1}"#),
        ("messageStop", r#"{"stopReason":"tool_use"}"#),
        (
            "metadata",
            r#"{"usage":{"inputTokens":10,"outputTokens":5,"totalTokens":15,"cacheReadInputTokens":7,"cacheWriteInputTokens":0},"metrics":{"latencyMs":3}}"#,
        ),
    ] {
        out.extend(eventstream::event(kind, payload));
    }
    out
}

#[test]
fn g5_frames_read_back_byte_by_byte_and_fold_into_the_converse_reply() {
    let bytes = stream();
    let mut decoder = Decoder::default();
    let mut fold = Reassembly::new(Ingress::ConverseStream);
    let mut raw = Vec::new();
    // One byte at a time: a frame is whole only once its last byte came.
    for b in &bytes {
        for frame in decoder.push(std::slice::from_ref(b)).unwrap() {
            raw.extend_from_slice(&frame.raw);
            fold.push_event(&frame);
        }
    }
    assert_eq!(raw, bytes, "the client gets the frames' bytes as they came");
    assert!(decoder.rest().is_empty());
    let out = fold.finish();
    assert!(out.complete);
    assert_eq!(
        out.reply,
        json!({
            "output": {"message": {"role": "assistant", "content": [
                {"text": "Let me look."},
                {"toolUse": {"toolUseId": "t1", "name": "now", "input": {"tz": "UTC"}}},
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens":10,"outputTokens":5,"totalTokens":15,"cacheReadInputTokens":7,"cacheWriteInputTokens":0},
            "metrics": {"latencyMs": 3},
        })
    );
    // The record reads the reply as Bedrock's, its usage from the metadata event.
    let (message, usage) = crate::formats::replies::reply_with_usage(out.reply).unwrap();
    let usage = usage.unwrap();
    assert_eq!(
        usage.input_tokens,
        Some(17),
        "inputTokens plus the cache's read"
    );
    assert_eq!(usage.cached_tokens, Some(7));
    assert_eq!(usage.output_tokens, Some(5));
    match message {
        Message::Assistant { tool_calls, .. } => assert_eq!(tool_calls[0].name, "now"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn g5_a_stream_without_its_metadata_is_not_complete() {
    let bytes = stream();
    let mut decoder = Decoder::default();
    let frames = decoder.push(&bytes).unwrap();
    let mut fold = Reassembly::new(Ingress::ConverseStream);
    for frame in &frames[..frames.len() - 1] {
        fold.push_event(frame);
    }
    assert!(!fold.finish().complete);
}

#[test]
fn g5_a_bad_crc_is_named() {
    let mut bytes = eventstream::event("messageStart", r#"{"role":"assistant"}"#);
    let second = eventstream::event("messageStop", r#"{"stopReason":"end_turn"}"#);
    let at = bytes.len();
    bytes.extend(second);
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let e = Decoder::default().push(&bytes).unwrap_err();
    assert!(
        matches!(e, FrameError::MessageCrc { frame: 1, .. }),
        "{e:?}"
    );
    assert_eq!(e.code(), "eventstream_message_crc");
    assert!(e
        .to_string()
        .contains("event-stream frame 1: message CRC32"));
    let mut prelude = bytes[..at].to_vec();
    prelude[9] ^= 1;
    let e = Decoder::default().push(&prelude).unwrap_err();
    assert!(
        matches!(e, FrameError::PreludeCrc { frame: 0, .. }),
        "{e:?}"
    );
}

#[test]
fn g5_an_exception_frame_is_the_streams_error() {
    let frame = eventstream::encode(
        &[
            (":exception-type", "throttlingException"),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        br#"{"message":"slow down"}"#,
    );
    let frames = Decoder::default().push(&frame).unwrap();
    let mut fold = Reassembly::new(Ingress::ConverseStream);
    fold.push_event(&frames[0]);
    let out = fold.finish();
    assert!(!out.complete);
    assert_eq!(out.error.as_deref(), Some("throttlingException: slow down"));
}

#[test]
fn g9_hmac_matches_rfc_4231_case_2() {
    let mac = sigv4::hmac(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[test]
fn g9_the_signing_key_matches_awss_documented_example() {
    // docs.aws.amazon.com, "Examples of how to derive a signing key for Signature Version 4".
    let key = sigv4::signing_key(
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        "20120215",
        "us-east-1",
        "iam",
    );
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
    );
}

fn example() -> sigv4::Credentials {
    sigv4::Credentials {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        session_token: None,
    }
}

#[test]
fn g9_sign_matches_the_sigv4_test_suites_get_vanilla() {
    // AWS's SigV4 test suite, get-vanilla.
    let request = sigv4::Request {
        method: "GET",
        path: "/",
        query: "",
        headers: vec![("host".into(), "example.amazonaws.com".into())],
        body: b"",
    };
    let signed = sigv4::sign(
        &request,
        &example(),
        "us-east-1",
        "service",
        "20150830T123600Z",
    );
    assert_eq!(
        signed.authorization,
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    );
}

#[test]
fn g9_a_changed_body_or_path_changes_the_signature() {
    let sign = |path: &str, body: &[u8]| {
        let request = sigv4::Request {
            method: "POST",
            path,
            query: "",
            headers: vec![("host".into(), "h".into())],
            body,
        };
        sigv4::sign(
            &request,
            &example(),
            "us-east-1",
            "bedrock",
            "20250101T000000Z",
        )
        .authorization
    };
    let base = sign("/model/m%3A0/converse", b"{}");
    assert_ne!(base, sign("/model/m%3A0/converse", b"{ }"));
    assert_ne!(base, sign("/model/m:0/converse", b"{}"));
}

#[test]
fn g9_a_session_token_is_signed_and_sent() {
    let request = sigv4::Request {
        method: "POST",
        path: "/",
        query: "",
        headers: vec![("host".into(), "h".into())],
        body: b"",
    };
    let credentials = sigv4::Credentials {
        session_token: Some("token".into()),
        ..example()
    };
    let signed = sigv4::sign(
        &request,
        &credentials,
        "us-east-1",
        "bedrock",
        "20250101T000000Z",
    );
    assert!(signed
        .authorization
        .contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"));
    assert_eq!(signed.security_token.as_deref(), Some("token"));
    let without = sigv4::sign(
        &request,
        &example(),
        "us-east-1",
        "bedrock",
        "20250101T000000Z",
    );
    assert_ne!(signed.authorization, without.authorization);
}

#[test]
fn g9_amz_date_is_utc_civil_time() {
    assert_eq!(sigv4::amz_date(0), "19700101T000000Z");
    assert_eq!(sigv4::amz_date(1_440_938_160), "20150830T123600Z");
    assert_eq!(sigv4::amz_date(1_709_251_199), "20240229T235959Z");
}

#[test]
fn g9_credentials_never_print() {
    let text = format!("{:?}", example());
    assert!(
        !text.contains("EXAMPLEKEY") && !text.contains("AKID"),
        "{text}"
    );
    let _: Value = json!(null);
}
