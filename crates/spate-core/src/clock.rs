//! The clock that every time-based behaviour goes through.
//!
//! Production code uses [`SystemClock`]; tests drive a [`ManualClock`] so
//! that batch timers, rolling intervals and rate limits run without sleeps
//! and give the same result on every run.

use std::fmt::Debug;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::sync::lock;
use crate::time::{Duration, Time};

/// A source of the current time that can also wait for a future time.
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> Time;

    /// Blocks the calling thread until [`Clock::now`] is at or after `deadline`
    /// and returns the time then.
    fn sleep_until(&self, deadline: Time) -> Time;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Time {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Time::from_millis(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }

    fn sleep_until(&self, deadline: Time) -> Time {
        loop {
            let now = self.now();
            if now >= deadline {
                return now;
            }
            std::thread::sleep(deadline.since(now).into());
        }
    }
}

/// A clock that only moves when a test moves it. Cloning shares the time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    inner: Arc<(Mutex<Time>, Condvar)>,
}

impl ManualClock {
    /// A manual clock standing at `start`.
    pub fn new(start: Time) -> Self {
        ManualClock { inner: Arc::new((Mutex::new(start), Condvar::new())) }
    }

    /// Moves the clock forward by `by` and wakes every sleeper it passes.
    pub fn advance(&self, by: Duration) {
        let mut now = self.lock();
        *now = *now + by;
        self.inner.1.notify_all();
    }

    /// Sets the clock to `to` (which may be earlier; tests of clock skew need it).
    pub fn set(&self, to: Time) {
        *self.lock() = to;
        self.inner.1.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, Time> {
        // A panic while holding this lock cannot leave a torn `Time`.
        lock(&self.inner.0)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Time {
        *self.lock()
    }

    fn sleep_until(&self, deadline: Time) -> Time {
        let mut now = self.lock();
        while *now < deadline {
            now = self.inner.1.wait(now).unwrap_or_else(PoisonError::into_inner);
        }
        *now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_wakes_sleepers_when_advanced() {
        let clock = ManualClock::new(Time::from_millis(1000));
        let sleeper = {
            let clock = clock.clone();
            std::thread::spawn(move || clock.sleep_until(Time::from_millis(3000)))
        };
        clock.advance(Duration::from_millis(1000));
        assert_eq!(clock.now(), Time::from_millis(2000));
        clock.advance(Duration::from_millis(1500));
        let woke_at = sleeper.join().map_err(|_| "sleeper panicked");
        assert_eq!(woke_at, Ok(Time::from_millis(3500)));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > Time::from_millis(1_577_836_800_000));
    }
}
