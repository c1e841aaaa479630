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
//!
//! A daemon that serves no set yet (it just started) and whose latest set does not load
//! serves the newest older set that loads whole (at most [`FALLBACK_SETS`] tried), as the
//! daemons that kept running do. When none does, it serves none: steps are refused (503
//! `plugin_set_unavailable`) and health says `no_plugin_set`, until a set loads. A set that
//! never loads is never served as an empty registry; a store with no set published is.

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

use super::plugins::{parallel_map, LOAD_WORKERS};
use crate::events::RegistryEvent;
use crate::{plugin_dir, Daemon, DaemonError, PluginStatus, Result};
use promptd_core::load::PluginFile;
use promptd_core::plugin::state::ChangeKind;

/// Set folders kept on disk: the one serving and the one before (a reload rescans the first).
const KEPT_SETS: usize = 2;

/// Older sets a daemon serving none tries, newest first, when the latest does not load: a
/// store with thousands of broken sets does not stall a start.
pub const FALLBACK_SETS: u64 = 16;

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
    /// Whether that failure was the store's (a read that may succeed at the next poll), not
    /// the set's own: such a set is tried again.
    pub(crate) retry: bool,
    /// Whether the store's sets were read once.
    pub(crate) read: bool,
    /// Why the store's sets could not be read, until they were once.
    pub(crate) unread: Option<ErrorBody>,
}

/// A following daemon's plugin set, as `/v1/health` and `GET /v1/plugins` show it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SetStatus {
    /// The published set this daemon serves (null before one loaded).
    pub serving: Option<u64>,
    /// The latest set the store holds, as last seen.
    pub latest: Option<u64>,
    /// Why the newest set that failed did not load (the older one keeps serving, or none
    /// does), or why the store's sets could not be read.
    pub error: Option<ErrorBody>,
}

impl Daemon {
    /// The plugin set this daemon serves, when it follows a store (K10).
    pub fn set_status(&self) -> Option<SetStatus> {
        let fleet = lock(&self.plugins.fleet);
        fleet.follow.then(|| SetStatus {
            serving: fleet.serving,
            latest: fleet.latest,
            error: fleet
                .failed
                .as_ref()
                .map(|(_, e)| e.clone())
                .or_else(|| fleet.unread.clone()),
        })
    }

    /// K10: refuses a step (503 `plugin_set_unavailable`) on a following daemon that serves
    /// no set though one is published: none loaded, or the store's sets could not be read
    /// yet. A store with no set published is served as an empty registry, as before.
    pub fn check_serving(&self) -> Result<()> {
        let fleet = lock(&self.plugins.fleet);
        if !fleet.follow || fleet.serving.is_some() {
            return Ok(());
        }
        let reason = match (&fleet.failed, &fleet.unread) {
            (Some((_, failed)), _) => failed.message.clone(),
            (None, Some(unread)) => format!(
                "the store's plugin sets could not be read: {}",
                unread.message
            ),
            (None, None) => return Ok(()),
        };
        Err(DaemonError::PluginSetUnavailable { reason })
    }

    /// The folder a reload scans: the serving set's when following, else the plugin folder.
    pub(crate) fn scan_dir(&self) -> PathBuf {
        let fleet = lock(&self.plugins.fleet);
        match (&fleet.dir, fleet.follow) {
            (Some(dir), true) => dir.clone(),
            _ => self.plugins.dir.clone(),
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
            (Some(recorded), None) if lock(&self.plugins.fleet).follow => {
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
    /// one that already failed), writes it under `root` and switches to it. A daemon serving
    /// no set whose latest does not load serves the newest older one that loads whole (at most
    /// [`FALLBACK_SETS`] tried). Returns the version serving afterwards.
    pub fn follow_once(&self, root: &Path) -> Result<Option<u64>> {
        // One at a time: the loader's first call and the poll's never interleave.
        let _turn = lock(&self.plugins.following);
        let latest = match self.sessions.store.latest_set() {
            Ok(latest) => latest,
            Err(e) => {
                let error = DaemonError::from(e);
                let mut fleet = lock(&self.plugins.fleet);
                if !fleet.read {
                    fleet.unread = Some(ErrorBody::from(&error));
                }
                return Err(error);
            }
        };
        let mut fleet = lock(&self.plugins.fleet);
        (fleet.read, fleet.unread) = (true, None);
        fleet.latest = latest.as_ref().map(|s| s.version);
        let Some(set) = latest else {
            return Ok(fleet.serving);
        };
        let tried = !fleet.retry
            && fleet
                .failed
                .as_ref()
                .is_some_and(|(v, _)| *v == set.version);
        if fleet.serving >= Some(set.version) || tried {
            return Ok(fleet.serving);
        }
        let serving = fleet.serving;
        drop(fleet);
        let error = match self.take(&set, root) {
            Ok(dir) => {
                self.served(root, &set, dir, None);
                return Ok(Some(set.version));
            }
            Err(error) => error,
        };
        // A store that could not be read is no fault of the set: the next poll tries it again.
        let transient = matches!(error, DaemonError::Core(promptd_core::Error::Store(_)));
        let refused =
            |message: String| (set.version, ErrorBody::new("plugin_set_refused", message));
        if let Some(serving) = serving {
            let (version, body) = refused(format!(
                "plugin set {} was not loaded, so set {serving} keeps serving: {error}",
                set.version
            ));
            tracing::warn!(set = set.version, "{}", body.message);
            let mut fleet = lock(&self.plugins.fleet);
            (fleet.failed, fleet.retry) = (Some((version, body)), transient);
            return Ok(Some(serving));
        }
        // Serving none (a start, or no set loaded since): the newest older set that loads.
        let (older, tried) = self.fall_back(&set, root);
        match older {
            Some((older, dir)) => {
                let failed = refused(format!(
                    "plugin set {} was not loaded, so set {} serves: {error}",
                    set.version, older.version
                ));
                tracing::warn!(
                    set = older.version,
                    latest = set.version,
                    "{}",
                    failed.1.message
                );
                self.served(root, &older, dir, Some(failed));
                lock(&self.plugins.fleet).retry = transient;
                Ok(Some(older.version))
            }
            None => {
                let nor = match tried.as_slice() {
                    [] => String::new(),
                    [one] => format!(", nor was set {one}"),
                    [newest, .., oldest] => format!(", nor was any of sets {oldest} to {newest}"),
                };
                let (version, body) = refused(format!(
                    "plugin set {} was not loaded{nor}, so no set serves: {error}",
                    set.version
                ));
                tracing::warn!(set = set.version, "{}", body.message);
                let mut fleet = lock(&self.plugins.fleet);
                (fleet.failed, fleet.retry) = (Some((version, body)), transient);
                Ok(None)
            }
        }
    }

    /// Writes `set` under `root` and switches to it whole; its folder.
    fn take(&self, set: &PluginSet, root: &Path) -> Result<PathBuf> {
        self.materialize(set, root)
            .and_then(|dir| self.switch_set(set, &dir).map(|_| dir))
    }

    /// Records `set` (in `dir`) as serving, with the newer set that failed if any.
    fn served(&self, root: &Path, set: &PluginSet, dir: PathBuf, failed: Option<(u64, ErrorBody)>) {
        let mut fleet = lock(&self.plugins.fleet);
        fleet.serving = Some(set.version);
        fleet.dir = Some(dir);
        fleet.failed = failed;
        fleet.retry = false;
        drop(fleet);
        prune(root, set.version);
        tracing::info!(set = set.version, "serving plugin set");
    }

    /// The newest set older than `latest` that loads whole, trying at most [`FALLBACK_SETS`]
    /// (their folders are removed when they do not load); the versions tried that did not
    /// load, newest first.
    fn fall_back(
        &self,
        latest: &PluginSet,
        root: &Path,
    ) -> (Option<(PluginSet, PathBuf)>, Vec<u64>) {
        let mut failed = Vec::new();
        let oldest = latest.version.saturating_sub(FALLBACK_SETS).max(1);
        for version in (oldest..latest.version).rev() {
            let set = match self.sessions.store.plugin_set(version) {
                Ok(Some(set)) => set,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(set = version, "reading plugin set {version} failed: {e}");
                    break;
                }
            };
            match self.take(&set, root) {
                Ok(dir) => return (Some((set, dir)), failed),
                Err(e) => {
                    tracing::warn!(
                        set = version,
                        latest = latest.version,
                        "plugin set {version} was not loaded either (falling back from set {}): {e}",
                        latest.version
                    );
                    let _ = std::fs::remove_dir_all(root.join(format!("v{version}")));
                    failed.push(version);
                }
            }
        }
        (None, failed)
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
            let bytes = self.sessions.store.set_file(&file.sha256)?;
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
        let _changing = lock(&self.plugins.changes);
        let config = self.config();
        let mut files = Vec::with_capacity(set.files.len());
        for f in &set.files {
            files.push(plugin_dir::read(&dir.join(format!("{}.wasm", f.stem)))?);
        }
        let serving = read(&self.plugins.files).clone();
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
            let result = load::load(self.plugins.engine.as_ref(), file, &config);
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
        let mut plugins = write(&self.plugins.files);
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
            .map(|(kind, id, file, sha)| self.plugins.events.push(kind, &id, &file, &sha, None))
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

#[cfg(test)]
mod tests {
    use super::*;
    use promptd_core::config::Config;
    use promptd_core::formats::Format;
    use promptd_core::load::{Engine, Instantiated, LoadRequest};
    use promptd_core::plugin::provider::NativePlugin;
    use promptd_core::store::{
        Event, MemoryStore, NewEvent, SessionStore, SessionSummary, StoreError,
    };
    use std::sync::atomic::AtomicBool;

    /// Builds `persona-vN` (a section saying `You are vN.`); anything else does not load.
    /// Counts what it was asked to load.
    #[derive(Default)]
    struct Personas(AtomicUsize);

    impl Engine for Personas {
        fn instantiate(&self, r: LoadRequest<'_>) -> promptd_core::Result<Instantiated> {
            self.0.fetch_add(1, Ordering::Relaxed);
            let text = std::str::from_utf8(r.bytes).unwrap_or("");
            let Some(v) = text.strip_prefix("persona-v") else {
                return Err(promptd_core::Error::NotAComponent {
                    plugin: r.id.to_string(),
                    cause: format!("`{text}` is no plugin"),
                    source: None,
                });
            };
            let (declaration, provider) = NativePlugin::new()
                .section("persona", 0, &format!("You are v{v}."))
                .build();
            Ok(Instantiated {
                declaration,
                provider,
                cache: None,
            })
        }
    }

    /// A following daemon over `store`, started as `promptd serve` starts one: the store's
    /// set first, then the first load. Its set folders go under `root`.
    fn follower(store: Arc<dyn SessionStore>, root: &Path) -> (Daemon, Arc<Personas>) {
        let engine = Arc::new(Personas::default());
        let config = Config::parse("[fleet]\nfollow = true\n", "test").unwrap();
        let daemon = Daemon::loading(store, engine.clone(), config, root);
        let _ = daemon.follow_once(root);
        daemon.load_initial().unwrap();
        (daemon, engine)
    }

    fn publish(store: &dyn SessionStore, files: &[(&str, &str)]) -> u64 {
        let files: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(stem, body)| (stem.to_string(), body.as_bytes().to_vec()))
            .collect();
        store.publish_set(&files).unwrap().version
    }

    /// A step's system prompt, or the step's error code.
    fn system(d: &Daemon, id: &str) -> std::result::Result<String, &'static str> {
        let step = crate::StepRequest::new(id, crate::StepInput::default(), Format::Neutral);
        let body = d.step(step).map_err(|e| e.code())?.body.into_string();
        let body: Value = serde_json::from_str(&body).unwrap();
        Ok(body["system"].as_str().unwrap_or("").to_string())
    }

    fn error(d: &Daemon) -> String {
        d.set_status()
            .unwrap()
            .error
            .map(|e| e.message)
            .unwrap_or_default()
    }

    /// K10: a start whose latest set does not load serves the newest older set that loads
    /// whole, says so, and does not try the failed set again until a newer one is published.
    #[test]
    fn a_start_whose_latest_sets_do_not_load_serves_the_newest_older_one_that_does() {
        let root = tempfile::tempdir().unwrap();
        let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
        publish(store.as_ref(), &[("persona", "persona-v1")]);
        publish(store.as_ref(), &[("persona", "persona-v2")]);
        publish(
            store.as_ref(),
            &[("persona", "persona-v3"), ("x", "broken")],
        );
        publish(store.as_ref(), &[("x", "broken 4")]);
        let (d, engine) = follower(store.clone(), root.path());
        let status = d.set_status().unwrap();
        assert_eq!((status.serving, status.latest), (Some(2), Some(4)));
        assert!(
            error(&d).starts_with("plugin set 4 was not loaded, so set 2 serves: plugin `x`"),
            "{}",
            error(&d)
        );
        assert_eq!(d.registry().set(), Some(2));
        assert!(d.check_serving().is_ok());
        let id = d.create_session("default").unwrap();
        assert_eq!(system(&d, &id).unwrap(), "You are v2.");
        // Sets 4 and 3 failed, 2 loaded: the polls that follow try nothing again.
        let loads = engine.0.load(Ordering::Relaxed);
        assert_eq!(d.follow_once(root.path()).unwrap(), Some(2));
        assert_eq!(engine.0.load(Ordering::Relaxed), loads);
        assert!(
            !root.path().join("v3").exists(),
            "a failed older set's folder goes"
        );
        // A newer set that loads is taken as by any daemon.
        publish(store.as_ref(), &[("persona", "persona-v5")]);
        assert_eq!(d.follow_once(root.path()).unwrap(), Some(5));
        assert_eq!(d.set_status().unwrap().error, None);
        assert_eq!(system(&d, &id).unwrap(), "You are v5.");
    }

    /// K10: when no published set loads, a following daemon serves none: steps are refused
    /// with `plugin_set_unavailable`, naming the latest set and its error, until a set loads.
    #[test]
    fn a_start_none_of_whose_sets_load_refuses_steps_until_one_does() {
        let root = tempfile::tempdir().unwrap();
        let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
        publish(store.as_ref(), &[("x", "broken 1")]);
        publish(store.as_ref(), &[("x", "broken 2")]);
        let (d, _) = follower(store.clone(), root.path());
        let status = d.set_status().unwrap();
        assert_eq!((status.serving, status.latest), (None, Some(2)));
        assert!(
            error(&d).starts_with(
                "plugin set 2 was not loaded, nor was set 1, so no set serves: plugin `x`"
            ),
            "{}",
            error(&d)
        );
        let refused = d.check_serving().unwrap_err();
        assert_eq!(refused.code(), "plugin_set_unavailable");
        assert!(
            refused
                .to_string()
                .contains("serves none: plugin set 2 was not loaded"),
            "{refused}"
        );
        let id = d.create_session("default").unwrap();
        assert_eq!(system(&d, &id), Err("plugin_set_unavailable"));
        assert_eq!(d.session_events(&id).unwrap().len(), 1, "nothing recorded");
        publish(store.as_ref(), &[("persona", "persona-v3")]);
        assert_eq!(d.follow_once(root.path()).unwrap(), Some(3));
        assert!(d.check_serving().is_ok());
        assert_eq!(system(&d, &id).unwrap(), "You are v3.");
    }

    /// K10: at most [`FALLBACK_SETS`] older sets are tried: a good set 17 sets below the
    /// latest is not reached, one 16 below is.
    #[test]
    fn the_fallback_tries_at_most_sixteen_older_sets() {
        for (broken, serves) in [(17u64, None), (16, Some(1))] {
            let root = tempfile::tempdir().unwrap();
            let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
            publish(store.as_ref(), &[("persona", "persona-v1")]);
            for n in 0..broken {
                publish(store.as_ref(), &[("x", &format!("broken {n}"))]);
            }
            let (d, engine) = follower(store, root.path());
            assert_eq!(d.set_status().unwrap().serving, serves);
            // The latest, then the older ones tried.
            assert_eq!(engine.0.load(Ordering::Relaxed), 1 + FALLBACK_SETS as usize);
            if serves.is_none() {
                assert!(
                    error(&d).starts_with(
                        "plugin set 18 was not loaded, nor was any of sets 2 to 17, so no set serves"
                    ),
                    "{}",
                    error(&d)
                );
            }
        }
    }

    /// A memory store whose plugin sets cannot be read while `down` is set, nor their files
    /// while `files_down` is.
    #[derive(Default)]
    struct Flaky {
        store: MemoryStore,
        down: AtomicBool,
        files_down: AtomicBool,
    }

    impl SessionStore for Flaky {
        fn create_session(&self, agent: &str, first: NewEvent) -> Result<String, StoreError> {
            self.store.create_session(agent, first)
        }
        fn session_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
            self.store.session_agent(id)
        }
        fn events(&self, id: &str) -> Result<Vec<Event>, StoreError> {
            self.store.events(id)
        }
        fn append(&self, id: &str, next: u64, events: Vec<NewEvent>) -> Result<(), StoreError> {
            self.store.append(id, next, events)
        }
        fn sessions(&self, filter: &str, limit: usize) -> Result<Vec<SessionSummary>, StoreError> {
            self.store.sessions(filter, limit)
        }
        fn latest_set(&self) -> Result<Option<PluginSet>, StoreError> {
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable {
                    context: "reading the latest plugin set".into(),
                    source: "connection refused".into(),
                });
            }
            self.store.latest_set()
        }
        fn publish_set(&self, files: &[(String, Vec<u8>)]) -> Result<PluginSet, StoreError> {
            self.store.publish_set(files)
        }
        fn plugin_set(&self, version: u64) -> Result<Option<PluginSet>, StoreError> {
            self.store.plugin_set(version)
        }
        fn set_file(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
            if self.files_down.load(Ordering::Relaxed) {
                return Err(StoreError::Unavailable {
                    context: format!("reading plugin file {sha256}"),
                    source: "connection refused".into(),
                });
            }
            self.store.set_file(sha256)
        }
    }

    /// K10: a set whose files the store could not give (an outage, not the set's fault) is
    /// tried again at the next poll, where a set that did not load waits for a newer one.
    #[test]
    fn a_set_the_store_could_not_give_is_tried_again_at_the_next_poll() {
        let root = tempfile::tempdir().unwrap();
        let flaky = Arc::new(Flaky::default());
        publish(flaky.as_ref(), &[("persona", "persona-v1")]);
        flaky.files_down.store(true, Ordering::Relaxed);
        let (d, _) = follower(flaky.clone(), root.path());
        assert_eq!(d.set_status().unwrap().serving, None);
        assert_eq!(
            d.check_serving().unwrap_err().code(),
            "plugin_set_unavailable"
        );
        flaky.files_down.store(false, Ordering::Relaxed);
        assert_eq!(d.follow_once(root.path()).unwrap(), Some(1));
        assert!(d.check_serving().is_ok());
        assert_eq!(d.set_status().unwrap().error, None);
    }

    /// K10: a following daemon that could not read the store's sets yet serves none (it
    /// cannot tell whether a set is published); once it reads that none is, it serves the
    /// empty registry, as a store with no set published always was.
    #[test]
    fn a_start_that_cannot_read_the_stores_sets_refuses_steps_until_it_can() {
        let root = tempfile::tempdir().unwrap();
        let flaky = Arc::new(Flaky::default());
        flaky.down.store(true, Ordering::Relaxed);
        let (d, _) = follower(flaky.clone(), root.path());
        let refused = d.check_serving().unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("the store's plugin sets could not be read"),
            "{refused}"
        );
        assert_eq!(
            d.set_status().unwrap().error.unwrap().code,
            "store_unavailable"
        );
        let id = d.create_session("default").unwrap();
        assert_eq!(system(&d, &id), Err("plugin_set_unavailable"));
        flaky.down.store(false, Ordering::Relaxed);
        assert_eq!(d.follow_once(root.path()).unwrap(), None);
        assert_eq!(d.set_status().unwrap().error, None);
        assert_eq!(system(&d, &id).unwrap(), "");
        // Read once, a later outage no longer refuses steps (they need the store anyway).
        flaky.down.store(true, Ordering::Relaxed);
        assert!(d.follow_once(root.path()).is_err());
        assert!(d.check_serving().is_ok());
    }
}
