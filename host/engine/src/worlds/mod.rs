//! The plugin worlds the host serves (SPEC W1, W2), one module per world version, and what
//! they share: the [`World`] trait each implements, the [`Calls`] a provider gives them, and
//! the conversions between their types and the core's plain data.
//!
//! `promptd:plugin@0.1.0` (wit/0.1.0, [`v0_1`]) and `promptd:plugin@0.2.0` (wit/0.2.0,
//! [`v0_2`]) are published and frozen: their components are adapted (0.1.0: per-item calls, no
//! verbatim, no review; both: no `reads`, so every call sees the whole step) and keep giving
//! the bytes they always gave. `promptd:plugin@0.3.0` (wit/, [`v0_3`]) is what the SDKs build.
//! Which world a component implements is read from its exports (only 0.1.0 exports
//! `section-text`) and, between 0.2.0 and 0.3.0, from the version of the types it imports. A
//! new world is a new module implementing [`World`], named in [`dispatch`] and
//! [`add_to_linker`].

use std::sync::Mutex;

use promptd_core::plugin::model::{Declaration, Scope, Step};
use promptd_core::plugin::provider::{CallResult, Evaluation, Provider};
use promptd_core::plugin::provider::{ReviewInput, Verdict, Wanted};
use promptd_core::sync::lock;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Engine, Store};

use crate::state::State;

/// One plugin world: how its components are instantiated, declared and called. Each method
/// of the core's [`Provider`] that a world answers in its own way is here, given the
/// provider's [`Calls`].
pub(crate) trait World: Sized + 'static {
    /// A component ready to instantiate in this world (bindgen's `PluginPre`).
    type Pre: Send + Sync + 'static;
    /// An instance's exports (bindgen's `Plugin`).
    type Exports: Send + 'static;
    /// What a provider keeps between calls, to lower the next call's arguments by what
    /// changed instead of copying every string per call.
    type Memo: Default + Send + Sync + 'static;

    /// Adds the world's imports (the host's `log`) to `linker`.
    fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()>;
    /// Checks that the component of `pre` implements this world.
    fn pre(pre: InstancePre<State>) -> wasmtime::Result<Self::Pre>;
    /// A new instance in `store`.
    fn instantiate(pre: &Self::Pre, store: &mut Store<State>) -> wasmtime::Result<Self::Exports>;
    /// Calls `declare(config)`, its declaration as the core's.
    fn declare(
        exports: &Self::Exports,
        store: &mut Store<State>,
        config: &[(String, String)],
    ) -> wasmtime::Result<Result<Declaration, String>>;

    /// [`Provider::batches`]: whether assembly asks with one `evaluate` per step.
    fn batches() -> bool;
    /// [`Provider::section_text`].
    fn section_text(
        p: &impl Calls<Self>,
        name: &str,
        scope: &Scope,
        step: &Step,
    ) -> CallResult<String>;
    /// [`Provider::context_text`].
    fn context_text(
        p: &impl Calls<Self>,
        name: &str,
        scope: &Scope,
        step: &Step,
    ) -> CallResult<String>;
    /// [`Provider::variable_value`].
    fn variable_value(
        p: &impl Calls<Self>,
        name: &str,
        scope: &Scope,
        step: &Step,
    ) -> CallResult<Option<String>>;
    /// [`Provider::shown_tools`].
    fn shown_tools(p: &impl Calls<Self>, step: &Step) -> CallResult<Vec<String>>;
    /// [`Provider::evaluate`].
    fn evaluate(p: &impl Calls<Self>, step: &Step, wanted: &Wanted) -> CallResult<Evaluation>;
    /// [`Provider::review`].
    fn review(p: &impl Calls<Self>, step: &Step, input: &ReviewInput) -> CallResult<Verdict>;
}

/// What a world's calls get from the provider running them (`wasm::Plugin`), which is also
/// the [`Provider`] they answer for.
pub(crate) trait Calls<W: World>: Provider {
    /// Runs `f` on a pooled instance under the call deadline. A trap drops the instance; a
    /// failed call is counted (L3).
    fn call<T>(
        &self,
        f: impl FnOnce(&W::Exports, &mut Store<State>) -> wasmtime::Result<Result<T, String>>,
    ) -> CallResult<T>;
    /// The provider's memo for this world.
    fn memo(&self) -> &W::Memo;
    /// Output checks: a returned text larger than the sandbox allows is a plugin error.
    fn bounded(&self, what: &str, text: &str) -> CallResult<()>;
    /// Counts one failure found after a call returned (L3).
    fn failed(&self);

    /// Checks a returned text, counting an oversized one as a failure.
    fn checked(&self, what: &str, result: CallResult<String>) -> CallResult<String> {
        let text = result?; // a failed call was counted already
        let checked = self.bounded(what, &text).map(|_| text);
        if checked.is_err() {
            self.failed();
        }
        checked
    }
}

/// Something done with the world a component implements, as a type ([`dispatch`]).
pub(crate) trait WithWorld {
    /// What it gives.
    type Output;
    /// Does it in world `W`.
    fn with<W: World>(self) -> Self::Output;
}

/// Runs `job` in the world `component` implements, judged by its exports and imports; a
/// component that is none of them is checked against 0.3.0, so its error names what 0.3.0
/// lacks.
pub(crate) fn dispatch<J: WithWorld>(component: &Component, engine: &Engine, job: J) -> J::Output {
    let ty = component.component_type();
    let mut names = ty.exports(engine).map(|(name, _)| name);
    if names.any(|n| n == "section-text" || n == "context-text") {
        return job.with::<v0_1::V0_1>();
    }
    // 0.2.0 and 0.3.0 export the same names; a component imports the types of the world it
    // was built against.
    let mut imports = ty.imports(engine).map(|(name, _)| name);
    if imports.any(|n| n.starts_with("promptd:plugin/") && n.ends_with("@0.2.0")) {
        job.with::<v0_2::V0_2>()
    } else {
        job.with::<v0_3::V0_3>()
    }
}

/// Adds every world's imports to `linker`: their interfaces are versioned, so they never clash.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    v0_1::V0_1::add_to_linker(linker)?;
    v0_2::V0_2::add_to_linker(linker)?;
    v0_3::V0_3::add_to_linker(linker)
}

/// Takes the lowering kept in `kept` (another call may be using it: then lowers afresh),
/// brings it up to `step`, runs `f` on it and puts it back.
pub(crate) fn with_lowered<L, R>(
    kept: &Mutex<Option<L>>,
    step: &Step,
    lower: fn(&Step) -> L,
    refresh: fn(&mut L, &Step),
    f: impl FnOnce(&L) -> R,
) -> R {
    let kept_one = lock(kept).take();
    let lowered = match kept_one {
        Some(mut lowered) => {
            refresh(&mut lowered, step);
            lowered
        }
        None => lower(step),
    };
    let result = f(&lowered);
    *lock(kept) = Some(lowered);
    result
}

/// What 0.2.0 added to a declaration's items, read the same way from any world: a 0.1.0
/// item is never verbatim, and a 0.1.0 plugin never reviews.
pub(crate) trait Added {
    fn verbatim(&self) -> bool {
        false
    }
    fn review_order(&self) -> Option<i32> {
        None
    }
}

// ---- conversions every world's alike types share, instantiated in each world's module -----

/// The core's scope and step into world `$w`'s: `$scope`, `$step` and `$refresh` (which makes
/// a kept lowering the lowering of a step, keeping what is already equal). `inputs: a, b`
/// names the request inputs the world's step carries (0.3.0), each a field of the same name
/// in [`promptd_core::plugin::model::StepInputs`].
macro_rules! to_wit {
    ($w:ident, $scope:ident, $step:ident, $refresh:ident $(, inputs: $($input:ident),*)?) => {
        pub(crate) fn $scope(scope: &Scope) -> $w::Scope {
            match scope {
                Scope::Global => $w::Scope::Global,
                Scope::Agent(a) => $w::Scope::Agent(a.clone()),
            }
        }

        pub(crate) fn $step(step: &Step) -> $w::Step {
            $w::Step {
                agent: step.agent.clone(),
                scope_chain: step.scope_chain.to_vec(),
                session_id: step.session_id.clone(),
                step_number: step.step_number,
                facts: step
                    .facts
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                $($($input: step.inputs.$input.clone(),)*)?
            }
        }

        /// Makes `lowered` the lowering of `step`, keeping what is already equal: a step of
        /// the same session differs from the last one in its number only.
        pub(crate) fn $refresh(lowered: &mut $w::Step, step: &Step) {
            if lowered.agent != step.agent {
                lowered.agent.clone_from(&step.agent);
            }
            if lowered.scope_chain[..] != step.scope_chain[..] {
                lowered.scope_chain = step.scope_chain.to_vec();
            }
            if lowered.session_id != step.session_id {
                lowered.session_id.clone_from(&step.session_id);
            }
            lowered.step_number = step.step_number;
            let same_facts = lowered.facts.len() == step.facts.len()
                && lowered
                    .facts
                    .iter()
                    .zip(&step.facts)
                    .all(|((a, b), (c, d))| a == c && b == d);
            if !same_facts {
                lowered.facts = step
                    .facts
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
            }
            $($(
                if lowered.$input != step.inputs.$input {
                    lowered.$input.clone_from(&step.inputs.$input);
                }
            )*)?
        }
    };
}

/// World `$w`'s scope and content into the core's: `$scope`, `$content`.
macro_rules! from_wit {
    ($w:ident, $scope:ident, $content:ident) => {
        fn $scope(s: $w::Scope) -> Scope {
            match s {
                $w::Scope::Global => Scope::Global,
                $w::Scope::Agent(a) => Scope::Agent(a),
            }
        }

        fn $content(c: $w::Content) -> Content {
            match c {
                $w::Content::StaticText(t) => Content::Static(t),
                $w::Content::Dynamic => Content::Dynamic,
            }
        }
    };
}

/// A world's declaration as the core's, `$fn`: the worlds' types are distinct but alike.
macro_rules! declaration {
    ($fn:ident, $w:ident, $scope:ident, $content:ident) => {
        pub(crate) fn $fn(d: $w::Declaration) -> Declaration {
            let review_order = d.review_order();
            Declaration {
                sections: (d.sections.into_iter())
                    .map(|s| model::Section {
                        verbatim: s.verbatim(),
                        name: s.name,
                        order: s.order,
                        text: $content(s.text),
                        complete: s.complete,
                        scope: $scope(s.scope),
                        reads: None,
                        refresh: None,
                    })
                    .collect(),
                contexts: (d.contexts.into_iter())
                    .map(|c| model::Context {
                        verbatim: c.verbatim(),
                        name: c.name,
                        order: c.order,
                        text: $content(c.text),
                        scope: $scope(c.scope),
                        reads: None,
                    })
                    .collect(),
                variables: (d.variables.into_iter())
                    .map(|v| model::Variable {
                        name: v.name,
                        value: $content(v.value),
                        scope: $scope(v.scope),
                        reads: None,
                    })
                    .collect(),
                tools: (d.tools.into_iter())
                    .map(|t| model::Tool {
                        name: t.name,
                        description: t.description,
                        parameters: t.parameters,
                        scope: $scope(t.scope),
                        refresh: None,
                        defer: false,
                    })
                    .collect(),
                filters_tools: d.filters_tools,
                review_order,
                reads: None,
            }
        }
    };
}

/// World `$w`'s log level in the host's terms, `$fn`.
macro_rules! level {
    ($fn:ident, $w:ident) => {
        fn $fn(level: $w::Level) -> Level {
            match level {
                $w::Level::Trace => Level::Trace,
                $w::Level::Debug => Level::Debug,
                $w::Level::Info => Level::Info,
                $w::Level::Warn => Level::Warn,
                $w::Level::Error => Level::Error,
            }
        }
    };
}

/// What every batching world (0.2.0 and later) does alike: `evaluate` once per step for every
/// wanted item, `review`, and the per-item methods through `evaluate`. `$w` is the world's
/// `types` module, `$world` its [`World`] type; `$lower_step`, `$refresh_step` and
/// `$lift_declaration` its own conversions.
macro_rules! batching {
    ($w:ident, $world:ident, $lower_step:ident, $refresh_step:ident, $lift_declaration:ident) => {
        fn lower_wanted(wanted: &Wanted) -> $w::Wanted {
            let items = |list: &[(String, Scope)]| {
                list.iter()
                    .map(|(name, scope)| $w::Item {
                        name: name.clone(),
                        scope: lower_scope(scope),
                    })
                    .collect()
            };
            $w::Wanted {
                sections: items(&wanted.sections),
                contexts: items(&wanted.contexts),
                variables: items(&wanted.variables),
                shown_tools: wanted.shown_tools,
            }
        }

        fn lower_review_input(input: &ReviewInput) -> $w::ReviewInput {
            $w::ReviewInput {
                messages: input
                    .messages
                    .iter()
                    .map(|m| $w::Message {
                        role: m.role.to_string(),
                        texts: m.texts.clone(),
                        tool_call_id: m.tool_call_id.clone(),
                    })
                    .collect(),
                system: input.system.clone(),
                runtime_context: input.runtime_context.clone(),
                tools: input.tools.clone(),
            }
        }

        fn lift_evaluation(e: $w::Evaluation) -> Evaluation {
            Evaluation {
                sections: e.sections.into_iter().map(failed).collect(),
                contexts: e.contexts.into_iter().map(failed).collect(),
                variables: e.variables.into_iter().map(failed).collect(),
                shown_tools: e.shown_tools.map(failed),
            }
        }

        fn failed<T>(r: Result<T, String>) -> CallResult<T> {
            r.map_err(CallError::Failed)
        }

        fn lift_verdict(v: $w::Verdict) -> Verdict {
            match v {
                $w::Verdict::Accept => Verdict::Accept,
                $w::Verdict::Reject(reason) => Verdict::Reject(reason),
                $w::Verdict::Redact(rules) => Verdict::Redact(
                    rules
                        .into_iter()
                        .map(|r| Redaction {
                            find: r.find,
                            replace: r.replace,
                        })
                        .collect(),
                ),
            }
        }

        /// What a provider keeps between calls.
        #[derive(Default)]
        pub(crate) struct Memo {
            /// The last step lowered.
            step: Mutex<Option<$w::Step>>,
            /// The last `Wanted` and its lowering: a plugin is usually asked the same every step, so
            /// its lowering is made once, not per call.
            wanted: Mutex<Option<(Wanted, Arc<$w::Wanted>)>>,
        }

        /// One item through [`World::evaluate`] (only reached through the per-item methods, which
        /// assembly does not use for batching plugins).
        fn one<T>(
            p: &impl Calls<$world>,
            step: &Step,
            wanted: &Wanted,
            pick: impl FnOnce(Evaluation) -> Option<CallResult<T>>,
        ) -> CallResult<T> {
            let answer = $world::evaluate(p, step, wanted)?;
            pick(answer).unwrap_or_else(|| Err(CallError::Failed("no answer".into())))
        }

        /// `wanted` lowered, from the memo when it was asked last.
        fn lowered_wanted(p: &impl Calls<$world>, wanted: &Wanted) -> Arc<$w::Wanted> {
            let mut last = lock(&p.memo().wanted);
            match last.as_ref() {
                Some((w, lowered)) if w == wanted => lowered.clone(),
                _ => {
                    let lowered = Arc::new(lower_wanted(wanted));
                    *last = Some((wanted.clone(), lowered.clone()));
                    lowered
                }
            }
        }

        impl World for $world {
            type Pre = bindings::PluginPre<State>;
            type Exports = bindings::Plugin;
            type Memo = Memo;

            fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
                bindings::Plugin::add_to_linker::<State, HasSelf<State>>(linker, |s| s)
            }

            fn pre(pre: InstancePre<State>) -> wasmtime::Result<Self::Pre> {
                bindings::PluginPre::new(pre)
            }

            fn instantiate(
                pre: &Self::Pre,
                store: &mut Store<State>,
            ) -> wasmtime::Result<Self::Exports> {
                pre.instantiate(store)
            }

            fn declare(
                exports: &Self::Exports,
                store: &mut Store<State>,
                config: &[(String, String)],
            ) -> wasmtime::Result<Result<Declaration, String>> {
                Ok(exports.call_declare(store, config)?.map($lift_declaration))
            }

            fn batches() -> bool {
                true
            }

            fn section_text(
                p: &impl Calls<Self>,
                name: &str,
                scope: &Scope,
                step: &Step,
            ) -> CallResult<String> {
                let wanted = Wanted {
                    sections: vec![(name.to_string(), scope.clone())],
                    ..Wanted::default()
                };
                one(p, step, &wanted, |e| e.sections.into_iter().next())
            }

            fn context_text(
                p: &impl Calls<Self>,
                name: &str,
                scope: &Scope,
                step: &Step,
            ) -> CallResult<String> {
                let wanted = Wanted {
                    contexts: vec![(name.to_string(), scope.clone())],
                    ..Wanted::default()
                };
                one(p, step, &wanted, |e| e.contexts.into_iter().next())
            }

            fn variable_value(
                p: &impl Calls<Self>,
                name: &str,
                scope: &Scope,
                step: &Step,
            ) -> CallResult<Option<String>> {
                let wanted = Wanted {
                    variables: vec![(name.to_string(), scope.clone())],
                    ..Wanted::default()
                };
                one(p, step, &wanted, |e| e.variables.into_iter().next())
            }

            fn shown_tools(p: &impl Calls<Self>, step: &Step) -> CallResult<Vec<String>> {
                let wanted = Wanted {
                    shown_tools: true,
                    ..Wanted::default()
                };
                one(p, step, &wanted, |e| e.shown_tools)
            }

            /// One call for every wanted item; each returned text is checked against the output
            /// bound, and a failed item counts as a failed call (L3).
            fn evaluate(
                p: &impl Calls<Self>,
                step: &Step,
                wanted: &Wanted,
            ) -> CallResult<Evaluation> {
                let wwanted = lowered_wanted(p, wanted);
                let answer =
                    with_lowered(&p.memo().step, step, $lower_step, $refresh_step, |wstep| {
                        p.call(|e, s| Ok(e.call_evaluate(s, wstep, &wwanted)?.map(lift_evaluation)))
                    })?;
                answer.check(wanted)?;
                let bound = |r: CallResult<String>, what: &str| {
                    r.and_then(|t| p.bounded(what, &t).map(|()| t))
                };
                let answer = Evaluation {
                    sections: (answer.sections.into_iter())
                        .map(|r| bound(r, "the text"))
                        .collect(),
                    contexts: (answer.contexts.into_iter())
                        .map(|r| bound(r, "the text"))
                        .collect(),
                    variables: (answer.variables.into_iter())
                        .map(|r| match r {
                            Ok(Some(v)) => bound(Ok(v), "the value").map(Some),
                            other => other,
                        })
                        .collect(),
                    shown_tools: answer.shown_tools,
                };
                let item_failed = answer.sections.iter().any(Result::is_err)
                    || answer.contexts.iter().any(Result::is_err)
                    || answer.shown_tools.as_ref().is_some_and(Result::is_err);
                if item_failed {
                    p.failed();
                }
                Ok(answer)
            }

            fn review(
                p: &impl Calls<Self>,
                step: &Step,
                input: &ReviewInput,
            ) -> CallResult<Verdict> {
                let (wstep, winput) = ($lower_step(step), lower_review_input(input));
                let verdict =
                    p.call(|e, s| Ok(e.call_review(s, &wstep, &winput)?.map(lift_verdict)))?;
                if let Err(cause) = verdict.check() {
                    p.failed();
                    return Err(CallError::Failed(cause));
                }
                Ok(verdict)
            }
        }
    };
}

pub(crate) mod v0_1;
pub(crate) mod v0_2;
pub(crate) mod v0_3;
