//! `promptd:plugin@0.3.0` (wit/), what the SDKs build: 0.2.0's one `evaluate` per step, and
//! what each dynamic contribution reads (the step a call is shown holds only that) and the
//! plugin's cache intent (`refresh`, `defer`).

use std::sync::{Arc, Mutex};

use promptd_core::plugin::model::{self, Content, Declaration, Inputs, Reads, RefreshMode};
use promptd_core::plugin::model::{Scope, Step};
use promptd_core::plugin::provider::{CallError, CallResult, Evaluation, Wanted};
use promptd_core::plugin::provider::{Redaction, ReviewInput, Verdict};
use promptd_core::sync::lock;
use wasmtime::component::{HasSelf, InstancePre, Linker};
use wasmtime::Store;

use super::{with_lowered, Calls, World};
use crate::log::Level;
use crate::state::State;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "plugin",
    });
}

use bindings::promptd::plugin::types as w3;

/// World 0.3.0.
pub(crate) struct V0_3;

to_wit!(w3, lower_scope, lower_step, refresh_step,
    inputs: last_user_message, model, client_tools, turn_count);
from_wit!(w3, lift_scope, lift_content);
level!(lift_level, w3);

impl w3::Host for State {}

impl bindings::promptd::plugin::host::Host for State {
    fn log(&mut self, level: w3::Level, message: String) {
        State::log(self, lift_level(level), &message);
    }
}

fn lift_reads(r: w3::Reads) -> Reads {
    Reads {
        facts: r.facts.into_iter().collect(),
        inputs: Inputs {
            last_user_message: r.inputs.contains(w3::Inputs::LAST_USER_MESSAGE),
            model: r.inputs.contains(w3::Inputs::MODEL),
            client_tools: r.inputs.contains(w3::Inputs::CLIENT_TOOLS),
            step_number: r.inputs.contains(w3::Inputs::STEP_NUMBER),
            turn_count: r.inputs.contains(w3::Inputs::TURN_COUNT),
        },
        volatile: r.volatile,
    }
}

fn lift_refresh(r: w3::Refresh) -> RefreshMode {
    match r {
        w3::Refresh::Step => RefreshMode::Step,
        w3::Refresh::Boundary => RefreshMode::Boundary,
        w3::Refresh::Session => RefreshMode::Session,
    }
}

fn lift_declaration(d: w3::Declaration) -> Declaration {
    Declaration {
        sections: (d.sections.into_iter())
            .map(|s| model::Section {
                name: s.name,
                order: s.order,
                text: lift_content(s.text),
                complete: s.complete,
                scope: lift_scope(s.scope),
                verbatim: s.verbatim,
                reads: s.reads.map(lift_reads),
                refresh: s.refresh.map(lift_refresh),
            })
            .collect(),
        contexts: (d.contexts.into_iter())
            .map(|c| model::Context {
                name: c.name,
                order: c.order,
                text: lift_content(c.text),
                scope: lift_scope(c.scope),
                verbatim: c.verbatim,
                reads: c.reads.map(lift_reads),
            })
            .collect(),
        variables: (d.variables.into_iter())
            .map(|v| model::Variable {
                name: v.name,
                value: lift_content(v.value),
                scope: lift_scope(v.scope),
                reads: v.reads.map(lift_reads),
            })
            .collect(),
        tools: (d.tools.into_iter())
            .map(|t| model::Tool {
                name: t.name,
                description: t.description,
                parameters: t.parameters,
                scope: lift_scope(t.scope),
                refresh: t.refresh.map(lift_refresh),
                defer: t.defer,
            })
            .collect(),
        filters_tools: d.filters_tools,
        review_order: d.review_order,
        reads: d.reads.map(lift_reads),
    }
}

batching!(w3, V0_3, lower_step, refresh_step, lift_declaration);
