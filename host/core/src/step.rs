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

use crate::assembly::review::Verdict;
use crate::assembly::{self, Assembly};
use crate::budget::Usage;
use crate::config::{AgentSettings, KeyPolicy};
use crate::conversation::content::Content;
use crate::conversation::{Header, Message, Ttl};
use crate::error::{Error, Result};
use crate::formats::{self, Format};
use crate::held;
use crate::observe::{observed, Activity, Observe};
use crate::plugin::model::Step;
use crate::plugin::registry::{PluginEntry, Registry};
use crate::provenance::Provenance;
use crate::session::log::Body;
use crate::session::{self, HeaderReason, SessionState};
use crate::store::{NewEvent, StoreError};

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
    let step = step_for(agent, session, state.steps() + 1, input.facts);
    let options = agent.options_for(state.data_secret().clone());
    let assembly = observed(serving.observe, Activity::Assembly, || {
        assembly::assemble_observed(registry, &step, &options, serving.observe)
    })?;
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
    formats::check_settings(&agent.model, format)?;
    let limits = &agent.content_limits;
    for (i, m) in messages.iter().enumerate() {
        content_of(m).check(limits).map_err(|e| e.at_message(i))?;
    }
    // Q18: hooks may reject the step or redact its new messages; redacted ones are checked
    // again (a redaction may lengthen a text).
    let shown = |current: &[Message]| crate::assembly::review::input(current, assembled);
    let messages = match review(registry, step, &messages, shown, serving.observe)? {
        Some(redacted) => {
            for (i, m) in redacted.iter().enumerate() {
                content_of(m).check(limits).map_err(|e| e.at_message(i))?;
            }
            redacted
        }
        None => messages,
    };
    let shown = &agent.tool_results;
    let messages = session::tool_results_shown(messages, shown.template.as_deref(), &shown.empty);
    state.check_renders(format, &messages)?;
    state.check_dialect(format, &agent.model, &messages)?;
    for tool in assembled.tools.iter() {
        crate::formats::check_tool_name(format, &tool.name)?;
    }

    // The header only when it differs from the recorded one: an unchanged header is neither
    // built nor compared field by field twice.
    let ttl = agent.cache_ttl.header_ttl(state.gaps(), serving.agent_gaps);
    let mut current = None;
    let mut held = Vec::new();
    let mut released = None;
    let header: Option<Header> = match state.header() {
        Some(h)
            if session::same_header(
                h,
                session::Proposed {
                    model: &agent.model,
                    system: &assembled.system,
                    tools: session::ToolsOf::Assembled(&assembled.tools),
                    layout: crate::conversation::LAYOUT,
                    cache_ttl: ttl,
                    key: session::KeyRule::Kept,
                },
            ) =>
        {
            None
        }
        Some(h) if holds_any(registry, assembled) => {
            let now = Provenance::of(registry, assembled);
            let decision = decide_held(
                state,
                h,
                &now,
                (registry, assembled),
                agent,
                ttl,
                serving,
                format,
            );
            current = Some(now);
            match decision {
                held::Decision::Hold(parts) => {
                    held = parts;
                    None
                }
                held::Decision::Apply(release) => {
                    released = release;
                    let key = cache_key(agent, &step.session_id, assembled, serving.key_shards);
                    Some(new_header(assembled, agent, key, ttl))
                }
            }
        }
        _ => {
            let key = cache_key(agent, &step.session_id, assembled, serving.key_shards);
            Some(new_header(assembled, agent, key, ttl))
        }
    };
    // Provenance only when it may have changed: a new header or plugin set.
    let known = header.is_none()
        && state.provenance().is_some_and(|p| {
            p.plugins.len() == registry.len()
                && registry.plugins().all(|e| {
                    p.plugins.get(&e.id).map(String::as_str)
                        == Some(e.sha256.as_deref().unwrap_or(""))
                })
        });
    // A held step sends the recorded header: its provenance still says who gave what it
    // sends, so none is recorded for it.
    let provenance = (!known && held.is_empty())
        .then(|| current.unwrap_or_else(|| Provenance::of(registry, assembled)));
    let facts = std::mem::take(&mut step.facts);
    let mut plan = state.step_events(
        messages,
        facts,
        assembled,
        header,
        serving.run,
        provenance.as_ref(),
    )?;

    // Measure what this step's request will hold: the log so far, this step's input and its
    // snapshot.
    let snapshot = plan.events.iter().find_map(|b| match b {
        Body::ContextSnapshot(s) => Some(Message::snapshot(s.content.clone())),
        _ => None,
    });
    let new: Vec<&Message> = plan
        .events
        .iter()
        .filter_map(Body::as_message)
        .chain(snapshot.as_ref())
        .collect();
    // The new header, when the plan records one; else the recorded one stands.
    let header = plan.events.iter().find_map(|b| match b {
        Body::RequestHeader(h) => Some(&h.header),
        _ => None,
    });
    let (usage, dropped) = observed::<_, Error>(serving.observe, Activity::Budget, || {
        Ok(state.fit(
            &agent.budget,
            &*agent.counter,
            header,
            assembled,
            format,
            &new,
        ))
    })?;
    drop(new);
    let mut prefix_kept = plan.prefix_kept;
    if let Some(dropped) = dropped {
        plan.events.push(dropped);
        prefix_kept = prefix_kept.map(|_| false);
    }
    usage.check(&agent.budget)?;
    plan.marker.usage = Some(usage);
    plan.marker.held = held;
    if let Some(released) = released {
        for body in &mut plan.events {
            if let Body::RequestHeader(record) = body {
                record.released = Some(released.clone());
            }
        }
    }
    let step = plan.step;
    let header_reason = plan.header_reason;
    Ok(PlannedStep {
        step,
        bodies: plan.into_bodies(),
        header_reason,
        prefix_kept,
    })
}

/// The `prompt_cache_key` a new header of `session` records under `agent`'s policy
/// ([`KeyPolicy`]): `promptd-SESSION`, `promptd-AGENT` or `promptd-p` and the head's hash, the
/// last two with `~N` (the session's shard of `N`) when the daemon says requests with that
/// key pass the per-key rate (`shards`).
pub fn cache_key(
    agent: &AgentSettings,
    session: &str,
    assembled: &Assembly,
    shards: Option<&BTreeMap<String, u32>>,
) -> String {
    let base = match agent.cache_key {
        KeyPolicy::Session => return format!("promptd-{session}"),
        KeyPolicy::Agent => format!("promptd-{}", agent.agent),
        KeyPolicy::Prefix => {
            let mut head = assembled.system.as_bytes().to_vec();
            for t in assembled.tools.iter() {
                head.push(0);
                head.extend_from_slice(t.name.as_bytes());
                head.push(0);
                head.extend_from_slice(t.description.as_bytes());
                head.push(0);
                head.extend_from_slice(t.parameters.to_string().as_bytes());
            }
            format!("promptd-p{:016x}", crate::cache::fnv(&head))
        }
    };
    match shards.and_then(|s| s.get(&base)) {
        Some(&n) if n > 1 => {
            let shard = crate::cache::fnv(session.as_bytes()) % u64::from(n);
            format!("{base}~{shard}")
        }
        _ => base,
    }
}

/// A key without its shard: what the rate past which requests are sharded counts.
pub fn key_base(key: &str) -> &str {
    key.split_once('~').map_or(key, |(base, _)| base)
}

/// Whether any plugin holds a change for a cache-cold point (K7), or a failed one's tools are
/// kept (K8): when none is, a changed header is recorded without comparing provenances.
fn holds_any(registry: &Registry, assembled: &Assembly) -> bool {
    registry.has_kept()
        || registry.plugins().any(|p| !p.options.refresh.is_step())
        || failed_keeping(registry, assembled, "").is_some()
}

/// K8: why plugin `id` (any plugin, when `id` is empty) with `keep_tools` was left out of
/// this assembly because a call failed (A9), if it was.
fn failed_keeping(registry: &Registry, assembled: &Assembly, id: &str) -> Option<String> {
    assembled
        .omitted
        .iter()
        .filter(|o| id.is_empty() || o.plugin == id)
        .find(|o| {
            registry
                .get(&o.plugin)
                .is_some_and(|e| e.options.keep_tools)
        })
        .map(|o| format!("{} failed: {}", o.contribution, o.cause))
}

/// K7: whether a header that would change from `header` to this step's assembly (whose
/// provenance is `now`) waits for a cache-cold point.
#[allow(clippy::too_many_arguments)]
fn decide_held(
    state: &SessionState,
    header: &Header,
    now: &Provenance,
    (registry, assembled): (&Registry, &Assembly),
    agent: &AgentSettings,
    ttl: Option<Ttl>,
    serving: Serving<'_>,
    format: Format,
) -> held::Decision {
    let rest_changed = if header.layout != crate::conversation::LAYOUT {
        Some("the body layout changed")
    } else if header.cache_key.is_none() {
        Some("the header had no cache key")
    } else if header.cache_ttl != ttl {
        Some("the cache TTL changed")
    } else if header.model != agent.model {
        Some("the model settings changed")
    } else {
        None
    };
    let tool_bytes: Vec<usize> = header
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .collect();
    let moment = held::Moment {
        step: state.steps() + 1,
        now_ms: serving.now_ms,
        last_reply_ms: state.last_reply_ms(),
        ttl_ms: agent.idle_ttl_ms(format, header.cache_ttl),
        compacted: state.compacted(),
        held: state.held(),
        system: &header.system,
        tool_bytes: &tool_bytes,
        message_bytes: state.message_bytes() as u64,
    };
    let policy = |id: &str| match (registry.get(id), registry.kept(id)) {
        (Some(e), _) => match failed_keeping(registry, assembled, id) {
            Some(cause) => held::Policy::Kept(cause),
            None => held::Policy::Loaded(e.options.refresh.clone()),
        },
        (None, Some(kept)) => held::Policy::Kept(kept.cause.clone()),
        (None, None) => held::Policy::Removed,
    };
    held::decide(
        state.header_provenance(),
        now,
        &policy,
        rest_changed,
        &moment,
    )
}

/// A new header for this step's assembly: built whole, its cache key and TTL set.
fn new_header(
    assembled: &Assembly,
    agent: &AgentSettings,
    key: String,
    ttl: Option<Ttl>,
) -> Header {
    let mut header = session::header(assembled, agent.model.clone());
    header.cache_key = Some(key);
    header.cache_ttl = ttl;
    header
}

/// Q18: every review hook, by (order, plugin id), each shown the messages as the hooks before
/// it left them; the messages as redacted, or none when no hook redacted (the common case,
/// so a step without hooks copies nothing). A rejection, a failed hook or a bad verdict fails
/// the step: a hook guards what is recorded, so it fails closed, `optional` or not.
fn review(
    registry: &Registry,
    step: &Step,
    messages: &[Message],
    shown: impl Fn(&[Message]) -> crate::plugin::provider::ReviewInput,
    observe: Option<&dyn Observe>,
) -> Result<Option<Vec<Message>>> {
    if !registry
        .plugins()
        .any(|p| p.declaration.review_order.is_some())
    {
        return Ok(None);
    }
    let mut hooks: Vec<(i32, &PluginEntry)> = registry
        .plugins()
        .filter_map(|p| p.declaration.review_order.map(|o| (o, &**p)))
        .collect();
    hooks.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
    let mut redacted: Option<Vec<Message>> = None;
    for (_, hook) in hooks {
        let current = redacted.as_deref().unwrap_or(messages);
        let failed = |cause: String, trapped: bool| Error::PluginCall {
            plugin: hook.id.clone(),
            contribution: "review".into(),
            cause,
            trapped,
        };
        let input = shown(current);
        let activity = Activity::Review {
            plugin: &hook.id,
            sha256: hook.sha256.as_deref(),
        };
        let verdict = observed(observe, activity, || hook.provider.review(step, &input));
        let verdict = verdict.map_err(|e| {
            let trapped = matches!(e, crate::plugin::provider::CallError::Trapped(_));
            failed(e.cause().to_string(), trapped)
        })?;
        match verdict {
            Verdict::Accept => {}
            Verdict::Reject(reason) => {
                return Err(Error::ReviewRejected {
                    plugin: hook.id.clone(),
                    reason,
                })
            }
            Verdict::Redact(rules) => {
                let next = crate::assembly::review::redact(current, &rules)
                    .map_err(|cause| failed(cause, false))?;
                redacted = Some(next);
            }
        }
    }
    Ok(redacted)
}

/// Q18 for a message recorded between steps (the model's reply, or a tool's output sent to
/// `POST …/messages`): the same hooks, in the same order and within the same bounds as a
/// step's, shown `message` with what the session's last step was assembled with (its system
/// prompt, runtime context and tools shown) and that step's number. A rejection or a failed
/// hook refuses the message; a redaction applies to a tool's output (a reply is shown, never
/// changed: the provider sent it) and is checked against the content limits again.
pub fn review_recorded(
    registry: &Registry,
    agent: &AgentSettings,
    state: &SessionState,
    message: Message,
    observe: Option<&dyn Observe>,
) -> Result<Message> {
    let step = step_for(agent, state.session_id(), state.steps(), BTreeMap::new());
    let header = state.header();
    let shown = |current: &[Message]| crate::plugin::provider::ReviewInput {
        messages: crate::assembly::review::shown_messages(current),
        system: header.map(|h| h.system.clone()).unwrap_or_default(),
        runtime_context: state.snapshot_text().map(str::to_string),
        tools: match (state.shown_tools(), header) {
            (Some(shown), _) => shown.to_vec(),
            (None, Some(h)) => h.tools.iter().map(|t| t.name.clone()).collect(),
            (None, None) => Vec::new(),
        },
    };
    match review(
        registry,
        &step,
        std::slice::from_ref(&message),
        shown,
        observe,
    )? {
        Some(mut redacted) if redacted.len() == 1 => {
            let message = redacted.remove(0);
            content_of(&message).check(&agent.content_limits)?;
            Ok(message)
        }
        _ => Ok(message),
    }
}

/// The blocks a user message or tool result carries (none for a reply).
pub fn content_of(message: &Message) -> &Content {
    static NONE: Content = Content::Blocks(Vec::new());
    match message {
        Message::User { content, .. } | Message::Tool { content, .. } => content,
        Message::Assistant { .. } => &NONE,
    }
}
