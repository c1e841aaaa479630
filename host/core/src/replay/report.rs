//! A replay's report: per step and summed.

use serde::Serialize;

use crate::formats::Format;
use crate::ErrorBody;

/// How a step's tokens were counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Counted {
    /// The recorded request's tokens are what the provider reported for its reply; the
    /// candidate's are its bytes at the same tokens per byte.
    Provider,
    /// No count was reported for this step: both at the tokens per byte of the latest step
    /// that had one, else four bytes a token.
    Estimate,
}

/// One step's tokens: the recorded request's and the candidate's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Tokens {
    /// The recorded request's input tokens.
    pub recorded: u64,
    /// The candidate request's input tokens.
    pub candidate: u64,
    /// `candidate − recorded`.
    pub delta: i64,
    /// Whether `recorded` is the provider's count.
    pub counted: Counted,
}

/// What a prompt cache does with a step's request, and what it costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Figures {
    /// The request's model (prices and cache minimums are per model); empty in totals.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Input tokens served from the cache.
    pub read: u64,
    /// Input tokens written to it (5-minute entries, or the automatic kind's).
    pub written: u64,
    /// Input tokens written to 1-hour entries.
    pub written_1h: u64,
    /// Input tokens neither read nor written: missed.
    pub uncached: u64,
    /// The request's cost in US dollars (input as above, output as the recorded reply's) by
    /// the config's `[pricing]`; `None` without a price for the model.
    pub cost: Option<f64>,
}

/// Where a candidate request first differs from the recorded one, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Difference {
    /// The byte offset in the provider's reading stream (model, tools, system, messages, each
    /// as the format sends it without cache markers: Q16) where they first differ; for a
    /// difference only in settings the stream does not hold, its length.
    pub offset: u64,
    /// The part where they first differ: `model`, `tool \`NAME\``, `system`, `message N`, or
    /// `settings`.
    pub part: String,
    /// The plugin behind that part, when the provenance or the candidate's assembly says.
    pub plugin: Option<String>,
    /// The first cause, in words.
    pub cause: String,
    /// Every cause, most important first.
    pub causes: Vec<String>,
}

/// One step of a replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepReplay {
    /// The step's number.
    pub step: u64,
    /// Whether the candidate's request differs from the recorded one in any byte (a step the
    /// candidate cannot plan differs).
    pub differs: bool,
    /// Where and why, when it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<Difference>,
    /// Why the candidate cannot plan this step; the recorded step stands in for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// Input tokens of both requests.
    pub tokens: Tokens,
    /// The cache model fed the recorded requests.
    pub recorded: Figures,
    /// The cache model fed the candidate's requests, at the recorded times.
    pub candidate: Figures,
    /// What the provider reported for the recorded reply, priced alike, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported: Option<Figures>,
}

/// The sums of a replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplayTotals {
    /// Steps replayed.
    pub steps: u64,
    /// Steps whose candidate request differs (failed ones included).
    pub differing_steps: u64,
    /// Steps the candidate could not plan.
    pub failed_steps: u64,
    /// Input tokens of the recorded requests.
    pub tokens_recorded: u64,
    /// Input tokens of the candidate's.
    pub tokens_candidate: u64,
    /// `tokens_candidate − tokens_recorded`.
    pub tokens_delta: i64,
    /// The recorded requests' figures, summed (cost: of the priced steps).
    pub recorded: Figures,
    /// The candidate's, summed.
    pub candidate: Figures,
    /// The provider-reported figures, summed over the steps that have them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported: Option<Figures>,
    /// `candidate.cost − recorded.cost`, when both are priced.
    pub cost_delta: Option<f64>,
    /// Models without a `[pricing]` table (their steps have no cost).
    pub unpriced_models: Vec<String>,
}

impl ReplayTotals {
    /// Adds one step.
    pub fn add(&mut self, s: &StepReplay) {
        self.steps += 1;
        self.differing_steps += u64::from(s.differs);
        self.failed_steps += u64::from(s.error.is_some());
        self.tokens_recorded += s.tokens.recorded;
        self.tokens_candidate += s.tokens.candidate;
        self.tokens_delta = signed(self.tokens_candidate, self.tokens_recorded);
        add_figures(&mut self.recorded, &s.recorded);
        add_figures(&mut self.candidate, &s.candidate);
        if let Some(r) = &s.reported {
            add_figures(self.reported.get_or_insert_with(Figures::default), r);
        }
        for f in [&s.recorded, &s.candidate] {
            if f.cost.is_none() && !self.unpriced_models.contains(&f.model) {
                self.unpriced_models.push(f.model.clone());
                self.unpriced_models.sort();
            }
        }
        self.cost_delta = match (self.candidate.cost, self.recorded.cost) {
            (Some(c), Some(r)) => Some(c - r),
            _ => None,
        };
    }

    /// Adds every step `other` summed.
    pub fn merge(&mut self, other: &ReplayTotals) {
        self.steps += other.steps;
        self.differing_steps += other.differing_steps;
        self.failed_steps += other.failed_steps;
        self.tokens_recorded += other.tokens_recorded;
        self.tokens_candidate += other.tokens_candidate;
        self.tokens_delta = signed(self.tokens_candidate, self.tokens_recorded);
        add_figures(&mut self.recorded, &other.recorded);
        add_figures(&mut self.candidate, &other.candidate);
        if let Some(r) = &other.reported {
            add_figures(self.reported.get_or_insert_with(Figures::default), r);
        }
        for m in &other.unpriced_models {
            if !self.unpriced_models.contains(m) {
                self.unpriced_models.push(m.clone());
            }
        }
        self.unpriced_models.sort();
        self.cost_delta = match (self.candidate.cost, self.recorded.cost) {
            (Some(c), Some(r)) => Some(c - r),
            _ => None,
        };
    }
}

fn add_figures(into: &mut Figures, f: &Figures) {
    into.read += f.read;
    into.written += f.written;
    into.written_1h += f.written_1h;
    into.uncached += f.uncached;
    if let Some(c) = f.cost {
        *into.cost.get_or_insert(0.0) += c;
    }
}

pub(super) fn signed(a: u64, b: u64) -> i64 {
    if a >= b {
        i64::try_from(a - b).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b - a).map_or(i64::MIN, |d| -d)
    }
}

/// A session replayed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionReplay {
    /// The session's id.
    pub session: String,
    /// Its agent.
    pub agent: String,
    /// The provider format compared and priced.
    pub format: Format,
    /// Each step, in order.
    pub steps: Vec<StepReplay>,
    /// The sums.
    pub totals: ReplayTotals,
}
