//! Locks that ignore poison.
//!
//! A `Mutex` or `RwLock` is poisoned when a thread panics while holding it.
//! spate does not treat that as a reason to fail every later caller: the data
//! behind its locks is kept consistent by the code that changes it (a change
//! is made whole or not at all, or the owner marks itself failed, as the
//! tracker does), and a panicking thread is reported where it is joined. A
//! second panic on every later `lock()` would only hide the first one. So
//! every lock in the engine is taken through these helpers, which hand back
//! the guard whether or not the lock is poisoned.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, poisoned or not.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a read lock on `lock`, poisoned or not.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the write lock on `lock`, poisoned or not.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let mutex = Arc::new(Mutex::new(1));
        let held = Arc::clone(&mutex);
        let _ = std::thread::spawn(move || {
            let _guard = held.lock();
            panic!("poison it");
        })
        .join();
        assert!(mutex.is_poisoned());
        *lock(&mutex) += 1;
        assert_eq!(*lock(&mutex), 2);
    }

    #[test]
    fn a_poisoned_rwlock_still_reads_and_writes() {
        let rw = Arc::new(RwLock::new(1));
        let held = Arc::clone(&rw);
        let _ = std::thread::spawn(move || {
            let _guard = held.write();
            panic!("poison it");
        })
        .join();
        *write(&rw) += 1;
        assert_eq!(*read(&rw), 2);
    }
}
