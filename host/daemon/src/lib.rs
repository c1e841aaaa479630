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
//! use promptd_core::{config::Config, load::*, plugin::provider::NativePlugin, store::MemoryStore};
//! use promptd_daemon::{Daemon, StepInput, StepRequest};
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
//! let step = daemon.step(StepRequest::new(id, StepInput::default(), promptd_core::formats::Format::Neutral)).unwrap();
//! assert_eq!(step.step, 1);
//! assert_eq!(step.body.into_string(), r#"{"messages":[],"model":{},"system":"Be brief.","tools":[]}"#);
//! ```

pub mod api;
pub mod cache_policy;
pub mod error;
pub mod gateway;
pub mod http;
pub mod metrics;
pub mod observe;
pub mod outcome;
pub mod plugin_host;
pub mod replay;
mod reply_body;
pub mod server;
pub mod sessions;
pub mod ui;

use plugin_host::readiness;
pub use plugin_host::{events, external, fleet, plugin_dir, watch};

use std::path::Path;
use std::sync::{Arc, RwLock};

use promptd_core::config::Config;
use promptd_core::load::Engine;
use promptd_core::plugin::registry::Registry;
use promptd_core::plugin::state::PluginState;
use promptd_core::store::SessionStore;
use promptd_core::ErrorBody;
use serde::Serialize;
use serde_json::Value;

pub use cache_policy::CachePolicy;
pub use error::{DaemonError, Result};
use events::RegistryEvent;
pub use external::{ExternalControl, ToolOutcome, ToolRun, ToolRunner};
pub use observe::{StepObserver, TraceContext};
pub use outcome::{RecordOutcome, RecordRequest, StepOutcome, StepRequest};
pub use plugin_host::PluginHost;
pub use sessions::Sessions;

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
    /// K7: which of its parts wait for a cache-cold point: `{mode, sections, tools, session,
    /// max_stale_s, by, defer}`, `mode` being `step` (none, the default), `boundary` (every
    /// section and tool), `session` (every one, for the whole session) or `parts` (the sections
    /// and tools listed; `session` the parts held for the session); `by` is who set it:
    /// `default`, `plugin` (its declaration, world 0.3.0) or `config` (`[plugins.ID] refresh`,
    /// which overrides the plugin); `defer` is `{all, tools, by}` likewise (K9). Null when
    /// none serves.
    #[schema(value_type = Object)]
    pub refresh: Value,
    /// K7: the changes of this plugin's that sessions' last steps on this daemon held, one
    /// per session and part, oldest first (at most [`HELD_SHOWN`]).
    pub held: Vec<HeldIn>,
}

/// Most held parts `GET /v1/plugins` lists per plugin.
pub const HELD_SHOWN: usize = 32;

/// One held change of a plugin, in a session (`GET /v1/plugins`).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct HeldIn {
    /// The session whose last step held it.
    pub session: String,
    /// The part, since when, and what it keeps.
    #[serde(flatten)]
    pub held: promptd_core::held::Held,
    /// The same, in words.
    pub said: String,
}

pub use promptd_core::step::StepInput;
pub(crate) use promptd_core::sync::lock;
use promptd_core::sync::{read, write};
pub use readiness::{Readiness, STEP_WAITS_FOR_LOADING};

/// The daemon: its config, and the services it is made of, each owning its state — the
/// plugin host (plugins, fleet, watcher, readiness, events), the sessions (store, locks,
/// cached states, plans; the step and record boundaries), the cache policy (agents' gaps,
/// key rates, held changes) and the observers (metrics, and what the binary adds). Shared by
/// the HTTP API, the watcher and the MCP servers.
pub struct Daemon {
    config: RwLock<Arc<Config>>,
    /// The plugin host.
    pub plugins: PluginHost,
    /// The sessions.
    pub sessions: Sessions,
    /// The cache policy's state across sessions.
    pub cache: CachePolicy,
    /// Who watches steps and records: the counters `GET /metrics` shows, and those the
    /// binary adds (telemetry).
    pub observers: observe::Observers,
}

/// Milliseconds since the Unix epoch, by the system clock.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
            plugins: PluginHost::new(engine, &config, plugin_dir),
            sessions: Sessions::new(store, &config),
            cache: CachePolicy::default(),
            observers: observe::Observers::default(),
            config: RwLock::new(Arc::new(config)),
        }
    }

    /// The config serving now.
    pub fn config(&self) -> Arc<Config> {
        read(&self.config).clone()
    }

    /// The plugin folder it watches.
    pub fn plugin_dir(&self) -> &Path {
        &self.plugins.dir
    }

    /// Replaces the config (already validated) and reloads every plugin under it, since plugin
    /// settings may have changed. A plugin that fails under the new config keeps its old
    /// version serving (H3).
    pub fn set_config(&self, config: Config) -> Result<Vec<RegistryEvent>> {
        self.sessions.cache.set_budget(config.session_cache_bytes());
        let config = Arc::new(config);
        *write(&self.config) = config.clone();
        for status in write(&self.plugins.files).values_mut() {
            status.sha256.clear(); // forces a reload on the rescan below
        }
        let events = self.reload();
        // `[mcp.*]` applies as plugins' settings do: servers added, removed or changed are
        // started, stopped or restarted.
        let control = lock(&self.plugins.external_control).clone();
        if let Some(control) = control {
            control.config_changed(&config);
        }
        events
    }

    /// Prometheus text, including the compile cache's counters.
    pub fn metrics_text(&self) -> String {
        let mut out = self.observers.metrics.render();
        for sample in self.observers.samples() {
            metrics::write_sample(&mut out, &sample);
        }
        if let Some((hits, misses)) = self.plugins.engine.cache_counts() {
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
        read(&self.plugins.registry).clone()
    }

    /// What `/metrics` counts, for OTLP export: the counters and the step latency's sum and
    /// count (an observer adds its own).
    pub fn metric_samples(&self) -> Vec<metrics::Sample> {
        let mut samples = self.observers.metrics.samples();
        samples.extend(self.observers.metrics.latency_samples());
        samples
    }

    /// How many sessions and bytes the session cache holds.
    pub fn session_cache_usage(&self) -> (usize, usize) {
        self.sessions.cache.usage()
    }
}
