//! Sessions kept in memory (the log stays the truth): each entry holds a session's agent and
//! its [`SessionState`], so a step neither re-reads nor re-parses the log. Bounded by a byte
//! budget (`[limits] session_cache_mb`): the least recently used sessions are evicted, and an
//! evicted (or never seen) session is rebuilt from the log once, on its next use.
//!
//! A caller takes a session's entry out while it holds the session's lock and puts it back
//! when done, so one session's state is never used by two steps at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use promptd_core::session::SessionState;
use promptd_core::sync::lock;

/// One cached session. The cache and a checked-out slot hold it boxed: a session's state is
/// kilobytes, and a step moves it out of the cache, through its task, and back; boxed, each
/// move is a pointer's, not a copy of the state (issue 50).
pub(crate) struct Cached {
    pub agent: String,
    pub state: SessionState,
    /// The key the cache kept it under, given back by [`SessionCache::take`] so that putting
    /// it back allocates no new key (once per step otherwise).
    pub key: Option<Arc<str>>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Arc<str>, (u64, Box<Cached>)>,
    /// Last use → session id, oldest first.
    order: BTreeMap<u64, Arc<str>>,
    tick: u64,
    bytes: usize,
}

pub(crate) struct SessionCache {
    inner: Mutex<Inner>,
    /// Bytes; a config change may move it (applied from the next `put`).
    budget: AtomicUsize,
}

fn size(c: &Cached) -> usize {
    c.state.bytes() + c.agent.len() + 256
}

impl SessionCache {
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            budget: AtomicUsize::new(budget_bytes),
        }
    }

    pub(crate) fn set_budget(&self, budget_bytes: usize) {
        self.budget.store(budget_bytes, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Takes session `id` out of the cache.
    pub(crate) fn take(&self, id: &str) -> Option<Box<Cached>> {
        let mut inner = self.lock();
        let (key, (tick, mut cached)) = inner.entries.remove_entry(id)?;
        inner.order.remove(&tick);
        inner.bytes -= size(&cached);
        cached.key = Some(key);
        Some(cached)
    }

    /// Puts session `id` back as the most recently used, evicting the least recently used
    /// ones beyond the budget. A session larger than the whole budget is not kept.
    pub(crate) fn put(&self, id: &str, mut cached: Box<Cached>) {
        let bytes = size(&cached);
        let budget = self.budget.load(Ordering::Relaxed);
        let mut inner = self.lock();
        if bytes > budget {
            // Too large to keep (or caching is off); the budget may also have shrunk.
            while inner.bytes > budget {
                let Some((_, oldest)) = inner.order.pop_first() else {
                    break;
                };
                if let Some((_, evicted)) = inner.entries.remove(&*oldest) {
                    inner.bytes -= size(&evicted);
                }
            }
            return;
        }
        while inner.bytes + bytes > budget {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some((_, evicted)) = inner.entries.remove(&*oldest) {
                inner.bytes -= size(&evicted);
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        let key = match cached.key.take() {
            Some(key) if &*key == id => key,
            _ => Arc::from(id),
        };
        inner.order.insert(tick, key.clone());
        inner.bytes += bytes;
        if let Some((old_tick, old)) = inner.entries.insert(key, (tick, cached)) {
            // Not reached while callers hold the session lock, but keep the books right.
            inner.order.remove(&old_tick);
            inner.bytes -= size(&old);
        }
    }

    /// How many sessions and bytes the cache holds.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(agent: &str) -> Box<Cached> {
        Box::new(Cached {
            key: None,
            agent: agent.into(),
            state: SessionState::new("s"),
        })
    }

    #[test]
    fn the_least_recently_used_sessions_leave_first_and_the_budget_holds() {
        let one = size(&cached("a"));
        let cache = SessionCache::new(one * 3);
        for id in ["s1", "s2", "s3"] {
            cache.put(id, cached("a"));
        }
        let s1 = cache.take("s1").unwrap();
        cache.put("s1", s1); // s1 is now the most recent
        cache.put("s4", cached("a"));
        assert!(cache.take("s2").is_none(), "s2 was the least recently used");
        assert_eq!(cache.usage(), (3, one * 3));
        assert!(cache.take("s1").is_some());
        assert_eq!(cache.usage(), (2, one * 2));
    }

    #[test]
    fn a_session_larger_than_the_budget_is_not_kept() {
        let cache = SessionCache::new(10);
        cache.put("big", cached("a"));
        assert_eq!(cache.usage(), (0, 0));
    }
}
