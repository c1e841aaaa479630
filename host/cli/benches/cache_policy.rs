//! Cache policies compared under the cache model (issue 30): the same scripted workload fed to
//! `promptd_core::cache` under each TTL and cache-key policy, with what a policy with perfect
//! foresight could reach under the same rules beside them.
//!
//! Run: `cargo bench -p promptd --bench cache_policy`. Environment: `POLICY_SESSIONS` (100),
//! `POLICY_SEED` (29).
//!
//! The workload is issue 29's script (`tests/cache_workload.rs`) without the plugin swaps and
//! the MCP crashes (they break every policy's prefix alike): session `s` starts at `s × 17 s`,
//! alternating agents `alpha` and `beta` that share one head (tools and system prompt, 3,000
//! tokens); 4–7 steps each; a step after a tool call (half the replies call one) comes 1–3 s
//! later, any other after an idle gap drawn from 80% uniform over 2–90 s and 20% uniform over
//! 6–20 minutes; each step adds 150–600 tokens of messages. Every request is fed to the model
//! as the provider would read it: the head, then one block per step's messages.
//!
//! Costs are in input-token equivalents under the documented multiples (Anthropic: read 0.1,
//! 5-minute write 1.25, 1-hour write 2; OpenAI: read 0.25 for gpt-4.1, writes at the input
//! price), so `cost` is what the input would cost divided by the input price.

use std::collections::BTreeMap;

use promptd_core::cache::ttl::Gaps;
use promptd_core::cache::{Block, Cache, Request, Rules, Ttl};

const HEAD: u64 = 3_000;
const MIN_MS: u64 = 60_000;

/// xorshift64*: the script's draws, the same on every run.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One request of the script: when, whose, and the tokens each step so far added (with the
/// content blocks each step's messages make).
struct Sent {
    at_ms: u64,
    session: usize,
    agent: &'static str,
    steps: Vec<u64>,
    parts: Vec<u64>,
}

/// The `versioned` plugin's version serving at `at_ms`: swapped at 10, 25 and 40 minutes, as
/// in issue 29's workload (its section and its tool change, so both head blocks do).
fn version_at(at_ms: u64) -> u64 {
    1 + [10, 25, 40]
        .iter()
        .filter(|&&m| at_ms >= m * MIN_MS)
        .count() as u64
        % 2
}

/// The script; with `long`, one step in ten is a long tool turn whose messages are 30 content
/// blocks (past Anthropic's 20-block lookback).
fn script(sessions: usize, seed: u64, long: bool) -> Vec<Sent> {
    let mut draw = Draw(seed.max(1));
    let mut out = Vec::new();
    for s in 0..sessions {
        let agent = if s % 2 == 0 { "alpha" } else { "beta" };
        let mut at = s as u64 * 17_000;
        let mut steps = Vec::new();
        let mut parts = Vec::new();
        let mut called = false;
        for _ in 0..draw.between(4, 7) {
            steps.push(draw.between(150, 600));
            parts.push(if long && draw.between(1, 10) == 1 {
                30
            } else {
                1
            });
            out.push(Sent {
                at_ms: at,
                session: s,
                agent,
                steps: steps.clone(),
                parts: parts.clone(),
            });
            let gap = if called {
                draw.between(1_000, 3_000)
            } else if draw.between(1, 10) <= 8 {
                draw.between(2_000, 90_000)
            } else {
                draw.between(6 * MIN_MS, 20 * MIN_MS)
            };
            called = draw.between(0, 1) == 1;
            at += gap;
        }
    }
    out.sort_by_key(|r| (r.at_ms, r.session));
    out
}

/// Where an Anthropic body's breakpoints go.
#[derive(Clone, Copy, PartialEq)]
enum Marks {
    /// promptd's rule: the last tool, the system prompt, the last message block.
    ToolsSystemLast,
    /// The same and a fourth on the previous request's last message block.
    WithPrevious,
    /// The system prompt and the last message block.
    SystemLast,
    /// The last message block alone.
    Last,
}

/// The blocks of `sent` as the provider reads them, the head at `version`: the tools (2,000
/// tokens), the system prompt (1,000), then each step's messages.
fn blocks(sent: &Sent, version: u64, mark: Option<Ttl>, marks: Marks) -> Vec<Block> {
    let on = |yes: bool| yes.then_some(mark).flatten();
    let mut blocks = vec![
        Block::new(
            100 + version,
            2 * HEAD / 3,
            on(marks == Marks::ToolsSystemLast || marks == Marks::WithPrevious),
        ),
        Block::new(200 + version, HEAD / 3, on(marks != Marks::Last)),
    ];
    let n = sent.steps.len();
    for (i, (&tokens, &parts)) in sent.steps.iter().zip(&sent.parts).enumerate() {
        for j in 0..parts {
            let hash = ((sent.session as u64) << 24) | ((i as u64 + 2) << 8) | j;
            let last_part = j + 1 == parts;
            let mark = (last_part && i + 1 == n)
                || (last_part && i + 2 == n && marks == Marks::WithPrevious);
            blocks.push(Block::new(
                hash,
                tokens / parts + u64::from(j == 0) * (tokens % parts),
                on(mark),
            ));
        }
    }
    blocks
}

#[derive(Default)]
struct Totals {
    read: u64,
    written: u64,
    written_1h: u64,
    missed: u64,
    cost: f64,
}

impl Totals {
    fn add(&mut self, rules: &Rules, s: &promptd_core::cache::Served) {
        self.add_parts(rules, [s.read, s.written, s.written_1h, s.uncached]);
    }

    /// Read, written (5 minutes or automatic), written (1 hour), missed.
    fn add_parts(&mut self, rules: &Rules, [read, written, written_1h, missed]: [u64; 4]) {
        self.read += read;
        self.written += written;
        self.written_1h += written_1h;
        self.missed += missed;
        self.cost += read as f64 * rules.read
            + written as f64 * rules.write_5m
            + written_1h as f64 * rules.write_1h
            + missed as f64;
    }

    fn row(&self, name: &str, input: u64) {
        let share = |n: u64| 100.0 * n as f64 / input as f64;
        println!(
            "| {name} | {} ({:.1}%) | {} | {} | {} | {:.0} |",
            self.read,
            share(self.read),
            self.written,
            self.written_1h,
            self.missed,
            self.cost
        );
    }
}

/// How an Anthropic run is set: the TTL policy, whether the `versioned` plugin's swaps wait
/// for a cache-cold point (`refresh = "boundary"`), and the breakpoints.
#[derive(Clone, Copy)]
struct Setting {
    ttl: &'static str,
    held: bool,
    marks: Marks,
}

const TODAY: Setting = Setting {
    ttl: "5m",
    held: false,
    marks: Marks::ToolsSystemLast,
};

/// The Anthropic format under one setting.
fn anthropic(script: &[Sent], setting: Setting) -> Totals {
    let rules = Rules::anthropic("claude-sonnet-4-5");
    let mut cache = Cache::new(rules.clone());
    let mut totals = Totals::default();
    // Per session: its gaps, its last request's time and input, and the version it shows.
    type Seen = (Gaps, Option<(u64, u64)>, u64);
    let mut gaps: BTreeMap<usize, Seen> = BTreeMap::new();
    let mut agents: BTreeMap<&str, Gaps> = BTreeMap::new();
    for sent in script {
        let now = version_at(sent.at_ms);
        let (g, last, shown) = gaps
            .entry(sent.session)
            .or_insert((Gaps::default(), None, now));
        let ttl = match setting.ttl {
            "5m" => Ttl::Minutes5,
            "1h" => Ttl::Hour1,
            _ => promptd_core::cache::ttl::choose(g, agents.get(sent.agent), &rules),
        };
        // K7: a held swap applies once the session's cache went cold (the idle gap passed the
        // TTL); a step one does not hold applies it at once.
        let gap = last.map(|(t, _)| sent.at_ms - t);
        let cold_after = match ttl {
            Ttl::Minutes5 => rules.ttl_ms,
            Ttl::Hour1 => rules.ttl_1h_ms,
        };
        if !setting.held || gap.is_none_or(|g| g >= cold_after) {
            *shown = now;
        }
        let request = Request::new(sent.at_ms, blocks(sent, *shown, Some(ttl), setting.marks));
        let served = cache.serve(&request);
        totals.add(&rules, &served);
        let input: u64 = HEAD + sent.steps.iter().sum::<u64>();
        // As the daemon's outcome says it: what the request before left that this one did
        // not read, hidden under the hour.
        let lost = last.map_or(0, |(_, before)| before.saturating_sub(served.read));
        let lost = (ttl == Ttl::Minutes5).then_some(lost);
        g.add(gap, input, lost);
        agents.entry(sent.agent).or_default().add(gap, input, lost);
        *last = Some((sent.at_ms, input));
    }
    totals
}

/// The OpenAI format under one cache-key policy and `rules` (their retention).
fn openai(script: &[Sent], policy: &str, rules: &Rules) -> Totals {
    let rules = rules.clone();
    let mut cache = Cache::new(rules.clone());
    let mut totals = Totals::default();
    // The sharded policies: each base key's requests in the last minute, and each session's
    // shard once given (a session keeps the key its header recorded, as the daemon does).
    let mut recent: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut shard_of: BTreeMap<usize, u64> = BTreeMap::new();
    for sent in script {
        let base = match policy {
            "session" => format!("s{}", sent.session),
            "agent" | "agent+shards" => sent.agent.to_string(),
            _ => "head".to_string(),
        };
        let times = recent.entry(base.clone()).or_default();
        times.retain(|&t| t + MIN_MS > sent.at_ms);
        times.push(sent.at_ms);
        let key = if policy.ends_with("+shards") {
            let shards = (times.len() as u64).div_ceil(u64::from(rules.per_key_per_minute));
            let shard = *shard_of
                .entry(sent.session)
                .or_insert(sent.session as u64 % shards.max(1));
            format!("{base}-{shard}")
        } else {
            base
        };
        let version = version_at(sent.at_ms);
        let mut request = Request::new(sent.at_ms, blocks(sent, version, None, Marks::Last));
        request.key = Some(key);
        let served = cache.serve(&request);
        totals.add(&rules, &served);
    }
    totals
}

/// Perfect foresight under the same rules: every request after a session's first reads
/// everything the one before it sent while that is within the TTL a policy could have chosen
/// (Anthropic: an hour; OpenAI: 24 hours, the extended retention), and the head is read
/// whenever any request sent it within that time; a read is rounded down to the provider's
/// step (OpenAI reads in 128-token steps; Anthropic's is 1), and what is new is written
/// (Anthropic) or missed (OpenAI, which writes at no premium). No routing limit, no swap.
fn foresight(script: &[Sent], rules: &Rules) -> Totals {
    let mut totals = Totals::default();
    let mut head_at: Option<u64> = None;
    let mut last: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for sent in script {
        let input: u64 = HEAD + sent.steps.iter().sum::<u64>();
        let warm = |t: u64| sent.at_ms - t <= rules.longest_ttl_ms();
        let read = match last.get(&sent.session) {
            Some(&(t, tokens)) if warm(t) => tokens,
            _ if head_at.is_some_and(warm) => HEAD,
            _ => 0,
        };
        let read = read - read % rules.step_tokens.max(1);
        let new = input - read;
        match rules.write_5m > 1.0 {
            true => totals.add_parts(rules, [read, new, 0, 0]),
            false => totals.add_parts(rules, [read, 0, 0, new]),
        }
        head_at = Some(sent.at_ms);
        last.insert(sent.session, (sent.at_ms, input));
    }
    totals
}

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let sessions = env("POLICY_SESSIONS", 100) as usize;
    let seed = env("POLICY_SEED", 29);
    for long in [false, true] {
        let script = script(sessions, seed, long);
        let input: u64 = script
            .iter()
            .map(|s| HEAD + s.steps.iter().sum::<u64>())
            .sum();
        let kind = if long {
            "with long tool turns (one step in ten makes 30 content blocks)"
        } else {
            "issue 29's workload"
        };
        println!(
            "\n## {kind}: {sessions} sessions, {} requests, {input} input tokens",
            script.len()
        );
        println!("\nAnthropic (claude-sonnet-4-5):\n");
        println!("| setting | read | written 5m | written 1h | missed | cost |");
        println!("| --- | --- | --- | --- | --- | --- |");
        let rows: [(&str, Setting); 8] = [
            ("today: ttl 5m, refresh step, tools+system+last", TODAY),
            ("ttl = 1h", Setting { ttl: "1h", ..TODAY }),
            (
                "ttl = auto",
                Setting {
                    ttl: "auto",
                    ..TODAY
                },
            ),
            (
                "refresh = boundary (versioned)",
                Setting {
                    held: true,
                    ..TODAY
                },
            ),
            (
                "breakpoints + previous request's end",
                Setting {
                    marks: Marks::WithPrevious,
                    ..TODAY
                },
            ),
            (
                "breakpoints system+last",
                Setting {
                    marks: Marks::SystemLast,
                    ..TODAY
                },
            ),
            (
                "breakpoint last only",
                Setting {
                    marks: Marks::Last,
                    ..TODAY
                },
            ),
            (
                "refresh = boundary, + previous end",
                Setting {
                    held: true,
                    marks: Marks::WithPrevious,
                    ..TODAY
                },
            ),
        ];
        for (name, setting) in rows {
            anthropic(&script, setting).row(name, input);
        }
        foresight(&script, &Rules::anthropic("claude-sonnet-4-5")).row("perfect foresight", input);
        // OpenAI's retention: 24 hours unless the organisation has Zero Data Retention (or
        // the agent says `in_memory`), K11.
        let of = |retention: &str| {
            let config = format!("[cache.openai]\nretention = \"{retention}\"\n");
            let config = promptd_core::config::Config::parse(&config, "bench")
                .unwrap_or_else(|e| panic!("{e}"));
            let format = promptd_core::formats::Format::Openai;
            Rules::of(format, "gpt-4.1", &config.cache).unwrap_or_else(|| Rules::openai(0.25))
        };
        for retention in ["in_memory", "24h"] {
            let rules = of(retention);
            println!("\nOpenAI (gpt-4.1), retention {retention}, cache-key policy:\n");
            println!("| policy | read | written | written 1h | missed | cost |");
            println!("| --- | --- | --- | --- | --- | --- |");
            for policy in [
                "session",
                "agent",
                "agent+shards",
                "prefix",
                "prefix+shards",
            ] {
                openai(&script, policy, &rules).row(&format!("cache_key = {policy}"), input);
            }
            // The bound under this retention (a ZDR organisation cannot choose 24 hours).
            foresight(&script, &rules).row("perfect foresight", input);
        }
    }
}
