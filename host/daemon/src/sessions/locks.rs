//! One lock per session being worked on, so two steps of one session never interleave.
//!
//! An entry lives only while some thread holds or waits for its session: the last one to
//! leave removes it, so the map is bounded by the requests in flight, not by the number of
//! sessions ever seen. A removed entry's key and lock are kept for the next session to be
//! held (at most [`SPARE`] of them): a step then takes its session's lock without allocating.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use promptd_core::sync::{lock, Signal};

#[derive(Default)]
pub(crate) struct SessionLocks {
    slots: Mutex<Slots>,
}

/// Removed entries kept for reuse, at most.
const SPARE: usize = 64;

#[derive(Default)]
struct Slots {
    /// The sessions held or waited for.
    held: HashMap<String, Arc<Slot>>,
    /// Entries no one holds any more, for the next sessions.
    spare: Vec<(String, Arc<Slot>)>,
}

impl Slots {
    /// The lock of session `id`, made (or taken from the spare ones) if no one holds it.
    fn slot(&mut self, id: &str) -> Arc<Slot> {
        if let Some(slot) = self.held.get(id) {
            return slot.clone();
        }
        let (mut key, slot) = match self.spare.pop() {
            // Its last holder may not have let go of its reference yet: a lock shared with
            // a holder would not be seen as free when it is.
            Some((key, slot)) if Arc::strong_count(&slot) == 1 => (key, slot),
            _ => Default::default(),
        };
        key.clear();
        key.push_str(id);
        self.held.insert(key, slot.clone());
        slot
    }

    /// Removes session `id`'s entry if only the map and the caller (`slot`) refer to it: no
    /// one else holds or waits for it.
    fn release(&mut self, id: &str, slot: &Arc<Slot>) {
        if Arc::strong_count(slot) == 2 {
            if let Some(entry) = self.held.remove_entry(id) {
                if self.spare.len() < SPARE {
                    self.spare.push(entry);
                }
            }
        }
    }
}

#[derive(Default)]
struct Slot {
    busy: Mutex<bool>,
    /// Wakes a waiter only when one waits: a release is once per step.
    free: Signal,
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
        let slot = lock(&self.slots).slot(id);
        let mut busy = lock(&slot.busy);
        while *busy {
            busy = slot.free.wait(busy);
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
        let slot = lock(&self.slots).slot(id);
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
        lock(&self.slots).release(id, &slot);
        None
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.slots).held.len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        *lock(&self.slot.busy) = false;
        self.slot.free.notify_one();
        lock(&self.locks.slots).release(self.id, &self.slot);
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
        // What is kept for reuse is bounded too.
        assert_eq!(lock(&locks.slots).spare.len(), 1);
        let held: Vec<String> = (0..2 * SPARE).map(|i| format!("t{i}")).collect();
        let holds: Vec<_> = held.iter().map(|id| locks.hold(id)).collect();
        assert_eq!(locks.len(), 2 * SPARE);
        drop(holds);
        assert_eq!(locks.len(), 0);
        assert_eq!(lock(&locks.slots).spare.len(), SPARE);
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
