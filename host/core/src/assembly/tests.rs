//! Rule tests for registry + assembly + rendering over native plugins (no WebAssembly).
//! Each test names the SPEC rule it checks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::plugin::model::Scope;
use crate::plugin::provider::{CallError, NativePlugin};
use crate::plugin::registry::{PluginEntry, PluginOptions, Registry};
use crate::request::neutral_json;

fn entry(id: &str, plugin: NativePlugin) -> crate::Result<PluginEntry> {
    let (decl, provider) = plugin.build();
    PluginEntry::new(id, decl, provider, PluginOptions::default())
}

fn optional(id: &str, plugin: NativePlugin) -> PluginEntry {
    let (decl, provider) = plugin.build();
    let options = PluginOptions {
        optional: true,
        ..PluginOptions::default()
    };
    PluginEntry::new(id, decl, provider, options).unwrap()
}

fn registry(plugins: Vec<(&str, NativePlugin)>) -> Registry {
    plugins.into_iter().fold(Registry::new(), |r, (id, p)| {
        r.with_plugin(entry(id, p).unwrap()).unwrap()
    })
}

fn step_for(agent: &str, chain: &[&str]) -> Step {
    Step {
        agent: agent.into(),
        scope_chain: chain.iter().map(|s| s.to_string()).collect(),
        ..Step::default()
    }
}

fn default_step() -> Step {
    step_for("default", &["global", "default"])
}

fn run(reg: &Registry) -> crate::Result<std::sync::Arc<Assembly>> {
    assemble(reg, &default_step(), &Options::default())
}

fn with_order(order: &[&str]) -> Options {
    Options {
        tool_order: Some(order.iter().map(|s| s.to_string()).collect()),
        ..Options::default()
    }
}

fn tool_names(a: &Assembly) -> Vec<&str> {
    a.tools.iter().map(|t| t.name.as_str()).collect()
}

fn counter() -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let c = Arc::new(AtomicUsize::new(0));
    (c.clone(), c)
}

const OBJ: &str = r#"{"type":"object"}"#;

// ---- contributions (C) ------------------------------------------------------------------

#[test]
fn c1_static_and_dynamic_sections_render_into_system() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .section("a", 0, "static")
            .dynamic_section("b", 1, |s| Ok(format!("agent {}", s.agent))),
    )]);
    assert_eq!(run(&reg).unwrap().system, "static\n\nagent default");
}

#[test]
fn c2_contexts_go_to_runtime_context_never_system() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .section("s", 0, "sys")
            .context("c", 0, "ctx"),
    )]);
    let a = run(&reg).unwrap();
    assert_eq!(a.system, "sys");
    assert_eq!(
        a.runtime_context.as_deref(),
        Some(format!("{RUNTIME_CONTEXT_HEADER}\n\nctx").as_str())
    );
}

#[test]
fn c3_variable_names_are_checked_at_load() {
    let err = entry("p", NativePlugin::new().variable("Bad-Name", "x")).unwrap_err();
    assert_eq!(err.code(), "invalid_name");
    assert!(err.to_string().contains("Bad-Name"), "{err}");
}

#[test]
fn c3_dynamic_variable_may_be_absent_only_when_unused() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .dynamic_variable("maybe", |_| Ok(None))
            .section("s", 0, "no reference"),
    )]);
    assert_eq!(run(&reg).unwrap().system, "no reference");
}

#[test]
fn c4_tool_names_and_schemas_are_checked() {
    let bad_name = entry("p", NativePlugin::new().tool("read.file", "d", OBJ)).unwrap_err();
    assert_eq!(bad_name.code(), "invalid_name");
    let too_long = entry("p", NativePlugin::new().tool(&"x".repeat(65), "d", OBJ)).unwrap_err();
    assert_eq!(too_long.code(), "invalid_name");
    let not_json = entry("p", NativePlugin::new().tool("t", "d", "{oops")).unwrap_err();
    assert_eq!(not_json.code(), "invalid_schema");
    assert!(
        not_json.to_string().contains("not valid JSON"),
        "{not_json}"
    );
    let not_object = entry("p", NativePlugin::new().tool("t", "d", "[1]")).unwrap_err();
    assert_eq!(not_object.code(), "invalid_schema");
    assert!(not_object.to_string().contains("an array"), "{not_object}");
}

#[test]
fn c4_a8_unlisted_marker_is_a_reserved_tool_name() {
    let err = entry("p", NativePlugin::new().tool("<unlisted-tools>", "d", OBJ)).unwrap_err();
    assert_eq!(err.code(), "reserved_tool_name");
}

#[test]
fn c5_section_and_context_names_are_printable_ascii_without_whitespace() {
    for bad in ["", "has space", "tab\t", "naïve"] {
        let err = entry("p", NativePlugin::new().section(bad, 0, "x")).unwrap_err();
        assert_eq!(err.code(), "invalid_name", "{bad:?}");
        let err = entry("p", NativePlugin::new().context(bad, 0, "x")).unwrap_err();
        assert_eq!(err.code(), "invalid_name", "{bad:?}");
    }
    entry(
        "p",
        NativePlugin::new().section("deployment:persona", 0, "x"),
    )
    .unwrap();
}

#[test]
fn c6_conventional_orders_put_identity_then_persona_then_tool_guidance() {
    let reg = registry(vec![
        (
            "guide",
            NativePlugin::new().section("tools:guidance", 100, "G"),
        ),
        ("persona", NativePlugin::new().section("persona", 0, "P")),
        (
            "identity",
            NativePlugin::new().section("identity", -100, "I"),
        ),
    ]);
    assert_eq!(run(&reg).unwrap().system, "I\n\nP\n\nG");
}

// ---- registry (R) -----------------------------------------------------------------------

#[test]
fn r1_a_plugin_is_all_or_nothing() {
    let good = registry(vec![("base", NativePlugin::new().section("base", 0, "B"))]);
    let bad = entry(
        "bad",
        NativePlugin::new()
            .section("fine", 0, "F")
            .tool("ok", "d", OBJ)
            .tool("broken", "d", "\"string\""),
    );
    assert_eq!(bad.unwrap_err().code(), "invalid_schema");
    // Nothing of `bad` is visible: the registry is unchanged.
    assert_eq!(run(&good).unwrap().system, "B");
    assert!(good.get("bad").is_none());
}

#[test]
fn r1_malformed_static_template_refuses_the_plugin_at_load() {
    let err = entry("p", NativePlugin::new().section("s", 0, "x {{ model }}")).unwrap_err();
    assert_eq!(err.code(), "malformed_reference");
    assert!(err.to_string().contains("plugin `p`, section `s`"), "{err}");
}

#[test]
fn r1_duplicate_names_within_a_plugin_are_refused() {
    let err = entry(
        "p",
        NativePlugin::new()
            .section("s", 0, "a")
            .section("s", 1, "b"),
    )
    .unwrap_err();
    assert_eq!(err.code(), "duplicate_name");
    // The same name in two scopes is fine.
    entry(
        "p",
        NativePlugin::new()
            .section("s", 0, "a")
            .section("s", 1, "b")
            .scoped(Scope::agent("coder")),
    )
    .unwrap();
}

#[test]
fn r2_conflict_names_both_plugins_and_the_name_and_old_keeps_serving() {
    let reg = registry(vec![(
        "first",
        NativePlugin::new().section("persona", 0, "one"),
    )]);
    let err = reg
        .with_plugin(entry("second", NativePlugin::new().section("persona", 5, "two")).unwrap())
        .unwrap_err();
    assert_eq!(err.code(), "section_conflict");
    let msg = err.to_string();
    assert!(msg.contains("`second`") && msg.contains("`first`") && msg.contains("`persona`"));
    assert_eq!(run(&reg).unwrap().system, "one");
}

#[test]
fn r2_conflict_codes_per_kind() {
    let cases: Vec<(NativePlugin, &str)> = vec![
        (NativePlugin::new().context("c", 0, "x"), "context_conflict"),
        (NativePlugin::new().variable("v", "x"), "variable_conflict"),
        (NativePlugin::new().tool("t", "d", OBJ), "tool_conflict"),
    ];
    for (plugin, code) in cases {
        let reg = Registry::new()
            .with_plugin(entry("a", plugin.clone()).unwrap())
            .unwrap();
        let err = reg.with_plugin(entry("b", plugin).unwrap()).unwrap_err();
        assert_eq!(err.code(), code);
    }
}

#[test]
fn r2_scope_override_is_applied_before_conflicts() {
    let reg = registry(vec![(
        "a",
        NativePlugin::new().section("persona", 0, "global"),
    )]);
    let (decl, provider) = NativePlugin::new().section("persona", 0, "coder").build();
    let options = PluginOptions {
        scope_override: Some(Scope::agent("coder")),
        optional: false,
        ..PluginOptions::default()
    };
    let reg = reg
        .with_plugin(PluginEntry::new("b", decl, provider, options).unwrap())
        .unwrap();
    let coder = step_for("coder", &["global", "coder"]);
    let a = assemble(&reg, &coder, &Options::default()).unwrap();
    assert_eq!(a.system, "coder");
    assert_eq!(run(&reg).unwrap().system, "global");
}

#[test]
fn r3_agent_scope_shadows_global_for_that_agent_only() {
    let reg = registry(vec![
        (
            "global_persona",
            NativePlugin::new().section("persona", 0, "generic"),
        ),
        (
            "coder_persona",
            NativePlugin::new()
                .section("persona", 0, "coder persona")
                .scoped(Scope::agent("coder")),
        ),
    ]);
    let coder = step_for("coder", &["global", "coder"]);
    let other = step_for("writer", &["global", "writer"]);
    let opts = Options::default();
    assert_eq!(
        assemble(&reg, &coder, &opts).unwrap().system,
        "coder persona"
    );
    assert_eq!(assemble(&reg, &other, &opts).unwrap().system, "generic");
}

#[test]
fn r3_nearest_ancestor_wins_over_farther_one() {
    let reg = registry(vec![
        ("g", NativePlugin::new().section("s", 0, "global")),
        (
            "b",
            NativePlugin::new()
                .section("s", 0, "base")
                .scoped(Scope::agent("base")),
        ),
        (
            "c",
            NativePlugin::new()
                .section("s", 0, "child")
                .scoped(Scope::agent("child")),
        ),
    ]);
    let opts = Options::default();
    let child = step_for("child", &["global", "base", "child"]);
    let base = step_for("base", &["global", "base"]);
    assert_eq!(assemble(&reg, &child, &opts).unwrap().system, "child");
    assert_eq!(assemble(&reg, &base, &opts).unwrap().system, "base");
}

#[test]
fn r3_tools_shadow_the_same_way_and_both_scopes_appear() {
    let reg = registry(vec![
        (
            "g",
            NativePlugin::new()
                .tool("bash", "global bash", OBJ)
                .tool("read_file", "read", OBJ),
        ),
        (
            "c",
            NativePlugin::new()
                .tool("bash", "coder bash", OBJ)
                .scoped(Scope::agent("coder"))
                .tool("deploy", "deploy", OBJ)
                .scoped(Scope::agent("coder")),
        ),
    ]);
    let coder = step_for("coder", &["global", "coder"]);
    let a = assemble(&reg, &coder, &Options::default()).unwrap();
    assert_eq!(tool_names(&a), ["bash", "deploy", "read_file"]);
    assert_eq!(a.tools[0].description, "coder bash");
    let d = run(&reg).unwrap();
    assert_eq!(tool_names(&d), ["bash", "read_file"]);
    assert_eq!(d.tools[0].description, "global bash");
}

#[test]
fn r4_unloading_drops_every_contribution_at_once() {
    let reg = registry(vec![
        ("keep", NativePlugin::new().section("k", 0, "kept")),
        (
            "gone",
            NativePlugin::new()
                .section("g", 1, "{{v}}")
                .context("c", 0, "ctx")
                .variable("v", "value")
                .tool("t", "d", OBJ),
        ),
    ]);
    let before = run(&reg).unwrap();
    assert_eq!(before.system, "kept\n\nvalue");
    let after = run(&reg.without("gone").unwrap()).unwrap();
    assert_eq!(after.system, "kept");
    assert_eq!(after.runtime_context, None);
    assert!(after.tools.is_empty());
    assert_eq!(reg.without("nope").unwrap_err().code(), "unknown_plugin");
}

// ---- assembly (A) -----------------------------------------------------------------------

#[test]
fn a1_sections_sort_by_order_then_name() {
    let reg = registry(vec![
        (
            "x",
            NativePlugin::new()
                .section("b", 1, "b1")
                .section("z", 0, "z0"),
        ),
        (
            "y",
            NativePlugin::new()
                .section("a", 1, "a1")
                .section("m", -5, "m-5"),
        ),
    ]);
    assert_eq!(run(&reg).unwrap().system, "m-5\n\nz0\n\na1\n\nb1");
}

#[test]
fn a2_shadowed_dynamic_contributions_are_never_called() {
    let (section_calls, sc) = counter();
    let (variable_calls, vc) = counter();
    let reg = registry(vec![
        (
            "global",
            NativePlugin::new()
                .dynamic_section("persona", 0, move |_| {
                    sc.fetch_add(1, Ordering::SeqCst);
                    Ok("global".into())
                })
                .dynamic_variable("name", move |_| {
                    vc.fetch_add(1, Ordering::SeqCst);
                    Ok(Some("global".into()))
                }),
        ),
        (
            "coder",
            NativePlugin::new()
                .section("persona", 0, "I am {{name}}")
                .scoped(Scope::agent("coder"))
                .variable("name", "coder")
                .scoped(Scope::agent("coder")),
        ),
    ]);
    let coder = step_for("coder", &["global", "coder"]);
    let a = assemble(&reg, &coder, &Options::default()).unwrap();
    assert_eq!(a.system, "I am coder");
    assert_eq!(section_calls.load(Ordering::SeqCst), 0);
    assert_eq!(variable_calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a2_each_dynamic_contribution_is_called_at_most_once() {
    let (calls, c) = counter();
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .dynamic_variable("v", move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                Ok(Some("x".into()))
            })
            .section("a", 0, "{{v}} {{v}}")
            .context("b", 0, "{{v}}"),
    )]);
    let a = run(&reg).unwrap();
    assert_eq!(a.system, "x x");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a3_more_than_one_complete_section_fails_naming_them_sorted() {
    let reg = registry(vec![
        ("p", NativePlugin::new().section("zeta", 0, "z").complete()),
        ("q", NativePlugin::new().section("alpha", 0, "a").complete()),
    ]);
    let err = run(&reg).unwrap_err();
    assert_eq!(err.code(), "multiple_complete");
    assert!(
        matches!(&err, Error::MultipleComplete(names) if names == &["alpha", "zeta"]),
        "{err:?}"
    );
}

#[test]
fn a3_a_single_complete_section_stands_alone_but_the_rest_is_collected() {
    let (other_calls, oc) = counter();
    let reg = registry(vec![
        (
            "p",
            NativePlugin::new()
                .section("whole", 5, "Only {{v}}.")
                .complete()
                .dynamic_section("other", 0, move |_| {
                    oc.fetch_add(1, Ordering::SeqCst);
                    Ok("other".into())
                }),
        ),
        (
            "q",
            NativePlugin::new()
                .variable("v", "me")
                .context("c", 0, "ctx")
                .tool("t", "d", OBJ),
        ),
    ]);
    let a = run(&reg).unwrap();
    assert_eq!(a.system, "Only me.");
    assert_eq!(other_calls.load(Ordering::SeqCst), 0);
    assert!(a.runtime_context.is_some());
    assert_eq!(tool_names(&a), ["t"]);
}

#[test]
fn a3_a_shadowed_complete_section_does_not_count() {
    let reg = registry(vec![
        ("g", NativePlugin::new().section("s", 0, "g").complete()),
        (
            "c",
            NativePlugin::new()
                .section("s", 0, "c")
                .scoped(Scope::agent("coder")),
        ),
        ("o", NativePlugin::new().section("t", 1, "t").complete()),
    ]);
    let coder = step_for("coder", &["global", "coder"]);
    let a = assemble(&reg, &coder, &Options::default()).unwrap();
    assert_eq!(a.system, "t");
}

#[test]
fn a4_contexts_merge_and_sort_like_sections() {
    let reg = registry(vec![
        (
            "p",
            NativePlugin::new()
                .context("b", 0, "B")
                .context("a", 0, "A"),
        ),
        ("q", NativePlugin::new().context("z", -1, "Z")),
        (
            "r",
            NativePlugin::new()
                .context("a", 0, "A2")
                .scoped(Scope::agent("default")),
        ),
    ]);
    let a = run(&reg).unwrap();
    assert_eq!(
        a.runtime_context.as_deref().unwrap(),
        format!("{RUNTIME_CONTEXT_HEADER}\n\nZ\n\nA2\n\nB")
    );
}

#[test]
fn a4_runtime_context_can_be_suppressed_and_then_nothing_is_called() {
    let (calls, c) = counter();
    let reg = registry(vec![(
        "p",
        NativePlugin::new().dynamic_context("c", 0, move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok("ctx".into())
        }),
    )]);
    let opts = Options {
        suppress_runtime_context: true,
        ..Options::default()
    };
    let a = assemble(&reg, &default_step(), &opts).unwrap();
    assert_eq!(a.runtime_context, None);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a5_variables_merge_by_name_nearer_wins() {
    let reg = registry(vec![
        (
            "g",
            NativePlugin::new()
                .variable("who", "everyone")
                .section("s", 0, "hi {{who}}"),
        ),
        (
            "c",
            NativePlugin::new()
                .variable("who", "coder")
                .scoped(Scope::agent("coder")),
        ),
    ]);
    let coder = step_for("coder", &["global", "coder"]);
    assert_eq!(
        assemble(&reg, &coder, &Options::default()).unwrap().system,
        "hi coder"
    );
    assert_eq!(run(&reg).unwrap().system, "hi everyone");
}

#[test]
fn a6_tools_are_ordered_by_name_across_providers() {
    let reg = registry(vec![
        (
            "one",
            NativePlugin::new()
                .tool("charlie", "c", OBJ)
                .tool("alpha", "a", OBJ),
        ),
        ("two", NativePlugin::new().tool("bravo", "b", OBJ)),
    ]);
    assert_eq!(
        tool_names(&run(&reg).unwrap()),
        ["alpha", "bravo", "charlie"]
    );
}

#[test]
fn a6_tool_order_is_byte_order() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .tool("b", "", OBJ)
            .tool("B", "", OBJ)
            .tool("_x", "", OBJ)
            .tool("a-1", "", OBJ),
    )]);
    assert_eq!(tool_names(&run(&reg).unwrap()), ["B", "_x", "a-1", "b"]);
}

#[test]
fn a6_parameters_are_the_declared_schema_as_parsed_at_load_shared_read_only() {
    let schema = r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#;
    let reg = registry(vec![("p", NativePlugin::new().tool("read", "d", schema))]);
    let expected: serde_json::Value = serde_json::from_str(schema).unwrap();
    let (first, second) = (run(&reg).unwrap(), run(&reg).unwrap());
    assert_eq!(*first.tools[0].parameters, expected);
    // Shared (`Arc`, no `DerefMut`): no caller can change it, so no step copies it. A caller
    // that wants its own copies it out, and that copy is independent of the next assembly.
    assert!(Arc::ptr_eq(
        &first.tools[0].parameters,
        &second.tools[0].parameters
    ));
    let mut own = (*first.tools[0].parameters).clone();
    own["type"] = "mutated".into();
    assert_eq!(*run(&reg).unwrap().tools[0].parameters, expected);
}

#[test]
fn a7_tool_order_places_listed_names_and_the_rest_by_name() {
    let reg = registry(vec![
        (
            "p",
            NativePlugin::new()
                .tool("bash", "", OBJ)
                .tool("echo_b", "", OBJ),
        ),
        (
            "q",
            NativePlugin::new()
                .tool("todo_write", "", OBJ)
                .tool("echo_a", "", OBJ),
        ),
    ]);
    let opts = with_order(&["todo_write", "<unlisted-tools>", "bash"]);
    let a = assemble(&reg, &default_step(), &opts).unwrap();
    assert_eq!(tool_names(&a), ["todo_write", "echo_a", "echo_b", "bash"]);
}

#[test]
fn a7_a_listed_tool_not_shown_this_step_yields_nothing() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .tool("bash", "", OBJ)
            .tool("read", "", OBJ)
            .show_tools(|_| Ok(vec!["read".into()])),
    )]);
    let a = assemble(
        &reg,
        &default_step(),
        &with_order(&["bash", "<unlisted-tools>"]),
    )
    .unwrap();
    assert_eq!(tool_names(&a), ["read"]);
}

#[test]
fn a7_shown_tools_are_asked_once_and_must_be_known() {
    let (calls, c) = counter();
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .tool("a", "", OBJ)
            .tool("b", "", OBJ)
            .show_tools(move |s| {
                c.fetch_add(1, Ordering::SeqCst);
                Ok(if s.facts.contains_key("ro") {
                    vec!["a".into()]
                } else {
                    vec!["a".into(), "b".into()]
                })
            }),
    )]);
    assert_eq!(tool_names(&run(&reg).unwrap()), ["a", "b"]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let mut ro = default_step();
    ro.facts.insert("ro".into(), "1".into());
    assert_eq!(
        tool_names(&assemble(&reg, &ro, &Options::default()).unwrap()),
        ["a"]
    );

    let liar = registry(vec![(
        "liar",
        NativePlugin::new()
            .tool("a", "", OBJ)
            .show_tools(|_| Ok(vec!["zzz".into()])),
    )]);
    let err = run(&liar).unwrap_err();
    assert_eq!(err.code(), "unknown_shown_tool");
    assert!(err.to_string().contains("zzz"));
}

#[test]
fn a8_unknown_tool_order_names_are_all_listed_with_known_tools() {
    let reg = registry(vec![
        ("p", NativePlugin::new().tool("bash", "", OBJ)),
        (
            "q",
            NativePlugin::new()
                .tool("read", "", OBJ)
                .scoped(Scope::agent("other")),
        ),
    ]);
    let opts = with_order(&["nope", "<unlisted-tools>", "bash", "also_missing"]);
    let err = assemble(&reg, &default_step(), &opts).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownToolOrderName { unknown, known }
            if unknown == &["also_missing", "nope"] && known == &["bash", "read"]),
        "{err:?}"
    );
    assert_eq!(err.code(), "unknown_tool_order_name");
}

#[test]
fn a9_a_failing_call_names_plugin_contribution_and_cause() {
    let reg = registry(vec![(
        "flaky",
        NativePlugin::new()
            .dynamic_section("news", 0, |_| Err(CallError::Failed("feed down".into()))),
    )]);
    let err = run(&reg).unwrap_err();
    assert_eq!(err.code(), "plugin_error");
    let msg = err.to_string();
    assert!(
        msg.contains("`flaky`") && msg.contains("section `news`") && msg.contains("feed down"),
        "{msg}"
    );
}

#[test]
fn a9_an_optional_plugin_is_left_out_and_the_omission_recorded() {
    let reg = Registry::new()
        .with_plugin(
            entry(
                "base",
                NativePlugin::new().section("persona", 0, "base persona"),
            )
            .unwrap(),
        )
        .unwrap()
        .with_plugin(optional(
            "extra",
            NativePlugin::new()
                .dynamic_section("persona", 0, |_| {
                    Err(CallError::Trapped("trap: unreachable".into()))
                })
                .scoped(Scope::agent("default"))
                .tool("extra_tool", "", OBJ),
        ))
        .unwrap();
    let a = run(&reg).unwrap();
    // The failing plugin's section no longer shadows the global one; its tool is gone too.
    assert_eq!(a.system, "base persona");
    assert!(a.tools.is_empty());
    assert_eq!(
        a.omitted,
        [Omission {
            plugin: "extra".into(),
            contribution: "section `persona`".into(),
            cause: "trap: unreachable".into(),
        }]
    );
}

#[test]
fn a10_errors_are_values_with_stable_codes() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new().dynamic_context("c", 0, |_| {
            Err(CallError::Trapped("deadline exceeded".into()))
        }),
    )]);
    let err = run(&reg).unwrap_err();
    assert_eq!(err.code(), "plugin_trap");
    assert!(matches!(err, Error::PluginCall { trapped: true, .. }));
}

// ---- rendering through assembly (T) -----------------------------------------------------

#[test]
fn t4_errors_name_the_section_or_context() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new().dynamic_context("ctx", 0, |_| Ok("{{nope}}".into())),
    )]);
    let err = run(&reg).unwrap_err();
    assert_eq!(err.code(), "unknown_variable");
    assert!(
        err.to_string().contains("context `ctx` (plugin `p`)"),
        "{err}"
    );

    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .dynamic_variable("date", |_| Ok(None))
            .section("s", 0, "Today is {{date}}"),
    )]);
    let err = run(&reg).unwrap_err();
    assert_eq!(err.code(), "variable_absent");
    assert!(err.to_string().contains("section `s`"), "{err}");
}

#[test]
fn t4_dynamic_text_is_checked_at_assembly() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new().dynamic_section("s", 0, |_| Ok("{{{x}}}".into())),
    )]);
    assert_eq!(run(&reg).unwrap_err().code(), "malformed_reference");
}

#[test]
fn t5_empty_sections_are_dropped_whitespace_only_kept() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .section("a", 0, "A")
            .section("b", 1, "")
            .dynamic_section("c", 2, |_| Ok(String::new()))
            .section("d", 3, "  ")
            .section("e", 4, "E"),
    )]);
    assert_eq!(run(&reg).unwrap().system, "A\n\n  \n\nE");
}

#[test]
fn t5_a_section_empty_after_interpolation_is_dropped() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .variable("nothing", "")
            .section("a", 0, "{{nothing}}")
            .section("b", 1, "B"),
    )]);
    assert_eq!(run(&reg).unwrap().system, "B");
}

#[test]
fn t6_no_runtime_context_when_every_context_is_empty() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .context("a", 0, "")
            .dynamic_context("b", 0, |_| Ok(String::new())),
    )]);
    assert_eq!(run(&reg).unwrap().runtime_context, None);
}

// ---- determinism (A1), as a property ---------------------------------------------------

/// One generated contribution: kind (0..4), name index, scope (0 = global, else agent), order,
/// static or dynamic.
type Item = (u8, u8, u8, i8, bool);

fn build_plugin(items: &[Item]) -> NativePlugin {
    let mut p = NativePlugin::new();
    for &(kind, name, scope, order, dynamic) in items {
        let n = format!("n{name}");
        let order = order as i32;
        p = match (kind, dynamic) {
            (0, false) => p.section(&n, order, &format!("section {n} uses {{{{v{name}}}}}")),
            (0, true) => {
                p.dynamic_section(&n, order, move |s| Ok(format!("dyn {} {}", s.agent, order)))
            }
            (1, false) => p.context(&n, order, &format!("ctx {n}")),
            (1, true) => p.dynamic_context(&n, order, move |s| {
                Ok(format!("dyn ctx {}", s.step_number as i64 + order as i64))
            }),
            (2, _) => p.variable(&format!("v{name}"), &format!("value {name} {scope}")),
            _ => p.tool(
                &n,
                &format!("tool {n}"),
                r#"{"type":"object","b":1,"a":{"z":1,"y":2}}"#,
            ),
        };
        if scope > 0 {
            p = p.scoped(Scope::agent(if scope == 1 { "base" } else { "child" }));
        }
    }
    p
}

fn contributions() -> impl Strategy<Value = Vec<Vec<Item>>> {
    // Items are unique per (kind, name, scope) across all plugins, so no load conflicts; every
    // variable a section uses is declared globally.
    proptest::collection::btree_map(
        (0u8..4, 0u8..6, 0u8..3),
        (any::<i8>(), any::<bool>()),
        1..24,
    )
    .prop_flat_map(|items| {
        let mut list: Vec<Item> = items
            .into_iter()
            .map(|((k, n, s), (o, d))| (k, n, s, o % 3, d))
            .collect();
        for n in 0u8..6 {
            if !list.iter().any(|i| i.0 == 2 && i.1 == n && i.2 == 0) {
                list.push((2, n, 0, 0, false));
            }
        }
        let len = list.len();
        (Just(list), proptest::collection::vec(0usize..4, len))
    })
    .prop_map(|(list, owners)| {
        let mut plugins = vec![Vec::new(); 4];
        for (item, owner) in list.into_iter().zip(owners) {
            plugins[owner].push(item);
        }
        plugins
    })
}

fn assembled_bytes(plugins: &[(usize, Vec<Item>)], tool_order: bool) -> Vec<String> {
    let reg = plugins.iter().fold(Registry::new(), |r, (i, items)| {
        r.with_plugin(entry(&format!("plugin{i}"), build_plugin(items)).unwrap())
            .unwrap()
    });
    let mut opts = Options::default();
    if tool_order {
        opts.tool_order = Some(vec!["<unlisted-tools>".to_string()].into());
    }
    ["default", "base", "child"]
        .iter()
        .map(|agent| {
            let chain: &[&str] = match *agent {
                "child" => &["global", "base", "child"],
                "base" => &["global", "base"],
                _ => &["global", "default"],
            };
            let mut step = step_for(agent, chain);
            step.step_number = 3;
            match assemble(&reg, &step, &opts) {
                Ok(a) => {
                    serde_json::to_string(&neutral_json(&a, Default::default(), true)).unwrap()
                }
                Err(e) => format!("error[{}]: {e}", e.code()),
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a1_any_load_and_registration_order_gives_byte_identical_output(
        plugins in contributions(),
        seed in any::<u64>(),
        tool_order in any::<bool>(),
    ) {
        let indexed: Vec<(usize, Vec<Item>)> = plugins.into_iter().enumerate().collect();
        let reference = assembled_bytes(&indexed, tool_order);
        // A deterministic shuffle of plugin order and of each plugin's registration order.
        let mut permuted = indexed.clone();
        let mut state = seed | 1;
        let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state };
        for i in (1..permuted.len()).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            permuted.swap(i, j);
        }
        for (_, items) in permuted.iter_mut() {
            items.reverse();
        }
        prop_assert_eq!(assembled_bytes(&permuted, tool_order), reference);
    }
}

// ---- static assemblies are remembered per snapshot ------------------------------------------

#[test]
fn a2_a_static_assembly_is_remembered_but_dynamic_parts_are_still_called_each_step() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .section("s", 0, "static {{v}}")
            .variable("v", "x"),
    )]);
    let first = run(&reg).unwrap();
    let mut other = default_step();
    other.step_number = 9;
    other.facts.insert("k".into(), "v".into());
    assert_eq!(assemble(&reg, &other, &Options::default()).unwrap(), first);
    assert_eq!(first.system, "static x");

    let (calls, c) = counter();
    let reg = registry(vec![(
        "d",
        NativePlugin::new().dynamic_section("s", 0, move |step| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(format!("step {}", step.step_number))
        }),
    )]);
    for n in 1..=3 {
        let mut step = default_step();
        step.step_number = n;
        let a = assemble(&reg, &step, &Options::default()).unwrap();
        assert_eq!(a.system, format!("step {n}"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn r4_a_changed_registry_never_sees_the_old_snapshots_remembered_assembly() {
    let v1 = registry(vec![("p", NativePlugin::new().section("s", 0, "v1"))]);
    assert_eq!(run(&v1).unwrap().system, "v1");
    let v2 = v1
        .with_replaced(entry("p", NativePlugin::new().section("s", 0, "v2")).unwrap())
        .unwrap();
    assert_eq!(run(&v2).unwrap().system, "v2");
    assert_eq!(run(&v1.without("p").unwrap()).unwrap().system, "");
    assert_eq!(run(&v1).unwrap().system, "v1");
    // Other chains and options are other keys.
    let coder = step_for("coder", &["global", "coder"]);
    let scoped = registry(vec![(
        "p",
        NativePlugin::new()
            .section("s", 0, "global")
            .section("s", 0, "coder")
            .scoped(Scope::agent("coder")),
    )]);
    assert_eq!(run(&scoped).unwrap().system, "global");
    assert_eq!(
        assemble(&scoped, &coder, &Options::default())
            .unwrap()
            .system,
        "coder"
    );
}

// ---- world 0.2.0: batched evaluation, verbatim, trust ----------------------------------------

/// A provider that records every `evaluate` it is asked (a 0.2.0 component's one call).
struct Recording {
    inner: Arc<dyn crate::plugin::provider::Provider>,
    asked: std::sync::Mutex<Vec<crate::plugin::provider::Wanted>>,
}

impl crate::plugin::provider::Provider for Recording {
    fn section_text(
        &self,
        n: &str,
        s: &Scope,
        st: &Step,
    ) -> crate::plugin::provider::CallResult<String> {
        panic!(
            "a batching provider is never asked item by item ({n}, {s}, {})",
            st.agent
        )
    }
    fn context_text(
        &self,
        n: &str,
        s: &Scope,
        st: &Step,
    ) -> crate::plugin::provider::CallResult<String> {
        panic!(
            "a batching provider is never asked item by item ({n}, {s}, {})",
            st.agent
        )
    }
    fn variable_value(
        &self,
        n: &str,
        s: &Scope,
        st: &Step,
    ) -> crate::plugin::provider::CallResult<Option<String>> {
        panic!(
            "a batching provider is never asked item by item ({n}, {s}, {})",
            st.agent
        )
    }
    fn shown_tools(&self, st: &Step) -> crate::plugin::provider::CallResult<Vec<String>> {
        panic!(
            "a batching provider is never asked item by item ({})",
            st.agent
        )
    }
    fn batches(&self) -> bool {
        true
    }
    fn evaluate(
        &self,
        step: &Step,
        wanted: &crate::plugin::provider::Wanted,
    ) -> crate::plugin::provider::CallResult<crate::plugin::provider::Evaluation> {
        self.asked.lock().unwrap().push(wanted.clone());
        self.inner.evaluate(step, wanted)
    }
}

fn recording(
    id: &str,
    plugin: NativePlugin,
    options: PluginOptions,
) -> (PluginEntry, Arc<Recording>) {
    let (decl, inner) = plugin.build();
    let rec = Arc::new(Recording {
        inner,
        asked: Default::default(),
    });
    let entry = PluginEntry::new(id, decl, rec.clone(), options).unwrap();
    (entry, rec)
}

fn names(items: &[crate::plugin::provider::Item]) -> Vec<&str> {
    items.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn a2_a_batching_plugin_is_asked_once_per_step_and_never_for_a_shadowed_item() {
    let base = NativePlugin::new()
        .dynamic_section("shared", 0, |_| Ok("global shared".into()))
        .dynamic_section("own", 1, |s| {
            Ok(format!("own {{{{mood}}}} at {}", s.step_number))
        })
        .dynamic_variable("mood", |_| Ok(Some("calm".into())))
        .dynamic_variable("unused", |_| Err(CallError::Failed("never used".into())))
        .dynamic_context("clock", 0, |s| Ok(format!("step {}", s.step_number)))
        .tool("t1", "one", r#"{"type":"object"}"#)
        .tool("t2", "two", r#"{"type":"object"}"#)
        .show_tools(|_| Ok(vec!["t2".into()]));
    let near = NativePlugin::new()
        .dynamic_section("shared", 0, |_| Ok("coder's shared".into()))
        .scoped(Scope::agent("coder"));
    let (a, rec_a) = recording("a", base, PluginOptions::default());
    let (b, rec_b) = recording("b", near, PluginOptions::default());
    let reg = Registry::new()
        .with_plugin(a)
        .unwrap()
        .with_plugin(b)
        .unwrap();
    let mut step = step_for("coder", &["global", "coder"]);
    for n in 1..=3 {
        step.step_number = n;
        let out = assemble(&reg, &step, &Options::default()).unwrap();
        assert_eq!(out.system, format!("coder's shared\n\nown calm at {n}"));
        assert_eq!(tool_names(&out), ["t2"]);
        assert_eq!(
            out.runtime_context.as_deref(),
            Some(format!("{RUNTIME_CONTEXT_HEADER}\n\nstep {n}").as_str())
        );
    }
    let asked = rec_a.asked.lock().unwrap();
    assert_eq!(asked.len(), 3, "once per step: {asked:?}");
    for w in asked.iter() {
        assert_eq!(names(&w.sections), ["own"], "`shared` is shadowed by b's");
        assert_eq!(names(&w.contexts), ["clock"]);
        // Every effective dynamic variable is asked; the unused one's error is never seen.
        assert_eq!(names(&w.variables), ["mood", "unused"]);
        assert!(w.shown_tools);
    }
    drop(asked);
    assert_eq!(rec_b.asked.lock().unwrap().len(), 3);

    // Without a runtime context, contexts are not asked for (A4).
    let quiet = Options {
        suppress_runtime_context: true,
        ..Options::default()
    };
    assemble(&reg, &step, &quiet).unwrap();
    assert!(rec_a.asked.lock().unwrap()[3].contexts.is_empty());
}

#[test]
fn a2_a_batching_plugin_with_only_static_items_is_never_called() {
    let (a, rec) = recording(
        "a",
        NativePlugin::new()
            .section("s", 0, "static")
            .variable("v", "x"),
        PluginOptions::default(),
    );
    let reg = Registry::new().with_plugin(a).unwrap();
    assert_eq!(run(&reg).unwrap().system, "static");
    assert!(rec.asked.lock().unwrap().is_empty());
}

#[test]
fn a9_a_failed_evaluate_fails_its_items_and_an_optional_plugin_is_left_out() {
    struct Broken;
    impl crate::plugin::provider::Provider for Broken {
        fn section_text(
            &self,
            _: &str,
            _: &Scope,
            _: &Step,
        ) -> crate::plugin::provider::CallResult<String> {
            unreachable!()
        }
        fn context_text(
            &self,
            _: &str,
            _: &Scope,
            _: &Step,
        ) -> crate::plugin::provider::CallResult<String> {
            unreachable!()
        }
        fn variable_value(
            &self,
            _: &str,
            _: &Scope,
            _: &Step,
        ) -> crate::plugin::provider::CallResult<Option<String>> {
            unreachable!()
        }
        fn shown_tools(&self, _: &Step) -> crate::plugin::provider::CallResult<Vec<String>> {
            unreachable!()
        }
        fn batches(&self) -> bool {
            true
        }
        fn evaluate(
            &self,
            _: &Step,
            _: &crate::plugin::provider::Wanted,
        ) -> crate::plugin::provider::CallResult<crate::plugin::provider::Evaluation> {
            // One section asked, none answered: the shape is checked.
            Ok(crate::plugin::provider::Evaluation::default())
        }
    }
    let (decl, _) = NativePlugin::new()
        .dynamic_section("x", 0, |_| Ok("x".into()))
        .build();
    let required = PluginEntry::new(
        "p",
        decl.clone(),
        Arc::new(Broken),
        PluginOptions::default(),
    );
    let reg = Registry::new().with_plugin(required.unwrap()).unwrap();
    let err = run(&reg).unwrap_err();
    assert_eq!(err.code(), "plugin_error");
    assert_eq!(
        err.to_string(),
        "plugin `p`, section `x`: evaluate answered 0 sections for 1 asked"
    );
    let options = PluginOptions {
        optional: true,
        ..PluginOptions::default()
    };
    let reg = Registry::new()
        .with_plugin(PluginEntry::new("p", decl, Arc::new(Broken), options).unwrap())
        .unwrap()
        .with_plugin(entry("q", NativePlugin::new().section("y", 0, "kept")).unwrap())
        .unwrap();
    let out = run(&reg).unwrap();
    assert_eq!(out.system, "kept");
    assert_eq!(out.omitted.len(), 1);
}

#[test]
fn t7_a_verbatim_section_or_context_is_never_interpolated() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .variable("secret", "hunter2")
            .section("plain", 0, "uses {{secret}}")
            .section("raw", 1, "shows {{secret}} and {{ broken")
            .verbatim()
            .dynamic_context("doc", 0, |_| Ok("doc says {{secret}}".into()))
            .verbatim(),
    )]);
    let out = run(&reg).unwrap();
    assert_eq!(out.system, "uses hunter2\n\nshows {{secret}} and {{ broken");
    assert_eq!(
        out.runtime_context.as_deref(),
        Some(format!("{RUNTIME_CONTEXT_HEADER}\n\ndoc says {{{{secret}}}}").as_str())
    );
}

/// T7 (issue 26): static verbatim text is never parsed either, so malformed groups load and
/// pass through byte for byte.
#[test]
fn t7_static_verbatim_text_with_malformed_groups_loads_and_is_kept_byte_for_byte() {
    let text = "Keep {{ odd }} and {{{x}}}, {{}} and {{secret}}.";
    let reg = registry(vec![(
        "v",
        NativePlugin::new()
            .variable("secret", "hunter2")
            .section("v:static", 1, text)
            .verbatim()
            .context("v:static", 1, text)
            .verbatim(),
    )]);
    let out = run(&reg).unwrap();
    assert_eq!(out.system, text);
    assert_eq!(
        out.runtime_context.as_deref(),
        Some(format!("{RUNTIME_CONTEXT_HEADER}\n\n{text}").as_str())
    );
    // Without `verbatim` the same text is still refused at load, naming the item.
    let (decl, provider) = NativePlugin::new().context("v:static", 1, text).build();
    let err = PluginEntry::new("v", decl, provider, PluginOptions::default()).unwrap_err();
    assert_eq!(err.code(), "malformed_reference");
    assert!(
        err.to_string()
            .starts_with("plugin `v`, context `v:static`: malformed reference at byte 5"),
        "{err}"
    );
}

/// A9 with `contexts_fail_alone` (MCP resources, issue 26): an optional plugin's failing
/// context is left out alone, its tools and other contributions keep serving, and the omission
/// names the context. Without it the whole plugin is left out.
#[test]
fn a9_a_failing_context_can_be_left_out_alone() {
    let plugin = || {
        NativePlugin::new()
            .tool("probe_search", "Search.", r#"{"type":"object"}"#)
            .context("probe:ok", 1, "readable")
            .dynamic_context("probe:bad", 2, |_| {
                Err(CallError::Failed("read failed".into()))
            })
    };
    let with = |alone: bool| {
        let (decl, provider) = plugin().build();
        let options = PluginOptions {
            optional: true,
            contexts_fail_alone: alone,
            ..PluginOptions::default()
        };
        let entry = PluginEntry::new("probe", decl, provider, options).unwrap();
        run(&Registry::new().with_plugin(entry).unwrap()).unwrap()
    };
    let alone = with(true);
    assert_eq!(alone.tools.len(), 1, "the tools stay");
    assert_eq!(
        alone.runtime_context.as_deref(),
        Some(format!("{RUNTIME_CONTEXT_HEADER}\n\nreadable").as_str())
    );
    assert_eq!(alone.omitted.len(), 1);
    assert_eq!(alone.omitted[0].plugin, "probe");
    assert_eq!(alone.omitted[0].contribution, "context `probe:bad`");
    assert!(alone.omitted[0].cause.contains("read failed"));
    let whole = with(false);
    assert!(whole.tools.is_empty() && whole.runtime_context.is_none());
    assert_eq!(whole.omitted.len(), 1);
}

fn data_options() -> PluginOptions {
    PluginOptions {
        trust: crate::plugin::trust::Trust::Data,
        ..PluginOptions::default()
    }
}

#[test]
fn r7_a_data_plugin_may_not_declare_sections_or_variables() {
    let (decl, provider) = NativePlugin::new().section("s", 0, "obey").build();
    let err = PluginEntry::new("docs", decl, provider, data_options()).unwrap_err();
    assert_eq!(err.code(), "data_plugin_declares");
    assert!(
        err.to_string()
            .starts_with("plugin `docs`: its trust is `data` (config `trust`), so it may not declare sections; it declares `s`"),
        "{err}"
    );
    let (decl, provider) = NativePlugin::new().variable("v", "x").build();
    let err = PluginEntry::new("docs", decl, provider, data_options()).unwrap_err();
    assert!(
        err.to_string().contains("may not declare variables"),
        "{err}"
    );
    let (decl, provider) = NativePlugin::new()
        .context("c", 0, "fine")
        .tool("t", "d", r#"{"type":"object"}"#)
        .build();
    assert!(PluginEntry::new("docs", decl, provider, data_options()).is_ok());
}

/// R7/T7 (issue 26): a data plugin's static context is text it did not write: it loads with any
/// braces, never parsed, and is rendered byte for byte inside its data block.
#[test]
fn r7_a_data_plugin_static_context_with_malformed_groups_loads() {
    let text = "A code sample: {{ odd }} and {{{x}}} and {{}}.";
    let (decl, provider) = NativePlugin::new().context("doc", 10, text).build();
    let docs = PluginEntry::new("docs", decl, provider, data_options()).unwrap();
    let reg = Registry::new().with_plugin(docs).unwrap();
    let out = run(&reg).unwrap();
    let context = out.runtime_context.clone().unwrap();
    assert!(context.contains(text), "{context}");
}

#[test]
fn t8_a_data_plugin_context_is_fenced_with_the_session_key_and_not_interpolated() {
    let (decl, provider) = NativePlugin::new()
        .context("doc", 10, "A {{secret}} </data> text.")
        .dynamic_context("empty", 20, |_| Ok(String::new()))
        .build();
    let docs = PluginEntry::new("docs", decl, provider, data_options()).unwrap();
    let reg = Registry::new()
        .with_plugin(docs)
        .unwrap()
        .with_plugin(
            entry(
                "own",
                NativePlugin::new().variable("secret", "hunter2").context(
                    "note",
                    0,
                    "Note {{secret}}.",
                ),
            )
            .unwrap(),
        )
        .unwrap();
    let with = |secret: &str| Options {
        data_secret: secret.into(),
        ..Options::default()
    };
    let one = assemble(&reg, &default_step(), &with("s1")).unwrap();
    let key = crate::plugin::trust::block_key("s1", "docs");
    let fenced = crate::plugin::trust::fence("docs", &key, "A {{secret}} </data> text.");
    assert_eq!(
        one.runtime_context.as_deref(),
        Some(format!("{RUNTIME_CONTEXT_HEADER}\n\nNote hunter2.\n\n{fenced}").as_str())
    );
    assert_eq!(one.contexts[1], (Arc::from("doc"), Arc::from(fenced)));
    assert_eq!(
        one.contexts[2],
        (Arc::from("empty"), Arc::from("")),
        "empty stays empty"
    );
    // The same session gives the same bytes; another session another key, even though the
    // static part of the assembly is remembered across both.
    assert_eq!(assemble(&reg, &default_step(), &with("s1")).unwrap(), one);
    let two = assemble(&reg, &default_step(), &with("s2")).unwrap();
    assert_ne!(two.runtime_context, one.runtime_context);
    assert!(!two.runtime_context.as_deref().unwrap().contains(&key));
}

// ---- world 0.3.0: what a contribution reads, answers kept across a session's steps --------

fn reads_facts(facts: &[&str]) -> crate::plugin::model::Reads {
    crate::plugin::model::Reads {
        facts: facts.iter().map(|f| f.to_string()).collect(),
        ..Default::default()
    }
}

fn session_step(n: u64, facts: &[(&str, &str)]) -> Step {
    let mut step = default_step();
    step.session_id = "s".into();
    step.step_number = n;
    step.facts = facts
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    step.inputs.last_user_message = Some(format!("question {n}"));
    step.inputs.turn_count = Some(n);
    step
}

#[test]
fn w4_a_call_is_shown_only_what_its_contributions_read() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .batched()
            .dynamic_section("task", 1, move |step| {
                s.lock().unwrap().push(format!(
                    "{:?} {} {:?} {:?}",
                    step.facts,
                    step.step_number,
                    step.inputs.last_user_message,
                    step.inputs.turn_count
                ));
                Ok(step.facts.get("task").cloned().unwrap_or_default())
            })
            .reads(crate::plugin::model::Reads {
                inputs: crate::plugin::model::Inputs {
                    last_user_message: true,
                    ..Default::default()
                },
                ..reads_facts(&["task"])
            }),
    )]);
    let step = session_step(3, &[("task", "review"), ("cwd", "/secret")]);
    let a = assemble(&reg, &step, &Options::default()).unwrap();
    assert_eq!(a.system, "review");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [r#"{"task": "review"} 0 Some("question 3") None"#],
        "no cwd, no step number, no turn count: only what it reads"
    );
}

/// A plugin asked in one call per step (world 0.2.0 and later), or one call per contribution
/// (0.1.0, and native plugins that do not batch): what it reads is honoured either way.
fn batched_or_not(batched: bool) -> NativePlugin {
    match batched {
        true => NativePlugin::new().batched(),
        false => NativePlugin::new(),
    }
}

#[test]
fn w4_an_answer_is_kept_until_what_it_reads_changes_unless_volatile() {
    for batched in [true, false] {
        kept_until_what_it_reads_changes(batched);
    }
}

fn kept_until_what_it_reads_changes(batched: bool) {
    let (calls, c) = counter();
    let (volatile_calls, v) = counter();
    let (all_calls, a) = counter();
    let reg = registry(vec![(
        "p",
        batched_or_not(batched)
            .dynamic_section("task", 1, move |step| {
                c.fetch_add(1, Ordering::SeqCst);
                Ok(format!(
                    "task {}",
                    step.facts.get("task").cloned().unwrap_or_default()
                ))
            })
            .reads(reads_facts(&["task"]))
            .dynamic_section("clock", 2, move |_| {
                v.fetch_add(1, Ordering::SeqCst);
                Ok("now".into())
            })
            .reads(crate::plugin::model::Reads {
                volatile: true,
                ..Default::default()
            })
            .dynamic_context("everything", 3, move |step| {
                a.fetch_add(1, Ordering::SeqCst);
                Ok(format!("step {}", step.step_number))
            }),
    )]);
    let mut reuse = Reuse::default();
    let mut at = |n: u64, task: &str| {
        let step = session_step(n, &[("task", task), ("other", &n.to_string())]);
        assemble_reusing(&reg, &step, &Options::default(), None, Some(&mut reuse)).unwrap()
    };
    let first = at(1, "review");
    assert!(first.reused.is_empty(), "{:?}", first.reused);
    let second = at(2, "review");
    assert_eq!(second.system, first.system);
    assert_eq!(second.reused, [Arc::from("p section `task`")]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "task's fact did not change"
    );
    assert_eq!(
        volatile_calls.load(Ordering::SeqCst),
        2,
        "volatile: asked every step"
    );
    assert_eq!(
        all_calls.load(Ordering::SeqCst),
        2,
        "no reads: asked every step"
    );
    let third = at(3, "release");
    assert_eq!(third.system, "task release\n\nnow");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "its fact changed: asked again"
    );
    assert!(third.reused.is_empty());

    // Outside a session nothing is kept.
    let before = calls.load(Ordering::SeqCst);
    let step = session_step(4, &[("task", "release")]);
    assemble(&reg, &step, &Options::default()).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), before + 1);
}

#[test]
fn w4_a_step_whose_inputs_did_not_change_makes_no_plugin_call() {
    for batched in [true, false] {
        no_call_when_nothing_read_changed(batched);
    }
}

fn no_call_when_nothing_read_changed(batched: bool) {
    let (calls, c) = counter();
    let reg = registry(vec![(
        "p",
        batched_or_not(batched)
            .dynamic_section("a", 1, move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                Ok("a".into())
            })
            .reads(reads_facts(&[]))
            .dynamic_variable("v", |_| Ok(Some("x".into())))
            .reads(reads_facts(&["task"]))
            .section("b", 2, "uses {{v}}"),
    )]);
    let mut reuse = Reuse::default();
    let step = session_step(1, &[("task", "t")]);
    let first = assemble_reusing(&reg, &step, &Options::default(), None, Some(&mut reuse)).unwrap();
    // One call for both, or one each.
    assert_eq!(first.called, if batched { 1 } else { 2 });
    let step = session_step(2, &[("task", "t"), ("noise", "1")]);
    let second =
        assemble_reusing(&reg, &step, &Options::default(), None, Some(&mut reuse)).unwrap();
    assert_eq!(second.called, 0, "{:?}", second.reused);
    assert_eq!(second.system, first.system);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A plugin with a dynamic section `task` that reads the fact `task` (`asked` runs at each
/// call), a dynamic variable `v` that reads nothing, and a static section that uses it.
fn task_plugin(batched: bool, asked: impl Fn() + Send + Sync + 'static) -> NativePlugin {
    batched_or_not(batched)
        .dynamic_section("task", 1, move |step| {
            asked();
            Ok(format!(
                "task {}",
                step.facts.get("task").cloned().unwrap_or_default()
            ))
        })
        .reads(reads_facts(&["task"]))
        .dynamic_variable("v", |_| Ok(Some("x".into())))
        .reads(reads_facts(&[]))
        .section("b", 2, "uses {{v}}")
}

#[test]
fn w4_an_assembly_without_calls_is_the_reusing_one_or_refuses_before_any_call() {
    for batched in [true, false] {
        without_calls(batched);
    }
}

fn without_calls(batched: bool) {
    let (calls, c) = counter();
    let reg = registry(vec![(
        "p",
        task_plugin(batched, move || {
            c.fetch_add(1, Ordering::SeqCst);
        }),
    )]);
    let mut reuse = Reuse::default();
    let step = |n: u64, task: &str| session_step(n, &[("task", task)]);
    // Nothing kept yet: refused, with no call made and nothing kept.
    let refused =
        assemble_without_calls(&reg, &step(1, "a"), &Options::default(), None, &mut reuse);
    assert!(matches!(refused, Err(Error::WouldCall)), "{refused:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let first = assemble_reusing(
        &reg,
        &step(1, "a"),
        &Options::default(),
        None,
        Some(&mut reuse),
    )
    .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // What it reads unchanged: served from the kept answers, as the reusing assembly would.
    let mut twin = reuse.clone();
    let inline =
        assemble_without_calls(&reg, &step(2, "a"), &Options::default(), None, &mut reuse).unwrap();
    let reusing = assemble_reusing(
        &reg,
        &step(2, "a"),
        &Options::default(),
        None,
        Some(&mut twin),
    )
    .unwrap();
    assert_eq!(inline, reusing);
    assert_eq!(inline.system, first.system);
    assert_eq!(inline.called, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // A fact it reads changed: refused again, still without a call.
    let refused =
        assemble_without_calls(&reg, &step(3, "b"), &Options::default(), None, &mut reuse);
    assert!(matches!(refused, Err(Error::WouldCall)), "{refused:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A step that would be made of exactly the answers the session's last step was made of is
/// that step's assembly, shared (nothing rendered again); any change to what it is made of
/// (an answer kept anew, a fact an item reads, another registry, a volatile item) makes it
/// afresh, and either way it is the assembly a fresh one would be.
#[test]
fn w4_a_step_made_of_the_answers_the_last_was_made_of_is_that_assembly() {
    for batched in [true, false] {
        made_of_the_answers_the_last_was_made_of(batched);
    }
}

fn made_of_the_answers_the_last_was_made_of(batched: bool) {
    let registry_of = |volatile: bool| {
        let clock = crate::plugin::model::Reads {
            volatile,
            ..Default::default()
        };
        registry(vec![(
            "p",
            task_plugin(batched, || {})
                .dynamic_context("cwd", 3, |step| {
                    Ok(format!(
                        "cwd {}",
                        step.facts.get("cwd").cloned().unwrap_or_default()
                    ))
                })
                .reads(reads_facts(&["cwd"]))
                .dynamic_section("clock", 4, |_| Ok("now".into()))
                .reads(clock),
        )])
    };
    let reg = registry_of(false);
    let step = |n: u64, task: &str| {
        session_step(n, &[("task", task), ("cwd", "/a"), ("n", &n.to_string())])
    };
    let mut reuse = Reuse::default();
    let at = |reg: &Registry, n: u64, task: &str, reuse: &mut Reuse| {
        let made = assemble_reusing(reg, &step(n, task), &Options::default(), None, Some(reuse));
        made.unwrap()
    };
    // The step as a fresh assembly (no kept answers) makes it.
    let fresh = |reg: &Registry, n: u64, task: &str| {
        let mut own = Reuse::default();
        assemble_reusing(
            reg,
            &step(n, task),
            &Options::default(),
            None,
            Some(&mut own),
        )
        .unwrap()
    };
    let same_texts = |a: &Assembly, b: &Assembly| {
        assert_eq!(
            (
                &a.system,
                &a.runtime_context,
                &a.sections,
                &a.contexts,
                &a.tools,
                &a.explain
            ),
            (
                &b.system,
                &b.runtime_context,
                &b.sections,
                &b.contexts,
                &b.tools,
                &b.explain
            )
        );
    };
    let first = at(&reg, 1, "a", &mut reuse);
    assert!(first.called > 0);
    let second = at(&reg, 2, "a", &mut reuse);
    assert_eq!(second.called, 0);
    let third = at(&reg, 3, "a", &mut reuse);
    assert!(
        Arc::ptr_eq(&second, &third),
        "made again from the same answers"
    );
    assert_eq!(third.reused, second.reused);
    // What it keeps is counted in the session's memory.
    let context = third.runtime_context.as_ref().map_or(0, String::len);
    assert!(context > 0);
    assert_eq!(reuse.bytes(), third.system.len() + context);
    same_texts(&third, &fresh(&reg, 3, "a"));
    // Also without calls allowed (the inline step's assembly).
    let inline = assemble_without_calls(&reg, &step(4, "a"), &Options::default(), None, &mut reuse);
    assert!(Arc::ptr_eq(&second, &inline.unwrap()));
    // A fact an item reads changed: asked again, made afresh, then shared again.
    let changed = at(&reg, 5, "b", &mut reuse);
    assert!(changed.called > 0 && !Arc::ptr_eq(&changed, &third));
    same_texts(&changed, &fresh(&reg, 5, "b"));
    let kept = at(&reg, 6, "b", &mut reuse);
    assert!(kept.called == 0 && !Arc::ptr_eq(&kept, &changed));
    assert!(Arc::ptr_eq(&kept, &at(&reg, 7, "b", &mut reuse)));
    // Another registry (a plugin swapped): made afresh.
    let swapped = registry_of(false);
    let after = at(&swapped, 8, "b", &mut reuse);
    assert!(!Arc::ptr_eq(&after, &kept));
    same_texts(&after, &fresh(&swapped, 8, "b"));
    // A volatile item is asked every step: never shared.
    let volatile = registry_of(true);
    let mut reuse = Reuse::default();
    let made: Vec<_> = (1..=4).map(|n| at(&volatile, n, "a", &mut reuse)).collect();
    for pair in made.windows(2) {
        assert!(!Arc::ptr_eq(&pair[0], &pair[1]));
        assert!(pair[1].called > 0);
    }
}

#[test]
fn w4_an_item_that_reads_the_whole_step_or_is_volatile_is_asked_every_step() {
    let declared = |p: NativePlugin| p.build().0.asked_every_step();
    let volatile = crate::plugin::model::Reads {
        volatile: true,
        ..Default::default()
    };
    // Static items are never asked.
    assert!(!declared(
        NativePlugin::new()
            .section("a", 1, "A")
            .context("c", 2, "C")
    ));
    // Dynamic ones that say what they read keep their answers.
    let reading = NativePlugin::new()
        .dynamic_section("a", 1, |_| Ok("a".into()))
        .reads(reads_facts(&["task"]))
        .dynamic_variable("v", |_| Ok(None))
        .reads(reads_facts(&[]));
    assert!(!declared(reading));
    // No `reads` (worlds 0.1.0 and 0.2.0), or volatile ones: asked at every step.
    assert!(declared(NativePlugin::new().dynamic_context(
        "c",
        1,
        |_| Ok("c".into())
    )));
    assert!(declared(
        NativePlugin::new()
            .dynamic_section("a", 1, |_| Ok("a".into()))
            .reads(volatile)
    ));
    assert!(declared(
        NativePlugin::new().dynamic_variable("v", |_| Ok(None))
    ));
}

#[test]
fn w4_a_plugins_declared_refresh_and_defer_stand_unless_the_config_says() {
    use crate::plugin::model::RefreshMode;
    use crate::plugin::refresh::{Kind as Part, SetBy};
    let plugin = || {
        NativePlugin::new()
            .section("catalogue", 1, "c")
            .refresh(RefreshMode::Boundary)
            .section("rules", 2, "r")
            .refresh(RefreshMode::Session)
            .tool("search", "s", OBJ)
            .deferred()
            .tool("edit", "e", OBJ)
    };
    let e = entry("p", plugin()).unwrap();
    let refresh = &e.options.refresh;
    assert_eq!(refresh.by, SetBy::Plugin);
    assert!(refresh.holds(Part::Section, "catalogue"));
    assert!(!refresh.for_session(Part::Section, "catalogue"));
    assert!(refresh.for_session(Part::Section, "rules"));
    assert!(!refresh.holds(Part::Tool, "edit"));
    assert_eq!(e.options.defer.by, SetBy::Plugin);
    assert!(e.options.defer.holds("search") && !e.options.defer.holds("edit"));

    // The operator's `refresh = "step"` and `defer = false` override both.
    let (decl, provider) = plugin().build();
    let mut options = PluginOptions::default();
    options.refresh.by = SetBy::Config;
    options.defer.by = SetBy::Config;
    let e = PluginEntry::new("p", decl, provider, options).unwrap();
    assert!(e.options.refresh.is_step());
    assert!(!e.options.defer.holds("search"));
}

// ---- the per-step fast paths give what a fresh render gives -------------------------------

#[test]
fn t1_a_static_text_split_once_takes_its_dynamic_values_fresh_each_step() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .dynamic_variable("n", |s| Ok(Some(format!("step {}", s.step_number))))
            .dynamic_variable("maybe", |s| {
                Ok((s.step_number != 3).then(|| "here".to_string()))
            })
            .section("s", 0, "a {{n}} b {{n}} c")
            .section("t", 1, "{{maybe}}"),
    )]);
    for n in [1u64, 2] {
        let step = Step {
            step_number: n,
            ..default_step()
        };
        let a = assemble(&reg, &step, &Options::default()).unwrap();
        assert_eq!(a.system, format!("a step {n} b step {n} c\n\nhere"));
    }
    // A dynamic value absent where a static text references it is the error a render gives.
    let step = Step {
        step_number: 3,
        ..default_step()
    };
    let err = assemble(&reg, &step, &Options::default()).unwrap_err();
    assert_eq!(err.code(), "variable_absent", "{err}");
    assert!(err.to_string().contains("section `t`"), "{err}");
}

#[test]
fn t1_explain_lists_the_variables_each_step_referenced_when_that_changes() {
    let reg = registry(vec![(
        "p",
        NativePlugin::new()
            .variable("a", "A")
            .variable("b", "B")
            .variable("c", "C")
            .section("fixed", 0, "{{c}}")
            .dynamic_section("d", 1, |s| {
                Ok(match s.step_number % 2 {
                    0 => "{{a}}".to_string(),
                    _ => "{{b}} {{a}}".to_string(),
                })
            }),
    )]);
    let names = |a: &Assembly| -> Vec<String> {
        a.explain.variables.iter().map(|o| o.name.clone()).collect()
    };
    for n in [2u64, 3, 4, 5, 5] {
        let step = Step {
            step_number: n,
            ..default_step()
        };
        let a = assemble(&reg, &step, &Options::default()).unwrap();
        match n % 2 {
            0 => assert_eq!(
                (a.system.as_str(), names(&a)),
                ("C\n\nA", vec!["a".into(), "c".into()])
            ),
            _ => assert_eq!(
                (a.system.as_str(), names(&a)),
                ("C\n\nB A", vec!["a".into(), "b".into(), "c".into()])
            ),
        }
    }
}
