//! Running a replay: the recorded steps of a log, each planned by the candidate and applied to
//! both sides, on a pool of threads.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::difference::Causes;
use super::report::{ReplayTotals, StepReplay};
use super::view::Side;
use super::Candidate;
use crate::assembly::Assembly;
use crate::cache::Block;
use crate::config::AgentSettings;
use crate::error::{Error, Result};
use crate::formats::Format;
use crate::session::log::{Body, Compacted, Dropped, Recorded};
use crate::step::{self, Assembled};
use crate::ErrorBody;

/// How many items [`ahead`]'s threads may run ahead of the one consuming them: what they hold
/// stays bounded whatever the session's length.
pub(super) const AHEAD: usize = 64;

/// `make` over `items` on `threads` scoped threads, each result handed to `take` in the
/// items' order on the calling thread as soon as it and those before it are made, so the two
/// overlap from the first item. The threads stay at most [`AHEAD`] items ahead; the first
/// error of `take` stops them and is returned.
pub(super) fn ahead<T: Sync, R: Send>(
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
pub(super) fn parallel<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
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
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) at_ms: u64,
    pub(super) body: Body,
}

/// Where one recorded step lies in the log: its batch (the messages appended with it), the
/// rest of what it appended (snapshot, header, omissions, trimming), its marker, and the
/// reply that answered it.
pub(super) struct Group {
    pub(super) batch: usize,
    pub(super) tail: usize,
    pub(super) marker: usize,
    pub(super) reply: Option<usize>,
}

/// The recorded steps of `log`. A step's events were appended in one transaction, so they
/// share the marker's time; a tool result recorded on its own before the step does not.
pub(super) fn steps_of(log: &[Entry]) -> Vec<Group> {
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
pub(super) fn recorded_format(log: &[Entry]) -> Format {
    log.iter()
        .find_map(|e| match &e.body {
            Body::AssistantMessage(Recorded { cache: Some(o), .. }) => Some(o.format),
            _ => None,
        })
        .filter(|f| *f != Format::Neutral)
        .unwrap_or(Format::Anthropic)
}

/// One replay in progress.
pub(super) struct Run<'a> {
    pub(super) session: &'a str,
    pub(super) log: &'a [Entry],
    pub(super) candidate: &'a Candidate<'a>,
    pub(super) agent: &'a AgentSettings,
    pub(super) format: Format,
    pub(super) recorded: Side,
    /// The candidate's side, once its log differs from the recorded one in anything a request
    /// is built from; `None` while both logs hold the same events, and the recorded side
    /// stands for both (applied, rendered, measured and cached once).
    pub(super) replayed: Option<Side>,
    /// Recorded seq → the candidate log's seq of the same event (messages, snapshots and
    /// markers), for compactions and trimming recorded by seq.
    pub(super) seqs: BTreeMap<u64, u64>,
    /// Leading closed fragments known equal on both sides (they never change).
    pub(super) verified: usize,
    /// Why the requests last differed.
    pub(super) causes: Causes,
    /// The blocks of both sides' requests, kept for the next step.
    pub(super) buffers: (Vec<Block>, Vec<Block>),
    /// Tokens per byte of the latest step with a provider count: (tokens, bytes).
    pub(super) per_byte: (u64, u64),
    pub(super) out: Vec<StepReplay>,
    pub(super) totals: ReplayTotals,
}

impl Run<'_> {
    /// Replays step `i` (0-based) of `groups` on its assembly.
    pub(super) fn step(
        &mut self,
        groups: &[Group],
        i: usize,
        assembly: Result<Arc<Assembly>>,
    ) -> Result<()> {
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
        // A gateway step was planned in the neutral format (G6: the client's body carries its
        // own model settings), so the candidate's is too; it is compared in `format` all the
        // same.
        let gateway = log
            .get(g.marker + 1)
            .is_some_and(|e| matches!(e.body, Body::GatewayRequest(_)));
        let planned_in = if gateway { Format::Neutral } else { format };
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
                planned_in,
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
    pub(super) fn report(
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
    pub(super) fn candidate_side(&mut self) -> &mut Side {
        match &mut self.replayed {
            Some(side) => side,
            None => &mut self.recorded,
        }
    }

    /// The candidate's own side, split from the recorded one (state, worked-out parts and
    /// caches as they are) when the logs first differ.
    pub(super) fn fork(&mut self) -> &mut Side {
        let recorded = &self.recorded;
        self.replayed.get_or_insert_with(|| recorded.clone())
    }

    /// The recorded seqs as the candidate's log numbers them; a seq the candidate's log has
    /// no event for is left out.
    pub(super) fn mapped(&self, seqs: &[u64]) -> Vec<u64> {
        seqs.iter()
            .filter_map(|s| self.seqs.get(s).copied())
            .collect()
    }

    /// An event between steps: as it is on the recorded side; on the candidate's, with the
    /// seqs it names mapped to the candidate log's.
    pub(super) fn between(&mut self, e: &Entry) -> Result<()> {
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
}

/// Whether `planned`, appended from seq `first`, are the recorded `events` as far as any
/// request is built from them: the same seqs and bodies, except what the session state does
/// not keep — the daemon process a header names, why it was recorded, a marker's budget
/// usage.
pub(super) fn same_events(events: &[Entry], first: u64, planned: &[Body]) -> bool {
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
