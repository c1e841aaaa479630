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

/// One request of the script: when, whose, and the tokens each step so far added.
struct Sent {
    at_ms: u64,
    session: usize,
    agent: &'static str,
    steps: Vec<u64>,
}

fn script(sessions: usize, seed: u64) -> Vec<Sent> {
    let mut draw = Draw(seed.max(1));
    let mut out = Vec::new();
    for s in 0..sessions {
        let agent = if s % 2 == 0 { "alpha" } else { "beta" };
        let mut at = s as u64 * 17_000;
        let mut steps = Vec::new();
        let mut called = false;
        for _ in 0..draw.between(4, 7) {
            steps.push(draw.between(150, 600));
            out.push(Sent {
                at_ms: at,
                session: s,
                agent,
                steps: steps.clone(),
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

fn blocks(sent: &Sent, mark: Option<Ttl>) -> Vec<Block> {
    let mut blocks = vec![Block::new(1, HEAD, mark)];
    let n = sent.steps.len();
    for (i, tokens) in sent.steps.iter().enumerate() {
        let hash = ((sent.session as u64) << 16) | (i as u64 + 2);
        blocks.push(Block::new(
            hash,
            *tokens,
            (i + 1 == n).then_some(mark).flatten(),
        ));
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

/// The Anthropic format under one TTL policy.
fn anthropic(script: &[Sent], policy: &str) -> Totals {
    let rules = Rules::anthropic("claude-sonnet-4-5");
    let mut cache = Cache::new(rules.clone());
    let mut totals = Totals::default();
    // Per session: its gaps, and its last request's time and input.
    let mut gaps: BTreeMap<usize, (Gaps, Option<(u64, u64)>)> = BTreeMap::new();
    let mut agents: BTreeMap<&str, Gaps> = BTreeMap::new();
    for sent in script {
        let (g, last) = gaps.entry(sent.session).or_default();
        let ttl = match policy {
            "5m" => Ttl::Minutes5,
            "1h" => Ttl::Hour1,
            _ => promptd_core::cache::ttl::choose(g, agents.get(sent.agent), &rules),
        };
        let served = cache.serve(&Request::new(sent.at_ms, blocks(sent, Some(ttl))));
        totals.add(&rules, &served);
        let input: u64 = HEAD + sent.steps.iter().sum::<u64>();
        // As the daemon's outcome says it: what the request before left that this one did
        // not read, hidden under the hour.
        let gap = last.map(|(t, _)| sent.at_ms - t);
        let lost = last.map_or(0, |(_, before)| before.saturating_sub(served.read));
        let lost = (ttl == Ttl::Minutes5).then_some(lost);
        g.add(gap, input, lost);
        agents.entry(sent.agent).or_default().add(gap, input, lost);
        *last = Some((sent.at_ms, input));
    }
    totals
}

/// The OpenAI format under one cache-key policy.
fn openai(script: &[Sent], policy: &str) -> Totals {
    let rules = Rules::openai(0.25);
    let mut cache = Cache::new(rules.clone());
    let mut totals = Totals::default();
    // The prefix policy's shards: requests with the head in the last minute, and each
    // session's shard once given.
    let mut recent: Vec<u64> = Vec::new();
    let mut shard_of: BTreeMap<usize, u64> = BTreeMap::new();
    for sent in script {
        recent.retain(|&t| t + MIN_MS > sent.at_ms);
        recent.push(sent.at_ms);
        let key = match policy {
            "session" => format!("s{}", sent.session),
            "agent" => sent.agent.to_string(),
            "prefix" => "head".to_string(),
            _ => {
                let shards = (recent.len() as u64).div_ceil(u64::from(rules.per_key_per_minute));
                let shard = *shard_of
                    .entry(sent.session)
                    .or_insert(sent.session as u64 % shards.max(1));
                format!("head-{shard}")
            }
        };
        let mut request = Request::new(sent.at_ms, blocks(sent, None));
        request.key = Some(key);
        let served = cache.serve(&request);
        totals.add(&rules, &served);
    }
    totals
}

/// Perfect foresight under the same rules: every request after a session's first reads
/// everything the one before it sent while that is within the TTL a policy could have chosen
/// (an hour at most), and the head is read whenever any request sent it within that hour; what
/// is new is written (Anthropic) or missed (OpenAI, which writes at no premium).
fn foresight(script: &[Sent], rules: &Rules) -> Totals {
    let mut totals = Totals::default();
    let mut head_at: Option<u64> = None;
    let mut last: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for sent in script {
        let input: u64 = HEAD + sent.steps.iter().sum::<u64>();
        let warm = |t: u64| sent.at_ms - t <= rules.ttl_1h_ms;
        let read = match last.get(&sent.session) {
            Some(&(t, tokens)) if warm(t) => tokens,
            _ if head_at.is_some_and(warm) => HEAD,
            _ => 0,
        };
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
    let script = script(sessions, env("POLICY_SEED", 29));
    let input: u64 = script
        .iter()
        .map(|s| HEAD + s.steps.iter().sum::<u64>())
        .sum();
    println!(
        "{} sessions, {} requests, {input} input tokens",
        sessions,
        script.len()
    );
    println!("\nAnthropic (claude-sonnet-4-5), TTL policy:\n");
    println!("| policy | read | written 5m | written 1h | missed | cost |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for policy in ["5m", "1h", "auto"] {
        anthropic(&script, policy).row(&format!("ttl = {policy}"), input);
    }
    foresight(&script, &Rules::anthropic("claude-sonnet-4-5")).row("perfect foresight", input);
    println!("\nOpenAI (gpt-4.1), cache-key policy:\n");
    println!("| policy | read | written | written 1h | missed | cost |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for policy in ["session", "agent", "prefix", "prefix+shards"] {
        openai(&script, policy).row(&format!("cache_key = {policy}"), input);
    }
    foresight(&script, &Rules::openai(0.25)).row("perfect foresight", input);
}
