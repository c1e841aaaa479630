//! The gateway in a fleet (G10): daemons sharing one store (PostgreSQL) each serve any request
//! of any session. A session another daemon created or continued is joined by prefix here
//! because the index first catches up with what the store recorded since it last looked: the
//! `gateway/request` events of the sessions active since then, read after the seq already
//! read.

use std::collections::HashMap;

use promptd_core::session::log::Body;
use promptd_core::store::EventKind;

use super::{index, now_ms, Gateway};

/// How far back a catch-up reads before the last one began: activity times come from each
/// daemon's clock, so a clock this far behind is still caught.
const CLOCK_SKEW_MS: u64 = 10_000;

/// Sessions whose read position is kept before the map starts over (a cleared map costs one
/// more read of a session's log, never a wrong join).
const MAX_SEEN: usize = 100_000;

/// What the index has read of the shared store.
pub(super) struct Seen {
    /// Per session, the last seq read.
    seq: HashMap<String, u64>,
    /// When the last catch-up began (ms since the epoch).
    since_ms: u64,
}

impl Seen {
    /// Nothing read yet: sessions active before `started_ms` are the start-up read-back's.
    pub(super) fn new(started_ms: u64) -> Seen {
        Seen {
            seq: HashMap::new(),
            since_ms: started_ms,
        }
    }
}

impl Gateway {
    /// Catches the index up with the `gateway/request`s other daemons recorded in the shared
    /// store since the last catch-up (nothing for a store no other daemon shares). One at a
    /// time: a request waits for a catch-up under way, then finds little left to read. A
    /// failure leaves the index as it was (the request may start a new session; logged).
    pub(super) fn catch_up(&self) {
        let daemon = &self.daemon;
        if !daemon.store_shared() {
            return;
        }
        let mut seen = crate::lock(&self.seen);
        let began = now_ms();
        let active = match daemon.active_since(
            seen.since_ms.saturating_sub(CLOCK_SKEW_MS),
            index::RECOVERED,
        ) {
            Ok(active) => active,
            Err(e) => {
                tracing::warn!(code = e.code(), "gateway: the index did not catch up: {e}");
                return;
            }
        };
        let config = daemon.config();
        if seen.seq.len() + active.len() > MAX_SEEN {
            seen.seq.clear();
        }
        // Oldest first: of sessions that reached the same digest, the latest wins.
        for summary in active.into_iter().rev() {
            let read = seen.seq.get(&summary.id).copied().unwrap_or(0);
            if summary.events <= read
                || !matches!(config.gateway.agent(&config, &summary.agent), Ok(Some(_)))
            {
                continue;
            }
            let events = match daemon.events_after(&summary.id, read) {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(session = %summary.id, code = e.code(), "gateway: a session was not read: {e}");
                    continue;
                }
            };
            let last = events.last().map_or(read, |e| e.seq);
            for event in events
                .iter()
                .filter(|e| e.kind == EventKind::GatewayRequest)
            {
                if let Ok(Body::GatewayRequest(record)) =
                    promptd_core::session::decode(&summary.id, event)
                {
                    let scope = index::scope(&summary.agent, record.key.as_deref());
                    crate::lock(&self.index).reached(&scope, &record.digest, &summary.id);
                }
            }
            seen.seq.insert(summary.id, last);
        }
        seen.since_ms = began;
    }
}
