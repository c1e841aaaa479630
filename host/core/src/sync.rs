//! Locks that recover from poisoning, the one way every crate of promptd takes a lock.
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

use std::sync::{
    Condvar, LockResult, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

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
}
