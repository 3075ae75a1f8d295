//! The driver: the JobGenerator's event loop. One thread owns the graph, the
//! checkpoint and the receivers; a timer thread sends it the batch ticks, the
//! job workers send it their outcomes, stop handles send it stop requests.
//!
//! One batch at a time is between its `offsets/N` and its `commits/N`
//! (invariant 2 allows exactly one logged-but-uncommitted batch), so a batch
//! starts only when the previous one committed; its output jobs run on the
//! [`JobScheduler`] up to `concurrent_jobs` at once.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use crossbeam::channel::{Receiver, Sender};
use serde_json::{Value, json};
use spate_core::sync::lock;
use spate_core::{BatchId, Clock, Duration, MemoryBudget, Time};
use spate_dstream::{BatchLimits, Graph, PlannedOffsets, StateWriter};
use spate_logstore::{OffsetSeq, SourceOffset};
use spate_tracker::ReceivedBlockTracker;
use tracing::{info, warn};

use crate::checkpoint_store::{CheckpointStore, GraphManifest, SnapshotChain};
use crate::error::{RuntimeError, taken_over};
use crate::failpoints::{Failpoints, Point};
use crate::inputs::{Fed, ReceiverInput};
use crate::progress::{BatchProgress, PhaseTimes, ProgressFiles, ProgressListener};
use crate::rate_controller::{BatchTiming, RateController};
use crate::scheduler::{CommitDecision, CommitOrder, JobOutcome, JobScheduler, NamedJob, OutcomeSink, panic_message};
use crate::settings::StreamingSettings;
use crate::status::StatusBoard;
use crate::telemetry;

/// How to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopMode {
    /// Stop receiving, process what was received and queued, commit, stop.
    Graceful,
    /// Stop at once; what was not committed is re-run on the next start.
    Now,
}

/// What the driver's thread is told.
pub(crate) enum Event {
    /// Batch time `Time` has come.
    Tick(Time),
    /// An output job ended.
    JobDone(JobOutcome),
    /// Stop.
    Stop(StopMode),
}

/// How a context ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopReport {
    /// The last committed batch, if any.
    pub last_committed: Option<BatchId>,
    /// Batches committed by this run.
    pub batches_committed: u64,
    /// True when it stopped gracefully (everything received was processed).
    pub graceful: bool,
}

/// What callers can wait on while the driver runs.
#[derive(Debug, Default)]
pub(crate) struct SharedStatus {
    state: Mutex<StatusState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct StatusState {
    last_committed: Option<BatchId>,
    finished: bool,
    failure: Option<String>,
}

impl SharedStatus {
    fn update(&self, f: impl FnOnce(&mut StatusState)) {
        f(&mut lock(&self.state));
        self.changed.notify_all();
    }

    pub(crate) fn last_committed(&self) -> Option<BatchId> {
        lock(&self.state).last_committed
    }

    /// Waits (real time, up to `timeout`) until `batch` committed; false on
    /// timeout or when the driver ended first.
    pub(crate) fn wait_committed(&self, batch: BatchId, timeout: std::time::Duration) -> bool {
        let state = lock(&self.state);
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| s.last_committed.is_none_or(|c| c < batch) && !s.finished)
            .unwrap_or_else(PoisonError::into_inner);
        state.last_committed.is_some_and(|c| c >= batch)
    }

    /// The failure that ended the driver, if it failed.
    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.state).failure.clone()
    }
}

/// A batch waiting to start.
#[derive(Debug, Clone)]
pub(crate) enum QueuedBatch {
    /// Plan a new batch at this time.
    New(Time),
    /// Run a logged batch again with exactly its offsets.
    Rerun {
        /// The batch.
        batch: BatchId,
        /// Its logged offsets (the batch time is in them).
        offsets: OffsetSeq,
    },
}

struct InFlight {
    batch: BatchId,
    time: Time,
    offsets: OffsetSeq,
    recovered: bool,
    started: Instant,
    scheduling_delay_ms: u64,
    phases: PhaseTimes,
    records: u64,
    /// Records the batch set aside as late.
    late: u64,
    /// Work on the batch's records done as they arrived, before the batch.
    ahead: std::time::Duration,
    outputs_started: Instant,
}

/// A hook on a replayable input: told the logged offsets on resume, and the
/// committed offsets after each batch.
pub(crate) struct InputHooks {
    /// The input's name.
    pub(crate) name: String,
    /// Called with the last logged offsets (JSON) when resuming.
    pub(crate) on_resume: Option<crate::context::OffsetsHook>,
    /// Called with a batch's offsets (JSON) after it committed.
    pub(crate) on_commit: Option<crate::context::OffsetsHook>,
}

/// Everything the driver thread owns.
pub(crate) struct Engine {
    pub(crate) settings: StreamingSettings,
    pub(crate) graph: Graph,
    pub(crate) store: Option<CheckpointStore>,
    pub(crate) tracker: Option<Arc<ReceivedBlockTracker>>,
    pub(crate) receivers: Vec<Box<dyn ReceiverInput>>,
    pub(crate) hooks: Vec<InputHooks>,
    pub(crate) listeners: Vec<Arc<dyn ProgressListener>>,
    pub(crate) progress_files: Option<ProgressFiles>,
    pub(crate) rate: RateController,
    pub(crate) queue: VecDeque<QueuedBatch>,
    pub(crate) next_batch: BatchId,
    /// The time of the last batch queued or run.
    pub(crate) last_time: Option<Time>,
    /// Per receiver input: records of its stream in all batches logged so far.
    pub(crate) records_through: BTreeMap<String, u64>,
    /// The last state snapshot: its batch and time.
    pub(crate) state_batch: Option<(BatchId, Time)>,
    /// The time of each batch still retained (for cleanup thresholds).
    pub(crate) batch_times: BTreeMap<BatchId, Time>,
    /// Bytes the last state snapshot wrote.
    pub(crate) last_state_bytes: u64,
    /// True when the last state snapshot wrote changes of some operator.
    pub(crate) last_state_incremental: bool,
    /// Whole snapshots or changes, and the chains in force.
    pub(crate) chain: SnapshotChain,
    /// Test hooks (none unless `SPATE_FAILPOINTS` is set).
    pub(crate) failpoints: Failpoints,
    /// What the web page shows, when it is served.
    pub(crate) board: Option<Arc<StatusBoard>>,
    /// The budget the receivers' blocks share.
    pub(crate) memory: Arc<MemoryBudget>,
    /// The bytes the receivers' spilled blocks may take on disk together.
    pub(crate) spill: Arc<MemoryBudget>,
}

/// The driver loop's own bookkeeping.
struct Loop {
    scheduler: JobScheduler,
    order: CommitOrder,
    in_flight: Option<InFlight>,
    stopping: bool,
    committed: u64,
    /// The last batch this run committed, with its time.
    last_commit: Option<(BatchId, Time)>,
    report: OutcomeSink,
}

impl Engine {
    fn interval(&self) -> Duration {
        self.settings.batch_interval
    }

    fn has_stateful_operators(&self) -> bool {
        self.graph.descriptor().operators.iter().any(|op| op.stateful)
    }

    /// Runs the event loop until stopped or failed.
    pub(crate) fn run(
        mut self,
        events: &Receiver<Event>,
        events_tx: &Sender<Event>,
        status: &SharedStatus,
    ) -> Result<StopReport, RuntimeError> {
        let scheduler = JobScheduler::new(self.settings.concurrent_jobs)
            .map_err(|e| RuntimeError::Lifecycle { what: format!("could not start job workers: {e}") })?;
        let tx = events_tx.clone();
        let report: OutcomeSink = Arc::new(move |outcome| {
            // The driver may be gone after a stop; nobody waits then.
            let _ = tx.send(Event::JobDone(outcome));
        });
        let mut lp = Loop {
            scheduler,
            order: CommitOrder::default(),
            in_flight: None,
            stopping: false,
            committed: 0,
            last_commit: None,
            report,
        };
        // A panic anywhere on the driver (user code in a transformation or a
        // listener, the engine itself) ends the run like any failure: the
        // batch in flight stays uncommitted and re-runs at the next start.
        let result =
            catch_unwind(AssertUnwindSafe(|| self.event_loop(&mut lp, events, status))).unwrap_or_else(|panic| {
                Err(RuntimeError::Panicked { place: "the driver".into(), message: panic_message(&panic) })
            });
        let graceful = matches!(result, Ok(true));
        // Only a graceful stop lets queued outputs run; otherwise their batch
        // is not committed and the next start re-runs it. Either way the
        // running ones end before the writer lock is released below.
        if graceful {
            lp.scheduler.shutdown();
        } else {
            lp.scheduler.abandon();
        }
        let stop_receivers = self.stop_receivers();
        if let Some(tracker) = &self.tracker
            && let Err(e) = tracker.close()
        {
            warn!(error = %e, "closing the block tracker failed");
        }
        let outcome = result.and(stop_receivers).map(|_| StopReport {
            last_committed: status.last_committed(),
            batches_committed: lp.committed,
            graceful,
        });
        status.update(|s| {
            s.finished = true;
            s.failure = outcome.as_ref().err().map(ToString::to_string);
        });
        // Dropping the store releases the writer lock.
        drop(self.store.take());
        outcome
    }

    /// Returns Ok(true) after a graceful stop, Ok(false) after an immediate one.
    fn event_loop(
        &mut self,
        lp: &mut Loop,
        events: &Receiver<Event>,
        status: &SharedStatus,
    ) -> Result<bool, RuntimeError> {
        loop {
            if lp.in_flight.is_none()
                && let Some(next) = self.queue.pop_front()
            {
                self.start_batch(lp, next)?;
                // A batch without outputs is ready at once.
                self.commit_ready(lp, status)?;
                continue;
            }
            if lp.stopping && lp.in_flight.is_none() && self.queue.is_empty() {
                info!("graceful stop: every received record processed and committed");
                self.snapshot_at_stop(lp)?;
                return Ok(true);
            }
            let Ok(event) = events.recv() else { return Ok(false) };
            match event {
                Event::Tick(time) => {
                    if !lp.stopping && self.last_time.is_none_or(|last| time > last) {
                        self.last_time = Some(time);
                        self.queue.push_back(QueuedBatch::New(time));
                    }
                }
                Event::JobDone(outcome) => {
                    tracing::debug!(batch = %outcome.batch, output = %outcome.name, ms = outcome.elapsed_ms, "output finished");
                    lp.order.record(&outcome);
                    self.commit_ready(lp, status)?;
                }
                Event::Stop(StopMode::Now) => {
                    info!("stopping now: batches not committed are re-run on the next start");
                    return Ok(false);
                }
                Event::Stop(StopMode::Graceful) if !lp.stopping => {
                    lp.stopping = true;
                    self.begin_graceful_stop()?;
                }
                Event::Stop(StopMode::Graceful) => {}
            }
        }
    }

    /// Snapshots the state of the last batch this run committed, unless it
    /// has a snapshot already: the next start (or, in an application, the
    /// task's next owner) then restores it and replays nothing.
    fn snapshot_at_stop(&mut self, lp: &Loop) -> Result<(), RuntimeError> {
        let Some((batch, time)) = lp.last_commit else { return Ok(()) };
        if self.state_batch.is_some_and(|(snapshot, _)| snapshot == batch) {
            return Ok(());
        }
        self.checkpoint_state_if_due(batch, time, true).map(drop)
    }

    /// Stops the receivers (they push their last blocks) and queues one more
    /// batch for what they received since the last batch.
    fn begin_graceful_stop(&mut self) -> Result<(), RuntimeError> {
        info!("graceful stop: stopping receivers, then finishing received data and queued batches");
        self.stop_receivers()?;
        if self.tracker.as_ref().is_some_and(|t| t.has_unallocated_blocks()) {
            let time =
                self.last_time.unwrap_or_else(|| self.settings.clock.now().floor(self.interval())) + self.interval();
            self.last_time = Some(time);
            self.queue.push_back(QueuedBatch::New(time));
        }
        Ok(())
    }

    fn stop_receivers(&mut self) -> Result<(), RuntimeError> {
        // No batch runs while the receivers stop, so none would make room
        // for a block waiting on the budget: their last blocks go over it.
        self.memory.stop_waiting();
        self.spill.stop_waiting();
        let mut first_error = None;
        for receiver in &mut self.receivers {
            if let Err(e) = receiver.stop() {
                warn!(input = receiver.name(), error = %e, "stopping a receiver failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn commit_ready(&mut self, lp: &mut Loop, status: &SharedStatus) -> Result<(), RuntimeError> {
        match lp.order.ready() {
            CommitDecision::Commit(batches) => {
                for batch in batches {
                    self.finish_batch(lp, batch, status)?;
                }
                Ok(())
            }
            CommitDecision::Failed { batch, output, reason } => {
                Err(RuntimeError::OutputFailed { batch, output, reason })
            }
        }
    }

    fn start_batch(&mut self, lp: &mut Loop, queued: QueuedBatch) -> Result<(), RuntimeError> {
        let started = Instant::now();
        let (batch, offsets, recovered) = match queued {
            QueuedBatch::New(time) => {
                let batch = self.next_batch;
                let offsets = self.plan(batch, time)?;
                if let Some(store) = &self.store {
                    store.write_offsets(batch, &offsets)?;
                }
                (batch, offsets, false)
            }
            QueuedBatch::Rerun { batch, offsets } => (batch, offsets, true),
        };
        self.failpoints.reach(Point::OffsetsLogged, batch);
        let time = offsets.batch_timestamp;
        self.next_batch = batch.next().ok_or_else(|| RuntimeError::Planning {
            batch,
            reason: "it is the largest batch id; no batch can follow it".to_string(),
        })?;
        self.last_time = Some(self.last_time.map_or(time, |last| last.max(time)));
        self.batch_times.insert(batch, time);
        let scheduling_delay_ms = self.settings.clock.now().since(time).as_millis();
        self.show_batch_started(batch, &offsets, scheduling_delay_ms, recovered);
        let mut phases = PhaseTimes { offsets_logged_ms: elapsed_ms(started), ..PhaseTimes::default() };
        let computing = Instant::now();
        let (jobs, Fed { records, ahead }) = self.compute(batch, &offsets, false)?;
        let late = self.graph.late_records();
        phases.jobs_ms = elapsed_ms(computing);
        let mut jobs: Vec<NamedJob> = jobs
            .into_iter()
            .map(|job| {
                let name = job.output().to_string();
                NamedJob {
                    name,
                    body: Box::new(move || {
                        let (result, read) = job.run_and_release();
                        (result.map_err(|e| e.to_string()), Some(read))
                    }),
                }
            })
            .collect();
        if let Some(first) = jobs.first_mut()
            && self.failpoints.output_panics(batch)
        {
            first.body = Box::new(move || panic!("failpoint panic-in-output fired in batch {batch}"));
        }
        lp.order.expect(batch, jobs.len());
        let outputs_started = Instant::now();
        lp.scheduler.submit(batch, jobs, &lp.report);
        lp.in_flight = Some(InFlight {
            batch,
            time,
            offsets,
            recovered,
            started,
            scheduling_delay_ms,
            phases,
            records,
            late,
            ahead,
            outputs_started,
        });
        Ok(())
    }

    /// Tells the web page's board that `batch` started and what its
    /// replayable inputs read.
    fn show_batch_started(&self, batch: BatchId, offsets: &OffsetSeq, scheduling_delay_ms: u64, recovered: bool) {
        let Some(board) = &self.board else { return };
        board.batch_started(batch, offsets.batch_timestamp, scheduling_delay_ms, recovered);
        let read: Vec<(String, &Value)> = self
            .graph
            .inputs()
            .into_iter()
            .filter(|input| input.replayable)
            .filter_map(|input| {
                let value = offsets.offset_of(&input.name).flatten()?;
                Some((input.name, value))
            })
            .collect();
        board.replayable_read(&read);
    }

    /// Decides what batch `batch` at `time` reads and describes it for the offsets log.
    fn plan(&mut self, batch: BatchId, time: Time) -> Result<OffsetSeq, RuntimeError> {
        let planning = |reason: String| RuntimeError::Planning { batch, reason };
        if let Some(tracker) = &self.tracker {
            tracker.allocate_blocks_to_batch(time).map_err(|e| match self.store.as_ref() {
                // A fenced event log means another writer took the checkpoint over.
                Some(store) => taken_over(store.dir(), &e).unwrap_or_else(|| planning(e.to_string())),
                None => planning(e.to_string()),
            })?;
        }
        let replayable: Vec<String> =
            self.graph.inputs().into_iter().filter(|i| i.replayable).map(|i| i.name).collect();
        // The rate is for the whole query: each rate-limited input gets its share.
        let shares = (replayable.len() + self.receivers.len()).max(1) as u64;
        let limit = self.rate.records_per_batch(self.interval()).map(|n| (n / shares).max(1));
        let batch_limits = self.settings.batch_limits(limit);
        let limits: BTreeMap<String, BatchLimits> =
            replayable.iter().map(|name| (name.clone(), batch_limits)).collect();
        let planned = self.graph.plan(time, &limits).map_err(|e| planning(e.to_string()))?;
        let mut sources = Vec::new();
        for input in self.graph.inputs() {
            let offset = if let Some(text) = planned.get(&input.name) {
                // Kept as JSON when it is JSON, so a person can read the file.
                Some(serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.clone())))
            } else {
                self.receiver_offsets(&input.name, time)
            };
            sources.push(SourceOffset::new(input.name, offset));
        }
        let mut conf = BTreeMap::new();
        conf.insert("spate.batchIntervalMs".to_string(), self.interval().as_millis().to_string());
        Ok(OffsetSeq { batch_timestamp: time, sources, conf, ..OffsetSeq::default() })
    }

    /// The offsets-log entry of a receiver input: the blocks the tracker
    /// allocated to `time` and the stream's running record count.
    fn receiver_offsets(&mut self, name: &str, time: Time) -> Option<Value> {
        let receiver = self.receivers.iter().find(|r| r.name() == name)?;
        let tracker = self.tracker.as_ref()?;
        let blocks = tracker.get_blocks_of_batch_and_stream(time, receiver.stream_id());
        let records: u64 = blocks.iter().filter_map(|b| b.info().num_records).sum();
        let through = self.records_through.entry(name.to_string()).or_insert(0);
        *through += records;
        Some(json!({
            "stream": receiver.stream_id().0,
            "blocks": blocks.len(),
            "records": records,
            "recordsThrough": *through,
        }))
    }

    /// Feeds the receiver inputs and computes the batch through the graph.
    /// Returns the batch's jobs (none when it is recomputed `for_state`
    /// alone), its records and the work done on them ahead.
    fn compute(
        &mut self,
        batch: BatchId,
        offsets: &OffsetSeq,
        for_state: bool,
    ) -> Result<(Vec<spate_dstream::Job>, Fed), RuntimeError> {
        let time = offsets.batch_timestamp;
        let mut total = Fed::default();
        if let Some(tracker) = &self.tracker {
            for receiver in &self.receivers {
                let blocks = tracker.get_blocks_of_batch_and_stream(time, receiver.stream_id());
                let fed = receiver.feed(time, &blocks)?;
                if let Some(board) = &self.board {
                    board.receiver_fed(receiver.stream_id().0, receiver.name(), fed.records);
                }
                total.records += fed.records;
                total.ahead += fed.ahead;
            }
        }
        let records = total.records.saturating_add(replayable_records(offsets, &self.graph));
        let planned = planned_offsets(offsets, &self.graph);
        let jobs = if for_state {
            self.graph.recompute_for_state(time, batch, &planned).map(|()| Vec::new())
        } else {
            self.graph.generate_jobs(time, batch, &planned)
        };
        let jobs = jobs.map_err(|e| RuntimeError::Planning { batch, reason: e.to_string() })?;
        Ok((jobs, Fed { records, ahead: total.ahead }))
    }

    /// Recomputes a committed batch without running its outputs, to bring
    /// operator state from its last snapshot up to the last commit.
    pub(crate) fn replay_for_state(&mut self, batch: BatchId, offsets: &OffsetSeq) -> Result<(), RuntimeError> {
        self.compute(batch, offsets, true)?;
        self.batch_times.insert(batch, offsets.batch_timestamp);
        self.last_time = Some(offsets.batch_timestamp);
        Ok(())
    }

    fn finish_batch(&mut self, lp: &mut Loop, batch: BatchId, status: &SharedStatus) -> Result<(), RuntimeError> {
        let Some(mut flight) = lp.in_flight.take().filter(|f| f.batch == batch) else {
            return Err(RuntimeError::Lifecycle { what: format!("committed batch {batch} that is not in flight") });
        };
        flight.phases.outputs_ms = elapsed_ms(flight.outputs_started);
        self.failpoints.reach(Point::OutputsDone, batch);
        let committing = Instant::now();
        if let Some(store) = &self.store {
            store.write_commit(batch)?;
        }
        flight.phases.commit_ms = elapsed_ms(committing);
        self.failpoints.reach(Point::Committed, batch);
        let checkpointing = Instant::now();
        let checkpointed = self.checkpoint_state_if_due(batch, flight.time, false)?;
        lp.last_commit = Some((batch, flight.time));
        flight.phases.state_checkpoint_ms = if checkpointed { elapsed_ms(checkpointing) } else { 0 };
        lp.committed += 1;
        self.after_commit(&flight);
        let reported = self.report_progress(&flight, checkpointed);
        // Last: whoever awaits the commit then finds the batch in the
        // metrics, the listeners and the status page too.
        status.update(|s| s.last_committed = Some(batch));
        reported
    }

    /// Snapshots every stateful operator when the batch time is a multiple
    /// of the checkpoint interval, or when `stopping`: whole, or what
    /// changed since the previous snapshot ([`SnapshotChain`] decides);
    /// state files first, then the manifest.
    fn checkpoint_state_if_due(&mut self, batch: BatchId, time: Time, stopping: bool) -> Result<bool, RuntimeError> {
        let due = stopping || time.is_multiple_of(self.settings.effective_checkpoint_interval());
        let Some(store) = &self.store else { return Ok(false) };
        if !due || !self.has_stateful_operators() {
            return Ok(false);
        }
        let base = self.chain.begin();
        // Each operator's name, and whether it wrote changes.
        let mut written = Vec::new();
        let mut bytes = 0u64;
        // Streamed: a state on disk need not fit in memory to be written,
        // nor a snapshot be held whole before its file.
        let mut write = |operator: &str, state: &mut StateWriter<'_>| {
            bytes += store.write_state_streamed(operator, batch, state, base)?;
            written.push((operator.to_string(), state.is_changes()));
            Ok::<_, RuntimeError>(())
        };
        match base {
            None => self.graph.snapshot_state_streamed(&mut write)?,
            Some(_) => self.graph.snapshot_state_changes_streamed(&mut write)?,
        }
        store.write_manifest(&GraphManifest {
            descriptor: self.graph.descriptor(),
            state_batch: Some(batch),
            state_batch_time: Some(time),
        })?;
        self.chain.completed(batch, &written);
        self.state_batch = Some((batch, time));
        self.last_state_bytes = bytes;
        self.last_state_incremental = written.iter().any(|(_, changes)| *changes);
        Ok(true)
    }

    /// Purges what no restart can need any more, tells replayable inputs
    /// their offsets committed, and updates backpressure.
    fn after_commit(&mut self, flight: &InFlight) {
        for hook in &self.hooks {
            if let (Some(on_commit), Some(Some(offsets))) = (&hook.on_commit, flight.offsets.offset_of(&hook.name)) {
                let text = offsets.as_str().map_or_else(|| offsets.to_string(), str::to_string);
                if let Err(e) = on_commit(&text) {
                    warn!(input = %hook.name, error = %e, "committing offsets to the source failed");
                }
            }
        }
        self.purge(flight.batch);
        let timing = BatchTiming {
            completed_at_ms: self.settings.clock.now().as_millis(),
            records: flight.records,
            // The work done as the records arrived counts too: without it a
            // batch whose records were processed ahead looks nearly free,
            // and the rate climbs until the memory budget holds the source.
            processing_ms: elapsed_ms(flight.started).saturating_add(flight.ahead.as_millis() as u64),
            scheduling_delay_ms: flight.scheduling_delay_ms,
        };
        if let Some(rate) = self.rate.on_batch_completed(timing) {
            let share = self.rate_share(rate);
            for receiver in &self.receivers {
                receiver.set_rate_limit(Some(share));
            }
        }
    }

    /// Each rate-limited input's share of the query's rate, records per second.
    pub(crate) fn rate_share(&self, rate: f64) -> u64 {
        let replayable = self.graph.inputs().iter().filter(|i| i.replayable).count();
        let shares = (replayable + self.receivers.len()).max(1) as f64;
        (rate / shares).max(1.0) as u64
    }

    /// The first batch a restart may need: the one after the last state
    /// snapshot when there is state, else the one after the last commit.
    fn first_needed_batch(&self, committed: BatchId) -> BatchId {
        // The largest id has no successor: then nothing after it is needed either.
        let after = |batch: BatchId| batch.next().unwrap_or(batch);
        match (self.has_stateful_operators(), self.state_batch) {
            (true, Some((snapshot, _))) => after(snapshot).min(after(committed)),
            (true, None) => BatchId(0),
            (false, _) => after(committed),
        }
    }

    fn purge(&mut self, committed: BatchId) {
        let needed = self.first_needed_batch(committed);
        let retained = BatchId(committed.0.saturating_add(1).saturating_sub(self.settings.retained_batches.max(1)));
        let threshold = needed.min(retained);
        if let Some(store) = &self.store {
            store.purge_logs(threshold);
            if let Some((snapshot, _)) = self.state_batch {
                store.purge_state(snapshot, self.chain.starts());
            }
        }
        // Input data: the blocks of batches before the first needed one.
        let now = self.settings.clock.now();
        if let Some(&needed_time) = self.batch_times.get(&needed) {
            let previous_time = needed_time - self.interval();
            if let Some(tracker) = &self.tracker
                && let Err(e) = tracker.cleanup_old_batches(needed_time.min(now), false)
            {
                warn!(error = %e, "cleaning up the block tracker failed; retried after the next batch");
            }
            // Every block stored before the previous batch's time was allocated to it or earlier.
            for receiver in &self.receivers {
                receiver.clean_old_blocks(previous_time.min(now));
            }
        }
        self.batch_times = self.batch_times.split_off(&threshold.min(needed));
    }

    /// Reports a committed batch. Progress is advisory, so a failed write
    /// is only a warning, except that the checkpoint was taken over by
    /// another writer: then this one stops.
    fn report_progress(&mut self, flight: &InFlight, checkpointed: bool) -> Result<(), RuntimeError> {
        let processing_ms = elapsed_ms(flight.started);
        let interval_secs = self.interval().as_secs_f64();
        let progress = BatchProgress {
            batch_id: flight.batch,
            batch_time: flight.time,
            recovered: flight.recovered,
            input_records: flight.records,
            late_records: flight.late,
            input_rate: if interval_secs > 0.0 { flight.records as f64 / interval_secs } else { 0.0 },
            processing_rate: flight.records as f64 * 1000.0 / processing_ms.max(1) as f64,
            scheduling_delay_ms: flight.scheduling_delay_ms,
            processing_time_ms: processing_ms,
            phases: flight.phases.clone(),
            state_bytes: self.last_state_bytes,
            state_checkpointed: checkpointed,
            state_incremental: checkpointed && self.last_state_incremental,
            rate_limit: self.rate.current(),
            receivers: self.receivers.iter().map(|r| r.status()).collect(),
        };
        info!(
            batch = %progress.batch_id,
            time = %progress.batch_time,
            records = progress.input_records,
            processing_ms = progress.processing_time_ms,
            scheduling_delay_ms = progress.scheduling_delay_ms,
            "batch committed"
        );
        telemetry::record_batch(&progress, &self.settings.metric_labels);
        telemetry::record_memory(&self.memory, &self.spill);
        let mut taken_over = None;
        if let Some(files) = &mut self.progress_files {
            match files.append(&progress) {
                Ok(()) => {}
                Err(e @ RuntimeError::TakenOver { .. }) => taken_over = Some(e),
                Err(e) => warn!(error = %e, "writing the progress file failed"),
            }
        }
        for listener in &self.listeners {
            listener.on_batch_completed(&progress);
        }
        taken_over.map_or(Ok(()), Err)
    }
}

/// The planned offsets the graph needs: the logged ones of its replayable inputs.
fn planned_offsets(offsets: &OffsetSeq, graph: &Graph) -> PlannedOffsets {
    graph
        .inputs()
        .into_iter()
        .filter(|input| input.replayable)
        .filter_map(|input| {
            let value = offsets.offset_of(&input.name).flatten()?;
            let text = value.as_str().map_or_else(|| value.to_string(), str::to_string);
            Some((input.name, text))
        })
        .collect()
}

/// Records a replayable input's offsets cover, when they are in the usual
/// shape of offset ranges (`{"from":…, "until":…}` objects anywhere inside,
/// as Kafka's `{"topic":{"0":{"from":3,"until":9}}}`).
fn replayable_records(offsets: &OffsetSeq, graph: &Graph) -> u64 {
    graph
        .inputs()
        .into_iter()
        .filter(|input| input.replayable)
        .filter_map(|input| offsets.offset_of(&input.name).flatten().map(range_records))
        .fold(0, u64::saturating_add)
}

/// Records in the offset ranges of one source's `offsets/N` entry, for the
/// progress report. The numbers come from a file, so the count saturates
/// instead of overflowing (a damaged range is the source's to refuse).
fn range_records(value: &Value) -> u64 {
    match value {
        Value::Object(map) => match (map.get("from").and_then(Value::as_u64), map.get("until").and_then(Value::as_u64))
        {
            (Some(from), Some(until)) => until.saturating_sub(from),
            _ => map.values().map(range_records).fold(0, u64::saturating_add),
        },
        Value::Array(items) => items.iter().map(range_records).fold(0, u64::saturating_add),
        _ => 0,
    }
}

/// Milliseconds since `since`, wall clock.
pub(crate) fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Sends a tick for every batch time on the clock, starting at `first`,
/// until `stop` is set or the driver is gone. It wakes at least every
/// 100 ms of clock time to notice a stop.
pub(crate) fn run_timer(
    clock: Arc<dyn Clock>,
    interval: Duration,
    first: Time,
    events: Sender<Event>,
    stop: Arc<AtomicBool>,
) {
    let mut next = first;
    while !stop.load(Ordering::Acquire) {
        let now = clock.now();
        if now >= next {
            if events.send(Event::Tick(next)).is_err() {
                return;
            }
            next = next + interval;
            continue;
        }
        let wake = (now + Duration::from_millis(100)).min(next);
        clock.sleep_until(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_ranges_count_their_records() {
        let kafka = json!({"events": {"0": {"from": 3, "until": 9}, "1": {"from": 10, "until": 10}}, "other": {"2": {"from": 0, "until": 5}}});
        assert_eq!(range_records(&kafka), 11);
        assert_eq!(range_records(&json!([{"from": 1, "until": 4}, {"from": 9, "until": 2}])), 3);
        assert_eq!(range_records(&json!({"position": 42})), 0);
        // Ranges from a damaged or crafted file: the count saturates, never overflows.
        let huge = json!({"a": {"0": {"from": 0, "until": u64::MAX}, "1": {"from": 0, "until": u64::MAX}}});
        assert_eq!(range_records(&huge), u64::MAX);
        assert_eq!(range_records(&json!([{"from": 0, "until": u64::MAX}, {"from": 0, "until": 1}])), u64::MAX);
    }
}
