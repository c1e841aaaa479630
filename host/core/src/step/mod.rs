//! One step, planned: the pipeline core owns and the daemon drives (Q1–Q6, Q14, Q18).
//!
//! [`plan`] takes a session's state, a registry snapshot, the agent's resolved
//! [`AgentSettings`], the step's input and the format, and returns the [`PlannedStep`]: the typed
//! bodies to append, in order, and what they mean. It builds them in this order, each stage
//! refusing the step before anything is recorded:
//!
//! 1. assembly of the plugins' contributions for the agent's scope chain;
//! 2. content checks of the new messages (block sizes and shapes);
//! 3. review hooks (Q18), which may reject the step or redact its new messages (checked
//!    again);
//! 4. tool-result shaping (`tool_result_template`, `empty_tool_result`);
//! 5. whether `format` can carry the session and the new messages (Q6);
//! 6. provenance, when the header or the plugin set may have changed;
//! 7. the session's events ([`SessionState::step_events`]): messages, snapshot, header,
//!    omissions and the marker (Q1–Q3, Q5);
//! 8. the budget: measuring, trimming with the `history/dropped` event before the marker, and
//!    refusing a request that still does not fit (Q14); the usage goes on the marker.
//!
//! The daemon then appends [`PlannedStep::encode`]'s events, applies the bodies to the state
//! as they are ([`crate::session::SessionState::apply_planned`]) and renders the request.

use std::collections::BTreeMap;

use crate::assembly::{self, Assembly};
use crate::budget::Usage;
use crate::config::AgentSettings;
use crate::conversation::content::Content;
use crate::conversation::Message;
use crate::error::{Error, Result};
use crate::formats::{self, Format};
use crate::held;
use crate::observe::{observed, Activity, Observe};
use crate::plugin::model::Step;
use crate::plugin::registry::Registry;
use crate::session::log::Body;
use crate::session::{self, HeaderReason, SessionState};
use crate::store::{NewEvent, StoreError};

mod budget;
mod header;
mod review;

pub use header::{cache_key, key_base};
pub use review::review_recorded;

/// What a client sends for one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepInput {
    /// New user messages and tool results, in order (tool results first).
    pub messages: Vec<Message>,
    /// The runtime facts plugins read (`cwd`, `git_branch`, …).
    pub facts: BTreeMap<String, String>,
    /// When the client will send the request, in ms since the Unix epoch, if it says (the
    /// daemon's clock otherwise): a held change's idle gap and age are measured from it (K7),
    /// as a recorded reply's idle gap is from its `sent_at`.
    pub sent_at: Option<u64>,
    /// The names of the tools the client sent with its request (the gateway knows them), for
    /// plugins that read `client-tools` (world 0.3.0).
    pub client_tools: Option<Vec<String>>,
}

/// Who plans a step: the daemon process (`run`, recorded with each header, Q3) and what it
/// counts across sessions for the cache policies of a step whose header is new (none in a
/// replay or a one-shot assembly). Only the choices the counts lead to are recorded (the
/// header's TTL and key), so a rebuild never needs them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serving<'a> {
    /// The daemon process.
    pub run: &'a str,
    /// The agent's idle gaps over the replies this daemon recorded (`ttl = "auto"` for a
    /// session with too few of its own).
    pub agent_gaps: Option<&'a crate::cache::ttl::Gaps>,
    /// Cache keys whose OpenAI requests passed the per-key rate in the last minute, and the
    /// shards each takes ([`cache_key`]).
    pub key_shards: Option<&'a BTreeMap<String, u32>>,
    /// Now, in ms since the Unix epoch: when a held change (K7) passed the TTL or its
    /// `max_stale_s`. None in a replay, which has no clock: only the other cold points apply.
    pub now_ms: Option<u64>,
    /// Told when each stage and plugin call starts and ends (telemetry); never changes what
    /// is planned.
    pub observe: Option<&'a dyn Observe>,
}

impl<'a> Serving<'a> {
    /// Process `run`, with no counts.
    pub fn run(run: &'a str) -> Serving<'a> {
        Serving {
            run,
            ..Serving::default()
        }
    }
}

/// A step ready to append: its bodies in log order, the marker last.
#[derive(Debug)]
pub struct PlannedStep {
    /// The step's number, from 1.
    pub step: u64,
    /// The bodies to append, in order.
    pub bodies: Vec<Body>,
    /// Why a header is recorded, when one is.
    pub header_reason: Option<HeaderReason>,
    /// Whether the previous step's whole request is a prefix of this one's (after trimming);
    /// `None` on a session's first step.
    pub prefix_kept: Option<bool>,
    /// The redactions review hooks applied to the step's new messages (Q18), in order: a
    /// front door that forwards the client's own bytes applies them there too (G6).
    pub redactions: Vec<crate::assembly::review::Redaction>,
}

impl PlannedStep {
    /// The events a store appends, one per body.
    pub fn encode(&self) -> Result<Vec<NewEvent>> {
        self.bodies.iter().map(encode).collect()
    }

    /// The step's usage, as its marker records it.
    pub fn usage(&self) -> Option<&Usage> {
        match self.bodies.last() {
            Some(Body::Step(marker)) => marker.usage.as_ref(),
            _ => None,
        }
    }

    /// What the step held for a cache-cold point (K7), as its marker records it.
    pub fn held(&self) -> &[held::Held] {
        match self.bodies.last() {
            Some(Body::Step(marker)) => &marker.held,
            _ => &[],
        }
    }

    /// The contributions that kept an earlier step's answer (W4), as its marker records them.
    pub fn reused(&self) -> &[std::sync::Arc<str>] {
        match self.bodies.last() {
            Some(Body::Step(marker)) => &marker.reused,
            _ => &[],
        }
    }

    /// Takes the usage out of the marker (once the events are encoded: the state does not
    /// keep it), so the reply can carry it without a copy.
    pub fn take_usage(&mut self) -> Option<Usage> {
        match self.bodies.last_mut() {
            Some(Body::Step(marker)) => marker.usage.take(),
            _ => None,
        }
    }
}

/// `body` as a store appends it.
pub fn encode(body: &Body) -> Result<NewEvent> {
    body.encode().map_err(|e| {
        Error::Store(StoreError::backend(
            format!("encoding a {} event", body.kind()),
            e,
        ))
    })
}

/// Plans one step of session `session` (see the module docs for the stages) for the process
/// `serving` names (recorded with each header, Q3). The state is only read, except for what
/// it remembers of measurements; a refused step leaves it as it was.
pub fn plan(
    state: &mut SessionState,
    registry: &Registry,
    agent: &AgentSettings,
    session: &str,
    serving: Serving<'_>,
    input: StepInput,
    format: Format,
) -> Result<PlannedStep> {
    match plan_with(
        state, registry, agent, session, serving, input, format, false,
    )? {
        Ok(planned) => Ok(planned),
        // Not reached: calls are allowed.
        Err(_) => Err(Error::WouldCall),
    }
}

/// [`plan`] where no plugin may be called (the caller shares its thread with other work, and
/// a call could block it to its deadline): a step whose assembly is served from the memo and
/// the session's kept answers (world 0.3.0), with no review hook, is planned as [`plan`]
/// plans it; any other gives its input back, untouched, with nothing called and the state
/// as it was, to be planned by [`plan`] where calls may block. A registry with a hook, or
/// with an item asked at every step ([`Declaration::asked_every_step`], a plugin of world
/// 0.1.0 or 0.2.0), gives it back at once, whatever the step.
///
/// [`Declaration::asked_every_step`]: crate::plugin::model::Declaration::asked_every_step
pub fn plan_without_calls(
    state: &mut SessionState,
    registry: &Registry,
    agent: &AgentSettings,
    session: &str,
    serving: Serving<'_>,
    input: StepInput,
    format: Format,
) -> Result<std::result::Result<PlannedStep, StepInput>> {
    // Review hooks are calls, and an item asked at every step is one: given back before any
    // work, rather than planned up to its call here and again on the blocking pool.
    let calls =
        |d: &crate::plugin::model::Declaration| d.review_order.is_some() || d.asked_every_step();
    if registry.plugins().any(|p| calls(&p.declaration)) {
        return Ok(Err(input));
    }
    plan_with(
        state, registry, agent, session, serving, input, format, true,
    )
}

#[allow(clippy::too_many_arguments)]
fn plan_with(
    state: &mut SessionState,
    registry: &Registry,
    agent: &AgentSettings,
    session: &str,
    serving: Serving<'_>,
    mut input: StepInput,
    format: Format,
    forbid: bool,
) -> Result<std::result::Result<PlannedStep, StepInput>> {
    let facts = std::mem::take(&mut input.facts);
    let mut step = step_for(agent, session, state.steps() + 1, facts);
    let model = step.facts.get("model").cloned();
    let client_tools = input.client_tools.take();
    let kept_tools = forbid.then(|| client_tools.clone());
    step.inputs = state.step_inputs(&input.messages, model, client_tools);
    let options = agent.options_for(state.data_secret().clone());
    let reuse = state.reuse_mut();
    let assembly = observed(serving.observe, Activity::Assembly, || match forbid {
        true => assembly::assemble_without_calls(registry, &step, &options, serving.observe, reuse),
        false => {
            assembly::assemble_reusing(registry, &step, &options, serving.observe, Some(reuse))
        }
    });
    let assembly = match (assembly, kept_tools) {
        (Err(Error::WouldCall), Some(client_tools)) => {
            input.facts = step.facts;
            input.client_tools = client_tools;
            return Ok(Err(input));
        }
        (assembly, _) => assembly?,
    };
    let mut assembled = Assembled { step, assembly };
    plan_assembled(
        state,
        registry,
        agent,
        &mut assembled,
        serving,
        input.messages,
        format,
    )
    .map(Ok)
}

/// What plugins are shown of step `number` of session `session` with `facts`.
pub fn step_for(
    agent: &AgentSettings,
    session: &str,
    number: u64,
    facts: BTreeMap<String, String>,
) -> Step {
    Step {
        agent: agent.agent.clone(),
        scope_chain: agent.scope_chain.clone(),
        session_id: session.to_string(),
        step_number: number,
        facts,
        inputs: Default::default(),
    }
}

/// Stage 1 alone: the assembly of `step` for `agent`, data blocks keyed with `secret` (T8).
/// It reads nothing of the session but its secret, so steps whose facts are known can be
/// assembled ahead, on other threads (a counterfactual replay does: [`crate::replay`]).
pub fn assemble(
    registry: &Registry,
    agent: &AgentSettings,
    step: &Step,
    secret: &std::sync::Arc<str>,
) -> Result<std::sync::Arc<Assembly>> {
    assembly::assemble(registry, step, &agent.options_for(secret.clone()))
}

/// A step and its assembly ([`assemble`]), ready for [`plan_assembled`].
#[derive(Debug)]
pub struct Assembled {
    /// The step plugins were shown.
    pub step: Step,
    /// What they gave (shared with other assemblies of the snapshot when no plugin was
    /// called).
    pub assembly: std::sync::Arc<Assembly>,
}

/// Stages 2 to 8 of [`plan`] on an assembly made by [`assemble`] for the state's next step.
/// The step's facts move into its marker (`assembled.step.facts` is left empty); the assembly
/// stays for the caller.
pub fn plan_assembled(
    state: &mut SessionState,
    registry: &Registry,
    agent: &AgentSettings,
    assembled: &mut Assembled,
    serving: Serving<'_>,
    messages: Vec<Message>,
    format: Format,
) -> Result<PlannedStep> {
    let Assembled {
        step,
        assembly: assembled,
    } = assembled;
    let assembled: &Assembly = assembled;
    // 2–5: content checks, review hooks, tool-result shaping, whether the format carries it.
    check_content(agent, format, &messages)?;
    let (messages, redactions) =
        review::reviewed(registry, step, assembled, agent, messages, serving.observe)?;
    let messages = shaped(agent, messages);
    check_format(state, agent, assembled, format, &messages)?;
    // The header (same, held or new), 6: provenance, 7: the session's events, 8: the budget.
    let mut header = header::choose(state, registry, agent, assembled, step, serving, format);
    let provenance = header.provenance(state, registry, assembled);
    let facts = std::mem::take(&mut step.facts);
    let events = state.step_events(
        messages,
        facts,
        assembled,
        header.header,
        serving.run,
        provenance.as_ref(),
    )?;
    let mut planned = budget::budgeted(
        state,
        agent,
        assembled,
        serving,
        format,
        events,
        (header.held, header.released),
    )?;
    planned.redactions = redactions;
    Ok(planned)
}

/// Stage 2: the model settings in `format`, then each new message's content (block sizes and
/// shapes).
fn check_content(agent: &AgentSettings, format: Format, messages: &[Message]) -> Result<()> {
    formats::check_settings(&agent.model, format)?;
    let limits = &agent.content_limits;
    for (i, m) in messages.iter().enumerate() {
        content_of(m).check(limits).map_err(|e| e.at_message(i))?;
    }
    Ok(())
}

/// Stage 4: tool results as the agent shows them (`tool_result_template`, `empty_tool_result`).
fn shaped(agent: &AgentSettings, messages: Vec<Message>) -> Vec<Message> {
    let shown = &agent.tool_results;
    session::tool_results_shown(messages, shown.template.as_deref(), &shown.empty)
}

/// Stage 5: whether `format` can carry the session and the new messages (Q6), and the
/// assembly's tool names.
fn check_format(
    state: &SessionState,
    agent: &AgentSettings,
    assembled: &Assembly,
    format: Format,
    messages: &[Message],
) -> Result<()> {
    state.check_renders(format, messages)?;
    state.check_dialect(format, &agent.model, messages)?;
    for tool in assembled.tools.iter() {
        crate::formats::check_tool_name(format, &tool.name)?;
    }
    Ok(())
}

/// The blocks a user message or tool result carries (none for a reply).
pub fn content_of(message: &Message) -> &Content {
    static NONE: Content = Content::Blocks(Vec::new());
    match message {
        Message::User { content, .. } | Message::Tool { content, .. } => content,
        Message::Assistant { .. } => &NONE,
    }
}
