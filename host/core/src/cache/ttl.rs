//! `ttl = "auto"` (issue 30): the TTL of an agent's Anthropic breakpoints chosen per session
//! by the break-even arithmetic over the idle gaps its replies recorded.
//!
//! Per request, with `P` the prefix a 5-minute entry loses in a gap it does not survive (on
//! average, what the outcomes of such gaps recorded as `lost` while 5 minutes was in force;
//! the session's mean input where none was seen) and `N` what the request adds, and the
//! [`Rules`]' multiples of the input price (`r` a read, `w5` and `w1` a 5-minute and a 1-hour
//! write), the 1-hour TTL
//!
//! - costs `N·(w1 − w5)` more after a gap the 5-minute entry survives (≤ 5 minutes);
//! - saves `P·(w5 − r) − N·(w1 − w5)` after a gap only the 1-hour entry survives (5 minutes to
//!   an hour): the prefix is read instead of written again;
//! - costs `(P + N)·(w1 − w5)` more after a gap neither survives (everything is written
//!   either way, at the dearer rate).
//!
//! Summed over the gaps seen, `1h` is chosen when the sum saves: `mid·P·(w5 − r) >
//! (short + mid)·N·(w1 − w5) + long·(P + N)·(w1 − w5)`, with `N` the session's mean. With the
//! documented prices (r = 0.1, w5 = 1.25, w1 = 2), a gap between 5 minutes and an hour that
//! loses `P` pays for steps adding `1.5·P` in all. `P` is what was lost, not the prompt: in a
//! session whose head other sessions keep warm, a long gap loses only the session's own part,
//! and the hour buys less. A session's first request is not counted: its write is paid
//! whatever follows.
//!
//! ```
//! use promptd_core::cache::ttl::Gaps;
//! use promptd_core::cache::{Rules, Ttl};
//!
//! let rules = Rules::anthropic("claude-sonnet-4-5");
//! // (seconds since the request before, input tokens, tokens the gap lost at 5 minutes)
//! let mut quick = Gaps::default();
//! for (gap_s, input, lost) in [(None, 20_000, 0), (Some(20), 20_300, 0), (Some(30), 20_600, 0)] {
//!     quick.add(gap_s.map(|s: u64| s * 1000), input, Some(lost));
//! }
//! assert_eq!(quick.choose(&rules), Ttl::Minutes5);
//! let mut idle = Gaps::default();
//! for (gap_s, input, lost) in [(None, 20_000, 0), (Some(600), 23_000, 20_000), (Some(900), 26_000, 23_000)] {
//!     idle.add(gap_s.map(|s: u64| s * 1000), input, Some(lost));
//! }
//! assert_eq!(idle.choose(&rules), Ttl::Hour1);
//! // The same gaps where other sessions kept the 19,000-token head warm: 1,000 lost a gap.
//! let mut shared = Gaps::default();
//! for (gap_s, input, lost) in [(None, 20_000, 0), (Some(600), 23_000, 1_000), (Some(900), 26_000, 1_300)] {
//!     shared.add(gap_s.map(|s: u64| s * 1000), input, Some(lost));
//! }
//! assert_eq!(shared.choose(&rules), Ttl::Minutes5);
//! ```

use super::{Rules, Ttl};

/// Gaps a choice needs before it is the session's own: fewer, and the agent's are used.
pub const MIN_GAPS: u64 = 2;

/// What a session's (or an agent's) replied requests say about its idle gaps and sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Requests counted.
    pub requests: u64,
    /// Requests with no earlier request to their prefix (a session's first, a model change).
    pub cold: u64,
    /// Gaps of at most the 5-minute TTL.
    pub short: u64,
    /// Gaps over the 5-minute TTL and at most the 1-hour one.
    pub mid: u64,
    /// Gaps over the 1-hour TTL.
    pub long: u64,
    /// Input tokens of every request, summed.
    pub input: u64,
    /// What each request added to the one before, summed (growth only).
    pub added: u64,
    /// The last request's input tokens.
    pub last_input: u64,
    /// Tokens lost in gaps of 5 minutes to an hour while 5 minutes was in force, summed.
    pub lost_mid: u64,
    /// Such gaps whose loss was seen.
    pub lost_seen: u64,
}

impl Gaps {
    /// Counts one replied request: the idle gap since the request before it (`None`: none
    /// before), its input tokens, and the tokens the request before it left cached that it
    /// did not read (its outcome's `lost`; `None` where a 1-hour TTL was in force, which hides
    /// what 5 minutes would have lost). Gaps are classed by the documented TTLs (5 minutes,
    /// 1 hour).
    pub fn add(&mut self, gap_ms: Option<u64>, input: u64, lost: Option<u64>) {
        const FIVE_MINUTES: u64 = 5 * 60 * 1000;
        const HOUR: u64 = 60 * 60 * 1000;
        match gap_ms {
            None => self.cold += 1,
            Some(g) if g <= FIVE_MINUTES => self.short += 1,
            Some(g) if g <= HOUR => {
                self.mid += 1;
                if let Some(lost) = lost {
                    self.lost_mid += lost;
                    self.lost_seen += 1;
                }
            }
            Some(_) => self.long += 1,
        }
        if self.requests > 0 {
            self.added += input.saturating_sub(self.last_input);
        }
        self.requests += 1;
        self.input += input;
        self.last_input = input;
    }

    /// Counts a judged reply's request: its outcome's gap and loss, its input tokens; `hour`:
    /// the request's breakpoints were the hour's (what 5 minutes would have lost is hidden).
    pub fn add_outcome(&mut self, outcome: &super::outcome::Outcome, input: u64, hour: bool) {
        self.add(outcome.gap_ms, input, (!hour).then_some(outcome.lost));
    }

    /// Gaps seen (requests after a first).
    pub fn gaps(&self) -> u64 {
        self.short + self.mid + self.long
    }

    /// Adds `other`'s counts (an agent's over its sessions).
    pub fn merge(&mut self, other: &Gaps) {
        self.requests += other.requests;
        self.cold += other.cold;
        self.short += other.short;
        self.mid += other.mid;
        self.long += other.long;
        self.input += other.input;
        self.added += other.added;
        self.last_input = other.last_input;
        self.lost_mid += other.lost_mid;
        self.lost_seen += other.lost_seen;
    }

    /// The TTL the break-even arithmetic (module docs) favours under `rules`' prices; the
    /// 5-minute one when nothing was seen or the two cost the same.
    pub fn choose(&self, rules: &Rules) -> Ttl {
        if self.requests == 0 {
            return Ttl::Minutes5;
        }
        let n = self.requests as f64;
        let prefix = self.input as f64 / n;
        let added = match self.requests {
            1 => 0.0,
            k => self.added as f64 / (k - 1) as f64,
        };
        let dearer = (rules.write_1h - rules.write_5m).max(0.0);
        let lost = match self.lost_seen {
            0 => prefix,
            k => self.lost_mid as f64 / k as f64,
        };
        let saved = self.mid as f64 * lost * (rules.write_5m - rules.read);
        let cost = (self.short + self.mid) as f64 * added * dearer
            + self.long as f64 * (prefix + added) * dearer;
        if saved > cost {
            Ttl::Hour1
        } else {
            Ttl::Minutes5
        }
    }
}

/// The TTL for a session: by its own gaps once it has [`MIN_GAPS`], else by `agent`'s (the
/// agent's sessions seen so far), else 5 minutes.
pub fn choose(session: &Gaps, agent: Option<&Gaps>, rules: &Rules) -> Ttl {
    match agent {
        Some(agent) if session.gaps() < MIN_GAPS => agent.choose(rules),
        _ if session.gaps() < MIN_GAPS => Ttl::Minutes5,
        _ => session.choose(rules),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (seconds since the request before, input tokens, lost at 5 minutes).
    fn gaps(script: &[(Option<u64>, u64, Option<u64>)]) -> Gaps {
        let mut g = Gaps::default();
        for (gap_s, input, lost) in script {
            g.add(gap_s.map(|s| s * 1000), *input, *lost);
        }
        g
    }

    #[test]
    fn the_break_even_is_the_formula_at_the_documented_prices() {
        let rules = Rules::anthropic("claude-sonnet-4-5");
        // A mid gap that lost 10,000 saves 11,500 (×input price) at 1 hour; steps adding
        // 15,000 in all cost 11,250 more: the hour, just.
        let mid = gaps(&[
            (None, 10_000, None),
            (Some(600), 13_000, Some(10_000)),
            (Some(10), 16_000, Some(0)),
            (Some(10), 19_000, Some(0)),
            (Some(10), 22_000, Some(0)),
            (Some(10), 25_000, Some(0)),
        ]);
        assert_eq!(mid.choose(&rules), Ttl::Hour1);
        // One more such step (18,000 in all, 13,500 more) tips it back.
        let mut busier = mid;
        busier.add(Some(10_000), 28_000, Some(0));
        assert_eq!(busier.choose(&rules), Ttl::Minutes5);
        // Gaps past the hour cost the dearer write of everything.
        let long = gaps(&[
            (None, 10_000, None),
            (Some(600), 10_000, Some(10_000)),
            (Some(7200), 10_000, Some(10_000)),
            (Some(9000), 10_000, Some(10_000)),
        ]);
        assert_eq!(long.choose(&rules), Ttl::Minutes5);
    }

    #[test]
    fn what_a_gap_lost_is_the_prefix_not_the_prompt_and_the_hour_hides_it() {
        let rules = Rules::anthropic("claude-sonnet-4-5");
        // Seen under the hour, a mid gap's loss is unknown: the mean input stands for it.
        let unseen = gaps(&[(None, 10_000, None), (Some(600), 10_200, None)]);
        assert_eq!(unseen.choose(&rules), Ttl::Hour1);
        // A loss seen at 5 minutes stays the estimate once the hour hides later ones, so the
        // choice does not flip back and forth.
        let mut seen = gaps(&[(None, 10_000, None), (Some(600), 10_200, Some(100))]);
        assert_eq!(seen.choose(&rules), Ttl::Minutes5);
        seen.add(Some(900), 10_400, None);
        assert_eq!((seen.lost_seen, seen.choose(&rules)), (1, Ttl::Minutes5));
    }

    #[test]
    fn a_session_without_enough_gaps_takes_the_agents_then_five_minutes() {
        let rules = Rules::anthropic("claude-sonnet-4-5");
        let new = gaps(&[(None, 10_000, None)]);
        let idle_agent = gaps(&[
            (None, 10_000, None),
            (Some(900), 10_000, Some(10_000)),
            (Some(900), 10_000, Some(10_000)),
        ]);
        assert_eq!(choose(&new, Some(&idle_agent), &rules), Ttl::Hour1);
        assert_eq!(choose(&new, None, &rules), Ttl::Minutes5);
        let quick = gaps(&[
            (None, 10_000, None),
            (Some(5), 10_100, Some(0)),
            (Some(5), 10_200, Some(0)),
        ]);
        assert_eq!(choose(&quick, Some(&idle_agent), &rules), Ttl::Minutes5);
    }

    #[test]
    fn prices_overridden_in_the_config_move_the_break_even() {
        let mut rules = Rules::anthropic("claude-sonnet-4-5");
        let one = gaps(&[
            (None, 10_000, None),
            (Some(600), 14_000, Some(10_000)),
            (Some(10), 18_000, Some(0)),
        ]);
        assert_eq!(one.choose(&rules), Ttl::Hour1);
        rules.write_1h = 3.0; // 8,000 added now costs 14,000 more at the hour
        assert_eq!(one.choose(&rules), Ttl::Minutes5);
    }
}
