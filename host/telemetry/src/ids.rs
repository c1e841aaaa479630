//! Trace and span ids, and the W3C trace context a client sends.
//!
//! A session's trace id and its session span's id are derived from the session id, and a
//! step's span id from the session id and the step number: every daemon of a fleet, and a
//! daemon after a restart, puts a session's steps under the same span, and a reply recorded on
//! another daemon finds its step's span.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use sha2::{Digest, Sha256};

/// The trace context a client sent (`traceparent`, `tracestate`), when it was valid.
#[derive(Clone, Debug, PartialEq)]
pub struct Parent(pub(crate) SpanContext);

impl Parent {
    /// The context in `traceparent` (and `tracestate`), as W3C Trace Context defines them;
    /// `None` when there is none or it is malformed (a bad header is ignored, as the
    /// specification asks, never refused).
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Parent> {
        let traceparent = traceparent?.trim();
        // The propagator pads a short id; W3C Trace Context says exactly 32 and 16 lowercase
        // hex digits (a later version may append fields).
        let fields: Vec<&str> = traceparent.split('-').collect();
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if fields.len() < 4
            || !(hex(fields[0], 2) && hex(fields[1], 32) && hex(fields[2], 16) && hex(fields[3], 2))
        {
            return None;
        }
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_string(), traceparent.to_string());
        if let Some(state) = tracestate {
            carrier.insert("tracestate".to_string(), state.to_string());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        let span = cx.span().span_context().clone();
        span.is_valid().then_some(Parent(span))
    }

    /// Its trace id, as 32 hex digits.
    pub fn trace_id(&self) -> String {
        self.0.trace_id().to_string()
    }

    /// Whether the client's tracer sampled its span.
    pub fn sampled(&self) -> bool {
        self.0.is_sampled()
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

fn nonzero_trace(bytes: [u8; 16]) -> TraceId {
    let id = TraceId::from_bytes(bytes);
    if id == TraceId::INVALID {
        TraceId::from_bytes([1; 16])
    } else {
        id
    }
}

fn nonzero_span(bytes: [u8; 8]) -> SpanId {
    let id = SpanId::from_bytes(bytes);
    if id == SpanId::INVALID {
        SpanId::from_bytes([1; 8])
    } else {
        id
    }
}

/// The trace of session `session`'s spans when no client trace context says otherwise.
pub fn session_trace(session: &str) -> TraceId {
    let d = digest(&[b"promptd trace", session.as_bytes()]);
    let mut b = [0; 16];
    b.copy_from_slice(&d[..16]);
    nonzero_trace(b)
}

/// The id of session `session`'s span.
pub fn session_span(session: &str) -> SpanId {
    let d = digest(&[b"promptd session", session.as_bytes()]);
    let mut b = [0; 8];
    b.copy_from_slice(&d[..8]);
    nonzero_span(b)
}

/// The id of step `step`'s span in session `session`.
pub fn step_span(session: &str, step: u64) -> SpanId {
    let d = digest(&[b"promptd step", session.as_bytes(), &step.to_le_bytes()]);
    let mut b = [0; 8];
    b.copy_from_slice(&d[..8]);
    nonzero_span(b)
}

/// Whether a trace is sampled at `ratio`: decided by the trace id alone, as the SDK's
/// `TraceIdRatioBased` sampler decides (its low 63 bits against the ratio), so a session is
/// traced whole or not at all, by every daemon alike.
pub fn ratio_sampled(trace: TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let bytes = trace.to_bytes();
    let mut low = [0; 8];
    low.copy_from_slice(&bytes[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    (x as f64) < ratio * (1u64 << 63) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_read_and_a_bad_one_ignored() {
        let p = Parent::from_headers(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("vendor=x"),
        )
        .expect("valid");
        assert_eq!(p.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(p.sampled());
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(Parent::from_headers(Some(bad), None), None, "{bad}");
        }
        assert_eq!(Parent::from_headers(None, Some("a=b")), None);
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(session_trace("s1"), session_trace("s1"));
        assert_ne!(session_trace("s1"), session_trace("s2"));
        assert_ne!(step_span("s1", 1), step_span("s1", 2));
        assert_ne!(step_span("s1", 1), session_span("s1"));
    }

    #[test]
    fn the_ratio_samples_about_its_share_of_sessions() {
        let n = 4000;
        let sampled = (0..n)
            .filter(|i| ratio_sampled(session_trace(&format!("s{i}")), 0.25))
            .count();
        assert!((800..1200).contains(&sampled), "{sampled} of {n}");
        assert!(ratio_sampled(session_trace("x"), 1.0));
        assert!(!ratio_sampled(session_trace("x"), 0.0));
    }
}
