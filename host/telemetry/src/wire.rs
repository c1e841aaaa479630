//! The OTLP trace request (`ExportTraceServiceRequest`, opentelemetry-proto's
//! `collector/trace/v1`) written as protobuf bytes straight from the SDK's [`SpanData`].
//!
//! Why not opentelemetry-otlp's span exporter: it first copies every span into
//! opentelemetry-proto's message structs (each attribute key and value allocated again) and
//! then encodes those; measured in process, that copy was about 40% of telemetry's CPU
//! (BENCHMARKS.md, issue 34). Here each message's length is computed from the span as it is,
//! then its fields are written once, with prost's wire primitives. The bytes decode to what the
//! SDK's own conversion makes, field for field (tested below against it).

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

/// Field numbers of opentelemetry-proto's messages, by message.
mod field {
    pub(super) const REQUEST_RESOURCE_SPANS: u32 = 1;
    pub(super) const RESOURCE_SPANS_RESOURCE: u32 = 1;
    pub(super) const RESOURCE_SPANS_SCOPE_SPANS: u32 = 2;
    pub(super) const RESOURCE_SPANS_SCHEMA_URL: u32 = 3;
    pub(super) const RESOURCE_ATTRIBUTES: u32 = 1;
    pub(super) const SCOPE_SPANS_SCOPE: u32 = 1;
    pub(super) const SCOPE_SPANS_SPANS: u32 = 2;
    pub(super) const SCOPE_SPANS_SCHEMA_URL: u32 = 3;
    pub(super) const SCOPE_NAME: u32 = 1;
    pub(super) const SCOPE_VERSION: u32 = 2;
    pub(super) const SCOPE_ATTRIBUTES: u32 = 3;
    pub(super) const SPAN_TRACE_ID: u32 = 1;
    pub(super) const SPAN_SPAN_ID: u32 = 2;
    pub(super) const SPAN_TRACE_STATE: u32 = 3;
    pub(super) const SPAN_PARENT_SPAN_ID: u32 = 4;
    pub(super) const SPAN_NAME: u32 = 5;
    pub(super) const SPAN_KIND: u32 = 6;
    pub(super) const SPAN_START: u32 = 7;
    pub(super) const SPAN_END: u32 = 8;
    pub(super) const SPAN_ATTRIBUTES: u32 = 9;
    pub(super) const SPAN_DROPPED_ATTRIBUTES: u32 = 10;
    pub(super) const SPAN_EVENTS: u32 = 11;
    pub(super) const SPAN_DROPPED_EVENTS: u32 = 12;
    pub(super) const SPAN_LINKS: u32 = 13;
    pub(super) const SPAN_DROPPED_LINKS: u32 = 14;
    pub(super) const SPAN_STATUS: u32 = 15;
    pub(super) const SPAN_FLAGS: u32 = 16;
    pub(super) const EVENT_TIME: u32 = 1;
    pub(super) const EVENT_NAME: u32 = 2;
    pub(super) const EVENT_ATTRIBUTES: u32 = 3;
    pub(super) const EVENT_DROPPED_ATTRIBUTES: u32 = 4;
    pub(super) const LINK_TRACE_ID: u32 = 1;
    pub(super) const LINK_SPAN_ID: u32 = 2;
    pub(super) const LINK_TRACE_STATE: u32 = 3;
    pub(super) const LINK_ATTRIBUTES: u32 = 4;
    pub(super) const LINK_DROPPED_ATTRIBUTES: u32 = 5;
    pub(super) const LINK_FLAGS: u32 = 6;
    pub(super) const STATUS_MESSAGE: u32 = 2;
    pub(super) const STATUS_CODE: u32 = 3;
    pub(super) const KEY_VALUE_KEY: u32 = 1;
    pub(super) const KEY_VALUE_VALUE: u32 = 2;
    pub(super) const ANY_STRING: u32 = 1;
    pub(super) const ANY_BOOL: u32 = 2;
    pub(super) const ANY_INT: u32 = 3;
    pub(super) const ANY_DOUBLE: u32 = 4;
    pub(super) const ANY_ARRAY: u32 = 5;
    pub(super) const ARRAY_VALUES: u32 = 1;
}

/// `SpanFlags`: the parent's remoteness is known, and it is remote.
const FLAGS_HAS_IS_REMOTE: u32 = 0x100;
const FLAGS_IS_REMOTE: u32 = 0x200;

/// The bytes of one `ExportTraceServiceRequest` carrying `spans` of `resource`, a
/// `ScopeSpans` per instrumentation scope in the order the scopes first appear.
pub(crate) fn request(resource: &Resource, spans: &[SpanData]) -> Vec<u8> {
    let mut scopes: Vec<(&InstrumentationScope, Vec<usize>)> = Vec::with_capacity(1);
    for (i, span) in spans.iter().enumerate() {
        match scopes
            .iter_mut()
            .find(|(s, _)| *s == &span.instrumentation_scope)
        {
            Some((_, members)) => members.push(i),
            None => scopes.push((&span.instrumentation_scope, vec![i])),
        }
    }
    let span_lens: Vec<usize> = spans.iter().map(span_len).collect();
    let resource_len = attributes_len(field::RESOURCE_ATTRIBUTES, resource.iter());
    let resource_schema = resource.schema_url().unwrap_or_default();
    let scope_lens: Vec<usize> = scopes
        .iter()
        .map(|(scope, members)| {
            message_len(field::SCOPE_SPANS_SCOPE, scope_len(scope))
                + members
                    .iter()
                    .map(|&i| message_len(field::SCOPE_SPANS_SPANS, span_lens[i]))
                    .sum::<usize>()
                + string_len(
                    field::SCOPE_SPANS_SCHEMA_URL,
                    scope.schema_url().unwrap_or_default(),
                )
        })
        .collect();
    let resource_spans_len = message_len(field::RESOURCE_SPANS_RESOURCE, resource_len)
        + scope_lens
            .iter()
            .map(|&l| message_len(field::RESOURCE_SPANS_SCOPE_SPANS, l))
            .sum::<usize>()
        + string_len(field::RESOURCE_SPANS_SCHEMA_URL, resource_schema);

    let mut out = Vec::with_capacity(message_len(
        field::REQUEST_RESOURCE_SPANS,
        resource_spans_len,
    ));
    let buf = &mut out;
    message_header(field::REQUEST_RESOURCE_SPANS, resource_spans_len, buf);
    message_header(field::RESOURCE_SPANS_RESOURCE, resource_len, buf);
    for (k, v) in resource.iter() {
        key_value(field::RESOURCE_ATTRIBUTES, k.as_str(), v, buf);
    }
    for ((scope, members), &len) in scopes.iter().zip(&scope_lens) {
        message_header(field::RESOURCE_SPANS_SCOPE_SPANS, len, buf);
        message_header(field::SCOPE_SPANS_SCOPE, scope_len(scope), buf);
        string(field::SCOPE_NAME, scope.name(), buf);
        string(
            field::SCOPE_VERSION,
            scope.version().unwrap_or_default(),
            buf,
        );
        for kv in scope.attributes() {
            key_value(field::SCOPE_ATTRIBUTES, kv.key.as_str(), &kv.value, buf);
        }
        for &i in members {
            message_header(field::SCOPE_SPANS_SPANS, span_lens[i], buf);
            span(&spans[i], buf);
        }
        string(
            field::SCOPE_SPANS_SCHEMA_URL,
            scope.schema_url().unwrap_or_default(),
            buf,
        );
    }
    string(field::RESOURCE_SPANS_SCHEMA_URL, resource_schema, buf);
    out
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn kind(k: &SpanKind) -> u64 {
    match k {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn flags(remote: bool, trace_flags: u8) -> u32 {
    u32::from(trace_flags) | FLAGS_HAS_IS_REMOTE | if remote { FLAGS_IS_REMOTE } else { 0 }
}

fn status(s: &Status) -> (u64, &str) {
    match s {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description),
    }
}

// Lengths: a field's whole size (key, length and body) as it is written; proto3 leaves out
// scalars at their default, as prost does.

fn message_len(tag: u32, body: usize) -> usize {
    key_len(tag) + encoded_len_varint(body as u64) + body
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        message_len(tag, s.len())
    }
}

fn varint_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

fn fixed64_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + 8
    }
}

fn fixed32_len(tag: u32, v: u32) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + 4
    }
}

fn any_len(v: &Value) -> usize {
    // A oneof's member is written even at its default.
    match v {
        Value::Bool(_) => key_len(field::ANY_BOOL) + 1,
        Value::I64(i) => key_len(field::ANY_INT) + encoded_len_varint(*i as u64),
        Value::F64(_) => key_len(field::ANY_DOUBLE) + 8,
        Value::String(s) => message_len(field::ANY_STRING, s.as_str().len()),
        Value::Array(a) => message_len(field::ANY_ARRAY, array_len(a)),
        other => message_len(field::ANY_STRING, other.as_str().len()),
    }
}

fn array_len(a: &Array) -> usize {
    let each = |v: Value| message_len(field::ARRAY_VALUES, any_len(&v));
    match a {
        Array::Bool(v) => v.iter().map(|&b| each(Value::Bool(b))).sum(),
        Array::I64(v) => v.iter().map(|&i| each(Value::I64(i))).sum(),
        Array::F64(v) => v.iter().map(|&f| each(Value::F64(f))).sum(),
        Array::String(v) => v
            .iter()
            .map(|s| {
                message_len(
                    field::ARRAY_VALUES,
                    message_len(field::ANY_STRING, s.as_str().len()),
                )
            })
            .sum(),
        _ => 0,
    }
}

fn key_value_len(key: &str, value: &Value) -> usize {
    string_len(field::KEY_VALUE_KEY, key) + message_len(field::KEY_VALUE_VALUE, any_len(value))
}

fn attributes_len<'a>(
    tag: u32,
    kvs: impl Iterator<Item = (&'a opentelemetry::Key, &'a Value)>,
) -> usize {
    kvs.map(|(k, v)| message_len(tag, key_value_len(k.as_str(), v)))
        .sum()
}

fn kvs_len(tag: u32, kvs: &[KeyValue]) -> usize {
    attributes_len(tag, kvs.iter().map(|kv| (&kv.key, &kv.value)))
}

fn scope_len(scope: &InstrumentationScope) -> usize {
    string_len(field::SCOPE_NAME, scope.name())
        + string_len(field::SCOPE_VERSION, scope.version().unwrap_or_default())
        + attributes_len(
            field::SCOPE_ATTRIBUTES,
            scope.attributes().map(|kv| (&kv.key, &kv.value)),
        )
}

fn status_len(s: &Status) -> usize {
    let (code, message) = status(s);
    string_len(field::STATUS_MESSAGE, message) + varint_len(field::STATUS_CODE, code)
}

fn span_len(s: &SpanData) -> usize {
    let c = &s.span_context;
    let state = c.trace_state().header();
    let parent = if s.parent_span_id == SpanId::INVALID {
        0
    } else {
        message_len(field::SPAN_PARENT_SPAN_ID, 8)
    };
    message_len(field::SPAN_TRACE_ID, 16)
        + message_len(field::SPAN_SPAN_ID, 8)
        + string_len(field::SPAN_TRACE_STATE, &state)
        + parent
        + string_len(field::SPAN_NAME, &s.name)
        + varint_len(field::SPAN_KIND, kind(&s.span_kind))
        + fixed64_len(field::SPAN_START, nanos(s.start_time))
        + fixed64_len(field::SPAN_END, nanos(s.end_time))
        + kvs_len(field::SPAN_ATTRIBUTES, &s.attributes)
        + varint_len(
            field::SPAN_DROPPED_ATTRIBUTES,
            u64::from(s.dropped_attributes_count),
        )
        + s.events
            .iter()
            .map(|e| message_len(field::SPAN_EVENTS, event_len(e)))
            .sum::<usize>()
        + varint_len(
            field::SPAN_DROPPED_EVENTS,
            u64::from(s.events.dropped_count),
        )
        + s.links
            .iter()
            .map(|l| message_len(field::SPAN_LINKS, link_len(l)))
            .sum::<usize>()
        + varint_len(field::SPAN_DROPPED_LINKS, u64::from(s.links.dropped_count))
        + message_len(field::SPAN_STATUS, status_len(&s.status))
        + fixed32_len(
            field::SPAN_FLAGS,
            flags(s.parent_span_is_remote, c.trace_flags().to_u8()),
        )
}

fn event_len(e: &opentelemetry::trace::Event) -> usize {
    fixed64_len(field::EVENT_TIME, nanos(e.timestamp))
        + string_len(field::EVENT_NAME, &e.name)
        + kvs_len(field::EVENT_ATTRIBUTES, &e.attributes)
        + varint_len(
            field::EVENT_DROPPED_ATTRIBUTES,
            u64::from(e.dropped_attributes_count),
        )
}

fn link_len(l: &opentelemetry::trace::Link) -> usize {
    let c = &l.span_context;
    message_len(field::LINK_TRACE_ID, 16)
        + message_len(field::LINK_SPAN_ID, 8)
        + string_len(field::LINK_TRACE_STATE, &c.trace_state().header())
        + kvs_len(field::LINK_ATTRIBUTES, &l.attributes)
        + varint_len(
            field::LINK_DROPPED_ATTRIBUTES,
            u64::from(l.dropped_attributes_count),
        )
        + fixed32_len(
            field::LINK_FLAGS,
            flags(c.is_remote(), c.trace_flags().to_u8()),
        )
}

// Writers: the same fields, in field order, as the lengths above count them.

fn message_header(tag: u32, body: usize, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(body as u64, buf);
}

fn bytes(tag: u32, b: &[u8], buf: &mut Vec<u8>) {
    message_header(tag, b.len(), buf);
    buf.extend_from_slice(b);
}

fn string(tag: u32, s: &str, buf: &mut Vec<u8>) {
    if !s.is_empty() {
        bytes(tag, s.as_bytes(), buf);
    }
}

fn varint(tag: u32, v: u64, buf: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }
}

fn fixed64(tag: u32, v: u64, buf: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

fn fixed32(tag: u32, v: u32, buf: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::ThirtyTwoBit, buf);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

fn any(v: &Value, buf: &mut Vec<u8>) {
    match v {
        Value::Bool(b) => {
            encode_key(field::ANY_BOOL, WireType::Varint, buf);
            buf.push(u8::from(*b));
        }
        Value::I64(i) => {
            encode_key(field::ANY_INT, WireType::Varint, buf);
            encode_varint(*i as u64, buf);
        }
        Value::F64(f) => {
            encode_key(field::ANY_DOUBLE, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&f.to_le_bytes());
        }
        Value::String(s) => bytes(field::ANY_STRING, s.as_str().as_bytes(), buf),
        Value::Array(a) => {
            message_header(field::ANY_ARRAY, array_len(a), buf);
            let mut each = |v: &Value| {
                message_header(field::ARRAY_VALUES, any_len(v), buf);
                any(v, buf);
            };
            match a {
                Array::Bool(v) => v.iter().for_each(|&b| each(&Value::Bool(b))),
                Array::I64(v) => v.iter().for_each(|&i| each(&Value::I64(i))),
                Array::F64(v) => v.iter().for_each(|&f| each(&Value::F64(f))),
                Array::String(v) => v.iter().for_each(|s| {
                    let len = s.as_str().len();
                    message_header(
                        field::ARRAY_VALUES,
                        message_len(field::ANY_STRING, len),
                        buf,
                    );
                    bytes(field::ANY_STRING, s.as_str().as_bytes(), buf);
                }),
                _ => {}
            }
        }
        other => bytes(field::ANY_STRING, other.as_str().as_bytes(), buf),
    }
}

fn key_value(tag: u32, key: &str, value: &Value, buf: &mut Vec<u8>) {
    message_header(tag, key_value_len(key, value), buf);
    string(field::KEY_VALUE_KEY, key, buf);
    message_header(field::KEY_VALUE_VALUE, any_len(value), buf);
    any(value, buf);
}

fn kvs(tag: u32, all: &[KeyValue], buf: &mut Vec<u8>) {
    for kv in all {
        key_value(tag, kv.key.as_str(), &kv.value, buf);
    }
}

fn span(s: &SpanData, buf: &mut Vec<u8>) {
    let c = &s.span_context;
    bytes(field::SPAN_TRACE_ID, &c.trace_id().to_bytes(), buf);
    bytes(field::SPAN_SPAN_ID, &c.span_id().to_bytes(), buf);
    string(field::SPAN_TRACE_STATE, &c.trace_state().header(), buf);
    if s.parent_span_id != SpanId::INVALID {
        bytes(
            field::SPAN_PARENT_SPAN_ID,
            &s.parent_span_id.to_bytes(),
            buf,
        );
    }
    string(field::SPAN_NAME, &s.name, buf);
    varint(field::SPAN_KIND, kind(&s.span_kind), buf);
    fixed64(field::SPAN_START, nanos(s.start_time), buf);
    fixed64(field::SPAN_END, nanos(s.end_time), buf);
    kvs(field::SPAN_ATTRIBUTES, &s.attributes, buf);
    varint(
        field::SPAN_DROPPED_ATTRIBUTES,
        u64::from(s.dropped_attributes_count),
        buf,
    );
    for e in s.events.iter() {
        message_header(field::SPAN_EVENTS, event_len(e), buf);
        fixed64(field::EVENT_TIME, nanos(e.timestamp), buf);
        string(field::EVENT_NAME, &e.name, buf);
        kvs(field::EVENT_ATTRIBUTES, &e.attributes, buf);
        varint(
            field::EVENT_DROPPED_ATTRIBUTES,
            u64::from(e.dropped_attributes_count),
            buf,
        );
    }
    varint(
        field::SPAN_DROPPED_EVENTS,
        u64::from(s.events.dropped_count),
        buf,
    );
    for l in s.links.iter() {
        let lc = &l.span_context;
        message_header(field::SPAN_LINKS, link_len(l), buf);
        bytes(field::LINK_TRACE_ID, &lc.trace_id().to_bytes(), buf);
        bytes(field::LINK_SPAN_ID, &lc.span_id().to_bytes(), buf);
        string(field::LINK_TRACE_STATE, &lc.trace_state().header(), buf);
        kvs(field::LINK_ATTRIBUTES, &l.attributes, buf);
        varint(
            field::LINK_DROPPED_ATTRIBUTES,
            u64::from(l.dropped_attributes_count),
            buf,
        );
        fixed32(
            field::LINK_FLAGS,
            flags(lc.is_remote(), lc.trace_flags().to_u8()),
            buf,
        );
    }
    varint(
        field::SPAN_DROPPED_LINKS,
        u64::from(s.links.dropped_count),
        buf,
    );
    message_header(field::SPAN_STATUS, status_len(&s.status), buf);
    let (code, message) = status(&s.status);
    string(field::STATUS_MESSAGE, message, buf);
    varint(field::STATUS_CODE, code, buf);
    fixed32(
        field::SPAN_FLAGS,
        flags(s.parent_span_is_remote, c.trace_flags().to_u8()),
        buf,
    );
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message;

    use super::*;

    fn context(trace: u128, span: u64, remote: bool, state: &str) -> SpanContext {
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            remote,
            state.parse::<TraceState>().expect("trace state"),
        )
    }

    /// Spans with every kind of field and value: the two scopes interleaved, a remote parent,
    /// an error status, events and links, arrays, unicode, empty strings, negative integers,
    /// times before and after the epoch.
    fn spans() -> Vec<SpanData> {
        let at = UNIX_EPOCH + Duration::from_nanos(1_764_800_000_123_456_789);
        let scope = |name: &'static str, version: Option<&'static str>| {
            let b = InstrumentationScope::builder(name)
                .with_attributes([KeyValue::new("scope.attr", true)]);
            let b = match version {
                Some(v) => b
                    .with_version(v)
                    .with_schema_url("https://opentelemetry.io/schemas/1.42.0"),
                None => b,
            };
            b.build()
        };
        let (promptd, other) = (scope("promptd", Some("0.1.0")), scope("other", None));
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "promptd.plugin.call",
            at,
            vec![
                KeyValue::new("promptd.plugin", "persona"),
                KeyValue::new("n", -3_i64),
            ],
            2,
        ));
        events
            .events
            .push(Event::new(Cow::Borrowed(""), UNIX_EPOCH, vec![], 0));
        events.dropped_count = 1;
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            context(7, 9, true, "vendor=x,other=y"),
            vec![KeyValue::new("why", "client")],
            1,
        ));
        let base = |name: &'static str, scope: &InstrumentationScope| SpanData {
            span_context: context(
                0x0af7651916cd43dd8448eb211c80319c,
                0xb7ad6b7169203331,
                false,
                "",
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed(name),
            start_time: at,
            end_time: at + Duration::from_millis(3),
            attributes: vec![],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        };
        let mut chat = base("chat claude-sonnet-4 — ünïcode", &promptd);
        chat.span_kind = SpanKind::Client;
        chat.parent_span_id = SpanId::from(0x1122334455667788);
        chat.parent_span_is_remote = true;
        chat.span_context = context(1 << 100, 42, false, "rojo=00f067aa0ba902b7");
        chat.attributes = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("promptd.step", 7_i64),
            KeyValue::new("promptd.negative", i64::MIN),
            KeyValue::new("promptd.cost", 0.001_25_f64),
            KeyValue::new("promptd.prefix.kept", false),
            KeyValue::new("promptd.empty", ""),
            KeyValue::new("", "an empty key"),
            KeyValue::new(
                "promptd.causes",
                Value::Array(Array::String(vec!["plugin `persona`".into(), "".into()])),
            ),
            KeyValue::new("ints", Value::Array(Array::I64(vec![0, -1, 300]))),
            KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new("floats", Value::Array(Array::F64(vec![0.0, -2.5]))),
            KeyValue::new("none", Value::Array(Array::String(vec![]))),
            KeyValue::new("text", "x".repeat(300)),
        ];
        chat.dropped_attributes_count = 4;
        chat.events = events;
        chat.links = links;
        chat.status = Status::error("budget_exceeded: over by 12 tokens");
        let mut ok = base("promptd.record", &other);
        ok.status = Status::Ok;
        ok.span_kind = SpanKind::Server;
        let mut early = base("before the epoch", &promptd);
        early.start_time = UNIX_EPOCH - Duration::from_secs(1);
        early.span_kind = SpanKind::Producer;
        let mut consumer = base("consumer", &other);
        consumer.span_kind = SpanKind::Consumer;
        vec![chat, ok, early, consumer]
    }

    fn resource() -> Resource {
        Resource::builder_empty()
            .with_service_name("promptd-test")
            .with_attribute(KeyValue::new("deployment.environment.name", "ci"))
            .with_attribute(KeyValue::new("host.count", 2_i64))
            .build()
    }

    #[test]
    fn the_bytes_decode_to_what_the_sdks_own_conversion_makes() {
        let (resource, spans) = (resource(), spans());
        let bytes = request(&resource, &spans);
        let ours = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("valid protobuf");
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(ours, theirs);
        // Field for field is not byte for byte only where prost orders differently; here the
        // lengths agree too, so nothing was written twice or left out.
        assert_eq!(bytes.len(), theirs.encoded_len());
        assert_eq!(ours.resource_spans[0].scope_spans.len(), 2);
    }

    #[test]
    fn no_spans_is_an_empty_request_of_the_resource() {
        let bytes = request(&resource(), &[]);
        let ours = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("valid protobuf");
        assert_eq!(ours.resource_spans.len(), 1);
        assert!(ours.resource_spans[0].scope_spans.is_empty());
        assert_eq!(
            ours.resource_spans[0]
                .resource
                .as_ref()
                .map(|r| r.attributes.len()),
            Some(3)
        );
    }
}
