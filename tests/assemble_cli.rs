//! End-to-end: the bundled plugins, built from source to wasm32-wasip2, loaded by the real
//! `promptd` binary. SPEC rules cited per test.

use promptd_testkit as common;

use common::{fails, ok, Folder};
use serde_json::{json, Value};

const CONFIG: &str = r#"
[agents.coder]

[plugins.identity]
config = { name = "Ada", model = "model-x" }

[plugins.persona]
config = { text = "You are careful: {{style}}.", style = "small diffs, tests first" }
"#;

fn all_bundled() -> Folder {
    Folder::new()
        .bundled("identity")
        .bundled("persona")
        .bundled("tools")
        .bundled("workspace")
}

const IDENTITY: &str = "You are Ada running on the model model-x. Your instructions are assembled \
by promptd from plugins; a runtime context message, when present, describes your environment and \
supersedes earlier ones.";
const GUIDANCE: &str =
    "Tools: read a file with read_file before you change it, and change it with \
write_file, giving the whole new content. Use list_dir to look around. Use bash for builds and \
tests, not for reading or writing files.";

fn tool(name: &str, description: &str, parameters: &Value) -> Value {
    json!({"name": name, "description": description, "parameters": parameters})
}

fn expected_tools(read_only: bool) -> Vec<Value> {
    let path = |d: &str| json!({"type": "string", "description": d});
    let rel = "File path, relative to the working directory";
    let mut tools = vec![];
    if !read_only {
        tools.push(tool(
            "bash",
            "Run a shell command in the working directory.",
            &json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The shell command to run"},
                "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000,
                               "description": "Kill the command after this many milliseconds"}},
                "required": ["command"], "additionalProperties": false}),
        ));
    }
    tools.push(tool(
        "list_dir",
        "List the entries of a directory.",
        &json!({"type": "object", "properties": {
            "path": path("Directory path; defaults to the working directory")},
            "additionalProperties": false}),
    ));
    tools.push(tool(
        "read_file",
        "Read a text file.",
        &json!({"type": "object", "properties": {
            "path": path(rel),
            "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
            "limit": {"type": "integer", "minimum": 1, "description": "Most lines to read"}},
            "required": ["path"], "additionalProperties": false}),
    ));
    if !read_only {
        tools.push(tool(
            "write_file",
            "Create or overwrite a text file.",
            &json!({"type": "object", "properties": {
                "path": path(rel),
                "content": {"type": "string", "description": "The whole new content of the file"}},
                "required": ["path", "content"], "additionalProperties": false}),
        ));
    }
    tools
}

/// The exact bytes promptd prints for `value`: sorted keys, pretty, one trailing newline.
fn bytes_of(value: &Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(value).unwrap())
}

#[test]
fn bundled_plugins_assemble_to_the_exact_request() {
    // C1, C2, C4, A1, A6, T5, T6 over real components.
    let folder = all_bundled();
    let config = folder.config(CONFIG);
    let out = folder.assemble(
        &config,
        &[
            "--fact",
            "cwd=/home/ada/repo",
            "--fact",
            "git_branch=main",
            "--fact",
            "git_dirty=true",
            "--fact",
            "os=linux",
            "--fact",
            "date=2026-11-30",
        ],
    );
    let expected = json!({
        "model": {},
        "system": format!("{IDENTITY}\n\nYou are careful: small diffs, tests first.\n\n{GUIDANCE}"),
        "tools": expected_tools(false),
        "messages": [{
            "role": "user",
            "snapshot": true,
            "content": "[Runtime context: this snapshot supersedes any earlier runtime context.]\n\n\
    <workspace>\nWorking directory: /home/ada/repo\nGit branch: main (uncommitted changes)\n\
    Operating system: linux\nDate: 2026-11-30\n</workspace>",
        }],
    });
    assert_eq!(out, bytes_of(&expected));
}

#[test]
fn read_only_fact_hides_write_tools_and_says_so_in_the_runtime_context() {
    // C4 (per-step subset of known tools), A6.
    let folder = all_bundled();
    let config = folder.config(CONFIG);
    let out = folder.assemble(&config, &["--fact", "read_only=true"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tools"], json!(expected_tools(true)));
    assert_eq!(
        v["messages"],
        json!([{"role": "user", "snapshot": true, "content": "[Runtime context: this snapshot supersedes any \
earlier runtime context.]\n\nThis step is read-only: you can read and list files, but not write \
them or run commands."}])
    );
}

#[test]
fn t6_no_facts_means_no_runtime_context_message_and_keys_are_always_present() {
    let folder = all_bundled();
    let config = folder.config(CONFIG);
    let v: Value = serde_json::from_str(&folder.assemble(&config, &[])).unwrap();
    assert_eq!(v["messages"], json!([]));
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["messages", "model", "system", "tools"]);

    let empty = Folder::new();
    let config = empty.config("");
    let v: Value = serde_json::from_str(&empty.assemble(&config, &[])).unwrap();
    assert_eq!(
        v,
        json!({"messages": [], "model": {}, "system": "", "tools": []})
    );
}

#[test]
fn explain_names_the_plugin_of_every_contribution() {
    let folder = all_bundled();
    let config = folder.config(CONFIG);
    let out = folder.assemble(&config, &["--explain", "--fact", "cwd=/x"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let origin =
        |name: &str, plugin: &str| json!({"name": name, "plugin": plugin, "scope": "global"});
    assert_eq!(
        v["explain"],
        json!({
            "sections": [origin("identity", "identity"), origin("persona", "persona"),
                         origin("tools:guidance", "tools")],
            "contexts": [origin("workspace", "workspace"), origin("tools:mode", "tools")],
            "variables": [origin("agent_name", "identity"), origin("model", "identity"),
                          origin("style", "persona")],
            "tools": [origin("bash", "tools"), origin("list_dir", "tools"),
                      origin("read_file", "tools"), origin("write_file", "tools")],
            "omitted": [],
        })
    );
}

#[test]
fn a1_output_is_byte_identical_whatever_the_file_order_timing_or_process() {
    let facts = [
        "--fact",
        "cwd=/r",
        "--fact",
        "date=2026-11-30",
        "--fact",
        "os=linux",
    ];
    let forward = all_bundled();
    let config_a = forward.config(CONFIG);
    // The same plugins copied in reverse order, with different modification times (set, not
    // waited for: workspace the oldest, then tools and persona, then identity).
    let backward = Folder::new()
        .bundled("workspace")
        .bundled("tools")
        .bundled("persona")
        .bundled("identity");
    let now = std::time::SystemTime::now();
    for (name, age_ms) in [
        ("workspace", 40),
        ("tools", 20),
        ("persona", 20),
        ("identity", 0),
    ] {
        std::fs::File::options()
            .write(true)
            .open(backward.path().join(format!("{name}.wasm")))
            .and_then(|f| f.set_modified(now - std::time::Duration::from_millis(age_ms)))
            .unwrap();
    }
    let config_b = backward.config(CONFIG);

    let reference = forward.assemble(&config_a, &facts);
    for _ in 0..3 {
        assert_eq!(forward.assemble(&config_a, &facts), reference);
        assert_eq!(backward.assemble(&config_b, &facts), reference);
    }
}

#[test]
fn r3_config_scope_makes_an_agent_scoped_persona_that_shadows_for_that_agent_only() {
    let folder = all_bundled();
    std::fs::copy(
        folder.path().join("persona.wasm"),
        folder.path().join("coder_persona.wasm"),
    )
    .unwrap();
    let config = folder.config(&format!(
        "{CONFIG}\n[plugins.coder_persona]\nscope = \"coder\"\nconfig = {{ text = \"You write Rust.\" }}\n"
    ));
    let coder: Value =
        serde_json::from_str(&folder.assemble(&config, &["--agent", "coder"])).unwrap();
    let default: Value = serde_json::from_str(&folder.assemble(&config, &[])).unwrap();
    let system = |v: &Value| v["system"].as_str().unwrap().to_string();
    assert!(
        system(&coder).contains("\n\nYou write Rust.\n\n"),
        "{}",
        system(&coder)
    );
    assert!(!system(&coder).contains("You are careful"));
    assert!(system(&default).contains("You are careful: small diffs, tests first."));
    assert!(!system(&default).contains("You write Rust."));
}

#[test]
fn a4_runtime_context_can_be_turned_off_per_agent() {
    let folder = all_bundled();
    let config = folder.config(&format!(
        "{CONFIG}\n[agents.quiet]\nruntime_context = false\n"
    ));
    let out = folder.assemble(&config, &["--agent", "quiet", "--fact", "cwd=/x"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["messages"], json!([]));
}

#[test]
fn a7_tool_order_from_config() {
    let folder = all_bundled();
    let config = folder.config(&format!(
        "tool_order = [\"bash\", \"<unlisted-tools>\", \"read_file\"]\n{CONFIG}"
    ));
    let v: Value = serde_json::from_str(&folder.assemble(&config, &[])).unwrap();
    let names: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bash", "list_dir", "write_file", "read_file"]);
}

#[test]
fn a8_unknown_tool_order_names_fail_listing_all_and_the_known_tools() {
    let folder = all_bundled();
    let config = folder.config(&format!(
        "tool_order = [\"todo_write\", \"<unlisted-tools>\", \"grep\"]\n{CONFIG}"
    ));
    let line = folder.assemble_fails(&config, &[], "unknown_tool_order_name");
    assert!(line.contains("grep, todo_write"), "{line}");
    assert!(
        line.contains("known tools: bash, list_dir, read_file, write_file"),
        "{line}"
    );
}

#[test]
fn r6_a_bad_tool_order_is_a_config_error() {
    let folder = all_bundled();
    let config = folder.config("tool_order = [\"bash\"]\n");
    folder.assemble_fails(&config, &[], "tool_order_missing_rest");
    let config = folder.config("tool_order = [\"bash\", \"<unlisted-tools>\", \"bash\"]\n");
    folder.assemble_fails(&config, &[], "tool_order_duplicate");
}

#[test]
fn t4_unknown_variable_names_section_plugin_and_registered_variables() {
    let folder = all_bundled();
    let config = folder.config("[plugins.persona]\nconfig = { text = \"Hi {{nickname}}\" }\n");
    let line = folder.assemble_fails(&config, &[], "unknown_variable");
    assert!(
        line.contains("section `persona` (plugin `persona`)"),
        "{line}"
    );
    assert!(line.contains("`nickname`"), "{line}");
    assert!(
        line.contains("registered variables: agent_name, model"),
        "{line}"
    );
}

#[test]
fn t3_malformed_reference_in_config_text_refuses_the_plugin_showing_where() {
    let folder = Folder::new().bundled("persona");
    let config = folder.config("[plugins.persona]\nconfig = { text = \"ab {{{x}}}\" }\n");
    let line = folder.assemble_fails(&config, &[], "malformed_reference");
    assert!(line.contains("byte 3"), "{line}");
    assert!(line.contains("(`{{{x}}`)"), "{line}");
    assert!(
        line.contains("plugin `persona`, section `persona`"),
        "{line}"
    );
}

#[test]
fn bad_command_line_and_config_input_get_clear_errors() {
    let folder = all_bundled();
    let config = folder.config("");
    let line = folder.assemble_fails(&config, &["--fact", "novalue"], "bad_argument");
    assert!(line.contains("novalue"), "{line}");
    let other = Folder::new();
    let bad = other.config("[agents.coder]\nparnet = \"x\"\n");
    let line = folder.assemble_fails(&bad, &[], "config_parse");
    assert!(
        line.contains("line 3, column 1: unknown field `parnet`"),
        "{line}"
    );
    let line = fails(
        &[
            "assemble",
            "--plugins",
            "/no/such/dir",
            "--config",
            config.to_str().unwrap(),
        ],
        "plugin_dir",
    );
    assert!(line.contains("/no/such/dir"), "{line}");
    let line = folder.assemble_fails(&config, &["--agent", "has space"], "invalid_agent");
    assert!(line.contains("`has space`"), "{line}");
}

#[test]
fn plugin_check_prints_what_a_plugin_declares() {
    let folder = Folder::new().bundled("tools");
    let file = folder.path().join("tools.wasm");
    let v: Value = serde_json::from_str(&ok(&["plugin", "check", file.to_str().unwrap()])).unwrap();
    assert_eq!(v["id"], "tools");
    assert!(v["origin"].as_str().unwrap().contains("sha256:"));
    let d = &v["declares"];
    assert_eq!(d["filters_tools"], true);
    assert_eq!(
        d["sections"],
        json!([{"name": "tools:guidance", "order": 100, "complete": false, "scope": "global",
                "text": {"static": GUIDANCE}}])
    );
    assert_eq!(
        d["contexts"],
        json!([{"name": "tools:mode", "order": 100, "scope": "global", "text": "dynamic"}])
    );
    let names: Vec<&str> = d["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", "write_file", "list_dir", "bash"]);
}

/// W4: `promptd assemble` shows a plugin of world 0.3.0 the request inputs it declares it
/// reads — the last user message, the model, the client's tools — as a daemon's step would.
#[test]
fn w4_assemble_passes_the_request_inputs_a_plugin_reads() {
    let folder = Folder::new().scripted("inputs");
    let config = folder
        .config("[agents.coder]\n[plugins.inputs.config]\n\"input_section.inputs:seen\" = \"5\"\n");
    let args = [
        "--agent",
        "coder",
        "--user",
        "list the files",
        "--model",
        "claude-sonnet-4-5",
        "--client-tool",
        "read_file",
        "--client-tool",
        "bash",
    ];
    let out: Value = serde_json::from_str(&folder.assemble(&config, &args)).unwrap();
    let seen = out.to_string();
    assert!(
        seen.contains(
            "model=claude-sonnet-4-5; tools=read_file,bash; turns=1; last=list the files"
        ),
        "{seen}"
    );
    // Without them, the plugin is shown none, and the model falls back to the fact `model`.
    let out = folder.assemble(&config, &["--agent", "coder", "--fact", "model=m-1"]);
    assert!(out.contains("model=m-1; tools=; turns=0; last="), "{out}");
}
