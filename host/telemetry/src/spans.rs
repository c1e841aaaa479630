//! What the daemon tells telemetry about a step, a recorded message and a new session (plain
//! data), and the spans made of it, after the OpenTelemetry GenAI semantic conventions 1.42.0
//! (`gen_ai.*`, still marked as in development) with promptd's own attributes under
//! `promptd.*`, and the few OpenInference attributes Arize Phoenix reads (`session.id`,
//! `openinference.span.kind`, `llm.*`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use promptd_core::budget::Usage;
use promptd_core::cache::outcome::Outcome;
use promptd_core::cache::price::Cost;
use promptd_core::formats::replies::ProviderUsage;
use promptd_core::formats::Format;
use promptd_core::held::Held;

/// The GenAI attribute names used, as semantic conventions 1.42.0 define them (the release
/// whose schema the spans name; the GenAI conventions have since moved to their own repository,
/// and are still marked as in development).
pub mod semconv {
    #![allow(missing_docs)]
    pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.42.0";
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
    pub const GEN_AI_REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
    pub const GEN_AI_REQUEST_TOP_P: &str = "gen_ai.request.top_p";
    pub const GEN_AI_REQUEST_TOP_K: &str = "gen_ai.request.top_k";
    pub const GEN_AI_REQUEST_STOP_SEQUENCES: &str = "gen_ai.request.stop_sequences";
    pub const GEN_AI_REQUEST_SEED: &str = "gen_ai.request.seed";
    pub const GEN_AI_REQUEST_FREQUENCY_PENALTY: &str = "gen_ai.request.frequency_penalty";
    pub const GEN_AI_REQUEST_PRESENCE_PENALTY: &str = "gen_ai.request.presence_penalty";
    pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
    pub const GEN_AI_AGENT_NAME: &str = "gen_ai.agent.name";
    pub const GEN_AI_SYSTEM_INSTRUCTIONS: &str = "gen_ai.system_instructions";
    pub const GEN_AI_INPUT_MESSAGES: &str = "gen_ai.input.messages";
    pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read_input_tokens";
    pub const GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: &str =
        "gen_ai.usage.cache_creation_input_tokens";
    pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
    pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
}

/// One stage of a step or of a record, or one plugin call, as the daemon timed it.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    /// Assembling the plugins' contributions.
    Assembly,
    /// One call into a plugin during assembly.
    Call {
        /// The plugin's id.
        plugin: Arc<str>,
        /// The SHA-256 of its file.
        sha256: Option<Arc<str>>,
        /// What was asked (`evaluate`, `section`, …).
        what: &'static str,
    },
    /// One review hook.
    Review {
        /// The hook's plugin id.
        plugin: Arc<str>,
        /// The SHA-256 of its file.
        sha256: Option<Arc<str>>,
    },
    /// Measuring against the budget and trimming history.
    Budget,
    /// Appending to the session store.
    Append {
        /// Events appended.
        events: usize,
        /// `sqlite` or `postgresql`.
        store: &'static str,
    },
}

/// A [`Work`] with its times.
#[derive(Clone, Debug, PartialEq)]
pub struct Timed {
    /// What was done.
    pub work: Work,
    /// When it started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Why it failed, when it did.
    pub failed: Option<String>,
}

/// How the step's request compares with the previous step's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixFacts {
    /// Whether the previous request is a prefix of this one.
    pub kept: bool,
    /// Bytes of this step's compared stream, when a diff was computed.
    pub bytes: Option<usize>,
    /// Bytes the two streams share from their start, when a diff was computed.
    pub shared_bytes: Option<usize>,
    /// Where the streams first differ (`system`, ``tool `bash` ``…).
    pub first_difference: Option<String>,
    /// Why the prefix broke, first cause first (they name the plugin).
    pub causes: Vec<String>,
}

/// Texts, when `capture_content` is on (never a `data` plugin's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepContent {
    /// The system prompt.
    pub system: Option<String>,
    /// The messages the step added, as `gen_ai.input.messages` JSON.
    pub input_messages: String,
}

/// One step, as it ended (served or refused).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRecord {
    /// The session.
    pub session: Arc<str>,
    /// Its agent.
    pub agent: Arc<str>,
    /// The step's number; `None` when it was refused before it had one.
    pub step: Option<u64>,
    /// The format the request was rendered in.
    pub format: Option<Format>,
    /// The model the request names.
    pub model: Option<String>,
    /// Request settings, as `gen_ai.request.*` attributes.
    pub params: Vec<KeyValue>,
    /// When the daemon received it.
    pub start: Option<SystemTime>,
    /// When it answered.
    pub end: Option<SystemTime>,
    /// Its stages and plugin calls, in the order they started.
    pub timeline: Vec<Timed>,
    /// The error's code and message, when refused.
    pub error: Option<(String, String)>,
    /// Why a header was recorded (`initial`, `change`, `resume`), when one was.
    pub header_reason: Option<&'static str>,
    /// The header's prompt cache key.
    pub cache_key: Option<String>,
    /// The header's cache TTL (`5m`, `1h`).
    pub cache_ttl: Option<String>,
    /// Against the previous step; `None` on the first.
    pub prefix: Option<PrefixFacts>,
    /// What the step held back for a cache-cold point (K7).
    pub held: Vec<Held>,
    /// The contributions that kept their answer from an earlier step, without a call (W4):
    /// `plugin kind \`name\``.
    pub reused: Vec<String>,
    /// Bytes of the request body.
    pub request_bytes: usize,
    /// SHA-256 of the system prompt, and its bytes.
    pub system: Option<(String, usize)>,
    /// Where the step's spans go, when the caller asked already ([`crate::Telemetry::sample`]):
    /// the ids are hashes, not computed twice.
    pub sampled: Option<Sampled>,
    /// Each tool group's tokens: the tools one plugin gives (name, description and schema),
    /// by plugin id, in the agent's tokenizer.
    pub tool_groups: Arc<Vec<(Arc<str>, u64)>>,
    /// The client's trace context.
    pub parent: Option<crate::Parent>,
    /// Texts, when captured.
    pub content: Option<StepContent>,
}

/// A message recorded between steps: the model's reply (with what the provider reported) or a
/// tool's output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordRecord {
    /// The session.
    pub session: Arc<str>,
    /// Its agent.
    pub agent: Arc<str>,
    /// The step the message follows (the session's last).
    pub step: u64,
    /// The event's sequence number, when recorded.
    pub seq: Option<u64>,
    /// `assistant` or `tool`.
    pub role: &'static str,
    /// When the daemon received it.
    pub start: Option<SystemTime>,
    /// When it answered.
    pub end: Option<SystemTime>,
    /// Review hooks and the append.
    pub timeline: Vec<Timed>,
    /// The error's code and message, when refused.
    pub error: Option<(String, String)>,
    /// Usage the provider reported for a reply.
    pub usage: Option<ProviderUsage>,
    /// The reply's cache outcome.
    pub outcome: Option<Outcome>,
    /// What the reply's request cost, when its model has a price.
    pub cost: Option<Cost>,
    /// The model that answered, when the reply says.
    pub response_model: Option<String>,
    /// The reply's id, when it has one.
    pub response_id: Option<String>,
    /// Why the model stopped, when the reply says.
    pub finish_reasons: Vec<String>,
    /// The message as `gen_ai.output.messages` JSON, when captured.
    pub output_messages: Option<String>,
    /// The client's trace context.
    pub parent: Option<crate::Parent>,
}

/// `gen_ai.provider.name` of a format (1.42.0's well-known values), or of a dialect.
pub fn provider_name(format: Format, dialect: Option<&str>) -> &'static str {
    match format {
        Format::Openai => match dialect {
            Some("vllm") => "vllm",
            Some("llamacpp") => "llama.cpp",
            Some("ollama") => "ollama",
            _ => "openai",
        },
        Format::OpenaiResponses => "openai",
        Format::Anthropic => "anthropic",
        Format::Gemini => "gcp.gemini",
        Format::Bedrock => "aws.bedrock",
        Format::Neutral => "promptd",
    }
}

pub(crate) fn kv(key: impl Into<opentelemetry::Key>, value: impl Into<Value>) -> KeyValue {
    KeyValue::new(key, value)
}

pub(crate) fn strings(values: impl IntoIterator<Item = String>) -> Value {
    Value::Array(Array::String(
        values.into_iter().map(StringValue::from).collect(),
    ))
}

fn int(n: impl TryInto<i64>) -> Value {
    Value::I64(n.try_into().unwrap_or(i64::MAX))
}

/// Where a span sits: its trace, its parent and whether that parent is another process's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Place {
    pub trace: TraceId,
    pub parent: SpanId,
    pub remote: bool,
}

/// A session (or a client's trace) that is sampled, and where its spans go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled(pub(crate) Place);

/// What one finished span is made of, besides its instrumentation scope.
pub(crate) struct SpanParts {
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    /// Its trace and parent.
    pub place: Place,
    pub id: SpanId,
    /// When it started and ended (an end before the start is taken as the start).
    pub time: (SystemTime, SystemTime),
    pub attributes: Vec<KeyValue>,
    pub status: Status,
}

/// Builds one finished span.
pub(crate) fn span(scope: &opentelemetry::InstrumentationScope, parts: SpanParts) -> SpanData {
    let SpanParts {
        name,
        kind,
        place,
        id,
        time: (start, end),
        attributes,
        status,
    } = parts;
    SpanData {
        span_context: SpanContext::new(
            place.trace,
            id,
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: place.parent,
        parent_span_is_remote: place.remote,
        span_kind: kind,
        name,
        start_time: start,
        end_time: end.max(start),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

pub(crate) fn status(error: Option<&(String, String)>) -> Status {
    match error {
        Some((code, message)) => Status::error(format!("{code}: {message}")),
        None => Status::Unset,
    }
}

/// Attribute keys and texts made once and shared: a section's key, a plugin's id and hash are
/// the same every step, so a span takes a reference, not a copy (bounded: past its size the
/// table starts again).
#[derive(Debug, Default)]
pub struct Keys {
    /// Read by every step at once, written only on a miss: a read lock never waits on
    /// another reader.
    #[allow(clippy::type_complexity)]
    keys: std::sync::RwLock<
        std::collections::HashMap<
            &'static str,
            std::collections::HashMap<Box<str>, opentelemetry::Key>,
        >,
    >,
    texts: std::sync::RwLock<std::collections::HashMap<Box<str>, Arc<str>>>,
}

/// Most keys or texts a [`Keys`] holds.
const MAX_KEYS: usize = 8192;

impl Keys {
    /// The key `prefix` + `name`.
    pub fn get(&self, prefix: &'static str, name: &str) -> opentelemetry::Key {
        let known = self.keys.read().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = known.get(prefix).and_then(|keys| keys.get(name)) {
            return k.clone();
        }
        drop(known);
        let mut all = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let keys = all.entry(prefix).or_default();
        if keys.len() >= MAX_KEYS {
            keys.clear();
        }
        let key = opentelemetry::Key::from(format!("{prefix}{name}"));
        keys.insert(name.into(), key.clone());
        key
    }

    /// `text`, shared.
    pub fn text(&self, text: &str) -> Arc<str> {
        let known = self.texts.read().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = known.get(text) {
            return t.clone();
        }
        drop(known);
        let mut texts = self.texts.write().unwrap_or_else(|p| p.into_inner());
        if texts.len() >= MAX_KEYS {
            texts.clear();
        }
        let shared: Arc<str> = Arc::from(text);
        texts.insert(text.into(), shared.clone());
        shared
    }
}

/// The attributes of a step's `chat` span known when the step is answered.
pub(crate) fn step_attributes(
    r: &StepRecord,
    usage: Option<&Usage>,
    keys: &Keys,
    rebuild_url: Option<String>,
) -> Vec<KeyValue> {
    let mut a = Vec::with_capacity(40);
    a.push(kv(semconv::GEN_AI_OPERATION_NAME, "chat"));
    if let Some(format) = r.format {
        let dialect = r
            .params
            .iter()
            .find(|k| k.key.as_str() == "promptd.dialect");
        let dialect = dialect.map(|k| k.value.as_str().into_owned());
        a.push(kv(
            semconv::GEN_AI_PROVIDER_NAME,
            provider_name(format, dialect.as_deref()),
        ));
        a.push(kv("promptd.format", format.as_str()));
        a.push(kv(
            "llm.provider",
            provider_name(format, dialect.as_deref()),
        ));
    }
    if let Some(model) = &r.model {
        a.push(kv(semconv::GEN_AI_REQUEST_MODEL, model.clone()));
        a.push(kv("llm.model_name", model.clone()));
    }
    a.extend(
        r.params
            .iter()
            .filter(|k| k.key.as_str() != "promptd.dialect")
            .cloned(),
    );
    a.push(kv(semconv::GEN_AI_CONVERSATION_ID, r.session.clone()));
    a.push(kv(semconv::GEN_AI_AGENT_NAME, r.agent.clone()));
    a.push(kv("session.id", r.session.clone()));
    a.push(kv("openinference.span.kind", "LLM"));
    a.push(kv("promptd.session", r.session.clone()));
    a.push(kv("promptd.agent", r.agent.clone()));
    if let Some(n) = r.step {
        a.push(kv("promptd.step", int(n)));
    }
    a.push(kv(
        "promptd.header.reason",
        r.header_reason.unwrap_or("unchanged"),
    ));
    if let Some(key) = &r.cache_key {
        a.push(kv("promptd.cache.key", key.clone()));
    }
    if let Some(ttl) = &r.cache_ttl {
        a.push(kv("promptd.cache.ttl", ttl.clone()));
    }
    if let Some(p) = &r.prefix {
        prefix_attributes(&mut a, p);
    }
    if let Some(u) = usage {
        token_attributes(&mut a, r, u, keys);
    }
    a.push(kv("promptd.held.count", int(r.held.len())));
    if !r.held.is_empty() {
        a.push(kv(
            "promptd.held.parts",
            strings(r.held.iter().map(|h| {
                format!(
                    "{} `{}` of plugin `{}` since step {}",
                    h.kind.as_str(),
                    h.name,
                    h.plugin,
                    h.since_step
                )
            })),
        ));
        let kept: u64 = r.held.iter().map(|h| h.kept_bytes).sum();
        a.push(kv("promptd.held.kept_bytes", int(kept)));
    }
    a.push(kv("promptd.plugins.reused.count", int(r.reused.len())));
    if !r.reused.is_empty() {
        a.push(kv(
            "promptd.plugins.reused",
            strings(r.reused.iter().cloned()),
        ));
    }
    a.push(kv("promptd.request.bytes", int(r.request_bytes)));
    if let Some((sha, bytes)) = &r.system {
        a.push(kv("promptd.system.sha256", sha.clone()));
        a.push(kv("promptd.system.bytes", int(*bytes)));
    }
    if let Some(url) = rebuild_url {
        a.push(kv("promptd.request.url", url));
    }
    if let Some(c) = &r.content {
        if let Some(system) = &c.system {
            let parts = serde_json::json!([{"type": "text", "content": system}]);
            a.push(kv(semconv::GEN_AI_SYSTEM_INSTRUCTIONS, parts.to_string()));
        }
        a.push(kv(semconv::GEN_AI_INPUT_MESSAGES, c.input_messages.clone()));
        a.push(kv("input.value", c.input_messages.clone()));
        a.push(kv("input.mime_type", "application/json"));
    }
    if let Some((code, _)) = &r.error {
        a.push(kv("error.type", code.clone()));
    }
    a
}

/// A step's prefix facts as attributes: whether it kept the cached prefix and, when it broke,
/// where and why.
fn prefix_attributes(a: &mut Vec<KeyValue>, p: &PrefixFacts) {
    a.push(kv("promptd.prefix.kept", p.kept));
    if let Some(b) = p.bytes {
        a.push(kv("promptd.prefix.bytes", int(b)));
    }
    if let Some(b) = p.shared_bytes {
        a.push(kv("promptd.prefix.shared_bytes", int(b)));
    }
    if let Some(d) = &p.first_difference {
        a.push(kv("promptd.prefix.first_difference", d.clone()));
    }
    if let Some(c) = p.causes.first() {
        a.push(kv("promptd.prefix.cause", c.clone()));
        a.push(kv(
            "promptd.prefix.causes",
            strings(p.causes.iter().cloned()),
        ));
    }
}

/// A step's tokens as attributes: in total, per part, per section, context and tool group, and
/// what the budget dropped.
fn token_attributes(a: &mut Vec<KeyValue>, r: &StepRecord, u: &Usage, keys: &Keys) {
    a.push(kv("promptd.tokens.tokenizer", u.tokenizer.clone()));
    a.push(kv("promptd.tokens.total", int(u.total.tokens)));
    a.push(kv("promptd.tokens.system", int(u.system.tokens)));
    a.push(kv("promptd.tokens.tools", int(u.tools.tokens)));
    a.push(kv("promptd.tokens.messages", int(u.messages.tokens)));
    a.push(kv("promptd.tokens.snapshot", int(u.snapshot.tokens)));
    if u.deferred_tools.tokens > 0 {
        a.push(kv(
            "promptd.tokens.deferred_tools",
            int(u.deferred_tools.tokens),
        ));
    }
    for s in &u.sections {
        let key = keys.get("promptd.tokens.section.", &s.name);
        a.push(KeyValue::new(key, int(s.size.tokens)));
    }
    for c in &u.contexts {
        let key = keys.get("promptd.tokens.context.", &c.name);
        a.push(KeyValue::new(key, int(c.size.tokens)));
    }
    for (plugin, tokens) in r.tool_groups.iter() {
        let key = keys.get("promptd.tokens.tool_group.", plugin);
        a.push(KeyValue::new(key, int(*tokens)));
    }
    a.push(kv("promptd.messages", int(u.message_count)));
    if let Some(w) = u.window {
        a.push(kv("promptd.budget.window", int(w)));
    }
    if let Some(d) = &u.dropped {
        a.push(kv("promptd.budget.dropped_messages", int(d.messages)));
        a.push(kv("promptd.budget.dropped_tokens", int(d.size.tokens)));
    }
}

/// What a reply adds to its step's `chat` span.
pub(crate) fn reply_attributes(r: &RecordRecord) -> Vec<KeyValue> {
    let mut a = Vec::with_capacity(20);
    if let Some(u) = &r.usage {
        if let Some(n) = u.input_tokens {
            a.push(kv(semconv::GEN_AI_USAGE_INPUT_TOKENS, int(n)));
            a.push(kv("llm.token_count.prompt", int(n)));
        }
        if let Some(n) = u.output_tokens {
            a.push(kv(semconv::GEN_AI_USAGE_OUTPUT_TOKENS, int(n)));
            a.push(kv("llm.token_count.completion", int(n)));
        }
        if let (Some(i), Some(o)) = (u.input_tokens, u.output_tokens) {
            a.push(kv("llm.token_count.total", int(i + o)));
        }
        if let Some(n) = u.cached_tokens {
            a.push(kv(semconv::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, int(n)));
            a.push(kv("llm.token_count.prompt_details.cache_read", int(n)));
        }
        if let Some(n) = u.cache_write_tokens {
            a.push(kv(
                semconv::GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
                int(n),
            ));
            a.push(kv("llm.token_count.prompt_details.cache_write", int(n)));
        }
    }
    if let Some(m) = &r.response_model {
        a.push(kv(semconv::GEN_AI_RESPONSE_MODEL, m.clone()));
    }
    if let Some(id) = &r.response_id {
        a.push(kv(semconv::GEN_AI_RESPONSE_ID, id.clone()));
    }
    if !r.finish_reasons.is_empty() {
        a.push(kv(
            semconv::GEN_AI_RESPONSE_FINISH_REASONS,
            strings(r.finish_reasons.iter().cloned()),
        ));
    }
    if let Some(o) = &r.outcome {
        a.push(kv("promptd.cache.outcome", o.outcome.as_str()));
        a.push(kv("promptd.cache.expected_read", int(o.expected_read)));
        a.push(kv("promptd.cache.lost_tokens", int(o.lost)));
        if let Some(gap) = o.gap_ms {
            a.push(kv("promptd.cache.gap_ms", int(gap)));
        }
        if let Some(part) = &o.part {
            a.push(kv("promptd.cache.part", part.clone()));
        }
        if let Some(plugin) = &o.plugin {
            a.push(kv("promptd.cache.plugin", plugin.clone()));
        }
        if let Some(cause) = &o.cause {
            a.push(kv("promptd.cache.cause", cause.clone()));
        }
    }
    if let Some(c) = &r.cost {
        a.push(kv("promptd.cost.usd", c.total));
        a.push(kv("promptd.cost.input_usd", c.input));
        a.push(kv("promptd.cost.cache_read_usd", c.cache_read));
        a.push(kv("promptd.cost.cache_write_usd", c.cache_write));
        a.push(kv("promptd.cost.output_usd", c.output));
        a.push(kv("promptd.cost.miss_usd", c.miss));
    }
    if let Some(out) = &r.output_messages {
        a.push(kv(semconv::GEN_AI_OUTPUT_MESSAGES, out.clone()));
        a.push(kv("output.value", out.clone()));
        a.push(kv("output.mime_type", "application/json"));
    }
    a
}

/// A timed piece of work as an event on its parent: at its start, with its duration
/// (`promptd.duration_ms`) and its failure (`error.message`).
pub(crate) fn work_event(
    name: Cow<'static, str>,
    mut attributes: Vec<KeyValue>,
    t: &Timed,
) -> opentelemetry::trace::Event {
    let ms = t
        .end
        .duration_since(t.start)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3;
    attributes.push(kv("promptd.duration_ms", ms));
    if let Some(why) = &t.failed {
        attributes.push(kv("error.message", why.clone()));
    }
    opentelemetry::trace::Event::new(name, t.start, attributes, 0)
}

/// The name and attributes of a timed piece of work's span.
pub(crate) fn work_span(w: &Work) -> (Cow<'static, str>, Vec<KeyValue>) {
    let plugin = |id: &Arc<str>, sha: &Option<Arc<str>>, a: &mut Vec<KeyValue>| {
        a.push(kv("promptd.plugin.id", id.clone()));
        if let Some(sha) = sha {
            a.push(kv("promptd.plugin.sha256", sha.clone()));
        }
    };
    let mut a = Vec::with_capacity(4);
    let name: Cow<'static, str> = match w {
        Work::Assembly => {
            a.push(kv("openinference.span.kind", "CHAIN"));
            "promptd.assemble".into()
        }
        Work::Call {
            plugin: id,
            sha256,
            what,
        } => {
            plugin(id, sha256, &mut a);
            a.push(kv("promptd.plugin.call", *what));
            format!("promptd.plugin {id}").into()
        }
        Work::Review { plugin: id, sha256 } => {
            plugin(id, sha256, &mut a);
            format!("promptd.review {id}").into()
        }
        Work::Budget => "promptd.budget".into(),
        Work::Append { events, store } => {
            a.push(kv("promptd.store.events", int(*events)));
            a.push(kv("db.system.name", *store));
            "promptd.store.append".into()
        }
    };
    (name, a)
}

/// `messages` as `gen_ai.input.messages` / `gen_ai.output.messages` JSON (1.42.0's message
/// schema: `role` and `parts` of `text`, `tool_call`, `tool_call_response`, and `blob` or
/// `uri` for media, whose bytes are left out: only their type and size).
pub fn messages_json<'m>(
    messages: impl IntoIterator<Item = &'m promptd_core::conversation::Message>,
) -> String {
    use promptd_core::conversation::content::{Block, Content};
    use promptd_core::conversation::Message;
    use serde_json::{json, Value as Json};
    let content = |c: &Content| -> Vec<Json> {
        match c {
            Content::Text(t) => vec![json!({"type": "text", "content": t})],
            Content::Blocks(blocks) => blocks
                .iter()
                .map(|b| match b {
                    Block::Text { text } => json!({"type": "text", "content": text}),
                    Block::Image {
                        media_type,
                        data,
                        url,
                    } => match url {
                        Some(url) => json!({"type": "uri", "modality": "image", "uri": url}),
                        None => {
                            json!({"type": "blob", "modality": "image", "mime_type": media_type,
                            "bytes": data.as_ref().map_or(0, |d| d.len())})
                        }
                    },
                    other => {
                        let kind = serde_json::to_value(other)
                            .ok()
                            .and_then(|v| v.get("type").and_then(Json::as_str).map(str::to_string))
                            .unwrap_or_default();
                        json!({"type": "blob", "modality": kind})
                    }
                })
                .collect(),
        }
    };
    let out: Vec<Json> = messages
        .into_iter()
        .map(|m| match m {
            Message::User { content: c, .. } => json!({"role": "user", "parts": content(c)}),
            Message::Tool { tool_call_id, content: c, .. } => {
                let text: Vec<Json> = content(c);
                json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": tool_call_id, "response": text}]})
            }
            Message::Assistant { content: text, tool_calls, .. } => {
                let mut parts = Vec::new();
                if !text.is_empty() {
                    parts.push(json!({"type": "text", "content": text}));
                }
                for call in tool_calls {
                    parts.push(json!({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}));
                }
                json!({"role": "assistant", "parts": parts})
            }
        })
        .collect();
    Json::Array(out).to_string()
}

/// Attributes of the kinds a request setting takes, for callers without the OpenTelemetry API.
pub mod attr {
    use opentelemetry::KeyValue;

    /// An integer.
    pub fn int(key: &'static str, v: i64) -> KeyValue {
        KeyValue::new(key, v)
    }

    /// A float.
    pub fn float(key: &'static str, v: f64) -> KeyValue {
        KeyValue::new(key, v)
    }

    /// A string.
    pub fn string(key: &'static str, v: &str) -> KeyValue {
        KeyValue::new(key, v.to_string())
    }

    /// An array of strings.
    pub fn strings(key: &'static str, v: Vec<String>) -> KeyValue {
        KeyValue::new(key, super::strings(v))
    }
}
