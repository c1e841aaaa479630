//! Sessions as logs (Q1–Q6): what a step appends, and how any step's frozen request is
//! rebuilt from the log alone.
//!
//! Everything here is a pure function of the events; the daemon feeds it the log, the
//! assembly and the step's input, and writes what `step::plan` returns (the events of
//! [`SessionState::step_events`], budgeted) in one transaction.
//! The frozen request a step returns is [`rebuild`] of the log *including* the step's events,
//! the same function `GET …/steps/{n}/request` uses, so the two are byte-identical (Q4).

use serde::Serialize;

use crate::assembly::Assembly;
use crate::conversation::{FrozenRequest, Header, Message, ToolSpec};
use crate::error::{Error, Result};
use crate::formats::transcript::{Head, Transcript};
use crate::formats::Format;
use crate::store::{Event, StoreError};

pub mod log;

use log::Body;
pub use log::HeaderReason;

mod append;
mod diff;
mod fit;
mod outcome;
mod parts;
mod rebuild;
mod report;
mod state;

pub use append::{
    check_message, message_event, reply_event, tool_result_shown, tool_results_shown, StepEvents,
};
pub use diff::step_diff;
pub use fit::message_size;
use fit::Measured;
pub use rebuild::{held_at, provenance_at, rebuild, step_count};
pub use report::{
    priced_replies, priced_usage_report, usage_report, PricedReply, StepUsage, UsageReport,
    UsageTotals,
};
use state::{remember, role, Role, SnapshotState};
pub use state::{RequestView, SessionState};

/// The snapshot appended once when runtime context disappears (Q2).
pub const CLEARED_SNAPSHOT: &str =
    "[Runtime context: there is no runtime context any more; earlier snapshots no longer apply.]";

/// The header for an assembly: model settings, system prompt, shown tools.
pub fn header(assembly: &Assembly, model: serde_json::Map<String, serde_json::Value>) -> Header {
    Header {
        model,
        system: assembly.system.clone(),
        tools: assembly
            .tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: std::sync::Arc::clone(&t.parameters),
                defer: t.defer.as_deref().map(str::to_string),
            })
            .collect(),
        layout: crate::conversation::LAYOUT,
        cache_key: None,
        cache_ttl: None,
    }
}

/// How [`same_header`] compares the cache key: the one place the two callers need different
/// answers, so each says which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRule<'a> {
    /// A step being planned (`step::plan`), before any header is built: the recorded
    /// header must have a key, whatever its value. A session keeps the key its header recorded
    /// until the header changes for another reason (a key change alone would route it away
    /// from the machine holding its messages); a header recorded before keys existed gets one.
    Kept,
    /// A header built whole, key and all ([`SessionState::step_events`] given one): its key must be
    /// `key`, as every other field must be equal, or it is a new header to record.
    Equal(Option<&'a str>),
}

/// The tools of a header being compared: an assembly's, or a built header's.
#[derive(Clone, Copy, Debug)]
pub enum ToolsOf<'a> {
    /// The assembly's, as [`header`] would copy them.
    Assembled(&'a [crate::assembly::AssembledTool]),
    /// A built header's.
    Specs(&'a [ToolSpec]),
}

/// A header as a step would record it, borrowed: what [`same_header`] compares a recorded
/// header with, so an unchanged header is never built.
#[derive(Clone, Copy, Debug)]
pub struct Proposed<'a> {
    /// Model settings.
    pub model: &'a serde_json::Map<String, serde_json::Value>,
    /// The system prompt.
    pub system: &'a str,
    /// The tools, in request order.
    pub tools: ToolsOf<'a>,
    /// The body layout.
    pub layout: u32,
    /// The cache TTL.
    pub cache_ttl: Option<crate::conversation::Ttl>,
    /// How the cache key is compared.
    pub key: KeyRule<'a>,
}

impl<'a> Proposed<'a> {
    /// A header built whole: every field compared, the key too ([`KeyRule::Equal`]).
    pub fn built(header: &'a Header) -> Proposed<'a> {
        Proposed {
            model: &header.model,
            system: &header.system,
            tools: ToolsOf::Specs(&header.tools),
            layout: header.layout,
            cache_ttl: header.cache_ttl,
            key: KeyRule::Equal(header.cache_key.as_deref()),
        }
    }
}

/// The header rule (Q3): whether `recorded` is the header `new` says, so none is recorded
/// again. Used where a step is planned (`step::plan`, [`KeyRule::Kept`]) and where
/// the session takes the header it is given ([`SessionState::step_events`], [`KeyRule::Equal`]).
pub fn same_header(recorded: &Header, new: Proposed<'_>) -> bool {
    recorded.layout == new.layout
        && match new.key {
            KeyRule::Kept => recorded.cache_key.is_some(),
            KeyRule::Equal(key) => recorded.cache_key.as_deref() == key,
        }
        && recorded.cache_ttl == new.cache_ttl
        && recorded.system == new.system
        && match new.tools {
            ToolsOf::Assembled(tools) => {
                recorded.tools.len() == tools.len()
                    && recorded.tools.iter().zip(tools.iter()).all(|(h, a)| {
                        h.name == a.name
                            && h.description == a.description
                            && h.parameters == a.parameters
                            && h.defer.as_deref() == a.defer.as_deref()
                    })
            }
            ToolsOf::Specs(tools) => recorded.tools == tools,
        }
        && recorded.model == *new.model
}

/// An event whose body does not decode: an error naming the session and seq, never a silent
/// omission (a request rebuilt without it would not be what the model saw).
pub(super) fn corrupt(session: &str, event: &Event, problem: impl std::fmt::Display) -> Error {
    Error::Store(StoreError::Corrupt {
        session: session.to_string(),
        seq: event.seq,
        problem: format!("{} event: {problem}", event.kind),
    })
}

/// The event's body, decoded; one that does not decode is `store_corrupt`.
pub fn decode(session: &str, event: &Event) -> Result<Body> {
    Body::decode(event.kind, event.version, &event.body).map_err(|e| corrupt(session, event, e))
}

/// Roughly the heap a JSON value holds in memory: its strings, and per node the `Value` and
/// the map entry around it, which its JSON text does not show (a tool's schema takes three to
/// five times its JSON length as a `Value`).
pub(super) fn value_heap_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    // A `Value` (32 bytes), and an allocation's header with its rounding.
    const NODE: usize = 32;
    const ALLOCATION: usize = 16;
    // A map entry beyond its key and value: the B-tree's share of a node per entry.
    const ENTRY: usize = 48;
    match value {
        Value::String(s) => s.len() + ALLOCATION,
        Value::Array(a) => ALLOCATION + a.iter().map(|v| NODE + value_heap_bytes(v)).sum::<usize>(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| ENTRY + k.len() + ALLOCATION + NODE + value_heap_bytes(v))
            .sum(),
        _ => 0,
    }
}

/// Roughly the heap a header holds (for the session cache's budget).
pub(super) fn header_heap_bytes(header: &Header) -> usize {
    let model: usize = (header.model.iter())
        .map(|(k, v)| 96 + k.len() + value_heap_bytes(v))
        .sum();
    let tools: usize = (header.tools.iter())
        .map(|t| {
            // The spec itself and its two strings' allocations.
            128 + t.name.len()
                + t.description.len()
                + value_heap_bytes(&t.parameters)
                + t.defer.as_ref().map_or(0, |d| d.len() + 16)
        })
        .sum();
    header.system.len() + model + tools + header.cache_key.as_ref().map_or(0, |k| k.len() + 16)
}

#[cfg(test)]
mod tests;
