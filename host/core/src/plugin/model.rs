//! Plain data: what plugins declare and what the host knows about a step.
//!
//! These types mirror `wit/plugin.wit` but carry no WebAssembly: the registry, assembly and
//! rendering work on them alone, so they can be tested without an engine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Where a contribution is visible (SPEC "scope").
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Visible to every agent.
    Global,
    /// Visible to this agent and the agents whose chain includes it.
    Agent(String),
}

impl Scope {
    /// The scope key as it appears in a scope chain: `global` or the agent's name.
    pub fn key(&self) -> &str {
        match self {
            Scope::Global => "global",
            Scope::Agent(name) => name,
        }
    }

    /// The scope of agent `name`.
    pub fn agent(name: impl Into<String>) -> Self {
        Scope::Agent(name.into())
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Static text known at load, or text computed by the plugin at each assembly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Text known at load, carried in the declaration.
    Static(String),
    /// Text the plugin computes at each assembly.
    Dynamic,
}

/// The request inputs a step may show a plugin besides its facts (world 0.3.0): each true
/// one is shown to a call whose wanted contributions read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Inputs {
    /// The text of the session's last user message.
    pub last_user_message: bool,
    /// The model the request is for.
    pub model: bool,
    /// The names of the tools the client sent.
    pub client_tools: bool,
    /// The step's number.
    pub step_number: bool,
    /// How many user messages the session holds.
    pub turn_count: bool,
}

impl Inputs {
    /// Every input.
    pub const ALL: Inputs = Inputs {
        last_user_message: true,
        model: true,
        client_tools: true,
        step_number: true,
        turn_count: true,
    };

    /// Each input either reads.
    pub fn union(self, other: Inputs) -> Inputs {
        Inputs {
            last_user_message: self.last_user_message || other.last_user_message,
            model: self.model || other.model,
            client_tools: self.client_tools || other.client_tools,
            step_number: self.step_number || other.step_number,
            turn_count: self.turn_count || other.turn_count,
        }
    }

    /// Their names, as the WIT spells them (for `promptd plugins` and errors).
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.last_user_message, "last-user-message"),
            (self.model, "model"),
            (self.client_tools, "client-tools"),
            (self.step_number, "step-number"),
            (self.turn_count, "turn-count"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// What a dynamic contribution reads of a step (world 0.3.0): it is shown only these, and in
/// a session it is asked again only when one of them changed, unless `volatile`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reads {
    /// The facts it reads, by name.
    pub facts: BTreeSet<String>,
    /// The request inputs it reads.
    pub inputs: Inputs,
    /// Asked at every step all the same (its answer depends on something else too).
    pub volatile: bool,
}

/// When a change to a section's or tool's text may reach the model, as the plugin declares it
/// (world 0.3.0; the operator's `[plugins.ID] refresh` overrides it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefreshMode {
    /// At the session's next step.
    #[default]
    Step,
    /// At the session's next cache-cold point, or after `max_stale_s`.
    Boundary,
    /// Never within a session: a session keeps what it was first sent.
    Session,
}

impl RefreshMode {
    /// Its name, as the WIT and the config spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RefreshMode::Step => "step",
            RefreshMode::Boundary => "boundary",
            RefreshMode::Session => "session",
        }
    }
}

/// C1: a part of the system prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// The section's name (C5); with the scope, its identity.
    pub name: String,
    /// Where it sorts in the system prompt: by order, then name (A1).
    pub order: i32,
    /// Its text, static or dynamic.
    pub text: Content,
    /// Whether it is the whole system prompt when effective (A3).
    pub complete: bool,
    /// Where it is visible.
    pub scope: Scope,
    /// Never interpolated: the text is used exactly as given (world 0.2.0).
    pub verbatim: bool,
    /// What a dynamic section reads; `None`: the declaration's (world 0.3.0).
    pub reads: Option<Reads>,
    /// When a change reaches the model, as the plugin declares it (world 0.3.0).
    pub refresh: Option<RefreshMode>,
}

/// C2: a part of the runtime context snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    /// The context's name (C5); with the scope, its identity.
    pub name: String,
    /// Where it sorts in the runtime context: by order, then name (A4).
    pub order: i32,
    /// Its text, static or dynamic.
    pub text: Content,
    /// Where it is visible.
    pub scope: Scope,
    /// Never interpolated: the text is used exactly as given (world 0.2.0).
    pub verbatim: bool,
    /// What a dynamic context reads; `None`: the declaration's (world 0.3.0).
    pub reads: Option<Reads>,
}

/// C3: a value for `{{name}}` interpolation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    /// The variable's name, as `{{name}}` references it.
    pub name: String,
    /// Its value, static or dynamic.
    pub value: Content,
    /// Where it is visible.
    pub scope: Scope,
    /// What a dynamic variable reads; `None`: the declaration's (world 0.3.0).
    pub reads: Option<Reads>,
}

/// C4: a tool schema. `parameters` is the JSON text as declared; it is parsed at validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    /// The tool's name, as the model calls it.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// Its parameters' JSON Schema, as JSON text.
    pub parameters: String,
    /// Where it is visible.
    pub scope: Scope,
    /// When a change to it reaches the model, as the plugin declares it (world 0.3.0).
    pub refresh: Option<RefreshMode>,
    /// Deferred, as the plugin declares it: found through the provider's tool search (world
    /// 0.3.0; the operator's `[plugins.ID] defer` overrides it).
    pub defer: bool,
}

/// Everything one plugin may contribute.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Declaration {
    /// The system prompt parts it declares.
    pub sections: Vec<Section>,
    /// The runtime context parts it declares.
    pub contexts: Vec<Context>,
    /// The interpolation values it declares.
    pub variables: Vec<Variable>,
    /// Every tool it may ever show.
    pub tools: Vec<Tool>,
    /// When true the plugin chooses, per assembly, which known tools are shown.
    pub filters_tools: bool,
    /// Some: the plugin reviews each session step; hooks run by (this order, plugin id).
    pub review_order: Option<i32>,
    /// What its dynamic contributions read unless one says, and what its tool filter reads;
    /// `None`: the whole step, at every step (worlds 0.1.0 and 0.2.0).
    pub reads: Option<Reads>,
}

impl Declaration {
    /// What the dynamic item `reads` (its own, else the declaration's) makes of a read:
    /// `None` reads the whole step.
    pub fn reads_of<'a>(&'a self, own: Option<&'a Reads>) -> Option<&'a Reads> {
        own.or(self.reads.as_ref())
    }

    /// Whether some dynamic item (or the tool filter) is asked at every step whatever it
    /// answered before: it reads the whole step (no `reads`) or says it is volatile. An
    /// assembly that shows it can then never be served from kept answers alone.
    pub fn asked_every_step(&self) -> bool {
        let every = |own: Option<&Reads>| self.reads_of(own).is_none_or(|r| r.volatile);
        let dynamic = |c: &Content| matches!(c, Content::Dynamic);
        self.sections
            .iter()
            .any(|s| dynamic(&s.text) && every(s.reads.as_ref()))
            || (self.contexts.iter()).any(|c| dynamic(&c.text) && every(c.reads.as_ref()))
            || (self.variables.iter()).any(|v| dynamic(&v.value) && every(v.reads.as_ref()))
            || (self.filters_tools && every(None))
    }
}

/// What every kind of contribution has in common: a name, a scope, and a list in a
/// declaration.
pub trait Contribution: Sized {
    /// Which kind of contribution this is.
    const KIND: Kind;
    /// The contribution's name.
    fn name(&self) -> &str;
    /// Where the contribution is visible.
    fn scope(&self) -> &Scope;
    /// This kind's items in a declaration.
    fn all(declaration: &Declaration) -> &[Self];
}

macro_rules! contribution {
    ($ty:ty, $kind:expr, $field:ident) => {
        impl Contribution for $ty {
            const KIND: Kind = $kind;
            fn name(&self) -> &str {
                &self.name
            }
            fn scope(&self) -> &Scope {
                &self.scope
            }
            fn all(declaration: &Declaration) -> &[Self] {
                &declaration.$field
            }
        }
    };
}

contribution!(Section, Kind::Section, sections);
contribution!(Context, Kind::Context, contexts);
contribution!(Variable, Kind::Variable, variables);
contribution!(Tool, Kind::Tool, tools);

/// What the host knows about the step being assembled; passed to every dynamic call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The agent the step is for.
    pub agent: String,
    /// Farthest first: `global`, ancestors…, the agent.
    pub scope_chain: std::sync::Arc<[String]>,
    /// The session's id.
    pub session_id: String,
    /// The step's number in its session, counted from 1 (0 outside a session).
    pub step_number: u64,
    /// Sorted by key, so plugins see the same order whatever order the client sent.
    pub facts: BTreeMap<String, String>,
    /// The request inputs a world 0.3.0 plugin may read.
    pub inputs: StepInputs,
}

/// The request inputs of a step (world 0.3.0): each `None` when not known — or, in the step a
/// call is shown, not read by the contributions it is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct StepInputs {
    /// The text of the session's last user message (its text blocks joined by a newline).
    pub last_user_message: Option<String>,
    /// The model the request is for.
    pub model: Option<String>,
    /// The names of the tools the client sent (through the gateway), in its order.
    pub client_tools: Option<Vec<String>>,
    /// How many user messages the session holds, this step's included.
    pub turn_count: Option<u64>,
}

/// The four kinds of contribution (defined below the plugin model: errors name them too).
pub use crate::kind::Kind;
