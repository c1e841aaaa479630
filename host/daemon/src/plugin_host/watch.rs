//! Hot reload (H1): watch the plugin folder and the config file; apply changes in bursts.
//!
//! Writers replace files in several steps (truncate + write, or write a temporary file and
//! rename it), so events are debounced: after the first event the watcher waits until the
//! folder has been quiet for [`DEBOUNCE`], then rescans once. A half-written file that slips
//! through fails to load and leaves the old version serving (H3); the write that completes it
//! is another event, and the rescan after it loads the whole file.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use promptd_core::plugin::state::ChangeKind;
use promptd_core::ErrorBody;

use crate::error::{DaemonError, Result};
use crate::plugin_dir::read_config;
use crate::Daemon;

/// How long the folder must be quiet before a rescan.
pub const DEBOUNCE: Duration = Duration::from_millis(15);

/// Keeps the watch alive; dropping it stops watching.
pub struct WatchHandle {
    _watcher: notify::RecommendedWatcher,
}

/// Watches `daemon`'s plugin folder (and `config_path`, when given) and applies changes.
pub fn watch(daemon: Arc<Daemon>, config_path: Option<PathBuf>) -> Result<WatchHandle> {
    let (tx, rx) = mpsc::channel::<notify::Result<notify::Event>>();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = tx.send(event);
    })
    .map_err(|e| watch_error(daemon.plugin_dir(), e))?;
    let dir = daemon.plugin_dir().to_path_buf();
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| watch_error(&dir, e))?;
    // Editors replace a config file by renaming over it, so watch its folder, not the file.
    let config_path = config_path.map(|p| canonical(&p).unwrap_or(p));
    if let Some(parent) = config_path.as_deref().and_then(Path::parent) {
        if parent != std::fs::canonicalize(&dir).unwrap_or(dir.clone()) {
            watcher
                .watch(parent, RecursiveMode::NonRecursive)
                .map_err(|e| watch_error(parent, e))?;
        }
    }
    std::thread::Builder::new()
        .name("promptd-watch".into())
        .spawn(move || apply_loop(&daemon, &rx, config_path.as_deref()))
        .map_err(DaemonError::WatchThread)?;
    Ok(WatchHandle { _watcher: watcher })
}

/// The path with its folder made canonical; works for a file that was just removed or renamed.
fn canonical(path: &Path) -> Option<PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(path.file_name()?))
}

fn watch_error(path: &Path, source: notify::Error) -> DaemonError {
    DaemonError::Watch {
        path: path.to_path_buf(),
        source,
    }
}

/// What a burst of events touched.
#[derive(Default)]
struct Touched {
    plugins: bool,
    config: bool,
}

impl Touched {
    fn add(&mut self, event: &notify::Event, config: Option<&Path>) {
        // Reading a file is an event too (and the daemon reads what it reloads): only changes
        // count, or every reload would trigger the next.
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        for path in &event.paths {
            if path.extension().is_some_and(|e| e == "wasm") {
                self.plugins = true;
            }
            if config.is_some() && canonical(path).as_deref() == config {
                self.config = true;
            }
        }
    }
}

fn apply_loop(
    daemon: &Daemon,
    rx: &mpsc::Receiver<notify::Result<notify::Event>>,
    config: Option<&Path>,
) {
    while let Ok(first) = rx.recv() {
        let mut touched = Touched::default();
        let note = |e: notify::Result<notify::Event>, touched: &mut Touched| match e {
            Ok(event) => touched.add(&event, config),
            Err(e) => tracing::warn!("watch error: {e}"),
        };
        note(first, &mut touched);
        // Debounce: keep collecting until the folder is quiet.
        while let Ok(next) = rx.recv_timeout(DEBOUNCE) {
            note(next, &mut touched);
        }
        if touched.config {
            if let Some(path) = config {
                apply_config(daemon, path);
                continue; // set_config rescans the plugins too
            }
        }
        if touched.plugins {
            if let Err(e) = daemon.reload() {
                tracing::warn!("rescan failed: error[{}]: {e}", e.code());
            }
        }
    }
}

/// Validates the changed config first; an invalid one is refused and the old one stays.
fn apply_config(daemon: &Daemon, path: &Path) {
    match read_config(path) {
        Ok(mut config) => {
            // The plugin folder is fixed for the daemon's life; keep serving the same one.
            config.plugin_dir = daemon.config().plugin_dir.clone();
            tracing::info!(config = %path.display(), "config changed; reloading plugins");
            if let Err(e) = daemon.set_config(config) {
                tracing::warn!(
                    "reload after config change failed: error[{}]: {e}",
                    e.code()
                );
            }
        }
        Err(e) => {
            tracing::warn!(config = %path.display(), "config refused, the old one stays: error[{}]: {e}", e.code());
            daemon.plugins.events.push(
                ChangeKind::Refused,
                "",
                &path.display().to_string(),
                "",
                Some(ErrorBody::from(&e)),
            );
        }
    }
}
