//! Gateway keys (G12): which key a request presents, whether it may use the agent and
//! upstream it asks for, and whether its rate and spend limits let it start. Pure: the
//! daemon keeps the counts and the store keeps the spend; this module judges.
//!
//! ```
//! use std::collections::BTreeMap;
//! use promptd_core::gateway::keys::{self, KeyConfig, KeyIndex, Periods, Used};
//! use promptd_core::gateway::Provider;
//!
//! let config: KeyConfig = toml::from_str(&format!(
//!     "token_sha256 = \"{}\"\nagents = [\"coder\"]\nusd_per_day = 5.0",
//!     keys::token_sha256("sk-team-a")
//! )).unwrap();
//! let index = KeyIndex::new(&BTreeMap::from([("team-a".to_string(), config)]));
//!
//! let header = |name: &str| (name == "x-api-key").then_some("sk-team-a");
//! let presented = keys::presented(Provider::Anthropic, &header).unwrap();
//! let (name, key) = index.find(presented.token).unwrap();
//! assert_eq!(name, "team-a");
//! assert!(key.allows("coder", "anthropic").is_ok());
//! assert!(key.allows("reviewer", "anthropic").is_err());
//!
//! // $5.00 spent today: the next request would start past the day's limit.
//! let periods = Periods::at(1_796_515_200_000 + 3_600_000); // 2026-12-06T01:00Z
//! let used = Used { day_micro_usd: 5_000_000, month_micro_usd: 5_000_000, requests_this_minute: 0 };
//! let over = key.judge(&used, &periods).unwrap_err();
//! assert_eq!(over.retry_after_s, 23 * 3600);
//! ```

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Provider;
use crate::calendar::{civil_from_days as civil, days_from_civil};

/// The header a client may send its gateway key in whatever provider it speaks to; its
/// provider credential then goes upstream as it came.
pub const KEY_HEADER: &str = "x-promptd-key";

/// Where a request's key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `x-promptd-key`: the client's provider credential is its own and goes upstream.
    KeyHeader,
    /// The provider's credential header (`x-api-key`, `Authorization: Bearer`,
    /// `x-goog-api-key`): the gateway key stands in for the provider's, so it is never
    /// forwarded and the upstream's configured credential is sent instead.
    Credential(&'static str),
}

/// A key a request presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Presented<'a> {
    /// The token as sent.
    pub token: &'a str,
    /// Where it was.
    pub via: Via,
}

/// `[gateway.keys.NAME]`: a key a team or an agent sends the gateway instead of its provider
/// key, what it may use, and its limits (G12).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// The SHA-256 (hex) of the token, never the token: one, or several while a token is
    /// rotated (each is accepted).
    pub token_sha256: Digests,
    /// The agents it may use (default: every agent the gateway serves).
    pub agents: Option<Vec<String>>,
    /// The upstreams it may reach, by `[gateway.upstream.NAME]` (default: all).
    pub upstreams: Option<Vec<String>>,
    /// Requests admitted per minute (UTC minute), per daemon.
    pub requests_per_minute: Option<u32>,
    /// Spend per UTC day, in USD, from the ledger's prices; counted in the store.
    pub usd_per_day: Option<Usd>,
    /// Spend per UTC month, in USD.
    pub usd_per_month: Option<Usd>,
}

/// `token_sha256`: one digest or a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Digests {
    /// One token.
    One(String),
    /// Several (a rotation: old and new).
    Many(Vec<String>),
}

impl Digests {
    /// The digests as written.
    pub fn hex(&self) -> &[String] {
        match self {
            Digests::One(d) => std::slice::from_ref(d),
            Digests::Many(d) => d,
        }
    }

    /// The digests as bytes; one that is not 64 hex digits is left out (config validation
    /// refuses it first).
    pub fn digests(&self) -> Vec<[u8; 32]> {
        self.hex().iter().filter_map(|h| decode_hex(h)).collect()
    }
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// An amount in US dollars, kept as whole micro-dollars so limits compare exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "f64")]
pub struct Usd(u64);

impl Usd {
    /// In micro-USD.
    pub fn micro(self) -> u64 {
        self.0
    }
}

impl TryFrom<f64> for Usd {
    type Error = String;

    fn try_from(usd: f64) -> std::result::Result<Usd, String> {
        if !usd.is_finite() || usd <= 0.0 || usd > 1e9 {
            return Err(format!(
                "{usd} is not an amount in USD (more than 0, at most 1e9)"
            ));
        }
        Ok(Usd((usd * 1e6).round() as u64))
    }
}

/// The key `header` (a lookup by lower-case name) presents to `provider`'s endpoints:
/// `x-promptd-key` first, else the credential header that provider's SDKs send.
pub fn presented<'a>(
    provider: Provider,
    header: &dyn Fn(&str) -> Option<&'a str>,
) -> Option<Presented<'a>> {
    let nonempty = |v: Option<&'a str>| v.map(str::trim).filter(|v| !v.is_empty());
    if let Some(token) = nonempty(header(KEY_HEADER)) {
        return Some(Presented {
            token,
            via: Via::KeyHeader,
        });
    }
    let bearer = || {
        let value = header("authorization")?;
        let (scheme, token) = value.trim().split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim())
            .filter(|t| !t.is_empty())
    };
    let (token, name) = match provider {
        Provider::Anthropic => match nonempty(header("x-api-key")) {
            Some(t) => (Some(t), "x-api-key"),
            None => (bearer(), "authorization"),
        },
        Provider::Gemini => match nonempty(header("x-goog-api-key")) {
            Some(t) => (Some(t), "x-goog-api-key"),
            None => (bearer(), "authorization"),
        },
        // OpenAI's SDKs, and a Bedrock API key (boto3's AWS_BEARER_TOKEN_BEDROCK); a SigV4
        // `Authorization` is no bearer token, so it presents nothing.
        Provider::Openai | Provider::Bedrock => (bearer(), "authorization"),
    };
    token.map(|token| Presented {
        token,
        via: Via::Credential(name),
    })
}

/// The SHA-256 of a token, in lower-case hex: what `[gateway.keys.NAME] token_sha256` holds.
pub fn token_sha256(token: &str) -> String {
    crate::store::sha256_hex(token.as_bytes())
}

/// The configured keys by the digest of their tokens.
#[derive(Debug, Default)]
pub struct KeyIndex {
    by_digest: HashMap<[u8; 32], String>,
    keys: BTreeMap<String, KeyConfig>,
}

impl KeyIndex {
    /// The index of `keys` (`[gateway.keys]`, already validated).
    pub fn new(keys: &BTreeMap<String, KeyConfig>) -> KeyIndex {
        let mut by_digest = HashMap::new();
        for (name, key) in keys {
            for digest in key.token_sha256.digests() {
                by_digest.insert(digest, name.clone());
            }
        }
        KeyIndex {
            by_digest,
            keys: keys.clone(),
        }
    }

    /// The key named `name`.
    pub fn get(&self, name: &str) -> Option<&KeyConfig> {
        self.keys.get(name)
    }

    /// Whether any key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key whose token `token` is, by name. Only digests are compared: the tokens
    /// themselves are nowhere in the config or in memory.
    pub fn find(&self, token: &str) -> Option<(&str, &KeyConfig)> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let name = self.by_digest.get(&digest)?;
        Some((name.as_str(), self.keys.get(name)?))
    }
}

/// Why a key may not serve a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAllowed {
    /// The key lists agents, and not this one.
    Agent,
    /// The key lists upstreams, and not this one.
    Upstream,
}

/// What a key used in the periods a request starts in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Used {
    /// Spent today (UTC), in micro-USD.
    pub day_micro_usd: u64,
    /// Spent this month (UTC), in micro-USD.
    pub month_micro_usd: u64,
    /// Requests admitted in the current minute.
    pub requests_this_minute: u32,
}

/// Which limit a request would start past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `requests_per_minute`.
    Rate,
    /// `usd_per_day`.
    Day,
    /// `usd_per_month`.
    Month,
}

impl Limit {
    /// promptd's stable code for the refusal.
    pub fn code(self) -> &'static str {
        match self {
            Limit::Rate => "key_rate_limit",
            Limit::Day | Limit::Month => "key_spend_limit",
        }
    }
}

/// A request refused by a limit, with when the period it is counted in ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Over {
    /// Which limit.
    pub limit: Limit,
    /// Seconds until the period ends (`retry-after`), at least 1.
    pub retry_after_s: u64,
    /// What the message says: the limit and what was used.
    pub detail: String,
}

impl KeyConfig {
    /// Whether the key may reach `agent` through the upstream named `upstream`.
    pub fn allows(&self, agent: &str, upstream: &str) -> Result<(), NotAllowed> {
        if let Some(agents) = &self.agents {
            if !agents.iter().any(|a| a == agent) {
                return Err(NotAllowed::Agent);
            }
        }
        if let Some(upstreams) = &self.upstreams {
            if !upstreams.iter().any(|u| u == upstream) {
                return Err(NotAllowed::Upstream);
            }
        }
        Ok(())
    }

    /// Whether a request may start, having used `used` in `periods`: a limit reached is a
    /// limit passed (a spend of exactly the limit leaves nothing to start with).
    pub fn judge(&self, used: &Used, periods: &Periods) -> Result<(), Over> {
        if let Some(rate) = self.requests_per_minute {
            if used.requests_this_minute >= rate {
                return Err(Over {
                    limit: Limit::Rate,
                    retry_after_s: periods.minute_ends_in_s,
                    detail: format!("{rate} requests per minute"),
                });
            }
        }
        let spend = [
            (
                Limit::Day,
                self.usd_per_day,
                used.day_micro_usd,
                "per day",
                periods.day_ends_in_s,
            ),
            (
                Limit::Month,
                self.usd_per_month,
                used.month_micro_usd,
                "per month",
                periods.month_ends_in_s,
            ),
        ];
        for (limit, max, spent, per, ends) in spend {
            if let Some(max) = max {
                if spent >= max.micro() {
                    return Err(Over {
                        limit,
                        retry_after_s: ends,
                        detail: format!("{} {per} (spent {}, UTC)", usd(max.micro()), usd(spent)),
                    });
                }
            }
        }
        Ok(())
    }
}

/// `$1.234567` for micro-USD.
pub fn usd(micro: u64) -> String {
    format!("${}.{:06}", micro / 1_000_000, micro % 1_000_000)
}

/// Keys counted at most: past it the counts start over (the store keeps the spend, so a
/// cleared count costs one read of it).
pub const MAX_COUNTED: usize = 10_000;

/// How old a shared store's spend may be before it is read again (other daemons spend too).
pub const SHARED_REFRESH_MS: u64 = 1_000;

/// Each key's counts in the periods of now: its spend as last read from or written to the
/// store, and the requests it was admitted in the current minute. Plain data: the daemon
/// holds it under a lock and does the store's reads and writes.
#[derive(Debug, Default)]
pub struct Counts {
    by_key: HashMap<String, Count>,
}

#[derive(Debug, Default)]
struct Count {
    day: String,
    month: String,
    day_micro_usd: u64,
    month_micro_usd: u64,
    /// When the spend was read (ms); none: never.
    read_at_ms: Option<u64>,
    refreshing: bool,
    minute: u64,
    requests: u32,
}

/// Whether a key's spend must be read from the store before its request is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpendRead {
    /// The count is current.
    No,
    /// Not read for these periods: read it, and judge after.
    Now,
    /// Read on a shared store more than [`SHARED_REFRESH_MS`] ago: judge with the count held
    /// and read it again in the background (marked as being read, so once at a time).
    Background,
}

impl Counts {
    fn entry(&mut self, name: &str) -> &mut Count {
        if self.by_key.len() >= MAX_COUNTED && !self.by_key.contains_key(name) {
            self.by_key.clear();
        }
        self.by_key.entry(name.to_string()).or_default()
    }

    /// Whether key `name`'s spend must be read (a key with no spend limit never needs it).
    pub fn spend_read(
        &mut self,
        name: &str,
        periods: &Periods,
        now_ms: u64,
        shared: bool,
    ) -> SpendRead {
        let Some(count) = self.by_key.get_mut(name) else {
            return SpendRead::Now;
        };
        match count.read_at_ms {
            Some(at) if count.day == periods.day => {
                let old = now_ms.saturating_sub(at) > SHARED_REFRESH_MS;
                if shared && old && !count.refreshing {
                    count.refreshing = true;
                    SpendRead::Background
                } else {
                    SpendRead::No
                }
            }
            _ => SpendRead::Now,
        }
    }

    /// Key `name`'s spend in `periods` as the store says (`totals`: the day's, the month's),
    /// or `None` when a background read failed (it is tried again later).
    pub fn read(&mut self, name: &str, periods: &Periods, totals: Option<&[u64]>, now_ms: u64) {
        let count = self.entry(name);
        count.refreshing = false;
        let Some(totals) = totals else {
            return;
        };
        count.day.clone_from(&periods.day);
        count.month.clone_from(&periods.month);
        count.day_micro_usd = totals.first().copied().unwrap_or(0);
        count.month_micro_usd = totals.get(1).copied().unwrap_or(0);
        count.read_at_ms = Some(now_ms);
    }

    /// Judges a request of key `name` (configured as `key`) by its limits, and counts it in
    /// its minute when it may start.
    pub fn admit(&mut self, key: &KeyConfig, name: &str, periods: &Periods) -> Result<(), Over> {
        let count = self.entry(name);
        if count.minute != periods.minute {
            count.minute = periods.minute;
            count.requests = 0;
        }
        let used = Used {
            day_micro_usd: if count.day == periods.day {
                count.day_micro_usd
            } else {
                0
            },
            month_micro_usd: if count.month == periods.month {
                count.month_micro_usd
            } else {
                0
            },
            requests_this_minute: count.requests,
        };
        key.judge(&used, periods)?;
        count.requests += 1;
        Ok(())
    }
}

/// The periods a moment falls in (UTC), named as the store counts them, and when each ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Periods {
    /// `2026-12-06`.
    pub day: String,
    /// `2026-12`.
    pub month: String,
    /// Minutes since the epoch.
    pub minute: u64,
    /// Seconds to the next minute, at least 1.
    pub minute_ends_in_s: u64,
    /// Seconds to the next UTC midnight, at least 1.
    pub day_ends_in_s: u64,
    /// Seconds to the first of next month, UTC, at least 1.
    pub month_ends_in_s: u64,
}

impl Periods {
    /// The periods of `now_ms` (ms since the Unix epoch).
    pub fn at(now_ms: u64) -> Periods {
        let secs = now_ms / 1000;
        let days = secs / 86_400;
        let (y, m, d) = civil(days);
        let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        let next_month = days_from_civil(ny, nm, 1) * 86_400;
        let up = |end: u64| end.saturating_sub(secs).max(1);
        Periods {
            day: format!("{y:04}-{m:02}-{d:02}"),
            month: format!("{y:04}-{m:02}"),
            minute: secs / 60,
            minute_ends_in_s: up((secs / 60 + 1) * 60),
            day_ends_in_s: up((days + 1) * 86_400),
            month_ends_in_s: up(next_month),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEC_6_2026: u64 = 1_796_515_200_000;

    #[test]
    fn periods_name_the_utc_day_and_month_and_when_they_end() {
        let p = Periods::at(DEC_6_2026);
        assert_eq!(
            (p.day.as_str(), p.month.as_str()),
            ("2026-12-06", "2026-12")
        );
        assert_eq!(p.day_ends_in_s, 86_400);
        assert_eq!(p.month_ends_in_s, 26 * 86_400);
        assert_eq!(p.minute_ends_in_s, 60);
        let last = Periods::at(DEC_6_2026 + 26 * 86_400_000 - 1);
        assert_eq!(last.day, "2026-12-31");
        assert_eq!((last.day_ends_in_s, last.month_ends_in_s), (1, 1));
        assert_eq!(Periods::at(0).day, "1970-01-01");
        assert_eq!(Periods::at(951_782_400_000).day, "2000-02-29");
        for days in [0u64, 59, 60, 365, 10_957, 20_000, 20_818] {
            let (y, m, d) = civil(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn the_key_header_wins_and_each_provider_reads_its_own_credential() {
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
        };
        let both = headers(&[("x-promptd-key", "pk"), ("x-api-key", "ak")]);
        assert_eq!(
            presented(Provider::Anthropic, &both),
            Some(Presented {
                token: "pk",
                via: Via::KeyHeader
            })
        );
        let anthropic = headers(&[("x-api-key", "ak"), ("authorization", "Bearer bk")]);
        let p = presented(Provider::Anthropic, &anthropic).unwrap();
        assert_eq!((p.token, p.via), ("ak", Via::Credential("x-api-key")));
        let openai = headers(&[("authorization", "bearer  ok ")]);
        let p = presented(Provider::Openai, &openai).unwrap();
        assert_eq!((p.token, p.via), ("ok", Via::Credential("authorization")));
        let gemini = headers(&[("x-goog-api-key", "gk")]);
        assert_eq!(presented(Provider::Gemini, &gemini).unwrap().token, "gk");
        let sigv4 = headers(&[(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKID/20261206/us-east-1/bedrock/aws4_request",
        )]);
        assert_eq!(presented(Provider::Bedrock, &sigv4), None);
        let empty = headers(&[("x-promptd-key", " "), ("x-api-key", "")]);
        assert_eq!(presented(Provider::Anthropic, &empty), None);
    }

    fn key(toml_text: &str) -> KeyConfig {
        toml::from_str(&format!(
            "token_sha256 = \"{}\"\n{toml_text}",
            token_sha256("t")
        ))
        .unwrap()
    }

    #[test]
    fn a_key_finds_by_its_digest_only_and_rotation_keeps_both_tokens_for_a_while() {
        let rotated: KeyConfig = toml::from_str(&format!(
            "token_sha256 = [\"{}\", \"{}\"]",
            token_sha256("old"),
            token_sha256("new")
        ))
        .unwrap();
        let index = KeyIndex::new(&BTreeMap::from([("a".to_string(), rotated)]));
        assert_eq!(index.find("old").map(|k| k.0), Some("a"));
        assert_eq!(index.find("new").map(|k| k.0), Some("a"));
        assert!(index.find("other").is_none());
        assert!(index.find(&token_sha256("old")).is_none());
    }

    #[test]
    fn agents_and_upstreams_listed_are_the_only_ones_allowed() {
        let open = key("");
        assert_eq!(open.allows("any", "any"), Ok(()));
        let k = key("agents = [\"coder\"]\nupstreams = [\"anthropic\"]");
        assert_eq!(k.allows("coder", "anthropic"), Ok(()));
        assert_eq!(k.allows("other", "anthropic"), Err(NotAllowed::Agent));
        assert_eq!(k.allows("coder", "openai"), Err(NotAllowed::Upstream));
    }

    #[test]
    fn a_limit_reached_refuses_until_its_period_ends() {
        let k = key("requests_per_minute = 2\nusd_per_day = 1.5\nusd_per_month = 10");
        let p = Periods::at(DEC_6_2026 + 30_000);
        let mut used = Used {
            day_micro_usd: 1_499_999,
            month_micro_usd: 9_000_000,
            requests_this_minute: 1,
        };
        assert_eq!(k.judge(&used, &p), Ok(()));
        used.requests_this_minute = 2;
        let over = k.judge(&used, &p).unwrap_err();
        assert_eq!((over.limit, over.retry_after_s), (Limit::Rate, 30));
        used.requests_this_minute = 0;
        used.day_micro_usd = 1_500_000;
        let over = k.judge(&used, &p).unwrap_err();
        assert_eq!(over.limit, Limit::Day);
        assert_eq!(over.detail, "$1.500000 per day (spent $1.500000, UTC)");
        used.day_micro_usd = 0;
        used.month_micro_usd = 10_000_000;
        let over = k.judge(&used, &p).unwrap_err();
        assert_eq!(
            (over.limit, over.retry_after_s),
            (Limit::Month, 26 * 86_400 - 30)
        );
        assert_eq!(key("").judge(&used, &p), Ok(()));
    }
}

#[cfg(test)]
mod counts_tests {
    use super::*;

    #[test]
    fn a_count_is_read_once_per_day_and_again_in_the_background_on_a_shared_store() {
        let key: KeyConfig = toml::from_str(&format!(
            "token_sha256 = \"{}\"\nusd_per_day = 1.0\nrequests_per_minute = 1",
            token_sha256("t")
        ))
        .unwrap();
        let day = 1_796_515_200_000;
        let p = Periods::at(day);
        let mut counts = Counts::default();
        assert_eq!(counts.spend_read("k", &p, day, true), SpendRead::Now);
        counts.read("k", &p, Some(&[999_999, 999_999]), day);
        assert_eq!(counts.spend_read("k", &p, day + 500, true), SpendRead::No);
        assert_eq!(
            counts.spend_read("k", &p, day + 1_500, false),
            SpendRead::No
        );
        assert_eq!(
            counts.spend_read("k", &p, day + 1_500, true),
            SpendRead::Background
        );
        assert_eq!(
            counts.spend_read("k", &p, day + 1_600, true),
            SpendRead::No,
            "once at a time"
        );
        assert_eq!(counts.admit(&key, "k", &p), Ok(()));
        assert_eq!(counts.admit(&key, "k", &p).unwrap_err().limit, Limit::Rate);
        counts.read("k", &p, Some(&[1_000_000, 1_000_000]), day + 1_700);
        let next_minute = Periods::at(day + 60_000);
        assert_eq!(
            counts.admit(&key, "k", &next_minute).unwrap_err().limit,
            Limit::Day
        );
        // The next day the spend is read again, and the day's count starts at 0.
        let tomorrow = Periods::at(day + 86_400_000);
        assert_eq!(
            counts.spend_read("k", &tomorrow, day + 86_400_000, false),
            SpendRead::Now
        );
        assert_eq!(counts.admit(&key, "k", &tomorrow), Ok(()));
    }
}
