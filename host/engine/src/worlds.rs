//! The two plugin worlds the host serves (SPEC W1, W2), and the conversions between their types and the
//! core's plain data.
//!
//! `promptd:plugin@0.1.0` (wit/0.1.0) is published and frozen: its components are adapted here
//! (per-item calls, no verbatim, no review) and keep giving the bytes they always gave.
//! `promptd:plugin@0.2.0` (wit/) is what the SDKs build. Which world a component implements is
//! read from its exports: only 0.2.0 exports `evaluate` and `review`.

use promptd_core::plugin::model::{self, Content, Declaration, Scope, Step};
use promptd_core::plugin::provider::{CallError, CallResult, Evaluation, Wanted};
use promptd_core::plugin::provider::{Redaction, ReviewInput, Verdict};
use wasmtime::component::Component;
use wasmtime::Engine;

pub(crate) mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../../wit/0.1.0",
        world: "plugin",
    });
}

pub(crate) mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "plugin",
    });
}

pub(crate) use v0_1::promptd::plugin::types as w1;
pub(crate) use v0_2::promptd::plugin::types as w2;

/// A world version the host serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum World {
    V0_1,
    V0_2,
}

impl World {
    /// The world `component` implements, judged by its exports; a component that exports
    /// neither world's functions is checked against 0.2.0, so its error names what 0.2.0 lacks.
    pub(crate) fn of(component: &Component, engine: &Engine) -> World {
        let ty = component.component_type();
        let mut names = ty.exports(engine).map(|(name, _)| name);
        if names.any(|n| n == "section-text" || n == "context-text") {
            World::V0_1
        } else {
            World::V0_2
        }
    }
}

// ---- the core's data into each world --------------------------------------------------------

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

to_wit!(w1, scope_v1, step_v1, refresh_v1);
to_wit!(w2, scope_v2, step_v2, refresh_v2);

pub(crate) fn wanted_v2(wanted: &Wanted) -> w2::Wanted {
    let items = |list: &[(String, Scope)]| {
        list.iter()
            .map(|(name, scope)| w2::Item {
                name: name.clone(),
                scope: scope_v2(scope),
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

pub(crate) fn review_input_v2(input: &ReviewInput) -> w2::ReviewInput {
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

// ---- each world's data into the core's ------------------------------------------------------

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

from_wit!(w1, from_scope_v1, from_content_v1);
from_wit!(w2, from_scope_v2, from_content_v2);

/// What 0.2.0 added to a declaration's items, read the same way from either world: a 0.1.0
/// item is never verbatim, and a 0.1.0 plugin never reviews.
trait Added {
    fn verbatim(&self) -> bool {
        false
    }
    fn review_order(&self) -> Option<i32> {
        None
    }
}

impl Added for w1::Section {}
impl Added for w1::Context {}
impl Added for w1::Declaration {}

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

/// A world's declaration as the core's: the two worlds' types are distinct but alike.
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

declaration!(declaration_v1, w1, from_scope_v1, from_content_v1);
declaration!(declaration_v2, w2, from_scope_v2, from_content_v2);

pub(crate) fn evaluation_v2(e: w2::Evaluation) -> Evaluation {
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

pub(crate) fn verdict_v2(v: w2::Verdict) -> Verdict {
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

/// A log level of either world, in the host's terms.
pub(crate) fn level_v1(level: w1::Level) -> crate::log::Level {
    use crate::log::Level;
    match level {
        w1::Level::Trace => Level::Trace,
        w1::Level::Debug => Level::Debug,
        w1::Level::Info => Level::Info,
        w1::Level::Warn => Level::Warn,
        w1::Level::Error => Level::Error,
    }
}

pub(crate) fn level_v2(level: w2::Level) -> crate::log::Level {
    use crate::log::Level;
    match level {
        w2::Level::Trace => Level::Trace,
        w2::Level::Debug => Level::Debug,
        w2::Level::Info => Level::Info,
        w2::Level::Warn => Level::Warn,
        w2::Level::Error => Level::Error,
    }
}
