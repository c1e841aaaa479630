//! Sessions: the store they are logged in, the per-session locks and cached states (a step
//! checks a session out as one [`slot`]: lock, state and the guard that puts it back), the
//! agents' settings, and the step and record boundaries ([`crate::Daemon::step`],
//! [`crate::Daemon::record`]) with the reads of the log (`steps.rs`).

mod cache;
mod gateway;
mod locks;
mod slot;
mod steps;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use promptd_core::budget::Counter;
use promptd_core::config::Config;
use promptd_core::store::SessionStore;

pub(crate) use cache::{Cached, SessionCache};
use locks::SessionLocks;
pub use steps::Explained;

/// What the sessions own.
pub struct Sessions {
    pub(crate) store: Arc<dyn SessionStore>,
    /// This process's run id, recorded with every header it writes: a header that changed
    /// since another run (another daemon, an earlier process) wrote the last one is recorded
    /// as `resume`, one this run wrote as `change` (Q3). Kept in the log, so the daemon needs
    /// no per-session memory for it.
    pub(crate) run: String,
    /// One lock per session being worked on, so two steps of one session never interleave.
    pub(crate) locks: SessionLocks,
    /// What steps need of recently used sessions (the log stays the truth).
    pub(crate) cache: SessionCache,
    /// Token counters by tokenizer name, kept so their memo of repeated texts lasts.
    pub(crate) counters: Mutex<BTreeMap<String, Arc<dyn Counter>>>,
    /// Agents' settings resolved for the config serving now.
    pub(crate) agents: Mutex<steps::ResolvedAgents>,
}

impl Sessions {
    pub(crate) fn new(store: Arc<dyn SessionStore>, config: &Config) -> Sessions {
        Sessions {
            store,
            run: run_id(),
            locks: SessionLocks::default(),
            cache: SessionCache::new(config.session_cache_bytes()),
            counters: Mutex::new(BTreeMap::new()),
            agents: Mutex::default(),
        }
    }
}

/// A run id unique enough to tell this process from earlier ones: the pid and the start time.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{nanos:x}", std::process::id())
}
