//! The four kinds of contribution a plugin makes, below everything that names one: the plugin
//! model, and the errors (a conflict names the kind of the contributions in it).

use std::fmt;

/// The four kinds of contribution; used in errors and `--explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A part of the system prompt (C1).
    Section,
    /// A part of the runtime context (C2).
    Context,
    /// A value for interpolation (C3).
    Variable,
    /// A tool (C4).
    Tool,
}

impl Kind {
    /// The kind's name in messages: `section`, `context`, `variable` or `tool`.
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
