//! The cost ledger (issue 29): each recorded reply's usage, cache outcome and cost by the
//! config's `[pricing]`, summed per session, per agent, per plugin and per cause of a miss.
//! Pure: the caller reads the logs.
//!
//! Without a price for a step's model the ledger counts its tokens and leaves it out of the
//! cost (its model is listed in `unpriced_models`): promptd guesses no price.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::cache::outcome::{Kind, Outcome};
use crate::cache::price::{Cost, Price};
use crate::cache::{Rules, RulesConfig};
use crate::formats::replies::ProviderUsage;

/// The prices and cache rules a ledger applies (the config's `[pricing]` and `[cache]`).
#[derive(Clone, Copy, Debug)]
pub struct Pricing<'a> {
    /// By model name.
    pub prices: &'a BTreeMap<String, Price>,
    /// Overrides of the cache rules (which give the cache prices a table leaves out).
    pub rules: &'a RulesConfig,
}

impl Pricing<'_> {
    /// What a reply's request cost, when its model has a price; `outcome` says the model and
    /// the tokens lost to a miss.
    pub fn cost(&self, usage: &ProviderUsage, outcome: Option<&Outcome>) -> Option<Cost> {
        let o = outcome?;
        let price = self.prices.get(&o.model)?;
        let rules = Rules::of(o.format, &o.model, self.rules)?;
        Some(price.cost(&rules, usage, o.lost))
    }
}

/// Totals of one cause.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CauseTotals {
    /// Replies with this outcome.
    pub replies: u64,
    /// Tokens of cache they lost.
    pub lost_tokens: u64,
    /// What the misses added, in US dollars (priced replies only).
    pub miss_cost: f64,
}

/// Sums over recorded replies.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Ledger {
    /// Replies recorded with a provider usage.
    pub replies: u64,
    /// Their input tokens (cached ones included).
    pub input_tokens: u64,
    /// Of those, read from the cache.
    pub cached_tokens: u64,
    /// Of those, written to the cache.
    pub cache_write_tokens: u64,
    /// Their output tokens.
    pub output_tokens: u64,
    /// `cached_tokens / input_tokens`.
    pub cached_share: Option<f64>,
    /// By cache outcome (`hit`, `ttl_expired`, …), for replies that have one.
    pub outcomes: BTreeMap<String, CauseTotals>,
    /// By the plugin whose change broke the prefix (`prefix_changed` outcomes naming one).
    pub plugins: BTreeMap<String, CauseTotals>,
    /// What the priced replies cost, in US dollars; `None` when none was priced.
    pub cost: Option<Cost>,
    /// Models of replies without a `[pricing]` table.
    pub unpriced_models: BTreeSet<String>,
}

impl Ledger {
    /// Adds one reply.
    pub fn add(&mut self, usage: &ProviderUsage, outcome: Option<&Outcome>, cost: Option<Cost>) {
        self.replies += 1;
        self.input_tokens += usage.input_tokens.unwrap_or(0);
        self.cached_tokens += usage.cached_tokens.unwrap_or(0);
        self.cache_write_tokens += usage.cache_write_tokens.unwrap_or(0);
        self.output_tokens += usage.output_tokens.unwrap_or(0);
        self.cached_share = ratio(self.cached_tokens, self.input_tokens);
        let miss = cost.map_or(0.0, |c| c.miss);
        if let Some(c) = cost {
            *self.cost.get_or_insert_with(Cost::default) += c;
        } else if let Some(o) = outcome {
            self.unpriced_models.insert(o.model.clone());
        }
        let Some(o) = outcome else { return };
        let add = |t: &mut CauseTotals| {
            t.replies += 1;
            t.lost_tokens += o.lost;
            t.miss_cost += miss;
        };
        add(self.outcomes.entry(o.outcome.as_str().into()).or_default());
        if let (Kind::PrefixChanged, Some(plugin)) = (o.outcome, &o.plugin) {
            add(self.plugins.entry(plugin.clone()).or_default());
        }
    }

    /// Adds every reply `other` summed.
    pub fn merge(&mut self, other: &Ledger) {
        self.replies += other.replies;
        self.input_tokens += other.input_tokens;
        self.cached_tokens += other.cached_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_share = ratio(self.cached_tokens, self.input_tokens);
        let fold = |into: &mut BTreeMap<String, CauseTotals>,
                    from: &BTreeMap<String, CauseTotals>| {
            for (k, t) in from {
                let e = into.entry(k.clone()).or_default();
                e.replies += t.replies;
                e.lost_tokens += t.lost_tokens;
                e.miss_cost += t.miss_cost;
            }
        };
        fold(&mut self.outcomes, &other.outcomes);
        fold(&mut self.plugins, &other.plugins);
        if let Some(c) = other.cost {
            *self.cost.get_or_insert_with(Cost::default) += c;
        }
        self.unpriced_models
            .extend(other.unpriced_models.iter().cloned());
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// A summary across sessions (`GET /v1/usage`, `promptd usage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Summary {
    /// Only replies to requests sent at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Sessions read.
    pub sessions: u64,
    /// Every reply counted.
    pub total: Ledger,
    /// By agent.
    pub agents: BTreeMap<String, Ledger>,
}

impl Summary {
    /// Adds one session of `agent`, whose ledger is `ledger`.
    pub fn add_session(&mut self, agent: &str, ledger: &Ledger) {
        self.sessions += 1;
        if ledger.replies == 0 {
            return; // an agent appears once it has a reply to count
        }
        self.total.merge(ledger);
        self.agents
            .entry(agent.to_string())
            .or_default()
            .merge(ledger);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::Format;

    fn outcome(kind: Kind, plugin: Option<&str>, lost: u64) -> Outcome {
        Outcome {
            outcome: kind,
            format: Format::Anthropic,
            model: "claude-sonnet-4-5".into(),
            sent_at_ms: 0,
            expected_read: 0,
            lost,
            gap_ms: None,
            part: None,
            plugin: plugin.map(String::from),
            cause: None,
        }
    }

    #[test]
    fn k4_misses_are_summed_by_cause_and_by_plugin_and_unpriced_models_listed() {
        let prices = BTreeMap::from([(
            "claude-sonnet-4-5".to_string(),
            Price {
                input: 3.0,
                output: 15.0,
                ..Price::default()
            },
        )]);
        let rules = RulesConfig::default();
        let pricing = Pricing {
            prices: &prices,
            rules: &rules,
        };
        let usage = ProviderUsage {
            input_tokens: Some(5000),
            cache_write_tokens: Some(5000),
            output_tokens: Some(10),
            ..ProviderUsage::default()
        };
        let mut ledger = Ledger::default();
        for o in [
            outcome(Kind::PrefixChanged, Some("skills"), 4000),
            outcome(Kind::TtlExpired, None, 5000),
        ] {
            ledger.add(&usage, Some(&o), pricing.cost(&usage, Some(&o)));
        }
        let mut other = outcome(Kind::Hit, None, 0);
        other.model = "unknown-model".into();
        ledger.add(&usage, Some(&other), pricing.cost(&usage, Some(&other)));
        assert_eq!(ledger.replies, 3);
        assert_eq!(ledger.plugins["skills"].lost_tokens, 4000);
        let miss = ledger.outcomes["ttl_expired"].miss_cost;
        assert!((miss - 5000.0 * (3.75 - 0.3) / 1e6).abs() < 1e-12, "{miss}");
        assert!(ledger.unpriced_models.contains("unknown-model"));
        let mut summary = Summary::default();
        summary.add_session("coder", &ledger);
        summary.add_session("coder", &ledger);
        assert_eq!(summary.agents["coder"].replies, 6);
    }
}
