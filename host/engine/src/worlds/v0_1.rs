//! `promptd:plugin@0.1.0` (wit/0.1.0), published and frozen: a plugin answers item by item
//! (`section-text`, `context-text`, `variable-value`, `shown-tools`), never verbatim, and has
//! no review hook; `evaluate` is adapted to those calls.

use std::sync::Mutex;

use promptd_core::plugin::model::{self, Content, Declaration, Scope, Step};
use promptd_core::plugin::provider::{per_item, CallResult, Evaluation};
use promptd_core::plugin::provider::{ReviewInput, Verdict, Wanted};
use wasmtime::component::{HasSelf, InstancePre, Linker};
use wasmtime::Store;

use super::{with_lowered, Added, Calls, World};
use crate::log::Level;
use crate::state::State;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/0.1.0",
        world: "plugin",
    });
}

use bindings::promptd::plugin::types as w1;

/// World 0.1.0.
pub(crate) struct V0_1;

to_wit!(w1, lower_scope, lower_step, refresh_step);
from_wit!(w1, lift_scope, lift_content);
declaration!(lift_declaration, w1, lift_scope, lift_content);
level!(lift_level, w1);

impl Added for w1::Section {}
impl Added for w1::Context {}
impl Added for w1::Declaration {}

impl w1::Host for State {}

impl bindings::promptd::plugin::host::Host for State {
    fn log(&mut self, level: w1::Level, message: String) {
        State::log(self, lift_level(level), &message);
    }
}

/// Runs `f` on `step` lowered for this world, from the last lowering when one is free.
fn with_step<R>(p: &impl Calls<V0_1>, step: &Step, f: impl FnOnce(&w1::Step) -> R) -> R {
    with_lowered(p.memo(), step, lower_step, refresh_step, f)
}

impl World for V0_1 {
    type Pre = bindings::PluginPre<State>;
    type Exports = bindings::Plugin;
    /// The last step lowered.
    type Memo = Mutex<Option<w1::Step>>;

    fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
        bindings::Plugin::add_to_linker::<State, HasSelf<State>>(linker, |s| s)
    }

    fn pre(pre: InstancePre<State>) -> wasmtime::Result<Self::Pre> {
        bindings::PluginPre::new(pre)
    }

    fn instantiate(pre: &Self::Pre, store: &mut Store<State>) -> wasmtime::Result<Self::Exports> {
        pre.instantiate(store)
    }

    fn declare(
        exports: &Self::Exports,
        store: &mut Store<State>,
        config: &[(String, String)],
    ) -> wasmtime::Result<Result<Declaration, String>> {
        Ok(exports.call_declare(store, config)?.map(lift_declaration))
    }

    fn batches() -> bool {
        false
    }

    fn section_text(
        p: &impl Calls<Self>,
        name: &str,
        scope: &Scope,
        step: &Step,
    ) -> CallResult<String> {
        let wscope = lower_scope(scope);
        let result = with_step(p, step, |wstep| {
            p.call(|e, s| e.call_section_text(s, name, &wscope, wstep))
        });
        p.checked("the text", result)
    }

    fn context_text(
        p: &impl Calls<Self>,
        name: &str,
        scope: &Scope,
        step: &Step,
    ) -> CallResult<String> {
        let wscope = lower_scope(scope);
        let result = with_step(p, step, |wstep| {
            p.call(|e, s| e.call_context_text(s, name, &wscope, wstep))
        });
        p.checked("the text", result)
    }

    fn variable_value(
        p: &impl Calls<Self>,
        name: &str,
        scope: &Scope,
        step: &Step,
    ) -> CallResult<Option<String>> {
        let wscope = lower_scope(scope);
        let result = with_step(p, step, |wstep| {
            p.call(|e, s| e.call_variable_value(s, name, &wscope, wstep))
        });
        match result {
            Ok(Some(v)) => p.checked("the value", Ok(v)).map(Some),
            other => other,
        }
    }

    fn shown_tools(p: &impl Calls<Self>, step: &Step) -> CallResult<Vec<String>> {
        with_step(p, step, |wstep| p.call(|e, s| e.call_shown_tools(s, wstep)))
    }

    /// The adapter: a 0.1.0 plugin answers item by item, as it always did.
    fn evaluate(p: &impl Calls<Self>, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        Ok(per_item(p, step, wanted))
    }

    /// 0.1.0 has no hook.
    fn review(_: &impl Calls<Self>, _: &Step, _: &ReviewInput) -> CallResult<Verdict> {
        Ok(Verdict::Accept)
    }
}
