//! The cost ledger's prices: the config's `[pricing."MODEL"]` tables, in US dollars per
//! million tokens. promptd guesses no price: without a table for a step's model, the ledger
//! counts tokens only.
//!
//! ```
//! use promptd_core::cache::price::Price;
//! use promptd_core::cache::Rules;
//! use promptd_core::formats::replies::ProviderUsage;
//!
//! let price = Price { input: 3.0, output: 15.0, ..Price::default() };
//! let usage = ProviderUsage {
//!     input_tokens: Some(10_000), output_tokens: Some(500),
//!     cached_tokens: Some(8_000), cache_write_tokens: Some(1_000),
//!     ..ProviderUsage::default()
//! };
//! let cost = price.cost(&Rules::anthropic("claude-sonnet-4-5"), &usage, 0);
//! // 1,000 uncached at $3, 8,000 read at $0.30, 1,000 written at $3.75, 500 out at $15.
//! assert!((cost.total - (0.003 + 0.0024 + 0.00375 + 0.0075)).abs() < 1e-12);
//! ```

use serde::{Deserialize, Serialize};

use super::Rules;
use crate::formats::replies::ProviderUsage;

/// One model's prices, US dollars per million tokens. The cache prices default to the
/// provider's documented multiples of `input` ([`Rules::read`], [`Rules::write_5m`],
/// [`Rules::write_1h`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// An uncached input token.
    pub input: f64,
    /// An output token.
    pub output: f64,
    /// An input token read from the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    /// An input token written to a 5-minute cache entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_5m: Option<f64>,
    /// An input token written to a 1-hour cache entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
}

/// What one step cost, in US dollars.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Cost {
    /// Everything below, summed.
    pub total: f64,
    /// Uncached input.
    pub input: f64,
    /// Input read from the cache.
    pub cache_read: f64,
    /// Input written to the cache (5-minute and 1-hour).
    pub cache_write: f64,
    /// Output.
    pub output: f64,
    /// What the miss added: the lost tokens at the price they were paid at (written or
    /// uncached) less what reading them would have cost.
    pub miss: f64,
}

impl Price {
    /// Refuses a price that is not a finite number ≥ 0, naming the model and the key.
    pub fn check(&self, model: &str) -> Result<(), String> {
        let fields = [
            ("input", Some(self.input)),
            ("output", Some(self.output)),
            ("cache_read", self.cache_read),
            ("cache_write_5m", self.cache_write_5m),
            ("cache_write_1h", self.cache_write_1h),
        ];
        for (key, v) in fields {
            if let Some(v) = v {
                if !v.is_finite() || v < 0.0 {
                    return Err(format!(
                        "[pricing.\"{model}\"] {key} must be a price ≥ 0 (US dollars per million tokens), got {v}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// What `usage` cost under `rules` (which give the cache prices this table leaves out);
    /// `lost` tokens of cache the step missed are priced into [`Cost::miss`].
    pub fn cost(&self, rules: &Rules, usage: &ProviderUsage, lost: u64) -> Cost {
        let per = |n: u64, price: f64| n as f64 * price / 1e6;
        let read_price = self.cache_read.unwrap_or(self.input * rules.read);
        let w5 = self.cache_write_5m.unwrap_or(self.input * rules.write_5m);
        let w1h = self.cache_write_1h.unwrap_or(self.input * rules.write_1h);
        let total_in = usage.input_tokens.unwrap_or(0);
        let read = usage.cached_tokens.unwrap_or(0).min(total_in);
        let written = usage.cache_write_tokens.unwrap_or(0).min(total_in - read);
        let written_1h = usage.cache_write_1h_tokens.unwrap_or(0).min(written);
        let uncached = total_in - read - written;
        let cache_write = per(written - written_1h, w5) + per(written_1h, w1h);
        let (input, cache_read, output) = (
            per(uncached, self.input),
            per(read, read_price),
            per(usage.output_tokens.unwrap_or(0), self.output),
        );
        // The lost tokens were written when there were writes, else paid as plain input.
        let paid = if written > 0 { w5 } else { self.input };
        Cost {
            total: input + cache_read + cache_write + output,
            input,
            cache_read,
            cache_write,
            output,
            miss: per(lost, (paid - read_price).max(0.0)),
        }
    }
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.total += o.total;
        self.input += o.input;
        self.cache_read += o.cache_read;
        self.cache_write += o.cache_write;
        self.output += o.output;
        self.miss += o.miss;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_reads_at_its_discount_and_writes_as_plain_input() {
        let price = Price {
            input: 2.0,
            output: 8.0,
            ..Price::default()
        };
        let usage = ProviderUsage {
            input_tokens: Some(4096),
            cached_tokens: Some(2048),
            output_tokens: Some(100),
            ..ProviderUsage::default()
        };
        let c = price.cost(&Rules::openai(0.25), &usage, 1000);
        assert!((c.input - 2048.0 * 2.0 / 1e6).abs() < 1e-12);
        assert!((c.cache_read - 2048.0 * 0.5 / 1e6).abs() < 1e-12);
        assert!((c.miss - 1000.0 * 1.5 / 1e6).abs() < 1e-12);
    }

    #[test]
    fn one_hour_writes_cost_their_own_price() {
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_write_1h: Some(6.0),
            ..Price::default()
        };
        let usage = ProviderUsage {
            input_tokens: Some(2000),
            cache_write_tokens: Some(2000),
            cache_write_1h_tokens: Some(1000),
            ..ProviderUsage::default()
        };
        let c = price.cost(&Rules::anthropic("claude-sonnet-4-5"), &usage, 0);
        assert!((c.cache_write - (1000.0 * 3.75 + 1000.0 * 6.0) / 1e6).abs() < 1e-12);
        assert_eq!(c.input, 0.0);
    }

    #[test]
    fn a_negative_or_infinite_price_is_refused_by_name() {
        let bad = Price {
            input: -1.0,
            ..Price::default()
        };
        let e = bad.check("gpt-5").unwrap_err();
        assert!(e.contains("[pricing.\"gpt-5\"] input"), "{e}");
    }
}
