//! `promptd:plugin@0.2.0` (wit/), what the SDKs build: one `evaluate` call answers every
//! item a step wants, items may be verbatim, and a plugin may `review` a step's request.

use std::sync::{Arc, Mutex};

use promptd_core::plugin::model::{self, Content, Declaration, Scope, Step};
use promptd_core::plugin::provider::{CallError, CallResult, Evaluation, Wanted};
use promptd_core::plugin::provider::{Redaction, ReviewInput, Verdict};
use promptd_core::sync::lock;
use wasmtime::component::{HasSelf, InstancePre, Linker};
use wasmtime::Store;

use super::{with_lowered, Added, Calls, World};
use crate::log::Level;
use crate::state::State;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/0.2.0",
        world: "plugin",
    });
}

use bindings::promptd::plugin::types as w2;

/// World 0.2.0.
pub(crate) struct V0_2;

to_wit!(w2, lower_scope, lower_step, refresh_step);
from_wit!(w2, lift_scope, lift_content);
declaration!(lift_declaration, w2, lift_scope, lift_content);
level!(lift_level, w2);

impl Added for w2::Section {
    fn verbatim(&self) -> bool {
        self.verbatim
    }
}

impl Added for w2::Context {
    fn verbatim(&self) -> bool {
        self.verbatim
    }
}

impl Added for w2::Declaration {
    fn review_order(&self) -> Option<i32> {
        self.review_order
    }
}

impl w2::Host for State {}

impl bindings::promptd::plugin::host::Host for State {
    fn log(&mut self, level: w2::Level, message: String) {
        State::log(self, lift_level(level), &message);
    }
}

fn lower_wanted(wanted: &Wanted) -> w2::Wanted {
    let items = |list: &[(String, Scope)]| {
        list.iter()
            .map(|(name, scope)| w2::Item {
                name: name.clone(),
                scope: lower_scope(scope),
            })
            .collect()
    };
    w2::Wanted {
        sections: items(&wanted.sections),
        contexts: items(&wanted.contexts),
        variables: items(&wanted.variables),
        shown_tools: wanted.shown_tools,
    }
}

fn lower_review_input(input: &ReviewInput) -> w2::ReviewInput {
    w2::ReviewInput {
        messages: input
            .messages
            .iter()
            .map(|m| w2::Message {
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

fn lift_evaluation(e: w2::Evaluation) -> Evaluation {
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

fn lift_verdict(v: w2::Verdict) -> Verdict {
    match v {
        w2::Verdict::Accept => Verdict::Accept,
        w2::Verdict::Reject(reason) => Verdict::Reject(reason),
        w2::Verdict::Redact(rules) => Verdict::Redact(
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

/// What a provider keeps between 0.2.0 calls.
#[derive(Default)]
pub(crate) struct Memo {
    /// The last step lowered.
    step: Mutex<Option<w2::Step>>,
    /// The last `Wanted` and its lowering: a plugin is usually asked the same every step, so
    /// its lowering is made once, not per call.
    wanted: Mutex<Option<(Wanted, Arc<w2::Wanted>)>>,
}

/// One item through [`World::evaluate`] (only reached through the per-item methods, which
/// assembly does not use for 0.2.0 plugins).
fn one<T>(
    p: &impl Calls<V0_2>,
    step: &Step,
    wanted: &Wanted,
    pick: impl FnOnce(Evaluation) -> Option<CallResult<T>>,
) -> CallResult<T> {
    let answer = V0_2::evaluate(p, step, wanted)?;
    pick(answer).unwrap_or_else(|| Err(CallError::Failed("no answer".into())))
}

/// `wanted` lowered, from the memo when it was asked last.
fn lowered_wanted(p: &impl Calls<V0_2>, wanted: &Wanted) -> Arc<w2::Wanted> {
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

impl World for V0_2 {
    type Pre = bindings::PluginPre<State>;
    type Exports = bindings::Plugin;
    type Memo = Memo;

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
    fn evaluate(p: &impl Calls<Self>, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        let wwanted = lowered_wanted(p, wanted);
        let answer = with_lowered(&p.memo().step, step, lower_step, refresh_step, |wstep| {
            p.call(|e, s| Ok(e.call_evaluate(s, wstep, &wwanted)?.map(lift_evaluation)))
        })?;
        answer.check(wanted)?;
        let bound =
            |r: CallResult<String>, what: &str| r.and_then(|t| p.bounded(what, &t).map(|()| t));
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

    fn review(p: &impl Calls<Self>, step: &Step, input: &ReviewInput) -> CallResult<Verdict> {
        let (wstep, winput) = (lower_step(step), lower_review_input(input));
        let verdict = p.call(|e, s| Ok(e.call_review(s, &wstep, &winput)?.map(lift_verdict)))?;
        if let Err(cause) = verdict.check() {
            p.failed();
            return Err(CallError::Failed(cause));
        }
        Ok(verdict)
    }
}
