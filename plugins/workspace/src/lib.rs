//! `workspace`: the runtime context from step facts: working directory, git branch, OS, date.
//!
//! Facts read: `cwd`, `git_branch`, `git_dirty` ("true"/"false"), `os`, `date`. With none of
//! them the context is empty, so no snapshot message is sent.

use promptd_sdk::{export_plugin, Config, Plugin, Reads, Step};

/// The facts the context reads.
const FACTS: [&str; 5] = ["cwd", "git_branch", "git_dirty", "os", "date"];

fn describe(step: &Step) -> String {
    let mut lines = Vec::new();
    if let Some(cwd) = step.fact("cwd") {
        lines.push(format!("Working directory: {cwd}"));
    }
    if let Some(branch) = step.fact("git_branch") {
        let state = match step.fact("git_dirty") {
            Some("true") => " (uncommitted changes)",
            Some("false") => " (clean)",
            _ => "",
        };
        lines.push(format!("Git branch: {branch}{state}"));
    }
    if let Some(os) = step.fact("os") {
        lines.push(format!("Operating system: {os}"));
    }
    if let Some(date) = step.fact("date") {
        lines.push(format!("Date: {date}"));
    }
    if lines.is_empty() {
        return String::new();
    }
    format!("<workspace>\n{}\n</workspace>", lines.join("\n"))
}

fn declare(_config: &Config) -> Result<Plugin, String> {
    Ok(Plugin::new()
        .dynamic_context("workspace", 0, |step| Ok(describe(step)))
        // Asked again only when one of these facts changes (world 0.3.0).
        .reads(Reads::facts(FACTS)))
}

export_plugin!(declare);
