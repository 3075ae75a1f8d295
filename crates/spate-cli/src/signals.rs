//! Stopping a job: the first SIGINT or SIGTERM asks for a graceful stop (the
//! batch in flight finishes and commits, the lock is released); a second one
//! ends the process at once with exit code 130. The checkpoint stays
//! consistent either way: an uncommitted batch re-runs at the next start.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

use spate_core::{Clock, Time};

use crate::error::{CliError, ExitCode};

/// A shared "please stop" flag that a waiting job wakes up for.
#[derive(Clone, Debug, Default)]
pub(crate) struct StopFlag {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl StopFlag {
    /// Asks the job to stop after the batch in flight.
    pub(crate) fn request(&self) {
        *self.inner.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.inner.1.notify_all();
    }

    /// True once a stop was asked for.
    pub(crate) fn is_requested(&self) -> bool {
        *self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `clock` reaches `deadline` or a stop is asked for; true
    /// when the deadline was reached without a stop. Wakes at least every
    /// 100 ms to look at the clock, which may be moved by someone else.
    pub(crate) fn wait_until(&self, clock: &dyn Clock, deadline: Time) -> bool {
        let mut stopped = self.inner.0.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if *stopped {
                return false;
            }
            let now = clock.now();
            if now >= deadline {
                return true;
            }
            let wait = std::time::Duration::from(deadline.since(now)).min(std::time::Duration::from_millis(100));
            stopped = self.inner.1.wait_timeout(stopped, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

/// Listens for SIGINT and SIGTERM while alive (dropping it stops listening).
#[derive(Debug)]
pub(crate) struct SignalListener {
    _runtime: tokio::runtime::Runtime,
}

/// Starts listening: the first signal requests `stop`, the second exits the process.
pub(crate) fn listen(stop: StopFlag) -> Result<SignalListener, CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("spate-signals")
        .enable_all()
        .build()
        .map_err(|e| CliError::io("start the signal listener for", "SIGINT/SIGTERM", e))?;
    let (mut interrupt, mut terminate) = runtime
        .block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            Ok::<_, std::io::Error>((signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
        })
        .map_err(|e| CliError::io("listen for", "SIGINT/SIGTERM", e))?;
    runtime.spawn(async move {
        for count in 1.. {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            if count == 1 {
                tracing::warn!(
                    signal = name,
                    "stopping gracefully: finishing the batch in flight (signal again to stop at once)"
                );
                say(&format!("{name}: stopping gracefully after the batch in flight; send it again to stop at once"));
                stop.request();
            } else {
                say(&format!("{name} again: stopping at once; the uncommitted batch re-runs at the next start"));
                std::process::exit(ExitCode::Interrupted.code());
            }
        }
    });
    Ok(SignalListener { _runtime: runtime })
}

/// One line on stderr; a closed stderr is ignored.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::{Duration, ManualClock};

    #[test]
    fn a_stop_wakes_a_waiter_and_a_reached_deadline_returns_true() {
        let clock = ManualClock::new(Time::from_millis(1_000));
        let stop = StopFlag::default();
        assert!(stop.wait_until(&clock, Time::from_millis(1_000)));
        let waiter = {
            let (stop, clock) = (stop.clone(), clock.clone());
            std::thread::spawn(move || stop.wait_until(&clock, Time::from_millis(60_000)))
        };
        stop.request();
        assert!(!waiter.join().unwrap());
        assert!(stop.is_requested());
        clock.advance(Duration::from_secs(100));
        assert!(!stop.wait_until(&clock, Time::from_millis(2_000)), "a requested stop wins over the deadline");
    }
}
