//! Readiness: a daemon serves HTTP at once and loads its plugin folder on another thread;
//! health says how far the first load is, and steps wait for it (bounded).

use std::time::Duration;

use promptd_core::sync::{lock, recover};
use serde::Serialize;

use crate::events::RegistryEvent;
use crate::{Daemon, DaemonError, Result};

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

impl Daemon {
    /// Loads every plugin file, in file-name order, then marks the daemon ready (also when
    /// the folder cannot be read: the error is returned, and the daemon serves what it has).
    pub fn load_initial(&self) -> Result<Vec<RegistryEvent>> {
        let result = self.reload();
        *lock(&self.plugins.readiness) = Readiness::Ok;
        self.plugins.ready.notify_all();
        result
    }

    /// Whether the first load has finished, and how far it is.
    pub fn readiness(&self) -> Readiness {
        *lock(&self.plugins.readiness)
    }

    /// Whether a step would not wait at all in [`Daemon::wait_ready`]: the first load done and
    /// every MCP server's first tool list in.
    pub(crate) fn ready_now(&self) -> bool {
        self.readiness() == Readiness::Ok && lock(&self.plugins.first_lists).is_empty()
    }

    pub(crate) fn progress(&self, loaded: usize, total: usize) {
        let mut readiness = lock(&self.plugins.readiness);
        if let Readiness::Loading { .. } = *readiness {
            *readiness = Readiness::Loading { loaded, total };
        }
    }

    /// Notes that the external contributors `ids` (MCP servers just started) have not given
    /// their first outcome yet: steps wait for it, within their bound.
    pub fn expect_first_lists(&self, ids: impl IntoIterator<Item = String>) {
        lock(&self.plugins.first_lists).extend(ids);
    }

    /// External contributor `id` gave its first outcome (or left).
    pub(crate) fn listed(&self, id: &str) {
        let mut pending = lock(&self.plugins.first_lists);
        if pending.remove(id) {
            self.plugins.first_listed.notify_all();
        }
    }

    /// Waits up to `bound` for the first load to finish, then, within the same bound, for
    /// each external contributor's first list (a step taken before a slow MCP server listed
    /// would go without its tools). Past the bound a step goes on without the servers still
    /// silent; the plugins' load alone is a 503 `loading`.
    pub(crate) fn wait_ready(&self, bound: Duration) -> Result<()> {
        let started = std::time::Instant::now();
        self.wait_loaded(bound)?;
        let pending = lock(&self.plugins.first_lists);
        if pending.is_empty() {
            return Ok(());
        }
        let left = bound.saturating_sub(started.elapsed());
        let (pending, _) = recover(self.plugins.first_listed.wait_timeout_while(
            pending,
            left,
            |p| !p.is_empty(),
        ));
        if !pending.is_empty() {
            tracing::warn!(
                servers = ?*pending,
                "a step goes on without servers that have not listed their tools yet"
            );
        }
        Ok(())
    }

    fn wait_loaded(&self, bound: Duration) -> Result<()> {
        let readiness = lock(&self.plugins.readiness);
        let (readiness, _) = recover(self.plugins.ready.wait_timeout_while(
            readiness,
            bound,
            |r| *r != Readiness::Ok,
        ));
        match *readiness {
            Readiness::Ok => Ok(()),
            Readiness::Loading { loaded, total } => Err(DaemonError::Loading { loaded, total }),
        }
    }
}
