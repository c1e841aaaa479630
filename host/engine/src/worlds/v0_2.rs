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

batching!(w2, V0_2, lower_step, refresh_step, lift_declaration);
