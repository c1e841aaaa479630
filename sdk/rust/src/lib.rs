//! Write a [promptd](https://example.invalid/promptd) plugin in Rust.
//!
//! A plugin is a function from its config to a [`Plugin`]: a builder of sections, contexts,
//! variables and tools. Static text is sent to the host once, at load; dynamic parts are
//! closures the host calls at each assembly with the [`Step`]. You never touch the generated
//! WebAssembly bindings.
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
//! Build with `cargo build --release --target wasm32-wasip2`; the `.wasm` file in
//! `target/wasm32-wasip2/release/` is the plugin. Its id is the file name without `.wasm`.

// Lets the generated bindings name this crate the same way from inside and from plugins.
extern crate self as promptd_sdk;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

#[doc(hidden)]
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
    /// Step facts from the client (cwd, git branch…), sorted by key.
    pub facts: BTreeMap<String, String>,
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

/// Where a contribution is visible: every agent, or one agent and those below it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Global,
    Agent(String),
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
}

pub(crate) struct ContextItem {
    pub name: String,
    pub order: i32,
    pub text: Text,
    pub scope: Scope,
}

pub(crate) struct VariableItem {
    pub name: String,
    pub value: Value,
    pub scope: Scope,
}

pub(crate) struct ToolItem {
    pub name: String,
    pub description: String,
    pub parameters: String,
    pub scope: Scope,
}

/// Everything a plugin contributes. Methods add one item each; [`Plugin::scope`] and
/// [`Plugin::complete`] change the item added last.
#[derive(Default)]
pub struct Plugin {
    pub(crate) sections: Vec<SectionItem>,
    pub(crate) contexts: Vec<ContextItem>,
    pub(crate) variables: Vec<VariableItem>,
    pub(crate) tools: Vec<ToolItem>,
    pub(crate) shown_tools: Option<ToolsFn>,
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
            ) -> ::std::result::Result<
                $crate::__private::wit::Declaration,
                ::std::string::String,
            > {
                $crate::__private::declare(config, $declare)
            }
            fn section_text(
                name: ::std::string::String,
                scope: $crate::__private::wit::Scope,
                step: $crate::__private::wit::Step,
            ) -> ::std::result::Result<::std::string::String, ::std::string::String> {
                $crate::__private::section_text(name, scope, step)
            }
            fn context_text(
                name: ::std::string::String,
                scope: $crate::__private::wit::Scope,
                step: $crate::__private::wit::Step,
            ) -> ::std::result::Result<::std::string::String, ::std::string::String> {
                $crate::__private::context_text(name, scope, step)
            }
            fn variable_value(
                name: ::std::string::String,
                scope: $crate::__private::wit::Scope,
                step: $crate::__private::wit::Step,
            ) -> ::std::result::Result<
                ::std::option::Option<::std::string::String>,
                ::std::string::String,
            > {
                $crate::__private::variable_value(name, scope, step)
            }
            fn shown_tools(
                step: $crate::__private::wit::Step,
            ) -> ::std::result::Result<
                ::std::vec::Vec<::std::string::String>,
                ::std::string::String,
            > {
                $crate::__private::shown_tools(step)
            }
        }

        $crate::__private::__export_bindings!(__PromptdPlugin);
    };
}

thread_local! {
    /// The plugin built by the last `declare`; dynamic calls look their closures up here.
    pub(crate) static PLUGIN: RefCell<Option<Rc<Plugin>>> = const { RefCell::new(None) };
}
