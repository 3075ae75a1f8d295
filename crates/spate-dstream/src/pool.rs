//! The worker pool that runs a batch's partitions in parallel.
//!
//! Each parallel stage runs on crossbeam scoped threads, one per core (or
//! fewer when there are fewer partitions); workers pull partitions from a
//! shared counter, so a slow partition does not hold the others back. Scoped
//! threads let a stage borrow the operator's closure and state without `Arc`
//! or `'static` bounds, and without unsafe code.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use spate_core::sync::lock;

/// Runs a function over a list of items, partition-parallel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pool {
    workers: usize,
}

/// A task panicked; the panic message, when it was a string.
#[derive(Debug)]
pub(crate) struct TaskPanic(pub(crate) String);

impl Pool {
    /// A pool of `workers` threads (at least one).
    pub(crate) fn new(workers: usize) -> Self {
        Pool { workers: workers.max(1) }
    }

    /// A pool as wide as the machine.
    pub(crate) fn for_machine() -> Self {
        Pool::new(std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// The number of worker threads.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Applies `f` to every item, in parallel, and returns the results in
    /// the items' order.
    pub(crate) fn map<I, O, F>(&self, items: Vec<I>, f: F) -> Result<Vec<O>, TaskPanic>
    where
        I: Send,
        O: Send,
        F: Fn(I) -> O + Sync,
    {
        let threads = self.workers.min(items.len());
        if threads <= 1 {
            return std::panic::catch_unwind(AssertUnwindSafe(|| items.into_iter().map(f).collect()))
                .map_err(|panic| TaskPanic(panic_message(panic.as_ref())));
        }
        let inputs: Vec<Mutex<Option<I>>> = items.into_iter().map(|item| Mutex::new(Some(item))).collect();
        let outputs: Vec<Mutex<Option<O>>> = inputs.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let failure: Mutex<Option<String>> = Mutex::new(None);
        let work = || {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = inputs.get(index) else { break };
                let item = lock(slot).take();
                let (Some(item), Some(out)) = (item, outputs.get(index)) else { continue };
                // A panic in user code becomes an error naming the operator,
                // not an abort of the whole process.
                match std::panic::catch_unwind(AssertUnwindSafe(|| f(item))) {
                    Ok(result) => *lock(out) = Some(result),
                    Err(panic) => {
                        *lock(&failure) = Some(panic_message(panic.as_ref()));
                        break;
                    }
                }
            }
        };
        let joined = crossbeam::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|_| work());
            }
        });
        if let Some(message) = failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
            return Err(TaskPanic(message));
        }
        if joined.is_err() {
            return Err(TaskPanic("a worker thread panicked".to_string()));
        }
        outputs
            .into_iter()
            .map(|out| out.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect::<Option<Vec<O>>>()
            .ok_or_else(|| TaskPanic("a task produced no result".to_string()))
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a task panicked".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_runs_everything() {
        let pool = Pool::new(3);
        let out = pool.map((0..100u64).collect(), |x| x * 2).unwrap();
        assert_eq!(out, (0..100u64).map(|x| x * 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_task_is_an_error() {
        let pool = Pool::new(2);
        let out = pool.map(vec![1, 2, 3], |x: i32| if x == 2 { panic!("boom") } else { x });
        assert!(matches!(out, Err(TaskPanic(m)) if m.contains("boom")));
    }
}
