//! `tools`: file and shell tools with guidance (order 100, by convention).
//!
//! Step fact `read_only` = "true" hides the tools that change things (`write_file`, `bash`)
//! and says so in the runtime context.

use promptd_sdk::{export_plugin, Config, Plugin, Reads};

const READ_FILE: &str = r#"{"type":"object","properties":{"path":{"type":"string","description":"File path, relative to the working directory"},"offset":{"type":"integer","minimum":1,"description":"First line to read (1-based)"},"limit":{"type":"integer","minimum":1,"description":"Most lines to read"}},"required":["path"],"additionalProperties":false}"#;
const WRITE_FILE: &str = r#"{"type":"object","properties":{"path":{"type":"string","description":"File path, relative to the working directory"},"content":{"type":"string","description":"The whole new content of the file"}},"required":["path","content"],"additionalProperties":false}"#;
const LIST_DIR: &str = r#"{"type":"object","properties":{"path":{"type":"string","description":"Directory path; defaults to the working directory"}},"additionalProperties":false}"#;
const BASH: &str = r#"{"type":"object","properties":{"command":{"type":"string","description":"The shell command to run"},"timeout_ms":{"type":"integer","minimum":1,"maximum":600000,"description":"Kill the command after this many milliseconds"}},"required":["command"],"additionalProperties":false}"#;

const GUIDANCE: &str =
    "Tools: read a file with read_file before you change it, and change it with \
                        write_file, giving the whole new content. Use list_dir to look around. \
                        Use bash for builds and tests, not for reading or writing files.";
const READ_ONLY_NOTE: &str = "This step is read-only: you can read and list files, but not \
                              write them or run commands.";

fn read_only(step: &promptd_sdk::Step) -> bool {
    step.fact("read_only") == Some("true")
}

fn declare(_config: &Config) -> Result<Plugin, String> {
    Ok(Plugin::new()
        // The mode and the tool filter read the fact `read_only` only (world 0.3.0).
        .reads_by_default(Reads::facts(["read_only"]))
        // Static guidance keeps the system prompt stable across steps (prefix caches hit);
        // the per-step mode goes into the runtime context instead.
        .section("tools:guidance", 100, GUIDANCE)
        .dynamic_context("tools:mode", 100, |step| {
            Ok(if read_only(step) { READ_ONLY_NOTE } else { "" }.to_string())
        })
        .tool("read_file", "Read a text file.", READ_FILE)
        .tool("write_file", "Create or overwrite a text file.", WRITE_FILE)
        .tool("list_dir", "List the entries of a directory.", LIST_DIR)
        .tool(
            "bash",
            "Run a shell command in the working directory.",
            BASH,
        )
        .show_tools(|step| {
            let all = ["bash", "list_dir", "read_file", "write_file"];
            let hidden: &[&str] = if read_only(step) {
                &["bash", "write_file"]
            } else {
                &[]
            };
            Ok(all
                .iter()
                .filter(|t| !hidden.contains(t))
                .map(|t| t.to_string())
                .collect())
        }))
}

export_plugin!(declare);
