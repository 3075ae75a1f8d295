//! The memory budget the inputs of one process share: what they hold of
//! records not yet processed may not pass it, and an input that would pass
//! it waits (backpressure) instead of growing.
//!
//! The budget counts bytes the holders estimate; it does not allocate. A
//! receiver reserves a block's bytes before it keeps the block and releases
//! them when the block has been read into its batch, so a source faster than
//! the engine is slowed to the engine's pace rather than filling memory.
//! While the process shuts down, [`MemoryBudget::stop_waiting`] admits every
//! reservation, so the last blocks of a stopping receiver are kept (and
//! processed) rather than lost or waited for forever.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::error::CoreError;
use crate::sync::lock;

/// Bytes of not yet processed records that the inputs of a process may hold.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    state: Mutex<BudgetState>,
    room: Condvar,
}

#[derive(Debug, Default)]
struct BudgetState {
    used: u64,
    waiting: usize,
    waits: u64,
    admit_all: bool,
}

/// What [`MemoryBudget::reserve`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// The bytes fitted at once.
    Immediate,
    /// The caller waited for room (backpressure held it back).
    Waited,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, none in use.
    pub fn new(limit: u64) -> Self {
        MemoryBudget { limit, state: Mutex::new(BudgetState::default()), room: Condvar::new() }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Callers waiting for room now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// How many reservations have had to wait so far.
    pub fn waits(&self) -> u64 {
        self.lock().waits
    }

    /// Reserves `bytes` if they fit now; false (reserving nothing) otherwise.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        let mut state = self.lock();
        if state.admit_all || state.used + bytes <= self.limit {
            state.used += bytes;
            true
        } else {
            false
        }
    }

    /// Reserves `bytes`, waiting until enough is released. More than the
    /// whole limit can never fit and is refused; the caller must split it
    /// or raise the limit.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, CoreError> {
        if bytes > self.limit {
            return Err(CoreError::OverMemoryBudget { needed: bytes, limit: self.limit });
        }
        let mut state = self.lock();
        let mut waited = false;
        while !state.admit_all && state.used + bytes > self.limit {
            if !waited {
                waited = true;
                state.waits += 1;
            }
            state.waiting += 1;
            state = self.room.wait(state).unwrap_or_else(PoisonError::into_inner);
            state.waiting -= 1;
        }
        state.used += bytes;
        Ok(if waited { Reservation::Waited } else { Reservation::Immediate })
    }

    /// Counts `bytes` that are held already (a result computed before its
    /// size was known), past the limit if need be: they do not wait, but
    /// the reservations after them do until they are released.
    pub fn charge(&self, bytes: u64) {
        self.lock().used += bytes;
    }

    /// Gives back `bytes` reserved before, waking the callers waiting for room.
    pub fn release(&self, bytes: u64) {
        let mut state = self.lock();
        state.used = state.used.saturating_sub(bytes);
        drop(state);
        self.room.notify_all();
    }

    /// From now on every reservation fits at once, over the limit if need
    /// be, and the callers waiting now go on: used while the process stops,
    /// when no batch will run to release what is held.
    pub fn stop_waiting(&self) {
        self.lock().admit_all = true;
        self.room.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, BudgetState> {
        // Every update of the state completes before anything can panic.
        lock(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn eventually(cond: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "the condition never held");
            std::thread::yield_now();
        }
    }

    #[test]
    fn reservations_fit_until_the_limit_and_release_makes_room() {
        let budget = MemoryBudget::new(100);
        assert_eq!(budget.reserve(60).unwrap(), Reservation::Immediate);
        assert!(!budget.try_reserve(41));
        assert!(budget.try_reserve(40));
        assert_eq!(budget.used(), 100);
        budget.release(30);
        assert_eq!(budget.used(), 70);
        assert!(budget.try_reserve(30));
    }

    #[test]
    fn charged_bytes_count_past_the_limit_and_hold_later_reservations_back() {
        let budget = MemoryBudget::new(100);
        budget.charge(150);
        assert_eq!(budget.used(), 150);
        assert!(!budget.try_reserve(1));
        budget.release(150);
        assert!(budget.try_reserve(100));
    }

    #[test]
    fn more_than_the_limit_is_refused_naming_both() {
        let err = MemoryBudget::new(100).reserve(101).unwrap_err();
        assert!(matches!(err, CoreError::OverMemoryBudget { needed: 101, limit: 100 }), "{err:?}");
        assert!(err.to_string().contains("101") && err.to_string().contains("100"), "{err}");
    }

    #[test]
    fn a_reservation_that_does_not_fit_waits_for_a_release() {
        let budget = Arc::new(MemoryBudget::new(100));
        budget.reserve(80).unwrap();
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.reserve(50).unwrap())
        };
        eventually(|| budget.waiting() == 1);
        assert_eq!(budget.used(), 80, "nothing is reserved while waiting");
        budget.release(40);
        assert_eq!(waiter.join().unwrap(), Reservation::Waited);
        assert_eq!((budget.used(), budget.waits()), (90, 1));
    }

    #[test]
    fn once_stopping_every_reservation_fits_and_waiters_go_on() {
        let budget = Arc::new(MemoryBudget::new(100));
        budget.reserve(100).unwrap();
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.reserve(10).unwrap())
        };
        eventually(|| budget.waiting() == 1);
        budget.stop_waiting();
        waiter.join().unwrap();
        assert!(budget.try_reserve(1000));
        assert_eq!(budget.used(), 1110);
    }
}
