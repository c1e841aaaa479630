//! `ttl = "auto"` (issue 30): the TTL of an agent's Anthropic breakpoints chosen per session
//! by the break-even arithmetic over the idle gaps its replies recorded.
//!
//! Per request, with `P` the prefix a cache entry would serve (the previous request's input)
//! and `N` what the request adds, and the [`Rules`]' multiples of the input price (`r` a read,
//! `w5` and `w1` a 5-minute and a 1-hour write), the 1-hour TTL
//!
//! - costs `N·(w1 − w5)` more after a gap the 5-minute entry survives (≤ 5 minutes);
//! - saves `P·(w5 − r) − N·(w1 − w5)` after a gap only the 1-hour entry survives (5 minutes to
//!   an hour): the prefix is read instead of written again;
//! - costs `(P + N)·(w1 − w5)` more after a gap neither survives, and on a session's first
//!   request (everything is written either way, at the dearer rate).
//!
//! Summed over the gaps seen, `1h` is chosen when the sum saves: `mid·P·(w5 − r) >
//! (short + mid)·N·(w1 − w5) + cold·(P + N)·(w1 − w5)`, with `P` and `N` the session's means.
//! With the documented prices (r = 0.1, w5 = 1.25, w1 = 2), one gap between 5 minutes and an
//! hour pays for about 1.5 cold starts of the same prefix, or for steps adding `1.5·P` in all.
//!
//! ```
//! use promptd_core::cache::ttl::Gaps;
//! use promptd_core::cache::{Rules, Ttl};
//!
//! let rules = Rules::anthropic("claude-sonnet-4-5");
//! let mut quick = Gaps::default();
//! for (gap_s, input) in [(None, 20_000), (Some(20), 20_300), (Some(30), 20_600), (Some(25), 20_900)] {
//!     quick.add(gap_s.map(|s: u64| s * 1000), input);
//! }
//! assert_eq!(quick.choose(&rules), Ttl::Minutes5);
//! let mut idle = Gaps::default();
//! for (gap_s, input) in [(None, 20_000), (Some(600), 20_300), (Some(900), 20_600), (Some(30), 20_900)] {
//!     idle.add(gap_s.map(|s: u64| s * 1000), input);
//! }
//! assert_eq!(idle.choose(&rules), Ttl::Hour1);
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
}

impl Gaps {
    /// Counts one replied request: the idle gap since the request before it to its prefix
    /// (`None`: none before) and its input tokens. Gaps are classed by the documented TTLs
    /// (5 minutes, 1 hour).
    pub fn add(&mut self, gap_ms: Option<u64>, input: u64) {
        const FIVE_MINUTES: u64 = 5 * 60 * 1000;
        const HOUR: u64 = 60 * 60 * 1000;
        match gap_ms {
            None => self.cold += 1,
            Some(g) if g <= FIVE_MINUTES => self.short += 1,
            Some(g) if g <= HOUR => self.mid += 1,
            Some(_) => self.long += 1,
        }
        if self.requests > 0 {
            self.added += input.saturating_sub(self.last_input);
        }
        self.requests += 1;
        self.input += input;
        self.last_input = input;
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
        let saved = self.mid as f64 * prefix * (rules.write_5m - rules.read);
        let cost = (self.short + self.mid) as f64 * added * dearer
            + (self.cold + self.long) as f64 * (prefix + added) * dearer;
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

    fn gaps(script: &[(Option<u64>, u64)]) -> Gaps {
        let mut g = Gaps::default();
        for (gap_s, input) in script {
            g.add(gap_s.map(|s| s * 1000), *input);
        }
        g
    }

    #[test]
    fn the_break_even_is_the_formula_at_the_documented_prices() {
        let rules = Rules::anthropic("claude-sonnet-4-5");
        // P = 10,000, N = 0: one mid gap saves 11,500 (×input price); one cold start costs
        // 7,500 more at 1 hour. One mid gap per cold start: 1 hour.
        let one = gaps(&[(None, 10_000), (Some(600), 10_000)]);
        assert_eq!(one.choose(&rules), Ttl::Hour1);
        // Two cold starts (a model change) per mid gap: 11,500 < 15,000.
        let mut two = one;
        two.add(None, 10_000);
        assert_eq!(two.choose(&rules), Ttl::Minutes5);
        // Gaps past the hour cost like cold starts.
        let long = gaps(&[(None, 10_000), (Some(600), 10_000), (Some(7200), 10_000)]);
        assert_eq!(long.choose(&rules), Ttl::Minutes5);
        // A loop adding a lot per step pays the dearer write on every step.
        let busy = gaps(&[
            (None, 10_000),
            (Some(600), 16_000),
            (Some(10), 22_000),
            (Some(10), 28_000),
        ]);
        assert_eq!(busy.choose(&rules), Ttl::Minutes5);
    }

    #[test]
    fn a_session_without_enough_gaps_takes_the_agents_then_five_minutes() {
        let rules = Rules::anthropic("claude-sonnet-4-5");
        let new = gaps(&[(None, 10_000)]);
        let idle_agent = gaps(&[(None, 10_000), (Some(900), 10_000), (Some(900), 10_000)]);
        assert_eq!(choose(&new, Some(&idle_agent), &rules), Ttl::Hour1);
        assert_eq!(choose(&new, None, &rules), Ttl::Minutes5);
        let quick = gaps(&[(None, 10_000), (Some(5), 10_100), (Some(5), 10_200)]);
        assert_eq!(choose(&quick, Some(&idle_agent), &rules), Ttl::Minutes5);
    }

    #[test]
    fn prices_overridden_in_the_config_move_the_break_even() {
        let mut rules = Rules::anthropic("claude-sonnet-4-5");
        let one = gaps(&[(None, 10_000), (Some(600), 10_000)]);
        rules.write_1h = 3.0; // a cold start now costs 17,500 more at 1 hour
        assert_eq!(one.choose(&rules), Ttl::Minutes5);
    }
}
