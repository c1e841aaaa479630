//! Session planning (Q1–Q3, Q5) and rebuild (Q4) on logs held in memory: no store, no engine.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::*;
use crate::assembly::AssembledTool;
use crate::conversation::ToolCall;
use crate::store::{EventKind, MemoryStore, NewEvent, SessionStore, BODY_VERSION};

const RUN: &str = "run-1";

fn assembly(system: &str, context: Option<&str>) -> Assembly {
    Assembly {
        shown_tools: None,
        sections: Vec::new(),
        contexts: Vec::new(),
        system: system.into(),
        runtime_context: context.map(str::to_string),
        tools: vec![AssembledTool {
            name: "read".into(),
            description: "Reads a file.".into(),
            parameters: json!({"type": "object"}).into(),
            defer: None,
        }]
        .into(),
        explain: Default::default(),
        omitted: Vec::new(),
        called: 0,
        reused: Vec::new(),
    }
}

fn user(text: &str) -> Message {
    Message::user(text)
}

fn tool_result(id: &str) -> Message {
    Message::Tool {
        tool_call_id: id.into(),
        content: "ok".into(),
        is_error: false,
    }
}

fn assistant_calling(id: &str) -> Message {
    Message::Assistant {
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: id.into(),
            name: "read".into(),
            arguments: json!({}),
            arguments_text: None,
        }],
        blocks: Vec::new(),
        native: None,
    }
}

/// The events a plan appends, encoded as a store takes them.
fn encoded(plan: &StepEvents) -> Vec<NewEvent> {
    plan.events
        .iter()
        .chain(std::iter::once(&Body::Step(Box::new(plan.marker.clone()))))
        .map(|b| crate::step::encode(b).unwrap())
        .collect()
}

/// A session log driven through [`SessionState::step_events`] as the daemon drives it.
struct Log {
    store: MemoryStore,
    id: String,
}

impl Log {
    fn new() -> Self {
        let store = MemoryStore::new();
        let id = store
            .create_session(
                "coder",
                NewEvent::json(EventKind::SessionCreated, &json!({})),
            )
            .unwrap();
        Log { store, id }
    }

    fn events(&self) -> Vec<Event> {
        self.store.events(&self.id).unwrap()
    }

    fn step(&self, messages: &[Message], a: &Assembly, run: &str) -> Result<StepEvents> {
        let log = self.events();
        let header = header(a, Default::default());
        let plan = SessionState::from_log(&self.id, &log)?.step_events(
            messages.to_vec(),
            BTreeMap::new(),
            a,
            Some(header),
            run,
            None,
        )?;
        self.store
            .append(&self.id, log.len() as u64 + 1, encoded(&plan))
            .unwrap();
        Ok(plan)
    }

    fn record(&self, message: &Message) {
        let log = self.events();
        check_message(&self.id, &log, message).unwrap();
        self.store
            .append(
                &self.id,
                log.len() as u64 + 1,
                vec![crate::step::encode(&message_event(message.clone())).unwrap()],
            )
            .unwrap();
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.events().iter().map(|e| e.kind.as_str()).collect()
    }
}

#[test]
fn q3_the_header_is_recorded_first_on_change_and_when_another_run_finds_it_changed() {
    let log = Log::new();
    let a = assembly("Be brief.", None);
    let reasons: Vec<Option<HeaderReason>> = [
        log.step(&[user("1")], &a, RUN),
        log.step(&[user("2")], &a, RUN),
        log.step(&[user("3")], &assembly("Be thorough.", None), RUN),
        // Another run with the same header records nothing; with another, `resume`.
        log.step(&[user("4")], &assembly("Be thorough.", None), "run-2"),
        log.step(&[user("5")], &assembly("Be thorough.", None), "run-2"),
        log.step(&[user("6")], &assembly("Be quick.", None), "run-3"),
        log.step(&[user("7")], &assembly("Be slow.", None), "run-3"),
    ]
    .into_iter()
    .map(|p| p.unwrap().header_reason)
    .collect();
    assert_eq!(
        reasons,
        [
            Some(HeaderReason::Initial),
            None,
            Some(HeaderReason::Change),
            None,
            None,
            Some(HeaderReason::Resume),
            Some(HeaderReason::Change),
        ]
    );
    let headers: Vec<Value> = log
        .events()
        .into_iter()
        .filter(|e| e.kind == EventKind::RequestHeader)
        .map(|e| e.body_value().unwrap())
        .map(|b| json!([b["reason"], b["run"]]))
        .collect();
    assert_eq!(
        headers,
        [
            json!(["initial", RUN]),
            json!(["change", RUN]),
            json!(["resume", "run-3"]),
            json!(["change", "run-3"])
        ]
    );
}

#[test]
fn q3_a_header_that_names_no_run_was_written_by_0_1_0_and_resumes_when_it_changes() {
    let log = Log::new();
    let a = assembly("Be brief.", None);
    let old_header = json!({"reason": "initial", "header": header(&a, Default::default())});
    log.store
        .append(
            &log.id,
            2,
            vec![
                NewEvent::json(EventKind::RequestHeader, &old_header),
                NewEvent::json(EventKind::Step, &json!({"step": 1, "facts": {}})),
            ],
        )
        .unwrap();
    // The same header: nothing to record, whoever wrote the last one.
    let plan = log.step(&[], &a, RUN).unwrap();
    assert_eq!((plan.step, plan.header_reason), (2, None));
    let plan = log.step(&[], &assembly("Be thorough.", None), RUN).unwrap();
    assert_eq!(
        (plan.step, plan.header_reason),
        (3, Some(HeaderReason::Resume))
    );
}

#[test]
fn q2_a_snapshot_is_appended_only_when_the_context_changes_and_cleared_once() {
    let log = Log::new();
    let contexts = [
        Some("cwd /a"),
        Some("cwd /a"),
        Some("cwd /b"),
        None,
        None,
        Some("cwd /b"),
    ];
    for c in contexts {
        log.step(&[], &assembly("S", c), RUN).unwrap();
    }
    let snapshots: Vec<Value> = log
        .events()
        .into_iter()
        .filter(|e| e.kind == EventKind::ContextSnapshot)
        .map(|e| e.body_value().unwrap())
        .map(|b| json!([b["content"], b["cleared"]]))
        .collect();
    assert_eq!(
        snapshots,
        [
            json!(["cwd /a", false]),
            json!(["cwd /b", false]),
            json!([CLEARED_SNAPSHOT, true]),
            json!(["cwd /b", false]),
        ]
    );
}

#[test]
fn q1_a_step_appends_messages_then_snapshot_header_and_marker() {
    let log = Log::new();
    let plan = log
        .step(&[user("hi")], &assembly("S", Some("ctx")), RUN)
        .unwrap();
    assert_eq!(plan.step, 1);
    assert_eq!(
        log.kinds(),
        [
            "session/created",
            "user/message",
            "context/snapshot",
            "request/header",
            "step"
        ]
    );
}

#[test]
fn q5_a_tool_result_must_answer_a_call_in_the_log_or_earlier_in_the_step() {
    let log = Log::new();
    let a = assembly("S", None);
    let err = log.step(&[tool_result("c1")], &a, RUN).unwrap_err();
    assert_eq!(err.code(), "unknown_tool_call");
    log.step(&[user("go")], &a, RUN).unwrap();
    log.record(&assistant_calling("c1"));
    log.step(&[tool_result("c1")], &a, RUN).unwrap();
    let err = log
        .step(&[user("x"), assistant_calling("c2")], &a, RUN)
        .unwrap_err();
    assert_eq!(err.code(), "bad_request");
    let err = check_message(&log.id, &log.events(), &Message::snapshot("x")).unwrap_err();
    assert_eq!(err.code(), "bad_request");
}

#[test]
fn q4_any_step_rebuilds_to_what_it_returned() {
    let log = Log::new();
    let mut returned = Vec::new();
    for (i, system) in ["A", "A", "B", "B"].iter().enumerate() {
        let plan = log
            .step(
                &[user(&format!("m{i}"))],
                &assembly(system, Some(&format!("c{}", i / 2))),
                RUN,
            )
            .unwrap();
        returned.push(rebuild(&log.id, &log.events(), plan.step).unwrap());
    }
    let all = log.events();
    for (n, expected) in returned.iter().enumerate() {
        assert_eq!(&rebuild(&log.id, &all, n as u64 + 1).unwrap(), expected);
    }
    assert_eq!(returned[3].header.system, "B");
    assert_eq!(returned[3].messages.len(), 6, "{:?}", returned[3].messages);
    let err = rebuild(&log.id, &all, 5).unwrap_err();
    assert_eq!(err.code(), "unknown_step");
    assert_eq!(
        rebuild(&log.id, &all, 0).unwrap_err().code(),
        "unknown_step"
    );
}

/// A log whose `seq`-th event has `body` instead of what was written.
fn damaged(seq: u64, body: &Value, version: u32) -> (String, Vec<Event>) {
    let log = Log::new();
    log.step(&[user("hello")], &assembly("S", Some("ctx")), RUN)
        .unwrap();
    let mut events = log.events();
    let event = events.iter_mut().find(|e| e.seq == seq).unwrap();
    event.body = body.to_string();
    event.version = version;
    (log.id.clone(), events)
}

#[test]
fn q9_an_event_that_no_longer_decodes_is_an_error_naming_session_and_seq() {
    // seq 2 is the user message, 3 the snapshot, 4 the header.
    for (seq, body) in [
        (2, json!({"role": "user", "content": 5})),
        (3, json!({"cleared": false})),
        (4, json!({"reason": "initial", "header": {"system": 1}})),
    ] {
        let (id, events) = damaged(seq, &body, BODY_VERSION);
        let err = rebuild(&id, &events, 1).unwrap_err();
        assert_eq!(err.code(), "store_corrupt", "{err}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("session `{id}`, event {seq}")),
            "{message}"
        );
    }
}

#[test]
fn q9_a_body_version_this_binary_does_not_know_is_refused() {
    let (id, events) = damaged(2, &json!({"role": "user", "content": "hello"}), 2);
    let err = rebuild(&id, &events, 1).unwrap_err();
    assert_eq!(err.code(), "store_corrupt");
    assert!(err.to_string().contains("body version 2"), "{err}");
    let result = Message::Tool {
        tool_call_id: "c1".into(),
        content: "ok".into(),
        is_error: false,
    };
    let err = check_message(&id, &events, &result).unwrap_err();
    assert_eq!(err.code(), "store_corrupt");
}

#[test]
fn q10_a_sessions_size_counts_its_header_and_snapshot() {
    let log = Log::new();
    log.step(&[user("hi")], &assembly("short", None), "r1")
        .unwrap();
    let small = SessionState::from_log(&log.id, &log.events())
        .unwrap()
        .bytes();
    let big_system = "s".repeat(1 << 20);
    log.step(
        &[],
        &assembly(&big_system, Some(&"c".repeat(1 << 19))),
        "r1",
    )
    .unwrap();
    let big = SessionState::from_log(&log.id, &log.events())
        .unwrap()
        .bytes();
    assert!(
        big >= small + (1 << 20) + (1 << 19),
        "a 1 MiB header and a 512 KiB snapshot count: {small} -> {big}"
    );
}

fn assistant_calling_all(ids: &[&str]) -> Message {
    Message::Assistant {
        content: String::new(),
        tool_calls: ids
            .iter()
            .map(|id| ToolCall {
                id: (*id).into(),
                name: "read".into(),
                arguments: json!({}),
                arguments_text: None,
            })
            .collect(),
        blocks: Vec::new(),
        native: None,
    }
}

/// What every provider requires of a conversation is checked when input arrives, and a
/// refused input records nothing.
#[test]
fn q5_the_conversation_stays_valid_for_every_provider() {
    let log = Log::new();
    let a = assembly("S", Some("ctx"));
    let state = || SessionState::from_log(&log.id, &log.events()).unwrap();
    let refused = |m: &Message| state().check_message(m).unwrap_err().code();
    assert_eq!(refused(&assistant_calling("c0")), "reply_before_step");
    log.step(&[user("go")], &a, RUN).unwrap();
    assert_eq!(
        refused(&Message::Assistant {
            content: " ".into(),
            tool_calls: vec![],
            blocks: vec![],
            native: None,
        }),
        "empty_message"
    );
    let mut bad = assistant_calling("c9");
    if let Message::Assistant { tool_calls, .. } = &mut bad {
        tool_calls[0].arguments = json!("{}");
    }
    assert_eq!(refused(&bad), "invalid_arguments");
    assert_eq!(refused(&assistant_calling_all(&["d", "d"])), "bad_request");
    log.record(&assistant_calling_all(&["c1", "c2"]));
    let before = log.events().len();
    // Open calls: a step must answer every one, results before user text, each once.
    let step = |messages: &[Message]| log.step(messages, &a, RUN).unwrap_err();
    let err = step(&[user("more")]);
    assert_eq!(err.code(), "open_tool_calls");
    assert!(err.to_string().contains("`c1`, `c2`"), "{err}");
    assert_eq!(step(&[tool_result("c1")]).code(), "open_tool_calls");
    let err = step(&[tool_result("c1"), user("and"), tool_result("c2")]);
    assert_eq!(err.code(), "tool_results_first");
    assert!(err.to_string().contains("messages[2]"), "{err}");
    assert_eq!(
        step(&[tool_result("c1"), tool_result("c1")]).code(),
        "tool_call_answered"
    );
    assert_eq!(
        step(&[tool_result("c1"), user(""), tool_result("c2")]).code(),
        "empty_message",
        "the first problem is the one reported"
    );
    assert_eq!(
        step(&[tool_result("c1"), tool_result("c2"), user("\n")]).code(),
        "empty_message"
    );
    assert_eq!(refused(&assistant_calling("c3")), "open_tool_calls");
    assert_eq!(log.events().len(), before, "nothing refused was recorded");
    log.step(
        &[tool_result("c2"), tool_result("c1"), user("thanks")],
        &a,
        RUN,
    )
    .unwrap();
    assert_eq!(refused(&tool_result("c1")), "tool_call_answered");
    assert_eq!(
        refused(&assistant_calling("c1")),
        "bad_request",
        "ids are not reused"
    );
}

#[test]
fn q14_media_counts_by_the_image_rule_not_by_its_base64() {
    use crate::budget::Chars;
    use crate::conversation::content::{Block, Content};
    let image = Message::User {
        content: Content::Blocks(vec![
            Block::Text {
                text: "look".into(),
            },
            Block::Image {
                media_type: Some("image/png".into()),
                data: Some("A".repeat(100_000)),
                url: None,
            },
        ]),
        snapshot: false,
    };
    let size = message_size(&image, &Chars);
    assert!(size.chars < 200, "the base64 is not text: {size:?}");
    assert_eq!(
        size.tokens,
        size.chars + 1600,
        "an image whose size cannot be read counts as the estimate"
    );
}

#[test]
fn q4_a_kept_state_renders_what_a_rebuild_renders_while_the_header_changes() {
    // The state remembers each format's head while the header stays; a new header must
    // drop it, or the next body would carry the old system prompt or tools.
    let log = Log::new();
    let mut state = SessionState::from_log(&log.id, &log.events()).unwrap();
    for (i, system) in ["A", "A", "B", "B", "A"].iter().enumerate() {
        let before = log.events().len();
        log.step(&[user(&format!("m{i}"))], &assembly(system, None), RUN)
            .unwrap();
        state.apply(&log.events()[before..]).unwrap();
        let rebuilt = rebuild(&log.id, &log.events(), i as u64 + 1).unwrap();
        for format in Format::ALL {
            for _ in 0..2 {
                assert_eq!(
                    state.render(format).unwrap(),
                    crate::formats::render(&rebuilt, format).to_string(),
                    "step {} in {format:?}",
                    i + 1
                );
            }
        }
    }
}

#[test]
fn k2_a_kept_state_gives_the_cache_model_the_blocks_of_the_rebuilt_request() {
    // The outcome hashes only what a step added; the blocks must be those of the request a
    // rebuild renders, or a restarted daemon would see a change that is not there.
    let log = Log::new();
    let mut state = SessionState::from_log(&log.id, &log.events()).unwrap();
    let script: [(&[Message], &str); 5] = [
        (&[user("m0")], "A"),
        (&[], "A"),
        (&[user("m1")], "B"),
        (&[user("m2")], "B"),
        (&[user("m3")], "A"),
    ];
    for (i, (messages, system)) in script.iter().enumerate() {
        let before = log.events().len();
        log.step(messages, &assembly(system, None), RUN).unwrap();
        if i == 1 {
            log.record(&assistant_calling("c1"));
            log.step(&[tool_result("c1")], &assembly(system, None), RUN)
                .unwrap();
        }
        state.apply(&log.events()[before..]).unwrap();
        let n = state.steps();
        let rebuilt = rebuild(&log.id, &log.events(), n).unwrap();
        for format in [Format::Openai, Format::Anthropic] {
            for _ in 0..2 {
                let (fast, _) = state.fast_blocks(format).expect("a fast path");
                assert_eq!(
                    fast,
                    crate::cache::blocks(&rebuilt, format),
                    "step {n} in {format:?}"
                );
            }
        }
    }
}

/// A client that keeps the body itself from a step's parts (issue 31).
#[derive(Default)]
struct PartsClient {
    step: u64,
    open: String,
    close: String,
    items: Vec<String>,
}

impl PartsClient {
    /// Applies `parts` (the object `render_parts_into` wrote) for step `step`; says whether
    /// they were relative to the step the client held.
    fn apply(&mut self, parts: &str, step: u64) -> bool {
        let parts: Value = serde_json::from_str(parts).unwrap();
        let since = parts["since"].as_u64().unwrap();
        let keep = parts["keep"].as_u64().unwrap() as usize;
        if since == 0 {
            assert_eq!(keep, 0, "{parts}");
            assert!(
                parts["open"].is_string() && parts["close"].is_string(),
                "{parts}"
            );
        } else {
            assert_eq!(
                since, self.step,
                "parts relative to a step the client does not hold"
            );
        }
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
        since != 0
    }

    fn body(&self) -> String {
        format!("{}{}{}", self.open, self.items.join(","), self.close)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Issue 31: a client that asks each step for the parts since the step it holds keeps,
    /// in every format, exactly the bytes of the whole body (and of a rebuild from the log),
    /// while the header changes, tools are called and replies recorded; and it is sent only
    /// what is new whenever the header stayed.
    #[test]
    fn a_client_keeping_the_body_from_parts_holds_the_whole_bodys_bytes(
        script in proptest::collection::vec((0u8..4, proptest::bool::ANY, proptest::bool::ANY), 1..9)
    ) {
        let log = Log::new();
        let mut state = SessionState::from_log(&log.id, &log.events()).unwrap();
        let mut clients: Vec<PartsClient> = Format::ALL.iter().map(|_| PartsClient::default()).collect();
        let mut system = "A";
        for (i, (kind, switch, context)) in script.iter().enumerate() {
            if *switch {
                system = if system == "A" { "B" } else { "A" };
            }
            let context = context.then_some("cwd: /w");
            let before = log.events().len();
            let a = assembly(system, context);
            let id = format!("c{i}");
            match kind {
                0 => { log.step(&[user(&format!("m{i} \"é\\"))], &a, RUN).unwrap(); }
                1 => {
                    log.step(&[user(&format!("m{i}"))], &a, RUN).unwrap();
                    log.record(&assistant_calling(&id));
                    log.step(&[tool_result(&id)], &a, RUN).unwrap();
                }
                2 => { log.step(&[user(&format!("m{i}"))], &a, RUN).unwrap(); }
                _ => { log.step(&[], &a, RUN).unwrap(); }
            }
            state.apply(&log.events()[before..]).unwrap();
            let n = state.steps();
            let rebuilt = rebuild(&log.id, &log.events(), n).unwrap();
            for (format, client) in Format::ALL.into_iter().zip(clients.iter_mut()) {
                let mut parts = String::new();
                state.render_parts_into(format, client.step, &mut parts).unwrap();
                let relative = client.apply(&parts, n);
                let whole = state.render(format).unwrap();
                proptest::prop_assert_eq!(&client.body(), &whole, "step {} in {:?}", n, format);
                // The whole body as pieces (what the daemon hands the socket), the same bytes.
                let mut pieces = crate::formats::pieces::Pieces::sharing_from(1);
                state.render_into(format, &mut pieces).unwrap();
                proptest::prop_assert_eq!(&pieces.into_string(), &whole);
                proptest::prop_assert_eq!(
                    &whole,
                    &crate::formats::render(&rebuilt, format).to_string()
                );
                // Only the first step of a format, or a step after a header change (here:
                // the system prompt switched), starts from nothing.
                let first = client.items.is_empty() || i == 0;
                if !first && !*switch {
                    proptest::prop_assert!(relative, "step {} in {:?}: {}", n, format, parts);
                }
            }
            if *kind == 2 {
                // The model's reply, recorded after the step (it joins the next body).
                let before = log.events().len();
                log.record(&Message::Assistant {
                    content: format!("reply {i}"),
                    tool_calls: Vec::new(),
                    blocks: Vec::new(),
                    native: None,
                });
                state.apply(&log.events()[before..]).unwrap();
            }
        }
    }
}

#[test]
fn q21_parts_relative_to_a_step_the_daemon_did_not_write_last_start_from_nothing() {
    // A second client holding an older step's body gets the parts from nothing, whole.
    let log = Log::new();
    let mut state = SessionState::from_log(&log.id, &log.events()).unwrap();
    let mut since = Vec::new();
    for (i, held) in [0u64, 1, 1].iter().enumerate() {
        let before = log.events().len();
        log.step(&[user(&format!("m{i}"))], &assembly("A", None), RUN)
            .unwrap();
        state.apply(&log.events()[before..]).unwrap();
        let mut parts = String::new();
        state
            .render_parts_into(Format::Anthropic, *held, &mut parts)
            .unwrap();
        let parts: Value = serde_json::from_str(&parts).unwrap();
        since.push((parts["since"].as_u64().unwrap(), parts["open"].is_string()));
    }
    assert_eq!(since, [(0, true), (1, false), (0, true)]);
}

#[test]
fn q3_a_header_shares_its_assemblys_tool_schemas_so_comparing_them_walks_no_tree() {
    let a = assembly("You are terse.", None);
    let h = header(&a, serde_json::Map::new());
    assert!(std::sync::Arc::ptr_eq(
        &h.tools[0].parameters,
        &a.tools[0].parameters
    ));
    // A header decoded from the log holds a copy: still the same header by value.
    let decoded: Header = serde_json::from_value(serde_json::to_value(&h).unwrap()).unwrap();
    assert!(!std::sync::Arc::ptr_eq(
        &decoded.tools[0].parameters,
        &a.tools[0].parameters
    ));
    let proposed = Proposed {
        model: &serde_json::Map::new(),
        system: &a.system,
        tools: ToolsOf::Assembled(&a.tools),
        layout: crate::conversation::LAYOUT,
        cache_ttl: None,
        key: KeyRule::Equal(None),
    };
    assert!(same_header(&h, proposed));
    assert!(same_header(&decoded, proposed));
}
