//! A step's cache outcome: what the provider reported it read from its cache, against what the
//! model ([`super::Cache`]) expected from the step before, and why they differ.
//!
//! The provider's usage is the truth about *how much* was read; the log says *why*. The model
//! is fed the session's previous replied request and this one (each as [`Block`]s whose tokens
//! are scaled so they add up to the input the provider reported), and says what a cache
//! following the documented rules would have read, and why. Then:
//!
//! - the provider read about what the model expected (within 5% of the input, or one
//!   [`Rules::step_tokens`]: the model's block sizes are estimates): the model's cause is the
//!   outcome (`hit`, `ttl_expired`, `prefix_changed` with the part and the plugin,
//!   `model_changed`, `compacted`, `cold`, …);
//! - the provider read more, all the previous request left cached: `hit` (another session,
//!   or a request the log does not hold, kept it warm); more, but not all of that: the
//!   model's cause (another session kept the head warm, this session's own part was lost).
//!   "All" is exact where the provider reported what it held (Anthropic and Bedrock report
//!   reads and writes): a miss the rules explain is one, however small. Where what was held
//!   is itself modelled (OpenAI, Gemini), the same tolerance applies;
//! - the provider read less: `routing` for OpenAI's automatic cache (the prefix was stable
//!   but the request went to a machine that did not hold it: the key, or the per-key rate),
//!   `unexplained` for Anthropic's (an entry evicted before its TTL).
//!
//! ```
//! use promptd_core::cache::outcome::{classify, Kind, Seen};
//! use promptd_core::cache::{Block, Rules, Ttl};
//! use promptd_core::formats::replies::ProviderUsage;
//! use promptd_core::formats::Format::Anthropic as F;
//!
//! let rules = Rules::anthropic("claude-sonnet-4-5");
//! let blocks = |n: u64| vec![Block::new(1, 3000, Some(Ttl::Minutes5)), Block::new(n, 100, None)];
//! let usage = |read, write| ProviderUsage {
//!     input_tokens: Some(3100), cached_tokens: Some(read), cache_write_tokens: Some(write),
//!     ..ProviderUsage::default()
//! };
//! let first = Seen { at_ms: 0, blocks: blocks(7), usage: usage(0, 3000) };
//! let cold = classify(&rules, F, None, &first, false, || None);
//! assert_eq!(cold.outcome, Kind::Cold);
//! // Ten minutes later the 5-minute entry is gone: the provider read nothing, as modelled.
//! let late = Seen { at_ms: 600_000, blocks: blocks(8), usage: usage(0, 3000) };
//! let o = classify(&rules, F, Some(&first), &late, false, || None);
//! assert_eq!((o.outcome, o.gap_ms, o.lost), (Kind::TtlExpired, Some(600_000), 3000));
//! ```

use serde::{Deserialize, Serialize};

use super::{Block, Cache, Cause, Family, Request, Rules};
use crate::formats::replies::ProviderUsage;
use crate::formats::Format;

/// Why a step's request was served from the cache as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Kind {
    /// Everything the previous request left cached that this one repeats was read.
    Hit,
    /// Less was read than before, and the model reads the same: the request's breakpoints
    /// reach only part of what is cached (Anthropic's 20-block lookback).
    Partial,
    /// The idle gap since the previous request to this prefix passed the cache's TTL.
    TtlExpired,
    /// The prefix changed: the first difference is in `part`, given by `plugin`.
    PrefixChanged,
    /// The session's first request (no earlier request to reuse).
    Cold,
    /// The model changed since the previous request (a cache is per model).
    ModelChanged,
    /// History was compacted or trimmed since the previous request.
    Compacted,
    /// OpenAI: the prefix was stable and fresh, but was not served (the request was routed
    /// to a machine without it: another `prompt_cache_key`, or past the per-key rate).
    Routing,
    /// The request's cacheable prefix is shorter than the model's minimum.
    Uncacheable,
    /// The provider read less than the model expected, and nothing in the log says why.
    Unexplained,
}

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 10] = [
        Kind::Hit,
        Kind::Partial,
        Kind::TtlExpired,
        Kind::PrefixChanged,
        Kind::Cold,
        Kind::ModelChanged,
        Kind::Compacted,
        Kind::Routing,
        Kind::Uncacheable,
        Kind::Unexplained,
    ];

    /// Its name in the log and the API (`ttl_expired`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Hit => "hit",
            Kind::Partial => "partial",
            Kind::TtlExpired => "ttl_expired",
            Kind::PrefixChanged => "prefix_changed",
            Kind::Cold => "cold",
            Kind::ModelChanged => "model_changed",
            Kind::Compacted => "compacted",
            Kind::Routing => "routing",
            Kind::Uncacheable => "uncacheable",
            Kind::Unexplained => "unexplained",
        }
    }

    /// Whether the step lost cache it could have had (every kind but `hit`, `cold` and
    /// `uncacheable`).
    pub fn is_miss(self) -> bool {
        !matches!(self, Kind::Hit | Kind::Cold | Kind::Uncacheable)
    }
}

/// Where a request first differs from the previous one, as the prefix diff says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The part (`system`, `tool \`bash\``, `message 3`).
    pub part: String,
    /// The plugin that gave it, when the provenance says.
    pub plugin: Option<String>,
    /// The diff's first cause, in words.
    pub cause: Option<String>,
}

/// One request as the outcome sees it: when it was sent, its blocks and what the provider
/// reported for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    /// When it was sent, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Its blocks in reading order (tokens in any unit: they are scaled to the reported
    /// input).
    pub blocks: Vec<Block>,
    /// What the provider reported.
    pub usage: ProviderUsage,
}

/// A step's cache outcome, recorded with its reply (`cache` in an `assistant/message` body).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Outcome {
    /// Why it was served as it was.
    pub outcome: Kind,
    /// The format the request was sent in (the provider's).
    pub format: Format,
    /// The request's model (its body's `model`): prices and cache minimums are per model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// When the request was sent (ms since the Unix epoch): the client's `sent_at`, else the
    /// step's time.
    pub sent_at_ms: u64,
    /// Input tokens the model expected the cache to read.
    pub expected_read: u64,
    /// Tokens the previous request left cached that this one did not read, when it missed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost: u64,
    /// Milliseconds since the previous replied request of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<u64>,
    /// `prefix_changed`: the part where the request first differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// `prefix_changed`: the plugin that gave that part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// `prefix_changed`, `model_changed`, `compacted`: the diff's cause in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Blocks whose tokens add up to `total` (the provider's count), in proportion to theirs.
pub(crate) fn scaled(blocks: &[Block], total: u64) -> Vec<Block> {
    let ours: u64 = blocks.iter().map(|b| b.tokens).sum();
    if ours == 0 {
        return blocks.to_vec();
    }
    let (mut seen, mut given) = (0u64, 0u64);
    blocks
        .iter()
        .map(|b| {
            // Cumulative rounding: the scaled blocks add up to `total` exactly.
            seen += b.tokens;
            let end = (u128::from(seen) * u128::from(total) / u128::from(ours)) as u64;
            let tokens = end - given;
            given = end;
            Block { tokens, ..*b }
        })
        .collect()
}

/// What the provider held for a request after serving it: what it read and wrote (Anthropic
/// reports both; for OpenAI's automatic cache, what the model says it wrote).
fn held_after(rules: &Rules, seen: &Seen, modelled: u64) -> u64 {
    match rules.family {
        Family::Breakpoints => {
            seen.usage.cached_tokens.unwrap_or(0) + seen.usage.cache_write_tokens.unwrap_or(0)
        }
        Family::Automatic => modelled,
    }
}

/// The outcome of `now` after `prev` (the session's previous replied request, if any);
/// `compacted` says history was compacted or trimmed between them, and `change` (asked only
/// when the model finds the prefix changed) where and by whom.
pub fn classify(
    rules: &Rules,
    format: Format,
    prev: Option<&Seen>,
    now: &Seen,
    compacted: bool,
    change: impl FnOnce() -> Option<Change>,
) -> Outcome {
    let input = |s: &Seen| s.usage.input_tokens.unwrap_or(0);
    let mut cache = Cache::new(rules.clone());
    let mut held = 0;
    if let Some(p) = prev {
        let served = cache.serve(&Request::new(p.at_ms, scaled(&p.blocks, input(p))));
        held = held_after(rules, p, served.read + served.written + served.written_1h);
    }
    let at_ms = now.at_ms.max(prev.map_or(0, |p| p.at_ms));
    let modelled = cache.serve(&Request::new(at_ms, scaled(&now.blocks, input(now))));
    let read = now.usage.cached_tokens.unwrap_or(0);
    let total = input(now);
    // The tolerance covers the model's estimates: its expected read always, what the previous
    // request held only when that too is modelled (automatic caches report no writes).
    let tolerance = (total / 20).max(rules.step_tokens);
    let held_slack = match rules.family {
        Family::Breakpoints => 0,
        Family::Automatic => tolerance,
    };
    let mut outcome = Outcome {
        outcome: Kind::Hit,
        format,
        model: String::new(),
        sent_at_ms: now.at_ms,
        expected_read: modelled.read,
        lost: 0,
        gap_ms: prev.map(|p| now.at_ms.saturating_sub(p.at_ms)),
        part: None,
        plugin: None,
        cause: None,
    };
    let kind = if read + tolerance < modelled.read {
        // The provider kept less than the rules say it should have.
        match rules.family {
            Family::Automatic => Kind::Routing,
            Family::Breakpoints if held == 0 && prev.is_some() => Kind::Uncacheable,
            Family::Breakpoints => Kind::Unexplained,
        }
    } else if read > modelled.read + tolerance && read + held_slack >= held {
        // Kept warm by a request this session's log does not hold (another session).
        Kind::Hit
    } else {
        // As modelled, or more (another session kept part of it warm), but less than the
        // previous request left cached: the model's cause says why.
        // Where this request first differs from the previous one, in blocks.
        let diverges = prev.and_then(|p| {
            let at = p
                .blocks
                .iter()
                .zip(&now.blocks)
                .position(|(a, b)| a.hash != b.hash);
            at.or((now.blocks.len() < p.blocks.len()).then_some(now.blocks.len()))
        });
        match (modelled.cause, diverges) {
            (Cause::Hit, _) => Kind::Hit,
            (Cause::Expired, _) => Kind::TtlExpired,
            (Cause::TooShort, _) => Kind::Uncacheable,
            (Cause::Routing, _) => Kind::Routing,
            _ if prev.is_none() => Kind::Cold,
            (_, None) => Kind::Partial,
            (_, Some(block)) => {
                let found = change();
                if block == 0 {
                    outcome.cause = found.and_then(|c| c.cause);
                    Kind::ModelChanged
                } else if compacted && found.as_ref().is_none_or(|c| c.part.starts_with("message"))
                {
                    outcome.cause = found.and_then(|c| c.cause);
                    Kind::Compacted
                } else {
                    if let Some(c) = found {
                        outcome.part = Some(c.part);
                        outcome.plugin = c.plugin;
                        outcome.cause = c.cause;
                    }
                    Kind::PrefixChanged
                }
            }
        }
    };
    outcome.outcome = kind;
    if kind.is_miss() {
        // What the previous request left cached and this one did not read, whatever this
        // request's own size (a compacted request is shorter than what it lost).
        outcome.lost = held.saturating_sub(read);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Ttl;

    const F: Format = Format::Anthropic;
    const MIN: u64 = 60_000;

    fn anthropic() -> Rules {
        Rules::anthropic("claude-sonnet-4-5")
    }

    /// Tools and system (2,000 tokens, one breakpoint) then `n` messages of 100 tokens, the
    /// last with a breakpoint; `head` names the head's bytes.
    fn blocks(head: u64, n: u64) -> Vec<Block> {
        let mut b = vec![
            Block::new(1, 0, None),
            Block::new(head, 2000, Some(Ttl::Minutes5)),
        ];
        for i in 0..n {
            b.push(Block::new(
                100 + i,
                100,
                (i + 1 == n).then_some(Ttl::Minutes5),
            ));
        }
        b
    }

    fn usage(input: u64, read: u64, write: u64) -> ProviderUsage {
        ProviderUsage {
            input_tokens: Some(input),
            cached_tokens: Some(read),
            cache_write_tokens: Some(write),
            ..ProviderUsage::default()
        }
    }

    fn seen(at_ms: u64, blocks: Vec<Block>, u: ProviderUsage) -> Seen {
        Seen {
            at_ms,
            blocks,
            usage: u,
        }
    }

    #[test]
    fn a_growing_conversation_read_as_modelled_is_a_hit() {
        let a = seen(0, blocks(2, 1), usage(2100, 0, 2100));
        let b = seen(MIN, blocks(2, 2), usage(2200, 2100, 100));
        let o = classify(&anthropic(), F, Some(&a), &b, false, || None);
        assert_eq!((o.outcome, o.expected_read, o.lost), (Kind::Hit, 2100, 0));
        assert_eq!(
            classify(&anthropic(), F, None, &a, false, || None).outcome,
            Kind::Cold
        );
    }

    #[test]
    fn a_changed_system_names_the_part_and_the_plugin() {
        let a = seen(0, blocks(2, 1), usage(2100, 0, 2100));
        let b = seen(MIN, blocks(3, 2), usage(2200, 0, 2200));
        let o = classify(&anthropic(), F, Some(&a), &b, false, || {
            Some(Change {
                part: "system".into(),
                plugin: Some("skills".into()),
                cause: Some("section `skills` text changed".into()),
            })
        });
        assert_eq!(o.outcome, Kind::PrefixChanged);
        assert_eq!(
            (o.part.as_deref(), o.plugin.as_deref()),
            (Some("system"), Some("skills"))
        );
        assert_eq!(o.lost, 2100);
    }

    #[test]
    fn a_gap_past_the_ttl_is_ttl_expired_and_a_model_change_is_model_changed() {
        let a = seen(0, blocks(2, 1), usage(2100, 0, 2100));
        let b = seen(5 * MIN + 1, blocks(2, 2), usage(2200, 0, 2200));
        assert_eq!(
            classify(&anthropic(), F, Some(&a), &b, false, || None).outcome,
            Kind::TtlExpired
        );
        let mut other = blocks(2, 2);
        other[0] = Block::new(9, 0, None);
        let c = seen(MIN, other, usage(2200, 0, 2200));
        let o = classify(&anthropic(), F, Some(&a), &c, false, || None);
        assert_eq!(o.outcome, Kind::ModelChanged);
    }

    #[test]
    fn compacted_history_is_compacted_and_a_short_prefix_uncacheable() {
        let a = seen(0, blocks(2, 3), usage(2300, 0, 2300));
        let mut shorter = blocks(2, 2);
        shorter[2] = Block::new(999, 100, None); // the summary in place of two messages
        let b = seen(MIN, shorter, usage(2200, 2000, 200));
        let change = || {
            Some(Change {
                part: "message 1".into(),
                plugin: None,
                cause: None,
            })
        };
        assert_eq!(
            classify(&anthropic(), F, Some(&a), &b, true, change).outcome,
            Kind::Compacted
        );
        let tiny = vec![Block::new(5, 300, Some(Ttl::Minutes5))];
        let s = seen(0, tiny, usage(300, 0, 0));
        assert_eq!(
            classify(&anthropic(), F, None, &s, false, || None).outcome,
            Kind::Uncacheable
        );
    }

    #[test]
    fn less_read_than_modelled_is_routing_on_openai_and_unexplained_on_anthropic() {
        let a = seen(0, blocks(2, 1), usage(2100, 0, 2100));
        let b = seen(MIN, blocks(2, 2), usage(2200, 0, 2200));
        assert_eq!(
            classify(&anthropic(), F, Some(&a), &b, false, || None).outcome,
            Kind::Unexplained
        );
        let openai = Rules::openai(0.5);
        let a = seen(0, blocks(2, 1), usage(2100, 0, 0));
        let b = seen(MIN, blocks(2, 2), usage(2200, 0, 0));
        let o = classify(&openai, F, Some(&a), &b, false, || None);
        assert_eq!((o.outcome, o.expected_read), (Kind::Routing, 2048));
        let served = seen(MIN, blocks(2, 2), usage(2200, 2048, 0));
        assert_eq!(
            classify(&openai, F, Some(&a), &served, false, || None).outcome,
            Kind::Hit
        );
    }

    #[test]
    fn more_read_than_modelled_is_a_hit_kept_warm_elsewhere() {
        let s = seen(0, blocks(2, 1), usage(2100, 2000, 100));
        assert_eq!(
            classify(&anthropic(), F, None, &s, false, || None).outcome,
            Kind::Hit
        );
    }

    #[test]
    fn a_head_kept_warm_by_another_session_does_not_hide_an_expired_tail() {
        let a = seen(0, blocks(2, 4), usage(2400, 0, 2400));
        // Ten minutes on, the provider reads the 2,000-token head another session kept warm.
        let b = seen(10 * MIN, blocks(2, 5), usage(2500, 2000, 500));
        let o = classify(&anthropic(), F, Some(&a), &b, false, || None);
        assert_eq!((o.outcome, o.lost), (Kind::TtlExpired, 400));
    }

    #[test]
    fn compacted_lost_counts_what_the_previous_request_left_cached_not_this_ones_size() {
        // The issue's case: 3,763 left cached; the compacted request reads its 2,599-token
        // head of 2,894: 1,164 lost, not the 295 uncached tokens of this request.
        let mut before = vec![
            Block::new(1, 0, None),
            Block::new(2, 2599, Some(Ttl::Minutes5)),
        ];
        before.extend((0..4).map(|i| Block::new(100 + i, 291, (i == 3).then_some(Ttl::Minutes5))));
        let a = seen(0, before, usage(3763, 3600, 163));
        let after = vec![
            Block::new(1, 0, None),
            Block::new(2, 2599, Some(Ttl::Minutes5)),
            Block::new(999, 295, Some(Ttl::Minutes5)),
        ];
        let b = seen(27_000, after, usage(2894, 2599, 295));
        let change = || {
            Some(Change {
                part: "message 1".into(),
                plugin: None,
                cause: None,
            })
        };
        let o = classify(&anthropic(), F, Some(&a), &b, true, change);
        assert_eq!((o.outcome, o.lost), (Kind::Compacted, 1164));
    }

    #[test]
    fn a_small_expired_tail_is_a_miss_however_small() {
        // Another session kept the 3,000-token head warm; after 626 s this session's own
        // 139-token tail is gone: within 5% of the input, yet a miss the rules explain.
        let head = || {
            vec![
                Block::new(1, 0, None),
                Block::new(2, 3000, Some(Ttl::Minutes5)),
            ]
        };
        let mut before = head();
        before.push(Block::new(3, 139, Some(Ttl::Minutes5)));
        let a = seen(0, before, usage(3139, 0, 3139));
        let mut after = head();
        after.push(Block::new(3, 139, None));
        after.push(Block::new(4, 50, Some(Ttl::Minutes5)));
        let b = seen(626_000, after.clone(), usage(3189, 3000, 189));
        let o = classify(&anthropic(), F, Some(&a), &b, false, || None);
        assert_eq!((o.outcome, o.lost), (Kind::TtlExpired, 139));
        // Everything it left cached read (another session kept it all warm): a hit.
        let c = seen(626_000, after, usage(3189, 3139, 50));
        let o = classify(&anthropic(), F, Some(&a), &c, false, || None);
        assert_eq!((o.outcome, o.lost), (Kind::Hit, 0));
    }

    #[test]
    fn scaled_blocks_add_up_to_the_reported_input() {
        let b = scaled(&blocks(2, 3), 1234);
        assert_eq!(b.iter().map(|b| b.tokens).sum::<u64>(), 1234);
    }
}
