//! Plain data: what plugins declare and what the host knows about a step.
//!
//! These types mirror `wit/plugin.wit` but carry no WebAssembly: the registry, assembly and
//! rendering work on them alone, so they can be tested without an engine.

use std::collections::BTreeMap;
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
}

/// The four kinds of contribution (defined below the plugin model: errors name them too).
pub use crate::kind::Kind;
