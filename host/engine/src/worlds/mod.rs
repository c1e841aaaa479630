//! The plugin worlds the host serves (SPEC W1, W2), one module per world version, and what
//! they share: the [`World`] trait each implements, the [`Calls`] a provider gives them, and
//! the conversions between their types and the core's plain data.
//!
//! `promptd:plugin@0.1.0` (wit/0.1.0, [`v0_1`]) is published and frozen: its components are
//! adapted (per-item calls, no verbatim, no review) and keep giving the bytes they always gave.
//! `promptd:plugin@0.2.0` (wit/, [`v0_2`]) is what the SDKs build. Which world a component
//! implements is read from its exports: only 0.2.0 exports `evaluate` and `review`. A new world
//! is a new module implementing [`World`], named in [`dispatch`] and [`add_to_linker`].

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

/// Runs `job` in the world `component` implements, judged by its exports; a component that
/// exports neither world's functions is checked against 0.2.0, so its error names what 0.2.0
/// lacks.
pub(crate) fn dispatch<J: WithWorld>(component: &Component, engine: &Engine, job: J) -> J::Output {
    let ty = component.component_type();
    let mut names = ty.exports(engine).map(|(name, _)| name);
    if names.any(|n| n == "section-text" || n == "context-text") {
        job.with::<v0_1::V0_1>()
    } else {
        job.with::<v0_2::V0_2>()
    }
}

/// Adds every world's imports to `linker`: their interfaces are versioned, so they never clash.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    v0_1::V0_1::add_to_linker(linker)?;
    v0_2::V0_2::add_to_linker(linker)
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
/// a kept lowering the lowering of a step, keeping what is already equal).
macro_rules! to_wit {
    ($w:ident, $scope:ident, $step:ident, $refresh:ident) => {
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
                    })
                    .collect(),
                contexts: (d.contexts.into_iter())
                    .map(|c| model::Context {
                        verbatim: c.verbatim(),
                        name: c.name,
                        order: c.order,
                        text: $content(c.text),
                        scope: $scope(c.scope),
                    })
                    .collect(),
                variables: (d.variables.into_iter())
                    .map(|v| model::Variable {
                        name: v.name,
                        value: $content(v.value),
                        scope: $scope(v.scope),
                    })
                    .collect(),
                tools: (d.tools.into_iter())
                    .map(|t| model::Tool {
                        name: t.name,
                        description: t.description,
                        parameters: t.parameters,
                        scope: $scope(t.scope),
                    })
                    .collect(),
                filters_tools: d.filters_tools,
                review_order,
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

pub(crate) mod v0_1;
pub(crate) mod v0_2;
