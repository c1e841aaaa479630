//! `promptd serve --dev WORKSPACE`: rebuild Rust plugins when their sources change.
//!
//! Watches the cargo workspace's sources (not `target/`), runs
//! `cargo build --release --target wasm32-wasip2` after a quiet moment, and copies each built
//! `.wasm` that changed into the plugin folder by rename, where the plugin watcher hot-reloads
//! it. Build errors go to the log; the running plugins keep serving.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use notify::{RecursiveMode, Watcher};

const QUIET: Duration = Duration::from_millis(300);

pub fn spawn(workspace: PathBuf, plugin_dir: PathBuf) -> anyhow::Result<()> {
    let workspace = std::fs::canonicalize(&workspace)
        .with_context(|| format!("--dev {}", workspace.display()))?;
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
            build_and_copy(&workspace, &plugin_dir); // start from fresh builds
            while let Ok(first) = rx.recv() {
                let mut relevant = is_source(&first, &target);
                while let Ok(next) = rx.recv_timeout(QUIET) {
                    relevant |= is_source(&next, &target);
                }
                if relevant {
                    build_and_copy(&workspace, &plugin_dir);
                }
            }
        })?;
    Ok(())
}

fn is_source(event: &notify::Result<notify::Event>, target: &Path) -> bool {
    let Ok(event) = event else { return false };
    event.paths.iter().any(|p| {
        !p.starts_with(target)
            && (p
                .extension()
                .is_some_and(|e| e == "rs" || e == "toml" || e == "wit"))
    })
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
        if path.extension().is_none_or(|e| e != "wasm") {
            continue;
        }
        let Some(name) = path.file_name() else {
            continue;
        };
        let dest = plugin_dir.join(name);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if std::fs::read(&dest).is_ok_and(|old| old == bytes) {
            continue;
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
}
