//! The gateway's overhead (G7): official-SDK-shaped Anthropic Messages traffic through
//! `promptd serve`'s gateway to a local upstream stub, and directly to the same stub, side by
//! side in one run.
//!
//! Run: `cargo bench -p promptd --bench gateway`. Environment: `GATEWAY_SECS` (5) measured
//! seconds per scenario after `GATEWAY_WARMUP_SECS` (1); `GATEWAY_CLIENTS` (`1,16,64`);
//! `GATEWAY_PROVIDERS` (`anthropic`; `bedrock` is Bedrock `converse` and `converse-stream`,
//! re-signed by the gateway with SigV4 and streamed as AWS event-stream frames; `anthropic,gemini` adds Gemini `generateContent` and
//! `streamGenerateContent?alt=sse` traffic of the same shape: contents, a system instruction,
//! three function declarations; its stream is five chunks, `usageMetadata` on each).
//!
//! Method. The stub is in this process: a thread per connection, answering each request at
//! once with a canned reply of the Messages API, whole (JSON with usage) or streamed (nine
//! server-sent events: `message_start`, a text block in five deltas, `message_delta` with its
//! cumulative usage, `message_stop`), each event written and flushed on its own. The daemon is
//! the release `promptd serve` with the bundled identity, persona and workspace plugins,
//! `[gateway] enabled`, agent `coder` forwarding to the stub, on durable SQLite (each gateway
//! request appends its step, its `gateway/request` and its reply). Each client thread holds one
//! keep-alive connection and runs a conversation the way an SDK agent does: every request
//! resends the history with the last reply and a new user message (system blocks with a
//! `cache_control`, three tools, an `x-promptd-fact-cwd` header), starting a new conversation
//! every 20 requests. Closed loop: a thread sends its next request when the last one is read.
//!
//! Measured per scenario, direct then gateway: latency from the first byte written to the last
//! byte read (p50, p99), time to the first byte of the body (streamed), requests per second,
//! and for the gateway the daemon's CPU time per request (/proc utime + stime over the window;
//! the stub and the clients share the same two cores). Added latency is gateway − direct at
//! the same percentile. RSS per open stream: with 64 streams held open by the stub (it pauses
//! after the first event), (daemon RSS − its RSS idle) / 64.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use promptd_testkit::bench::{
    binaries, env_or, fmt_duration, fmt_mib, percentile, scratch, Binary, Daemon, Table,
    RUST_PLUGINS,
};

/// Requests per conversation before a client starts another.
const TURNS: usize = 20;

/// The canned whole reply.
const REPLY: &str = r#"{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Done: the file is read and the answer is ready."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1200,"cache_creation_input_tokens":0,"cache_read_input_tokens":4096,"output_tokens":12}}"#;

/// The canned stream's events.
fn stream_events() -> Vec<String> {
    let mut events = vec![
        ("message_start", r#"{"type":"message_start","message":{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1200,"cache_creation_input_tokens":0,"cache_read_input_tokens":4096,"output_tokens":1}}}"#.to_string()),
        ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_string()),
    ];
    for piece in [
        "Done: ",
        "the file ",
        "is read ",
        "and the answer ",
        "is ready.",
    ] {
        events.push((
            "content_block_delta",
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{piece}"}}}}"#),
        ));
    }
    events.push((
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#.to_string(),
    ));
    events.push(("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":12}}"#.to_string()));
    events.push(("message_stop", r#"{"type":"message_stop"}"#.to_string()));
    events
        .into_iter()
        .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
        .collect()
}

/// The canned whole Gemini reply.
const GEMINI_REPLY: &str = r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Done: the file is read and the answer is ready."}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":5296,"cachedContentTokenCount":4096,"candidatesTokenCount":12,"totalTokenCount":5308},"modelVersion":"gemini-2.5-flash"}"#;

/// The canned Gemini stream's chunks (`alt=sse`): the text in five pieces, cumulative usage
/// on each, the finish reason on the last.
fn gemini_events() -> Vec<String> {
    let pieces = [
        "Done: ",
        "the file ",
        "is read ",
        "and the answer ",
        "is ready.",
    ];
    (pieces.iter().enumerate())
        .map(|(i, piece)| {
            let finish = if i + 1 == pieces.len() { r#","finishReason":"STOP""# } else { "" };
            format!(
                "data: {{\"candidates\":[{{\"content\":{{\"role\":\"model\",\"parts\":[{{\"text\":\"{piece}\"}}]}}{finish},\"index\":0}}],\"usageMetadata\":{{\"promptTokenCount\":5296,\"cachedContentTokenCount\":4096,\"candidatesTokenCount\":{},\"totalTokenCount\":{}}},\"modelVersion\":\"gemini-2.5-flash\"}}\r\n\r\n",
                2 * i + 2,
                5296 + 2 * i + 2
            )
        })
        .collect()
}

/// The canned whole Bedrock Converse reply.
const BEDROCK_REPLY: &str = r#"{"output":{"message":{"role":"assistant","content":[{"text":"Done: the file is read and the answer is ready."}]}},"stopReason":"end_turn","usage":{"inputTokens":1200,"outputTokens":12,"totalTokens":5308,"cacheReadInputTokens":4096,"cacheWriteInputTokens":0},"metrics":{"latencyMs":120}}"#;

/// The canned Bedrock `converse-stream` frames: the text in five deltas, then `messageStop`
/// and `metadata` with the usage, each an AWS event-stream frame with its CRCs.
fn bedrock_events() -> Vec<Vec<u8>> {
    use promptd_core::gateway::eventstream::event;
    let mut frames = vec![event("messageStart", r#"{"role":"assistant"}"#)];
    for piece in [
        "Done: the ",
        "file is read ",
        "and the ",
        "answer is ",
        "ready.",
    ] {
        frames.push(event(
            "contentBlockDelta",
            &format!(r#"{{"contentBlockIndex":0,"delta":{{"text":"{piece}"}}}}"#),
        ));
    }
    frames.push(event("contentBlockStop", r#"{"contentBlockIndex":0}"#));
    frames.push(event("messageStop", r#"{"stopReason":"end_turn"}"#));
    frames.push(event(
        "metadata",
        r#"{"usage":{"inputTokens":1200,"outputTokens":12,"totalTokens":5308,"cacheReadInputTokens":4096,"cacheWriteInputTokens":0},"metrics":{"latencyMs":120}}"#,
    ));
    frames
}

/// The stub upstream: a thread per connection.
struct Stub {
    url: String,
    /// Set: streams pause after their first event until it is cleared.
    hold: Arc<AtomicBool>,
}

fn start_stub() -> Stub {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stub");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let hold = Arc::new(AtomicBool::new(false));
    let held = hold.clone();
    std::thread::spawn(move || {
        let bytes = |events: Vec<String>| events.into_iter().map(String::into_bytes).collect();
        let events = Arc::new([
            bytes(stream_events()),
            bytes(gemini_events()),
            bedrock_events(),
        ]);
        for conn in listener.incoming().flatten() {
            let (events, held) = (events.clone(), held.clone());
            std::thread::spawn(move || serve_stub(conn, &events, &held));
        }
    });
    Stub { url, hold }
}

/// `events`: Anthropic's stream, Gemini's, then Bedrock's (binary event-stream frames).
fn serve_stub(conn: TcpStream, events: &[Vec<Vec<u8>>; 3], hold: &AtomicBool) {
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut out = conn;
    while let Some((head, body)) = read_request(&mut reader) {
        let line = head.lines().next().unwrap_or("");
        let (gemini, bedrock) = (line.contains("Content"), line.contains("/model/"));
        let streamed = memchr(&body, b"\"stream\":true")
            || head.contains(":streamGenerateContent")
            || line.contains("/converse-stream");
        let (events, reply, kind) = match (gemini, bedrock) {
            (true, _) => (&events[1], GEMINI_REPLY, "text/event-stream"),
            (_, true) => (
                &events[2],
                BEDROCK_REPLY,
                "application/vnd.amazon.eventstream",
            ),
            _ => (&events[0], REPLY, "text/event-stream"),
        };
        let ok = if streamed {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n"
            );
            let mut ok = out.write_all(head.as_bytes()).is_ok();
            for (i, event) in events.iter().enumerate() {
                let mut chunk = format!("{:x}\r\n", event.len()).into_bytes();
                chunk.extend_from_slice(event);
                chunk.extend_from_slice(b"\r\n");
                ok = ok && out.write_all(&chunk).is_ok() && out.flush().is_ok();
                while i == 0 && hold.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            ok && out.write_all(b"0\r\n\r\n").is_ok()
        } else {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                reply.len()
            );
            out.write_all(head.as_bytes()).is_ok() && out.write_all(reply.as_bytes()).is_ok()
        };
        if !ok {
            return;
        }
    }
}

fn memchr(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Reads one request: its head and its body (by content-length).
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// One keep-alive connection, timing each exchange.
struct Conn {
    reader: BufReader<TcpStream>,
    out: TcpStream,
    host: String,
}

/// What one exchange took.
struct Timed {
    total: Duration,
    first_byte: Duration,
}

impl Conn {
    fn open(url: &str) -> Conn {
        let host = url.trim_start_matches("http://").to_string();
        let out = TcpStream::connect(&host).expect("connect");
        out.set_nodelay(true).unwrap();
        out.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Conn {
            reader: BufReader::new(out.try_clone().unwrap()),
            out,
            host,
        }
    }

    fn post(&mut self, path: &str, body: &str) -> Timed {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\nx-api-key: sk-ant-bench\r\nanthropic-version: 2023-06-01\r\nx-promptd-fact-cwd: /src/app\r\ncontent-length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        let started = Instant::now();
        self.out.write_all(request.as_bytes()).expect("send");
        let mut status = String::new();
        self.reader.read_line(&mut status).expect("status line");
        assert!(status.starts_with("HTTP/1.1 200"), "{path}: {status}");
        let (mut length, mut chunked) = (None, false);
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).expect("header");
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse::<usize>().ok();
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut first_byte = None;
        if chunked {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size).expect("chunk size");
                let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
                first_byte.get_or_insert_with(|| started.elapsed());
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
            }
        } else {
            let mut body = vec![0; length.expect("a length")];
            self.reader.read_exact(&mut body[..1]).expect("body");
            first_byte = Some(started.elapsed());
            self.reader.read_exact(&mut body[1..]).expect("body");
        }
        Timed {
            total: started.elapsed(),
            first_byte: first_byte.unwrap_or_default(),
        }
    }
}

/// The body an Anthropic SDK agent sends at `turn` of a conversation.
fn body(conversation: u64, turn: usize, stream: bool) -> String {
    let mut messages = Vec::new();
    for t in 0..=turn {
        messages.push(format!(
            r#"{{"role":"user","content":[{{"type":"text","text":"Conversation {conversation}, turn {t}: look at src/main.rs and tell me what the handler at line {t} returns."}}]}}"#
        ));
        if t < turn {
            messages.push(r#"{"role":"assistant","content":[{"type":"text","text":"Done: the file is read and the answer is ready."}]}"#.to_string());
        }
    }
    let tools = ["read_file", "list_dir", "run_command"]
        .map(|t| format!(r#"{{"name":"{t}","description":"{t} on the workspace.","input_schema":{{"type":"object","properties":{{"path":{{"type":"string"}}}},"required":["path"]}}}}"#))
        .join(",");
    format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":4096,"system":[{{"type":"text","text":"You are a coding agent. Work in small steps and explain each change.","cache_control":{{"type":"ephemeral"}}}}],"tools":[{tools}],"messages":[{}],"metadata":{{"user_id":"bench"}}{}}}"#,
        messages.join(","),
        if stream { r#","stream":true"# } else { "" }
    )
}

/// The body a Gemini SDK agent (google-genai) sends at `turn` of a conversation: the same
/// conversation as [`body`]'s (the stream is asked for by the method, not the body).
fn gemini_body(conversation: u64, turn: usize) -> String {
    let mut contents = Vec::new();
    for t in 0..=turn {
        contents.push(format!(
            r#"{{"role":"user","parts":[{{"text":"Conversation {conversation}, turn {t}: look at src/main.rs and tell me what the handler at line {t} returns."}}]}}"#
        ));
        if t < turn {
            contents.push(r#"{"role":"model","parts":[{"text":"Done: the file is read and the answer is ready."}]}"#.to_string());
        }
    }
    let tools = ["read_file", "list_dir", "run_command"]
        .map(|t| format!(r#"{{"name":"{t}","description":"{t} on the workspace.","parameters":{{"type":"OBJECT","properties":{{"path":{{"type":"STRING"}}}},"required":["path"]}}}}"#))
        .join(",");
    format!(
        r#"{{"contents":[{}],"systemInstruction":{{"parts":[{{"text":"You are a coding agent. Work in small steps and explain each change."}}]}},"tools":[{{"functionDeclarations":[{tools}]}}],"generationConfig":{{"maxOutputTokens":4096}}}}"#,
        contents.join(",")
    )
}

/// The body a boto3 agent sends to Converse at `turn` of a conversation: the same
/// conversation as [`body`]'s (the stream is asked for by the path).
fn bedrock_body(conversation: u64, turn: usize) -> String {
    let mut messages = Vec::new();
    for t in 0..=turn {
        messages.push(format!(
            r#"{{"role":"user","content":[{{"text":"Conversation {conversation}, turn {t}: look at src/main.rs and tell me what the handler at line {t} returns."}}]}}"#
        ));
        if t < turn {
            messages.push(r#"{"role":"assistant","content":[{"text":"Done: the file is read and the answer is ready."}]}"#.to_string());
        }
    }
    let tools = ["read_file", "list_dir", "run_command"]
        .map(|t| format!(r#"{{"toolSpec":{{"name":"{t}","description":"{t} on the workspace.","inputSchema":{{"json":{{"type":"object","properties":{{"path":{{"type":"string"}}}},"required":["path"]}}}}}}}}"#))
        .join(",");
    format!(
        r#"{{"messages":[{}],"system":[{{"text":"You are a coding agent. Work in small steps and explain each change."}},{{"cachePoint":{{"type":"default"}}}}],"toolConfig":{{"tools":[{tools}]}},"inferenceConfig":{{"maxTokens":4096}}}}"#,
        messages.join(",")
    )
}

/// The provider API a scenario speaks.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    Anthropic,
    Gemini,
    Bedrock,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
            Api::Bedrock => "bedrock",
        }
    }

    /// The path after the gateway's prefix (and on the stub).
    fn path(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Api::Anthropic, _) => "/v1/messages",
            (Api::Gemini, false) => "/v1beta/models/gemini-2.5-flash:generateContent",
            (Api::Gemini, true) => "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            (Api::Bedrock, false) => "/model/amazon.nova-lite-v1%3A0/converse",
            (Api::Bedrock, true) => "/model/amazon.nova-lite-v1%3A0/converse-stream",
        }
    }

    fn body(self, conversation: u64, turn: usize, stream: bool) -> String {
        match self {
            Api::Anthropic => body(conversation, turn, stream),
            Api::Gemini => gemini_body(conversation, turn),
            Api::Bedrock => bedrock_body(conversation, turn),
        }
    }
}

/// What one scenario measured on one path.
struct Measured {
    totals: Vec<Duration>,
    first_bytes: Vec<Duration>,
    elapsed: Duration,
}

fn run(
    api: Api,
    url: &str,
    path: &str,
    clients: usize,
    stream: bool,
    warmup: Duration,
    secs: Duration,
) -> Measured {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (barrier, stop, measuring) = (barrier.clone(), stop.clone(), measuring.clone());
            let (url, path) = (url.to_string(), path.to_string());
            std::thread::spawn(move || {
                let mut conn = Conn::open(&url);
                let (mut totals, mut first_bytes) = (Vec::new(), Vec::new());
                barrier.wait();
                let mut n = 0usize;
                let conversation_base = (c as u64) << 32;
                while !stop.load(Ordering::Acquire) {
                    let conversation = conversation_base + (n / TURNS) as u64;
                    let timed = conn.post(&path, &api.body(conversation, n % TURNS, stream));
                    if measuring.load(Ordering::Acquire) {
                        totals.push(timed.total);
                        first_bytes.push(timed.first_byte);
                    }
                    n += 1;
                }
                (totals, first_bytes)
            })
        })
        .collect();
    barrier.wait();
    std::thread::sleep(warmup);
    measuring.store(true, Ordering::Release);
    let started = Instant::now();
    std::thread::sleep(secs);
    measuring.store(false, Ordering::Release);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Release);
    let (mut totals, mut first_bytes) = (Vec::new(), Vec::new());
    for h in handles {
        let (t, f) = h.join().expect("client thread");
        totals.extend(t);
        first_bytes.extend(f);
    }
    totals.sort();
    first_bytes.sort();
    Measured {
        totals,
        first_bytes,
        elapsed,
    }
}

fn plugin_folder(dir: &Path, stub: &str) -> std::path::PathBuf {
    let config = promptd_testkit::bench::rust_plugin_folder(dir);
    // The gateway serves no agent whose scope gives it plugin tools (G4).
    assert!(RUST_PLUGINS.contains(&"tools"));
    std::fs::remove_file(dir.join("tools.wasm")).expect("remove tools.wasm");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[gateway]\nenabled = true\n[gateway.upstream.anthropic]\nprovider = \"anthropic\"\nbase_url = \"{stub}\"\n[gateway.upstream.google]\nprovider = \"gemini\"\nbase_url = \"{stub}\"\n[gateway.upstream.aws]\nprovider = \"bedrock\"\nbase_url = \"{stub}\"\naws_access_key_id_env = \"BENCH_AWS_ACCESS_KEY_ID\"\naws_secret_access_key_env = \"BENCH_AWS_SECRET_ACCESS_KEY\"\naws_region = \"us-east-1\"\n[agents.coder.gateway]\n"
    ));
    std::fs::write(&config, text).unwrap();
    config
}

fn added(gateway: Duration, direct: Duration) -> String {
    let (g, d) = (gateway.as_secs_f64(), direct.as_secs_f64());
    format!("{:+.3} ms", (g - d) * 1000.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let secs = Duration::from_secs(env_or("GATEWAY_SECS", 5));
    let warmup = Duration::from_secs(env_or("GATEWAY_WARMUP_SECS", 1));
    let clients: Vec<usize> = std::env::var("GATEWAY_CLIENTS")
        .unwrap_or_else(|_| "1,16,64".into())
        .split(',')
        .map(|c| c.trim().parse().expect("GATEWAY_CLIENTS: numbers"))
        .collect();
    let apis: Vec<Api> = std::env::var("GATEWAY_PROVIDERS")
        .unwrap_or_else(|_| "anthropic".into())
        .split(',')
        .map(|p| match p.trim() {
            "anthropic" => Api::Anthropic,
            "gemini" => Api::Gemini,
            "bedrock" => Api::Bedrock,
            other => panic!("GATEWAY_PROVIDERS: `{other}` is not anthropic, gemini or bedrock"),
        })
        .collect();
    let stub = start_stub();
    let bin: Binary = binaries().remove(0);
    let mut table = Table::new(&[
        "api",
        "clients",
        "stream",
        "direct p50",
        "direct p99",
        "gateway p50",
        "gateway p99",
        "added p50",
        "added p99",
        "added TTFB p50",
        "added TTFB p99",
        "req/s direct",
        "req/s gateway",
        "daemon CPU/req",
    ]);
    let mut rss_line = String::new();
    for (&api, &n) in apis
        .iter()
        .flat_map(|a| clients.iter().map(move |n| (a, n)))
    {
        for stream in [false, true] {
            let dir = scratch("gateway");
            let config = plugin_folder(&dir.path().join("plugins"), &stub.url);
            // Bedrock's requests are re-signed with these (G9): AWS's documented example keys.
            let daemon = Daemon::start_with_env(
                &bin,
                &dir.path().join("plugins"),
                &config,
                &dir.path().join("state"),
                &[
                    ("BENCH_AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
                    (
                        "BENCH_AWS_SECRET_ACCESS_KEY",
                        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                    ),
                ],
            );
            daemon.wait_ready();
            let path = api.path(stream);
            let direct = run(api, &stub.url, path, n, stream, warmup, secs);
            let cpu_before = daemon.cpu_seconds();
            let through = format!("/gateway/coder{path}");
            let gateway = run(api, &daemon.url, &through, n, stream, warmup, secs);
            let cpu = daemon.cpu_seconds() - cpu_before;
            // The CPU window includes the warm-up's requests too: count them by rate.
            let per_req = cpu
                / ((gateway.totals.len() as f64)
                    * (1.0 + warmup.as_secs_f64() / gateway.elapsed.as_secs_f64()));
            let p = |v: &[Duration], q: f64| percentile(v, q);
            table.row(vec![
                api.name().to_string(),
                n.to_string(),
                stream.to_string(),
                fmt_duration(p(&direct.totals, 0.5)),
                fmt_duration(p(&direct.totals, 0.99)),
                fmt_duration(p(&gateway.totals, 0.5)),
                fmt_duration(p(&gateway.totals, 0.99)),
                added(p(&gateway.totals, 0.5), p(&direct.totals, 0.5)),
                added(p(&gateway.totals, 0.99), p(&direct.totals, 0.99)),
                if stream {
                    added(p(&gateway.first_bytes, 0.5), p(&direct.first_bytes, 0.5))
                } else {
                    "-".into()
                },
                if stream {
                    added(p(&gateway.first_bytes, 0.99), p(&direct.first_bytes, 0.99))
                } else {
                    "-".into()
                },
                format!(
                    "{:.0}",
                    direct.totals.len() as f64 / direct.elapsed.as_secs_f64()
                ),
                format!(
                    "{:.0}",
                    gateway.totals.len() as f64 / gateway.elapsed.as_secs_f64()
                ),
                format!("{:.3} ms", per_req * 1000.0),
            ]);
            if api == Api::Anthropic && stream && n == *clients.iter().max().unwrap() {
                rss_line = open_streams(&daemon, &stub, n);
            }
            daemon.stop();
        }
    }
    table.print();
    println!("{rss_line}");
}

/// RSS per open stream: `n` streams held open after their first event.
fn open_streams(daemon: &Daemon, stub: &Stub, n: usize) -> String {
    let idle = daemon.rss_kib();
    stub.hold.store(true, Ordering::Release);
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|c| {
            let (url, barrier) = (daemon.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::open(&url);
                barrier.wait();
                conn.post(
                    "/gateway/coder/v1/messages",
                    &body(1 << 40 | c as u64, 0, true),
                );
            })
        })
        .collect();
    barrier.wait();
    std::thread::sleep(Duration::from_secs(2));
    let open = daemon.rss_kib();
    stub.hold.store(false, Ordering::Release);
    for h in handles {
        h.join().expect("stream thread");
    }
    format!(
        "RSS with {n} streams open: {} (idle {}): {:.1} KiB per open stream",
        fmt_mib(open),
        fmt_mib(idle),
        (open.saturating_sub(idle)) as f64 / n as f64
    )
}
