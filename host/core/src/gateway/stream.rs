//! A streamed reply read back into the reply it stands for (G5): server-sent events cut into
//! frames as they arrive ([`Frames`]), and each provider's events folded into its unstreamed
//! reply ([`Reassembly`]), by the providers' documented rules: OpenAI chat tool-call
//! fragments keyed by `index` (only the first carries `id` and name), usage in the last chunk;
//! Responses' `response.completed`; Anthropic's `message_start` usage, then `message_delta`
//! usage that is cumulative (assigned, never added).

use serde_json::{Map, Value};

use super::{GatewayError, Ingress};

/// The largest frame the gateway holds (a Responses `response.completed` carries the whole
/// reply): past it the stream is refused as invalid rather than buffered without bound.
pub const MAX_FRAME: usize = 32 << 20;

/// Cuts a byte stream into server-sent event frames. Holds at most one frame's bytes.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
}

/// One server-sent event: its bytes as they came (blank line included), and its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The frame's bytes, forwarded as they are.
    pub raw: Vec<u8>,
    /// Its `event:` field.
    pub event: Option<String>,
    /// Its `data:` lines joined by `\n` (none: a comment or keep-alive).
    pub data: Option<String>,
}

impl Frames {
    /// Takes `chunk`, returns the frames it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Frame>, GatewayError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = frame_end(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end).collect();
            out.push(Frame::parse(raw)?);
        }
        if self.buf.len() > MAX_FRAME {
            return Err(GatewayError::InvalidStream(format!(
                "a frame passed {MAX_FRAME} bytes without its closing blank line"
            )));
        }
        Ok(out)
    }

    /// The bytes of an unfinished frame left when the stream ended.
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }

    /// Checks what is left when the stream ended: an error naming the line that is no
    /// server-sent event field, if one is there.
    pub fn finish(&self) -> Result<(), GatewayError> {
        Frame::parse(self.buf.clone()).map(|_| ())
    }
}

/// Where the first frame of `buf` ends (after its blank line), if it is whole.
fn frame_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            match buf.get(i + 1) {
                Some(b'\n') => return Some(i + 2),
                Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => return Some(i + 3),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

impl Frame {
    fn parse(raw: Vec<u8>) -> Result<Frame, GatewayError> {
        let text = std::str::from_utf8(&raw)
            .map_err(|_| GatewayError::InvalidStream("a frame is not UTF-8".into()))?;
        let mut event = None;
        let mut data: Option<String> = None;
        for line in text.lines() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => event = Some(value.to_string()),
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                "id" | "retry" => {}
                _ => {
                    return Err(GatewayError::InvalidStream(format!(
                        "a line that is no server-sent event field: {:?}",
                        truncate(line)
                    )))
                }
            }
        }
        Ok(Frame { raw, event, data })
    }

    /// The frame's data as JSON, when it is (OpenAI's `[DONE]` is not).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(self.data.as_deref()?).ok()
    }
}

fn truncate(line: &str) -> &str {
    let mut end = line.len().min(80);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// The reply a stream stands for, folded from its frames.
#[derive(Debug)]
pub struct Reassembly {
    ingress: Ingress,
    reply: Map<String, Value>,
    /// Chat: choices by index; Anthropic: content blocks by index.
    parts: Vec<Map<String, Value>>,
    /// The JSON text of each Anthropic tool_use input or Chat call's arguments, by index.
    pieces: Vec<(usize, usize, String)>,
    done: bool,
    error: Option<String>,
    /// Bedrock: its events, folded apart (they come framed in binary, not as SSE).
    bedrock: super::bedrock::Fold,
}

/// What a stream amounted to.
#[derive(Debug, Clone, PartialEq)]
pub struct Reassembled {
    /// The reply as the unstreamed call would have answered it (as far as it came).
    pub reply: Value,
    /// Whether the stream reached its end event.
    pub complete: bool,
    /// An error the upstream sent in the stream.
    pub error: Option<String>,
}

impl Reassembly {
    /// A reassembly of a reply to `ingress`.
    pub fn new(ingress: Ingress) -> Reassembly {
        Reassembly {
            ingress,
            reply: Map::new(),
            parts: Vec::new(),
            pieces: Vec::new(),
            done: false,
            error: None,
            bedrock: super::bedrock::Fold::default(),
        }
    }

    /// Folds one Bedrock event-stream frame in (G5).
    pub fn push_event(&mut self, frame: &super::eventstream::Message) {
        self.bedrock.push(frame);
    }

    /// Folds one frame in.
    pub fn push(&mut self, frame: &Frame) {
        if frame.data.as_deref() == Some("[DONE]") {
            self.done = true;
            return;
        }
        let Some(Value::Object(event)) = frame.json() else {
            return;
        };
        match self.ingress {
            Ingress::ChatCompletions => self.chat(event),
            Ingress::Responses => self.responses(frame.event.as_deref(), event),
            Ingress::Messages | Ingress::CountTokens => self.anthropic(event),
            Ingress::GenerateContent | Ingress::StreamGenerateContent => {
                let folded = super::gemini::fold(&mut self.reply, event);
                // No end event: a candidate's `finishReason` is the stream's last word.
                self.done |= folded.finished;
                if folded.error.is_some() {
                    self.error = folded.error;
                }
            }
            // Framed in binary: read by `push_event`.
            Ingress::Converse | Ingress::ConverseStream => {}
        }
    }

    /// The reply, as far as the stream came.
    pub fn finish(mut self) -> Reassembled {
        for (part, index, text) in std::mem::take(&mut self.pieces) {
            self.set_piece(part, index, text);
        }
        let parts = std::mem::take(&mut self.parts);
        match self.ingress {
            Ingress::ChatCompletions => {
                self.reply
                    .insert("object".into(), Value::from("chat.completion"));
                let choices = parts.into_iter().map(chat_choice).collect();
                self.reply.insert("choices".into(), Value::Array(choices));
            }
            Ingress::Messages | Ingress::CountTokens => {
                let content = parts.into_iter().map(Value::Object).collect();
                self.reply.insert("content".into(), Value::Array(content));
            }
            Ingress::Converse | Ingress::ConverseStream => {
                let (reply, complete, error) = std::mem::take(&mut self.bedrock).finish();
                return Reassembled {
                    reply,
                    complete,
                    error,
                };
            }
            Ingress::Responses | Ingress::GenerateContent | Ingress::StreamGenerateContent => {}
        }
        Reassembled {
            reply: Value::Object(self.reply),
            complete: self.done,
            error: self.error,
        }
    }

    fn part(&mut self, index: usize) -> &mut Map<String, Value> {
        if self.parts.len() <= index {
            self.parts.resize_with(index + 1, Map::new);
        }
        &mut self.parts[index]
    }

    fn piece(&mut self, part: usize, index: usize) -> &mut String {
        let at = match self
            .pieces
            .iter()
            .position(|(p, i, _)| *p == part && *i == index)
        {
            Some(at) => at,
            None => {
                self.pieces.push((part, index, String::new()));
                self.pieces.len() - 1
            }
        };
        &mut self.pieces[at].2
    }

    /// Puts a call's collected JSON text where the unstreamed reply has it.
    fn set_piece(&mut self, part: usize, index: usize, text: String) {
        match self.ingress {
            Ingress::ChatCompletions => {
                let message = message_of(self.part(part));
                if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
                    if let Some(Value::Object(call)) = calls.get_mut(index) {
                        if let Some(Value::Object(function)) = call.get_mut("function") {
                            function.insert("arguments".into(), Value::String(text));
                        }
                    }
                }
            }
            _ => {
                let block = self.part(part);
                let input = if text.trim().is_empty() {
                    Value::Object(Map::new())
                } else {
                    serde_json::from_str(&text).unwrap_or(Value::String(text))
                };
                block.insert("input".into(), input);
            }
        }
    }

    fn chat(&mut self, mut event: Map<String, Value>) {
        if let Some(usage) = event.remove("usage").filter(|u| !u.is_null()) {
            self.reply.insert("usage".into(), usage); // the last chunk's wins
        }
        let choices = match event.remove("choices") {
            Some(Value::Array(choices)) => choices,
            _ => Vec::new(),
        };
        for key in [
            "id",
            "created",
            "model",
            "system_fingerprint",
            "service_tier",
        ] {
            if let Some(v) = event.remove(key).filter(|v| !v.is_null()) {
                self.reply.entry(key).or_insert(v);
            }
        }
        for choice in choices {
            let Value::Object(mut choice) = choice else {
                continue;
            };
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            let delta = match choice.remove("delta") {
                Some(Value::Object(d)) => d,
                _ => Map::new(),
            };
            let finish = choice.remove("finish_reason").filter(|v| !v.is_null());
            let logprobs = choice.remove("logprobs").filter(|v| !v.is_null());
            self.chat_delta(index, delta);
            let slot = self.part(index);
            slot.insert("index".into(), Value::from(index));
            if let Some(finish) = finish {
                slot.insert("finish_reason".into(), finish);
            }
            if let Some(logprobs) = logprobs {
                slot.insert("logprobs".into(), logprobs);
            }
        }
    }

    fn chat_delta(&mut self, index: usize, delta: Map<String, Value>) {
        for (key, value) in delta {
            match (key.as_str(), value) {
                (_, Value::Null) => {}
                ("tool_calls", Value::Array(calls)) => {
                    for call in calls {
                        self.chat_call(index, call);
                    }
                }
                ("content" | "refusal" | "reasoning_content", Value::String(text)) => {
                    let message = message_of(self.part(index));
                    match message.get_mut(&key) {
                        Some(Value::String(s)) => s.push_str(&text),
                        _ => {
                            message.insert(key, Value::String(text));
                        }
                    }
                }
                (_, value) => {
                    message_of(self.part(index)).insert(key, value);
                }
            }
        }
    }

    fn chat_call(&mut self, choice: usize, call: Value) {
        let Value::Object(mut call) = call else {
            return;
        };
        let at = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let function = match call.remove("function") {
            Some(Value::Object(f)) => f,
            _ => Map::new(),
        };
        let message = message_of(self.part(choice));
        let calls = match message
            .entry("tool_calls")
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(calls) => calls,
            other => {
                *other = Value::Array(Vec::new());
                let Value::Array(calls) = other else {
                    return;
                };
                calls
            }
        };
        if calls.len() <= at {
            calls.resize_with(
                at + 1,
                || serde_json::json!({"type": "function", "function": {}}),
            );
        }
        if let Value::Object(slot) = &mut calls[at] {
            for key in ["id", "type"] {
                if let Some(v) = call.remove(key).filter(|v| !v.is_null()) {
                    slot.insert(key.into(), v);
                }
            }
            if let Some(Value::Object(f)) = slot.get_mut("function") {
                if let Some(name) = function.get("name").filter(|v| !v.is_null()) {
                    f.insert("name".into(), name.clone());
                }
            }
        }
        if let Some(Value::String(args)) = function.get("arguments") {
            self.piece(choice, at).push_str(args);
        }
    }

    fn responses(&mut self, name: Option<&str>, mut event: Map<String, Value>) {
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .or(name)
            .unwrap_or("")
            .to_string();
        match kind.as_str() {
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(Value::Object(response)) = event.remove("response") {
                    self.reply = response;
                }
                self.done = true;
            }
            "response.created" | "response.in_progress" => {
                if let Some(Value::Object(response)) = event.remove("response") {
                    self.reply = response;
                }
            }
            "response.output_item.done" => {
                let index = event
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if let Some(item) = event.remove("item") {
                    let output = self
                        .reply
                        .entry("output")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(output) = output {
                        let index = index as usize;
                        if output.len() <= index {
                            output.resize(index + 1, Value::Null);
                        }
                        output[index] = item;
                    }
                }
            }
            "error" => self.error = Some(error_text(&Value::Object(event))),
            _ => {}
        }
    }

    fn anthropic(&mut self, mut event: Map<String, Value>) {
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        match kind.as_str() {
            "message_start" => {
                if let Some(Value::Object(message)) = event.remove("message") {
                    self.reply = message;
                }
            }
            "content_block_start" => {
                if let Some(Value::Object(block)) = event.remove("content_block") {
                    *self.part(index) = block;
                }
            }
            "content_block_delta" => {
                let Some(Value::Object(delta)) = event.remove("delta") else {
                    return;
                };
                let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                match kind {
                    "input_json_delta" => {
                        let piece = text("partial_json").to_string();
                        self.piece(index, 0).push_str(&piece);
                    }
                    "text_delta" => append(self.part(index), "text", text("text")),
                    "thinking_delta" => append(self.part(index), "thinking", text("thinking")),
                    "signature_delta" => {
                        let signature = Value::from(text("signature"));
                        self.part(index).insert("signature".into(), signature);
                    }
                    "citations_delta" => {
                        if let Some(citation) = delta.get("citation") {
                            let block = self.part(index);
                            let list = block
                                .entry("citations")
                                .or_insert_with(|| Value::Array(Vec::new()));
                            if let Value::Array(list) = list {
                                list.push(citation.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(Value::Object(delta)) = event.remove("delta") {
                    for (k, v) in delta {
                        self.reply.insert(k, v);
                    }
                }
                // Cumulative: each field the event carries replaces the one before.
                if let Some(Value::Object(usage)) = event.remove("usage") {
                    let total = self
                        .reply
                        .entry("usage")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(total) = total {
                        for (k, v) in usage.into_iter().filter(|(_, v)| !v.is_null()) {
                            total.insert(k, v);
                        }
                    }
                }
            }
            "message_stop" => self.done = true,
            "error" => self.error = Some(error_text(&Value::Object(event))),
            _ => {}
        }
    }
}

fn append(block: &mut Map<String, Value>, key: &str, text: &str) {
    match block.get_mut(key) {
        Some(Value::String(s)) => s.push_str(text),
        _ => {
            block.insert(key.into(), Value::from(text));
        }
    }
}

fn message_of(choice: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let message = choice
        .entry("message")
        .or_insert_with(|| Value::Object(Map::new()));
    if !message.is_object() {
        *message = Value::Object(Map::new());
    }
    match message {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

/// A chat choice as the unstreamed reply has it: its message's role and content always set.
fn chat_choice(mut choice: Map<String, Value>) -> Value {
    let message = message_of(&mut choice);
    message
        .entry("role")
        .or_insert_with(|| Value::from("assistant"));
    message.entry("content").or_insert(Value::Null);
    choice.entry("finish_reason").or_insert(Value::Null);
    Value::Object(choice)
}

fn error_text(event: &Value) -> String {
    let error = event.get("error").unwrap_or(event);
    error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| error.to_string())
}

/// What the client sees of a Chat frame when promptd asked for usage it did not (G5): the
/// usage chunk (no choices) is dropped, and the `"usage":null` member other chunks carry is cut
/// out of their bytes (nothing else of the frame changes). Any other frame passes as it came.
pub fn unasked_usage(frame: &Frame) -> Option<Vec<u8>> {
    let raw = &frame.raw;
    let Ok(text) = std::str::from_utf8(raw) else {
        return Some(raw.clone());
    };
    let Some(start) = text.find('{') else {
        return Some(raw.clone());
    };
    let end = text.rfind('}').map_or(text.len(), |e| e + 1);
    let Ok(chunk) = super::body::ClientBody::parse(&text.as_bytes()[start..end]) else {
        return Some(raw.clone());
    };
    let Some(usage) = chunk.member("usage") else {
        return Some(raw.clone());
    };
    let json = chunk.text;
    let no_choices = chunk
        .raw("choices")
        .map(|c| c.trim_start_matches('[').trim())
        == Some("]");
    // Usage on a chunk that also has choices (some servers) is cut out like a null: the
    // client did not ask for it.
    if &json[usage.value.clone()] != "null" && no_choices {
        return None;
    }
    // The member's bytes: its key back to the comma before it, or on to the comma after.
    let key = json[..usage.value.start]
        .rfind("\"usage\"")
        .unwrap_or(usage.value.start);
    let before = json[..key].trim_end();
    let (cut_start, cut_end) = if before.ends_with(',') {
        (before.len() - 1, usage.value.end)
    } else {
        let after = &json[usage.value.end..];
        let trimmed = after.trim_start();
        let skip = after.len() - trimmed.len() + usize::from(trimmed.starts_with(','));
        (key, usage.value.end + skip)
    };
    let mut out = Vec::with_capacity(raw.len());
    out.extend_from_slice(&raw[..start + cut_start]);
    out.extend_from_slice(&raw[start + cut_end..]);
    Some(out)
}
