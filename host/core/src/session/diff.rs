//! A step's request against the ones before it in the log ([`StepDiff`]): the prefix diff
//! of [`crate::prefix`] over requests rebuilt from the log.

use crate::budget::Counter;
use crate::conversation::Header;
use crate::formats::Format;
use crate::prefix::{diff, stream, Against, CachedShare, Diff, StepDiff, TokenShare};
use crate::store::{Event, EventKind};
use crate::Result;

use super::log::Body;
use super::{provenance_at, rebuild};

/// [`StepDiff`] of step `n` of a session's log, in `format`; `counter` (when the agent has a
/// tokenizer) measures the cached share in tokens.
pub fn step_diff(
    session: &str,
    events: &[Event],
    n: u64,
    format: Format,
    counter: Option<&dyn Counter>,
) -> Result<StepDiff> {
    let now = rebuild(session, events, n)?;
    let now_from = provenance_at(session, events, n)?;
    let against = |m: u64| -> Result<(Against, Diff)> {
        let then = rebuild(session, events, m)?;
        let then_from = provenance_at(session, events, m)?;
        let d = diff(&then, then_from.as_ref(), &now, now_from.as_ref(), format);
        let a = Against {
            step: m,
            bytes: d.previous_bytes,
            shared_bytes: d.shared_bytes,
            prefix_kept: d.prefix_kept,
            first_divergence: d.first_divergence.clone(),
        };
        Ok((a, d))
    };
    let (previous, causes, notes) = match n.checked_sub(1).filter(|m| *m >= 1) {
        Some(m) => {
            let (a, d) = against(m)?;
            (Some(a), d.causes, d.notes)
        }
        None => (
            None,
            vec!["first step: nothing to reuse".into()],
            Vec::new(),
        ),
    };
    let same_header = match last_step_with_header(session, events, n, &now.header)? {
        Some(m) if Some(m) != n.checked_sub(1) => Some(against(m)?.0),
        _ => None,
    };
    let parts = stream(&now, format);
    let bytes: usize = parts.iter().map(|p| p.text.len()).sum();
    let shared = [&previous, &same_header]
        .iter()
        .filter_map(|a| a.as_ref().map(|a| a.shared_bytes))
        .max()
        .unwrap_or(0);
    let tokens = counter.map(|c| {
        let text: String = parts.iter().map(|p| p.text.as_str()).collect();
        let mut cut = shared.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        TokenShare {
            shared: c.count(&text[..cut]),
            total: c.count(&text),
            tokenizer: c.name().to_string(),
        }
    });
    Ok(StepDiff {
        step: n,
        format,
        bytes,
        breaks_cache: previous.as_ref().is_some_and(|a| !a.prefix_kept),
        previous,
        same_header,
        causes,
        notes,
        cached_share: CachedShare {
            bytes: if bytes == 0 {
                0.0
            } else {
                shared as f64 / bytes as f64
            },
            tokens,
        },
    })
}

/// The last step before `n` whose request header equals `header`.
fn last_step_with_header(
    session: &str,
    events: &[Event],
    n: u64,
    header: &Header,
) -> Result<Option<u64>> {
    let mut current: Option<Header> = None;
    let mut step = 0;
    let mut found = None;
    for e in events {
        match e.kind {
            EventKind::RequestHeader => {
                if let Body::RequestHeader(h) = super::decode(session, e)? {
                    current = Some(h.header);
                }
            }
            EventKind::Step => {
                step += 1;
                if step >= n {
                    break;
                }
                if current.as_ref() == Some(header) {
                    found = Some(step);
                }
            }
            _ => {}
        }
    }
    Ok(found)
}
