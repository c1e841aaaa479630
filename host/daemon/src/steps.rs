//! Steps and the session log: the daemon drives core's step pipeline
//! ([`promptd_core::step::plan`]) and records what it plans (Q1–Q6, Q14, Q18).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use promptd_core::budget::{self, Counter, Usage};
use promptd_core::config::{AgentSettings, Config};
use promptd_core::conversation::{FrozenRequest, Message};
use promptd_core::formats::pieces::Pieces;
use promptd_core::formats::{self, Format};
use promptd_core::provenance::Provenance;
use promptd_core::session::log::{Body, SessionCreated};
use promptd_core::session::{self, SessionState};
use promptd_core::step::{self, StepInput};
use promptd_core::store::{Event, NewEvent};
use promptd_core::Error;

use crate::sessions::{Cached, SessionCache};
use crate::telemetry::Timeline;
use crate::{Daemon, DaemonError, Result, STEP_WAITS_FOR_LOADING};
use promptd_telemetry::{RecordRecord, StepRecord};

/// Most agents whose settings are kept: agent names come from clients, so never let them grow
/// this (a cleared map is refilled one resolve per agent).
const MAX_AGENTS: usize = 1024;

/// Agents' settings resolved for one config version.
#[derive(Default)]
pub(crate) struct ResolvedAgents {
    config: Option<Arc<Config>>,
    by_agent: HashMap<String, Arc<AgentSettings>>,
}

/// A session's cached state, taken out of the session cache while the session's lock is
/// held, and put back when dropped — on every path, errors included — unless marked stale.
struct Taken<'a> {
    cache: &'a SessionCache,
    id: &'a str,
    /// Always `Some` until the guard drops (only `drop` takes it).
    cached: Option<Cached>,
    stale: bool,
}

impl Taken<'_> {
    fn get(&mut self) -> &mut Cached {
        match &mut self.cached {
            Some(cached) => cached,
            None => unreachable!("the state is taken only when the guard drops"),
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let (Some(cached), false) = (self.cached.take(), self.stale) {
            self.cache.put(self.id, cached);
        }
    }
}

impl Daemon {
    /// Creates a session for `agent` (after checking its name): returns its id.
    pub fn create_session(&self, agent: &str) -> Result<String> {
        self.create_session_traced(agent, None)
    }

    /// [`Daemon::create_session`] for a client that sent its trace context (`parent`: the
    /// session's span links to it, with telemetry on).
    pub fn create_session_traced(
        &self,
        agent: &str,
        parent: Option<promptd_telemetry::Parent>,
    ) -> Result<String> {
        let id = self.new_session(agent)?;
        if let Some(t) = self.telemetry() {
            t.session_created(&id, agent, SystemTime::now(), parent.as_ref());
        }
        Ok(id)
    }

    fn new_session(&self, agent: &str) -> Result<String> {
        self.config().chain(agent)?; // validates the name

        // The key of the session's data blocks (T8): plugins never see the log, so they
        // cannot learn it; every daemon reading the log fences alike.
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| Error::Engine {
            context: "drawing a session secret".into(),
            source: Box::new(std::io::Error::other(e.to_string())),
        })?;
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let created = Body::SessionCreated(SessionCreated {
            agent: agent.to_string(),
            data_secret: Some(secret),
        });
        let id = self
            .store
            .create_session(agent, promptd_core::step::encode(&created)?)?;
        Ok(id)
    }

    pub(crate) fn agent_of(&self, id: &str) -> Result<String> {
        self.store
            .session_agent(id)?
            .ok_or_else(|| Error::UnknownSession(id.to_string()).into())
    }

    /// `agent`'s settings for the config serving now, resolved once per agent and config version.
    pub fn agent_settings(&self, agent: &str) -> Result<Arc<AgentSettings>> {
        let config = self.config();
        let mut plans = crate::lock(&self.agents);
        if !plans
            .config
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &config))
        {
            *plans = ResolvedAgents {
                config: Some(config.clone()),
                by_agent: HashMap::new(),
            };
        }
        if let Some(plan) = plans.by_agent.get(agent) {
            return Ok(plan.clone());
        }
        let plan = Arc::new(AgentSettings::resolve(&config, agent, |name| {
            Some(self.counter(name))
        })?);
        if plans.by_agent.len() >= MAX_AGENTS {
            plans.by_agent.clear();
        }
        plans.by_agent.insert(agent.to_string(), plan.clone());
        Ok(plan)
    }

    /// The counter for a tokenizer the config validated (`chars` for anything else).
    pub(crate) fn counter(&self, name: &str) -> Arc<dyn Counter> {
        let mut counters = crate::lock(&self.counters);
        if let Some(counter) = counters.get(name) {
            return counter.clone();
        }
        let counter = promptd_tokenize::counter(name).unwrap_or_else(|| Arc::new(budget::Chars));
        counters.insert(name.to_string(), counter.clone());
        counter
    }

    /// Session `id`'s cached state, or one built from its log (once, for a cold session).
    /// Call with the session's lock held; the guard puts it back.
    fn session<'a>(&'a self, id: &'a str) -> Result<Taken<'a>> {
        let taken = |cached| Taken {
            cache: &self.sessions,
            id,
            cached: Some(cached),
            stale: false,
        };
        if let Some(mut cached) = self.sessions.take(id) {
            if !self.store.is_shared() {
                return Ok(taken(cached));
            }
            // Other daemons may have appended since (Q17): catch up before using the state,
            // so alternating daemons plan on the whole log instead of meeting a conflict.
            let missing = match self.store.events_after(id, cached.state.last_seq()) {
                Ok(missing) => missing,
                Err(e) => {
                    drop(taken(cached)); // kept: nothing changed
                    return Err(e.into());
                }
            };
            if missing.is_empty() || cached.state.apply(&missing).is_ok() {
                return Ok(taken(cached));
            }
            // The log no longer continues the state (e.g. restored from a backup): rebuild.
        }
        let agent = self.agent_of(id)?;
        let state = SessionState::from_log(id, &self.store.events(id)?)?;
        Ok(taken(Cached { agent, state }))
    }

    /// Appends `bodies` (encoded as `events`) at the state's next seq and extends the state
    /// by them as they are. When another writer appended in the meantime the append is
    /// refused (`store_conflict`) and the stale state is dropped, so the next call rebuilds
    /// it from the log.
    fn append(&self, taken: &mut Taken<'_>, events: &[NewEvent], bodies: Vec<Body>) -> Result<u64> {
        let next = taken.get().state.last_seq() + 1;
        let applied = self
            .store
            .append(taken.id, next, events)
            .map_err(DaemonError::from)
            .and_then(|()| Ok(taken.get().state.apply_planned(next, bodies)?));
        if let Err(e) = applied {
            taken.stale = true;
            return Err(e);
        }
        Ok(next)
    }

    /// Runs one step (Q1–Q3, Q6): assemble, plan, append in one transaction, and return the
    /// step number and the request body in `format` — the bytes a rebuild of the step from the
    /// log renders (Q4), spliced from the session's cached fragments.
    pub fn step(&self, id: &str, input: &StepInput, format: Format) -> Result<(u64, String)> {
        let mut body = Pieces::default();
        let never = AtomicBool::new(false);
        let (n, _) = self.step_into(id, input.clone(), format, None, &never, &mut body)?;
        Ok((n, body.into_string()))
    }

    /// [`Daemon::step`], with the body appended to `out` (the HTTP layer writes its envelope
    /// around it, and hands the session's kept fragments to the socket as they are, issue 31);
    /// with `since`, the body's parts relative to that step instead
    /// (`SessionState::render_parts_into`). Once `cancelled` is set (the client went away),
    /// the step stops before its append and records nothing: `DaemonError::Cancelled`.
    pub fn step_into(
        &self,
        id: &str,
        input: StepInput,
        format: Format,
        since: Option<u64>,
        cancelled: &AtomicBool,
        out: &mut Pieces,
    ) -> Result<(u64, Usage)> {
        self.step_traced(id, input, format, since, cancelled, out, None)
    }

    /// [`Daemon::step_into`] for a client that sent its trace context (`parent`): with
    /// telemetry on, the step's spans join that trace (else the session's).
    #[allow(clippy::too_many_arguments)]
    pub fn step_traced(
        &self,
        id: &str,
        input: StepInput,
        format: Format,
        since: Option<u64>,
        cancelled: &AtomicBool,
        out: &mut Pieces,
        parent: Option<promptd_telemetry::Parent>,
    ) -> Result<(u64, Usage)> {
        let started = Instant::now();
        let sampled = self
            .telemetry()
            .and_then(|t| Some((t.clone(), t.sample(id, parent.as_ref())?)));
        let (telemetry, sampled) = sampled.unzip();
        let timeline = telemetry.as_deref().map(Timeline::new);
        let mut record = sampled.map(|sampled| StepRecord {
            session: Arc::from(id),
            sampled: Some(sampled),
            format: Some(format),
            start: Some(SystemTime::now()),
            parent,
            ..StepRecord::default()
        });
        let traced = match (&timeline, &mut record) {
            (Some(timeline), Some(record)) => Some((timeline, record)),
            _ => None,
        };
        let result = self.step_inner(id, input, format, since, cancelled, out, traced);
        if let (Some(t), Some(mut record), Some(timeline)) = (&telemetry, record, timeline) {
            record.end = Some(SystemTime::now());
            record.timeline = timeline.take();
            record.request_bytes = out.len();
            if let Err(e) = &result {
                record.error = Some((e.code().to_string(), e.to_string()));
            }
            t.step(record, result.as_ref().ok().map(|(_, usage)| usage));
        }
        let error = match &result {
            Err(DaemonError::Core(e)) => Some(e),
            // Neither served nor failed: nobody asked any more.
            Err(DaemonError::Cancelled) => {
                self.metrics.step_cancelled();
                return result;
            }
            _ => None,
        };
        self.metrics.step(started.elapsed(), error);
        self.quarantine_failing(error);
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn step_inner(
        &self,
        id: &str,
        input: StepInput,
        format: Format,
        since: Option<u64>,
        cancelled: &AtomicBool,
        out: &mut Pieces,
        mut traced: Option<(&Timeline<'_>, &mut StepRecord)>,
    ) -> Result<(u64, Usage)> {
        let gone = || {
            if cancelled.load(Ordering::Acquire) {
                Err(DaemonError::Cancelled)
            } else {
                Ok(())
            }
        };
        self.wait_ready(STEP_WAITS_FOR_LOADING)?;
        // K10: a following daemon none of whose published sets loads refuses, never plans on
        // an empty registry.
        self.check_serving()?;
        gone()?;
        let _held = self.locks.hold(id);
        let mut taken = self.session(id)?;
        // One snapshot of the registry and the plan for the whole step (H2).
        let registry = self.registry();
        let plan = self.agent_settings(&taken.get().agent)?;
        if let Some((_, record)) = &mut traced {
            record.agent = self
                .telemetry()
                .map_or_else(|| Arc::from(""), |t| t.shared(&plan.agent));
            request_settings(&plan.model, format, record);
        }
        let cached = taken.get();
        self.check_set(id, cached.state.provenance().and_then(|p| p.set))?;
        let auto = matches!(
            plan.cache_ttl,
            promptd_core::config::settings::TtlPolicy::Auto(_)
        );
        let agent_gaps = auto
            .then(|| crate::lock(&self.agent_gaps).get(&plan.agent).copied())
            .flatten();
        let openai = matches!(format, Format::Openai | Format::OpenaiResponses);
        let now = crate::now_ms();
        let key_shards = openai
            .then(|| crate::lock(&self.key_rates).shards(now, plan.key_rate))
            .flatten();
        let serving = step::Serving {
            run: &self.run,
            agent_gaps: agent_gaps.as_ref(),
            key_shards: key_shards.as_deref(),
            now_ms: Some(input.sent_at.unwrap_or(now)),
            observe: traced
                .as_ref()
                .map(|(t, _)| *t as &dyn promptd_core::observe::Observe),
        };
        let mut planned = step::plan(
            &mut cached.state,
            &registry,
            &plan,
            id,
            serving,
            input,
            format,
        )?;
        let events = planned.encode()?;
        // The last point before anything is recorded: plugin calls made for a client that went
        // away (they ran to their deadline) are dropped here.
        gone()?;
        let usage = planned.take_usage().unwrap_or_default();
        let n = planned.step;
        let held = planned.held().to_vec();
        if let Some((_, record)) = &mut traced {
            record.step = Some(n);
            record.header_reason = planned.header_reason.map(|r| r.as_str());
            record.held = held.clone();
            if let Some(t) = self.telemetry().filter(|t| t.captures_content()) {
                let _ = t;
                let input = planned.bodies.iter().filter_map(Body::as_message);
                record.content = Some(promptd_telemetry::StepContent {
                    system: None,
                    input_messages: promptd_telemetry::spans::messages_json(input),
                });
            }
        }
        let append_started = SystemTime::now();
        let appended = self.append(&mut taken, &events, planned.bodies);
        if let Some((timeline, _)) = &traced {
            let work = promptd_telemetry::Work::Append {
                events: events.len(),
                store: self.store_name(),
            };
            let failed = appended.as_ref().err().map(|e| e.to_string());
            timeline.push(work, append_started, failed);
        }
        appended?;
        // Written: the encoded events (a copy of each message) are not kept while the reply
        // is rendered (issue 32: a step's memory a small multiple of its body).
        drop(events);
        if !held.is_empty() || self.holding(id) {
            self.note_held(id, &held);
        }
        if let Some(key) = taken
            .get()
            .state
            .header()
            .and_then(|h| h.cache_key.as_deref())
        {
            if openai {
                crate::lock(&self.key_rates).count(step::key_base(key), now);
            }
        }
        if let Some(kept) = planned.prefix_kept {
            self.metrics.prefix(&plan.agent, kept);
        }
        if let Some((_, record)) = traced {
            self.step_facts(
                id,
                n,
                format,
                planned.prefix_kept,
                &plan,
                &taken.get().state,
                record,
            );
        }
        let state = &mut taken.get().state;
        match since {
            Some(since) => out.text_with(|out| state.render_parts_into(format, since, out))?,
            None => state.render_into(format, out)?,
        }
        Ok((n, usage))
    }

    /// Records the model's reply or a tool's output (Q5); returns the event's sequence number.
    pub fn record_message(&self, id: &str, message: &Message) -> Result<u64> {
        self.record_reply(id, message, None)
    }

    /// [`Daemon::record_message`], with the usage the provider reported for a reply (Q14).
    pub fn record_reply(
        &self,
        id: &str,
        message: &Message,
        usage: Option<&promptd_core::formats::replies::ProviderUsage>,
    ) -> Result<u64> {
        self.record_sent_reply(id, message, usage, None)
    }

    /// [`Daemon::record_reply`] of a reply to a request `sent` in a provider's format (the
    /// reply's shape says which) at a time (ms since the Unix epoch; default now): the
    /// cache outcome of that request is recorded with it (issue 29).
    pub fn record_sent_reply(
        &self,
        id: &str,
        message: &Message,
        usage: Option<&promptd_core::formats::replies::ProviderUsage>,
        sent: Option<(Format, Option<u64>)>,
    ) -> Result<u64> {
        self.record_traced(id, message, usage, sent, None, None)
    }

    /// [`Daemon::record_sent_reply`] for a client that sent its trace context (`parent`),
    /// with the reply as the provider sent it (`reply`: its model, id and stop reason go on
    /// the step's span, with telemetry on).
    pub fn record_traced(
        &self,
        id: &str,
        message: &Message,
        usage: Option<&promptd_core::formats::replies::ProviderUsage>,
        sent: Option<(Format, Option<u64>)>,
        parent: Option<promptd_telemetry::Parent>,
        reply: Option<promptd_telemetry::spans::ReplyMeta>,
    ) -> Result<u64> {
        let Some(telemetry) = self.telemetry().cloned() else {
            return self.record_inner(id, message, usage, sent, None);
        };
        let timeline = Timeline::new(&telemetry);
        let reply = reply.unwrap_or_default();
        let mut record = RecordRecord {
            session: Arc::from(id),
            role: match message {
                Message::Assistant { .. } => "assistant",
                Message::Tool { .. } => "tool",
                Message::User { .. } => "user",
            },
            start: Some(SystemTime::now()),
            usage: usage.copied(),
            response_model: reply.model,
            response_id: reply.id,
            finish_reasons: reply.finish_reasons,
            parent,
            ..RecordRecord::default()
        };
        let result = self.record_inner(id, message, usage, sent, Some((&timeline, &mut record)));
        record.end = Some(SystemTime::now());
        record.timeline = timeline.take();
        match &result {
            Ok(seq) => record.seq = Some(*seq),
            Err(e) => record.error = Some((e.code().to_string(), e.to_string())),
        }
        telemetry.record(record);
        result
    }

    fn record_inner(
        &self,
        id: &str,
        message: &Message,
        usage: Option<&promptd_core::formats::replies::ProviderUsage>,
        sent: Option<(Format, Option<u64>)>,
        mut traced: Option<(&Timeline<'_>, &mut RecordRecord)>,
    ) -> Result<u64> {
        if matches!(message, Message::User { .. }) {
            self.agent_of(id)?;
            return Err(Error::BadRequest(
                "user input is sent with a step (POST /v1/sessions/{id}/steps)".into(),
            )
            .into());
        }
        step::content_of(message).check(&self.config().content_limits())?;
        let _held = self.locks.hold(id);
        let mut taken = self.session(id)?;
        let plan = self.agent_settings(&taken.get().agent)?;
        if let Some((_, record)) = &mut traced {
            record.agent = self
                .telemetry()
                .map_or_else(|| Arc::from(""), |t| t.shared(&plan.agent));
            record.step = taken.get().state.steps();
        }
        let shown = &plan.tool_results;
        // Q18: the review hooks see what is recorded between steps too, in the same order.
        let registry = self.registry();
        let mut message = message.clone();
        // Calls that came without ids (Gemini may leave them out) are named by where they land.
        promptd_core::formats::replies::name_calls(&mut message, taken.get().state.last_seq() + 1);
        let observe = traced
            .as_ref()
            .map(|(t, _)| *t as &dyn promptd_core::observe::Observe);
        let mut message =
            step::review_recorded(&registry, &plan, &taken.get().state, message, observe)?;
        session::tool_result_shown(&mut message, shown.template.as_deref(), &shown.empty);
        taken.get().state.check_message(&message)?;
        let mut blocks = None;
        let body = match message {
            Message::Assistant { .. } => {
                let mut body = session::reply_event(message, usage.cloned());
                if let (Some(usage), Some((format, at))) = (usage, sent) {
                    let at = at.unwrap_or_else(crate::now_ms);
                    let config = self.config();
                    let store = &self.store;
                    // An outcome that cannot be said never costs the reply its record.
                    let outcome = taken
                        .get()
                        .state
                        .cache_outcome(
                            format,
                            at,
                            usage,
                            &config.cache,
                            &mut || Ok(store.events(id)?),
                        )
                        .unwrap_or_else(|e| {
                            tracing::warn!(session = id, error = %e, "no cache outcome for a reply");
                            None
                        });
                    if let (Some((o, b)), Body::AssistantMessage(r)) = (outcome, &mut body) {
                        r.cache = Some(o);
                        blocks = Some(b);
                    }
                }
                body
            }
            _ => session::message_event(message),
        };
        let event = step::encode(&body)?;
        let outcome = match &body {
            Body::AssistantMessage(r) => r.cache.clone(),
            _ => None,
        };
        if let Some((_, record)) = &mut traced {
            if self.telemetry().is_some_and(|t| t.captures_content()) {
                if let Some(m) = body.as_message() {
                    record.output_messages =
                        Some(promptd_telemetry::spans::messages_json(std::iter::once(m)));
                }
            }
            if let (Some(o), Some(usage)) = (&outcome, usage) {
                let config = self.config();
                let pricing = promptd_core::ledger::Pricing {
                    prices: &config.pricing,
                    rules: &config.cache,
                };
                record.cost = pricing.cost(usage, Some(o));
            }
            record.outcome = outcome.clone();
        }
        let append_started = SystemTime::now();
        let appended = self.append(&mut taken, &[event], vec![body]);
        if let Some((timeline, _)) = &traced {
            let work = promptd_telemetry::Work::Append {
                events: 1,
                store: self.store_name(),
            };
            let failed = appended.as_ref().err().map(|e| e.to_string());
            timeline.push(work, append_started, failed);
        }
        let seq = appended?;
        if let Some(blocks) = blocks {
            taken.get().state.remember_blocks(blocks);
        }
        if let Some(o) = outcome {
            let cached = taken.get();
            let (agent, hour) = (&cached.agent, cached.state.hour_ttl());
            self.metrics.cache_outcome(agent, &o);
            if let Some(input) = usage.and_then(|u| u.input_tokens) {
                let mut gaps = crate::lock(&self.agent_gaps);
                // Agents are the config's (a session's agent is checked when it is created).
                if gaps.len() < 1024 || gaps.contains_key(agent) {
                    gaps.entry(agent.clone())
                        .or_default()
                        .add_outcome(&o, input, hour);
                }
            }
        }
        Ok(seq)
    }

    /// Compacts the message events `from..=to` (seqs) into `summary` (Q14): later requests
    /// show the summary in their place; the events stay, and past steps rebuild unchanged.
    /// Returns the seq of the `history/compacted` event.
    pub fn compact(&self, id: &str, from: u64, to: u64, summary: &str) -> Result<u64> {
        let _held = self.locks.hold(id);
        let mut taken = self.session(id)?;
        let body = taken.get().state.compaction(from, to, summary)?;
        let event = step::encode(&body)?;
        self.append(&mut taken, &[event], vec![body])
    }

    /// Estimate against provider-reported usage, per step and in total (Q14), with each
    /// reply's cache outcome and cost by the config's `[pricing]` (issue 29).
    pub fn usage_report(&self, id: &str) -> Result<session::UsageReport> {
        let events = self.session_events(id)?;
        let config = self.config();
        let pricing = promptd_core::ledger::Pricing {
            prices: &config.pricing,
            rules: &config.cache,
        };
        Ok(session::priced_usage_report(id, &events, pricing, None)?)
    }

    /// The cost ledger across sessions (`GET /v1/usage`): of `agent`'s sessions (all when
    /// `None`) with activity at or after `since_ms`, the replies to requests sent since then;
    /// at most `limit` sessions, most recent first.
    pub fn usage_summary(
        &self,
        agent: Option<&str>,
        since_ms: Option<u64>,
        limit: usize,
    ) -> Result<promptd_core::ledger::Summary> {
        let config = self.config();
        let pricing = promptd_core::ledger::Pricing {
            prices: &config.pricing,
            rules: &config.cache,
        };
        let mut summary = promptd_core::ledger::Summary {
            since_ms,
            ..Default::default()
        };
        // The store filters by substring; the exact agent is checked here.
        let listed = self.store.sessions(agent.unwrap_or(""), limit)?;
        for s in listed {
            if agent.is_some_and(|a| a != s.agent) || since_ms.is_some_and(|t| s.last_ms < t) {
                continue;
            }
            let events = self.store.events(&s.id)?;
            let report = session::priced_usage_report(&s.id, &events, pricing, since_ms)?;
            summary.add_session(&s.agent, &report.ledger);
        }
        Ok(summary)
    }

    /// The session's log, in order.
    pub fn session_events(&self, id: &str) -> Result<Vec<Event>> {
        self.agent_of(id)?;
        Ok(self.store.events(id)?)
    }

    /// Sessions whose id or agent contains `filter`, most recent activity first.
    pub fn sessions(
        &self,
        filter: &str,
        limit: usize,
    ) -> Result<Vec<promptd_core::store::SessionSummary>> {
        Ok(self.store.sessions(filter, limit)?)
    }

    /// Step `n`'s request in `format` (as the step returned it) and who gave each part.
    pub fn explain(&self, id: &str, n: u64, format: Format) -> Result<Explained> {
        let events = self.session_events(id)?;
        let request = session::rebuild(id, &events, n)?;
        let provenance = session::provenance_at(id, &events, n)?;
        let (held, released) = session::held_at(id, &events, n)?;
        Ok(Explained {
            request: formats::render(&request, format),
            provenance,
            held,
            released,
        })
    }

    /// Whether session `id`'s last step held a change (K7).
    fn holding(&self, id: &str) -> bool {
        crate::lock(&self.held).contains_key(id)
    }

    /// Step `n` against the step before and the last one with the same header: the shared
    /// prefix, where it broke and why. Tokens are counted when the session's agent has a
    /// tokenizer other than `chars`.
    pub fn diff(&self, id: &str, n: u64, format: Format) -> Result<promptd_core::prefix::StepDiff> {
        let agent = self.agent_of(id)?;
        let events = self.store.events(id)?;
        let plan = self.agent_settings(&agent)?;
        let counter = plan.counts_tokens.then(|| plan.counter.clone());
        Ok(promptd_core::session::step_diff(
            id,
            &events,
            n,
            format,
            counter.as_deref(),
        )?)
    }

    /// The frozen request of step `n`, rebuilt from the log alone (Q4).
    pub fn request(&self, id: &str, n: u64) -> Result<FrozenRequest> {
        let events = self.session_events(id)?;
        Ok(session::rebuild(id, &events, n)?)
    }
}

/// Step `n`'s request and what explains it ([`Daemon::explain`]).
pub struct Explained {
    /// The request in the format asked for.
    pub request: serde_json::Value,
    /// Who gave each part.
    pub provenance: Option<Provenance>,
    /// What the step held (K7).
    pub held: Vec<promptd_core::held::Held>,
    /// What a header of the step applied of what was held.
    pub released: Option<promptd_core::held::Released>,
}

/// OpenAI requests of the last minute per cache key (without its shard).
#[derive(Default)]
pub(crate) struct KeyRates {
    recent: std::collections::HashMap<String, std::collections::VecDeque<u64>>,
}

impl KeyRates {
    const MINUTE_MS: u64 = 60_000;
    /// Keys counted at once; past it, keys idle for a minute are forgotten first.
    const MAX_KEYS: usize = 4096;
    /// Requests kept per key: enough to say 64 shards at OpenAI's documented rate.
    const MAX_PER_KEY: usize = 64 * 15;

    /// Counts a request with key `base` at `now_ms`.
    pub(crate) fn count(&mut self, base: &str, now_ms: u64) {
        if self.recent.len() >= Self::MAX_KEYS && !self.recent.contains_key(base) {
            self.recent
                .retain(|_, times| times.back().is_some_and(|t| t + Self::MINUTE_MS > now_ms));
            if self.recent.len() >= Self::MAX_KEYS {
                return; // every key busy: this one is not sharded
            }
        }
        let times = self.recent.entry(base.to_string()).or_default();
        times.push_back(now_ms);
        while times.len() > Self::MAX_PER_KEY
            || times.front().is_some_and(|t| t + Self::MINUTE_MS <= now_ms)
        {
            times.pop_front();
        }
    }

    /// The keys past `rate` requests a minute, each with the shards that keep every shard
    /// within it; `None` when there are none (or no rate).
    pub(crate) fn shards(
        &self,
        now_ms: u64,
        rate: u32,
    ) -> Option<std::sync::Arc<std::collections::BTreeMap<String, u32>>> {
        if rate == 0 {
            return None;
        }
        let busy: std::collections::BTreeMap<String, u32> = self
            .recent
            .iter()
            .filter_map(|(key, times)| {
                let n = times
                    .iter()
                    .filter(|t| **t + Self::MINUTE_MS > now_ms)
                    .count() as u32;
                (n > rate).then(|| (key.clone(), n.div_ceil(rate)))
            })
            .collect();
        (!busy.is_empty()).then(|| std::sync::Arc::new(busy))
    }
}

/// The request settings of `model` in `format` (its model, and what `gen_ai.request.*` names)
/// onto `record`.
fn request_settings(
    model: &serde_json::Map<String, serde_json::Value>,
    format: Format,
    record: &mut StepRecord,
) {
    use promptd_telemetry::spans::attr as kv;
    use promptd_telemetry::spans::semconv as a;
    let get = |key: &str| formats::setting(model, format, key);
    record.model = get("model").and_then(|v| v.as_str()).map(str::to_string);
    let max = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| get(k).and_then(|v| v.as_i64()));
    if let Some(max) = max {
        record
            .params
            .push(kv::int(a::GEN_AI_REQUEST_MAX_TOKENS, max));
    }
    for (key, name) in [
        ("temperature", a::GEN_AI_REQUEST_TEMPERATURE),
        ("top_p", a::GEN_AI_REQUEST_TOP_P),
        ("frequency_penalty", a::GEN_AI_REQUEST_FREQUENCY_PENALTY),
        ("presence_penalty", a::GEN_AI_REQUEST_PRESENCE_PENALTY),
    ] {
        if let Some(v) = get(key).and_then(|v| v.as_f64()) {
            record.params.push(kv::float(name, v));
        }
    }
    for (key, name) in [
        ("top_k", a::GEN_AI_REQUEST_TOP_K),
        ("seed", a::GEN_AI_REQUEST_SEED),
    ] {
        if let Some(v) = get(key).and_then(|v| v.as_i64()) {
            record.params.push(kv::int(name, v));
        }
    }
    let stop = get("stop_sequences").or_else(|| get("stop"));
    let stop: Vec<String> = match stop {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    if !stop.is_empty() {
        record
            .params
            .push(kv::strings(a::GEN_AI_REQUEST_STOP_SEQUENCES, stop));
    }
    if format == Format::Openai {
        if let Some(d) = get("dialect").and_then(|v| v.as_str()) {
            record.params.push(kv::string("promptd.dialect", d));
        }
    }
}

impl Daemon {
    /// `sqlite` or `postgresql`: the store appended to, as `db.system.name` says it.
    fn store_name(&self) -> &'static str {
        if self.store.is_shared() {
            "postgresql"
        } else {
            "sqlite"
        }
    }

    /// What a served step's span says that the plan does not: the header's cache key, TTL and
    /// system prompt hash, and why the prefix broke (the diff is rebuilt from the log, only
    /// for a step that broke it).
    #[allow(clippy::too_many_arguments)]
    fn step_facts(
        &self,
        id: &str,
        n: u64,
        format: Format,
        prefix_kept: Option<bool>,
        plan: &AgentSettings,
        state: &SessionState,
        record: &mut StepRecord,
    ) {
        if let Some(h) = state.header() {
            record.cache_key = h.cache_key.clone();
            record.cache_ttl = h
                .cache_ttl
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_string));
            let facts = self.header_facts(
                id,
                h,
                state.provenance(),
                plan.counter.as_ref(),
                record.header_reason.is_some(),
            );
            record.system = Some(facts.system.clone());
            record.tool_groups = facts.tool_groups.clone();
            if let Some(content) = &mut record.content {
                content.system = Some(h.system.clone());
            }
        }
        record.prefix = prefix_kept.map(|kept| {
            let mut facts = promptd_telemetry::PrefixFacts {
                kept,
                ..Default::default()
            };
            if kept {
                return facts;
            }
            let counter = plan.counts_tokens.then(|| plan.counter.clone());
            let diff = self.store.events(id).map_err(DaemonError::from).and_then(|events| {
                Ok(session::step_diff(id, &events, n, format, counter.as_deref())?)
            });
            match diff {
                Ok(d) => {
                    facts.bytes = Some(d.bytes);
                    if let Some(p) = &d.previous {
                        facts.shared_bytes = Some(p.shared_bytes);
                        facts.first_difference =
                            p.first_divergence.as_ref().map(|d| d.part.clone());
                    }
                    facts.causes = d.causes;
                }
                Err(e) => {
                    tracing::debug!(session = id, step = n, error = %e, "no prefix diff for the step's span");
                }
            }
            facts
        });
    }
}
