//! Where contributions come from: the `Provider` trait and its native implementation.
//!
//! A provider answers the dynamic calls of one loaded plugin. The registry holds its
//! `Declaration` (plain data); assembly calls the provider only for dynamic contributions.
//! Two implementations exist: `promptd_engine::WasmProvider` for components and
//! [`NativePlugin`] for built-ins, tests and benchmarks.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{Content, Context, Declaration, Scope, Section, Step, Tool, Variable};

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The plugin returned an error result.
    Failed(String),
    /// The plugin trapped (panic, unreachable, time-out, memory cap).
    Trapped(String),
}

impl CallError {
    pub fn cause(&self) -> &str {
        match self {
            CallError::Failed(m) | CallError::Trapped(m) => m,
        }
    }
}

pub type CallResult<T> = Result<T, CallError>;

/// The dynamic half of a plugin. Implementations must be callable from several threads.
pub trait Provider: Send + Sync {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String>;
    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String>;
    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>>;
    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>>;
    /// Failed calls since the last successful one (used to quarantine, L3).
    fn consecutive_failures(&self) -> u32 {
        0
    }
}

type TextFn = Arc<dyn Fn(&Step) -> CallResult<String> + Send + Sync>;
type ValueFn = Arc<dyn Fn(&Step) -> CallResult<Option<String>> + Send + Sync>;
type ToolsFn = Arc<dyn Fn(&Step) -> CallResult<Vec<String>> + Send + Sync>;

/// A plugin made of plain Rust values and closures.
///
/// ```
/// use promptd_core::provider::NativePlugin;
/// use promptd_core::model::Scope;
///
/// let plugin = NativePlugin::new()
///     .section("deployment:persona", 0, "You are {{name}}.")
///     .variable("name", "Ada")
///     .dynamic_context("clock", 10, |step| Ok(format!("step {}", step.step_number)))
///     .scoped(Scope::agent("coder"));
/// let (declaration, _provider) = plugin.build();
/// assert_eq!(declaration.sections.len(), 1);
/// assert_eq!(declaration.contexts[0].scope, Scope::agent("coder"));
/// ```
#[derive(Clone, Default)]
pub struct NativePlugin {
    declaration: Declaration,
    // Callbacks aligned by index with the declaration's items (None for static ones).
    sections: Vec<Option<TextFn>>,
    contexts: Vec<Option<TextFn>>,
    variables: Vec<Option<ValueFn>>,
    shown_tools: Option<ToolsFn>,
    last: Option<Last>,
}

#[derive(Clone, Copy)]
enum Last {
    Section,
    Context,
    Variable,
    Tool,
}

impl NativePlugin {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn section(mut self, name: &str, order: i32, text: &str) -> Self {
        self.push_section(name, order, Content::Static(text.into()), None);
        self
    }

    pub fn dynamic_section(
        mut self,
        name: &str,
        order: i32,
        f: impl Fn(&Step) -> CallResult<String> + Send + Sync + 'static,
    ) -> Self {
        self.push_section(name, order, Content::Dynamic, Some(Arc::new(f)));
        self
    }

    fn push_section(&mut self, name: &str, order: i32, text: Content, f: Option<TextFn>) {
        self.sections.push(f);
        self.declaration.sections.push(Section {
            name: name.into(),
            order,
            text,
            complete: false,
            scope: Scope::Global,
        });
        self.last = Some(Last::Section);
    }

    pub fn context(mut self, name: &str, order: i32, text: &str) -> Self {
        self.push_context(name, order, Content::Static(text.into()), None);
        self
    }

    pub fn dynamic_context(
        mut self,
        name: &str,
        order: i32,
        f: impl Fn(&Step) -> CallResult<String> + Send + Sync + 'static,
    ) -> Self {
        self.push_context(name, order, Content::Dynamic, Some(Arc::new(f)));
        self
    }

    fn push_context(&mut self, name: &str, order: i32, text: Content, f: Option<TextFn>) {
        self.contexts.push(f);
        self.declaration.contexts.push(Context {
            name: name.into(),
            order,
            text,
            scope: Scope::Global,
        });
        self.last = Some(Last::Context);
    }

    pub fn variable(mut self, name: &str, value: &str) -> Self {
        self.push_variable(name, Content::Static(value.into()), None);
        self
    }

    pub fn dynamic_variable(
        mut self,
        name: &str,
        f: impl Fn(&Step) -> CallResult<Option<String>> + Send + Sync + 'static,
    ) -> Self {
        self.push_variable(name, Content::Dynamic, Some(Arc::new(f)));
        self
    }

    fn push_variable(&mut self, name: &str, value: Content, f: Option<ValueFn>) {
        self.variables.push(f);
        self.declaration.variables.push(Variable {
            name: name.into(),
            value,
            scope: Scope::Global,
        });
        self.last = Some(Last::Variable);
    }

    pub fn tool(mut self, name: &str, description: &str, parameters: &str) -> Self {
        self.declaration.tools.push(Tool {
            name: name.into(),
            description: description.into(),
            parameters: parameters.into(),
            scope: Scope::Global,
        });
        self.last = Some(Last::Tool);
        self
    }

    /// Chooses per assembly which known tools are shown.
    pub fn show_tools(
        mut self,
        f: impl Fn(&Step) -> CallResult<Vec<String>> + Send + Sync + 'static,
    ) -> Self {
        self.declaration.filters_tools = true;
        self.shown_tools = Some(Arc::new(f));
        self
    }

    /// Puts the contribution added last into `scope`.
    pub fn scoped(mut self, scope: Scope) -> Self {
        let d = &mut self.declaration;
        let target = match self.last {
            Some(Last::Section) => d.sections.last_mut().map(|s| &mut s.scope),
            Some(Last::Context) => d.contexts.last_mut().map(|c| &mut c.scope),
            Some(Last::Variable) => d.variables.last_mut().map(|v| &mut v.scope),
            Some(Last::Tool) => d.tools.last_mut().map(|t| &mut t.scope),
            None => None,
        };
        if let Some(target) = target {
            *target = scope;
        }
        self
    }

    /// Marks the section added last as complete (C1, A3).
    pub fn complete(mut self) -> Self {
        if let (Some(Last::Section), Some(s)) = (self.last, self.declaration.sections.last_mut()) {
            s.complete = true;
        }
        self
    }

    /// Splits into the declaration (data) and the provider (behaviour).
    pub fn build(self) -> (Declaration, Arc<dyn Provider>) {
        let d = &self.declaration;
        let provider = NativeProvider {
            sections: keyed(
                d.sections.iter().map(|s| (&s.name, &s.scope)),
                self.sections,
            ),
            contexts: keyed(
                d.contexts.iter().map(|c| (&c.name, &c.scope)),
                self.contexts,
            ),
            variables: keyed(
                d.variables.iter().map(|v| (&v.name, &v.scope)),
                self.variables,
            ),
            shown_tools: self.shown_tools,
        };
        (self.declaration, Arc::new(provider))
    }
}

/// Pairs each dynamic item's (name, scope) with its callback.
fn keyed<'a, F>(
    keys: impl Iterator<Item = (&'a String, &'a Scope)>,
    fns: Vec<Option<F>>,
) -> BTreeMap<(String, Scope), F> {
    keys.zip(fns)
        .filter_map(|((n, s), f)| f.map(|f| ((n.clone(), s.clone()), f)))
        .collect()
}

struct NativeProvider {
    sections: BTreeMap<(String, Scope), TextFn>,
    contexts: BTreeMap<(String, Scope), TextFn>,
    variables: BTreeMap<(String, Scope), ValueFn>,
    shown_tools: Option<ToolsFn>,
}

fn missing(kind: &str, name: &str) -> CallError {
    CallError::Failed(format!("no dynamic {kind} `{name}`"))
}

impl Provider for NativeProvider {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        let f = self.sections.get(&(name.to_string(), scope.clone()));
        f.ok_or_else(|| missing("section", name))?(step)
    }

    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        let f = self.contexts.get(&(name.to_string(), scope.clone()));
        f.ok_or_else(|| missing("context", name))?(step)
    }

    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>> {
        let f = self.variables.get(&(name.to_string(), scope.clone()));
        f.ok_or_else(|| missing("variable", name))?(step)
    }

    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>> {
        match &self.shown_tools {
            Some(f) => f(step),
            None => Err(CallError::Failed("plugin does not filter tools".into())),
        }
    }
}
