//! The glue between the generated bindings and [`Plugin`]. Used by `export_plugin!` only.

use std::rc::Rc;

use crate::__private::wit;
use crate::{
    Config, Input, Message, Plugin, Reads, Refresh, ReviewInput, Scope, Step, Text, Value, Verdict,
    Wanted, WantedItem, PLUGIN,
};

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
        last_user_message: s.last_user_message,
        model: s.model,
        client_tools: s.client_tools,
        turn_count: s.turn_count,
    }
}

fn reads_to_wit(r: &Reads) -> wit::Reads {
    let mut inputs = wit::Inputs::empty();
    for input in &r.inputs {
        inputs = inputs
            | (match input {
                Input::LastUserMessage => wit::Inputs::LAST_USER_MESSAGE,
                Input::Model => wit::Inputs::MODEL,
                Input::ClientTools => wit::Inputs::CLIENT_TOOLS,
                Input::StepNumber => wit::Inputs::STEP_NUMBER,
                Input::TurnCount => wit::Inputs::TURN_COUNT,
            });
    }
    wit::Reads {
        facts: r.facts.clone(),
        inputs,
        volatile: r.volatile,
    }
}

fn refresh_to_wit(r: Refresh) -> wit::Refresh {
    match r {
        Refresh::Step => wit::Refresh::Step,
        Refresh::Boundary => wit::Refresh::Boundary,
        Refresh::Session => wit::Refresh::Session,
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
    // (Only in a component: the native unit tests have no host to log to.)
    #[cfg(target_family = "wasm")]
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
                verbatim: s.verbatim,
                reads: s.reads.as_ref().map(reads_to_wit),
                refresh: s.refresh.map(refresh_to_wit),
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
                verbatim: c.verbatim,
                reads: c.reads.as_ref().map(reads_to_wit),
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
                reads: v.reads.as_ref().map(reads_to_wit),
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
                refresh: t.refresh.map(refresh_to_wit),
                defer: t.defer,
            })
            .collect(),
        filters_tools: plugin.shown_tools.is_some(),
        review_order: plugin.review.as_ref().map(|(order, _)| *order),
        reads: plugin.reads.as_ref().map(reads_to_wit),
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

fn items_from_wit(items: Vec<wit::Item>) -> Vec<WantedItem> {
    items
        .into_iter()
        .map(|i| WantedItem {
            name: i.name,
            scope: scope_from_wit(i.scope),
        })
        .collect()
}

fn section_text(plugin: &Plugin, item: &WantedItem, step: &Step) -> Result<String, String> {
    let found = plugin
        .sections
        .iter()
        .find(|s| s.name == item.name && s.scope == item.scope);
    match found.map(|s| &s.text) {
        Some(Text::Dynamic(f)) => f(step),
        _ => Err(not_dynamic("section", &item.name)),
    }
}

fn context_text(plugin: &Plugin, item: &WantedItem, step: &Step) -> Result<String, String> {
    let found = plugin
        .contexts
        .iter()
        .find(|c| c.name == item.name && c.scope == item.scope);
    match found.map(|c| &c.text) {
        Some(Text::Dynamic(f)) => f(step),
        _ => Err(not_dynamic("context", &item.name)),
    }
}

fn variable_value(
    plugin: &Plugin,
    item: &WantedItem,
    step: &Step,
) -> Result<Option<String>, String> {
    let found = plugin
        .variables
        .iter()
        .find(|v| v.name == item.name && v.scope == item.scope);
    match found.map(|v| &v.value) {
        Some(Value::Dynamic(f)) => f(step),
        _ => Err(not_dynamic("variable", &item.name)),
    }
}

fn shown_tools(plugin: &Plugin, step: &Step) -> Result<Vec<String>, String> {
    match &plugin.shown_tools {
        Some(f) => f(step),
        None => Err("this plugin does not filter its tools".into()),
    }
}

/// Answers every wanted item by the closure registered for its (name, scope), in order: each
/// item gets exactly what the 0.1.0 per-item export gave (its value, or the same error).
pub fn evaluate(step: wit::Step, wanted: wit::Wanted) -> Result<wit::Evaluation, String> {
    let plugin = current()?;
    let step = step_from_wit(step);
    let wanted = Wanted {
        sections: items_from_wit(wanted.sections),
        contexts: items_from_wit(wanted.contexts),
        variables: items_from_wit(wanted.variables),
        shown_tools: wanted.shown_tools,
    };
    for observe in &plugin.observers {
        observe(&step, &wanted);
    }
    Ok(wit::Evaluation {
        sections: wanted
            .sections
            .iter()
            .map(|i| section_text(&plugin, i, &step))
            .collect(),
        contexts: wanted
            .contexts
            .iter()
            .map(|i| context_text(&plugin, i, &step))
            .collect(),
        variables: wanted
            .variables
            .iter()
            .map(|i| variable_value(&plugin, i, &step))
            .collect(),
        shown_tools: wanted.shown_tools.then(|| shown_tools(&plugin, &step)),
    })
}

fn review_input_from_wit(input: wit::ReviewInput) -> ReviewInput {
    ReviewInput {
        messages: input
            .messages
            .into_iter()
            .map(|m| Message {
                role: m.role,
                texts: m.texts,
                tool_call_id: m.tool_call_id,
            })
            .collect(),
        system: input.system,
        runtime_context: input.runtime_context,
        tools: input.tools,
    }
}

fn verdict_to_wit(v: Verdict) -> wit::Verdict {
    match v {
        Verdict::Accept => wit::Verdict::Accept,
        Verdict::Reject(reason) => wit::Verdict::Reject(reason),
        Verdict::Redact(redactions) => wit::Verdict::Redact(
            redactions
                .into_iter()
                .map(|r| wit::Redaction {
                    find: r.find,
                    replace: r.replace,
                })
                .collect(),
        ),
    }
}

/// Runs the review hook; a plugin without one accepts (the host never calls it then).
pub fn review(step: wit::Step, input: wit::ReviewInput) -> Result<wit::Verdict, String> {
    let plugin = current()?;
    match &plugin.review {
        Some((_, f)) => f(&step_from_wit(step), &review_input_from_wit(input)).map(verdict_to_wit),
        None => Ok(wit::Verdict::Accept),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::Redaction;

    fn wit_step() -> wit::Step {
        wit::Step {
            agent: "coder".into(),
            scope_chain: vec!["global".into(), "coder".into()],
            session_id: String::new(),
            step_number: 3,
            facts: vec![("echo".into(), "{{x}}".into())],
            last_user_message: Some("review my change".into()),
            model: None,
            client_tools: Some(vec!["read".into()]),
            turn_count: Some(2),
        }
    }

    fn item(name: &str, scope: wit::Scope) -> wit::Item {
        wit::Item {
            name: name.into(),
            scope,
        }
    }

    fn load(f: fn(&Config) -> Result<Plugin, String>) -> wit::Declaration {
        declare(vec![("k".into(), "v".into())], f).unwrap()
    }

    thread_local! {
        static SEEN: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn plugin(config: &Config) -> Result<Plugin, String> {
        let k = config.get_or("k", "").to_string();
        Ok(Plugin::new()
            .section("a", 1, "static {{x}}")
            .verbatim()
            .dynamic_section("b", 2, move |s| Ok(format!("{k} {}", s.step_number)))
            .dynamic_section("b", 3, |_| Ok("coder's b".into()))
            .scope("coder")
            .dynamic_section("c", 4, |_| Err("c failed".into()))
            .dynamic_context("d", 5, |s| Ok(s.fact("echo").unwrap_or("").into()))
            .verbatim()
            .context("e", 6, "plain")
            .dynamic_variable("v", |s| Ok(s.fact("missing").map(str::to_string)))
            .variable("w", "static")
            .tool("t1", "one", "{}")
            .tool("t2", "two", "{}")
            .show_tools(|_| Ok(vec!["t2".into()]))
            .before_evaluate(|step, wanted| {
                SEEN.with(|s| {
                    s.borrow_mut().push(format!(
                        "{} {:?} {}",
                        step.step_number,
                        wanted
                            .sections
                            .iter()
                            .map(|i| i.name.as_str())
                            .collect::<Vec<_>>(),
                        wanted.shown_tools
                    ))
                })
            })
            .review(-5, |step, input| {
                Ok(if input.any_text_contains("no") {
                    Verdict::reject(format!("{} said no", step.agent))
                } else if input.any_text_contains("pw") {
                    Verdict::redact([("pw", "[x]")])
                } else {
                    Verdict::accept()
                })
            }))
    }

    #[test]
    fn declaration_carries_verbatim_and_review_order() {
        let d = load(plugin);
        let flags: Vec<(&str, bool)> = d
            .sections
            .iter()
            .map(|s| (s.name.as_str(), s.verbatim))
            .collect();
        assert_eq!(
            flags,
            [("a", true), ("b", false), ("b", false), ("c", false)]
        );
        let flags: Vec<(&str, bool)> = d
            .contexts
            .iter()
            .map(|c| (c.name.as_str(), c.verbatim))
            .collect();
        assert_eq!(flags, [("d", true), ("e", false)]);
        assert_eq!(d.review_order, Some(-5));
        assert!(d.filters_tools);
    }

    #[test]
    fn evaluate_answers_item_by_item_in_order() {
        load(plugin);
        SEEN.with(|s| s.borrow_mut().clear());
        let wanted = wit::Wanted {
            sections: vec![
                item("c", wit::Scope::Global),
                item("b", wit::Scope::Agent("coder".into())),
                item("b", wit::Scope::Global),
                item("a", wit::Scope::Global),
                item("zz", wit::Scope::Global),
            ],
            contexts: vec![item("d", wit::Scope::Global), item("e", wit::Scope::Global)],
            variables: vec![item("v", wit::Scope::Global), item("w", wit::Scope::Global)],
            shown_tools: true,
        };
        let e = evaluate(wit_step(), wanted).unwrap();
        assert_eq!(
            e.sections,
            [
                Err("c failed".to_string()),
                Ok("coder's b".to_string()),
                Ok("v 3".to_string()),
                Err("no dynamic section `a` is declared".to_string()),
                Err("no dynamic section `zz` is declared".to_string()),
            ]
        );
        assert_eq!(
            e.contexts,
            [
                Ok("{{x}}".to_string()),
                Err("no dynamic context `e` is declared".to_string())
            ]
        );
        assert_eq!(
            e.variables,
            [
                Ok(None),
                Err("no dynamic variable `w` is declared".to_string())
            ]
        );
        assert_eq!(e.shown_tools, Some(Ok(vec!["t2".to_string()])));
        SEEN.with(|s| assert_eq!(*s.borrow(), ["3 [\"c\", \"b\", \"b\", \"a\", \"zz\"] true"]));
    }

    #[test]
    fn shown_tools_only_when_asked() {
        load(plugin);
        let e = evaluate(wit_step(), nothing_wanted()).unwrap();
        assert!(e.sections.is_empty() && e.contexts.is_empty() && e.variables.is_empty());
        assert_eq!(e.shown_tools, None);
        load(|_| Ok(Plugin::new().tool("t", "d", "{}")));
        let mut wanted = nothing_wanted();
        wanted.shown_tools = true;
        let e = evaluate(wit_step(), wanted).unwrap();
        assert_eq!(
            e.shown_tools,
            Some(Err("this plugin does not filter its tools".to_string()))
        );
    }

    fn nothing_wanted() -> wit::Wanted {
        wit::Wanted {
            sections: vec![],
            contexts: vec![],
            variables: vec![],
            shown_tools: false,
        }
    }

    fn input(texts: &[&str]) -> wit::ReviewInput {
        wit::ReviewInput {
            messages: vec![wit::Message {
                role: "user".into(),
                texts: texts.iter().map(|t| t.to_string()).collect(),
                tool_call_id: String::new(),
            }],
            system: "sys".into(),
            runtime_context: None,
            tools: vec![],
        }
    }

    fn verdict(v: wit::Verdict) -> Verdict {
        match v {
            wit::Verdict::Accept => Verdict::Accept,
            wit::Verdict::Reject(r) => Verdict::Reject(r),
            wit::Verdict::Redact(r) => Verdict::Redact(
                r.into_iter()
                    .map(|r| Redaction::new(r.find, r.replace))
                    .collect(),
            ),
        }
    }

    #[test]
    fn review_runs_the_hook() {
        load(plugin);
        let r = |texts: &[&str]| verdict(review(wit_step(), input(texts)).unwrap());
        assert_eq!(r(&["fine", "all good"]), Verdict::Accept);
        assert_eq!(
            r(&["a pw here", "say no"]),
            Verdict::reject("coder said no")
        );
        assert_eq!(
            r(&["a pw here"]),
            Verdict::Redact(vec![Redaction::new("pw", "[x]")])
        );
    }

    #[test]
    fn no_hook_accepts_and_declares_no_order() {
        let d = load(|_| Ok(Plugin::new().section("s", 0, "x")));
        assert_eq!(d.review_order, None);
        assert!(!d.filters_tools);
        assert!(matches!(
            review(wit_step(), input(&["no"])).unwrap(),
            wit::Verdict::Accept
        ));
    }

    #[test]
    fn misuse_refuses_the_plugin() {
        let err = |f: fn(&Config) -> Result<Plugin, String>| declare(vec![], f).err().unwrap();
        assert_eq!(
            err(|_| Ok(Plugin::new().variable("v", "x").verbatim())),
            "verbatim() applies to a section or a context only"
        );
        assert_eq!(
            err(|_| Ok(Plugin::new()
                .review(0, |_, _| Ok(Verdict::Accept))
                .review(1, |_, _| Ok(Verdict::Accept)))),
            "review() called twice: a plugin has one review hook"
        );
    }

    #[test]
    fn declaration_carries_reads_refresh_and_defer() {
        fn p(_: &Config) -> Result<Plugin, String> {
            Ok(Plugin::new()
                .dynamic_section("q", 1, |s| {
                    Ok(s.last_user_message.clone().unwrap_or_default())
                })
                .reads(
                    Reads::facts(["task"])
                        .input(Input::LastUserMessage)
                        .input(Input::TurnCount)
                        .volatile(),
                )
                .refresh(Refresh::Boundary)
                .dynamic_context("r", 2, |_| Ok(String::new()))
                .tool("t", "one", "{}")
                .refresh(Refresh::Session)
                .defer()
                .reads_by_default(Reads::nothing()))
        }
        let d = load(p);
        let reads = d.sections[0].reads.as_ref().expect("reads");
        assert_eq!(reads.facts, ["task"]);
        assert_eq!(
            reads.inputs,
            wit::Inputs::LAST_USER_MESSAGE | wit::Inputs::TURN_COUNT
        );
        assert!(reads.volatile);
        assert_eq!(d.sections[0].refresh, Some(wit::Refresh::Boundary));
        assert!(
            d.contexts[0].reads.is_none(),
            "the declaration's reads apply"
        );
        let default = d.reads.as_ref().expect("reads by default");
        assert!(default.facts.is_empty() && !default.volatile);
        assert_eq!(default.inputs, wit::Inputs::empty());
        assert_eq!(d.tools[0].refresh, Some(wit::Refresh::Session));
        assert!(d.tools[0].defer);

        let step = step_from_wit(wit_step());
        assert_eq!(step.last_user_message.as_deref(), Some("review my change"));
        assert_eq!(step.client_tools, Some(vec!["read".to_string()]));
        assert_eq!((step.model, step.turn_count), (None, Some(2)));
    }

    #[test]
    fn reads_refresh_and_defer_on_the_wrong_item_are_misuse() {
        fn on_static(_: &Config) -> Result<Plugin, String> {
            Ok(Plugin::new().section("s", 1, "x").reads(Reads::nothing()))
        }
        fn refresh_context(_: &Config) -> Result<Plugin, String> {
            Ok(Plugin::new().context("c", 1, "x").refresh(Refresh::Step))
        }
        fn defer_section(_: &Config) -> Result<Plugin, String> {
            Ok(Plugin::new().section("s", 1, "x").defer())
        }
        let err = |f| declare(Vec::new(), f).unwrap_err();
        assert!(err(on_static).contains("reads() applies to a dynamic"));
        assert!(err(refresh_context).contains("refresh() applies to a section or a tool"));
        assert!(err(defer_section).contains("defer() applies to a tool"));
    }
}
