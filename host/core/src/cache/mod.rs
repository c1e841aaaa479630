//! A model of the providers' prompt caches (issue 29, first part): given requests in time
//! order, each as the blocks a provider reads (tools, system, messages) with their tokens, it
//! says per request how many input tokens a cache would serve, write and leave uncached, and
//! why. Pure: no clock, no I/O; the caller gives the times.
//!
//! Modelled from the providers' documentation as of 2026-12 (Anthropic "Prompt caching",
//! OpenAI "Prompt caching"); every number is in [`Rules`], which a caller may override:
//!
//! - **Anthropic**: explicit `cache_control` breakpoints, at most 4 honoured; an entry is
//!   written at each breakpoint whose prefix reaches the model's minimum; a later request hits
//!   the longest live entry at one of its breakpoints or up to 20 blocks before one; an entry
//!   lives 5 minutes (or 1 hour) after its last write or hit; writes cost 1.25× input (2× for
//!   1 hour), reads 0.1×.
//! - **OpenAI** (Chat Completions and Responses): automatic, from 1,024 tokens, in 128-token
//!   steps; requests are routed by the prefix's first ~256 tokens and `prompt_cache_key`, and
//!   one (prefix, key) pair is served by one machine up to about 15 requests a minute, past
//!   which requests spill to machines whose caches are cold.
//!
//! What it does not capture: caching inside a block (hits are at block boundaries, rounded
//! down to the step), eviction before the TTL under the provider's load, OpenAI's longer
//! retention off-peak, and which of several machines a spilled request lands on (the model
//! sends the n-th request past the rate to the next machine in turn).
//!
//! ```
//! use promptd_core::cache::{Block, Cache, Cause, Request, Rules, Ttl};
//!
//! let blocks = |tail: u64| vec![
//!     Block::new(1, 3000, Some(Ttl::Minutes5)), // tools and system, one breakpoint
//!     Block::new(tail, 50, None),               // the new message
//! ];
//! let mut cache = Cache::new(Rules::anthropic("claude-sonnet-4-5"));
//! let first = cache.serve(&Request::new(0, blocks(10)));
//! assert_eq!((first.read, first.written, first.uncached, first.cause), (0, 3000, 50, Cause::Cold));
//! let second = cache.serve(&Request::new(60_000, blocks(11)));
//! assert_eq!((second.read, second.written, second.cause), (3000, 0, Cause::Hit));
//! let late = cache.serve(&Request::new(60_000 + 301_000, blocks(12)));
//! assert_eq!((late.read, late.written, late.cause), (0, 3000, Cause::Expired));
//! ```

pub mod outcome;
pub mod price;
pub mod retention;
pub mod ttl;

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::conversation::FrozenRequest;
use crate::formats::Format;

/// Which kind of cache a provider runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Explicit breakpoints (Anthropic Messages, Bedrock Converse's `cachePoint` blocks).
    Breakpoints,
    /// Automatic prefix caching (OpenAI Chat Completions and Responses, with routing; Gemini's
    /// implicit caching).
    Automatic,
}

pub use crate::prefix::Ttl;
use retention::Retention;

/// One provider's cache rules; the defaults are the documented ones, every field overridable.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Breakpoints or automatic.
    pub family: Family,
    /// Breakpoints honoured per request (Anthropic: 4; more is a 400 the model does not send).
    pub max_breakpoints: usize,
    /// Blocks before a breakpoint where a hit is also looked for (Anthropic: 20).
    pub lookback_blocks: usize,
    /// The shortest prefix that is cached, in tokens (per model family).
    pub min_tokens: u64,
    /// Cached prefixes grow in steps of this many tokens (OpenAI: 128; Anthropic: 1).
    pub step_tokens: u64,
    /// Life of an entry after its last write or hit, 5-minute kind, in milliseconds.
    pub ttl_ms: u64,
    /// Life of a long entry, in milliseconds: Anthropic's `"ttl": "1h"` breakpoints (an
    /// hour), OpenAI's extended retention (24 hours).
    pub ttl_1h_ms: u64,
    /// OpenAI: requests are served under extended retention (their entries live
    /// `ttl_1h_ms`), by the model's offer, the organisation's default and the request's
    /// `prompt_cache_retention` ([`retention::served`]). Anthropic: unused.
    pub extended: bool,
    /// Tokens at the start of the prefix that, with the key, choose the machine (OpenAI: 256).
    pub routing_tokens: u64,
    /// Requests a minute one (prefix, key) pair is served by one machine (OpenAI: about 15;
    /// 0: no limit).
    pub per_key_per_minute: u32,
    /// A cache read, as a multiple of the input price.
    pub read: f64,
    /// A 5-minute cache write, as a multiple of the input price.
    pub write_5m: f64,
    /// A 1-hour cache write, as a multiple of the input price.
    pub write_1h: f64,
}

impl Rules {
    /// The rules of the provider that reads `format` for `model`, with `overrides` (the
    /// config's `[cache.anthropic]` / `[cache.openai]`) applied; `None` for the neutral
    /// format, which no provider reads.
    pub fn of(format: Format, model: &str, overrides: &RulesConfig) -> Option<Rules> {
        let (mut rules, o) = match format {
            Format::Anthropic => (Rules::anthropic(model), &overrides.anthropic),
            Format::Openai | Format::OpenaiResponses => {
                let mut rules = Rules::openai(openai_read(model));
                let default = overrides.openai.retention.unwrap_or(Retention::Hours24);
                rules.extended = retention::served(model, None, default) == Retention::Hours24;
                (rules, &overrides.openai)
            }
            Format::Gemini => (Rules::gemini(model), &overrides.gemini),
            // Converse's cache points work as Anthropic's breakpoints do, for the models that
            // cache (Claude's limits and prices on Bedrock are Anthropic's).
            Format::Bedrock => (Rules::anthropic(model), &overrides.bedrock),
            Format::Neutral => return None,
        };
        o.apply(&mut rules);
        Some(rules)
    }

    /// These rules for a request whose body says `prompt_cache_retention = asked` for
    /// `model` (OpenAI; the value is ignored elsewhere, and where the model does not offer it).
    pub fn asked(mut self, model: &str, asked: Option<&str>) -> Rules {
        if self.family == Family::Automatic {
            if let Some(r) = asked.and_then(Retention::parse) {
                let now = if self.extended {
                    Retention::Hours24
                } else {
                    Retention::InMemory
                };
                self.extended = retention::served(model, Some(r), now) == Retention::Hours24;
            }
        }
        self
    }

    /// How long an idle entry written under these rules lives at most, in milliseconds.
    pub fn longest_ttl_ms(&self) -> u64 {
        match self.family {
            Family::Automatic if !self.extended => self.ttl_ms,
            _ => self.ttl_ms.max(self.ttl_1h_ms),
        }
    }

    /// Anthropic's rules for `model`: the minimum cacheable prefix is 4,096 tokens for the
    /// Opus 4.5+ and Haiku 4.5 families, 2,048 for Haiku 3 and 3.5, 1,024 for the others.
    pub fn anthropic(model: &str) -> Rules {
        let m = model.to_ascii_lowercase();
        let min_tokens = if ["opus-4-5", "opus-4-6", "opus-4-7", "haiku-4-5"]
            .iter()
            .any(|f| m.contains(f))
        {
            4096
        } else if m.contains("haiku") {
            2048 // Haiku 3 and 3.5 (`claude-3-haiku`, `claude-3-5-haiku`)
        } else {
            1024
        };
        Rules {
            family: Family::Breakpoints,
            max_breakpoints: 4,
            lookback_blocks: 20,
            min_tokens,
            step_tokens: 1,
            ttl_ms: 5 * 60_000,
            ttl_1h_ms: 60 * 60_000,
            extended: false,
            routing_tokens: 0,
            per_key_per_minute: 0,
            read: 0.1,
            write_5m: 1.25,
            write_1h: 2.0,
        }
    }

    /// Gemini's implicit caching (its context-caching guide): automatic, from 4,096 tokens on
    /// Pro models and 1,024 on the others, reads at a tenth of input (Gemini 2.5 and later),
    /// no charge for writing. The life of an implicit entry is not documented: 5 minutes is
    /// assumed (`[cache.gemini] ttl_ms` changes it).
    pub fn gemini(model: &str) -> Rules {
        let min_tokens = if model.to_ascii_lowercase().contains("pro") {
            4096
        } else {
            1024
        };
        Rules {
            family: Family::Automatic,
            max_breakpoints: 0,
            lookback_blocks: 0,
            min_tokens,
            step_tokens: 1,
            ttl_ms: 5 * 60_000,
            ttl_1h_ms: 5 * 60_000,
            extended: false,
            routing_tokens: 0,
            per_key_per_minute: 0,
            read: 0.1,
            write_5m: 1.0,
            write_1h: 1.0,
        }
    }

    /// OpenAI's rules (Chat Completions and Responses): cached reads cost `read` of input
    /// (0.5 for the GPT-4o family, 0.25 for GPT-4.1, 0.1 for GPT-5 — check the model's page);
    /// writes cost nothing extra. In-memory retention (5 minutes idle); [`Rules::of`] sets
    /// `extended` where the model and the organisation's default give 24 hours.
    pub fn openai(read: f64) -> Rules {
        Rules {
            family: Family::Automatic,
            max_breakpoints: 0,
            lookback_blocks: 0,
            min_tokens: 1024,
            step_tokens: 128,
            ttl_ms: 5 * 60_000,
            ttl_1h_ms: 24 * 60 * 60_000,
            extended: false,
            routing_tokens: 256,
            per_key_per_minute: 15,
            read,
            write_5m: 1.0,
            write_1h: 1.0,
        }
    }
}

/// OpenAI's cached-read price as a share of input, by model family (its pricing page,
/// 2026-12): GPT-5 and later 0.1, GPT-4.1 and the o-series 0.25, GPT-4o and others 0.5.
fn openai_read(model: &str) -> f64 {
    let m = model.to_ascii_lowercase();
    if m.starts_with("gpt-5") || m.starts_with("gpt-6") {
        0.1
    } else if m.starts_with("gpt-4.1") || m.starts_with("o3") || m.starts_with("o4") {
        0.25
    } else {
        0.5
    }
}

/// The config's overrides of the documented rules: `[cache.anthropic]` and `[cache.openai]`
/// (Chat Completions and Responses), each field optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesConfig {
    /// Anthropic Messages.
    #[serde(default)]
    pub anthropic: RulesOverride,
    /// OpenAI Chat Completions and Responses.
    #[serde(default)]
    pub openai: RulesOverride,
    /// Gemini `generateContent`.
    #[serde(default)]
    pub gemini: RulesOverride,
    /// Bedrock Converse.
    #[serde(default)]
    pub bedrock: RulesOverride,
}

/// The fields of [`Rules`] a config may set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesOverride {
    /// [`Rules::max_breakpoints`].
    pub max_breakpoints: Option<usize>,
    /// [`Rules::lookback_blocks`].
    pub lookback_blocks: Option<usize>,
    /// [`Rules::min_tokens`].
    pub min_tokens: Option<u64>,
    /// [`Rules::step_tokens`].
    pub step_tokens: Option<u64>,
    /// [`Rules::ttl_ms`], in seconds.
    pub ttl_s: Option<u64>,
    /// [`Rules::ttl_1h_ms`], in seconds (Anthropic).
    pub ttl_1h_s: Option<u64>,
    /// [`Rules::ttl_1h_ms`], in seconds (OpenAI's extended retention).
    pub ttl_24h_s: Option<u64>,
    /// OpenAI: the retention a request that does not say gets on a model that offers both
    /// (`"24h"`, OpenAI's default for an organisation without Zero Data Retention, or
    /// `"in_memory"`, its default with it).
    pub retention: Option<Retention>,
    /// [`Rules::routing_tokens`].
    pub routing_tokens: Option<u64>,
    /// [`Rules::per_key_per_minute`].
    pub per_key_per_minute: Option<u32>,
    /// [`Rules::read`].
    pub read: Option<f64>,
    /// [`Rules::write_5m`].
    pub write_5m: Option<f64>,
    /// [`Rules::write_1h`].
    pub write_1h: Option<f64>,
}

impl RulesOverride {
    fn apply(&self, r: &mut Rules) {
        let set = |to: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *to = v;
            }
        };
        set(&mut r.min_tokens, self.min_tokens);
        set(&mut r.step_tokens, self.step_tokens);
        set(&mut r.ttl_ms, self.ttl_s.map(|s| s.saturating_mul(1000)));
        set(
            &mut r.ttl_1h_ms,
            self.ttl_1h_s
                .or(self.ttl_24h_s)
                .map(|s| s.saturating_mul(1000)),
        );
        set(&mut r.routing_tokens, self.routing_tokens);
        r.max_breakpoints = self.max_breakpoints.unwrap_or(r.max_breakpoints);
        r.lookback_blocks = self.lookback_blocks.unwrap_or(r.lookback_blocks);
        r.per_key_per_minute = self.per_key_per_minute.unwrap_or(r.per_key_per_minute);
        r.read = self.read.unwrap_or(r.read);
        r.write_5m = self.write_5m.unwrap_or(r.write_5m);
        r.write_1h = self.write_1h.unwrap_or(r.write_1h);
    }

    /// Refuses a value no cache could have, naming the key.
    pub fn check(&self, table: &str) -> Result<(), String> {
        for (key, v) in [
            ("read", self.read),
            ("write_5m", self.write_5m),
            ("write_1h", self.write_1h),
        ] {
            if let Some(v) = v {
                if !v.is_finite() || v < 0.0 {
                    return Err(format!(
                        "[cache.{table}] {key} must be a number ≥ 0, got {v}"
                    ));
                }
            }
        }
        if self.step_tokens == Some(0) {
            return Err(format!("[cache.{table}] step_tokens must be at least 1"));
        }
        let (theirs, other) = match table {
            "openai" => ("ttl_24h_s", self.ttl_1h_s.map(|_| "ttl_1h_s")),
            _ => (
                "ttl_1h_s",
                self.ttl_24h_s
                    .map(|_| "ttl_24h_s")
                    .or(self.retention.map(|_| "retention")),
            ),
        };
        if let Some(key) = other {
            return Err(format!(
                "[cache.{table}] {key} is not a {table} setting (its long lifetime is {theirs})"
            ));
        }
        Ok(())
    }
}

/// `request` in `format` as the cache model's blocks: one per part of the prefix stream
/// (model, each tool, system, each message), its hash the FNV-1a of its bytes, its tokens
/// its bytes (the outcome scales them to the provider's count), its breakpoint the
/// `cache_control` it carries. The model part counts no tokens.
pub fn blocks(request: &FrozenRequest, format: Format) -> Vec<Block> {
    blocks_of_parts(crate::prefix::marked_stream(request, format))
}

/// [`blocks`] of a request body already rendered in `format`.
pub fn blocks_of_body(body: &serde_json::Value, format: Format) -> Vec<Block> {
    blocks_of_parts(crate::prefix::marked_parts(body, format))
}

/// The block of one part: `text` is its compact JSON without `cache_control`.
pub(crate) fn block_of(label: &str, text: &str, mark: Option<Ttl>) -> Block {
    let tokens = if label == "model" {
        0
    } else {
        text.len() as u64
    };
    Block::new(fnv(text.as_bytes()), tokens, mark)
}

fn blocks_of_parts(parts: Vec<(crate::prefix::Part, Option<Ttl>)>) -> Vec<Block> {
    parts
        .into_iter()
        .map(|(part, mark)| block_of(&part.label, &part.text, mark))
        .collect()
}

/// FNV-1a over 8-byte words (and the tail's bytes), 64 bits: stable across runs, builds and
/// machines (two daemons must agree), and a word at a time, since every reply hashes its
/// request's new parts.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(PRIME);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h
}

/// One block of a request, in the order the provider reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// A hash of the block's bytes (equal blocks, equal hashes).
    pub hash: u64,
    /// The block's input tokens.
    pub tokens: u64,
    /// The `cache_control` breakpoint on it, if any (Anthropic).
    pub breakpoint: Option<Ttl>,
}

impl Block {
    /// A block of `tokens` tokens whose bytes hash to `hash`.
    pub fn new(hash: u64, tokens: u64, breakpoint: Option<Ttl>) -> Block {
        Block {
            hash,
            tokens,
            breakpoint,
        }
    }
}

/// One request as the cache sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// When it was sent, in milliseconds (any epoch, non-decreasing).
    pub at_ms: u64,
    /// Its blocks, in reading order.
    pub blocks: Vec<Block>,
    /// OpenAI's `prompt_cache_key`, if sent.
    pub key: Option<String>,
}

impl Request {
    /// A request of `blocks` at `at_ms`, without a cache key.
    pub fn new(at_ms: u64, blocks: Vec<Block>) -> Request {
        Request {
            at_ms,
            blocks,
            key: None,
        }
    }
}

/// Why a request was served as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Everything cacheable was read from the cache.
    Hit,
    /// A shorter prefix was read; what follows it is new or changed.
    Partial,
    /// Nothing like it was seen before.
    Cold,
    /// Its prefix was cached, but the entry outlived its TTL since its last use.
    Expired,
    /// The request first differs from the last one at this block.
    PrefixChanged {
        /// The index of the first differing block.
        block: usize,
    },
    /// Its prefix is shorter than the model's minimum: nothing is cached.
    TooShort,
    /// Its prefix is cached, but on a machine this request was not routed to (OpenAI: past
    /// the per-key rate, or another key).
    Routing,
}

/// What the cache did with one request, in input tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// Read from the cache.
    pub read: u64,
    /// Written to the cache at 5-minute (or the automatic kind's) rates.
    pub written: u64,
    /// Written at 1-hour rates.
    pub written_1h: u64,
    /// Neither read nor written.
    pub uncached: u64,
    /// Why.
    pub cause: Cause,
}

impl Served {
    /// The request's input cost as a multiple of `input` (the price of one uncached token).
    pub fn cost(&self, rules: &Rules, input: f64) -> f64 {
        input
            * (self.read as f64 * rules.read
                + self.written as f64 * rules.write_5m
                + self.written_1h as f64 * rules.write_1h
                + self.uncached as f64)
    }
}

/// A cache entry: when it stops being served.
#[derive(Clone, Copy, Debug)]
struct Entry {
    expires_ms: u64,
    ttl: Ttl,
}

/// A provider's cache, fed requests in time order.
#[derive(Clone, Debug)]
pub struct Cache {
    rules: Rules,
    /// By (route, machine, prefix hash).
    entries: HashMap<(u64, u32, u64), Entry>,
    /// Every prefix ever cached, and when it was last used: tells an expired one from a new.
    seen: HashMap<u64, u64>,
    /// The previous request's cumulative prefix hashes, to say where a new one differs.
    last: Vec<u64>,
    /// The previous request's block hashes: a request that starts with the same blocks
    /// starts with the same prefix hashes, not computed again.
    last_blocks: Vec<u64>,
    /// When the previous request was served: what it left (entries, `seen`) is what is read,
    /// as if [`Cache::expire`] had swept at that time.
    last_ms: u64,
    /// When `expire` last swept (it sweeps at most once per 5-minute TTL, so a long session
    /// does not walk every remembered prefix at each request).
    swept_ms: u64,
    /// Recent request times per route, for the per-key rate.
    routes: BTreeMap<u64, VecDeque<u64>>,
}

/// The hash of a prefix extended by one block (FNV-1a over the two hashes).
fn extend(prefix: u64, block: u64) -> u64 {
    let mut h = prefix ^ 0xcbf2_9ce4_8422_2325;
    for b in block.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Cache {
    /// An empty cache following `rules`.
    pub fn new(rules: Rules) -> Cache {
        Cache {
            rules,
            entries: HashMap::new(),
            seen: HashMap::new(),
            last: Vec::new(),
            last_blocks: Vec::new(),
            last_ms: 0,
            swept_ms: 0,
            routes: BTreeMap::new(),
        }
    }

    /// The rules it follows.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    fn ttl_ms(&self, ttl: Ttl) -> u64 {
        match ttl {
            Ttl::Minutes5 => self.rules.ttl_ms,
            Ttl::Hour1 => self.rules.ttl_1h_ms,
        }
    }

    /// Where entries of a request of `blocks` may be written (each with its TTL) and looked up:
    /// the marked blocks (at most `max_breakpoints`) and the blocks a lookback reaches from
    /// them, or every block for the automatic kind.
    fn marks(&self, blocks: &[Block]) -> (Vec<(usize, Ttl)>, Vec<usize>) {
        match self.rules.family {
            Family::Breakpoints => {
                let marks: Vec<(usize, Ttl)> = blocks
                    .iter()
                    .enumerate()
                    .filter_map(|(i, b)| b.breakpoint.map(|ttl| (i, ttl)))
                    .take(self.rules.max_breakpoints)
                    .collect();
                let mut candidates: Vec<usize> = marks
                    .iter()
                    .flat_map(|&(i, _)| i.saturating_sub(self.rules.lookback_blocks)..=i)
                    .collect();
                candidates.sort_unstable();
                candidates.dedup();
                (marks, candidates)
            }
            Family::Automatic => {
                let ttl = if self.rules.extended {
                    Ttl::Hour1
                } else {
                    Ttl::Minutes5
                };
                let all: Vec<(usize, Ttl)> = (0..blocks.len()).map(|i| (i, ttl)).collect();
                let candidates = (0..blocks.len()).collect();
                (all, candidates)
            }
        }
    }

    /// Serves `request` and remembers what it leaves cached.
    pub fn serve(&mut self, request: &Request) -> Served {
        let now = request.at_ms;
        let blocks = &request.blocks;
        // Cumulative prefix hashes and token ends, per block.
        let mut prefix = Vec::with_capacity(blocks.len());
        let mut ends = Vec::with_capacity(blocks.len());
        let same = blocks
            .iter()
            .zip(&self.last_blocks)
            .take_while(|(b, h)| b.hash == **h)
            .count()
            .min(self.last.len());
        prefix.extend_from_slice(&self.last[..same]);
        let (mut h, mut t) = (prefix.last().copied().unwrap_or(0), 0u64);
        for b in &blocks[same..] {
            h = extend(h, b.hash);
            prefix.push(h);
        }
        for b in blocks {
            t += b.tokens;
            ends.push(t);
        }
        let total = t;
        let machine = self.route(request, &prefix, &ends);
        let at = |i: usize| (machine.0, machine.1, prefix[i]);
        let (written_at, candidates) = self.marks(blocks);
        let cacheable = |end: u64| end >= self.rules.min_tokens;
        let rounded = |end: u64| end - end % self.rules.step_tokens.max(1);
        // The longest live entry on this machine.
        let hit = candidates.iter().rev().copied().find(|&i| {
            cacheable(ends[i])
                && self
                    .entries
                    .get(&at(i))
                    .is_some_and(|e| e.expires_ms >= now)
        });
        // Said before the cache changes: what it held decides the cause.
        let cause = self.cause(request, &prefix, &ends, &written_at, hit, machine);
        let read = hit.map_or(0, |i| rounded(ends[i]));
        if let Some(i) = hit {
            // A read uses every byte up to `i`: each live entry at a shorter prefix of it (a
            // breakpoint an earlier request wrote) is refreshed too, not only the one read.
            for (j, &hash) in prefix[..=i].iter().enumerate() {
                let key = at(j);
                let Some(ttl) = self
                    .entries
                    .get(&key)
                    .filter(|e| e.expires_ms >= now)
                    .map(|e| e.ttl)
                else {
                    continue;
                };
                let expires_ms = now + self.ttl_ms(ttl);
                self.entries.insert(key, Entry { expires_ms, ttl });
                self.seen.insert(hash, now);
            }
        }
        // Writes: every cacheable mark past what was read, each at its own TTL.
        let (mut written, mut written_1h, mut covered) = (0, 0, read);
        for &(i, ttl) in &written_at {
            let end = rounded(ends[i]);
            if !cacheable(ends[i]) || end <= covered {
                continue;
            }
            match ttl {
                Ttl::Minutes5 => written += end - covered,
                Ttl::Hour1 => written_1h += end - covered,
            }
            covered = end;
            let expires_ms = now + self.ttl_ms(ttl);
            self.entries.insert(at(i), Entry { expires_ms, ttl });
            self.seen.insert(prefix[i], now);
        }
        if self.rules.family == Family::Automatic {
            // Automatic caching bills a write as plain input.
            written += written_1h;
            written_1h = 0;
        }
        self.last = prefix;
        self.last_blocks.clear();
        self.last_blocks.extend(blocks.iter().map(|b| b.hash));
        self.last_ms = now;
        if now
            >= self
                .swept_ms
                .saturating_add(self.rules.ttl_ms.min(self.rules.ttl_1h_ms))
        {
            self.expire(now);
            self.swept_ms = now;
        }
        Served {
            read,
            written,
            written_1h,
            uncached: total - read - written - written_1h,
            cause,
        }
    }

    /// Why the request was served as it was.
    fn cause(
        &self,
        request: &Request,
        prefix: &[u64],
        ends: &[u64],
        marks: &[(usize, Ttl)],
        hit: Option<usize>,
        machine: (u64, u32),
    ) -> Cause {
        let last_mark = marks
            .iter()
            .rev()
            .find(|&&(i, _)| ends[i] >= self.rules.min_tokens)
            .map(|&(i, _)| i);
        let Some(last_mark) = last_mark else {
            return Cause::TooShort;
        };
        // A read that covers what was cached, or everything the last request was: a hit (a
        // conversation that grows writes its new tail, and that is no miss).
        let extends_last = !self.last.is_empty()
            && prefix.len() >= self.last.len()
            && prefix[self.last.len() - 1] == self.last[self.last.len() - 1];
        match hit {
            Some(i) if ends[i] >= ends[last_mark] => return Cause::Hit,
            // The longer prefix was cached before and is no longer: its entry expired.
            Some(_) if self.seen_at(prefix[last_mark]).is_some() => return Cause::Expired,
            Some(_) if extends_last => return Cause::Hit,
            Some(_) => return Cause::Partial,
            None => {}
        }
        // Nothing read: was it cached before (expired, or elsewhere), changed, or new?
        let first_mark = marks
            .iter()
            .find(|&&(i, _)| ends[i] >= self.rules.min_tokens)
            .map_or(last_mark, |&(i, _)| i);
        let now = request.at_ms;
        if let Some(used) = self.seen_at(prefix[first_mark]) {
            let live_elsewhere = self.entries.iter().any(|(&(r, m, p), e)| {
                p == prefix[first_mark] && (r, m) != machine && e.expires_ms >= now
            });
            if live_elsewhere {
                return Cause::Routing;
            }
            if used < now {
                return Cause::Expired;
            }
        }
        match self.last.iter().zip(prefix).position(|(a, b)| a != b) {
            Some(block) if !self.last.is_empty() => Cause::PrefixChanged { block },
            _ if !self.last.is_empty() && self.last.len() != prefix.len() => Cause::PrefixChanged {
                block: self.last.len().min(prefix.len()),
            },
            _ => Cause::Cold,
        }
    }

    /// The machine `request` is served by: per route (the prefix's first `routing_tokens` and
    /// the key), the first machine up to `per_key_per_minute` requests in the last minute, the
    /// next one past it, and so on.
    fn route(&mut self, request: &Request, prefix: &[u64], ends: &[u64]) -> (u64, u32) {
        if self.rules.per_key_per_minute == 0 || prefix.is_empty() {
            return (0, 0);
        }
        let head = ends
            .iter()
            .position(|&e| e >= self.rules.routing_tokens)
            .unwrap_or(prefix.len() - 1);
        let mut route = prefix[head];
        for b in request.key.as_deref().unwrap_or("").bytes() {
            route = extend(route, u64::from(b));
        }
        let times = self.routes.entry(route).or_default();
        while times.front().is_some_and(|&t| t + 60_000 <= request.at_ms) {
            times.pop_front();
        }
        times.push_back(request.at_ms);
        let n = times.len() as u32;
        (route, (n - 1) / self.rules.per_key_per_minute)
    }

    /// Forgets entries that can no longer be served and routes with no recent request, so the
    /// model's memory is bounded by what is live.
    /// When prefix `key` was last used, if a sweep at the previous request would have kept it.
    fn seen_at(&self, key: u64) -> Option<u64> {
        let horizon = self.rules.longest_ttl_ms().saturating_mul(4);
        self.seen
            .get(&key)
            .copied()
            .filter(|&used| used + horizon >= self.last_ms)
    }

    fn expire(&mut self, now: u64) {
        self.entries.retain(|_, e| e.expires_ms >= now);
        self.routes
            .retain(|_, times| times.back().is_some_and(|&t| t + 60_000 > now));
        let horizon = self.rules.longest_ttl_ms().saturating_mul(4);
        self.seen.retain(|_, &mut used| used + horizon >= now);
    }
}

#[cfg(test)]
mod tests;
