//! A stop signal that blocking waits (rate limits, backoff, block timers)
//! and async receivers can both watch.
//!
//! Waits go through the [`Clock`], but a `ManualClock` does not wake anyone
//! when a stop is signalled, so a wait sleeps in short real-time slices and
//! re-reads the clock between them.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

use spate_core::sync::lock;
use spate_core::{Clock, Time};

/// Longest real-time slice of a clock wait before the clock is read again.
const POLL_SLICE: std::time::Duration = std::time::Duration::from_millis(5);

/// A one-way latch: once stopped, stays stopped. Cloning shares it.
#[derive(Clone, Debug)]
pub(crate) struct StopSignal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    stopped: Mutex<bool>,
    changed: Condvar,
    watch: tokio::sync::watch::Sender<bool>,
}

impl Default for StopSignal {
    fn default() -> Self {
        let (watch, _) = tokio::sync::watch::channel(false);
        StopSignal { inner: Arc::new(Inner { stopped: Mutex::new(false), changed: Condvar::new(), watch }) }
    }
}

impl StopSignal {
    /// Signals the stop and wakes every waiter.
    pub(crate) fn stop(&self) {
        *lock(&self.inner.stopped) = true;
        self.inner.changed.notify_all();
        self.inner.watch.send_replace(true);
    }

    /// True once stopped.
    pub(crate) fn is_stopped(&self) -> bool {
        *lock(&self.inner.stopped)
    }

    /// Blocks until `clock` reaches `deadline` (true) or the signal stops (false).
    pub(crate) fn wait_until(&self, clock: &dyn Clock, deadline: Time) -> bool {
        let mut stopped = lock(&self.inner.stopped);
        loop {
            if *stopped {
                return false;
            }
            let now = clock.now();
            if now >= deadline {
                return true;
            }
            let slice = std::time::Duration::from(deadline.since(now)).min(POLL_SLICE);
            stopped = self.inner.changed.wait_timeout(stopped, slice).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Resolves once stopped.
    pub(crate) async fn stopped(&self) {
        let mut watch = self.inner.watch.subscribe();
        // The sender lives in `self`, so waiting cannot fail.
        let _ = watch.wait_for(|stopped| *stopped).await;
    }
}

#[cfg(test)]
mod tests {
    use spate_core::{Duration, ManualClock};

    use super::*;

    #[test]
    fn wait_ends_at_deadline_or_stop() {
        let clock = ManualClock::new(Time::from_millis(0));
        let signal = StopSignal::default();
        let waiter = {
            let (clock, signal) = (clock.clone(), signal.clone());
            std::thread::spawn(move || signal.wait_until(&clock, Time::from_millis(100)))
        };
        clock.advance(Duration::from_millis(100));
        assert!(waiter.join().unwrap());
        let waiter = {
            let (clock, signal) = (clock.clone(), signal.clone());
            std::thread::spawn(move || signal.wait_until(&clock, Time::from_millis(1_000_000)))
        };
        signal.stop();
        assert!(!waiter.join().unwrap());
        assert!(signal.is_stopped());
    }
}
