//! The usage report: promptd's estimate per step against what the provider reported (Q14).

use super::*;

/// One step's estimate against what the provider reported for the reply that followed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepUsage {
    /// The step's number.
    pub step: u64,
    /// promptd's estimate of the request's tokens (`None` in logs without usage).
    pub estimate: Option<usize>,
    /// The tokenizer that estimated it.
    pub tokenizer: Option<String>,
    /// What the provider reported for the reply, when the client recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<crate::formats::replies::ProviderUsage>,
    /// How the provider's cache served the request, recorded with the reply (issue 29).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::outcome::Outcome>,
    /// What the request cost by the config's `[pricing]`, when its model has a price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::cache::price::Cost>,
}

/// The totals of a [`UsageReport`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageTotals {
    /// Steps with both an estimate and a reported input count.
    pub compared_steps: usize,
    /// Their estimates, summed.
    pub estimate: u64,
    /// Their reported input tokens, summed.
    pub actual: u64,
    /// `actual / estimate`, when there is an estimate.
    pub actual_per_estimate: Option<f64>,
    /// Their reported cached input tokens, summed.
    pub cached: u64,
    /// `cached / actual`, when there is an actual.
    pub cached_share: Option<f64>,
}

/// Per step, what promptd estimated against what the provider reported (Q14).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UsageReport {
    /// One entry per step, in order.
    pub steps: Vec<StepUsage>,
    /// The totals over the steps compared.
    pub totals: UsageTotals,
    /// The cost ledger over the session's replies: outcomes, misses by cause and plugin,
    /// cost.
    pub ledger: crate::ledger::Ledger,
}

/// Per step: what promptd estimated against what the provider reported for the reply that
/// followed (its input tokens, cached and cache-written ones), and the totals: how far the
/// estimate is off (`actual / estimate`) and what share of the input the cache served.
pub fn usage_report(session: &str, events: &[Event]) -> Result<UsageReport> {
    let prices = std::collections::BTreeMap::new();
    let rules = crate::cache::RulesConfig::default();
    let pricing = crate::ledger::Pricing {
        prices: &prices,
        rules: &rules,
    };
    priced_usage_report(session, events, pricing, None)
}

/// [`usage_report`], with costs by `pricing`, counting in the ledger only replies to
/// requests sent at or after `since_ms`.
pub fn priced_usage_report(
    session: &str,
    events: &[Event],
    pricing: crate::ledger::Pricing<'_>,
    since_ms: Option<u64>,
) -> Result<UsageReport> {
    let mut ledger = crate::ledger::Ledger::default();
    let mut steps: Vec<StepUsage> = Vec::new();
    let (mut estimate, mut actual, mut cached, mut compared) = (0u64, 0u64, 0u64, 0usize);
    let mut pending: Option<usize> = None;
    for event in events {
        match event.kind {
            crate::store::EventKind::Step | crate::store::EventKind::AssistantMessage => {}
            _ => continue,
        }
        match decode(session, event)? {
            Body::Step(m) => {
                steps.push(StepUsage {
                    step: m.step,
                    estimate: m.usage.as_ref().map(|u| u.total.tokens),
                    tokenizer: m.usage.map(|u| u.tokenizer),
                    actual: None,
                    cache: None,
                    cost: None,
                });
                pending = Some(steps.len() - 1);
            }
            Body::AssistantMessage(r) => {
                let (Some(i), Some(reported)) = (pending.take(), r.usage) else {
                    continue;
                };
                let step = &mut steps[i];
                if let (Some(est), Some(input)) = (step.estimate, reported.input_tokens) {
                    estimate += est as u64;
                    actual += input;
                    cached += reported.cached_tokens.unwrap_or(0);
                    compared += 1;
                }
                step.actual = Some(reported);
                step.cost = pricing.cost(&reported, r.cache.as_ref());
                let at = r.cache.as_ref().map_or(event.at_ms, |o| o.sent_at_ms);
                if since_ms.is_none_or(|since| at >= since) {
                    ledger.add(&reported, r.cache.as_ref(), step.cost);
                }
                step.cache = r.cache;
            }
            _ => {}
        }
    }
    let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
    Ok(UsageReport {
        steps,
        totals: UsageTotals {
            compared_steps: compared,
            estimate,
            actual,
            actual_per_estimate: ratio(actual, estimate),
            cached,
            cached_share: ratio(cached, actual),
        },
        ledger,
    })
}

/// One recorded reply with a provider usage, as the usage API counts it (issue 49): the step
/// it answered, when its request was sent, the gateway key that served it, its cache outcome
/// and cost.
#[derive(Clone, Debug, PartialEq)]
pub struct PricedReply {
    /// The step it answered.
    pub step: u64,
    /// When its request was sent (the outcome's `sent_at_ms`, else the reply's event time).
    pub at_ms: u64,
    /// The gateway key named by the step's `gateway/request` (`None`: no key, or no gateway).
    pub key: Option<String>,
    /// What the provider reported.
    pub usage: crate::formats::replies::ProviderUsage,
    /// How the provider's cache served it.
    pub outcome: Option<crate::cache::outcome::Outcome>,
    /// By the config's `[pricing]`, when its model has a price.
    pub cost: Option<crate::cache::price::Cost>,
}

/// Only the `key` of a `gateway/request` body: read apart from the typed record so a log
/// written before keys existed (no `key`) reads as "no key".
#[derive(serde::Deserialize)]
struct GatewayKey {
    #[serde(default)]
    key: Option<String>,
}

/// The session's replies that [`priced_usage_report`]'s ledger counts (a reply with a usage,
/// the first after a step marker), each with its step's gateway key.
pub fn priced_replies(
    session: &str,
    events: &[Event],
    pricing: crate::ledger::Pricing<'_>,
) -> Result<Vec<PricedReply>> {
    let mut replies = Vec::new();
    // The last step marker not answered yet, and its gateway key.
    let mut pending: Option<(u64, Option<String>)> = None;
    for event in events {
        match event.kind {
            crate::store::EventKind::Step => {
                if let Body::Step(m) = decode(session, event)? {
                    pending = Some((m.step, None));
                }
            }
            crate::store::EventKind::GatewayRequest => {
                // It follows its step's marker (docs/log-format.md).
                let read: GatewayKey =
                    serde_json::from_str(&event.body).map_err(|e| corrupt(session, event, e))?;
                if let Some((_, key)) = pending.as_mut() {
                    *key = read.key;
                }
            }
            crate::store::EventKind::AssistantMessage => {
                let Body::AssistantMessage(r) = decode(session, event)? else {
                    continue;
                };
                let Some(reported) = r.usage else {
                    // Not counted, but it answers the step, as in the report.
                    pending = None;
                    continue;
                };
                let Some((step, key)) = pending.take() else {
                    continue;
                };
                replies.push(PricedReply {
                    step,
                    at_ms: r.cache.as_ref().map_or(event.at_ms, |o| o.sent_at_ms),
                    key,
                    usage: reported,
                    cost: pricing.cost(&reported, r.cache.as_ref()),
                    outcome: r.cache,
                });
            }
            _ => {}
        }
    }
    Ok(replies)
}
