//! `promptd serve --dev DIR`: rebuild plugins when their sources change.
//!
//! DIR is a cargo workspace of Rust plugins (e.g. `plugins/`, or a folder from
//! `promptd plugin new --lang rust`), or a JavaScript, Python or C plugin folder from
//! `promptd plugin new`. After a quiet moment following a source change it builds
//! (`cargo build --release --target wasm32-wasip2`, or what `promptd plugin build` runs) and
//! copies each built `.wasm` that changed into the plugin folder by rename, where the plugin
//! watcher hot-reloads it. Build errors go to the log; the running plugins keep serving.

use crate::error::CliError;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

const QUIET: Duration = Duration::from_millis(300);

/// What `--dev` rebuilds.
#[derive(Clone, Copy)]
enum Project {
    /// A cargo workspace: every `.wasm` it builds is a plugin.
    Cargo,
    /// One plugin folder in another language, built like `promptd plugin build`.
    Folder,
}

pub fn spawn(workspace: &Path, plugin_dir: PathBuf) -> anyhow::Result<()> {
    let workspace = std::fs::canonicalize(workspace).map_err(|e| CliError::BadArgument {
        flag: "--dev",
        value: workspace.display().to_string(),
        expected: e.to_string(),
    })?;
    let project = if workspace.join("Cargo.toml").is_file() {
        Project::Cargo
    } else if crate::scaffold::is_plugin_folder(&workspace) {
        Project::Folder
    } else {
        anyhow::bail!(CliError::BadArgument {
            flag: "--dev",
            value: workspace.display().to_string(),
            expected: "a cargo workspace or a plugin folder (plugin.js, app.py or .c files)".into(),
        });
    };
    let (tx, rx) = mpsc::channel::<notify::Result<notify::Event>>();
    let mut watcher = notify::recommended_watcher(move |e| {
        let _ = tx.send(e);
    })?;
    watcher.watch(&workspace, RecursiveMode::Recursive)?;
    let target = workspace.join("target");
    std::thread::Builder::new()
        .name("promptd-dev".into())
        .spawn(move || {
            let _watcher = watcher; // lives as long as the thread
            let build = || match project {
                Project::Cargo => build_and_copy(&workspace, &plugin_dir),
                Project::Folder => build_folder(&workspace, &plugin_dir),
            };
            build(); // start from fresh builds
            while let Ok(first) = rx.recv() {
                let mut relevant = is_source(&first, &target);
                while let Ok(next) = rx.recv_timeout(QUIET) {
                    relevant |= is_source(&next, &target);
                }
                if relevant {
                    build();
                }
            }
        })?;
    Ok(())
}

/// Source files of any plugin language; not build output, installed packages or caches.
fn is_source(event: &notify::Result<notify::Event>, target: &Path) -> bool {
    const SOURCES: [&str; 9] = ["rs", "toml", "wit", "js", "mjs", "json", "py", "c", "h"];
    let Ok(event) = event else { return false };
    // Builds read the sources; reads must not trigger the next build.
    if matches!(event.kind, notify::EventKind::Access(_)) {
        return false;
    }
    event.paths.iter().any(|p| {
        !p.starts_with(target)
            && !p.components().any(|c| {
                let c = c.as_os_str();
                c == "node_modules" || c == "__pycache__"
            })
            && p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| SOURCES.contains(&e))
    })
}

fn build_folder(dir: &Path, plugin_dir: &Path) {
    tracing::info!(plugin = %dir.display(), "dev: building the plugin");
    match crate::scaffold::build_plugin(dir) {
        Ok(built) => copy_if_changed(&built, plugin_dir),
        Err(e) => tracing::warn!("dev: build failed; the running plugins keep serving: {e:#}"),
    }
}

fn build_and_copy(workspace: &Path, plugin_dir: &Path) {
    tracing::info!(workspace = %workspace.display(), "dev: building plugins");
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=short",
        ])
        .current_dir(workspace)
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) => return tracing::warn!("dev: cannot run cargo: {e}"),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return tracing::warn!(
            "dev: build failed; the running plugins keep serving:\n{}",
            tail.join("\n")
        );
    }
    let built = workspace.join("target/wasm32-wasip2/release");
    let Ok(entries) = std::fs::read_dir(&built) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "wasm") {
            copy_if_changed(&path, plugin_dir);
        }
    }
}

/// Copies a built plugin into the plugin folder unless the same bytes are already there.
fn copy_if_changed(path: &Path, plugin_dir: &Path) {
    let Some(name) = path.file_name() else {
        return;
    };
    let dest = plugin_dir.join(name);
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    if std::fs::read(&dest).is_ok_and(|old| old == bytes) {
        return;
    }
    // Rename into place, so the plugin watcher never sees a half-written file.
    let tmp = plugin_dir.join(format!(".{}.tmp", name.to_string_lossy()));
    if std::fs::write(&tmp, &bytes)
        .and_then(|_| std::fs::rename(&tmp, &dest))
        .is_ok()
    {
        tracing::info!(plugin = %dest.display(), "dev: updated");
    }
}
