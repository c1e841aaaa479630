//! Steps and the session log: the daemon drives core's step pipeline
//! ([`promptd_core::step::plan`]) and records what it plans (Q1–Q6, Q14, Q18).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use promptd_core::budget::{self, Counter, Usage};
use promptd_core::config::{AgentSettings, Config};
use promptd_core::conversation::{FrozenRequest, Message};
use promptd_core::formats::{self, Format};
use promptd_core::provenance::Provenance;
use promptd_core::session::log::{Body, SessionCreated};
use promptd_core::session::{self, SessionState};
use promptd_core::step::{self, StepInput};
use promptd_core::store::{Event, NewEvent};
use promptd_core::Error;

use super::slot::SessionSlot;
use super::Cached;
use crate::observe::{Detail, PrefixFacts, StepFacts, Timeline, TraceContext, Work};
use crate::outcome::{
    GatewayStep, RecordOutcome, RecordRequest, StepOutcome, StepRequest, Timings,
};
use crate::{Daemon, DaemonError, Result, STEP_WAITS_FOR_LOADING};
use promptd_core::gateway::messages::{step_messages, Held};
use promptd_core::gateway::record::GatewayRecord;

/// Most agents whose settings are kept: agent names come from clients, so never let them grow
/// this (a cleared map is refilled one resolve per agent).
const MAX_AGENTS: usize = 1024;

/// The longest a gateway step waits for another daemon to record the reply it carries (G10):
/// a reply is recorded right after its answer, so this is the bound for a daemon that died
/// in between.
const FLEET_REPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often the wait reads the log again.
const FLEET_REPLY_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Agents' settings resolved for one config version.
#[derive(Default)]
pub(crate) struct ResolvedAgents {
    config: Option<Arc<Config>>,
    by_agent: HashMap<String, Arc<AgentSettings>>,
}

impl Daemon {
    /// Creates a session for `agent` (after checking its name): returns its id.
    pub fn create_session(&self, agent: &str) -> Result<String> {
        self.create_session_traced(agent, None)
    }

    /// [`Daemon::create_session`] for a client that sent its trace context (`trace`: the
    /// observers are told of it).
    pub fn create_session_traced(
        &self,
        agent: &str,
        trace: Option<&TraceContext>,
    ) -> Result<String> {
        let id = self.new_session(agent)?;
        self.observers.session_created(&id, agent, trace);
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
            .sessions
            .store
            .create_session(agent, promptd_core::step::encode(&created)?)?;
        // Its state is cached now, as the first step would rebuild it from the log: so a
        // session's first step reads nothing (1% of the steps at 100 steps a session spent
        // a millisecond more reading its log, BENCHMARKS.md issue 50's eighth stop).
        let mut state = SessionState::new(&id);
        state.apply_planned(1, vec![created])?;
        self.sessions.cache.put(
            &id,
            Box::new(Cached {
                agent: agent.to_string(),
                state,
                key: None,
            }),
        );
        Ok(id)
    }

    pub(crate) fn agent_of(&self, id: &str) -> Result<String> {
        self.sessions
            .store
            .session_agent(id)?
            .ok_or_else(|| Error::UnknownSession(id.to_string()).into())
    }

    /// Whose gateway session `id` is (G12): `Some(key)` for the gateway key its last
    /// `gateway/request` came with (`Some(None)`: none), `None` when it has no gateway request
    /// yet. From the session's cached state: no log read when it is cached.
    pub(crate) fn gateway_owner(&self, id: &str) -> Result<Option<Option<String>>> {
        let mut slot = self.checkout(id)?;
        let state = &slot.get().state;
        Ok(state
            .gateway_conversation()
            .map(|_| state.gateway_key().map(str::to_string)))
    }

    /// `agent`'s plan for the config serving now, resolved once per agent and config version.
    pub fn agent_settings(&self, agent: &str) -> Result<Arc<AgentSettings>> {
        let config = self.config();
        let mut plans = crate::lock(&self.sessions.agents);
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
        let mut counters = crate::lock(&self.sessions.counters);
        if let Some(counter) = counters.get(name) {
            return counter.clone();
        }
        let counter = promptd_tokenize::counter(name).unwrap_or_else(|| Arc::new(budget::Chars));
        counters.insert(name.to_string(), counter.clone());
        counter
    }

    /// Checks session `id` out: waits for its lock, then takes its cached state, or builds
    /// one from its log (once, for a cold session). The slot puts it back.
    fn checkout<'a>(&'a self, id: &'a str) -> Result<SessionSlot<'a>> {
        let lock = self.sessions.locks.hold(id);
        let cached = self.cached_state(id)?;
        Ok(SessionSlot::new(&self.sessions.cache, id, cached, lock))
    }

    /// [`Daemon::checkout`] when it can be had at once: session `id` free, its state in
    /// memory, and no other daemon appending to the store (which would mean reading the log).
    fn try_checkout<'a>(&'a self, id: &'a str) -> Option<SessionSlot<'a>> {
        if self.sessions.store.is_shared() {
            return None;
        }
        let lock = self.sessions.locks.try_hold(id)?;
        let cached = self.sessions.cache.take(id)?;
        Some(SessionSlot::new(&self.sessions.cache, id, cached, lock))
    }

    /// Session `id`'s cached state, caught up with the log; call with its lock held.
    fn cached_state(&self, id: &str) -> Result<Box<Cached>> {
        if let Some(mut cached) = self.sessions.cache.take(id) {
            if !self.sessions.store.is_shared() {
                return Ok(cached);
            }
            // Other daemons may have appended since (Q17): catch up before using the state,
            // so alternating daemons plan on the whole log instead of meeting a conflict.
            let missing = match self
                .sessions
                .store
                .events_after(id, cached.state.last_seq())
            {
                Ok(missing) => missing,
                Err(e) => {
                    self.sessions.cache.put(id, cached); // kept: nothing changed
                    return Err(e.into());
                }
            };
            if missing.is_empty() || cached.state.apply(&missing).is_ok() {
                return Ok(cached);
            }
            // The log no longer continues the state (e.g. restored from a backup): rebuild.
        }
        let agent = self.agent_of(id)?;
        let state = SessionState::from_log(id, &self.sessions.store.events(id)?)?;
        Ok(Box::new(Cached {
            agent,
            state,
            key: None,
        }))
    }

    /// Appends `bodies` (encoded as `events`) at the state's next seq and extends the state
    /// by them as they are. When another writer appended in the meantime the append is
    /// refused (`store_conflict`) and the stale state is dropped, so the next call rebuilds
    /// it from the log.
    fn append(
        &self,
        slot: &mut SessionSlot<'_>,
        events: Vec<NewEvent>,
        bodies: Vec<Body>,
    ) -> Result<u64> {
        let next = slot.get().state.last_seq() + 1;
        // The store takes the encoded events (a copy of each message) and drops them once
        // written: they are not kept while the state takes the bodies (issue 32: a step's
        // memory a small multiple of its body).
        let written = self.sessions.store.append(slot.id, next, events);
        Self::applied(slot, next, written, bodies)
    }

    /// [`Daemon::append`] without blocking: the store's writer writes the events while this
    /// waits (the runtime's thread free meanwhile). Dropped while it waits (the runtime shutting
    /// down), the events may still be written: the state is then dropped, not put back, and
    /// rebuilt from the log by the session's next use.
    async fn append_deferred(
        &self,
        slot: &mut SessionSlot<'_>,
        events: Vec<NewEvent>,
        bodies: Vec<Body>,
    ) -> Result<u64> {
        let next = slot.get().state.last_seq() + 1;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let then = Box::new(move |written| {
            let _ = tx.send(written);
        });
        self.sessions.store.append_then(slot.id, next, events, then);
        slot.mark_stale();
        let written = rx.await.unwrap_or_else(|_| {
            Err(promptd_core::store::StoreError::backend(
                "appending",
                "the store closed before the append was written",
            ))
        });
        slot.keep();
        Self::applied(slot, next, written, bodies)
    }

    /// The state extended by `bodies` at `next` once the store `written` them; a refused
    /// append or one the state cannot take drops the state (rebuilt from the log next time).
    fn applied(
        slot: &mut SessionSlot<'_>,
        next: u64,
        written: std::result::Result<(), promptd_core::store::StoreError>,
        bodies: Vec<Body>,
    ) -> Result<u64> {
        let applied = written
            .map_err(DaemonError::from)
            .and_then(|()| Ok(slot.get().state.apply_planned(next, bodies)?));
        if let Err(e) = applied {
            slot.mark_stale();
            return Err(e);
        }
        Ok(next)
    }

    /// Runs one step (Q1–Q3, Q6): assemble, plan, append in one transaction, and return what
    /// it did, with the request body in the request's format — the bytes a rebuild of the step
    /// from the log renders (Q4), spliced from the session's cached fragments. The one step
    /// boundary: every front door calls it, and the observers see its outcome.
    pub fn step(&self, request: StepRequest) -> Result<StepOutcome> {
        let StepRequest {
            session,
            input,
            format,
            since,
            out,
            cancelled,
            trace,
            gateway,
        } = request;
        let mut begun = self.begin_step(&session, format, out, trace);
        let run = StepRun {
            id: &session,
            since,
            cancelled: cancelled.as_deref(),
            detail: begun.detail,
            timeline: begun.timeline.as_ref(),
        };
        // A gateway step that may be forwarded without its plugins keeps what a second try
        // needs (its facts; its messages come from the client's body again).
        let again = gateway.as_ref().map(|_| StepInput {
            facts: input.facts.clone(),
            sent_at: input.sent_at,
            messages: Vec::new(),
            client_tools: input.client_tools.clone(),
        });
        let mut gateway = gateway;
        let outcome = &mut begun.outcome;
        let mut result = self.run_step(&run, input, &mut gateway, outcome);
        if let (Err(e), Some(g), Some(input)) = (&result, gateway.as_mut(), again) {
            if let Some(code) = super::gateway::forwards(e, g) {
                // G6: the plugins failed and the agent forwards; the failure counts towards
                // quarantine as any step's does, and the step is recorded without them.
                if let DaemonError::Core(e) = e {
                    self.quarantine_failing(Some(e));
                }
                tracing::warn!(session = %session, code, "gateway: the step failed; forwarding the client's body as it came: {e}");
                g.degraded = Some(code);
                result = self.run_step(&run, input, &mut gateway, outcome);
            }
        }
        self.end_step(begun, result)
    }

    /// [`Daemon::step`] on the async runtime's thread, for a step that is short and bounded:
    /// its session's state is in memory and free, and its assembly is served from the memo
    /// and the session's kept answers (no plugin call, no review hook). Its append is handed
    /// to the store's writer, and this waits for it without holding the thread (so concurrent
    /// steps share a sync with no thread switch each). Any other step is given back, as it
    /// came, for [`Daemon::step`] on a thread that may block: a store that does not defer
    /// its appends, a daemon still loading, a gateway step, a session busy, not cached or on
    /// a shared store, or an assembly that would call a plugin. Run it as a task of its own
    /// (the HTTP route does): a future dropped between its append and its state's update
    /// would let the session's next step meet a conflict (Q22).
    pub async fn step_inline(
        &self,
        request: StepRequest,
    ) -> std::result::Result<Result<StepOutcome>, StepRequest> {
        let store = &self.sessions.store;
        let possible = request.gateway.is_none()
            && store.defers()
            && self.ready_now()
            && self.check_serving().is_ok();
        if !possible {
            return Err(request);
        }
        let StepRequest {
            session,
            input,
            format,
            since,
            out,
            cancelled,
            trace,
            gateway: _,
        } = request;
        let back = |session, input, out, trace| StepRequest {
            session,
            input,
            format,
            since,
            out,
            cancelled: cancelled.clone(),
            trace,
            gateway: None,
        };
        let Some(slot) = self.try_checkout(&session) else {
            return Err(back(session, input, out, trace));
        };
        let mut begun = self.begin_step(&session, format, out, trace);
        let run = StepRun {
            id: &session,
            since,
            cancelled: None,
            detail: begun.detail,
            timeline: begun.timeline.as_ref(),
        };
        let planned = self.prepare_inline(&run, slot, input, &mut begun.outcome);
        let prepared = match planned {
            Ok(Ok(prepared)) => prepared,
            Ok(Err(input)) => {
                // (The slot borrowed `session` for the plan: a copy goes back.)
                let (out, trace) = (begun.outcome.body, begun.outcome.trace);
                return Err(back(session.clone(), input, out, trace));
            }
            Err(e) => return Ok(self.end_step(begun, Err(e))),
        };
        let result = self.finish_inline(&run, prepared, &mut begun.outcome).await;
        Ok(self.end_step(begun, result))
    }

    /// The inline step's plan ([`Daemon::step_inline`]): its input back when a plugin would
    /// be called.
    fn prepare_inline<'a>(
        &self,
        run: &StepRun<'_>,
        mut slot: SessionSlot<'a>,
        input: StepInput,
        outcome: &mut StepOutcome,
    ) -> Result<std::result::Result<Prepared<'a>, StepInput>> {
        let (id, format) = (run.id, outcome.format);
        let registry = self.registry();
        let plan = self.agent_settings(&slot.get().agent)?;
        outcome.plan = Some(plan.clone());
        let cached = slot.get();
        self.check_set(id, cached.state.provenance().and_then(|p| p.set))?;
        let across = self.across(&plan, format);
        let serving = across.serving(&self.sessions.run, input.sent_at, run.timeline);
        let (openai, now) = (across.openai, across.now);
        let planned = step::plan_without_calls(
            &mut cached.state,
            &registry,
            &plan,
            id,
            serving,
            input,
            format,
        )?;
        let mut planned = match planned {
            Ok(planned) => planned,
            Err(input) => return Ok(Err(input)),
        };
        let events = planned.encode()?;
        self.took_plan(run, &mut planned, outcome);
        Ok(Ok(Prepared {
            slot,
            plan,
            openai,
            now,
            events,
            bodies: planned.bodies,
            prefix_kept: planned.prefix_kept,
        }))
    }

    /// The inline step's append, awaited, and what follows it.
    async fn finish_inline(
        &self,
        run: &StepRun<'_>,
        prepared: Prepared<'_>,
        outcome: &mut StepOutcome,
    ) -> Result<()> {
        let Prepared {
            mut slot,
            plan,
            openai,
            now,
            events,
            bodies,
            prefix_kept,
        } = prepared;
        outcome.appended = events.len();
        let (started, clock) = (SystemTime::now(), Instant::now());
        let appended = self.append_deferred(&mut slot, events, bodies).await;
        outcome.append = timed(run.timeline, outcome.appended, started, clock, appended)?;
        self.after_append(
            run,
            &mut slot,
            outcome,
            &plan,
            openai,
            now,
            prefix_kept,
            None,
        )
    }

    /// What every step does before it runs: whether it is traced (its timeline kept) and its
    /// outcome so far.
    fn begin_step(
        &self,
        session: &Arc<str>,
        format: Format,
        out: formats::pieces::Pieces,
        trace: Option<TraceContext>,
    ) -> Begun {
        let started = Instant::now();
        let detail = self.observers.step_detail(session, trace.as_ref());
        let timeline = detail.traced.then(Timeline::new);
        let outcome = StepOutcome {
            session: session.clone(),
            trace,
            format,
            plan: None,
            step: 0,
            appended: 0,
            body: out,
            usage: Usage::default(),
            header_reason: None,
            held: Vec::new(),
            reused: Vec::new(),
            prefix_kept: None,
            facts: None,
            content: None,
            timings: Timings::started(),
            gateway: None,
            append: std::time::Duration::ZERO,
        };
        Begun {
            started,
            detail,
            timeline,
            outcome,
        }
    }

    /// What every step does once it ran: its timings, the observers told, the quarantine
    /// counted.
    fn end_step(&self, begun: Begun, result: Result<()>) -> Result<StepOutcome> {
        let Begun {
            started,
            timeline,
            mut outcome,
            ..
        } = begun;
        outcome.timings.end = SystemTime::now();
        outcome.timings.elapsed = started.elapsed();
        if let Some(timeline) = timeline {
            outcome.timings.stages = timeline.take();
        }
        self.observers.step(&outcome, result.as_ref().err());
        match &result {
            // Neither served nor failed: nobody asked any more.
            Err(DaemonError::Cancelled) => {}
            // A plugin past its consecutive failures is quarantined, whether or not the step
            // was served (a failing optional plugin does not fail it).
            Err(DaemonError::Core(e)) => self.quarantine_failing(Some(e)),
            _ => self.quarantine_failing(None),
        }
        result.map(|()| outcome)
    }

    /// G10: on a store other daemons share, a gateway request that carries back the reply to
    /// the session's last request, answered by another daemon and not recorded yet, waits
    /// (at most [`FLEET_REPLY_WAIT`], the session's lock let go meanwhile) until the log holds
    /// it, so the log never holds a step before the reply it follows. A daemon that died
    /// between answering and recording never records it: the step then goes on without it
    /// (the client's body, recorded whole, still holds it).
    fn await_reply<'a>(
        &'a self,
        id: &'a str,
        mut slot: SessionSlot<'a>,
        conversation: &promptd_core::gateway::messages::Conversation,
        gone: &dyn Fn() -> Result<()>,
    ) -> Result<SessionSlot<'a>> {
        if !self.sessions.store.is_shared() {
            return Ok(slot);
        }
        let started = Instant::now();
        loop {
            let state = &slot.get().state;
            let awaits = promptd_core::gateway::messages::awaits_reply(
                state.gateway_conversation(),
                state.gateway_replied(),
                conversation,
            );
            if !awaits || started.elapsed() >= FLEET_REPLY_WAIT {
                return Ok(slot);
            }
            drop(slot);
            std::thread::sleep(FLEET_REPLY_POLL);
            gone()?;
            slot = self.checkout(id)?;
        }
    }

    fn run_step(
        &self,
        run: &StepRun<'_>,
        mut input: StepInput,
        gateway: &mut Option<Box<GatewayStep>>,
        outcome: &mut StepOutcome,
    ) -> Result<()> {
        let gone = || match run.cancelled {
            Some(c) if c.load(Ordering::Acquire) => Err(DaemonError::Cancelled),
            _ => Ok(()),
        };
        let (id, format) = (run.id, outcome.format);
        // G6: a gateway step forwarded without its plugins plans on none.
        let degraded = gateway.as_ref().is_some_and(|g| g.degraded.is_some());
        if !degraded {
            self.wait_ready(STEP_WAITS_FOR_LOADING)?;
            // K10: a following daemon none of whose published sets loads refuses, never plans
            // on an empty registry.
            self.check_serving()?;
        }
        gone()?;
        let mut slot = self.checkout(id)?;
        if let Some(g) = gateway.as_ref() {
            slot = self.await_reply(id, slot, &g.conversation, &gone)?;
        }
        // One snapshot of the registry and the plan for the whole step (H2).
        let registry = match degraded {
            true => Arc::new(promptd_core::plugin::registry::Registry::default()),
            false => self.registry(),
        };
        let plan = self.agent_settings(&slot.get().agent)?;
        outcome.plan = Some(plan.clone());
        let cached = slot.get();
        if !degraded {
            self.check_set(id, cached.state.provenance().and_then(|p| p.set))?;
        }
        // G3: a gateway step's messages are its conversation's new ones.
        let joined = gateway.as_ref().map(|g| {
            let state = &cached.state;
            let held = Held {
                last: state.gateway_conversation(),
                call_open: &|id| state.call_open(id),
                reply_seq: state.last_reply_seq(),
            };
            let joined = step_messages(&held, &g.conversation);
            input.messages.clone_from(&joined.messages);
            joined
        });
        let across = self.across(&plan, format);
        let serving = across.serving(&self.sessions.run, input.sent_at, run.timeline);
        let (openai, now) = (across.openai, across.now);
        let mut planned = step::plan(
            &mut cached.state,
            &registry,
            &plan,
            id,
            serving,
            input,
            format,
        )?;
        let mut events = planned.encode()?;
        // The last point before anything is recorded: plugin calls made for a client that went
        // away (they ran to their deadline) are dropped here.
        gone()?;
        self.took_plan(run, &mut planned, outcome);
        let mut bodies = planned.bodies;
        // G4: the gateway's request is appended with the step, in the same transaction.
        let spliced = match (gateway.take(), &joined) {
            (Some(gateway), Some(joined)) => {
                let state = &slot.get().state;
                let step = super::gateway::Step {
                    state,
                    bodies: &bodies,
                    agent: &plan.agent,
                    joined,
                    redactions: &planned.redactions,
                    runnable: &|name| self.tool_runner(name).is_some(),
                };
                let (upstream, record, body) = super::gateway::splice(&step, *gateway)?;
                events.push(step::encode(&body)?);
                bodies.push(body);
                Some((upstream, record))
            }
            _ => None,
        };
        outcome.appended = events.len();
        let (started, clock) = (SystemTime::now(), Instant::now());
        let appended = self.append(&mut slot, events, bodies);
        outcome.append = timed(run.timeline, outcome.appended, started, clock, appended)?;
        let prefix_kept = planned.prefix_kept;
        self.after_append(
            run,
            &mut slot,
            outcome,
            &plan,
            openai,
            now,
            prefix_kept,
            spliced,
        )
    }

    /// A planned step's outcome so far: its number, usage, header reason, held changes, and
    /// (for observers that ask) what it reused and its new messages.
    fn took_plan(
        &self,
        run: &StepRun<'_>,
        planned: &mut step::PlannedStep,
        outcome: &mut StepOutcome,
    ) {
        outcome.usage = planned.take_usage().unwrap_or_default();
        outcome.step = planned.step;
        outcome.header_reason = planned.header_reason.map(|r| r.as_str());
        outcome.held = planned.held().to_vec();
        if run.detail.traced {
            // Only a traced step's observers read them (a copy per item otherwise).
            outcome.reused = planned.reused().iter().map(|r| r.to_string()).collect();
        }
        if run.detail.content {
            let input = planned.bodies.iter().filter_map(Body::as_message);
            outcome.content = Some(input.cloned().collect());
        }
    }

    /// What follows a step's append: its held changes and key rate counted, its facts for
    /// the observers, and its body rendered (or the gateway's spliced upstream body).
    #[allow(clippy::too_many_arguments)]
    fn after_append(
        &self,
        run: &StepRun<'_>,
        slot: &mut SessionSlot<'_>,
        outcome: &mut StepOutcome,
        plan: &AgentSettings,
        openai: bool,
        now: u64,
        prefix_kept: Option<bool>,
        spliced: Option<(String, GatewayRecord)>,
    ) -> Result<()> {
        let id = run.id;
        if !outcome.held.is_empty() || self.holding(id) {
            self.note_held(id, &outcome.held);
        }
        if let Some(key) = slot
            .get()
            .state
            .header()
            .and_then(|h| h.cache_key.as_deref())
        {
            if openai {
                crate::lock(&self.cache.key_rates).count(step::key_base(key), now);
            }
        }
        outcome.prefix_kept = prefix_kept;
        if run.detail.traced {
            let facts = self.step_facts(run, outcome.step, outcome, plan, &slot.get().state);
            outcome.facts = Some(facts);
        }
        if let Some((upstream, record)) = spliced {
            outcome.body.text_with(|out| out.push_str(&upstream));
            outcome.gateway = Some(Box::new(record));
            return Ok(());
        }
        let state = &mut slot.get().state;
        let out = &mut outcome.body;
        match run.since {
            Some(since) => {
                out.text_with(|out| state.render_parts_into(outcome.format, since, out))?
            }
            None => state.render_into(outcome.format, out)?,
        }
        Ok(())
    }

    /// What a step of `plan`'s agent in `format` is planned with across sessions.
    fn across(&self, plan: &AgentSettings, format: Format) -> Across {
        let openai = matches!(format, Format::Openai | Format::OpenaiResponses);
        let now = crate::now_ms();
        let (agent_gaps, key_shards) = self.cache_counts(plan, openai, now);
        Across {
            openai,
            now,
            agent_gaps,
            key_shards,
        }
    }

    /// What the cache policies count across sessions for a step of `plan`'s agent: its idle
    /// gaps (`ttl = "auto"`) and, for the OpenAI formats, the keys past the per-key rate.
    fn cache_counts(
        &self,
        plan: &AgentSettings,
        openai: bool,
        now: u64,
    ) -> (
        Option<promptd_core::cache::ttl::Gaps>,
        Option<Arc<std::collections::BTreeMap<String, u32>>>,
    ) {
        let auto = matches!(
            plan.cache_ttl,
            promptd_core::config::settings::TtlPolicy::Auto(_)
        );
        let agent_gaps = auto
            .then(|| {
                crate::lock(&self.cache.agent_gaps)
                    .get(&plan.agent)
                    .copied()
            })
            .flatten();
        let key_shards = openai
            .then(|| crate::lock(&self.cache.key_rates).shards(now, plan.key_rate))
            .flatten();
        (agent_gaps, key_shards)
    }

    /// [`Daemon::append`], timed, and told to the step's timeline; returns how long it took.
    /// Records the model's reply or a tool's output (Q5), with what came with it (the
    /// provider's usage, the format and time its request was sent: the cache outcome of that
    /// request is recorded with it, issue 29). The one record boundary: every front door
    /// calls it, and the observers see its outcome.
    pub fn record(&self, request: RecordRequest) -> Result<RecordOutcome> {
        let started = Instant::now();
        let RecordRequest {
            session,
            message,
            usage,
            sent,
            reply,
            trace,
            partial,
        } = request;
        let detail = self.observers.record_detail(&session, trace.as_ref());
        let timeline = detail.traced.then(Timeline::new);
        let mut outcome = RecordOutcome {
            session: Arc::from(session.as_str()),
            trace,
            plan: None,
            step: 0,
            seq: 0,
            role: match message {
                Message::Assistant { .. } => "assistant",
                Message::Tool { .. } => "tool",
                Message::User { .. } => "user",
            },
            usage,
            cache: None,
            cost: None,
            reply,
            tool_calls: Vec::new(),
            content: None,
            timings: Timings::started(),
        };
        let run = RecordRun {
            id: &session,
            sent,
            partial,
            detail,
            timeline: timeline.as_ref(),
        };
        let result = self.run_record(&run, message, &mut outcome);
        outcome.timings.end = SystemTime::now();
        outcome.timings.elapsed = started.elapsed();
        if let Some(timeline) = timeline {
            outcome.timings.stages = timeline.take();
        }
        self.observers.record(&outcome, result.as_ref().err());
        result.map(|()| outcome)
    }

    fn run_record(
        &self,
        run: &RecordRun<'_>,
        message: Message,
        outcome: &mut RecordOutcome,
    ) -> Result<()> {
        let id = run.id;
        if matches!(message, Message::User { .. }) {
            self.agent_of(id)?;
            return Err(Error::BadRequest(
                "user input is sent with a step (POST /v1/sessions/{id}/steps)".into(),
            )
            .into());
        }
        step::content_of(&message).check(&self.config().content_limits())?;
        // The calls as the client will be told them (named below, by the seq).
        let mut calls =
            matches!(&message, Message::Assistant { tool_calls, .. } if !tool_calls.is_empty())
                .then(|| message.clone());
        let mut slot = self.checkout(id)?;
        let plan = self.agent_settings(&slot.get().agent)?;
        outcome.plan = Some(plan.clone());
        outcome.step = slot.get().state.steps();
        let shown = &plan.tool_results;
        // Q18: the review hooks see what is recorded between steps too, in the same order.
        let registry = self.registry();
        let mut message = message;
        // Calls that came without ids (Gemini may leave them out) are named by where they land.
        promptd_core::formats::replies::name_calls(&mut message, slot.get().state.last_seq() + 1);
        let observe = run
            .timeline
            .map(|t| t as &dyn promptd_core::observe::Observe);
        let mut message =
            step::review_recorded(&registry, &plan, &slot.get().state, message, observe)?;
        session::tool_result_shown(&mut message, shown.template.as_deref(), &shown.empty);
        // A partial reply (G5) is recorded with its reason even when nothing of it came.
        let empty = matches!(&message, Message::Assistant { content, tool_calls, .. }
            if content.trim().is_empty() && tool_calls.is_empty());
        if !(run.partial.is_some() && empty) {
            slot.get().state.check_message(&message)?;
        }
        let (mut body, blocks) =
            self.reply_body(&mut slot, message, outcome.usage.as_ref(), run.sent);
        if let Body::AssistantMessage(recorded) = &mut body {
            recorded.partial.clone_from(&run.partial);
        }
        let event = step::encode(&body)?;
        outcome.cache = match &body {
            Body::AssistantMessage(r) => r.cache.clone(),
            _ => None,
        };
        if run.detail.content {
            outcome.content = body.as_message().cloned();
        }
        if run.detail.traced {
            if let (Some(o), Some(usage)) = (&outcome.cache, &outcome.usage) {
                let config = self.config();
                let pricing = promptd_core::ledger::Pricing {
                    prices: &config.pricing,
                    rules: &config.cache,
                };
                outcome.cost = pricing.cost(usage, Some(o));
            }
        }
        let append_started = SystemTime::now();
        let appended = self.append(&mut slot, vec![event], vec![body]);
        if let Some(timeline) = run.timeline {
            let failed = appended.as_ref().err().map(|e| e.to_string());
            timeline.push(Work::Append { events: 1 }, append_started, failed);
        }
        let seq = appended?;
        outcome.seq = seq;
        if let Some(blocks) = blocks {
            slot.get().state.remember_blocks(blocks);
        }
        if let (Some(o), Some(input)) = (
            &outcome.cache,
            outcome.usage.as_ref().and_then(|u| u.input_tokens),
        ) {
            let cached = slot.get();
            let (agent, hour) = (&cached.agent, cached.state.hour_ttl());
            let mut gaps = crate::lock(&self.cache.agent_gaps);
            // Agents are the config's (a session's agent is checked when it is created).
            if gaps.len() < 1024 || gaps.contains_key(agent) {
                gaps.entry(agent.clone())
                    .or_default()
                    .add_outcome(o, input, hour);
            }
        }
        if let Some(calls) = &mut calls {
            // The daemon named calls that came without ids by the seq: the same names, for the
            // client.
            promptd_core::formats::replies::name_calls(calls, seq);
            if let Message::Assistant { tool_calls, .. } = calls {
                outcome.tool_calls = std::mem::take(tool_calls);
            }
        }
        Ok(())
    }

    /// The event recording `message`: a reply with its usage and, when its request's format
    /// and time are known, that request's cache outcome (and the blocks it leaves cached).
    fn reply_body(
        &self,
        slot: &mut SessionSlot<'_>,
        message: Message,
        usage: Option<&promptd_core::formats::replies::ProviderUsage>,
        sent: Option<(Format, Option<u64>)>,
    ) -> (Body, Option<Arc<[promptd_core::cache::Block]>>) {
        let Message::Assistant { .. } = message else {
            return (session::message_event(message), None);
        };
        let id = slot.id;
        let mut body = session::reply_event(message, usage.cloned());
        let mut blocks = None;
        if let (Some(usage), Some((format, at))) = (usage, sent) {
            let at = at.unwrap_or_else(crate::now_ms);
            let config = self.config();
            let store = &self.sessions.store;
            // An outcome that cannot be said never costs the reply its record.
            let outcome = slot
                .get()
                .state
                .cache_outcome(format, at, usage, &config.cache, &mut || {
                    Ok(store.events(id)?)
                })
                .unwrap_or_else(|e| {
                    tracing::warn!(session = id, error = %e, "no cache outcome for a reply");
                    None
                });
            if let (Some((o, b)), Body::AssistantMessage(r)) = (outcome, &mut body) {
                r.cache = Some(o);
                blocks = Some(b);
            }
        }
        (body, blocks)
    }
    /// Compacts the message events `from..=to` (seqs) into `summary` (Q14): later requests
    /// show the summary in their place; the events stay, and past steps rebuild unchanged.
    /// Returns the seq of the `history/compacted` event.
    pub fn compact(&self, id: &str, from: u64, to: u64, summary: &str) -> Result<u64> {
        let mut slot = self.checkout(id)?;
        let body = slot.get().state.compaction(from, to, summary)?;
        let event = step::encode(&body)?;
        self.append(&mut slot, vec![event], vec![body])
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
    /// `None`) with activity since the query's `since` and window start, the replies the query
    /// counts, in total, per agent, per key, per UTC day of its window, and its top sessions;
    /// at most `limit` sessions are read, most recent first (each one's log, in full).
    pub fn usage_summary(
        &self,
        agent: Option<&str>,
        query: promptd_core::usage::Query,
        limit: usize,
    ) -> Result<promptd_core::usage::Report> {
        let config = self.config();
        let pricing = promptd_core::ledger::Pricing {
            prices: &config.pricing,
            rules: &config.cache,
        };
        // A session last active before both bounds holds no reply they count.
        let active_since = query
            .since_ms
            .into_iter()
            .chain(query.window.map(|w| w.from.start_ms()))
            .max();
        let mut usage = promptd_core::usage::Usage::new(query);
        // The store filters by substring; the exact agent is checked here.
        let listed = self.sessions.store.sessions(agent.unwrap_or(""), limit)?;
        for s in listed {
            if agent.is_some_and(|a| a != s.agent) || active_since.is_some_and(|t| s.last_ms < t) {
                continue;
            }
            let events = self.sessions.store.events(&s.id)?;
            let replies = session::priced_replies(&s.id, &events, pricing)?;
            usage.add_session(&s.id, &s.agent, &replies);
        }
        Ok(usage.finish())
    }

    /// The session's log, in order.
    pub fn session_events(&self, id: &str) -> Result<Vec<Event>> {
        self.agent_of(id)?;
        Ok(self.sessions.store.events(id)?)
    }

    /// Whether other daemons may append to the sessions this one serves (a shared store).
    pub(crate) fn store_shared(&self) -> bool {
        self.sessions.store.is_shared()
    }

    /// Sessions with activity at or after `since_ms`, most recent first (G10).
    pub(crate) fn active_since(
        &self,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<promptd_core::store::SessionSummary>> {
        Ok(self.sessions.store.active_since(since_ms, limit)?)
    }

    /// Session `id`'s events after `seq`.
    pub(crate) fn events_after(&self, id: &str, seq: u64) -> Result<Vec<Event>> {
        Ok(self.sessions.store.events_after(id, seq)?)
    }

    /// Sessions whose id or agent contains `filter`, most recent activity first.
    pub fn sessions(
        &self,
        filter: &str,
        limit: usize,
    ) -> Result<Vec<promptd_core::store::SessionSummary>> {
        Ok(self.sessions.store.sessions(filter, limit)?)
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
        crate::lock(&self.cache.held).contains_key(id)
    }

    /// Step `n` against the step before and the last one with the same header: the shared
    /// prefix, where it broke and why. Tokens are counted when the session's agent has a
    /// tokenizer other than `chars`.
    pub fn diff(&self, id: &str, n: u64, format: Format) -> Result<promptd_core::prefix::StepDiff> {
        let agent = self.agent_of(id)?;
        let events = self.sessions.store.events(id)?;
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

    /// Step `n`'s gateway request (G4), rebuilt from the log: the client's body and what was
    /// spliced in; its [`GatewayRecord::upstream_body`] is the bytes that went upstream.
    /// `None` for a step that did not come through the gateway.
    pub fn gateway_request(&self, id: &str, n: u64) -> Result<Option<GatewayRecord>> {
        let events = self.session_events(id)?;
        let mut step = 0;
        for event in &events {
            match event.kind {
                promptd_core::store::EventKind::Step => step += 1,
                promptd_core::store::EventKind::GatewayRequest if step == n => {
                    let body = Body::decode(event.kind, event.version, &event.body).map_err(
                        |problem| promptd_core::store::StoreError::Corrupt {
                            session: id.to_string(),
                            seq: event.seq,
                            problem,
                        },
                    )?;
                    if let Body::GatewayRequest(record) = body {
                        return Ok(Some(*record));
                    }
                }
                _ => {}
            }
            if step > n {
                break;
            }
        }
        if step < n || n == 0 {
            return Err(Error::UnknownStep {
                session: id.to_string(),
                step: n,
                steps: step,
            }
            .into());
        }
        Ok(None)
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

/// What one step runs with, besides its session's state.
struct StepRun<'a> {
    id: &'a str,
    since: Option<u64>,
    cancelled: Option<&'a AtomicBool>,
    detail: Detail,
    timeline: Option<&'a Timeline>,
}

/// What a step is planned with across sessions ([`Daemon::across`]): whether its format is
/// OpenAI's, now, and the cache policies' counts.
struct Across {
    openai: bool,
    now: u64,
    agent_gaps: Option<promptd_core::cache::ttl::Gaps>,
    key_shards: Option<Arc<std::collections::BTreeMap<String, u32>>>,
}

impl Across {
    /// The plan's [`step::Serving`]: `run` the daemon's, `sent_at` the client's time of the
    /// request (now if it gave none), and `timeline` told of each stage when traced.
    fn serving<'a>(
        &'a self,
        run: &'a str,
        sent_at: Option<u64>,
        timeline: Option<&'a Timeline>,
    ) -> step::Serving<'a> {
        step::Serving {
            run,
            agent_gaps: self.agent_gaps.as_ref(),
            key_shards: self.key_shards.as_deref(),
            now_ms: Some(sent_at.unwrap_or(self.now)),
            observe: timeline.map(|t| t as &dyn promptd_core::observe::Observe),
        }
    }
}

/// A step's outcome while it runs: what [`Daemon::end_step`] finishes.
struct Begun {
    started: Instant,
    detail: Detail,
    timeline: Option<Timeline>,
    outcome: StepOutcome,
}

/// An inline step planned ([`Daemon::step_inline`]): what its append and what follows need.
struct Prepared<'a> {
    slot: SessionSlot<'a>,
    plan: Arc<AgentSettings>,
    openai: bool,
    now: u64,
    events: Vec<NewEvent>,
    bodies: Vec<Body>,
    prefix_kept: Option<bool>,
}

/// An append's time, told to the timeline (a traced step's) with its event count and any
/// failure.
fn timed<T>(
    timeline: Option<&Timeline>,
    events: usize,
    started: SystemTime,
    clock: Instant,
    appended: Result<T>,
) -> Result<std::time::Duration> {
    let took = clock.elapsed();
    if let Some(timeline) = timeline {
        let failed = appended.as_ref().err().map(|e| e.to_string());
        timeline.push(Work::Append { events }, started, failed);
    }
    appended.map(|_| took)
}

/// What one record runs with.
struct RecordRun<'a> {
    id: &'a str,
    sent: Option<(Format, Option<u64>)>,
    partial: Option<String>,
    detail: Detail,
    timeline: Option<&'a Timeline>,
}

impl Daemon {
    /// What a traced step says that the plan does not: the header's cache key, TTL and
    /// system prompt hash, and why the prefix broke (the diff is rebuilt from the log, only
    /// for a step that broke it).
    fn step_facts(
        &self,
        run: &StepRun<'_>,
        n: u64,
        outcome: &StepOutcome,
        plan: &AgentSettings,
        state: &SessionState,
    ) -> StepFacts {
        let id = run.id;
        let mut facts = StepFacts::default();
        if let Some(h) = state.header() {
            facts.cache_key = h.cache_key.clone();
            facts.cache_ttl = h
                .cache_ttl
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.as_str().map(str::to_string));
            facts.header = Some(self.observers.header_facts.get(
                id,
                h,
                state.provenance(),
                plan.counter.as_ref(),
                outcome.header_reason.is_some(),
            ));
            if run.detail.content {
                facts.system = Some(h.system.clone());
            }
        }
        facts.prefix = outcome.prefix_kept.map(|kept| {
            let mut facts = PrefixFacts {
                kept,
                ..Default::default()
            };
            if kept {
                return facts;
            }
            let counter = plan.counts_tokens.then(|| plan.counter.clone());
            let format = outcome.format;
            let diff = self.sessions.store.events(id).map_err(DaemonError::from).and_then(|events| {
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
        facts
    }
}
