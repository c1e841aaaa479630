//! The usage API's time buckets (issue 49, `GET /v1/usage`): recorded replies summed per UTC
//! day, by agent and by gateway key, with the share read from cache, misses by cause and by
//! plugin with their cost, and the most expensive sessions. Pure: plain replies in (the daemon
//! reads the logs, [`crate::session::priced_replies`]), plain data out.
//!
//! Bounded by construction: a window holds at most [`MAX_DAYS`] days, the top list at most
//! [`MAX_TOP`] sessions, and a day's agents and keys are those of the replies counted (which the
//! caller bounds by the sessions it reads).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::calendar::{civil_from_days, days_from_civil};
use crate::ledger::{Ledger, Summary};
use crate::session::PricedReply;

/// A window holds at most this many days.
pub const MAX_DAYS: u64 = 366;
/// The days a window holds when only one end is given.
pub const DEFAULT_DAYS: u64 = 30;
/// The top list's length unless `top` says otherwise.
pub const DEFAULT_TOP: usize = 10;
/// The top list holds at most this many sessions.
pub const MAX_TOP: u64 = 100;
/// A filter's name (`agent`, `key`) is at most this long.
pub const MAX_NAME: usize = 256;

const DAY_MS: u64 = 86_400_000;

/// Why a usage query was refused; each names the parameter and the cause.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum UsageQueryError {
    /// `from` or `to` is not a date `YYYY-MM-DD`.
    #[error("`{param}` must be a UTC date YYYY-MM-DD, got `{value}`")]
    BadDate {
        /// The parameter.
        param: &'static str,
        /// What it held (its first 40 characters).
        value: String,
    },
    /// `to` is before `from`.
    #[error("the window ends (`to` {to}) before it starts (`from` {from})")]
    Backwards {
        /// The first day asked for.
        from: Day,
        /// The last day asked for.
        to: Day,
    },
    /// The window is longer than [`MAX_DAYS`], or `days` is 0.
    #[error("a window holds 1 to {MAX_DAYS} days, this one {days}")]
    Length {
        /// The days it would hold.
        days: u64,
    },
    /// `days` with `from` or `to`.
    #[error("give `days` or `from`/`to`, not both")]
    DaysAndDates,
    /// `top` out of range.
    #[error("`top` must be 1 to {MAX_TOP}, got {0}")]
    Top(u64),
    /// An empty or overlong `agent` or `key`.
    #[error("`{param}` must be 1 to {MAX_NAME} characters, got {len}")]
    Name {
        /// The parameter.
        param: &'static str,
        /// Its length in characters.
        len: usize,
    },
}

impl UsageQueryError {
    /// The stable code the API answers with (400).
    pub fn code(&self) -> &'static str {
        match self {
            UsageQueryError::BadDate { .. } => "invalid_date",
            UsageQueryError::Backwards { .. }
            | UsageQueryError::Length { .. }
            | UsageQueryError::DaysAndDates => "invalid_window",
            UsageQueryError::Top(_) => "invalid_top",
            UsageQueryError::Name { .. } => "invalid_filter",
        }
    }
}

/// A UTC day: days since 1970-01-01.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Day(pub u64);

impl Day {
    /// The day holding `ms` (since the Unix epoch).
    pub fn of_ms(ms: u64) -> Day {
        Day(ms / DAY_MS)
    }

    /// Its first millisecond.
    pub fn start_ms(self) -> u64 {
        self.0 * DAY_MS
    }

    /// Reads `YYYY-MM-DD` (a real date, from 1970 to 9999).
    pub fn parse(param: &'static str, value: &str) -> Result<Day, UsageQueryError> {
        let bad = || UsageQueryError::BadDate {
            param,
            value: value.chars().take(40).collect(),
        };
        let b = value.as_bytes();
        let digits = |r: std::ops::Range<usize>| -> Option<u64> {
            let s = b.get(r)?;
            s.iter()
                .all(u8::is_ascii_digit)
                .then(|| s.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
        };
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return Err(bad());
        }
        let (Some(y), Some(m), Some(d)) = (digits(0..4), digits(5..7), digits(8..10)) else {
            return Err(bad());
        };
        if y < 1970 || !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
            return Err(bad());
        }
        Ok(Day(days_from_civil(y, m, d)))
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = civil_from_days(self.0);
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

impl Serialize for Day {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn leap(y: u64) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Whole UTC days `from..=to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Window {
    /// The first day, `YYYY-MM-DD`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub from: Day,
    /// The last day, `YYYY-MM-DD`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub to: Day,
    /// How many.
    pub days: u64,
}

impl Window {
    /// The window a query asks for: `days=N` (the N days ending today), or `from`/`to`
    /// (`to` defaults to today, `from` to [`DEFAULT_DAYS`] days ending at `to`); `None` when
    /// it asks for none.
    pub fn resolve(
        from: Option<&str>,
        to: Option<&str>,
        days: Option<u64>,
        today: Day,
    ) -> Result<Option<Window>, UsageQueryError> {
        if days.is_some() && (from.is_some() || to.is_some()) {
            return Err(UsageQueryError::DaysAndDates);
        }
        let (from, to) = match (from, to, days) {
            (None, None, None) => return Ok(None),
            (_, _, Some(n)) => {
                if n == 0 || n > MAX_DAYS {
                    return Err(UsageQueryError::Length { days: n });
                }
                (Day(today.0.saturating_sub(n - 1)), today)
            }
            (f, t, None) => {
                let to = t.map(|t| Day::parse("to", t)).transpose()?.unwrap_or(today);
                let from = match f {
                    Some(f) => Day::parse("from", f)?,
                    None => Day(to.0.saturating_sub(DEFAULT_DAYS - 1)),
                };
                (from, to)
            }
        };
        if to < from {
            return Err(UsageQueryError::Backwards { from, to });
        }
        let days = to.0 - from.0 + 1;
        if days > MAX_DAYS {
            return Err(UsageQueryError::Length { days });
        }
        Ok(Some(Window { from, to, days }))
    }

    /// Whether it holds `ms`.
    pub fn holds(&self, ms: u64) -> bool {
        (self.from..=self.to).contains(&Day::of_ms(ms))
    }
}

/// What a usage query counts, checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Query {
    /// Only replies sent in these days; no day buckets without one.
    pub window: Option<Window>,
    /// Only replies sent at or after this (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Only replies served with this gateway key.
    pub key: Option<String>,
    /// The top list's length.
    pub top: usize,
}

impl Query {
    /// Checks a `top` and a `key` filter (its length); the window is [`Window::resolve`]'s.
    pub fn new(
        window: Option<Window>,
        since_ms: Option<u64>,
        key: Option<String>,
        top: Option<u64>,
    ) -> Result<Query, UsageQueryError> {
        let top = match top {
            None => DEFAULT_TOP,
            Some(n) if (1..=MAX_TOP).contains(&n) => n as usize,
            Some(n) => return Err(UsageQueryError::Top(n)),
        };
        if let Some(k) = &key {
            check_name("key", k)?;
        }
        Ok(Query {
            window,
            since_ms,
            key,
            top,
        })
    }

    /// Whether a reply counts.
    pub fn counts(&self, r: &PricedReply) -> bool {
        self.since_ms.is_none_or(|t| r.at_ms >= t)
            && self.window.is_none_or(|w| w.holds(r.at_ms))
            && self.key.as_ref().is_none_or(|k| r.key.as_ref() == Some(k))
    }
}

/// Refuses an empty or overlong filter name.
pub fn check_name(param: &'static str, name: &str) -> Result<(), UsageQueryError> {
    let len = name.chars().count();
    if len == 0 || len > MAX_NAME {
        return Err(UsageQueryError::Name { param, len });
    }
    Ok(())
}

/// Replies, tokens and spend of one agent or key in one day.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Spend {
    /// Replies counted.
    pub replies: u64,
    /// Their input tokens (cached ones included).
    pub input_tokens: u64,
    /// Of those, read from the cache.
    pub cached_tokens: u64,
    /// Their output tokens.
    pub output_tokens: u64,
    /// What the priced ones cost, in US dollars.
    pub cost: f64,
    /// What their misses added, in US dollars.
    pub miss_cost: f64,
}

impl Spend {
    fn add(&mut self, r: &PricedReply) {
        self.replies += 1;
        self.input_tokens += r.usage.input_tokens.unwrap_or(0);
        self.cached_tokens += r.usage.cached_tokens.unwrap_or(0);
        self.output_tokens += r.usage.output_tokens.unwrap_or(0);
        if let Some(c) = r.cost {
            self.cost += c.total;
            self.miss_cost += c.miss;
        }
    }
}

/// One gateway key's [`Spend`] (`key` null: replies served without one).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeySpend {
    /// The key's name; null for replies no key served.
    pub key: Option<String>,
    /// Its sums.
    #[serde(flatten)]
    pub spend: Spend,
}

/// One UTC day of the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DayBucket {
    /// `YYYY-MM-DD`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub day: Day,
    /// Its first millisecond (since the Unix epoch).
    pub start_ms: u64,
    /// Its replies' ledger: tokens, `cached_share`, outcomes and plugins with the misses'
    /// cost, `cost`.
    #[serde(flatten)]
    pub ledger: Ledger,
    /// By agent.
    pub by_agent: BTreeMap<String, Spend>,
    /// By gateway key, the keyless (`null`) first, then by name.
    pub by_key: Vec<KeySpend>,
}

/// One of the most expensive sessions.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopSession {
    /// Its id.
    pub session: String,
    /// Its agent.
    pub agent: String,
    /// Its replies counted, their tokens and spend.
    #[serde(flatten)]
    pub spend: Spend,
    /// Its most expensive step counted (the first of equals), and that step's cost.
    pub top_step: u64,
    /// That step's cost, in US dollars.
    pub top_step_cost: f64,
}

/// `GET /v1/usage`: the ledger summary, and with a window its day buckets; by key; the top
/// sessions.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Report {
    /// Totals and per agent, as before buckets existed.
    #[serde(flatten)]
    pub summary: Summary,
    /// The window counted; null when the query named none (then no day buckets).
    pub window: Option<Window>,
    /// The `key` filter, when given.
    pub key: Option<String>,
    /// One per day of the window, in order, days without replies included.
    pub days: Vec<DayBucket>,
    /// Every reply counted, by gateway key: the keyless (`null`) first, then by name.
    pub keys: Vec<KeySpend>,
    /// The most expensive sessions, by cost then input tokens (most first), then id.
    pub top_sessions: Vec<TopSession>,
}

/// Sums sessions' replies into a [`Report`].
#[derive(Debug)]
pub struct Usage {
    query: Query,
    report: Report,
    /// Every session with a counted reply; the top list is cut from it at the end (its size
    /// is the number of sessions the caller reads, which the caller bounds).
    sessions: Vec<TopSession>,
    keys: BTreeMap<Option<String>, Spend>,
}

impl Usage {
    /// An empty report for `query`.
    pub fn new(query: Query) -> Usage {
        let days = query.window.map_or_else(Vec::new, |w| {
            (w.from.0..=w.to.0)
                .map(|d| DayBucket {
                    day: Day(d),
                    start_ms: Day(d).start_ms(),
                    ledger: Ledger::default(),
                    by_agent: BTreeMap::new(),
                    by_key: Vec::new(),
                })
                .collect()
        });
        let report = Report {
            summary: Summary {
                since_ms: query.since_ms,
                ..Summary::default()
            },
            window: query.window,
            key: query.key.clone(),
            days,
            ..Report::default()
        };
        Usage {
            query,
            report,
            sessions: Vec::new(),
            keys: BTreeMap::new(),
        }
    }

    /// Adds one session of `agent`: the replies the query counts.
    pub fn add_session(&mut self, session: &str, agent: &str, replies: &[PricedReply]) {
        let mut ledger = Ledger::default();
        let mut spend = Spend::default();
        let mut top: Option<(u64, f64)> = None;
        for r in replies.iter().filter(|r| self.query.counts(r)) {
            ledger.add(&r.usage, r.outcome.as_ref(), r.cost);
            spend.add(r);
            let cost = r.cost.map_or(0.0, |c| c.total);
            if top.is_none_or(|(_, c)| cost > c) {
                top = Some((r.step, cost));
            }
            self.keys.entry(r.key.clone()).or_default().add(r);
            if let Some(w) = self.query.window {
                let i = (Day::of_ms(r.at_ms).0 - w.from.0) as usize;
                if let Some(day) = self.report.days.get_mut(i) {
                    day.ledger.add(&r.usage, r.outcome.as_ref(), r.cost);
                    day.by_agent.entry(agent.to_string()).or_default().add(r);
                    match day.by_key.iter_mut().find(|k| k.key == r.key) {
                        Some(k) => k.spend.add(r),
                        None => {
                            let mut k = KeySpend {
                                key: r.key.clone(),
                                spend: Spend::default(),
                            };
                            k.spend.add(r);
                            day.by_key.push(k);
                        }
                    }
                }
            }
        }
        self.report.summary.add_session(agent, &ledger);
        if let Some((top_step, top_step_cost)) = top {
            self.sessions.push(TopSession {
                session: session.to_string(),
                agent: agent.to_string(),
                spend,
                top_step,
                top_step_cost,
            });
        }
    }

    /// The report: days' keys in order, the top sessions cut to the query's `top`.
    pub fn finish(mut self) -> Report {
        // `None` sorts before any name: the keyless first.
        for day in &mut self.report.days {
            day.by_key.sort_by(|a, b| a.key.cmp(&b.key));
        }
        self.report.keys = self
            .keys
            .into_iter()
            .map(|(key, spend)| KeySpend { key, spend })
            .collect();
        self.sessions.sort_by(|a, b| {
            b.spend
                .cost
                .total_cmp(&a.spend.cost)
                .then(b.spend.input_tokens.cmp(&a.spend.input_tokens))
                .then(a.session.cmp(&b.session))
        });
        self.sessions.truncate(self.query.top);
        self.report.top_sessions = self.sessions;
        self.report
    }
}

#[cfg(test)]
mod tests;
