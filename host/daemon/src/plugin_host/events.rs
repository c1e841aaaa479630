//! Registry change events (R5): a numbered, bounded history plus a live broadcast for SSE
//! clients.
//!
//! The history keeps the last [`HISTORY`] events. A client that resumes from further back, or
//! that reads the live stream more slowly than changes arrive, is told so with a `lagged`
//! event (and the stream ends), so it knows to resync from `GET /v1/plugins` instead of
//! silently missing changes.

use std::collections::VecDeque;
use std::sync::Mutex;

use promptd_core::plugin::state::ChangeKind;
use promptd_core::sync::lock;
use promptd_core::ErrorBody;
use serde::Serialize;
use tokio::sync::broadcast;

/// How many past events are kept for replay.
pub const HISTORY: usize = 1024;

/// How many live events may wait for one slow subscriber before it is `lagged`.
const LIVE_BUFFER: usize = 1024;

/// One applied registry change.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct RegistryEvent {
    /// 1-based, increasing for the daemon's lifetime.
    pub seq: u64,
    /// What changed.
    pub kind: ChangeKind,
    /// The plugin's id (empty for a file refused before it had one).
    pub plugin: String,
    /// Its file.
    pub file: String,
    /// SHA-256 of the file's bytes (empty when there is none).
    pub sha256: String,
    /// Why it was refused or quarantined, when it was.
    pub error: Option<ErrorBody>,
}

/// What a subscriber gets: the replayable past, then live events.
pub struct Subscription {
    /// The events after `since` still in the history, in order.
    pub past: Vec<RegistryEvent>,
    /// Events after `since` that fell out of the history: the replay is incomplete.
    pub missed: u64,
    /// Every event from then on.
    pub live: broadcast::Receiver<RegistryEvent>,
}

/// The history of registry events and the channel live subscribers listen on.
pub struct RegistryEvents {
    inner: Mutex<History>,
    live: broadcast::Sender<RegistryEvent>,
}

struct History {
    events: VecDeque<RegistryEvent>,
    last_seq: u64,
}

impl Default for RegistryEvents {
    fn default() -> Self {
        Self {
            inner: Mutex::new(History {
                events: VecDeque::with_capacity(HISTORY),
                last_seq: 0,
            }),
            live: broadcast::channel(LIVE_BUFFER).0,
        }
    }
}

impl RegistryEvents {
    /// Records an event and tells live subscribers.
    pub fn push(
        &self,
        kind: ChangeKind,
        plugin: &str,
        file: &str,
        sha256: &str,
        error: Option<ErrorBody>,
    ) -> RegistryEvent {
        let mut history = lock(&self.inner);
        history.last_seq += 1;
        let event = RegistryEvent {
            seq: history.last_seq,
            kind,
            plugin: plugin.to_string(),
            file: file.to_string(),
            sha256: sha256.to_string(),
            error,
        };
        if history.events.len() == HISTORY {
            history.events.pop_front();
        }
        history.events.push_back(event.clone());
        // Sent under the history lock, so a subscriber never sees an event twice or misses one
        // between its replay and its subscription. No receiver is not an error.
        let _ = self.live.send(event.clone());
        event
    }

    /// Events after `since` (`None`: after the last one given out, i.e. only new ones), how
    /// many of those are no longer kept, and a receiver for the ones that follow.
    pub fn subscribe(&self, since: Option<u64>) -> Subscription {
        let history = lock(&self.inner);
        // Read under the lock a publisher holds: nothing falls between "now" and the receiver.
        let since = since.unwrap_or(history.last_seq);
        let past: Vec<RegistryEvent> = history
            .events
            .iter()
            .filter(|e| e.seq > since)
            .cloned()
            .collect();
        let first_kept = history
            .events
            .front()
            .map_or(history.last_seq + 1, |e| e.seq);
        // `since` is the client's: u64::MAX (past every seq) must not overflow.
        let missed = first_kept.saturating_sub(since.saturating_add(1));
        Subscription {
            past,
            missed,
            live: self.live.subscribe(),
        }
    }

    /// The last sequence number given out.
    pub fn last_seq(&self) -> u64 {
        lock(&self.inner).last_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r5_history_is_bounded_and_says_what_it_lost() {
        let events = RegistryEvents::default();
        for i in 0..HISTORY + 10 {
            events.push(ChangeKind::Load, &format!("p{i}"), "f", "s", None);
        }
        let all = events.subscribe(Some(0));
        assert_eq!(all.past.len(), HISTORY);
        assert_eq!(all.past[0].seq, 11);
        assert_eq!(all.missed, 10);
        let recent = events.subscribe(Some(HISTORY as u64));
        assert_eq!(recent.missed, 0);
        assert_eq!(recent.past.len(), 10);
        assert_eq!(events.subscribe(Some(events.last_seq())).past.len(), 0);
        assert_eq!(events.subscribe(Some(events.last_seq())).missed, 0);
        // A client past every seq missed nothing (and does not overflow the count).
        assert_eq!(events.subscribe(Some(u64::MAX)).missed, 0);
        assert!(events.subscribe(Some(u64::MAX)).past.is_empty());
        // From now: nothing replayed, nothing missed.
        let now = events.subscribe(None);
        assert!(now.past.is_empty());
        assert_eq!(now.missed, 0);
    }
}
