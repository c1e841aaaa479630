//! Rendering a request in each provider format, side by side in one run: what a format costs
//! against the others, on the same conversation.
//!
//! Run: `cargo bench -p promptd --bench formats` (criterion; `-- step` runs one group).
//!
//! Method: one conversation of `FORMATS_MESSAGES` (200) messages in rounds of a user message,
//! a reply with two tool calls, their two results and a runtime-context snapshot, under a
//! header of 12 tools (small JSON Schemas) and a 4 KiB system prompt, model settings for every
//! format. Two groups, each with every format: `whole`, `formats::render` of the whole request
//! then its JSON text (what a rebuild does); `step`, what a step of a running session does:
//! one more message pushed into the session's `Transcript` (rendered once per format as it
//! arrives) and the body written from its fragments around the session's kept `Head` (the setup clones the transcript and
//! drops it, neither timed). The table is criterion's median per iteration.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use promptd_core::conversation::{FrozenRequest, Header, Message, ToolCall, ToolSpec, LAYOUT};
use promptd_core::formats::transcript::{Head, Transcript};
use promptd_core::formats::{self, Format};
use serde_json::{json, Map};

fn header() -> Header {
    let mut model = Map::new();
    model.insert("model".into(), json!("example-model"));
    model.insert("max_tokens".into(), json!(4096));
    Header {
        model,
        system: "You are a careful engineer. ".repeat(150),
        tools: (0..12)
            .map(|i| ToolSpec {
                name: format!("tool_{i}"),
                description: format!("Tool number {i}: does one thing well."),
                parameters: json!({"type": "object", "properties": {
                    "path": {"type": "string", "description": "A path."},
                    "limit": {"type": "integer"}}, "required": ["path"]})
                .into(),
                defer: None,
            })
            .collect(),
        layout: LAYOUT,
        cache_key: Some("promptd-coder".into()),
        cache_ttl: None,
    }
}

/// The `i`-th message of the conversation (rounds of five).
fn message(i: usize) -> Message {
    let round = i / 5;
    let call = |k: usize| ToolCall {
        id: format!("call_{round}_{k}"),
        name: format!("tool_{k}"),
        arguments: json!({"path": format!("src/file_{round}.rs"), "limit": 100}),
        arguments_text: None,
    };
    match i % 5 {
        0 => Message::user(format!("Look at file {round} and tell me what it does.")),
        1 => Message::Assistant {
            content: "Reading the file and its neighbour.".into(),
            tool_calls: vec![call(0), call(1)],
            blocks: Vec::new(),
            native: None,
        },
        2 | 3 => Message::Tool {
            tool_call_id: format!("call_{round}_{}", i % 5 - 2),
            content: format!("fn main() {{ println!(\"{round}\"); }}\n")
                .repeat(20)
                .into(),
            is_error: false,
        },
        _ => Message::snapshot(format!("cwd: /src/app\ngit_branch: main\nstep: {round}")),
    }
}

fn main() {
    let n: usize = std::env::var("FORMATS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let header = header();
    let messages: Vec<Message> = (0..n).map(message).collect();
    let request = FrozenRequest {
        header: header.clone(),
        messages: messages.clone(),
        shown_tools: None,
    };
    let mut transcript = Transcript::new();
    for m in &messages {
        transcript.push(m);
    }
    for format in Format::ALL {
        // Every format active, as in a session that asked for it; and the same bytes both ways.
        assert_eq!(
            transcript.render(&header, None, format).expect("render"),
            formats::render(&request, format).to_string(),
            "{}",
            format.as_str()
        );
    }
    let next = message(n);
    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let mut whole = c.benchmark_group("whole");
    for format in Format::ALL {
        whole.bench_with_input(BenchmarkId::new(format.as_str(), n), &format, |b, f| {
            b.iter(|| formats::render(&request, *f).to_string().len())
        });
    }
    whole.finish();
    let mut step = c.benchmark_group("step");
    for format in Format::ALL {
        // A session keeps its head (settings, system prompt, tools) while its header stays.
        let head = Head::new(&header, None, format);
        step.bench_with_input(BenchmarkId::new(format.as_str(), n), &format, |b, f| {
            // By reference: the clone is made and dropped outside the timing.
            b.iter_batched_ref(
                || transcript.clone(),
                |t| {
                    t.push(&next);
                    let mut out = String::new();
                    t.render_with(&head, &header, *f, &mut out);
                    out.len()
                },
                criterion::BatchSize::LargeInput,
            )
        });
    }
    step.finish();
    c.final_summary();
}
