//! Where two requests first differ, and why: the part, the bytes before it, the causes in
//! words, and the plugin behind it.

use serde_json::{Map, Value};

use super::view::View;
use crate::assembly::Assembly;
use crate::conversation::FrozenRequest;
use crate::formats::Format;
use crate::prefix;

/// Why the requests last differed, kept so a step whose difference lies where the last one's
/// did is not explained again.
#[derive(Default)]
pub(super) struct Causes {
    /// Why the messages diverged, when they first did (the divergence stays where it is).
    pub(super) message: Option<(usize, String, Option<String>)>,
    /// Why the headers differ, for the headers and provenances last compared.
    pub(super) header: Option<(HeaderKey, Vec<String>, Option<String>)>,
}

impl Causes {
    /// Why part `p`, labelled `label`, differs, and the plugin behind it: worked out again only
    /// when the headers, tools shown, provenances or part changed since last asked.
    pub(super) fn of_part(
        &mut self,
        rec: &View<'_>,
        cand: &View<'_>,
        p: usize,
        label: &str,
        assembly: Option<&Assembly>,
        format: Format,
    ) -> (Vec<String>, Option<String>) {
        let header_part = p < rec.header_parts.max(cand.header_parts);
        if header_part {
            self.message = None;
            let key = HeaderKey::of(rec, cand, p);
            match &self.header {
                Some((k, causes, plugin)) if *k == key => (causes.clone(), plugin.clone()),
                _ => {
                    let (causes, plugin) = header_causes(rec, cand, label, format);
                    self.header = Some((key, causes.clone(), plugin.clone()));
                    (causes, plugin)
                }
            }
        } else {
            let (cause, plugin) = match &self.message {
                Some((at, cause, plugin)) if *at == p => (cause.clone(), plugin.clone()),
                _ => {
                    let (cause, plugin) = message_cause(
                        label,
                        (rec.left_out, cand.left_out),
                        (rec.snapshot, cand.snapshot),
                        assembly,
                    );
                    self.message = Some((p, cause.clone(), plugin.clone()));
                    (cause, plugin)
                }
            };
            (vec![cause], plugin)
        }
    }
}

/// What the causes of a header difference depend on: both headers (by the seq that
/// recorded them), the tools shown, the provenances and the part.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct HeaderKey {
    pub(super) seqs: (u64, u64),
    pub(super) shown: (Option<Vec<String>>, Option<Vec<String>>),
    pub(super) provenance: (
        Option<crate::provenance::Provenance>,
        Option<crate::provenance::Provenance>,
    ),
    pub(super) part: usize,
}

impl HeaderKey {
    pub(super) fn of(rec: &View<'_>, cand: &View<'_>, part: usize) -> HeaderKey {
        HeaderKey {
            seqs: (rec.header_seq, cand.header_seq),
            shown: (
                rec.shown.map(<[String]>::to_vec),
                cand.shown.map(<[String]>::to_vec),
            ),
            provenance: (rec.provenance.cloned(), cand.provenance.cloned()),
            part,
        }
    }
}

/// Bytes two strings share at their start, at a char boundary.
pub(super) fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The index of the first part where `a` and `b` differ (text or cache breakpoint), `None`
/// when they are the same stream. The first `verified` closed fragments are equal on both
/// sides: once the parts before them are equal, their values are skipped, so a step compares
/// what it adds.
pub(super) fn first_differing_part(a: &View<'_>, b: &View<'_>, verified: usize) -> Option<usize> {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i < n {
        if i == a.pre() && a.pre() == b.pre() && a.spliced && b.spliced {
            // Equal fragments split into equal values: as many on both sides.
            i += a.values_before(verified);
            if i >= n {
                break;
            }
        }
        let (x, y) = (a.part(i), b.part(i));
        if x.hash != y.hash || x.text.len() != y.text.len() || x.mark != y.mark || x.text != y.text
        {
            return Some(i);
        }
        i += 1;
    }
    (a.len() != b.len()).then_some(n)
}

/// The keys whose values differ between two settings objects, for words. Settings that are
/// not a JSON object (a rendered request's always are) are named as a whole, never as "none".
pub(super) fn differing_settings(a: &str, b: &str) -> String {
    let parse = |t: &str| serde_json::from_str::<Map<String, Value>>(t);
    let (Ok(a), Ok(b)) = (parse(a), parse(b)) else {
        return "the settings as a whole (not a JSON object)".into();
    };
    let mut keys: Vec<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .collect();
    keys.sort();
    keys.dedup();
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why the header parts differ, in the diff's words (Q16), and the plugin behind the part.
pub(super) fn header_causes(
    rec: &View<'_>,
    cand: &View<'_>,
    label: &str,
    format: Format,
) -> (Vec<String>, Option<String>) {
    let request = |v: &View<'_>| FrozenRequest {
        header: v.header.clone(),
        messages: Vec::new(),
        shown_tools: v.shown.map(<[String]>::to_vec),
    };
    let (rec_from, cand_from) = (rec.provenance, cand.provenance);
    let d = prefix::diff(&request(rec), rec_from, &request(cand), cand_from, format);
    let plugin = prefix::culprit(label, rec_from, cand_from);
    let mut causes = d.causes;
    if causes.is_empty() || causes.iter().all(|c| c.ends_with("prefix kept")) {
        causes = vec![format!("{label} differs")];
    }
    (causes, plugin)
}

/// Why a message part differs: history left out differently, or the runtime context
/// (naming the candidate's context, and its plugin, whose text the recorded snapshot does
/// not hold), or else the message itself.
pub(super) fn message_cause(
    label: &str,
    left_out: (usize, usize),
    snapshots: (Option<&str>, Option<&str>),
    assembly: Option<&Assembly>,
) -> (String, Option<String>) {
    if left_out.0 != left_out.1 {
        return (
            format!(
                "{label}: history left out differently (the recorded request leaves out {} \
                 message events, the candidate's {})",
                left_out.0, left_out.1
            ),
            None,
        );
    }
    match snapshots {
        (recorded, candidate) if recorded != candidate => {
            let recorded = recorded.unwrap_or("");
            let culprit = assembly.and_then(|a| {
                a.contexts
                    .iter()
                    .find(|(_, text)| !text.is_empty() && !recorded.contains(&**text))
                    .map(|(name, _)| {
                        let plugin = a
                            .explain
                            .contexts
                            .iter()
                            .find(|o| *o.name == **name)
                            .map(|o| o.plugin.clone());
                        (name.to_string(), plugin)
                    })
            });
            match (culprit, candidate) {
                (Some((name, plugin)), _) => {
                    let by = plugin
                        .as_deref()
                        .map_or(String::new(), |p| format!(" (plugin `{p}`)"));
                    (
                        format!("{label}: runtime context changed: context `{name}`{by} gives other text"),
                        plugin,
                    )
                }
                (None, None) => (
                    format!("{label}: runtime context changed: the candidate gives none"),
                    None,
                ),
                (None, Some(_)) => (
                    format!(
                        "{label}: runtime context changed: the recorded snapshot holds text no \
                         candidate context gives"
                    ),
                    None,
                ),
            }
        }
        _ => (
            format!("{label} differs (an earlier runtime context, or a review hook's redaction)"),
            None,
        ),
    }
}
