//! One plugin set for a fleet (K10): a daemon with `[fleet] follow = true` serves the plugin
//! set last published in its session store (`promptd plugins publish DIR`) instead of its
//! folder, and switches to a newer one as a whole, or not at all.
//!
//! Each poll asks the store for its latest set; a newer one is written to
//! `STATE/fleet/vN/STEM.wasm` (from the store's content-addressed files), every file of it
//! that is not serving already is loaded, and only when all load is the registry replaced, in
//! one publication, marked with the set's version. A set that does not load leaves the old one
//! serving, and the failure shows in `/v1/health` and `GET /v1/plugins` until a newer set
//! loads. Every provenance a following daemon records carries the set's version, so a step on
//! a daemon still on an older set than the session's is refused (503 `plugin_set_behind`)
//! rather than moving the session back: each session moves once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use promptd_core::load;
use promptd_core::plugin::state::PluginState;
use promptd_core::request::declaration_json;
use promptd_core::store::PluginSet;
use promptd_core::sync::{lock, read, write};
use promptd_core::ErrorBody;
use serde::Serialize;
use serde_json::Value;

use crate::events::RegistryEvent;
use crate::plugins::{parallel_map, LOAD_WORKERS};
use crate::{plugin_dir, Daemon, DaemonError, PluginStatus, Result};
use promptd_core::load::PluginFile;
use promptd_core::plugin::state::ChangeKind;

/// Set folders kept on disk: the one serving and the one before (a reload rescans the first).
const KEPT_SETS: usize = 2;

/// What a following daemon knows of the store's plugin sets.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    /// Whether the config says to follow the store (read at start).
    pub(crate) follow: bool,
    /// The folder of the set serving, which a reload rescans.
    pub(crate) dir: Option<PathBuf>,
    /// The set serving.
    pub(crate) serving: Option<u64>,
    /// The latest set the store holds, as last seen.
    pub(crate) latest: Option<u64>,
    /// The newest set that failed to load, and why.
    pub(crate) failed: Option<(u64, ErrorBody)>,
}

/// A following daemon's plugin set, as `/v1/health` and `GET /v1/plugins` show it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SetStatus {
    /// The published set this daemon serves (null before one loaded).
    pub serving: Option<u64>,
    /// The latest set the store holds, as last seen.
    pub latest: Option<u64>,
    /// Why the newest set that failed did not load (the older one keeps serving).
    pub error: Option<ErrorBody>,
}

impl Daemon {
    /// The plugin set this daemon serves, when it follows a store (K10).
    pub fn set_status(&self) -> Option<SetStatus> {
        let fleet = lock(&self.fleet);
        fleet.follow.then(|| SetStatus {
            serving: fleet.serving,
            latest: fleet.latest,
            error: fleet.failed.as_ref().map(|(_, e)| e.clone()),
        })
    }

    /// The folder a reload scans: the serving set's when following, else the plugin folder.
    pub(crate) fn scan_dir(&self) -> PathBuf {
        let fleet = lock(&self.fleet);
        match (&fleet.dir, fleet.follow) {
            (Some(dir), true) => dir.clone(),
            _ => self.plugin_dir.clone(),
        }
    }

    /// K10: refuses a step of a session whose recorded plugin set is newer than the one this
    /// daemon serves (another daemon of the fleet already moved it).
    pub(crate) fn check_set(&self, session: &str, recorded: Option<u64>) -> Result<()> {
        let serving = self.registry().set();
        match (recorded, serving) {
            (Some(recorded), Some(serving)) if recorded > serving => {
                Err(DaemonError::PluginSetBehind {
                    session: session.to_string(),
                    serving,
                    recorded,
                })
            }
            (Some(recorded), None) if lock(&self.fleet).follow => {
                Err(DaemonError::PluginSetBehind {
                    session: session.to_string(),
                    serving: 0,
                    recorded,
                })
            }
            _ => Ok(()),
        }
    }

    /// Asks the store for its latest set and, when it is newer than the one serving (and not
    /// one that already failed), writes it under `root` and switches to it. Returns the
    /// version serving afterwards.
    pub fn follow_once(&self, root: &Path) -> Result<Option<u64>> {
        let latest = self.store.latest_set()?;
        let mut fleet = lock(&self.fleet);
        fleet.latest = latest.as_ref().map(|s| s.version);
        let Some(set) = latest else {
            return Ok(fleet.serving);
        };
        let tried = fleet
            .failed
            .as_ref()
            .is_some_and(|(v, _)| *v == set.version);
        if fleet.serving >= Some(set.version) || tried {
            return Ok(fleet.serving);
        }
        drop(fleet);
        let outcome = self
            .materialize(&set, root)
            .and_then(|dir| self.switch_set(&set, &dir).map(|_| dir));
        let mut fleet = lock(&self.fleet);
        match outcome {
            Ok(dir) => {
                fleet.serving = Some(set.version);
                fleet.dir = Some(dir);
                fleet.failed = None;
                drop(fleet);
                prune(root, set.version);
                tracing::info!(set = set.version, "serving plugin set");
            }
            Err(error) => {
                let body = ErrorBody::new(
                    "plugin_set_refused",
                    format!(
                        "plugin set {} was not loaded, so set {} keeps serving: {error}",
                        set.version,
                        fleet
                            .serving
                            .map_or_else(|| "none".to_string(), |v| v.to_string())
                    ),
                );
                tracing::warn!(set = set.version, "{}", body.message);
                fleet.failed = Some((set.version, body));
                return Ok(fleet.serving);
            }
        }
        Ok(Some(set.version))
    }

    /// Writes set `set`'s files to `root/vN/STEM.wasm` from the store (each checked against
    /// its sha256); returns the folder.
    fn materialize(&self, set: &PluginSet, root: &Path) -> Result<PathBuf> {
        let dir = root.join(format!("v{}", set.version));
        let failed = |e: std::io::Error| DaemonError::PluginSetFiles {
            what: format!("writing plugin set {} to {}", set.version, dir.display()),
            source: e,
        };
        std::fs::create_dir_all(&dir).map_err(failed)?;
        for file in &set.files {
            let path = dir.join(format!("{}.wasm", file.stem));
            let fresh = std::fs::read(&path)
                .map(|b| promptd_core::store::sha256_hex(&b) == file.sha256)
                .unwrap_or(false);
            if fresh {
                continue;
            }
            let bytes = self.store.set_file(&file.sha256)?;
            if promptd_core::store::sha256_hex(&bytes) != file.sha256 {
                return Err(DaemonError::PluginSetFiles {
                    what: format!("plugin file {} of set {}", file.stem, set.version),
                    source: std::io::Error::other("its bytes do not match its sha256"),
                });
            }
            // Written whole, then renamed: a crash never leaves half a component.
            let partial = dir.join(format!(".{}.partial", file.stem));
            std::fs::write(&partial, &bytes).map_err(failed)?;
            std::fs::rename(&partial, &path).map_err(failed)?;
        }
        Ok(dir)
    }

    /// Loads every file of `set` from `dir` that is not serving already and, when all load,
    /// replaces the registry in one publication (files gone from the set leave with it);
    /// when any fails, nothing changes.
    pub fn switch_set(&self, set: &PluginSet, dir: &Path) -> Result<Vec<RegistryEvent>> {
        let _changing = lock(&self.changes);
        let config = self.config();
        let mut files = Vec::with_capacity(set.files.len());
        for f in &set.files {
            files.push(plugin_dir::read(&dir.join(format!("{}.wasm", f.stem)))?);
        }
        let serving = read(&self.plugins).clone();
        let changed: Vec<&PluginFile> = files
            .iter()
            .filter(|f| {
                serving.get(&f.stem).is_none_or(|s| {
                    s.serving_sha256.as_deref() != Some(f.sha256.as_str())
                        || config.plugin_id(&f.stem) != s.id
                })
            })
            .collect();
        let total = changed.len();
        let done = AtomicUsize::new(0);
        let started = Instant::now();
        let outcomes = parallel_map(&changed, LOAD_WORKERS, |file| {
            let result = load::load(self.engine.as_ref(), file, &config);
            done.fetch_add(1, Ordering::Relaxed);
            result
        });
        let mut loaded = Vec::with_capacity(total);
        for (file, outcome) in changed.iter().zip(outcomes) {
            // The load's own error (it names the plugin and the cause, with its code).
            loaded.push((*file, outcome.map(|(entry, _)| entry)?));
        }
        // The next registry: without what left the set, with what changed, in file order.
        let in_set: std::collections::BTreeSet<&str> =
            set.files.iter().map(|f| f.stem.as_str()).collect();
        let mut next = (*self.registry()).clone();
        let mut events: Vec<(ChangeKind, String, String, String)> = Vec::new();
        for (stem, status) in &serving {
            let renamed = loaded
                .iter()
                .any(|(f, e)| f.stem == *stem && e.id != status.id);
            if !in_set.contains(stem.as_str()) || renamed {
                if let Ok(without) = next.without(&status.id) {
                    next = without;
                }
                if !in_set.contains(stem.as_str()) {
                    events.push((
                        ChangeKind::Unload,
                        status.id.clone(),
                        status.file.clone(),
                        status.sha256.clone(),
                    ));
                }
            }
        }
        let mut statuses = Vec::with_capacity(loaded.len());
        for (file, entry) in loaded {
            let id = entry.id.clone();
            let existed = next.get(&id).is_some();
            let declares = declaration_json(&entry.declaration);
            next = next.with_replaced(entry)?;
            let path = file.path.display().to_string();
            let kind = if existed {
                ChangeKind::Reload
            } else {
                ChangeKind::Load
            };
            events.push((kind, id.clone(), path.clone(), file.sha256.clone()));
            statuses.push((file.stem.clone(), id, path, file.sha256.clone(), declares));
        }
        self.publish(next.with_set(set.version));
        let mut plugins = write(&self.plugins);
        plugins.retain(|stem, _| in_set.contains(stem.as_str()));
        for (stem, id, file, sha256, declares) in statuses {
            plugins.insert(
                stem,
                PluginStatus {
                    id,
                    file,
                    sha256: sha256.clone(),
                    serving_sha256: Some(sha256),
                    state: PluginState::Loaded,
                    last_error: None,
                    declares,
                    refresh: Value::Null,
                    held: Vec::new(),
                },
            );
        }
        drop(plugins);
        tracing::info!(
            set = set.version,
            loaded = total,
            ms = started.elapsed().as_millis() as u64,
            "plugin set loaded"
        );
        Ok(events
            .into_iter()
            .map(|(kind, id, file, sha)| self.events.push(kind, &id, &file, &sha, None))
            .collect())
    }
}

/// Removes set folders under `root` older than the [`KEPT_SETS`] newest up to `serving`.
fn prune(root: &Path, serving: u64) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let version = name
            .to_str()
            .and_then(|n| n.strip_prefix('v'))
            .and_then(|v| v.parse::<u64>().ok());
        if version.is_some_and(|v| v + (KEPT_SETS as u64) <= serving) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Polls the store every `poll` for a newer set, on a thread of its own, for as long as the
/// daemon runs.
pub fn follow(daemon: Arc<Daemon>, root: PathBuf, poll: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("promptd-fleet".into())
        .spawn(move || loop {
            std::thread::sleep(poll);
            if let Err(e) = daemon.follow_once(&root) {
                tracing::warn!(
                    "following the store's plugin sets: error[{}]: {e}",
                    e.code()
                );
            }
        })
        .map(|_| ())
}
