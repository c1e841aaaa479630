//! Rebuilding any step's frozen request from the log alone (Q4), and what it recorded.

use super::*;

use std::collections::{BTreeMap, BTreeSet};

/// The message a body stands for, if it is one (a snapshot is a user message).
pub(super) fn message_of(body: &Body) -> Option<Message> {
    match body {
        Body::ContextSnapshot(s) => Some(Message::snapshot(s.content.clone())),
        other => other.as_message().cloned(),
    }
}

/// Every message the log holds, in order, less those a `history/dropped` event left out, and
/// with each compacted range shown as its summary.
pub(super) fn messages(events: &[(u64, Body)]) -> Vec<Message> {
    let mut dropped = BTreeSet::new();
    let mut summaries = BTreeMap::new();
    for (_, body) in events {
        match body {
            Body::HistoryDropped(d) => dropped.extend(d.seqs.iter().copied()),
            Body::HistoryCompacted(c) => {
                summaries.insert(c.from, c.summary.clone());
                dropped.extend(
                    events
                        .iter()
                        .map(|(seq, _)| *seq)
                        .filter(|s| (c.from..=c.to).contains(s) && !c.kept.contains(s)),
                );
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (seq, body) in events {
        if let Some(summary) = summaries.get(seq) {
            out.push(Message::user(summary.clone()));
        }
        if !dropped.contains(seq) {
            out.extend(message_of(body));
        }
    }
    out
}

/// Every event of `events` decoded, with its seq.
pub(super) fn decode_all(session: &str, events: &[Event]) -> Result<Vec<(u64, Body)>> {
    events
        .iter()
        .map(|e| Ok((e.seq, decode(session, e)?)))
        .collect()
}

/// Step `n`'s provenance: what the last header or marker at or before its marker recorded.
pub fn provenance_at(
    session: &str,
    events: &[Event],
    n: u64,
) -> Result<Option<crate::provenance::Provenance>> {
    let upto = up_to_step(session, events, n)?;
    for event in upto.iter().rev() {
        match decode(session, event)? {
            Body::Step(m) if m.provenance.is_some() => return Ok(m.provenance),
            Body::RequestHeader(h) if h.provenance.is_some() => return Ok(h.provenance),
            _ => {}
        }
    }
    Ok(None)
}

/// What step `n` held (its marker's list) and what a header recorded in step `n` released
/// of what was held before (K7).
pub fn held_at(
    session: &str,
    events: &[Event],
    n: u64,
) -> Result<(Vec<crate::held::Held>, Option<crate::held::Released>)> {
    let upto = up_to_step(session, events, n)?;
    let start = upto[..upto.len().saturating_sub(1)]
        .iter()
        .rposition(|e| e.kind == crate::store::EventKind::Step)
        .map_or(0, |i| i + 1);
    let (mut held, mut released) = (Vec::new(), None);
    for event in &upto[start..] {
        match event.kind {
            crate::store::EventKind::Step | crate::store::EventKind::RequestHeader => {}
            _ => continue,
        }
        match decode(session, event)? {
            Body::Step(m) => held = m.held,
            Body::RequestHeader(h) => released = h.released,
            _ => {}
        }
    }
    Ok((held, released))
}

/// The events up to and including step `n`'s marker.
pub(super) fn up_to_step<'a>(session: &str, events: &'a [Event], n: u64) -> Result<&'a [Event]> {
    let marker = events
        .iter()
        .filter(|e| e.kind == crate::store::EventKind::Step)
        .nth(n.checked_sub(1).unwrap_or(u64::MAX) as usize)
        .ok_or_else(|| Error::UnknownStep {
            session: session.to_string(),
            step: n,
            steps: step_count(events),
        })?;
    Ok(&events[..events.partition_point(|e| e.seq <= marker.seq)])
}

/// How many steps the log holds.
pub fn step_count(events: &[Event]) -> u64 {
    events
        .iter()
        .filter(|e| e.kind == crate::store::EventKind::Step)
        .count() as u64
}

/// Rebuilds the frozen request of step `n` from the log alone (Q4): the last header recorded
/// at or before the step, and every message up to its marker.
pub fn rebuild(session: &str, events: &[Event], n: u64) -> Result<FrozenRequest> {
    let upto = decode_all(session, up_to_step(session, events, n)?)?;
    let marker_seq = upto.last().map_or(0, |(seq, _)| *seq);
    let header = upto.iter().rev().find_map(|(_, b)| match b {
        Body::RequestHeader(h) => Some(h.header.clone()),
        _ => None,
    });
    let header = header.ok_or_else(|| {
        Error::Store(StoreError::Corrupt {
            session: session.to_string(),
            seq: marker_seq,
            problem: format!("step {n} has no request header before it"),
        })
    })?;
    let shown_tools = match upto.last() {
        Some((_, Body::Step(m))) => m.shown_tools.clone(),
        _ => None,
    };
    Ok(FrozenRequest {
        header,
        messages: messages(&upto),
        shown_tools,
    })
}
