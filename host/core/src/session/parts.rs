//! A step's body in parts, for a client that keeps the body itself (issue 31): the body's two
//! ends around its message list, and the list's items, each as JSON text. Since the step whose
//! body the client holds, a step usually sends only what it adds: the new items, and the ends
//! only when the header changed. The client joins `open`, the items and `close` into the very
//! bytes the whole body has (`tests` check it for every format).
//!
//! The parts are written as JSON into the response:
//!
//! ```json
//! {"since": 7, "open": null, "close": null, "keep": 12, "items": ["{\"role\":…}", …]}
//! ```
//!
//! `since` is the step the parts are relative to: the client keeps the first `keep` items of
//! that step's list, drops the rest, and appends `items`; `open` and `close` are given when they
//! changed (else `null`: the client keeps its own). `since = 0` means from nothing: `keep` is 0
//! and both ends are given. The daemon answers from nothing whenever it cannot vouch for the
//! client's copy: another step in between, another format, a new header or other tools shown,
//! history trimmed or compacted, a restart or an eviction of the session's state.

use super::state::Mark;
use super::SessionState;
use crate::error::Result;
use crate::formats::transcript::split_body;
use crate::formats::Format;

/// Writes `text` as a JSON string into `out` (a string always writes).
fn json_str(out: &mut String, text: &str) {
    let _ = crate::formats::json_text::write_json_str(out, text);
}

/// Writes the parts object.
fn write_parts<'a>(
    out: &mut String,
    since: u64,
    ends: Option<(&str, &str)>,
    keep: usize,
    items: impl Iterator<Item = &'a str>,
) {
    use std::fmt::Write as _;
    let _ = write!(out, "{{\"since\":{since},\"open\":");
    match ends {
        Some((open, _)) => json_str(out, open),
        None => out.push_str("null"),
    }
    out.push_str(",\"close\":");
    match ends {
        Some((_, close)) => json_str(out, close),
        None => out.push_str("null"),
    }
    let _ = write!(out, ",\"keep\":{keep},\"items\":[");
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(out, item);
    }
    out.push_str("]}");
}

impl SessionState {
    /// The last step's body in `format` as parts (see the module), relative to step `since`
    /// when the client's copy of it is the one this state last wrote, else from nothing;
    /// appended to `out`. The same bytes as [`SessionState::render_into`] once joined.
    pub fn render_parts_into(
        &mut self,
        format: Format,
        since: u64,
        out: &mut String,
    ) -> Result<()> {
        let header = super::state::renderable_header(
            &self.header,
            &self.transcript,
            &self.session,
            self.last_seq,
            format,
        )?;
        if !self.dropped.is_empty() {
            // Trimmed: the kept request, whole (bounded by the budget, not by the history).
            self.marks.clear();
            let request = self.kept_request(header)?;
            let body = crate::formats::render(&request, format);
            let Some((open, items, close)) = split_body(&body, format) else {
                unreachable!("every format's body is an object holding its message list")
            };
            write_parts(
                out,
                0,
                Some((&open, &close)),
                0,
                items.iter().map(|s| s.as_str()),
            );
            return Ok(());
        }
        self.activate(format)?;
        let header = super::state::renderable_header(
            &self.header,
            &self.transcript,
            &self.session,
            self.last_seq,
            format,
        )?;
        let at = self.memo.head(header, &self.shown_tools, format);
        let fragments = self.transcript.fragments(header, format);
        let mark = Mark {
            step: self.steps,
            format,
            header_seq: self.header_seq,
            shown: self.shown_tools.clone(),
            closed: fragments.closed.len(),
        };
        // The client's copy is the body this state wrote last, at step `since`: the items
        // made once then are still the first of the list.
        let kept = self.marks.iter().find(|m| {
            m.step == since
                && since > 0
                && m.format == format
                && m.header_seq == mark.header_seq
                && m.shown == mark.shown
                && m.closed <= mark.closed
        });
        let lead = fragments.lead.as_deref().filter(|l| !l.is_empty());
        let closed = fragments.closed.iter().map(|c| &**c);
        let tail = fragments.tail.as_deref().filter(|t| !t.is_empty());
        match kept {
            Some(m) => {
                let keep = usize::from(lead.is_some())
                    + closed
                        .clone()
                        .take(m.closed)
                        .filter(|c| !c.is_empty())
                        .count();
                let items = closed.skip(m.closed).chain(tail).filter(|i| !i.is_empty());
                write_parts(out, since, None, keep, items);
            }
            None => {
                let (open, close) = self.memo.heads[at].2.around_list(format);
                let items = lead.into_iter().chain(closed).chain(tail);
                write_parts(
                    out,
                    0,
                    Some((&open, &close)),
                    0,
                    items.filter(|i| !i.is_empty()),
                );
            }
        }
        self.marks.retain(|m| m.format != format);
        self.marks.push(mark);
        Ok(())
    }
}
