//! Counterfactual replay (issue 29): a recorded session re-assembled step by step with a
//! candidate plugin set or config, and each step's request compared with the recorded one —
//! where they first differ and why, the token delta, and what a provider's prompt cache
//! would serve and charge for each (Q19, Q20).
//!
//! The candidate is given what the session recorded: the messages of each step (user input
//! and tool results, as they were recorded: already shaped and reviewed), the step's facts,
//! the replies and tool results recorded between steps, compactions, and the times the
//! requests were sent. Its own plugins and config give the rest — system prompt, tools,
//! model settings, runtime context, trimming — exactly as [`crate::step::plan`] would have
//! planned each step. A step the candidate cannot plan is reported with its error, and the
//! recorded step stands in its place, so later steps have the recorded history.
//!
//! Everything here is a pure function of the log and the candidate: nothing is written, and
//! the only effects are the candidate's plugin calls. Steps are assembled ahead on
//! [`Candidate::workers`] threads (assembly reads nothing of the session but its facts), and
//! each request is compared and measured from the session state's cached fragments, so a
//! step costs what it adds, not the length of the history, until history is left out.
//!
//! What it does not capture: a plugin whose output depends on the outside world or the clock
//! gives today's answer, not the one it gave then, and MCP servers' tools are the ones they
//! list today.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::assembly::Assembly;
use crate::cache::{self, Block, Cache, Rules, Ttl};
use crate::config::plan::ToolResults;
use crate::config::AgentPlan;
use crate::conversation::{FrozenRequest, Header};
use crate::error::{Error, Result};
use crate::formats::replies::ProviderUsage;
use crate::formats::{self, Format};
use crate::ledger::Pricing;
use crate::plugin::registry::Registry;
use crate::prefix::{self, Part};
use crate::session::log::{Body, Compacted, Dropped, Recorded};
use crate::session::{self, RequestView, SessionState};
use crate::step::{self, Assembled};
use crate::store::Event;
use crate::ErrorBody;

/// What a session is replayed with.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// The candidate plugin set (its own registry, never the one serving).
    pub registry: &'a Registry,
    /// The session's agent, resolved from the candidate config.
    pub agent: &'a AgentPlan,
    /// The candidate config's prices and cache rules.
    pub pricing: Pricing<'a>,
    /// The provider format requests are compared and priced in; `None`: the format of the
    /// session's recorded replies, else `anthropic`.
    pub format: Option<Format>,
    /// Threads a replay runs on: with 2 or more, the caller's compares while the others
    /// assemble the next steps ahead; with 1, the caller's does both.
    pub workers: usize,
}

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

fn signed(a: u64, b: u64) -> i64 {
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

/// Replays session `session`, whose whole log is `events`, with `candidate`. Fails only on a
/// log that does not decode or does not render in the format (`store_corrupt`,
/// `unsupported_block`) and on the neutral format (`bad_request`); a step the candidate
/// cannot plan is reported in its place.
pub fn replay(session: &str, events: &[Event], candidate: &Candidate<'_>) -> Result<SessionReplay> {
    let log: Vec<Entry> = parallel(events, candidate.workers, |e| {
        Ok(Entry {
            seq: e.seq,
            at_ms: e.at_ms,
            body: session::decode(session, e)?,
        })
    })
    .into_iter()
    .collect::<Result<_>>()?;
    let format = candidate.format.unwrap_or_else(|| recorded_format(&log));
    if format == Format::Neutral {
        return Err(Error::BadRequest(
            "a replay compares requests as a provider reads and prices them: choose the \
             format `openai`, `anthropic`, `openai-responses`, `gemini` or `bedrock`, not `neutral`"
                .into(),
        ));
    }
    let groups = steps_of(&log);
    let secret: Arc<str> = match log.first().map(|e| &e.body) {
        Some(Body::SessionCreated(c)) => c.data_secret.as_deref().unwrap_or(session).into(),
        _ => session.into(),
    };
    // Recorded tool results were shaped when they arrived: shown again as they are.
    let mut agent = candidate.agent.clone();
    agent.tool_results = ToolResults {
        template: None,
        empty: String::new(),
    };
    let steps: Vec<crate::plugin::model::Step> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let facts = match &log[g.marker].body {
                Body::Step(m) => m.facts.clone(),
                _ => BTreeMap::new(),
            };
            step::step_for(&agent, session, i as u64 + 1, facts)
        })
        .collect();
    let assemble = |s: &crate::plugin::model::Step| -> Result<Arc<Assembly>> {
        step::assemble(candidate.registry, &agent, s, &secret)
    };
    let mut run = Run {
        session,
        log: &log,
        candidate,
        agent: &agent,
        format,
        recorded: Side::new(session, format),
        replayed: None,
        seqs: BTreeMap::new(),
        verified: 0,
        message_cause: None,
        header_cause: None,
        buffers: (Vec::new(), Vec::new()),
        per_byte: (1, 4),
        out: Vec::with_capacity(groups.len()),
        totals: ReplayTotals::default(),
    };
    if candidate.workers <= 1 || steps.len() <= 1 {
        for (i, s) in steps.iter().enumerate() {
            run.step(&groups, i, assemble(s))?;
        }
    } else {
        ahead(&steps, candidate.workers - 1, assemble, |i, a| {
            run.step(&groups, i, a)
        })?;
    }
    // What follows the last step (its reply…) changes no request.
    let agent_name = agent.agent.clone();
    Ok(SessionReplay {
        session: session.to_string(),
        agent: agent_name,
        format,
        steps: run.out,
        totals: run.totals,
    })
}

/// How many items [`ahead`]'s threads may run ahead of the one consuming them: what they hold
/// stays bounded whatever the session's length.
const AHEAD: usize = 64;

/// `make` over `items` on `threads` scoped threads, each result handed to `take` in the
/// items' order on the calling thread as soon as it and those before it are made, so the two
/// overlap from the first item. The threads stay at most [`AHEAD`] items ahead; the first
/// error of `take` stops them and is returned.
fn ahead<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    make: impl Fn(&T) -> R + Sync,
    mut take: impl FnMut(usize, R) -> Result<()>,
) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (next, taken) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, R)>(AHEAD);
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            let (tx, make, next, taken) = (tx.clone(), &make, &next, &taken);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                // Past the bound: wait for the consumer (it never waits on this item).
                while i >= taken.load(Ordering::Acquire) + AHEAD {
                    std::thread::park_timeout(std::time::Duration::from_micros(200));
                }
                if tx.send((i, make(item))).is_err() {
                    break; // the consumer stopped
                }
            });
        }
        drop(tx);
        let mut early: BTreeMap<usize, R> = BTreeMap::new();
        let result = (0..items.len()).try_for_each(|i| {
            let r = loop {
                if let Some(r) = early.remove(&i) {
                    break r;
                }
                match rx.recv() {
                    Ok((j, r)) if j == i => break r,
                    Ok((j, r)) => {
                        early.insert(j, r);
                    }
                    // Every thread ended without it: one panicked (the scope rethrows it).
                    Err(_) => {
                        return Err(Error::BadRequest(
                            "a replay's assembling thread ended early".into(),
                        ))
                    }
                }
            };
            take(i, r)?;
            taken.store(i + 1, Ordering::Release);
            Ok(())
        });
        // Stop the threads: they see the bound never move, or a closed channel.
        taken.store(usize::MAX / 2, Ordering::Release);
        next.store(items.len(), Ordering::Relaxed);
        drop(rx);
        result
    })
}

/// `f` over `items` on up to `workers` scoped threads; results in the items' order.
fn parallel<T: Sync, R: Send>(items: &[T], workers: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if workers <= 1 || items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                *crate::sync::lock(&results[i]) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .filter_map(|r| crate::sync::recover(r.into_inner()))
        .collect()
}

/// One decoded event.
struct Entry {
    seq: u64,
    at_ms: u64,
    body: Body,
}

/// Where one recorded step lies in the log: its batch (the messages appended with it), the
/// rest of what it appended (snapshot, header, omissions, trimming), its marker, and the
/// reply that answered it.
struct Group {
    batch: usize,
    tail: usize,
    marker: usize,
    reply: Option<usize>,
}

/// The recorded steps of `log`. A step's events were appended in one transaction, so they
/// share the marker's time; a tool result recorded on its own before the step does not.
fn steps_of(log: &[Entry]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (m, entry) in log.iter().enumerate() {
        if !matches!(entry.body, Body::Step(_)) {
            continue;
        }
        let mut tail = m;
        while tail > 0
            && matches!(
                log[tail - 1].body,
                Body::ContextSnapshot(_)
                    | Body::RequestHeader(_)
                    | Body::PluginOmitted(_)
                    | Body::HistoryDropped(_)
            )
        {
            tail -= 1;
        }
        let floor = groups.last().map_or(0, |g| g.marker + 1);
        let mut batch = tail;
        while batch > floor
            && matches!(
                log[batch - 1].body,
                Body::UserMessage(_) | Body::ToolResult(_)
            )
            && log[batch - 1].at_ms == entry.at_ms
        {
            batch -= 1;
        }
        groups.push(Group {
            batch: batch.max(floor),
            tail,
            marker: m,
            reply: None,
        });
    }
    for i in 0..groups.len() {
        let until = groups.get(i + 1).map_or(log.len(), |g| g.batch);
        groups[i].reply = (groups[i].marker + 1..until)
            .find(|&j| matches!(log[j].body, Body::AssistantMessage(_)));
    }
    groups
}

/// The format of the session's recorded replies (the first that says), else Anthropic's.
fn recorded_format(log: &[Entry]) -> Format {
    log.iter()
        .find_map(|e| match &e.body {
            Body::AssistantMessage(Recorded { cache: Some(o), .. }) => Some(o.format),
            _ => None,
        })
        .filter(|f| *f != Format::Neutral)
        .unwrap_or(Format::Anthropic)
}

/// One replay in progress.
struct Run<'a> {
    session: &'a str,
    log: &'a [Entry],
    candidate: &'a Candidate<'a>,
    agent: &'a AgentPlan,
    format: Format,
    recorded: Side,
    /// The candidate's side, once its log differs from the recorded one in anything a request
    /// is built from; `None` while both logs hold the same events, and the recorded side
    /// stands for both (applied, rendered, measured and cached once).
    replayed: Option<Side>,
    /// Recorded seq → the candidate log's seq of the same event (messages, snapshots and
    /// markers), for compactions and trimming recorded by seq.
    seqs: BTreeMap<u64, u64>,
    /// Leading closed fragments known equal on both sides (they never change).
    verified: usize,
    /// Why the messages diverged, when they first did (the divergence stays where it is).
    message_cause: Option<(usize, String, Option<String>)>,
    /// The blocks of both sides' requests, kept for the next step.
    buffers: (Vec<Block>, Vec<Block>),
    /// Why the headers differ, for the headers and provenances last compared.
    header_cause: Option<(HeaderKey, Vec<String>, Option<String>)>,
    /// Tokens per byte of the latest step with a provider count: (tokens, bytes).
    per_byte: (u64, u64),
    out: Vec<StepReplay>,
    totals: ReplayTotals,
}

impl Run<'_> {
    /// Replays step `i` (0-based) of `groups` on its assembly.
    fn step(&mut self, groups: &[Group], i: usize, assembly: Result<Arc<Assembly>>) -> Result<()> {
        let (log, agent, candidate, format) = (self.log, self.agent, self.candidate, self.format);
        let g = &groups[i];
        let from = if i == 0 { 0 } else { groups[i - 1].marker + 1 };
        for e in &log[from..g.batch] {
            self.between(e)?;
        }
        let first = self.candidate_side().state.last_seq() + 1;
        let messages: Vec<_> = log[g.batch..g.tail]
            .iter()
            .filter_map(|e| e.body.as_message().cloned())
            .collect();
        let mut error = None;
        let mut assembled = None;
        let planned = assembly.and_then(|assembly| {
            let mut a = Assembled {
                step: step::step_for(agent, self.session, i as u64 + 1, BTreeMap::new()),
                assembly,
            };
            a.step.facts = match &log[g.marker].body {
                Body::Step(m) => m.facts.clone(),
                _ => BTreeMap::new(),
            };
            let planned = step::plan_assembled(
                &mut self.candidate_side().state,
                candidate.registry,
                agent,
                &mut a,
                step::Serving::run("replay"),
                messages,
                format,
            );
            assembled = Some(a.assembly);
            planned
        });
        match planned {
            Ok(planned) => {
                let bodies = planned.bodies;
                // The batch's messages come first, in order; then the snapshot, the marker.
                let snapshot_at = bodies
                    .iter()
                    .position(|b| matches!(b, Body::ContextSnapshot(_)));
                let count = bodies.len() as u64;
                for (k, e) in log[g.batch..g.tail].iter().enumerate() {
                    self.seqs.insert(e.seq, first + k as u64);
                }
                if let (Some(at), Some(rec)) = (
                    snapshot_at,
                    log[g.tail..g.marker]
                        .iter()
                        .find(|e| matches!(e.body, Body::ContextSnapshot(_))),
                ) {
                    self.seqs.insert(rec.seq, first + at as u64);
                }
                self.seqs.insert(log[g.marker].seq, first + count - 1);
                if self.replayed.is_none() && same_events(&log[g.batch..=g.marker], first, &bodies)
                {
                    // Both logs gain the same events: applied once, to the side both share.
                    self.recorded.state.apply_planned(first, bodies)?;
                    return self.report(g, error, assembled.as_deref());
                }
                self.fork().state.apply_planned(first, bodies)?;
            }
            Err(e) => {
                error = Some(ErrorBody::from(&e));
                // The recorded step stands in, so later steps have the recorded history.
                if self.replayed.is_none() {
                    // Seqs map to themselves while the logs agree: the same events.
                    for e in &log[g.batch..=g.marker] {
                        self.seqs.insert(e.seq, e.seq);
                        self.recorded
                            .state
                            .apply_planned(e.seq, vec![e.body.clone()])?;
                    }
                    return self.report(g, error, assembled.as_deref());
                }
                for e in &log[g.batch..=g.marker] {
                    let next = self.candidate_side().state.last_seq() + 1;
                    let body = match &e.body {
                        Body::HistoryDropped(d) => Body::HistoryDropped(Dropped {
                            seqs: self.mapped(&d.seqs),
                        }),
                        other => other.clone(),
                    };
                    self.seqs.insert(e.seq, next);
                    self.candidate_side()
                        .state
                        .apply_planned(next, vec![body])?;
                }
            }
        }
        for e in &log[g.batch..=g.marker] {
            self.recorded
                .state
                .apply_planned(e.seq, vec![e.body.clone()])?;
        }
        self.report(g, error, assembled.as_deref())
    }

    /// Compares step `g`'s requests and keeps the report.
    fn report(
        &mut self,
        g: &Group,
        error: Option<ErrorBody>,
        assembly: Option<&Assembly>,
    ) -> Result<()> {
        let report = self.compare(g, error, assembly)?;
        self.totals.add(&report);
        self.out.push(report);
        Ok(())
    }

    /// The side the candidate plans on: its own once the logs differ, else the shared one.
    fn candidate_side(&mut self) -> &mut Side {
        match &mut self.replayed {
            Some(side) => side,
            None => &mut self.recorded,
        }
    }

    /// The candidate's own side, split from the recorded one (state, worked-out parts and
    /// caches as they are) when the logs first differ.
    fn fork(&mut self) -> &mut Side {
        let recorded = &self.recorded;
        self.replayed.get_or_insert_with(|| recorded.clone())
    }

    /// The recorded seqs as the candidate's log numbers them; a seq the candidate's log has
    /// no event for is left out.
    fn mapped(&self, seqs: &[u64]) -> Vec<u64> {
        seqs.iter()
            .filter_map(|s| self.seqs.get(s).copied())
            .collect()
    }

    /// An event between steps: as it is on the recorded side; on the candidate's, with the
    /// seqs it names mapped to the candidate log's.
    fn between(&mut self, e: &Entry) -> Result<()> {
        if self.replayed.is_none() && !matches!(e.body, Body::HistoryCompacted(_)) {
            // Seqs map to themselves while the logs agree: the event as it is, once.
            if e.body.as_message().is_some() {
                self.seqs.insert(e.seq, e.seq);
            }
            return self
                .recorded
                .state
                .apply_planned(e.seq, vec![e.body.clone()]);
        }
        let next = self.candidate_side().state.last_seq() + 1;
        let body = match &e.body {
            Body::HistoryCompacted(c) => {
                let mapped: Vec<u64> = self.seqs.range(c.from..=c.to).map(|(_, s)| *s).collect();
                let (Some(&from), Some(&to)) = (mapped.first(), mapped.last()) else {
                    // Nothing of the range is in the candidate's log: the recorded side alone.
                    self.fork();
                    return self
                        .recorded
                        .state
                        .apply_planned(e.seq, vec![e.body.clone()]);
                };
                match self.candidate_side().state.compaction(from, to, &c.summary) {
                    Ok(body) => body,
                    // What the candidate holds in the range differs: the range as mapped.
                    Err(_) => Body::HistoryCompacted(Compacted {
                        from,
                        kept: self.mapped(&c.kept),
                        summary: c.summary.clone(),
                        to,
                    }),
                }
            }
            Body::HistoryDropped(d) => Body::HistoryDropped(Dropped {
                seqs: self.mapped(&d.seqs),
            }),
            other => other.clone(),
        };
        if e.body.as_message().is_some() {
            self.seqs.insert(e.seq, next);
        }
        if self.replayed.is_none() && next == e.seq && body == e.body {
            return self.recorded.state.apply_planned(next, vec![body]);
        }
        self.fork().state.apply_planned(next, vec![body])?;
        self.recorded
            .state
            .apply_planned(e.seq, vec![e.body.clone()])
    }

    /// Step `g`'s requests compared, measured and priced.
    fn compare(
        &mut self,
        g: &Group,
        error: Option<ErrorBody>,
        assembly: Option<&Assembly>,
    ) -> Result<StepReplay> {
        let log = self.log;
        let step = match &log[g.marker].body {
            Body::Step(m) => m.step,
            _ => 0,
        };
        let reply = g.reply.and_then(|r| match &log[r].body {
            Body::AssistantMessage(rec) => Some(rec),
            _ => None,
        });
        let usage = reply.and_then(|r| r.usage);
        let at_ms = reply
            .and_then(|r| r.cache.as_ref())
            .map_or(log[g.marker].at_ms, |o| o.sent_at_ms);
        let format = self.format;
        let rec = self.recorded.view()?;
        // While the logs agree, one side stands for both: the same request.
        let own = match &mut self.replayed {
            Some(side) => Some(side.view()?),
            None => None,
        };
        let shared = own.is_none();
        let cand = own.as_ref().unwrap_or(&rec);

        // Leading closed fragments equal on both sides stay equal: compared once.
        if let (Some(a), Some(b), false) = (rec.closed, cand.closed, shared) {
            while self.verified < a.len().min(b.len()) && a[self.verified] == b[self.verified] {
                self.verified += 1;
            }
        }
        let first = match shared {
            true => None,
            false => first_differing_part(&rec, cand, self.verified),
        };
        let settings_differ = !shared && rec.settings != cand.settings;
        let differs = first.is_some() || settings_differ || error.is_some();
        let (mut rec_blocks, mut cand_blocks) = (
            std::mem::take(&mut self.buffers.0),
            std::mem::take(&mut self.buffers.1),
        );
        rec.blocks_into(&mut rec_blocks);
        if !shared {
            cand.blocks_into(&mut cand_blocks);
        }
        // Bytes of a stream's first `n` parts: the blocks' (the model's part counts none there).
        let bytes_before = |v: &View<'_>, blocks: &[Block], n: usize| -> u64 {
            let model = match v.part(0) {
                p if n > 0 && p.label == Some("model") => p.text.len() as u64,
                _ => 0,
            };
            blocks[..n.min(blocks.len())]
                .iter()
                .map(|b| b.tokens)
                .sum::<u64>()
                + model
        };
        let first_difference = match first {
            Some(p) => {
                let before = bytes_before(&rec, &rec_blocks, p);
                let common = match (p < rec.len(), p < cand.len()) {
                    (true, true) => common_prefix(rec.part(p).text, cand.part(p).text),
                    _ => 0,
                };
                let label = cand
                    .label(p)
                    .or_else(|| rec.label(p))
                    .unwrap_or_else(|| "end".into());
                let header_part = p < rec.header_parts.max(cand.header_parts);
                let (causes, plugin) = if header_part {
                    self.message_cause = None;
                    let key = HeaderKey::of(&rec, cand, p);
                    match &self.header_cause {
                        Some((k, causes, plugin)) if *k == key => (causes.clone(), plugin.clone()),
                        _ => {
                            let (causes, plugin) = header_causes(&rec, cand, &label, format);
                            self.header_cause = Some((key, causes.clone(), plugin.clone()));
                            (causes, plugin)
                        }
                    }
                } else {
                    let (cause, plugin) = match &self.message_cause {
                        Some((at, cause, plugin)) if *at == p => (cause.clone(), plugin.clone()),
                        _ => {
                            let (cause, plugin) = message_cause(
                                &label,
                                (rec.left_out, cand.left_out),
                                (rec.snapshot, cand.snapshot),
                                assembly,
                            );
                            self.message_cause = Some((p, cause.clone(), plugin.clone()));
                            (cause, plugin)
                        }
                    };
                    (vec![cause], plugin)
                };
                Some(Difference {
                    offset: before + common as u64,
                    part: label,
                    plugin,
                    cause: causes.first().cloned().unwrap_or_default(),
                    causes,
                })
            }
            None if settings_differ => {
                let cause = format!(
                    "model settings differ (not read by the prompt cache): {}",
                    differing_settings(rec.settings, cand.settings)
                );
                Some(Difference {
                    offset: bytes_before(cand, &cand_blocks, cand.len()),
                    part: "settings".into(),
                    plugin: None,
                    cause: cause.clone(),
                    causes: vec![cause],
                })
            }
            None => None,
        };

        // Tokens: the recorded request scaled to what the provider reported, the candidate's
        // bytes at the same tokens per byte.
        let bytes = |b: &[Block]| b.iter().map(|x| x.tokens).sum::<u64>();
        let rec_bytes = bytes(&rec_blocks);
        let reported = usage.and_then(|u| u.input_tokens);
        let counted = match reported {
            Some(t) if rec_bytes > 0 => {
                self.per_byte = (t, rec_bytes);
                Counted::Provider
            }
            _ => Counted::Estimate,
        };
        let (num, den) = self.per_byte;
        let at_rate = |b: u64| -> u64 {
            let t = (u128::from(b) * u128::from(num) + u128::from(den) / 2) / u128::from(den);
            u64::try_from(t).unwrap_or(u64::MAX)
        };
        let rec_total = match (counted, reported) {
            (Counted::Provider, Some(t)) => t,
            _ => at_rate(rec_bytes),
        };
        let same = shared || rec_blocks == cand_blocks;
        let cand_total = match same {
            true => rec_total,
            false => at_rate(bytes(&cand_blocks)),
        };
        scale(&mut rec_blocks, rec_total);
        if shared {
            // The recorded side's figures stand for both.
        } else if same {
            cand_blocks.clear();
            cand_blocks.extend_from_slice(&rec_blocks);
        } else {
            scale(&mut cand_blocks, cand_total);
        }
        let (rec_model, rec_key) = (rec.model.to_string(), rec.said());
        let (cand_model, cand_key) = (cand.model.to_string(), cand.said());
        // The views borrow the sides: no longer used from here on.
        let output = usage.and_then(|u| u.output_tokens).unwrap_or(0);
        let pricing = self.candidate.pricing;
        let recorded = self.recorded.serve(
            &rec_model,
            rec_key,
            at_ms,
            &mut rec_blocks,
            output,
            pricing,
            format,
        );
        let candidate = match &mut self.replayed {
            Some(side) => side.serve(
                &cand_model,
                cand_key,
                at_ms,
                &mut cand_blocks,
                output,
                pricing,
                format,
            ),
            None => recorded.clone(),
        };
        self.buffers = (rec_blocks, cand_blocks);
        let reported = usage
            .filter(|u| u.input_tokens.is_some())
            .map(|u| reported_figures(&u, reply, &rec_model, pricing, format));
        Ok(StepReplay {
            step,
            differs,
            first_difference,
            error,
            tokens: Tokens {
                recorded: rec_total,
                candidate: cand_total,
                delta: signed(cand_total, rec_total),
                counted,
            },
            recorded,
            candidate,
            reported,
        })
    }
}

/// What the provider reported for a recorded reply, as [`Figures`].
fn reported_figures(
    usage: &ProviderUsage,
    reply: Option<&Recorded>,
    model: &str,
    pricing: Pricing<'_>,
    format: Format,
) -> Figures {
    let input = usage.input_tokens.unwrap_or(0);
    let read = usage.cached_tokens.unwrap_or(0).min(input);
    let written = usage.cache_write_tokens.unwrap_or(0).min(input - read);
    let written_1h = usage.cache_write_1h_tokens.unwrap_or(0).min(written);
    let outcome = reply.and_then(|r| r.cache.as_ref());
    let model = outcome
        .map(|o| o.model.as_str())
        .filter(|m| !m.is_empty())
        .unwrap_or(model);
    let format = outcome.map_or(format, |o| o.format);
    let cost = pricing.prices.get(model).and_then(|price| {
        Rules::of(format, model, pricing.rules).map(|rules| price.cost(&rules, usage, 0).total)
    });
    Figures {
        model: model.to_string(),
        read,
        written: written - written_1h,
        written_1h,
        uncached: input - read - written,
        cost,
    }
}

/// Scales `blocks`' tokens (bytes) in place so they add up to `total`, in proportion, each
/// block's share rounded down from the running sum and the last taking what rounding left.
fn scale(blocks: &mut [Block], total: u64) {
    let ours: u64 = blocks.iter().map(|b| b.tokens).sum();
    if ours == 0 || ours == total {
        return;
    }
    let per = total as f64 / ours as f64;
    let (mut seen, mut given) = (0u64, 0u64);
    for b in blocks.iter_mut() {
        seen += b.tokens;
        let end = ((seen as f64 * per) as u64).clamp(given, total);
        b.tokens = end - given;
        given = end;
    }
    if let Some(last) = blocks.last_mut() {
        last.tokens += total - given;
    }
}

/// Bytes two strings share at their start, at a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The index of the first part where `a` and `b` differ (text or cache breakpoint), `None`
/// when they are the same stream. The first `verified` closed fragments are equal on both
/// sides: once the parts before them are equal, their values are skipped, so a step compares
/// what it adds.
fn first_differing_part(a: &View<'_>, b: &View<'_>, verified: usize) -> Option<usize> {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i < n {
        if i == a.pre() && a.pre() == b.pre() && a.spliced && b.spliced {
            // Equal fragments split into equal values: as many on both sides.
            i += a.values_before(verified);
            if i >= n {
                break;
            }
        }
        let (x, y) = (a.part(i), b.part(i));
        if x.hash != y.hash || x.text.len() != y.text.len() || x.mark != y.mark || x.text != y.text
        {
            return Some(i);
        }
        i += 1;
    }
    (a.len() != b.len()).then_some(n)
}

/// The keys whose values differ between two settings objects, for words. Settings that are
/// not a JSON object (a rendered request's always are) are named as a whole, never as "none".
fn differing_settings(a: &str, b: &str) -> String {
    let parse = |t: &str| serde_json::from_str::<Map<String, Value>>(t);
    let (Ok(a), Ok(b)) = (parse(a), parse(b)) else {
        return "the settings as a whole (not a JSON object)".into();
    };
    let mut keys: Vec<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .collect();
    keys.sort();
    keys.dedup();
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the causes of a header difference depend on: both headers (by the seq that
/// recorded them), the tools shown, the provenances and the part.
#[derive(Clone, Debug, PartialEq)]
struct HeaderKey {
    seqs: (u64, u64),
    shown: (Option<Vec<String>>, Option<Vec<String>>),
    provenance: (
        Option<crate::provenance::Provenance>,
        Option<crate::provenance::Provenance>,
    ),
    part: usize,
}

impl HeaderKey {
    fn of(rec: &View<'_>, cand: &View<'_>, part: usize) -> HeaderKey {
        HeaderKey {
            seqs: (rec.header_seq, cand.header_seq),
            shown: (
                rec.shown.map(<[String]>::to_vec),
                cand.shown.map(<[String]>::to_vec),
            ),
            provenance: (rec.provenance.cloned(), cand.provenance.cloned()),
            part,
        }
    }
}

/// Why the header parts differ, in the diff's words (Q16), and the plugin behind the part.
fn header_causes(
    rec: &View<'_>,
    cand: &View<'_>,
    label: &str,
    format: Format,
) -> (Vec<String>, Option<String>) {
    let request = |v: &View<'_>| FrozenRequest {
        header: v.header.clone(),
        messages: Vec::new(),
        shown_tools: v.shown.map(<[String]>::to_vec),
    };
    let (rec_from, cand_from) = (rec.provenance, cand.provenance);
    let d = prefix::diff(&request(rec), rec_from, &request(cand), cand_from, format);
    let plugin = prefix::culprit(label, rec_from, cand_from);
    let mut causes = d.causes;
    if causes.is_empty() || causes.iter().all(|c| c.ends_with("prefix kept")) {
        causes = vec![format!("{label} differs")];
    }
    (causes, plugin)
}

/// Why a message part differs: history left out differently, or the runtime context
/// (naming the candidate's context, and its plugin, whose text the recorded snapshot does
/// not hold), or else the message itself.
fn message_cause(
    label: &str,
    left_out: (usize, usize),
    snapshots: (Option<&str>, Option<&str>),
    assembly: Option<&Assembly>,
) -> (String, Option<String>) {
    if left_out.0 != left_out.1 {
        return (
            format!(
                "{label}: history left out differently (the recorded request leaves out {} \
                 message events, the candidate's {})",
                left_out.0, left_out.1
            ),
            None,
        );
    }
    match snapshots {
        (recorded, candidate) if recorded != candidate => {
            let recorded = recorded.unwrap_or("");
            let culprit = assembly.and_then(|a| {
                a.contexts
                    .iter()
                    .find(|(_, text)| !text.is_empty() && !recorded.contains(&**text))
                    .map(|(name, _)| {
                        let plugin = a
                            .explain
                            .contexts
                            .iter()
                            .find(|o| *o.name == **name)
                            .map(|o| o.plugin.clone());
                        (name.to_string(), plugin)
                    })
            });
            match (culprit, candidate) {
                (Some((name, plugin)), _) => {
                    let by = plugin
                        .as_deref()
                        .map_or(String::new(), |p| format!(" (plugin `{p}`)"));
                    (
                        format!("{label}: runtime context changed: context `{name}`{by} gives other text"),
                        plugin,
                    )
                }
                (None, None) => (
                    format!("{label}: runtime context changed: the candidate gives none"),
                    None,
                ),
                (None, Some(_)) => (
                    format!(
                        "{label}: runtime context changed: the recorded snapshot holds text no \
                         candidate context gives"
                    ),
                    None,
                ),
            }
        }
        _ => (
            format!("{label} differs (an earlier runtime context, or a review hook's redaction)"),
            None,
        ),
    }
}

/// Whether `planned`, appended from seq `first`, are the recorded `events` as far as any
/// request is built from them: the same seqs and bodies, except what the session state does
/// not keep — the daemon process a header names, why it was recorded, a marker's budget
/// usage.
fn same_events(events: &[Entry], first: u64, planned: &[Body]) -> bool {
    events.len() == planned.len()
        && events.first().is_none_or(|e| e.seq == first)
        && events.iter().zip(planned).all(|(e, p)| match (&e.body, p) {
            (Body::RequestHeader(a), Body::RequestHeader(b)) => {
                a.header == b.header && a.provenance == b.provenance
            }
            (Body::Step(a), Body::Step(b)) => {
                a.step == b.step
                    && a.facts == b.facts
                    && a.provenance == b.provenance
                    && a.shown_tools == b.shown_tools
            }
            (a, b) => a == b,
        })
}

/// One side of a replay: the session's state as that side's log builds it, what was worked
/// out of its requests so far (each closed fragment's values once), and its prompt caches
/// (one per model).
#[derive(Clone)]
struct Side {
    state: SessionState,
    format: Format,
    head: Option<HeadMemo>,
    /// Every closed fragment's values, in order.
    items: Vec<Item>,
    /// Where each closed fragment's first value is in `items`.
    fragment_starts: Vec<usize>,
    /// `items` as the cache model's blocks (bytes for tokens).
    closed_blocks: Vec<Block>,
    /// The open end's values, worked out per step.
    tail: Vec<Owned>,
    /// The request of what is kept, once history is left out, worked out per step.
    kept: Option<Kept>,
    caches: Vec<(String, Option<String>, Cache)>,
    last_ms: u64,
}

/// The header's parts in one format, worked out once per header and tools shown.
#[derive(Clone)]
struct HeadMemo {
    header_seq: u64,
    shown: Option<Vec<String>>,
    parts: Vec<Owned>,
    /// `parts`, then `lead_items`, as blocks.
    blocks: Vec<Block>,
    /// The body's settings (every key but the stream's), as JSON text.
    settings: String,
    model: String,
    key: Option<String>,
    retention: Option<String>,
    /// OpenAI's system message, the first of the list.
    lead: String,
    lead_items: Vec<Item>,
}

/// A request of what is kept, worked out whole.
#[derive(Clone)]
struct Kept {
    request: FrozenRequest,
    parts: Vec<Owned>,
    settings: String,
    model: String,
    key: Option<String>,
    retention: Option<String>,
    head: usize,
    lead_from: usize,
}

/// One value of a fragment: where it is, its hash and breakpoint.
#[derive(Clone)]
struct Item {
    fragment: usize,
    start: usize,
    end: usize,
    hash: u64,
    /// When the value held a `cache_control`: its text without it, and the breakpoint.
    marked: Option<(String, Option<Ttl>)>,
}

/// A part with its own text.
#[derive(Clone)]
struct Owned {
    label: String,
    text: String,
    hash: u64,
    mark: Option<Ttl>,
}

impl Owned {
    fn of((part, mark): (Part, Option<Ttl>)) -> Owned {
        Owned {
            hash: cache::fnv(part.text.as_bytes()),
            label: part.label,
            text: part.text,
            mark,
        }
    }

    fn block(&self) -> Block {
        let tokens = if self.label == "model" {
            0
        } else {
            self.text.len() as u64
        };
        Block::new(self.hash, tokens, self.mark)
    }
}

/// One part of a request as the provider reads it.
#[derive(Clone, Copy)]
struct PartRef<'a> {
    text: &'a str,
    hash: u64,
    mark: Option<Ttl>,
    label: Option<&'a str>,
}

/// One side's request at a step: the header's parts, the message list's values (borrowed from
/// the state's fragments and what was worked out of them), the open end.
struct View<'a> {
    /// Spliced: model, tools, system; kept: every part.
    head: &'a [Owned],
    lead: &'a str,
    lead_items: &'a [Item],
    fragments: &'a [std::sync::Arc<str>],
    items: &'a [Item],
    fragment_starts: &'a [usize],
    tail: &'a [Owned],
    /// Spliced: the blocks of `head` and `lead_items`.
    head_blocks: &'a [Block],
    closed_blocks: &'a [Block],
    spliced: bool,
    /// Parts that come from the header (OpenAI's system message included).
    header_parts: usize,
    /// Where the message list starts.
    lead_from: usize,
    settings: &'a str,
    model: &'a str,
    key: Option<&'a str>,
    /// OpenAI's `prompt_cache_retention`, when the body says.
    retention: Option<&'a str>,
    header: &'a Header,
    /// The seq of the `request/header` event that recorded `header`.
    header_seq: u64,
    shown: Option<&'a [String]>,
    closed: Option<&'a [std::sync::Arc<str>]>,
    provenance: Option<&'a crate::provenance::Provenance>,
    snapshot: Option<&'a str>,
    left_out: usize,
}

impl<'a> View<'a> {
    /// What the body says that routes and keeps it: `prompt_cache_key`, `prompt_cache_retention`.
    fn said(&self) -> (Option<String>, Option<String>) {
        (
            self.key.map(str::to_string),
            self.retention.map(str::to_string),
        )
    }

    fn len(&self) -> usize {
        self.head.len() + self.lead_items.len() + self.items.len() + self.tail.len()
    }

    /// The parts before the closed fragments' values.
    fn pre(&self) -> usize {
        self.head.len() + self.lead_items.len()
    }

    /// How many values the first `fragments` closed fragments hold.
    fn values_before(&self, fragments: usize) -> usize {
        self.fragment_starts
            .get(fragments)
            .copied()
            .unwrap_or(self.items.len())
    }

    fn part(&self, i: usize) -> PartRef<'a> {
        let owned = |o: &'a Owned, label: bool| PartRef {
            text: &o.text,
            hash: o.hash,
            mark: o.mark,
            label: label.then_some(o.label.as_str()),
        };
        if let Some(o) = self.head.get(i) {
            return owned(o, true);
        }
        let i = i - self.head.len();
        if let Some(it) = self.lead_items.get(i) {
            return value_of(self.lead, it);
        }
        let i = i - self.lead_items.len();
        if let Some(it) = self.items.get(i) {
            return value_of(&self.fragments[it.fragment], it);
        }
        owned(&self.tail[i - self.items.len()], false)
    }

    fn label(&self, i: usize) -> Option<String> {
        (i < self.len()).then(|| match self.part(i).label {
            Some(l) => l.to_string(),
            // The lead is Chat Completions' system message: the part `system` (Q16).
            None if i < self.lead_from => "system".to_string(),
            None => format!("message {}", i + 1 - self.lead_from),
        })
    }

    /// The cache model's blocks, into `out`: a hash and the bytes of each part (none for the
    /// model).
    fn blocks_into(&self, out: &mut Vec<Block>) {
        out.clear();
        if self.spliced {
            out.extend_from_slice(self.head_blocks);
            out.extend_from_slice(self.closed_blocks);
        } else {
            out.extend(self.head.iter().map(Owned::block));
        }
        out.extend(self.tail.iter().map(Owned::block));
    }
}

/// The part a fragment's value stands for.
fn value_of<'a>(fragment: &'a str, it: &'a Item) -> PartRef<'a> {
    let (text, mark) = match &it.marked {
        Some((stripped, mark)) => (stripped.as_str(), *mark),
        None => (&fragment[it.start..it.end], None),
    };
    PartRef {
        text,
        hash: it.hash,
        mark,
        label: None,
    }
}

/// The byte ranges of the top-level values of `text`: compact JSON values joined by commas.
fn values_of(text: &str) -> Vec<(usize, usize)> {
    let (mut out, mut depth, mut in_string, mut escaped, mut start) =
        (Vec::new(), 0i64, false, false, 0);
    for (i, &c) in text.as_bytes().iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => {
                out.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// A value of the message list as [`prefix::marked_parts`] reads it: without its cache
/// markers, and the breakpoint they set.
fn marked_value(text: &str, format: Format) -> Option<(String, Option<Ttl>)> {
    // The marker promptd writes (Q8), the first key of a block (it sorts first): its bytes
    // cut out are the block without it, as serialized. It cannot be inside a string, whose
    // quotes are escaped; anything else is read as JSON.
    const MARK: &str = "\"cache_control\":{\"type\":\"ephemeral\"},";
    if let Some(at) = text.find(MARK) {
        let (before, after) = (&text[..at], &text[at + MARK.len()..]);
        if before.ends_with('{')
            && !before.contains("cache_control")
            && !after.contains("cache_control")
        {
            return Some(([before, after].concat(), Some(Ttl::Minutes5)));
        }
    }
    let value: Value = serde_json::from_str(text).ok()?;
    let body = serde_json::json!({ formats::list_key(format): [value] });
    let (part, mark) = prefix::marked_parts(&body, format).into_iter().next()?;
    Some((part.text, mark))
}

fn items_of(text: &str, fragment: usize, format: Format) -> Vec<Item> {
    values_of(text)
        .into_iter()
        .map(|(start, end)| {
            let value = &text[start..end];
            // Only a value holding a marker is read as JSON.
            let marker = match format {
                Format::Bedrock => "\"cachePoint\"",
                _ => "\"cache_control\"",
            };
            let marked = value
                .contains(marker)
                .then(|| marked_value(value, format))
                .flatten();
            let hash = match &marked {
                Some((stripped, _)) => cache::fnv(stripped.as_bytes()),
                None => cache::fnv(value.as_bytes()),
            };
            Item {
                fragment,
                start,
                end,
                hash,
                marked,
            }
        })
        .collect()
}

/// `body`'s settings: every key but those the provider's stream reads (Gemini's `config`
/// holds the system instruction and the tools beside the settings; Bedrock's `toolConfig` the
/// tools).
fn settings_of(body: &Map<String, Value>, format: Format) -> String {
    let mut rest = body.clone();
    for key in [
        "tools",
        "system",
        "instructions",
        "toolConfig",
        formats::list_key(format),
    ] {
        rest.remove(key);
    }
    if let (Format::Gemini, Some(Value::Object(config))) = (format, rest.get_mut("config")) {
        config.remove("systemInstruction");
        config.remove("tools");
    }
    Value::Object(rest).to_string()
}

impl Side {
    fn new(session: &str, format: Format) -> Side {
        Side {
            state: SessionState::new(session),
            format,
            head: None,
            items: Vec::new(),
            fragment_starts: Vec::new(),
            closed_blocks: Vec::new(),
            tail: Vec::new(),
            kept: None,
            caches: Vec::new(),
            last_ms: 0,
        }
    }

    /// The last step's request, from the state's fragments (each worked out once) while no
    /// history is left out, else rendered whole.
    fn view(&mut self) -> Result<View<'_>> {
        let format = self.format;
        self.state.activate(format)?;
        let Side {
            state,
            head,
            items,
            fragment_starts,
            closed_blocks,
            tail,
            kept,
            ..
        } = self;
        let state: &SessionState = state;
        let header_seq = state.header_seq();
        match state.request_view(format)? {
            RequestView::Spliced {
                header,
                shown_tools,
                fragments,
            } => {
                let stale = head.as_ref().is_none_or(|h| {
                    h.header_seq != header_seq || h.shown.as_deref() != shown_tools
                });
                if stale {
                    let map = formats::head(header, format, shown_tools);
                    let parts: Vec<Owned> =
                        prefix::marked_parts(&Value::Object(map.clone()), format)
                            .into_iter()
                            .map(Owned::of)
                            .collect();
                    let lead = fragments.lead.clone().unwrap_or_default();
                    let lead_items = items_of(&lead, 0, format);
                    let mut blocks: Vec<Block> = parts.iter().map(Owned::block).collect();
                    blocks.extend(lead_items.iter().map(|it| block_of(value_of(&lead, it))));
                    *head = Some(HeadMemo {
                        header_seq,
                        shown: shown_tools.map(<[String]>::to_vec),
                        parts,
                        blocks,
                        settings: settings_of(&map, format),
                        model: string_at(&map, "model")
                            .or_else(|| string_at(&map, "modelId"))
                            .unwrap_or_default(),
                        key: string_at(&map, "prompt_cache_key"),
                        retention: string_at(&map, "prompt_cache_retention"),
                        lead,
                        lead_items,
                    });
                }
                let known = fragment_starts.len().min(fragments.closed.len());
                for (f, fragment) in fragments.closed.iter().enumerate().skip(known) {
                    fragment_starts.push(items.len());
                    for it in items_of(fragment, f, format) {
                        closed_blocks.push(block_of(value_of(fragment, &it)));
                        items.push(it);
                    }
                }
                tail.clear();
                if let Some(t) = &fragments.tail {
                    for (start, end) in values_of(t) {
                        let (text, mark) = marked_value(&t[start..end], format)
                            .unwrap_or_else(|| (t[start..end].to_string(), None));
                        tail.push(Owned {
                            label: String::new(),
                            hash: cache::fnv(text.as_bytes()),
                            text,
                            mark,
                        });
                    }
                }
                let Some(head) = head.as_ref() else {
                    unreachable!("the head was just worked out")
                };
                Ok(View {
                    head: &head.parts,
                    lead: &head.lead,
                    lead_items: &head.lead_items,
                    fragments: fragments.closed,
                    items,
                    fragment_starts,
                    tail,
                    head_blocks: &head.blocks,
                    closed_blocks,
                    spliced: true,
                    header_parts: head.parts.len() + head.lead_items.len(),
                    lead_from: head.parts.len() + head.lead_items.len(),
                    settings: &head.settings,
                    model: &head.model,
                    key: head.key.as_deref(),
                    retention: head.retention.as_deref(),
                    header,
                    header_seq,
                    shown: shown_tools,
                    closed: Some(fragments.closed),
                    provenance: state.provenance(),
                    snapshot: state.snapshot_text(),
                    left_out: state.left_out(),
                })
            }
            RequestView::Kept(request) => {
                let body = formats::render(&request, format);
                let map = body.as_object().cloned().unwrap_or_default();
                let parts: Vec<Owned> = prefix::marked_parts(&body, format)
                    .into_iter()
                    .map(Owned::of)
                    .collect();
                let lead_from = parts
                    .iter()
                    .position(|p| p.label.starts_with("message"))
                    .unwrap_or(parts.len());
                *kept = Some(Kept {
                    settings: settings_of(&map, format),
                    model: string_at(&map, "model")
                        .or_else(|| string_at(&map, "modelId"))
                        .unwrap_or_default(),
                    key: string_at(&map, "prompt_cache_key"),
                    retention: string_at(&map, "prompt_cache_retention"),
                    head: lead_from,
                    lead_from,
                    parts,
                    request,
                });
                let Some(k) = kept.as_ref() else {
                    unreachable!("just kept")
                };
                tail.clear();
                Ok(View {
                    head: &k.parts,
                    lead: "",
                    lead_items: &[],
                    fragments: &[],
                    items: &[],
                    fragment_starts: &[],
                    tail: &[],
                    head_blocks: &[],
                    closed_blocks: &[],
                    spliced: false,
                    header_parts: k.head,
                    lead_from: k.lead_from,
                    settings: &k.settings,
                    model: &k.model,
                    key: k.key.as_deref(),
                    retention: k.retention.as_deref(),
                    header: &k.request.header,
                    header_seq,
                    shown: k.request.shown_tools.as_deref(),
                    closed: None,
                    provenance: state.provenance(),
                    snapshot: state.snapshot_text(),
                    left_out: state.left_out(),
                })
            }
        }
    }

    /// Feeds this side's cache model one request (blocks already scaled to tokens; the
    /// buffer is handed back for the next one) and says what it read, wrote and missed, and
    /// what that costs.
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &mut self,
        model: &str,
        (key, retention): (Option<String>, Option<String>),
        at_ms: u64,
        blocks: &mut Vec<Block>,
        output: u64,
        pricing: Pricing<'_>,
        format: Format,
    ) -> Figures {
        // One cache per model and retention: entries kept under one retention are not
        // lengthened by requests under another (a header that changes it is rare).
        let at = match self
            .caches
            .iter()
            .position(|(m, r, _)| m == model && *r == retention)
        {
            Some(at) => at,
            None => match Rules::of(format, model, pricing.rules) {
                Some(rules) => {
                    let rules = rules.asked(model, retention.as_deref());
                    self.caches
                        .push((model.to_string(), retention, Cache::new(rules)));
                    self.caches.len() - 1
                }
                None => return Figures::default(),
            },
        };
        let at_ms = at_ms.max(self.last_ms);
        self.last_ms = at_ms;
        let total: u64 = blocks.iter().map(|b| b.tokens).sum();
        let request = cache::Request {
            at_ms,
            blocks: std::mem::take(blocks),
            key,
        };
        let cache = &mut self.caches[at].2;
        let served = cache.serve(&request);
        *blocks = request.blocks;
        let usage = ProviderUsage {
            input_tokens: Some(total),
            output_tokens: Some(output),
            cached_tokens: Some(served.read),
            cache_write_tokens: Some(served.written + served.written_1h),
            cache_write_1h_tokens: Some(served.written_1h),
        };
        let cost = pricing
            .prices
            .get(model)
            .map(|price| price.cost(cache.rules(), &usage, 0).total);
        Figures {
            model: model.to_string(),
            read: served.read,
            written: served.written,
            written_1h: served.written_1h,
            uncached: served.uncached,
            cost,
        }
    }
}

/// A part as the cache model's block.
fn block_of(p: PartRef<'_>) -> Block {
    Block::new(p.hash, p.text.len() as u64, p.mark)
}

/// The string at `key` of a body.
fn string_at(body: &Map<String, Value>, key: &str) -> Option<String> {
    body.get(key).and_then(Value::as_str).map(str::to_string)
}

#[cfg(test)]
mod tests;
