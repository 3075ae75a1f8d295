//! The JobScheduler: runs the output jobs of batches on a pool of worker
//! threads and decides when a batch may commit.
//!
//! Jobs of a batch may finish in any order and, with more than one worker,
//! jobs of several batches may run at once; [`CommitOrder`] still releases
//! batches for commit strictly in batch order, and only once every one of a
//! batch's outputs finished (invariant 1).

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam::channel::{Sender, unbounded};
use spate_core::BatchId;
use spate_dstream::Released;
use tracing::warn;

/// The body of one output job: writes the batch's output somewhere, and
/// hands back what it read, freed only after its outcome is reported.
pub(crate) type JobBody = Box<dyn FnOnce() -> (Result<(), String>, Option<Released>) + Send>;

/// An output job with the name of the output it runs.
pub(crate) struct NamedJob {
    /// The output's name (used in errors and progress).
    pub(crate) name: String,
    /// What to run.
    pub(crate) body: JobBody,
}

#[cfg(test)]
impl NamedJob {
    /// A job that hands nothing back.
    pub(crate) fn new(name: impl Into<String>, body: impl FnOnce() -> Result<(), String> + Send + 'static) -> Self {
        NamedJob { name: name.into(), body: Box::new(move || (body(), None)) }
    }
}

/// How one job ended.
#[derive(Debug, Clone)]
pub(crate) struct JobOutcome {
    /// The batch the job belongs to.
    pub(crate) batch: BatchId,
    /// The output's name.
    pub(crate) name: String,
    /// `Err` carries what the output reported (or the panic message).
    pub(crate) result: Result<(), String>,
    /// Wall time the job took, ms.
    pub(crate) elapsed_ms: u64,
}

/// Called with each finished job, on the worker that ran it.
pub(crate) type OutcomeSink = Arc<dyn Fn(JobOutcome) + Send + Sync>;

struct Task {
    batch: BatchId,
    job: NamedJob,
    report: OutcomeSink,
}

/// A fixed pool of worker threads fed from one queue.
pub(crate) struct JobScheduler {
    queue: Option<Sender<Task>>,
    workers: Vec<JoinHandle<()>>,
    /// Set when queued jobs must not start any more (an immediate stop, a failure).
    cancelled: Arc<AtomicBool>,
}

impl JobScheduler {
    /// Starts `concurrent_jobs` workers (at least one).
    pub(crate) fn new(concurrent_jobs: usize) -> std::io::Result<Self> {
        let (queue, tasks) = unbounded::<Task>();
        let cancelled = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for i in 0..concurrent_jobs.max(1) {
            let (tasks, cancelled) = (tasks.clone(), Arc::clone(&cancelled));
            let worker = std::thread::Builder::new().name(format!("spate-job-{i}")).spawn(move || {
                for task in tasks {
                    if cancelled.load(Ordering::Acquire) {
                        break;
                    }
                    run_task(task);
                }
            })?;
            workers.push(worker);
        }
        Ok(JobScheduler { queue: Some(queue), workers, cancelled })
    }

    /// Queues the jobs of `batch`; each outcome goes to `report`.
    pub(crate) fn submit(&self, batch: BatchId, jobs: Vec<NamedJob>, report: &OutcomeSink) {
        for job in jobs {
            let task = Task { batch, job, report: Arc::clone(report) };
            let Some(queue) = &self.queue else { return };
            if let Err(rejected) = queue.send(task) {
                // Only after shutdown: report the job as failed so nobody waits on it.
                let task = rejected.into_inner();
                (task.report)(JobOutcome {
                    batch,
                    name: task.job.name,
                    result: Err("the job scheduler is shut down".to_string()),
                    elapsed_ms: 0,
                });
            }
        }
    }

    /// Lets the queued jobs finish and joins the workers.
    pub(crate) fn shutdown(mut self) {
        self.stop_and_join();
    }

    /// Starts no queued job any more and waits for the running ones (at
    /// most one a worker). The caller releases the writer lock only after
    /// this returns, so no output of an abandoned batch runs once another
    /// writer may have taken the checkpoint over.
    pub(crate) fn abandon(mut self) {
        self.cancel_and_join();
    }

    fn cancel_and_join(&mut self) {
        self.cancelled.store(true, Ordering::Release);
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.queue = None;
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                warn!("a job worker thread panicked outside a job");
            }
        }
    }
}

impl Drop for JobScheduler {
    /// Dropped without [`JobScheduler::shutdown`] (a panic unwinding the
    /// driver): nothing queued starts, and what runs is waited for.
    fn drop(&mut self) {
        self.cancel_and_join();
    }
}

fn run_task(task: Task) {
    let Task { batch, job, report } = task;
    let started = Instant::now();
    // A panicking output fails its batch instead of killing the worker and
    // leaving the batch waiting forever.
    let (result, read) = catch_unwind(AssertUnwindSafe(job.body))
        .unwrap_or_else(|panic| (Err(format!("panicked: {}", panic_message(&panic))), None));
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    report(JobOutcome { batch, name: job.name, result, elapsed_ms });
    // The batch may commit meanwhile: freeing what the job read is not part of it.
    drop(read);
}

/// The message of a caught panic, when it was a string.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

#[derive(Debug, Default)]
struct PendingBatch {
    remaining: usize,
    failure: Option<(String, String)>,
}

/// What [`CommitOrder`] decided after a job finished.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CommitDecision {
    /// These batches (in order) have all their outputs done and every earlier
    /// batch is committed: commit them.
    Commit(Vec<BatchId>),
    /// An output of this batch failed: the batch must not commit.
    Failed {
        /// The batch.
        batch: BatchId,
        /// The output that failed.
        output: String,
        /// Why.
        reason: String,
    },
}

/// Tracks the outputs of in-flight batches and releases them for commit in
/// batch order.
#[derive(Debug, Default)]
pub(crate) struct CommitOrder {
    pending: BTreeMap<BatchId, PendingBatch>,
}

impl CommitOrder {
    /// Registers `batch` with `jobs` outputs to wait for.
    pub(crate) fn expect(&mut self, batch: BatchId, jobs: usize) {
        self.pending.insert(batch, PendingBatch { remaining: jobs, failure: None });
    }

    /// True when no batch is waiting.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Records a finished job and says what may happen now.
    #[cfg(test)]
    pub(crate) fn finished(&mut self, outcome: &JobOutcome) -> CommitDecision {
        self.record(outcome);
        self.ready()
    }

    /// Records a finished job.
    pub(crate) fn record(&mut self, outcome: &JobOutcome) {
        if let Some(pending) = self.pending.get_mut(&outcome.batch) {
            pending.remaining = pending.remaining.saturating_sub(1);
            if let Err(reason) = &outcome.result {
                pending.failure.get_or_insert_with(|| (outcome.name.clone(), reason.clone()));
            }
        }
    }

    /// Releases the completed prefix of batches (a batch with no outputs is
    /// released as soon as it is first in line).
    pub(crate) fn ready(&mut self) -> CommitDecision {
        let mut ready = Vec::new();
        while let Some(entry) = self.pending.first_entry() {
            let batch = *entry.key();
            if let Some((output, reason)) = entry.get().failure.clone() {
                return CommitDecision::Failed { batch, output, reason };
            }
            if entry.get().remaining > 0 {
                break;
            }
            entry.remove();
            ready.push(batch);
        }
        CommitDecision::Commit(ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam::channel::bounded;
    use std::sync::Mutex;

    fn outcome(batch: u64, ok: bool) -> JobOutcome {
        JobOutcome {
            batch: BatchId(batch),
            name: "out".into(),
            result: if ok { Ok(()) } else { Err("disk full".into()) },
            elapsed_ms: 0,
        }
    }

    #[test]
    fn batches_are_released_in_order_only_when_complete() {
        let mut order = CommitOrder::default();
        order.expect(BatchId(1), 2);
        order.expect(BatchId(2), 1);
        assert_eq!(order.finished(&outcome(2, true)), CommitDecision::Commit(vec![]));
        assert_eq!(order.finished(&outcome(1, true)), CommitDecision::Commit(vec![]));
        assert_eq!(order.finished(&outcome(1, true)), CommitDecision::Commit(vec![BatchId(1), BatchId(2)]));
        assert!(order.is_idle());
    }

    #[test]
    fn a_failed_output_blocks_the_batch() {
        let mut order = CommitOrder::default();
        order.expect(BatchId(4), 2);
        order.finished(&outcome(4, false));
        let decision = order.finished(&outcome(4, true));
        assert_eq!(
            decision,
            CommitDecision::Failed { batch: BatchId(4), output: "out".into(), reason: "disk full".into() }
        );
    }

    #[test]
    fn workers_run_jobs_concurrently_and_survive_panics() {
        let scheduler = JobScheduler::new(2).unwrap();
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let (gate_tx, gate_rx) = bounded::<()>(0);
        let report: OutcomeSink = {
            let outcomes = Arc::clone(&outcomes);
            Arc::new(move |o: JobOutcome| outcomes.lock().unwrap().push(o))
        };
        // The first job waits for the second: with one worker this would deadlock.
        let jobs = vec![
            NamedJob::new("waits", move || gate_rx.recv().map_err(|e| e.to_string())),
            NamedJob::new("opens", move || gate_tx.send(()).map_err(|e| e.to_string())),
            NamedJob::new("panics", || panic!("bad output")),
        ];
        scheduler.submit(BatchId(0), jobs, &report);
        scheduler.shutdown();
        let outcomes = outcomes.lock().unwrap();
        assert_eq!(outcomes.len(), 3);
        let panicked = outcomes.iter().find(|o| o.name == "panics").unwrap();
        assert_eq!(panicked.result, Err("panicked: bad output".to_string()));
        assert!(outcomes.iter().filter(|o| o.name != "panics").all(|o| o.result.is_ok()));
    }

    #[test]
    fn what_a_job_read_is_freed_after_its_outcome_is_reported() {
        /// Records whose freeing is seen.
        struct Records(Arc<AtomicBool>);
        impl Drop for Records {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let freed_at_report = Arc::new(Mutex::new(Vec::new()));
        let report: OutcomeSink = {
            let (freed, seen) = (Arc::clone(&freed), Arc::clone(&freed_at_report));
            Arc::new(move |_: JobOutcome| seen.lock().unwrap().push(freed.load(Ordering::Acquire)))
        };
        let records = Records(Arc::clone(&freed));
        let job = NamedJob { name: "reads".into(), body: Box::new(move || (Ok(()), Some(Released::new(records)))) };
        let scheduler = JobScheduler::new(1).unwrap();
        scheduler.submit(BatchId(0), vec![job], &report);
        scheduler.shutdown();
        assert_eq!(*freed_at_report.lock().unwrap(), [false], "reported before the records were freed");
        assert!(freed.load(Ordering::Acquire), "and freed after");
    }

    #[test]
    fn an_abandoned_scheduler_starts_no_queued_job_and_waits_for_the_running_one() {
        let scheduler = JobScheduler::new(1).unwrap();
        let cancelled = Arc::clone(&scheduler.cancelled);
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let report: OutcomeSink = {
            let outcomes = Arc::clone(&outcomes);
            Arc::new(move |o: JobOutcome| outcomes.lock().unwrap().push(o.name))
        };
        let (started_tx, started_rx) = bounded::<()>(1);
        let (gate_tx, gate_rx) = bounded::<()>(1);
        let queued_ran = Arc::new(AtomicBool::new(false));
        let ran = Arc::clone(&queued_ran);
        let jobs = vec![
            NamedJob::new("running", move || {
                started_tx.send(()).map_err(|e| e.to_string())?;
                gate_rx.recv().map_err(|e| e.to_string())
            }),
            NamedJob::new("queued", move || {
                ran.store(true, Ordering::Release);
                Ok(())
            }),
        ];
        scheduler.submit(BatchId(3), jobs, &report);
        started_rx.recv().unwrap();
        let abandoning = std::thread::spawn(move || scheduler.abandon());
        // Let the running job end only once the scheduler was cancelled.
        while !cancelled.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        gate_tx.send(()).unwrap();
        abandoning.join().unwrap();
        // abandon() returned: the running job had finished, the queued one never started.
        assert_eq!(*outcomes.lock().unwrap(), vec!["running".to_string()]);
        assert!(!queued_ran.load(Ordering::Acquire));
    }
}
