//! Locks that recover from poisoning, the one way every crate of promptd takes a lock, and
//! [`Signal`], the condvar they wait with when a notify is frequent.
//!
//! A lock is poisoned when a thread panicked while holding it. Every lock in promptd guards
//! data that stays consistent between statements (a panic cannot leave it half-updated), so
//! the data is still good: these helpers take it instead of propagating the panic to every
//! later caller.
//!
//! ```
//! use std::sync::{Mutex, RwLock};
//! use promptd_core::sync::{lock, read, write};
//!
//! let counter = Mutex::new(0);
//! *lock(&counter) += 1;
//! let names = RwLock::new(vec!["a"]);
//! write(&names).push("b");
//! assert_eq!((*lock(&counter), read(&names).len()), (1, 2));
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{
    Condvar, LockResult, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

/// The value of a lock operation, poisoned or not.
pub fn recover<G>(result: LockResult<G>) -> G {
    result.unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks `mutex`, recovering it if a thread panicked while holding it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    recover(mutex.lock())
}

/// Locks `lock` for reading, recovering it if a thread panicked while holding it.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    recover(lock.read())
}

/// Locks `lock` for writing, recovering it if a thread panicked while holding it.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    recover(lock.write())
}

/// Waits on `condvar` with `guard` ([`Condvar::wait`]), recovering the lock if poisoned.
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    recover(condvar.wait(guard))
}

/// A condvar that makes no system call when no thread waits. The standard library's notify
/// is a `FUTEX_WAKE` whether or not anyone waits: one per step for a session's lock, one per
/// plugin call for an instance pool (issue 50). A waiter is counted while it holds the mutex,
/// before waiting releases it, and a notifier changes the guarded state under the same mutex
/// before it looks at the count: a waiter it does not see saw the change before sleeping.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use promptd_core::sync::{lock, Signal};
///
/// let shared = Arc::new((Mutex::new(false), Signal::default()));
/// let other = shared.clone();
/// let waiter = std::thread::spawn(move || {
///     let (done, signal) = &*other;
///     let mut done = lock(done);
///     while !*done {
///         done = signal.wait(done);
///     }
/// });
/// *lock(&shared.0) = true;
/// shared.1.notify_one();
/// waiter.join().unwrap();
/// ```
#[derive(Debug, Default)]
pub struct Signal {
    condvar: Condvar,
    waiting: AtomicUsize,
}

impl Signal {
    /// Waits with `guard` until notified ([`Condvar::wait`]; spurious wakes possible),
    /// recovering the lock if poisoned.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let guard = recover(self.condvar.wait(guard));
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Waits with `guard` while `condition` holds, at most `timeout`
    /// ([`Condvar::wait_timeout_while`]); the guard, and whether the time ran out.
    pub fn wait_timeout_while<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        condition: impl FnMut(&mut T) -> bool,
    ) -> (MutexGuard<'a, T>, bool) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let (guard, waited) = recover(self.condvar.wait_timeout_while(guard, timeout, condition));
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        (guard, waited.timed_out())
    }

    /// Wakes one waiting thread, if any waits.
    pub fn notify_one(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.condvar.notify_one();
        }
    }

    /// Wakes every waiting thread, if any waits.
    pub fn notify_all(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.condvar.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _held = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 1);
    }

    #[test]
    fn a_signal_wakes_a_waiter_and_counts_none_after() {
        let shared = std::sync::Arc::new((Mutex::new(0), Signal::default()));
        let other = shared.clone();
        let waiter = std::thread::spawn(move || {
            let (n, signal) = &*other;
            let (n, timed_out) =
                signal.wait_timeout_while(lock(n), Duration::from_secs(30), |n| *n == 0);
            (*n, timed_out)
        });
        // Changed under the lock only once the waiter is counted, so the notify must wake it.
        while shared.1.waiting.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        *lock(&shared.0) = 7;
        shared.1.notify_all();
        assert_eq!(waiter.join().unwrap(), (7, false));
        assert_eq!(shared.1.waiting.load(Ordering::SeqCst), 0);
    }
}
