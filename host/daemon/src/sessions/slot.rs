//! A session checked out for one step, record or compaction: its lock, its cached state and
//! the guard that puts the state back, as one value.

use super::cache::{Cached, SessionCache};
use super::locks::Held;

/// Session `id` checked out: its lock is held and its cached state taken out of the session
/// cache; when dropped, the state is put back — on every path, errors included — unless
/// marked stale, and only then is the lock released.
pub(crate) struct SessionSlot<'a> {
    cache: &'a SessionCache,
    pub(crate) id: &'a str,
    /// Always `Some` until the slot drops (only `drop` takes it).
    cached: Option<Box<Cached>>,
    stale: bool,
    /// Released after `drop` put the state back (fields drop after it).
    _lock: Held<'a>,
}

impl<'a> SessionSlot<'a> {
    pub(crate) fn new(
        cache: &'a SessionCache,
        id: &'a str,
        cached: Box<Cached>,
        lock: Held<'a>,
    ) -> SessionSlot<'a> {
        SessionSlot {
            cache,
            id,
            cached: Some(cached),
            stale: false,
            _lock: lock,
        }
    }

    /// The session's agent and state.
    pub(crate) fn get(&mut self) -> &mut Cached {
        match &mut self.cached {
            Some(cached) => cached,
            None => unreachable!("the state is taken only when the slot drops"),
        }
    }

    /// The state no longer continues the log: it is dropped, not put back, so the next
    /// checkout rebuilds it from the log.
    pub(crate) fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// The state continues the log again (after [`SessionSlot::mark_stale`] covered a wait
    /// that could have been cut short).
    pub(crate) fn keep(&mut self) {
        self.stale = false;
    }
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        if let (Some(cached), false) = (self.cached.take(), self.stale) {
            self.cache.put(self.id, cached);
        }
    }
}
