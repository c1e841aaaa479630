//! Registry change events (R5): a numbered history plus a live broadcast for SSE clients.

use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::daemon::ErrorBody;
use crate::error::Error;

/// One applied registry change.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RegistryEvent {
    /// 1-based, increasing for the daemon's lifetime.
    pub seq: u64,
    /// `load`, `reload`, `unload` or `refused`.
    pub kind: &'static str,
    pub plugin: String,
    pub file: String,
    pub sha256: String,
    pub error: Option<ErrorBody>,
}

/// The history of registry events and the channel live subscribers listen on.
pub struct RegistryEvents {
    history: Mutex<Vec<RegistryEvent>>,
    live: broadcast::Sender<RegistryEvent>,
}

impl Default for RegistryEvents {
    fn default() -> Self {
        Self {
            history: Mutex::new(Vec::new()),
            live: broadcast::channel(1024).0,
        }
    }
}

impl RegistryEvents {
    /// Records an event and tells live subscribers.
    pub fn push(
        &self,
        kind: &'static str,
        plugin: &str,
        file: &str,
        sha256: &str,
        error: Option<&Error>,
    ) -> RegistryEvent {
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let event = RegistryEvent {
            seq: history.len() as u64 + 1,
            kind,
            plugin: plugin.to_string(),
            file: file.to_string(),
            sha256: sha256.to_string(),
            error: error.map(ErrorBody::from),
        };
        history.push(event.clone());
        // Sent under the history lock, so a subscriber never sees an event twice or misses one
        // between its replay and its subscription.
        let _ = self.live.send(event.clone());
        event
    }

    /// Events after `since`, and a receiver for the ones that follow.
    pub fn subscribe(
        &self,
        since: u64,
    ) -> (Vec<RegistryEvent>, broadcast::Receiver<RegistryEvent>) {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let past = history.iter().filter(|e| e.seq > since).cloned().collect();
        (past, self.live.subscribe())
    }
}
