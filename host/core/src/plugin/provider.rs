//! Where contributions come from: the `Provider` trait and its native implementation.
//!
//! A provider answers the dynamic calls of one loaded plugin. The registry holds its
//! `Declaration` (plain data); assembly calls the provider only for dynamic contributions.
//! Two implementations exist: `promptd_engine::WasmProvider` for components and
//! [`NativePlugin`] for built-ins, tests and benchmarks.
//!
//! The types each call takes and returns live here too, review hooks' included ([`ReviewInput`],
//! [`Verdict`]); [`crate::assembly::review`] builds a hook's input and applies its redactions.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::plugin::model::{Content, Context, Declaration, Scope, Section, Step, Tool, Variable};

/// Most redactions one verdict may carry.
pub const MAX_REDACTIONS: usize = 256;
/// Longest `find` or `replace` of one redaction, in bytes.
pub const MAX_REDACTION_BYTES: usize = 64 * 1024;
/// One message of the step under review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewMessage {
    /// `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// Its texts in order (text blocks only; images and documents give none).
    pub texts: Vec<String>,
    /// The call a tool message answers; empty for the other roles.
    pub tool_call_id: String,
}

/// What a hook is shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewInput {
    /// The step's messages, in order.
    pub messages: Vec<ReviewMessage>,
    /// The assembled system prompt.
    pub system: String,
    /// The assembled runtime context, if the agent has one this step.
    pub runtime_context: Option<String>,
    /// The tools shown this step, in order.
    pub tools: Vec<String>,
}

/// Replace every occurrence of `find` by `replace`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Redaction {
    /// The text to find; never empty.
    pub find: String,
    /// What stands in for it.
    pub replace: String,
}

/// What a hook decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The step goes ahead as it is.
    Accept,
    /// The step is refused, for this reason.
    Reject(String),
    /// The step goes ahead with these replacements made in its new user and tool messages.
    Redact(Vec<Redaction>),
}

impl Verdict {
    /// Checks a plugin's verdict against the bounds: an empty `find` would match everywhere,
    /// and an unbounded list or text would let one plugin grow every recorded message.
    pub fn check(&self) -> Result<(), String> {
        let Verdict::Redact(rules) = self else {
            return Ok(());
        };
        if rules.len() > MAX_REDACTIONS {
            return Err(format!(
                "{} redactions, over the limit of {MAX_REDACTIONS}",
                rules.len()
            ));
        }
        for (i, r) in rules.iter().enumerate() {
            if r.find.is_empty() {
                return Err(format!("redaction {}: `find` is empty", i + 1));
            }
            if r.find.len().max(r.replace.len()) > MAX_REDACTION_BYTES {
                return Err(format!(
                    "redaction {}: over the limit of {MAX_REDACTION_BYTES} bytes",
                    i + 1
                ));
            }
        }
        Ok(())
    }
}

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The plugin returned an error result.
    Failed(String),
    /// The plugin trapped (panic, unreachable, time-out, memory cap).
    Trapped(String),
}

impl CallError {
    /// The plugin's message, failed or trapped.
    pub fn cause(&self) -> &str {
        match self {
            CallError::Failed(m) | CallError::Trapped(m) => m,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.cause())
    }
}

/// The result of one plugin call.
pub type CallResult<T> = Result<T, CallError>;

/// A dynamic contribution by its name and declared scope.
pub type Item = (String, Scope);

/// The dynamic values assembly wants of one plugin at one step (world 0.2.0 `wanted`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// The dynamic sections wanted.
    pub sections: Vec<Item>,
    /// The dynamic contexts wanted.
    pub contexts: Vec<Item>,
    /// The dynamic variables wanted.
    pub variables: Vec<Item>,
    /// Whether the plugin's shown tools are wanted.
    pub shown_tools: bool,
}

impl Wanted {
    /// Whether nothing is wanted.
    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
            && self.contexts.is_empty()
            && self.variables.is_empty()
            && !self.shown_tools
    }
}

/// The answer to a [`Wanted`], item by item (same order and lengths); `shown_tools` is some
/// exactly when asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// One result per wanted section.
    pub sections: Vec<CallResult<String>>,
    /// One result per wanted context.
    pub contexts: Vec<CallResult<String>>,
    /// One result per wanted variable; `None` is a value absent this assembly.
    pub variables: Vec<CallResult<Option<String>>>,
    /// The shown tools, when they were wanted.
    pub shown_tools: Option<CallResult<Vec<String>>>,
}

impl Evaluation {
    /// Every item of `wanted` failed with `error` (a failed or trapped `evaluate` call).
    pub fn failed(wanted: &Wanted, error: CallError) -> Self {
        Self {
            sections: vec![Err(error.clone()); wanted.sections.len()],
            contexts: vec![Err(error.clone()); wanted.contexts.len()],
            variables: vec![Err(error.clone()); wanted.variables.len()],
            shown_tools: wanted.shown_tools.then_some(Err(error)),
        }
    }

    /// Checks the shape against `wanted`: a plugin that answers another number of items than
    /// it was asked fails the whole call.
    pub fn check(&self, wanted: &Wanted) -> CallResult<()> {
        let counts = [
            ("sections", self.sections.len(), wanted.sections.len()),
            ("contexts", self.contexts.len(), wanted.contexts.len()),
            ("variables", self.variables.len(), wanted.variables.len()),
        ];
        for (kind, got, asked) in counts {
            if got != asked {
                return Err(CallError::Failed(format!(
                    "evaluate answered {got} {kind} for {asked} asked"
                )));
            }
        }
        if self.shown_tools.is_some() != wanted.shown_tools {
            return Err(CallError::Failed(format!(
                "evaluate {} shown tools when {} asked for them",
                if self.shown_tools.is_some() {
                    "gave"
                } else {
                    "gave no"
                },
                if wanted.shown_tools {
                    "it was"
                } else {
                    "it was not"
                }
            )));
        }
        Ok(())
    }
}

/// `wanted`, answered through `provider`'s per-item methods, one call per item (how a 0.1.0
/// plugin answers a step).
pub fn per_item<P: Provider + ?Sized>(provider: &P, step: &Step, wanted: &Wanted) -> Evaluation {
    Evaluation {
        sections: (wanted.sections.iter())
            .map(|(n, s)| provider.section_text(n, s, step))
            .collect(),
        contexts: (wanted.contexts.iter())
            .map(|(n, s)| provider.context_text(n, s, step))
            .collect(),
        variables: (wanted.variables.iter())
            .map(|(n, s)| provider.variable_value(n, s, step))
            .collect(),
        shown_tools: wanted.shown_tools.then(|| provider.shown_tools(step)),
    }
}

/// The dynamic half of a plugin. Implementations must be callable from several threads.
///
/// A provider either answers item by item (world 0.1.0: the four per-item methods, called
/// lazily, each at most once per assembly) or, when [`Provider::batches`] is true, answers a
/// whole step in one [`Provider::evaluate`] call (world 0.2.0).
pub trait Provider: Send + Sync {
    /// The text of dynamic section `name` in `scope`.
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String>;
    /// The text of dynamic context `name` in `scope`.
    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String>;
    /// The value of dynamic variable `name` in `scope`; `None` when it has none this assembly.
    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>>;
    /// Which of its known tools are shown this step (only if the declaration filters tools).
    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>>;

    /// Whether assembly asks this provider once per step ([`Provider::evaluate`]) instead of
    /// once per contribution.
    fn batches(&self) -> bool {
        false
    }

    /// Every wanted value in one call. The default answers through the per-item methods.
    fn evaluate(&self, step: &Step, wanted: &Wanted) -> CallResult<Evaluation> {
        Ok(per_item(self, step, wanted))
    }

    /// Reviews a session step (only called when the declaration has a `review_order`).
    fn review(&self, _step: &Step, _input: &ReviewInput) -> CallResult<Verdict> {
        Ok(Verdict::Accept)
    }

    /// Failed calls since the last successful one (used to quarantine, L3).
    fn consecutive_failures(&self) -> u32 {
        0
    }
}

type TextFn = Arc<dyn Fn(&Step) -> CallResult<String> + Send + Sync>;
type ValueFn = Arc<dyn Fn(&Step) -> CallResult<Option<String>> + Send + Sync>;
type ToolsFn = Arc<dyn Fn(&Step) -> CallResult<Vec<String>> + Send + Sync>;
type ReviewFn = Arc<dyn Fn(&Step, &ReviewInput) -> CallResult<Verdict> + Send + Sync>;

/// A plugin made of plain Rust values and closures.
///
/// ```
/// use promptd_core::plugin::provider::NativePlugin;
/// use promptd_core::plugin::model::Scope;
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
    review: Option<ReviewFn>,
    batches: bool,
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
    /// A plugin with nothing declared.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a static section.
    pub fn section(mut self, name: &str, order: i32, text: &str) -> Self {
        self.push_section(name, order, Content::Static(text.into()), None);
        self
    }

    /// Adds a section whose text `f` computes at each assembly.
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
            verbatim: false,
            reads: None,
            refresh: None,
        });
        self.last = Some(Last::Section);
    }

    /// Adds a static context.
    pub fn context(mut self, name: &str, order: i32, text: &str) -> Self {
        self.push_context(name, order, Content::Static(text.into()), None);
        self
    }

    /// Adds a context whose text `f` computes at each assembly.
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
            verbatim: false,
            reads: None,
        });
        self.last = Some(Last::Context);
    }

    /// Adds a static variable.
    pub fn variable(mut self, name: &str, value: &str) -> Self {
        self.push_variable(name, Content::Static(value.into()), None);
        self
    }

    /// Adds a variable whose value `f` computes at each assembly.
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
            reads: None,
        });
        self.last = Some(Last::Variable);
    }

    /// Adds a tool; `parameters` is its JSON Schema as text.
    pub fn tool(mut self, name: &str, description: &str, parameters: &str) -> Self {
        self.declaration.tools.push(Tool {
            name: name.into(),
            description: description.into(),
            parameters: parameters.into(),
            scope: Scope::Global,
            refresh: None,
            defer: false,
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

    /// Marks the section or context added last as verbatim: never interpolated.
    pub fn verbatim(mut self) -> Self {
        let d = &mut self.declaration;
        match self.last {
            Some(Last::Section) => d.sections.last_mut().map(|s| s.verbatim = true),
            Some(Last::Context) => d.contexts.last_mut().map(|c| c.verbatim = true),
            _ => None,
        };
        self
    }

    /// Says when a change to the section or tool added last reaches the model (world 0.3.0).
    pub fn refresh(mut self, mode: crate::plugin::model::RefreshMode) -> Self {
        let d = &mut self.declaration;
        match self.last {
            Some(Last::Section) => d.sections.last_mut().map(|s| s.refresh = Some(mode)),
            Some(Last::Tool) => d.tools.last_mut().map(|t| t.refresh = Some(mode)),
            _ => None,
        };
        self
    }

    /// Defers the tool added last (world 0.3.0).
    pub fn deferred(mut self) -> Self {
        if let Some(Last::Tool) = self.last {
            if let Some(t) = self.declaration.tools.last_mut() {
                t.defer = true;
            }
        }
        self
    }

    /// Says what the section, context or variable added last reads (world 0.3.0).
    pub fn reads(mut self, reads: crate::plugin::model::Reads) -> Self {
        let d = &mut self.declaration;
        let slot = match self.last {
            Some(Last::Section) => d.sections.last_mut().map(|s| &mut s.reads),
            Some(Last::Context) => d.contexts.last_mut().map(|c| &mut c.reads),
            Some(Last::Variable) => d.variables.last_mut().map(|v| &mut v.reads),
            _ => None,
        };
        if let Some(slot) = slot {
            *slot = Some(reads);
        }
        self
    }

    /// Reviews every session step with `f`; hooks run by (`order`, plugin id).
    pub fn review(
        mut self,
        order: i32,
        f: impl Fn(&Step, &ReviewInput) -> CallResult<Verdict> + Send + Sync + 'static,
    ) -> Self {
        self.declaration.review_order = Some(order);
        self.review = Some(Arc::new(f));
        self
    }

    /// Answers each step in one [`Provider::evaluate`] call, as a 0.2.0 component does.
    pub fn batched(mut self) -> Self {
        self.batches = true;
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
            review: self.review,
            batches: self.batches,
        };
        (self.declaration, Arc::new(provider))
    }
}

/// Pairs each dynamic item's (name, scope) with its callback, looked up by name first so a
/// call borrows its key rather than building one (this runs for every dynamic item, every step).
fn keyed<'a, F>(
    keys: impl Iterator<Item = (&'a String, &'a Scope)>,
    fns: Vec<Option<F>>,
) -> Callbacks<F> {
    let mut out: Callbacks<F> = BTreeMap::new();
    for ((n, s), f) in keys.zip(fns) {
        if let Some(f) = f {
            out.entry(n.clone()).or_default().push((s.clone(), f));
        }
    }
    out
}

/// A native plugin's callbacks of one kind: by name, then by scope.
type Callbacks<F> = BTreeMap<String, Vec<(Scope, F)>>;

fn callback<'f, F>(fns: &'f Callbacks<F>, name: &str, scope: &Scope) -> Option<&'f F> {
    let by_scope = fns.get(name)?;
    by_scope.iter().find(|(s, _)| s == scope).map(|(_, f)| f)
}

struct NativeProvider {
    sections: Callbacks<TextFn>,
    contexts: Callbacks<TextFn>,
    variables: Callbacks<ValueFn>,
    shown_tools: Option<ToolsFn>,
    review: Option<ReviewFn>,
    batches: bool,
}

fn missing(kind: &str, name: &str) -> CallError {
    CallError::Failed(format!("no dynamic {kind} `{name}`"))
}

impl Provider for NativeProvider {
    fn section_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        let f = callback(&self.sections, name, scope);
        f.ok_or_else(|| missing("section", name))?(step)
    }

    fn context_text(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<String> {
        let f = callback(&self.contexts, name, scope);
        f.ok_or_else(|| missing("context", name))?(step)
    }

    fn variable_value(&self, name: &str, scope: &Scope, step: &Step) -> CallResult<Option<String>> {
        let f = callback(&self.variables, name, scope);
        f.ok_or_else(|| missing("variable", name))?(step)
    }

    fn shown_tools(&self, step: &Step) -> CallResult<Vec<String>> {
        match &self.shown_tools {
            Some(f) => f(step),
            None => Err(CallError::Failed("plugin does not filter tools".into())),
        }
    }

    fn batches(&self) -> bool {
        self.batches
    }

    fn review(&self, step: &Step, input: &ReviewInput) -> CallResult<Verdict> {
        match &self.review {
            Some(f) => f(step, input),
            None => Ok(Verdict::Accept),
        }
    }
}
