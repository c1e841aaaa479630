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

mod compare;
mod difference;
mod report;
mod run;
mod scan;
mod view;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::assembly::Assembly;
use crate::config::settings::ToolResults;
use crate::config::AgentSettings;
use crate::error::{Error, Result};
use crate::formats::Format;
use crate::ledger::Pricing;
use crate::plugin::registry::Registry;
use crate::session;
use crate::session::log::Body;
use crate::step;
use crate::store::Event;
use difference::Causes;
use run::{ahead, parallel, recorded_format, steps_of, Entry, Run};
use view::Side;

pub use report::{Counted, Difference, Figures, ReplayTotals, SessionReplay, StepReplay, Tokens};

/// What a session is replayed with.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// The candidate plugin set (its own registry, never the one serving).
    pub registry: &'a Registry,
    /// The session's agent, resolved from the candidate config.
    pub agent: &'a AgentSettings,
    /// The candidate config's prices and cache rules.
    pub pricing: Pricing<'a>,
    /// The provider format requests are compared and priced in; `None`: the format of the
    /// session's recorded replies, else `anthropic`.
    pub format: Option<Format>,
    /// Threads a replay runs on: with 2 or more, the caller's compares while the others
    /// assemble the next steps ahead; with 1, the caller's does both.
    pub workers: usize,
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
        causes: Causes::default(),
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

#[cfg(test)]
mod tests;
