//! End-to-end: broken and misbehaving plugins are refused with a clear, coded error (R1, R2,
//! A9, A10). Real components: the `scripted` fixture (Rust, built from source) configured to
//! misbehave, hand-written WAT components, and raw bytes.

use promptd_testkit as common;

use common::{fails, ok, Folder};
use promptd_core::load;
use promptd_daemon::plugin_dir;
use promptd_engine::WasmEngine;
use serde_json::Value;

fn check(folder: &Folder, name: &str, code: &str) -> String {
    let file = folder.path().join(format!("{name}.wasm"));
    let config = folder.path().join("promptd.toml");
    let mut args = vec!["plugin", "check", file.to_str().unwrap()];
    if config.exists() {
        args.extend(["--config", config.to_str().unwrap()]);
    }
    fails(&args, code)
}

fn assemble_fails(folder: &Folder, code: &str) -> String {
    let config = folder.path().join("promptd.toml");
    if !config.exists() {
        folder.config("");
    }
    folder.assemble_fails(&config, &[], code)
}

#[test]
fn garbage_bytes_are_not_a_component() {
    let folder = Folder::new().bytes("junk", b"this is not wasm at all");
    let line = check(&folder, "junk", "not_a_component");
    assert!(
        line.contains("plugin `junk`") && line.contains("magic bytes"),
        "{line}"
    );
    assemble_fails(&folder, "not_a_component");
}

#[test]
fn a_truncated_plugin_is_not_a_component() {
    let bytes = std::fs::read(common::bundled().join("persona.wasm")).unwrap();
    let folder = Folder::new().bytes("half", &bytes[..bytes.len() / 2]);
    check(&folder, "half", "not_a_component");
    let empty = Folder::new().bytes("empty", b"");
    let line = check(&empty, "empty", "not_a_component");
    assert!(line.contains("the file is empty"), "{line}");
}

#[test]
fn a_core_module_is_not_a_component() {
    let module = wat::parse_str("(module (func (export \"declare\")))").unwrap();
    let folder = Folder::new().bytes("core", &module);
    let line = check(&folder, "core", "not_a_component");
    assert!(
        line.contains("plugin `core`") && line.contains("core WebAssembly module"),
        "{line}"
    );
}

#[test]
fn a_component_of_another_world_is_refused() {
    let empty = wat::parse_str("(component)").unwrap();
    let folder = Folder::new().bytes("empty_world", &empty);
    let line = check(&folder, "empty_world", "wrong_world");
    // Neither world: the error names the current one and the older one it also serves (W1),
    // and what is missing.
    assert!(
        line.contains(
            "does not implement the world promptd:plugin/plugin@0.3.0 (nor the older @0.2.0 or @0.1.0)"
        ) && line.contains("declare"),
        "{line}"
    );

    // Imports something the host does not provide.
    let alien = wat::parse_str(
        r#"(component (import "acme:thing/api@1.0.0" (instance (export "f" (func)))))"#,
    )
    .unwrap();
    let folder = Folder::new().bytes("alien", &alien);
    let line = check(&folder, "alien", "wrong_world");
    assert!(line.contains("acme:thing/api@1.0.0"), "{line}");
}

#[test]
fn r1_a_duplicate_name_refuses_the_plugin() {
    let folder = Folder::new().scripted("dup");
    folder.config("[plugins.dup]\nconfig = { duplicate_section = \"persona\" }\n");
    let line = check(&folder, "dup", "duplicate_name");
    assert!(
        line.contains("plugin `dup`") && line.contains("section `persona`"),
        "{line}"
    );
}

#[test]
fn r1_an_invalid_tool_schema_refuses_the_plugin() {
    let folder = Folder::new().scripted("schema");
    folder.config("[plugins.schema]\nconfig = { \"tool.grep\" = '{\"type\": \"object\"' }\n");
    let line = check(&folder, "schema", "invalid_schema");
    assert!(
        line.contains("tool `grep`") && line.contains("not valid JSON"),
        "{line}"
    );

    folder.config("[plugins.schema]\nconfig = { \"tool.grep\" = '\"object\"' }\n");
    let line = check(&folder, "schema", "invalid_schema");
    assert!(line.contains("must be an object, got a string"), "{line}");
}

#[test]
fn a8_the_rest_marker_is_refused_as_a_tool_name() {
    let folder = Folder::new().scripted("sneaky");
    folder.config("[plugins.sneaky]\nconfig = { \"tool.<unlisted-tools>\" = '{}' }\n");
    check(&folder, "sneaky", "reserved_tool_name");
}

#[test]
fn r1_invalid_names_refuse_the_plugin() {
    let folder = Folder::new().scripted("names");
    folder.config("[plugins.names]\nconfig = { \"variable.Bad\" = 'x' }\n");
    let line = check(&folder, "names", "invalid_name");
    assert!(line.contains("variable name `Bad`"), "{line}");
    folder.config("[plugins.names]\nconfig = { \"tool.read.file\" = '{}' }\n");
    check(&folder, "names", "invalid_name");
}

#[test]
fn a_trap_in_declare_refuses_the_plugin_with_the_cause() {
    let folder = Folder::new().scripted("trapper");
    folder.config("[plugins.trapper]\nconfig = { trap_in_declare = \"true\" }\n");
    let line = check(&folder, "trapper", "declare_failed");
    assert!(
        line.contains("plugin `trapper`: declare failed: wasm trap"),
        "{line}"
    );
    assert!(line.contains("unreachable"), "{line}");
    assert!(
        line.contains("the plugin logged: panic:") && line.contains("trap_in_declare is set"),
        "{line}"
    );
}

#[test]
fn an_error_from_declare_is_shown_verbatim() {
    let folder = Folder::new().scripted("picky");
    folder
        .config("[plugins.picky]\nconfig = { fail_declare = \"config key `url` is required\" }\n");
    let line = check(&folder, "picky", "declare_failed");
    assert!(
        line.ends_with("declare failed: config key `url` is required"),
        "{line}"
    );
}

#[test]
fn r2_a_conflict_refuses_the_later_file_and_names_both_plugins() {
    let folder = Folder::new().scripted("a_first").scripted("b_second");
    let config = folder.config(
        "[plugins.a_first]\nconfig = { \"section.persona\" = \"0|first\" }\n\
         [plugins.b_second]\nconfig = { \"section.persona\" = \"0|second\" }\n",
    );
    // The CLI is strict: a refused plugin fails the command.
    let line = assemble_fails(&folder, "section_conflict");
    assert!(
        line.contains("plugin `b_second` conflicts with plugin `a_first`")
            && line.contains("section `persona` in scope `global`"),
        "{line}"
    );

    // The library keeps the plugin loaded first serving, whatever the timing: file-name order.
    let runtime = WasmEngine::new().unwrap();
    let config = plugin_dir::read_config(&config).unwrap();
    for _ in 0..3 {
        let loaded = load::load_all(
            &runtime,
            plugin_dir::read_all(folder.path()).unwrap(),
            &config,
        );
        let ids: Vec<&str> = loaded.registry.plugins().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["a_first"]);
        assert_eq!(loaded.refused.len(), 1);
        assert_eq!(loaded.refused[0].error.code(), "section_conflict");
    }
}

#[test]
fn a9_a_trapping_dynamic_section_fails_the_assembly_naming_plugin_and_section() {
    let folder = Folder::new().scripted("boom");
    folder.config("[plugins.boom]\nconfig = { \"trap_section.news\" = \"5\", \"section.base\" = \"0|base\" }\n");
    let line = assemble_fails(&folder, "plugin_trap");
    assert!(line.contains("plugin `boom`, section `news`"), "{line}");
    assert!(line.contains("trap_section called"), "{line}");
}

#[test]
fn a9_an_optional_plugin_that_traps_is_left_out_and_reported() {
    let folder = Folder::new().scripted("base").scripted("boom");
    let config = folder.config(
        "[plugins.base]\nconfig = { \"section.persona\" = \"0|base persona\" }\n\
         [plugins.boom]\noptional = true\nscope = \"default\"\n\
         config = { \"trap_section.persona\" = \"0\", \"tool.extra\" = '{\"type\":\"object\"}' }\n",
    );
    let out = ok(&[
        "assemble",
        "--plugins",
        folder.path().to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--explain",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["system"], "base persona");
    assert_eq!(v["tools"], serde_json::json!([]));
    let omitted = &v["explain"]["omitted"][0];
    assert_eq!(omitted["plugin"], "boom");
    assert_eq!(omitted["contribution"], "section `persona`");
    assert!(
        omitted["cause"].as_str().unwrap().contains("unreachable"),
        "{omitted}"
    );
}

/// Loads every plugin in `folder` with `config` through the library, as the daemon does. The
/// engine is returned too: dropping it stops its epoch ticker, and with it call deadlines.
fn load_folder(folder: &Folder, config: &std::path::Path) -> (WasmEngine, load::LoadedSet) {
    let config = plugin_dir::read_config(config).unwrap();
    let files = plugin_dir::read_all(folder.path()).unwrap();
    let engine = WasmEngine::new().unwrap();
    let loaded = load::load_all(&engine, files, &config);
    (engine, loaded)
}

#[test]
fn dynamic_sections_see_the_step_and_a_fresh_instance_serves_after_a_trap() {
    let folder = Folder::new().scripted("dyn");
    let config = folder.config(
        "[plugins.dyn]\nconfig = { \"dynamic_section.hello\" = \"0|hello $agent\", \"trap_section.bad\" = \"1\" }\n",
    );
    let (_engine, loaded) = load_folder(&folder, &config);
    let entry = loaded.registry.get("dyn").unwrap();
    let step = promptd_core::plugin::model::Step {
        agent: "coder".into(),
        scope_chain: vec!["global".into(), "coder".into()].into(),
        ..Default::default()
    };
    let global = promptd_core::plugin::model::Scope::Global;
    let trap = entry
        .provider
        .section_text("bad", &global, &step)
        .unwrap_err();
    assert!(
        matches!(trap, promptd_core::plugin::provider::CallError::Trapped(_)),
        "{trap:?}"
    );
    // L3: the trapped instance is dropped; the next call runs on a fresh, re-declared one.
    let text = entry
        .provider
        .section_text("hello", &global, &step)
        .unwrap();
    assert_eq!(text, "hello coder");
}

/// Calls section `busy` of the one plugin in `folder` from two threads at once.
fn two_concurrent_calls(instances: u32) -> Vec<String> {
    let folder = Folder::new().scripted("busy");
    let config = folder.config(&format!(
        "[plugins.busy]\ninstances = {instances}\nconfig = {{ \"busy_section.busy\" = \"0|400\" }}\n"
    ));
    let (_engine, loaded) = load_folder(&folder, &config);
    let provider = loaded.registry.get("busy").unwrap().provider.clone();
    let start = std::sync::Arc::new(std::sync::Barrier::new(2));
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let (provider, start) = (provider.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let step = promptd_core::plugin::model::Step::default();
                provider
                    .section_text("busy", &promptd_core::plugin::model::Scope::Global, &step)
                    .unwrap()
            })
        })
        .collect();
    let mut texts: Vec<String> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    texts.sort();
    // A later call reuses a warm instance rather than making another.
    let step = promptd_core::plugin::model::Step::default();
    texts.push(
        provider
            .section_text("busy", &promptd_core::plugin::model::Scope::Global, &step)
            .unwrap(),
    );
    texts
}

#[test]
fn l6_concurrent_calls_into_one_plugin_are_served_by_different_instances() {
    assert_eq!(
        two_concurrent_calls(2),
        [
            "call 1 of this instance",
            "call 1 of this instance",
            "call 2 of this instance"
        ]
    );
    // With one instance allowed, the second caller waits for it.
    assert_eq!(
        two_concurrent_calls(1),
        [
            "call 1 of this instance",
            "call 2 of this instance",
            "call 3 of this instance"
        ]
    );
}
