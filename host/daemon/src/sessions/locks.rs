//! One lock per session being worked on, so two steps of one session never interleave.
//!
//! An entry lives only while some thread holds or waits for its session: the last one to
//! leave removes it, so the map is bounded by the requests in flight, not by the number of
//! sessions ever seen.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use promptd_core::sync::{lock, wait};

#[derive(Default)]
pub(crate) struct SessionLocks {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

#[derive(Default)]
struct Slot {
    busy: Mutex<bool>,
    free: Condvar,
}

/// The session's lock, held until dropped.
pub(crate) struct Held<'a> {
    locks: &'a SessionLocks,
    id: &'a str,
    slot: Arc<Slot>,
}

impl SessionLocks {
    /// Waits until no one else holds session `id`, then holds it.
    pub(crate) fn hold<'a>(&'a self, id: &'a str) -> Held<'a> {
        // Clones of a slot are made only under the map's lock, which is what makes the
        // strong-count check in `drop` sound.
        let slot = lock(&self.slots).entry(id.to_string()).or_default().clone();
        let mut busy = lock(&slot.busy);
        while *busy {
            busy = wait(&slot.free, busy);
        }
        *busy = true;
        drop(busy);
        Held {
            locks: self,
            id,
            slot,
        }
    }

    /// Holds session `id` if no one else does, without waiting.
    pub(crate) fn try_hold<'a>(&'a self, id: &'a str) -> Option<Held<'a>> {
        let slot = lock(&self.slots).entry(id.to_string()).or_default().clone();
        let mut busy = lock(&slot.busy);
        if !*busy {
            *busy = true;
            drop(busy);
            return Some(Held {
                locks: self,
                id,
                slot,
            });
        }
        drop(busy);
        // Held by another: leave the map as that holder's drop expects it.
        let mut slots = lock(&self.slots);
        if Arc::strong_count(&slot) == 2 {
            slots.remove(id);
        }
        None
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.slots).len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        *lock(&self.slot.busy) = false;
        self.slot.free.notify_one();
        let mut slots = lock(&self.locks.slots);
        // The map's reference and ours: no one else holds or waits for this session.
        if Arc::strong_count(&self.slot) == 2 {
            slots.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_map_holds_only_sessions_in_use() {
        let locks = SessionLocks::default();
        for i in 0..1000 {
            let id = format!("s{i}");
            let _held = locks.hold(&id);
            assert_eq!(locks.len(), 1);
        }
        assert_eq!(locks.len(), 0);
    }

    #[test]
    fn two_holders_of_one_session_never_overlap() {
        let locks = Arc::new(SessionLocks::default());
        let inside = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _held = locks.hold("one");
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(locks.len(), 0);
    }
}
