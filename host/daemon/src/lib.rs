//! promptd's daemon: the state and operations behind the HTTP API, without HTTP.
//!
//! [`Daemon`] holds the plugin folder's state, the published registry and the session store;
//! [`http`] serves it, [`watch`] feeds it file changes. It is built from its parts with
//! [`Daemon::new`]: any [`Engine`] (wasmtime in the binary, native providers in tests) and any
//! [`SessionStore`] (SQLite in the binary, memory in tests).
//!
//! Every method is synchronous (plugin calls and the store are blocking); the HTTP layer runs
//! them on tokio's blocking pool. The registry is an immutable snapshot behind a lock that is
//! held only to clone or replace an `Arc`, so a step assembles on the snapshot it started with
//! while plugins change (H2).
//!
//! ```
//! use std::sync::Arc;
//! use promptd_core::{config::Config, load::*, provider::NativePlugin, store::MemoryStore};
//! use promptd_daemon::{Daemon, StepInput};
//!
//! /// An engine whose "components" are native plugins, chosen by file name.
//! struct Native;
//! impl Engine for Native {
//!     fn instantiate(&self, r: LoadRequest<'_>) -> promptd_core::Result<Instantiated> {
//!         let (declaration, provider) = NativePlugin::new().section("persona", 0, "Be brief.").build();
//!         Ok(Instantiated { declaration, provider, cache: None })
//!     }
//! }
//!
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("persona.wasm"), b"native").unwrap();
//! let daemon = Daemon::new(Arc::new(MemoryStore::new()), Arc::new(Native), Config::default(), dir.path()).unwrap();
//! let id = daemon.create_session("default").unwrap();
//! let (step, body) = daemon.step(&id, &StepInput::default(), promptd_core::formats::Format::Neutral).unwrap();
//! assert_eq!(step, 1);
//! assert_eq!(body, r#"{"messages":[],"model":{},"system":"Be brief.","tools":[]}"#);
//! ```

pub mod api;
pub mod error;
pub mod events;
pub mod external;
pub mod http;
mod locks;
pub mod metrics;
pub mod plugin_dir;
pub mod server;
mod sessions;
mod steps;
pub mod ui;
pub mod watch;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use promptd_core::config::Config;
use promptd_core::load::{self, CacheLookup, Engine, PluginFile};
use promptd_core::plugin_state::{ChangeKind, PluginState};
use promptd_core::registry::{PluginEntry, Registry};
use promptd_core::request::declaration_json;
use promptd_core::session::log::{Body, SessionCreated};
use promptd_core::store::SessionStore;
use promptd_core::{Error, ErrorBody};
use serde::Serialize;
use serde_json::Value;

pub use error::{DaemonError, Result};
use events::{RegistryEvent, RegistryEvents};
pub use external::{ToolOutcome, ToolRun, ToolRunner};
use locks::SessionLocks;
use metrics::Metrics;
use promptd_core::budget::Counter;
use sessions::SessionCache;

/// What `GET /v1/plugins` shows for each plugin file.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct PluginStatus {
    /// The plugin's id.
    pub id: String,
    /// The plugin file's path (for an MCP server, its command line or URL).
    pub file: String,
    /// SHA-256 of the file as last read.
    pub sha256: String,
    /// SHA-256 of the version serving now (differs from `sha256` while `stale`).
    pub serving_sha256: Option<String>,
    /// Whether it is loaded, refused, stale or quarantined.
    pub state: PluginState,
    /// Why its last load or call failed, if it did.
    pub last_error: Option<ErrorBody>,
    /// What the serving version declares (null when none serves).
    #[schema(value_type = Object)]
    pub declares: Value,
}

pub use promptd_core::step::StepInput;
pub(crate) use promptd_core::sync::lock;
use promptd_core::sync::{read, recover, write};

/// The daemon's state: config, plugin registry, session store and caches, shared by the HTTP API, the watcher and the MCP servers.
pub struct Daemon {
    engine: Arc<dyn Engine>,
    config: RwLock<Arc<Config>>,
    plugin_dir: PathBuf,
    registry: RwLock<Arc<Registry>>,
    /// By file stem.
    plugins: RwLock<BTreeMap<String, PluginStatus>>,
    /// Contributors that are not files (MCP servers), by plugin id.
    externals: RwLock<BTreeMap<String, external::External>>,
    store: Arc<dyn SessionStore>,
    /// This process's run id, recorded with every header it writes: a header that changed
    /// since another run (another daemon, an earlier process) wrote the last one is recorded
    /// as `resume`, one this run wrote as `change` (Q3). Kept in the log, so the daemon needs
    /// no per-session memory for it.
    run: String,
    /// Serialises registry changes (watcher, API calls), so none is lost to a race.
    changes: Mutex<()>,
    /// One lock per session being worked on, so two steps of one session never interleave.
    locks: SessionLocks,
    /// What steps need of recently used sessions (the log stays the truth).
    sessions: SessionCache,
    /// Whether the first load of the plugin folder has finished (steps wait for it).
    readiness: Mutex<Readiness>,
    ready: Condvar,
    /// Every registry change, for `GET /v1/events` and its replay.
    pub events: RegistryEvents,
    /// The counters `GET /metrics` shows.
    pub metrics: Metrics,
    /// Token counters by tokenizer name, kept so their memo of repeated texts lasts.
    counters: Mutex<BTreeMap<String, Arc<dyn Counter>>>,
    /// Agents' resolved plans for the config serving now.
    plans: Mutex<steps::AgentPlans>,
}

/// Where the daemon's first load of its plugin folder stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Readiness {
    /// Loading the plugin folder: `loaded` of `total` files done.
    Loading {
        /// Plugin files loaded so far.
        loaded: usize,
        /// Plugin files to load.
        total: usize,
    },
    /// The first full registry is published.
    Ok,
}

/// How long a step waits for the first load before it is refused with 503 `loading`.
pub const STEP_WAITS_FOR_LOADING: Duration = Duration::from_secs(30);

/// A run id unique enough to tell this process from earlier ones: the pid and the start time.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{nanos:x}", std::process::id())
}

impl Daemon {
    /// A daemon over `store` and `engine` serving the plugins in `plugin_dir`: loads every
    /// plugin file there, in file-name order. Refused plugins are recorded (and shown), not
    /// fatal; an unreadable folder is.
    pub fn new(
        store: Arc<dyn SessionStore>,
        engine: Arc<dyn Engine>,
        config: Config,
        plugin_dir: &Path,
    ) -> Result<Daemon> {
        let daemon = Self::loading(store, engine, config, plugin_dir);
        daemon.load_initial()?;
        Ok(daemon)
    }

    /// A daemon that has not loaded its plugins yet: it can serve HTTP at once (health says
    /// `loading`, steps wait) while [`Daemon::load_initial`] runs, on another thread.
    pub fn loading(
        store: Arc<dyn SessionStore>,
        engine: Arc<dyn Engine>,
        config: Config,
        plugin_dir: &Path,
    ) -> Daemon {
        Daemon {
            engine,
            sessions: SessionCache::new(config.session_cache_bytes()),
            counters: Mutex::new(BTreeMap::new()),
            plans: Mutex::default(),
            config: RwLock::new(Arc::new(config)),
            plugin_dir: plugin_dir.to_path_buf(),
            registry: RwLock::new(Arc::new(Registry::new())),
            plugins: RwLock::new(BTreeMap::new()),
            externals: RwLock::new(BTreeMap::new()),
            store,
            run: run_id(),
            changes: Mutex::new(()),
            locks: SessionLocks::default(),
            events: RegistryEvents::default(),
            metrics: Metrics::default(),
            readiness: Mutex::new(Readiness::Loading {
                loaded: 0,
                total: 0,
            }),
            ready: Condvar::new(),
        }
    }

    /// Loads every plugin file, in file-name order, then marks the daemon ready (also when
    /// the folder cannot be read: the error is returned, and the daemon serves what it has).
    pub fn load_initial(&self) -> Result<Vec<RegistryEvent>> {
        let result = self.reload();
        *lock(&self.readiness) = Readiness::Ok;
        self.ready.notify_all();
        result
    }

    /// Whether the first load has finished, and how far it is.
    pub fn readiness(&self) -> Readiness {
        *lock(&self.readiness)
    }

    fn progress(&self, loaded: usize, total: usize) {
        let mut readiness = lock(&self.readiness);
        if let Readiness::Loading { .. } = *readiness {
            *readiness = Readiness::Loading { loaded, total };
        }
    }

    /// Waits up to `bound` for the first load to finish.
    fn wait_ready(&self, bound: Duration) -> Result<()> {
        let readiness = lock(&self.readiness);
        let (readiness, _) = recover(
            self.ready
                .wait_timeout_while(readiness, bound, |r| *r != Readiness::Ok),
        );
        match *readiness {
            Readiness::Ok => Ok(()),
            Readiness::Loading { loaded, total } => Err(DaemonError::Loading { loaded, total }),
        }
    }

    /// The config serving now.
    pub fn config(&self) -> Arc<Config> {
        read(&self.config).clone()
    }

    /// The plugin folder it watches.
    pub fn plugin_dir(&self) -> &Path {
        &self.plugin_dir
    }

    /// Replaces the config (already validated) and reloads every plugin under it, since plugin
    /// settings may have changed. A plugin that fails under the new config keeps its old
    /// version serving (H3).
    pub fn set_config(&self, config: Config) -> Result<Vec<RegistryEvent>> {
        self.sessions.set_budget(config.session_cache_bytes());
        *write(&self.config) = Arc::new(config);
        for status in write(&self.plugins).values_mut() {
            status.sha256.clear(); // forces a reload on the rescan below
        }
        self.reload()
    }

    /// Prometheus text, including the compile cache's counters.
    pub fn metrics_text(&self) -> String {
        let mut out = self.metrics.render();
        if let Some((hits, misses)) = self.engine.cache_counts() {
            out.push_str("# HELP promptd_compile_cache_total Plugin loads served from or missing the compile cache.\n");
            out.push_str("# TYPE promptd_compile_cache_total counter\n");
            out.push_str(&format!(
                "promptd_compile_cache_total{{result=\"hit\"}} {hits}\n"
            ));
            out.push_str(&format!(
                "promptd_compile_cache_total{{result=\"miss\"}} {misses}\n"
            ));
        }
        out
    }

    /// The registry snapshot serving now.
    pub fn registry(&self) -> Arc<Registry> {
        read(&self.registry).clone()
    }

    fn publish(&self, registry: Registry) {
        self.metrics.set_plugins_loaded(registry.len());
        *write(&self.registry) = Arc::new(registry);
    }

    /// Every plugin file's status, and every external contributor's (MCP servers).
    pub fn plugins(&self) -> Vec<PluginStatus> {
        let plugins = read(&self.plugins);
        let mut all: Vec<PluginStatus> = plugins.values().cloned().collect();
        all.extend(self.external_statuses());
        all
    }

    /// Rescans the plugin folder: loads new files, reloads changed ones (the old version keeps
    /// serving if the new one fails), unloads removed ones. Each change is an event (R5).
    pub fn reload(&self) -> Result<Vec<RegistryEvent>> {
        let _changing = lock(&self.changes);
        let files = plugin_dir::plugin_files(&self.plugin_dir)?;
        let total = files.len();
        let mut applied = Vec::new();
        let mut present = HashSet::new();
        let mut changed = Vec::new();
        let config = self.config();
        for path in files {
            let file = match plugin_dir::read(&path) {
                Ok(file) => file,
                Err(error) => {
                    let path = path.display().to_string();
                    tracing::warn!(file = %path, "refused: {error}");
                    let body = ErrorBody::from(&error);
                    applied.push(
                        self.events
                            .push(ChangeKind::Refused, "", &path, "", Some(body)),
                    );
                    continue;
                }
            };
            present.insert(file.stem.clone());
            let unchanged = read(&self.plugins)
                .get(&file.stem)
                .is_some_and(|s| s.sha256 == file.sha256);
            if !unchanged {
                changed.push(file);
            }
        }
        // Compile, instantiate and declare in parallel (a slow or hostile plugin holds one
        // worker up to its deadline, not the whole load); apply in file order, so the registry
        // never depends on which finished first (R2).
        let done = AtomicUsize::new(total - changed.len());
        self.progress(done.load(Ordering::Relaxed), total);
        let outcomes = parallel_map(&changed, LOAD_WORKERS, |file| {
            let started = Instant::now();
            let result = load::load(self.engine.as_ref(), file, &config);
            self.progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
            (started.elapsed(), result)
        });
        for (file, (took, result)) in changed.iter().zip(outcomes) {
            applied.push(self.apply(file, &config, took, result));
        }
        let gone: Vec<String> = read(&self.plugins)
            .keys()
            .filter(|stem| !present.contains(*stem))
            .cloned()
            .collect();
        for stem in gone {
            let status = write(&self.plugins).remove(&stem);
            if let Some(status) = status {
                if let Ok(next) = self.registry().without(&status.id) {
                    self.publish(next);
                }
                applied.push(self.events.push(
                    ChangeKind::Unload,
                    &status.id,
                    &status.file,
                    &status.sha256,
                    None,
                ));
            }
        }
        Ok(applied)
    }

    /// Publishes one loaded (or refused) file: validates it against the other plugins first.
    fn apply(
        &self,
        file: &PluginFile,
        config: &Config,
        took: Duration,
        loaded: Result<(PluginEntry, Option<CacheLookup>), Error>,
    ) -> RegistryEvent {
        let id = config.plugin_id(&file.stem);
        let path = file.path.display().to_string();
        let mut current = self.registry();
        // A config change can give the file another id: the old id leaves with the new load.
        let old_id = read(&self.plugins)
            .get(&file.stem)
            .map(|s| s.id.clone())
            .filter(|old| *old != id);
        if let Some(old) = &old_id {
            if let Ok(without) = current.without(old) {
                current = Arc::new(without);
            }
        }
        let existed = current.get(&id).is_some();
        let result = loaded.and_then(|(entry, lookup)| {
            let declares = declaration_json(&entry.declaration);
            current
                .with_replaced(entry)
                .map(|next| (next, declares, lookup))
        });
        let mut plugins = write(&self.plugins);
        match result {
            Ok((next, declares, lookup)) => {
                self.publish(next);
                plugins.insert(
                    file.stem.clone(),
                    PluginStatus {
                        id: id.clone(),
                        file: path.clone(),
                        sha256: file.sha256.clone(),
                        serving_sha256: Some(file.sha256.clone()),
                        state: PluginState::Loaded,
                        last_error: None,
                        declares,
                    },
                );
                let cache = lookup.map_or("off", |l| l.as_str());
                let ms = took.as_secs_f64() * 1000.0;
                tracing::info!(plugin = %id, sha256 = %file.sha256, cache, ms = format!("{ms:.1}"), "loaded");
                self.events.push(
                    if existed {
                        ChangeKind::Reload
                    } else {
                        ChangeKind::Load
                    },
                    &id,
                    &path,
                    &file.sha256,
                    None,
                )
            }
            Err(error) => {
                tracing::warn!(plugin = %id, "refused: {error}");
                self.metrics.plugin_error();
                let status = plugins
                    .entry(file.stem.clone())
                    .or_insert_with(|| PluginStatus {
                        id: id.clone(),
                        file: path.clone(),
                        sha256: String::new(),
                        serving_sha256: None,
                        state: PluginState::Refused,
                        last_error: None,
                        declares: Value::Null,
                    });
                // H3: an older version, if any, keeps serving; the new bytes are remembered so
                // an unchanged file is not retried on every rescan.
                status.state = if existed {
                    PluginState::Stale
                } else {
                    PluginState::Refused
                };
                status.sha256 = file.sha256.clone();
                status.last_error = Some(ErrorBody::from(&error));
                self.events.push(
                    ChangeKind::Refused,
                    &id,
                    &path,
                    &file.sha256,
                    Some(ErrorBody::from(&error)),
                )
            }
        }
    }

    /// Unloads plugin `id` (R4): all its contributions leave the next assembly.
    pub fn unload(&self, id: &str) -> Result<RegistryEvent> {
        let _changing = lock(&self.changes);
        let next = self.registry().without(id)?;
        self.publish(next);
        let mut plugins = write(&self.plugins);
        let stem = plugins
            .iter()
            .find(|(_, s)| s.id == id)
            .map(|(k, _)| k.clone());
        let status = stem.and_then(|s| plugins.remove(&s));
        let (file, sha) = status.map(|s| (s.file, s.sha256)).unwrap_or_default();
        Ok(self.events.push(ChangeKind::Unload, id, &file, &sha, None))
    }

    /// Creates a session for `agent` (after checking its name): returns its id.
    pub fn create_session(&self, agent: &str) -> Result<String> {
        self.config().chain(agent)?; // validates the name

        // The key of the session's data blocks (T8): plugins never see the log, so they
        // cannot learn it; every daemon reading the log fences alike.
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| Error::Engine {
            context: "drawing a session secret".into(),
            source: Box::new(std::io::Error::other(e.to_string())),
        })?;
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let created = Body::SessionCreated(SessionCreated {
            agent: agent.to_string(),
            data_secret: Some(secret),
        });
        let id = self
            .store
            .create_session(agent, promptd_core::step::encode(&created)?)?;
        Ok(id)
    }

    fn agent_of(&self, id: &str) -> Result<String> {
        self.store
            .session_agent(id)?
            .ok_or_else(|| Error::UnknownSession(id.to_string()).into())
    }

    /// How many sessions and bytes the session cache holds.
    pub fn session_cache_usage(&self) -> (usize, usize) {
        self.sessions.usage()
    }

    /// L3: a plugin whose calls failed `quarantine_after` times in a row leaves the registry
    /// until its file changes or an operator enables it.
    fn quarantine_failing(&self, error: Option<&Error>) {
        let Some(limit) = self.config().quarantine_after() else {
            return;
        };
        let failing: Vec<String> = self
            .registry()
            .plugins()
            .filter(|p| p.provider.consecutive_failures() >= limit)
            .map(|p| p.id.clone())
            .collect();
        for id in failing {
            let _changing = lock(&self.changes);
            let Ok(next) = self.registry().without(&id) else {
                continue; // already gone
            };
            self.publish(next);
            let cause = match error {
                Some(e @ Error::PluginCall { plugin, .. }) if *plugin == id => e.to_string(),
                _ => format!("{limit} consecutive calls failed"),
            };
            let message =
                format!("quarantined after {limit} consecutive failed calls; last: {cause}");
            tracing::warn!(plugin = %id, "{message}");
            let mut plugins = write(&self.plugins);
            let (mut file, mut sha) = (String::new(), String::new());
            if let Some(status) = plugins.values_mut().find(|s| s.id == id) {
                status.state = PluginState::Quarantined;
                status.serving_sha256 = None;
                status.declares = Value::Null;
                status.last_error = Some(ErrorBody::new("quarantined", message.clone()));
                (file, sha) = (status.file.clone(), status.sha256.clone());
            }
            let error = Error::Quarantined {
                plugin: id.clone(),
                message,
            };
            self.events.push(
                ChangeKind::Quarantine,
                &id,
                &file,
                &sha,
                Some(ErrorBody::from(&error)),
            );
        }
    }

    /// Brings a quarantined plugin back: its file is loaded again (a fresh instance).
    pub fn enable(&self, id: &str) -> Result<Vec<RegistryEvent>> {
        {
            let mut plugins = write(&self.plugins);
            let status = plugins
                .values_mut()
                .find(|s| s.id == id)
                .ok_or_else(|| Error::UnknownPlugin(id.to_string()))?;
            if status.state != PluginState::Quarantined {
                return Ok(Vec::new()); // nothing to do
            }
            status.sha256.clear(); // forces the rescan to load it
        }
        self.reload()
    }
}

/// Most plugins loaded at once: a few more than this machine's cores, so that plugins stuck
/// in a looping `declare` (each stopped at its deadline) do not hold up every other load.
const LOAD_WORKERS: usize = 4;

/// `f` over `items` on up to `workers` scoped threads; results in the items' order.
fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                *lock(&results[i]) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .filter_map(|r| recover(r.into_inner()))
        .collect()
}
