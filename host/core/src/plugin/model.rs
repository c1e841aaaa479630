//! Plain data: what plugins declare and what the host knows about a step.
//!
//! These types mirror `wit/plugin.wit` but carry no WebAssembly: the registry, assembly and
//! rendering work on them alone, so they can be tested without an engine.

use std::collections::BTreeMap;
use std::fmt;

/// Where a contribution is visible (SPEC "scope").
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Global,
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
    Static(String),
    Dynamic,
}

/// C1: a part of the system prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub order: i32,
    pub text: Content,
    pub complete: bool,
    pub scope: Scope,
    /// Never interpolated: the text is used exactly as given (world 0.2.0).
    pub verbatim: bool,
}

/// C2: a part of the runtime context snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub name: String,
    pub order: i32,
    pub text: Content,
    pub scope: Scope,
    /// Never interpolated: the text is used exactly as given (world 0.2.0).
    pub verbatim: bool,
}

/// C3: a value for `{{name}}` interpolation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    pub name: String,
    pub value: Content,
    pub scope: Scope,
}

/// C4: a tool schema. `parameters` is the JSON text as declared; it is parsed at validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    pub parameters: String,
    pub scope: Scope,
}

/// Everything one plugin may contribute.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Declaration {
    pub sections: Vec<Section>,
    pub contexts: Vec<Context>,
    pub variables: Vec<Variable>,
    pub tools: Vec<Tool>,
    /// When true the plugin chooses, per assembly, which known tools are shown.
    pub filters_tools: bool,
    /// Some: the plugin reviews each session step; hooks run by (this order, plugin id).
    pub review_order: Option<i32>,
}

/// What every kind of contribution has in common: a name, a scope, and a list in a
/// declaration.
pub trait Contribution: Sized {
    const KIND: Kind;
    fn name(&self) -> &str;
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
    pub agent: String,
    /// Farthest first: `global`, ancestors…, the agent.
    pub scope_chain: std::sync::Arc<[String]>,
    pub session_id: String,
    pub step_number: u64,
    /// Sorted by key, so plugins see the same order whatever order the client sent.
    pub facts: BTreeMap<String, String>,
}

/// The four kinds of contribution; used in errors and `--explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Section,
    Context,
    Variable,
    Tool,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Section => "section",
            Kind::Context => "context",
            Kind::Variable => "variable",
            Kind::Tool => "tool",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
