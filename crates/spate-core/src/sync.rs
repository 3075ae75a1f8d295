//! Locking a mutex whatever a panicking holder left behind.
//!
//! A thread that panics while holding a lock poisons it. spate's shared
//! state is kept consistent at every step a panic can interrupt (a value
//! is replaced whole, a counter moved once), and a panic is reported where
//! it happens (a failed batch, a receiver restart); refusing every later
//! lock would turn one failed task into a stuck process. So every crate
//! takes its locks through [`lock`], which ignores the poison.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, ignoring a poison left by a holder that panicked.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_with_its_last_value() {
        let mutex = std::sync::Arc::new(Mutex::new(1));
        let holder = std::sync::Arc::clone(&mutex);
        let _ = std::thread::spawn(move || {
            let mut guard = holder.lock().unwrap();
            *guard = 2;
            panic!("the holder fails");
        })
        .join();
        assert!(mutex.is_poisoned());
        assert_eq!(*lock(&mutex), 2);
    }
}
