//! The plugin host: the plugin folder's files and the registry they make (lifecycle), the
//! external contributors (MCP servers), the fleet's published sets (K10), the watcher, the
//! first load's readiness, and the registry's events. Its operations are `impl Daemon`
//! blocks in this folder, since a change also reaches the sessions (held changes) and the
//! observers (plugin errors).

pub mod events;
pub mod external;
pub mod fleet;
pub mod plugin_dir;
pub(crate) mod plugins;
pub(crate) mod readiness;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use promptd_core::config::Config;
use promptd_core::load::Engine;
use promptd_core::plugin::registry::Registry;

use crate::PluginStatus;
use events::RegistryEvents;
use readiness::Readiness;

/// What the plugin host owns.
pub struct PluginHost {
    pub(crate) engine: Arc<dyn Engine>,
    /// The plugin folder it watches.
    pub(crate) dir: PathBuf,
    /// The registry serving now: an immutable snapshot, replaced whole (H2).
    pub(crate) registry: RwLock<Arc<Registry>>,
    /// The plugin files, by file stem.
    pub(crate) files: RwLock<BTreeMap<String, PluginStatus>>,
    /// Contributors that are not files (MCP servers), by plugin id.
    pub(crate) externals: RwLock<BTreeMap<String, external::External>>,
    /// What starts, stops and restarts the external contributors (the MCP supervisors), once
    /// one registered: told of config changes and of `enable` calls.
    pub(crate) external_control: Mutex<Option<Arc<dyn external::ExternalControl>>>,
    /// External contributors whose first outcome (a list or a failure) has not come yet:
    /// steps wait for them as for the first load (`first_listed` is told when one comes).
    pub(crate) first_lists: Mutex<BTreeSet<String>>,
    pub(crate) first_listed: Condvar,
    /// Serialises registry changes (watcher, API calls), so none is lost to a race.
    pub(crate) changes: Mutex<()>,
    /// Whether the first load of the plugin folder has finished (steps wait for it).
    pub(crate) readiness: Mutex<Readiness>,
    pub(crate) ready: Condvar,
    /// Every registry change, for `GET /v1/events` and its replay.
    pub events: RegistryEvents,
    /// Held by the replay running (one at a time: each loads a plugin set of its own).
    pub(crate) replays: Mutex<()>,
    /// K10: the store's plugin sets, when the daemon follows them.
    pub(crate) fleet: Mutex<fleet::Fleet>,
    /// K10: held by the one reading the store's sets and switching (start or poll).
    pub(crate) following: Mutex<()>,
}

impl PluginHost {
    pub(crate) fn new(engine: Arc<dyn Engine>, config: &Config, dir: &Path) -> PluginHost {
        PluginHost {
            engine,
            dir: dir.to_path_buf(),
            registry: RwLock::new(Arc::new(Registry::new())),
            files: RwLock::new(BTreeMap::new()),
            externals: RwLock::new(BTreeMap::new()),
            external_control: Mutex::new(None),
            first_lists: Mutex::new(BTreeSet::new()),
            first_listed: Condvar::new(),
            changes: Mutex::new(()),
            readiness: Mutex::new(Readiness::Loading {
                loaded: 0,
                total: 0,
            }),
            ready: Condvar::new(),
            events: RegistryEvents::default(),
            replays: Mutex::new(()),
            fleet: Mutex::new(fleet::Fleet {
                follow: config.fleet.follow,
                ..fleet::Fleet::default()
            }),
            following: Mutex::new(()),
        }
    }
}
