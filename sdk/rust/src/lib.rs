//! Write a [promptd](https://example.invalid/promptd) plugin in Rust.
//!
//! A plugin is a function from its config to a [`Plugin`]: a builder of sections, contexts,
//! variables and tools. Static text is sent to the host once, at load; dynamic parts are
//! closures the host calls at each assembly with the [`Step`]. A plugin may also review each
//! session step's new messages ([`Plugin::review`]). You never touch the generated
//! WebAssembly bindings (world `promptd:plugin@0.2.0`).
//!
//! ```no_run
//! use promptd_sdk::{export_plugin, Config, Plugin};
//!
//! fn declare(config: &Config) -> Result<Plugin, String> {
//!     Ok(Plugin::new()
//!         .section("deployment:persona", 0, "You are {{name}}.")
//!         .variable("name", config.get_or("name", "a helpful assistant"))
//!         .dynamic_context("clock", 50, |step| {
//!             Ok(format!("Today is {}.", step.fact("date").unwrap_or("unknown")))
//!         }))
//! }
//!
//! export_plugin!(declare);
//! ```
//!
//! Text the plugin did not write itself (retrieved documents, web pages, tool output) belongs
//! in a [`verbatim`](Plugin::verbatim) section or context: the host never interpolates
//! `{{...}}` in it. A review hook sees the step's new messages and the assembled request, and
//! accepts, rejects or redacts:
//!
//! ```no_run
//! use promptd_sdk::{export_plugin, Config, Plugin, Verdict};
//!
//! fn declare(_config: &Config) -> Result<Plugin, String> {
//!     Ok(Plugin::new()
//!         .dynamic_context("docs:found", 60, |step| {
//!             Ok(step.fact("document").unwrap_or_default().to_string())
//!         })
//!         .verbatim()
//!         .review(0, |_step, input| {
//!             Ok(if input.any_text_contains("password") {
//!                 Verdict::redact([("password", "[redacted]")])
//!             } else {
//!                 Verdict::Accept
//!             })
//!         }))
//! }
//!
//! export_plugin!(declare);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2`; the `.wasm` file in
//! `target/wasm32-wasip2/release/` is the plugin. Its id is the file name without `.wasm`.

// Lets the generated bindings name this crate the same way from inside and from plugins.
extern crate self as promptd_sdk;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

#[doc(hidden)]
// The generated export glue takes `evaluate`'s and `review`'s records as flat arguments.
#[allow(clippy::too_many_arguments)]
pub mod __private {
    pub use wit_bindgen;

    wit_bindgen::generate!({
        path: "../../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_bindings",
        default_bindings_module: "promptd_sdk::__private",
        runtime_path: "promptd_sdk::__private::wit_bindgen::rt",
    });

    pub use self::promptd::plugin::types as wit;
    pub use crate::runtime::*;
}

mod runtime;

/// Plugin config: the key/value strings of the plugin's `[plugins.NAME] config` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    values: BTreeMap<String, String>,
}

impl Config {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value of `key`, or `default` when the config does not set it.
    pub fn get_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    /// All values, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// What the host knows about the step being assembled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The agent the request is for.
    pub agent: String,
    /// `global`, the agent's ancestors, the agent.
    pub scope_chain: Vec<String>,
    /// The session id; empty outside a session.
    pub session_id: String,
    /// The step number in the session (from 1); 0 outside a session.
    pub step_number: u64,
    /// Step facts from the client (cwd, git branch…), sorted by key: those the wanted
    /// contributions read ([`Reads`]).
    pub facts: BTreeMap<String, String>,
    /// The session's last user message's text, when a wanted contribution reads it
    /// ([`Input::LastUserMessage`]) and there is one.
    pub last_user_message: Option<String>,
    /// The model the request is for, when read ([`Input::Model`]) and known.
    pub model: Option<String>,
    /// The names of the tools the client sent (through the gateway), when read
    /// ([`Input::ClientTools`]).
    pub client_tools: Option<Vec<String>>,
    /// The session's user messages so far, this step's included, when read
    /// ([`Input::TurnCount`]).
    pub turn_count: Option<u64>,
}

/// A request input a dynamic contribution may read besides its facts ([`Reads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Input {
    /// The text of the session's last user message.
    LastUserMessage,
    /// The model the request is for.
    Model,
    /// The names of the tools the client sent.
    ClientTools,
    /// The step's number ([`Step::step_number`] is 0 unless read).
    StepNumber,
    /// How many user messages the session holds.
    TurnCount,
}

/// What a dynamic contribution reads of a step: it is shown only these, and in a session the
/// host asks it again only when one of them changed (unless [`Reads::volatile`]); otherwise its
/// last answer stands without a call.
///
/// ```
/// # use promptd_sdk::{Input, Plugin, Reads};
/// let plugin = Plugin::new()
///     .dynamic_context("docs:found", 60, |step| {
///         Ok(format!("Asked: {}", step.last_user_message.as_deref().unwrap_or("")))
///     })
///     .reads(Reads::facts(["query"]).input(Input::LastUserMessage));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// The facts it reads, by name.
    pub facts: Vec<String>,
    /// The request inputs it reads.
    pub inputs: Vec<Input>,
    /// Asked at every step all the same: its answer depends on something else too (the
    /// clock, a file).
    pub volatile: bool,
}

impl Reads {
    /// Reads nothing: asked once per session (and again only if volatile).
    pub fn nothing() -> Self {
        Self::default()
    }

    /// Reads these facts.
    pub fn facts<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Reads {
            facts: names.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Reads fact `name` too.
    pub fn fact(mut self, name: impl Into<String>) -> Self {
        self.facts.push(name.into());
        self
    }

    /// Reads `input` too.
    pub fn input(mut self, input: Input) -> Self {
        self.inputs.push(input);
        self
    }

    /// Asked at every step, whether or not what it reads changed.
    pub fn volatile(mut self) -> Self {
        self.volatile = true;
        self
    }
}

/// When a change to a section's or tool's text may reach the model. The operator's
/// `[plugins.ID] refresh` overrides what the plugin says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// At the session's next step (the default).
    Step,
    /// At the session's next cache-cold point, or after `max_stale_s`: for catalogues,
    /// references, descriptions the model can do without for a while.
    Boundary,
    /// Never within a session: a session keeps what it was first sent.
    Session,
}

impl Step {
    /// One step fact, if the client sent it.
    pub fn fact(&self, key: &str) -> Option<&str> {
        self.facts.get(key).map(String::as_str)
    }
}

/// The result of a dynamic callback; an `Err` fails the assembly with that message (or omits
/// the plugin if the host config marks it optional).
pub type CallResult<T> = Result<T, String>;

type TextFn = Rc<dyn Fn(&Step) -> CallResult<String>>;
type ValueFn = Rc<dyn Fn(&Step) -> CallResult<Option<String>>>;
type ToolsFn = Rc<dyn Fn(&Step) -> CallResult<Vec<String>>>;
type ObserveFn = Rc<dyn Fn(&Step, &Wanted)>;
type ReviewFn = Rc<dyn Fn(&Step, &ReviewInput) -> CallResult<Verdict>>;

/// Where a contribution is visible: every agent, or one agent and those below it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Global,
    Agent(String),
}

/// A dynamic contribution the host wants this step: its name and the scope it was declared
/// with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedItem {
    pub name: String,
    pub scope: Scope,
}

/// The dynamic contributions the host wants at one step, in the host's canonical order, as
/// [`Plugin::before_evaluate`] observers see them. Only effective contributions are listed
/// (never one a nearer scope shadows, never a context when the agent has no runtime context).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    pub sections: Vec<WantedItem>,
    pub contexts: Vec<WantedItem>,
    pub variables: Vec<WantedItem>,
    /// Whether the host asks which known tools are shown (only when the plugin has
    /// [`Plugin::show_tools`]).
    pub shown_tools: bool,
}

/// One message the client sent this step, as a review sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// `user`, `assistant` or `tool`.
    pub role: String,
    /// Its texts in order: a text content is one entry, a block content gives one entry per
    /// text block (images and documents give none), an assistant's reply gives its text (empty
    /// when it only calls tools).
    pub texts: Vec<String>,
    /// The call a `tool` message answers; empty for the other roles.
    pub tool_call_id: String,
}

/// What a review is shown: the step's new messages and what assembly made of the step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReviewInput {
    pub messages: Vec<Message>,
    /// The assembled system prompt.
    pub system: String,
    /// The assembled runtime context snapshot, if any.
    pub runtime_context: Option<String>,
    /// The names of the tools shown this step, in order.
    pub tools: Vec<String>,
}

impl ReviewInput {
    /// Every text of every message, in order.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        self.messages
            .iter()
            .flat_map(|m| m.texts.iter().map(String::as_str))
    }

    /// Whether any text of any message contains `needle`.
    pub fn any_text_contains(&self, needle: &str) -> bool {
        self.texts().any(|t| t.contains(needle))
    }
}

/// Replace every occurrence of `find` (non-empty) by `replace`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redaction {
    pub find: String,
    pub replace: String,
}

impl Redaction {
    pub fn new(find: impl Into<String>, replace: impl Into<String>) -> Self {
        Self {
            find: find.into(),
            replace: replace.into(),
        }
    }
}

/// What a review decides.
///
/// ```
/// use promptd_sdk::Verdict;
///
/// let ok = Verdict::accept();
/// let no = Verdict::reject("the step mentions a secret");
/// let masked = Verdict::redact([("hunter2", "[redacted]")]);
/// # assert_eq!(ok, Verdict::Accept);
/// # assert_eq!(no, Verdict::Reject("the step mentions a secret".into()));
/// # assert_eq!(masked.redactions().len(), 1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The step goes on unchanged.
    Accept,
    /// The step fails (the client gets HTTP 422 naming the plugin and this reason); nothing is
    /// recorded.
    Reject(String),
    /// The step goes on with these replacements made, in order, in the texts of its new `user`
    /// and `tool` messages before they are recorded and sent. The model's replies are not
    /// changed.
    Redact(Vec<Redaction>),
}

impl Verdict {
    /// [`Verdict::Accept`].
    pub fn accept() -> Self {
        Verdict::Accept
    }

    /// [`Verdict::Reject`] with `reason`.
    pub fn reject(reason: impl Into<String>) -> Self {
        Verdict::Reject(reason.into())
    }

    /// [`Verdict::Redact`] from `(find, replace)` pairs, applied in order.
    pub fn redact<F: Into<String>, R: Into<String>>(
        pairs: impl IntoIterator<Item = (F, R)>,
    ) -> Self {
        Verdict::Redact(
            pairs
                .into_iter()
                .map(|(find, replace)| Redaction::new(find, replace))
                .collect(),
        )
    }

    /// The redactions of a [`Verdict::Redact`]; empty for the other verdicts.
    pub fn redactions(&self) -> &[Redaction] {
        match self {
            Verdict::Redact(r) => r,
            _ => &[],
        }
    }
}

#[derive(Clone, Copy)]
enum Last {
    Section(usize),
    Context(usize),
    Variable(usize),
    Tool(usize),
}

pub(crate) enum Text {
    Static(String),
    Dynamic(TextFn),
}

pub(crate) enum Value {
    Static(String),
    Dynamic(ValueFn),
}

pub(crate) struct SectionItem {
    pub name: String,
    pub order: i32,
    pub text: Text,
    pub complete: bool,
    pub scope: Scope,
    pub verbatim: bool,
    pub reads: Option<Reads>,
    pub refresh: Option<Refresh>,
}

pub(crate) struct ContextItem {
    pub name: String,
    pub order: i32,
    pub text: Text,
    pub scope: Scope,
    pub verbatim: bool,
    pub reads: Option<Reads>,
}

pub(crate) struct VariableItem {
    pub name: String,
    pub value: Value,
    pub scope: Scope,
    pub reads: Option<Reads>,
}

pub(crate) struct ToolItem {
    pub name: String,
    pub description: String,
    pub parameters: String,
    pub scope: Scope,
    pub refresh: Option<Refresh>,
    pub defer: bool,
}

/// Everything a plugin contributes. Methods add one item each; [`Plugin::scope`],
/// [`Plugin::complete`] and [`Plugin::verbatim`] change the item added last.
#[derive(Default)]
pub struct Plugin {
    pub(crate) sections: Vec<SectionItem>,
    pub(crate) contexts: Vec<ContextItem>,
    pub(crate) variables: Vec<VariableItem>,
    pub(crate) tools: Vec<ToolItem>,
    pub(crate) shown_tools: Option<ToolsFn>,
    pub(crate) observers: Vec<ObserveFn>,
    pub(crate) review: Option<(i32, ReviewFn)>,
    pub(crate) reads: Option<Reads>,
    last: Option<Last>,
    pub(crate) misuse: Option<String>,
}

impl Plugin {
    pub fn new() -> Self {
        Self::default()
    }

    /// A static section of the system prompt. `{{name}}` references are interpolated by the
    /// host. Conventional orders: identity -100, persona 0, tool guidance 100..199.
    pub fn section(self, name: &str, order: i32, text: impl Into<String>) -> Self {
        self.push_section(name, order, Text::Static(text.into()))
    }

    /// A section whose text `f` computes at each assembly.
    pub fn dynamic_section(
        self,
        name: &str,
        order: i32,
        f: impl Fn(&Step) -> CallResult<String> + 'static,
    ) -> Self {
        self.push_section(name, order, Text::Dynamic(Rc::new(f)))
    }

    fn push_section(mut self, name: &str, order: i32, text: Text) -> Self {
        self.sections.push(SectionItem {
            name: name.into(),
            order,
            text,
            complete: false,
            scope: Scope::Global,
            verbatim: false,
            reads: None,
            refresh: None,
        });
        self.last = Some(Last::Section(self.sections.len() - 1));
        self
    }

    /// A static part of the runtime context snapshot (sent as a user message, not system).
    pub fn context(self, name: &str, order: i32, text: impl Into<String>) -> Self {
        self.push_context(name, order, Text::Static(text.into()))
    }

    /// A runtime context part computed at each assembly; an empty string contributes nothing.
    pub fn dynamic_context(
        self,
        name: &str,
        order: i32,
        f: impl Fn(&Step) -> CallResult<String> + 'static,
    ) -> Self {
        self.push_context(name, order, Text::Dynamic(Rc::new(f)))
    }

    fn push_context(mut self, name: &str, order: i32, text: Text) -> Self {
        self.contexts.push(ContextItem {
            name: name.into(),
            order,
            text,
            scope: Scope::Global,
            verbatim: false,
            reads: None,
        });
        self.last = Some(Last::Context(self.contexts.len() - 1));
        self
    }

    /// A variable for `{{name}}`; names match `^[a-z][a-z0-9_]*$`.
    pub fn variable(self, name: &str, value: impl Into<String>) -> Self {
        self.push_variable(name, Value::Static(value.into()))
    }

    /// A variable computed when referenced; `Ok(None)` means "no value this assembly", which
    /// is an error only if some text references it.
    pub fn dynamic_variable(
        self,
        name: &str,
        f: impl Fn(&Step) -> CallResult<Option<String>> + 'static,
    ) -> Self {
        self.push_variable(name, Value::Dynamic(Rc::new(f)))
    }

    fn push_variable(mut self, name: &str, value: Value) -> Self {
        self.variables.push(VariableItem {
            name: name.into(),
            value,
            scope: Scope::Global,
            reads: None,
        });
        self.last = Some(Last::Variable(self.variables.len() - 1));
        self
    }

    /// A tool the plugin knows. `parameters` is a JSON Schema object as JSON text.
    pub fn tool(mut self, name: &str, description: &str, parameters: &str) -> Self {
        self.tools.push(ToolItem {
            name: name.into(),
            description: description.into(),
            parameters: parameters.into(),
            scope: Scope::Global,
            refresh: None,
            defer: false,
        });
        self.last = Some(Last::Tool(self.tools.len() - 1));
        self
    }

    /// Chooses, per assembly, which known tools are shown (by name). Without it, all are.
    pub fn show_tools(mut self, f: impl Fn(&Step) -> CallResult<Vec<String>> + 'static) -> Self {
        self.shown_tools = Some(Rc::new(f));
        self
    }

    /// Makes the item added last visible only to `agent` (and agents below it).
    pub fn scope(mut self, agent: &str) -> Self {
        let scope = Scope::Agent(agent.into());
        match self.last {
            Some(Last::Section(i)) => self.sections[i].scope = scope,
            Some(Last::Context(i)) => self.contexts[i].scope = scope,
            Some(Last::Variable(i)) => self.variables[i].scope = scope,
            Some(Last::Tool(i)) => self.tools[i].scope = scope,
            None => self.misuse = Some("scope() called before any item was added".into()),
        }
        self
    }

    /// Marks the section added last as complete: it replaces every other section.
    pub fn complete(mut self) -> Self {
        match self.last {
            Some(Last::Section(i)) => self.sections[i].complete = true,
            _ => self.misuse = Some("complete() applies to a section only".into()),
        }
        self
    }

    /// Marks the section or context added last as verbatim: the host uses its text exactly as
    /// given and never interpolates `{{...}}` in it, so it can never pull a variable (a secret)
    /// into the prompt. For text the plugin did not write itself: retrieved documents, web
    /// pages, tool output.
    ///
    /// ```
    /// # use promptd_sdk::Plugin;
    /// let plugin = Plugin::new()
    ///     .context("notes:raw", 35, "Kept as written: {{not_a_variable}}")
    ///     .verbatim()
    ///     .dynamic_section("notes:page", 30, |step| {
    ///         Ok(step.fact("page").unwrap_or_default().to_string())
    ///     })
    ///     .verbatim();
    /// ```
    pub fn verbatim(mut self) -> Self {
        match self.last {
            Some(Last::Section(i)) => self.sections[i].verbatim = true,
            Some(Last::Context(i)) => self.contexts[i].verbatim = true,
            _ => self.misuse = Some("verbatim() applies to a section or a context only".into()),
        }
        self
    }

    /// Says what the dynamic section, context or variable added last reads ([`Reads`]): the
    /// step it is shown holds only that, and in a session it is asked again only when that
    /// changed. Without it, the plugin's [`Plugin::reads_by_default`], else the whole step at
    /// every step.
    pub fn reads(mut self, reads: Reads) -> Self {
        let dynamic = match self.last {
            Some(Last::Section(i)) => matches!(self.sections[i].text, Text::Dynamic(_))
                .then(|| &mut self.sections[i].reads),
            Some(Last::Context(i)) => matches!(self.contexts[i].text, Text::Dynamic(_))
                .then(|| &mut self.contexts[i].reads),
            Some(Last::Variable(i)) => matches!(self.variables[i].value, Value::Dynamic(_))
                .then(|| &mut self.variables[i].reads),
            _ => None,
        };
        match dynamic {
            Some(slot) => *slot = Some(reads),
            None => {
                self.misuse =
                    Some("reads() applies to a dynamic section, context or variable only".into())
            }
        }
        self
    }

    /// What the plugin's dynamic contributions read unless one says ([`Plugin::reads`]), and
    /// what its tool filter ([`Plugin::show_tools`]) reads.
    pub fn reads_by_default(mut self, reads: Reads) -> Self {
        self.reads = Some(reads);
        self
    }

    /// When a change to the section or tool added last may reach the model ([`Refresh`]).
    ///
    /// ```
    /// # use promptd_sdk::{Plugin, Refresh};
    /// let plugin = Plugin::new()
    ///     .section("skills:catalogue", 120, "Skills: review, release.")
    ///     .refresh(Refresh::Boundary)
    ///     .tool("search", "Searches the notes.", r#"{"type":"object"}"#)
    ///     .defer();
    /// ```
    pub fn refresh(mut self, refresh: Refresh) -> Self {
        match self.last {
            Some(Last::Section(i)) => self.sections[i].refresh = Some(refresh),
            Some(Last::Tool(i)) => self.tools[i].refresh = Some(refresh),
            _ => self.misuse = Some("refresh() applies to a section or a tool only".into()),
        }
        self
    }

    /// Defers the tool added last: sent for the provider's tool search to find, not in every
    /// request's cached prefix.
    pub fn defer(mut self) -> Self {
        match self.last {
            Some(Last::Tool(i)) => self.tools[i].defer = true,
            _ => self.misuse = Some("defer() applies to a tool only".into()),
        }
        self
    }

    /// Calls `f` at the start of each evaluation with the step and the dynamic contributions
    /// the host wants this step, before any of their closures: for a plugin that fetches
    /// everything it needs at once. Observers run in the order they were added.
    ///
    /// ```
    /// # use promptd_sdk::Plugin;
    /// let plugin = Plugin::new()
    ///     .before_evaluate(|step, wanted| {
    ///         let names: Vec<&str> = wanted.sections.iter().map(|i| i.name.as_str()).collect();
    ///         promptd_sdk::log::debug(&format!("step {}: {}", step.step_number, names.join(",")));
    ///     });
    /// ```
    pub fn before_evaluate(mut self, f: impl Fn(&Step, &Wanted) + 'static) -> Self {
        self.observers.push(Rc::new(f));
        self
    }

    /// Reviews every session step after assembly: `f` sees the step's new messages and the
    /// assembled request and returns a [`Verdict`]. Hooks of all plugins run one after another,
    /// sorted by (`order`, plugin id). An `Err` (or a panic) fails the step with its message.
    /// One review hook per plugin.
    ///
    /// ```
    /// # use promptd_sdk::{Plugin, Verdict};
    /// let plugin = Plugin::new().review(0, |_step, input| {
    ///     Ok(if input.any_text_contains("forbidden") {
    ///         Verdict::reject("the step mentions \"forbidden\"")
    ///     } else if input.any_text_contains("hunter2") {
    ///         Verdict::redact([("hunter2", "[redacted]")])
    ///     } else {
    ///         Verdict::Accept
    ///     })
    /// });
    /// ```
    pub fn review(
        mut self,
        order: i32,
        f: impl Fn(&Step, &ReviewInput) -> CallResult<Verdict> + 'static,
    ) -> Self {
        if self.review.is_some() {
            self.misuse = Some("review() called twice: a plugin has one review hook".into());
        }
        self.review = Some((order, Rc::new(f)));
        self
    }
}

/// Writes a line to the host's log, tagged with this plugin's id.
pub mod log {
    use crate::__private::promptd::plugin::host;
    use crate::__private::wit::Level;

    pub fn debug(message: &str) {
        host::log(Level::Debug, message);
    }
    pub fn info(message: &str) {
        host::log(Level::Info, message);
    }
    pub fn warn(message: &str) {
        host::log(Level::Warn, message);
    }
    pub fn error(message: &str) {
        host::log(Level::Error, message);
    }
}

/// Exports `declare` (a `fn(&Config) -> Result<Plugin, String>`) as this component's plugin.
#[macro_export]
macro_rules! export_plugin {
    ($declare:path) => {
        struct __PromptdPlugin;

        impl $crate::__private::Guest for __PromptdPlugin {
            fn declare(
                config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::std::result::Result<$crate::__private::wit::Declaration, ::std::string::String>
            {
                $crate::__private::declare(config, $declare)
            }
            fn evaluate(
                step: $crate::__private::wit::Step,
                wanted: $crate::__private::wit::Wanted,
            ) -> ::std::result::Result<$crate::__private::wit::Evaluation, ::std::string::String>
            {
                $crate::__private::evaluate(step, wanted)
            }
            fn review(
                step: $crate::__private::wit::Step,
                input: $crate::__private::wit::ReviewInput,
            ) -> ::std::result::Result<$crate::__private::wit::Verdict, ::std::string::String> {
                $crate::__private::review(step, input)
            }
        }

        $crate::__private::__export_bindings!(__PromptdPlugin);
    };
}

thread_local! {
    /// The plugin built by the last `declare`; dynamic calls look their closures up here.
    pub(crate) static PLUGIN: RefCell<Option<Rc<Plugin>>> = const { RefCell::new(None) };
}
