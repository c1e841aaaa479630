//! The glue between the generated bindings and [`Plugin`]. Used by `export_plugin!` only.

use std::rc::Rc;

use crate::__private::wit;
use crate::{Config, Plugin, Scope, Step, Text, Value, PLUGIN};

fn scope_to_wit(s: &Scope) -> wit::Scope {
    match s {
        Scope::Global => wit::Scope::Global,
        Scope::Agent(a) => wit::Scope::Agent(a.clone()),
    }
}

fn scope_from_wit(s: wit::Scope) -> Scope {
    match s {
        wit::Scope::Global => Scope::Global,
        wit::Scope::Agent(a) => Scope::Agent(a),
    }
}

fn step_from_wit(s: wit::Step) -> Step {
    Step {
        agent: s.agent,
        scope_chain: s.scope_chain,
        session_id: s.session_id,
        step_number: s.step_number,
        facts: s.facts.into_iter().collect(),
    }
}

fn text_to_wit(t: &Text) -> wit::Content {
    match t {
        Text::Static(s) => wit::Content::StaticText(s.clone()),
        Text::Dynamic(_) => wit::Content::Dynamic,
    }
}

pub fn declare(
    config: Vec<(String, String)>,
    f: fn(&Config) -> Result<Plugin, String>,
) -> Result<wit::Declaration, String> {
    // A panic traps the instance; send its message to the host first, so the trap says why.
    std::panic::set_hook(Box::new(|info| {
        crate::log::error(&format!("panic: {info}"))
    }));
    let config = Config {
        values: config.into_iter().collect(),
    };
    let plugin = f(&config)?;
    if let Some(misuse) = &plugin.misuse {
        return Err(misuse.clone());
    }
    let declaration = wit::Declaration {
        sections: plugin
            .sections
            .iter()
            .map(|s| wit::Section {
                name: s.name.clone(),
                order: s.order,
                text: text_to_wit(&s.text),
                complete: s.complete,
                scope: scope_to_wit(&s.scope),
            })
            .collect(),
        contexts: plugin
            .contexts
            .iter()
            .map(|c| wit::Context {
                name: c.name.clone(),
                order: c.order,
                text: text_to_wit(&c.text),
                scope: scope_to_wit(&c.scope),
            })
            .collect(),
        variables: plugin
            .variables
            .iter()
            .map(|v| wit::Variable {
                name: v.name.clone(),
                value: match &v.value {
                    Value::Static(s) => wit::Content::StaticText(s.clone()),
                    Value::Dynamic(_) => wit::Content::Dynamic,
                },
                scope: scope_to_wit(&v.scope),
            })
            .collect(),
        tools: plugin
            .tools
            .iter()
            .map(|t| wit::Tool {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
                scope: scope_to_wit(&t.scope),
            })
            .collect(),
        filters_tools: plugin.shown_tools.is_some(),
    };
    PLUGIN.with(|p| *p.borrow_mut() = Some(Rc::new(plugin)));
    Ok(declaration)
}

fn current() -> Result<Rc<Plugin>, String> {
    PLUGIN
        .with(|p| p.borrow().clone())
        .ok_or_else(|| "the plugin was called before declare".to_string())
}

fn not_dynamic(kind: &str, name: &str) -> String {
    format!("no dynamic {kind} `{name}` is declared")
}

pub fn section_text(name: String, scope: wit::Scope, step: wit::Step) -> Result<String, String> {
    let plugin = current()?;
    let scope = scope_from_wit(scope);
    let item = plugin
        .sections
        .iter()
        .find(|s| s.name == name && s.scope == scope);
    match item.map(|s| &s.text) {
        Some(Text::Dynamic(f)) => f(&step_from_wit(step)),
        _ => Err(not_dynamic("section", &name)),
    }
}

pub fn context_text(name: String, scope: wit::Scope, step: wit::Step) -> Result<String, String> {
    let plugin = current()?;
    let scope = scope_from_wit(scope);
    let item = plugin
        .contexts
        .iter()
        .find(|c| c.name == name && c.scope == scope);
    match item.map(|c| &c.text) {
        Some(Text::Dynamic(f)) => f(&step_from_wit(step)),
        _ => Err(not_dynamic("context", &name)),
    }
}

pub fn variable_value(
    name: String,
    scope: wit::Scope,
    step: wit::Step,
) -> Result<Option<String>, String> {
    let plugin = current()?;
    let scope = scope_from_wit(scope);
    let item = plugin
        .variables
        .iter()
        .find(|v| v.name == name && v.scope == scope);
    match item.map(|v| &v.value) {
        Some(Value::Dynamic(f)) => f(&step_from_wit(step)),
        _ => Err(not_dynamic("variable", &name)),
    }
}

pub fn shown_tools(step: wit::Step) -> Result<Vec<String>, String> {
    let plugin = current()?;
    match &plugin.shown_tools {
        Some(f) => f(&step_from_wit(step)),
        None => Err("this plugin does not filter its tools".into()),
    }
}
