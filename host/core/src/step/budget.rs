//! Stage 8, the budget (Q14): what the step's request will hold measured, history trimmed
//! with the `history/dropped` event before the marker, a request that still does not fit
//! refused; the usage and what the step holds go on the marker.

use super::{PlannedStep, Serving};
use crate::assembly::Assembly;
use crate::config::AgentSettings;
use crate::conversation::Message;
use crate::error::{Error, Result};
use crate::formats::Format;
use crate::held;
use crate::observe::{observed, Activity};
use crate::session::log::Body;
use crate::session::{SessionState, StepEvents};

/// The session's events for the step, budgeted: the step ready to append, with what
/// it holds and what its header releases (K7).
pub(super) fn budgeted(
    state: &mut SessionState,
    agent: &AgentSettings,
    assembled: &Assembly,
    serving: Serving<'_>,
    format: Format,
    mut appended: StepEvents,
    (held, released): (Vec<held::Held>, Option<held::Released>),
) -> Result<PlannedStep> {
    // Measure what this step's request will hold: the log so far, this step's input and its
    // snapshot.
    let snapshot = appended.events.iter().find_map(|b| match b {
        Body::ContextSnapshot(s) => Some(Message::snapshot(s.content.clone())),
        _ => None,
    });
    let new: Vec<&Message> = appended
        .events
        .iter()
        .filter_map(Body::as_message)
        .chain(snapshot.as_ref())
        .collect();
    // The new header, when the step records one; else the recorded one stands.
    let header = appended.events.iter().find_map(|b| match b {
        Body::RequestHeader(h) => Some(&h.header),
        _ => None,
    });
    let (usage, dropped) = observed::<_, Error>(serving.observe, Activity::Budget, || {
        Ok(state.fit(
            &agent.budget,
            &*agent.counter,
            header,
            assembled,
            format,
            &new,
        ))
    })?;
    drop(new);
    let mut prefix_kept = appended.prefix_kept;
    if let Some(dropped) = dropped {
        appended.events.push(dropped);
        prefix_kept = prefix_kept.map(|_| false);
    }
    usage.check(&agent.budget)?;
    appended.marker.usage = Some(usage);
    appended.marker.held = held;
    if let Some(released) = released {
        for body in &mut appended.events {
            if let Body::RequestHeader(record) = body {
                record.released = Some(released.clone());
            }
        }
    }
    let step = appended.step;
    let header_reason = appended.header_reason;
    Ok(PlannedStep {
        step,
        bodies: appended.into_bodies(),
        header_reason,
        prefix_kept,
        redactions: Vec::new(),
    })
}
