//! The [`Receiver`] trait and the [`ReceiverSupervisor`] that runs one:
//! it hands the receiver a [`ReceiverContext`] to store data through,
//! restarts it with a backoff after an error, and stops it cleanly (Spark's
//! `Receiver`, `ReceiverSupervisor` and `ReceiverSupervisorImpl`).
//!
//! Each receiver runs on its own thread with its own single-threaded tokio
//! runtime. The context's store methods may block that thread (rate limit,
//! a full block queue, a WAL write): that holds back this receiver only,
//! which is the point of backpressure.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use async_trait::async_trait;
use spate_core::sync::lock;
use spate_core::{Clock, Duration, InPlace, ReceivedBlockInfo, StreamId, Time};
use tracing::{error, info, warn};

use crate::block::ReceivedBlock;
use crate::block_generator::{
    BlockGenerator, BlockGeneratorListener, BlockGeneratorSettings, BlockIdAllocator, BlockWriter,
};
use crate::codec::Record;
use crate::error::{BoxError, ReceiverError};
use crate::handler::{Pending, ReceivedBlockHandler};
use crate::signal::StopSignal;
use crate::storage::StorageLevel;

/// A source of records that runs under a [`ReceiverSupervisor`].
///
/// `run` receives until the source ends (return `Ok`), fails (return an
/// error: the supervisor restarts it after a backoff) or the supervisor
/// stops or restarts it (the `run` future is then dropped at its next
/// `.await`, so a receiver needs no stop checks of its own around awaits).
/// The same receiver value is run again on a restart, so it can keep its
/// position in the source across restarts.
#[async_trait]
pub trait Receiver<T: Record>: Send + 'static {
    /// A name for logs and errors.
    fn name(&self) -> String;

    /// The level the runtime should store this receiver's blocks at.
    fn storage_level(&self) -> StorageLevel {
        StorageLevel::default()
    }

    /// Receives records and stores them through `ctx`.
    async fn run(&mut self, ctx: ReceiverContext<T>) -> Result<(), ReceiverError>;

    /// Called after each run ends, however it ended, before its tasks are joined.
    async fn on_stop(&mut self) {}
}

/// Where the supervisor sends the description of every stored block: the
/// runtime connects it to the `ReceivedBlockTracker`. An error fails the
/// store (the block is not acknowledged).
pub trait BlockInfoSink: Send + Sync {
    /// Takes the block's description.
    fn add_block(&self, info: ReceivedBlockInfo) -> Result<(), BoxError>;
}

impl BlockInfoSink for crossbeam::channel::Sender<ReceivedBlockInfo> {
    fn add_block(&self, info: ReceivedBlockInfo) -> Result<(), BoxError> {
        self.send(info).map_err(|e| Box::new(e) as BoxError)
    }
}

impl BlockInfoSink for std::sync::mpsc::Sender<ReceivedBlockInfo> {
    fn add_block(&self, info: ReceivedBlockInfo) -> Result<(), BoxError> {
        self.send(info).map_err(|e| Box::new(e) as BoxError)
    }
}

/// A [`BlockInfoSink`] from a function.
pub struct FnSink<F>(pub F);

impl<F: Fn(ReceivedBlockInfo) -> Result<(), BoxError> + Send + Sync> BlockInfoSink for FnSink<F> {
    fn add_block(&self, info: ReceivedBlockInfo) -> Result<(), BoxError> {
        (self.0)(info)
    }
}

/// How a [`ReceiverSupervisor`] runs its receiver.
#[derive(Clone, Debug)]
pub struct SupervisorSettings {
    /// The input stream the receiver feeds.
    pub stream_id: StreamId,
    /// Blocks: interval, queue, maximum rate.
    pub block_generator: BlockGeneratorSettings,
    /// The wait before the first restart after a failure (Spark's
    /// `receiverRestartDelay`, 2 s); it doubles with each failure in a row.
    pub restart_delay: Duration,
    /// The longest wait between restarts; a run that lasted this long
    /// resets the backoff.
    pub max_restart_delay: Duration,
}

impl SupervisorSettings {
    /// Defaults for `stream_id`.
    pub fn new(stream_id: StreamId) -> Self {
        SupervisorSettings {
            stream_id,
            block_generator: BlockGeneratorSettings::default(),
            restart_delay: Duration::from_secs(2),
            max_restart_delay: Duration::from_secs(60),
        }
    }
}

/// What the receiver is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiverState {
    /// A run is in progress.
    Running,
    /// The last run failed; the next starts at `until` on the clock.
    BackingOff {
        /// When the restart is due.
        until: Time,
    },
    /// The receiver returned `Ok`: its source ended. Blocks already cut are
    /// still pushed until the supervisor stops.
    Finished,
    /// The supervisor was stopped.
    Stopped,
}

#[derive(Debug)]
struct Status {
    state: ReceiverState,
    starts: u64,
    errors: Vec<String>,
}

/// Stores blocks through the handler and reports them to the sink.
struct BlockPusher<T> {
    stream_id: StreamId,
    handler: Arc<dyn ReceivedBlockHandler<T>>,
    sink: Arc<dyn BlockInfoSink>,
    supervisor: Arc<SupervisorState>,
}

impl<T: Record> BlockPusher<T> {
    fn push(
        &self,
        block_id: spate_core::StreamBlockId,
        block: ReceivedBlock<T>,
        metadata: Option<Vec<u8>>,
    ) -> Result<ReceivedBlockInfo, ReceiverError> {
        let store_result = self.handler.store_block(block_id, block)?;
        report(self.sink.as_ref(), self.stream_id, store_result, metadata)
    }
}

/// Describes a stored block to the sink.
fn report(
    sink: &dyn BlockInfoSink,
    stream_id: StreamId,
    store_result: spate_core::BlockStoreResult,
    metadata: Option<Vec<u8>>,
) -> Result<ReceivedBlockInfo, ReceiverError> {
    let block_id = store_result.block_id;
    let info = ReceivedBlockInfo { stream_id, num_records: store_result.num_records, metadata, store_result };
    sink.add_block(info.clone()).map_err(|source| ReceiverError::ReportFailed { stream_id, block_id, source })?;
    Ok(info)
}

impl<T: Record> BlockGeneratorListener<T> for BlockPusher<T> {
    fn on_push_block(&self, block_id: spate_core::StreamBlockId, records: Vec<T>) -> Result<(), ReceiverError> {
        self.push(block_id, ReceivedBlock::Records(records), None).map(drop)
    }

    fn start_push(&self, block_id: spate_core::StreamBlockId, records: Vec<T>) -> Pending<()> {
        self.start_push_reusing(block_id, records).0
    }

    fn start_push_reusing(
        &self,
        block_id: spate_core::StreamBlockId,
        records: Vec<T>,
    ) -> (Pending<()>, Option<Vec<T>>) {
        let (pending, spent) = self.handler.start_store_records(block_id, records);
        let (sink, stream_id) = (Arc::clone(&self.sink), self.stream_id);
        (pending.then(move |stored| report(sink.as_ref(), stream_id, stored?, None).map(drop)), spent)
    }

    fn start_push_serialized(&self, block_id: spate_core::StreamBlockId, bytes: Vec<u8>) -> Pending<()> {
        let pending = self.handler.start_store(block_id, ReceivedBlock::Serialized(bytes));
        let (sink, stream_id) = (Arc::clone(&self.sink), self.stream_id);
        pending.then(move |stored| report(sink.as_ref(), stream_id, stored?, None).map(drop))
    }

    /// The handler keeps blocks serialized (the write-ahead log on, or a
    /// serialized level): records are encoded as they are stored.
    fn stores_serialized(&self) -> bool {
        !self.handler.storage_level().deserialized()
    }

    fn on_error(&self, error: ReceiverError) {
        self.supervisor.record_error(format!("pushing a block: {error}"));
    }
}

/// The part of the supervisor every thread sees.
#[derive(Debug)]
struct SupervisorState {
    stream_id: StreamId,
    status: Mutex<Status>,
    status_changed: Condvar,
    stop: StopSignal,
}

impl SupervisorState {
    fn lock(&self) -> MutexGuard<'_, Status> {
        lock(&self.status)
    }

    fn set_state(&self, state: ReceiverState) {
        self.lock().state = state;
        self.status_changed.notify_all();
    }

    fn record_error(&self, message: String) {
        error!(stream = %self.stream_id, %message, "receiver error");
        self.lock().errors.push(message);
        self.status_changed.notify_all();
    }
}

/// One run's cancellation and restart request.
#[derive(Debug, Default)]
struct RunState {
    cancel: StopSignal,
    restart_reason: Mutex<Option<String>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

struct ContextShared<T> {
    stream_id: StreamId,
    /// The run in progress, so that a stop can cancel it.
    current_run: Mutex<Option<Arc<RunState>>>,
    generator: BlockGenerator<T>,
    pusher: BlockPusher<T>,
    ids: Arc<BlockIdAllocator>,
    clock: Arc<dyn Clock>,
    supervisor: Arc<SupervisorState>,
}

/// What a running receiver stores through, reports to and watches.
/// Cloning is cheap; clones belong to the same run.
pub struct ReceiverContext<T> {
    shared: Arc<ContextShared<T>>,
    run: Arc<RunState>,
    runtime: tokio::runtime::Handle,
}

impl<T> Clone for ReceiverContext<T> {
    fn clone(&self) -> Self {
        ReceiverContext { shared: Arc::clone(&self.shared), run: Arc::clone(&self.run), runtime: self.runtime.clone() }
    }
}

impl<T: Record> ReceiverContext<T> {
    /// The stream this receiver feeds.
    pub fn stream_id(&self) -> StreamId {
        self.shared.stream_id
    }

    /// The clock of the supervisor.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.shared.clock)
    }

    /// Adds one record to the current block (rate-limited). Not durable
    /// when it returns: see [`ReceiverContext::flush`].
    pub fn store(&self, record: T) -> Result<(), ReceiverError> {
        self.shared.generator.add_record(record)
    }

    /// Adds a batch of records to the current block at once (rate-limited):
    /// the fast path. Not durable when it returns: see [`ReceiverContext::flush`].
    pub fn store_many(&self, records: Vec<T>) -> Result<(), ReceiverError> {
        self.shared.generator.add_records(records)
    }

    /// Adds `count` records that `fill(block, n)` appends straight into the
    /// current block (rate-limited), with no batch to build and copy: the
    /// fastest path, for sources that produce records cheaply. `fill` runs
    /// with the block locked, once per slice of the rate limit, and must
    /// append exactly the `n` records it is asked for each time. Not
    /// durable when it returns: see [`ReceiverContext::flush`].
    pub fn store_with(&self, count: usize, fill: impl FnMut(&mut Vec<T>, usize)) -> Result<(), ReceiverError> {
        self.shared.generator.add_with(count, fill)
    }

    /// Adds `count` records that `fill(block, n)` writes in place, as views
    /// ([`BlockWriter::push`]: a `&str` for a `String` record), straight
    /// into the current block's serialized form (rate-limited): no record
    /// is made and none is encoded later. As with
    /// [`ReceiverContext::store_with`], `fill` runs with the block locked,
    /// once per slice, and must push exactly the `n` records it is asked
    /// for. Not durable when it returns: see [`ReceiverContext::flush`].
    pub fn store_in_place_with(
        &self,
        count: usize,
        fill: impl FnMut(&mut BlockWriter<'_, T>, usize),
    ) -> Result<(), ReceiverError>
    where
        T: InPlace,
    {
        self.shared.generator.add_in_place_with(count, fill)
    }

    /// Cuts the current block and waits until every record stored so far
    /// through `store`/`store_many`/`store_with`/`store_in_place_with` is stored (durably, with the WAL on).
    /// Acknowledge the source after this returns.
    pub fn flush(&self) -> Result<(), ReceiverError> {
        self.shared.generator.flush()
    }

    /// Stores `records` as one block now, bypassing the block generator, and
    /// returns its description once it is stored (durably, with the WAL on)
    /// and reported. Acknowledge the source after this returns.
    pub fn store_block(&self, records: Vec<T>, metadata: Option<Vec<u8>>) -> Result<ReceivedBlockInfo, ReceiverError> {
        let block_id = self.shared.ids.next(self.shared.clock.now());
        self.shared.pusher.push(block_id, ReceivedBlock::Records(records), metadata)
    }

    /// Stores a block already serialized with [`crate::encode_block`], as
    /// [`ReceiverContext::store_block`] does.
    pub fn store_serialized(
        &self,
        bytes: Vec<u8>,
        metadata: Option<Vec<u8>>,
    ) -> Result<ReceivedBlockInfo, ReceiverError> {
        let block_id = self.shared.ids.next(self.shared.clock.now());
        self.shared.pusher.push(block_id, ReceivedBlock::Serialized(bytes), metadata)
    }

    /// Reports an error without stopping (it is logged and kept in
    /// [`ReceiverSupervisor::errors`]).
    pub fn report_error(&self, message: impl Into<String>) {
        self.shared.supervisor.record_error(message.into());
    }

    /// Asks the supervisor to restart the receiver after the backoff; the
    /// current run is cancelled at its next `.await`.
    pub fn restart(&self, reason: impl Into<String>) {
        let reason = reason.into();
        warn!(stream = %self.shared.stream_id, %reason, "receiver asked to be restarted");
        *lock(&self.run.restart_reason) = Some(reason);
        self.run.cancel.stop();
    }

    /// True once this run is being stopped or restarted.
    pub fn is_stopped(&self) -> bool {
        self.run.cancel.is_stopped() || self.shared.supervisor.stop.is_stopped()
    }

    /// Blocks until the clock reaches `deadline` (true) or the run is
    /// stopped or restarted (false): pacing that a stop interrupts.
    pub fn wait_until(&self, deadline: Time) -> bool {
        self.run.cancel.wait_until(self.shared.clock.as_ref(), deadline)
    }

    /// Resolves when this run is being stopped or restarted.
    pub async fn stopped(&self) {
        tokio::select! {
            () = self.run.cancel.stopped() => {}
            () = self.shared.supervisor.stop.stopped() => {}
        }
    }

    /// Spawns a task of this run; the supervisor joins it when the run ends.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.runtime.spawn(task);
        lock(&self.run.tasks).push(handle);
    }

    /// The current rate limit of stored records, per second.
    pub fn rate_limit(&self) -> Option<u64> {
        self.shared.generator.rate_limiter().limit()
    }
}

/// Runs one [`Receiver`]: see the module documentation.
pub struct ReceiverSupervisor<T> {
    shared: Arc<ContextShared<T>>,
    handler: Arc<dyn ReceivedBlockHandler<T>>,
    receiver_thread: Mutex<Option<JoinHandle<()>>>,
}

impl<T> std::fmt::Debug for ReceiverSupervisor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverSupervisor").field("stream_id", &self.shared.stream_id).finish_non_exhaustive()
    }
}

/// How a run ended.
enum RunOutcome {
    Returned(Result<(), ReceiverError>),
    Cancelled,
}

impl<T: Record> ReceiverSupervisor<T> {
    /// Starts `receiver`: its block generator, then a thread that runs it.
    /// Blocks are stored through `handler` and described to `sink`.
    pub fn start(
        receiver: impl Receiver<T>,
        config: SupervisorSettings,
        handler: Arc<dyn ReceivedBlockHandler<T>>,
        sink: Arc<dyn BlockInfoSink>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ReceiverError> {
        let stream_id = config.stream_id;
        let supervisor = Arc::new(SupervisorState {
            stream_id,
            status: Mutex::new(Status { state: ReceiverState::Running, starts: 0, errors: Vec::new() }),
            status_changed: Condvar::new(),
            stop: StopSignal::default(),
        });
        let ids = Arc::new(BlockIdAllocator::new(stream_id));
        let make_pusher = || BlockPusher {
            stream_id,
            handler: Arc::clone(&handler),
            sink: Arc::clone(&sink),
            supervisor: Arc::clone(&supervisor),
        };
        let generator = BlockGenerator::start_with_ids(
            stream_id,
            config.block_generator.clone(),
            Arc::clone(&clock),
            Arc::new(make_pusher()),
            Arc::clone(&ids),
        )?;
        let shared = Arc::new(ContextShared {
            stream_id,
            current_run: Mutex::new(None),
            generator,
            pusher: make_pusher(),
            ids,
            clock,
            supervisor,
        });
        let name = receiver.name();
        let runner = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("receiver-{stream_id}"))
            .spawn(move || runner.supervise(receiver, &config))
            .map_err(|e| ReceiverError::Runtime { what: format!("receiver {name}"), reason: e.to_string() })?;
        info!(stream = %stream_id, receiver = %name, "receiver started");
        Ok(ReceiverSupervisor { shared, handler, receiver_thread: Mutex::new(Some(thread)) })
    }

    /// The stream the receiver feeds.
    pub fn stream_id(&self) -> StreamId {
        self.shared.stream_id
    }

    /// What the receiver is doing now.
    pub fn state(&self) -> ReceiverState {
        self.shared.supervisor.lock().state
    }

    /// How many runs have started (1 + restarts).
    pub fn starts(&self) -> u64 {
        self.shared.supervisor.lock().starts
    }

    /// Every error reported so far, oldest first.
    pub fn errors(&self) -> Vec<String> {
        self.shared.supervisor.lock().errors.clone()
    }

    /// Waits (up to `timeout`, real time) until `pred` holds for the state
    /// and returns it, or `None` on timeout.
    pub fn wait_for_state(
        &self,
        pred: impl Fn(ReceiverState) -> bool,
        timeout: std::time::Duration,
    ) -> Option<ReceiverState> {
        let status = self.shared.supervisor.lock();
        let (status, _) = self
            .shared
            .supervisor
            .status_changed
            .wait_timeout_while(status, timeout, |s| !pred(s.state))
            .unwrap_or_else(PoisonError::into_inner);
        pred(status.state).then_some(status.state)
    }

    /// Sets the rate limit of stored records (backpressure); capped by the
    /// configured maximum rate. `None` lifts it back to that maximum.
    pub fn set_rate_limit(&self, records_per_sec: Option<u64>) {
        self.shared.generator.rate_limiter().update_limit(records_per_sec);
    }

    /// The current rate limit, records per second.
    pub fn rate_limit(&self) -> Option<u64> {
        self.shared.generator.rate_limiter().limit()
    }

    /// Stops the receiver and joins its run and tasks, then cuts and pushes
    /// the last block, joins the block generator and closes the handler.
    pub fn stop(&self) -> Result<(), ReceiverError> {
        self.shared.supervisor.stop.stop();
        self.shared.cancel_current_run();
        self.shared.generator.interrupt_adders();
        let thread = lock(&self.receiver_thread).take();
        let joined = match thread.map(JoinHandle::join) {
            Some(Err(_)) => Err(ReceiverError::Runtime {
                what: format!("receiver thread of stream {}", self.shared.stream_id),
                reason: "panicked".into(),
            }),
            _ => Ok(()),
        };
        let generator = self.shared.generator.stop();
        let closed = self.handler.close();
        self.shared.supervisor.set_state(ReceiverState::Stopped);
        info!(stream = %self.shared.stream_id, "receiver stopped");
        joined.and(generator).and(closed)
    }
}

impl<T> Drop for ReceiverSupervisor<T> {
    fn drop(&mut self) {
        // Without an explicit stop, end the run; its thread then ends too.
        self.shared.supervisor.stop.stop();
        self.shared.cancel_current_run();
    }
}

impl<T> ContextShared<T> {
    fn cancel_current_run(&self) {
        if let Some(run) = lock(&self.current_run).as_ref() {
            run.cancel.stop();
        }
    }
}

impl<T: Record> ContextShared<T> {
    /// The receiver thread: run, and restart with backoff, until stopped.
    fn supervise(self: Arc<Self>, mut receiver: impl Receiver<T>, config: &SupervisorSettings) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                self.supervisor.record_error(format!("could not build the receiver's runtime: {e}"));
                return;
            }
        };
        let mut failures_in_a_row = 0u32;
        while !self.supervisor.stop.is_stopped() {
            self.supervisor.lock().starts += 1;
            self.supervisor.set_state(ReceiverState::Running);
            let started_at = self.clock.now();
            let run = Arc::new(RunState::default());
            *lock(&self.current_run) = Some(Arc::clone(&run));
            if self.supervisor.stop.is_stopped() {
                break;
            }
            let ctx =
                ReceiverContext { shared: Arc::clone(&self), run: Arc::clone(&run), runtime: runtime.handle().clone() };
            let outcome = runtime.block_on(self.run_once(&mut receiver, ctx, &run));
            let restart_reason = lock(&run.restart_reason).take();
            if self.supervisor.stop.is_stopped() {
                break;
            }
            match (outcome, restart_reason) {
                (_, Some(reason)) => self.supervisor.record_error(format!("restart requested: {reason}")),
                (RunOutcome::Returned(Err(e)), None) => self.supervisor.record_error(e.to_string()),
                (RunOutcome::Returned(Ok(())), None) | (RunOutcome::Cancelled, None) => {
                    info!(stream = %self.stream_id, "receiver finished");
                    self.supervisor.set_state(ReceiverState::Finished);
                    return;
                }
            }
            if self.clock.now().since(started_at) >= config.max_restart_delay {
                failures_in_a_row = 0;
            }
            let delay = config.restart_delay.times(1u64 << failures_in_a_row.min(30)).min(config.max_restart_delay);
            failures_in_a_row += 1;
            let until = self.clock.now() + delay;
            self.supervisor.set_state(ReceiverState::BackingOff { until });
            warn!(stream = %self.stream_id, delay = %delay, "restarting the receiver after a backoff");
            if !self.supervisor.stop.wait_until(self.clock.as_ref(), until) {
                break;
            }
            self.generator.clear_failure();
        }
    }

    async fn run_once(&self, receiver: &mut impl Receiver<T>, ctx: ReceiverContext<T>, run: &RunState) -> RunOutcome {
        let outcome = tokio::select! {
            result = receiver.run(ctx) => RunOutcome::Returned(result),
            () = run.cancel.stopped() => RunOutcome::Cancelled,
            () = self.supervisor.stop.stopped() => RunOutcome::Cancelled,
        };
        run.cancel.stop();
        receiver.on_stop().await;
        let tasks = std::mem::take(&mut *lock(&run.tasks));
        // The run is over: a task still waiting is cancelled at its await,
        // as the run itself was, and then joined.
        for task in tasks {
            task.abort();
            if let Err(e) = task.await
                && e.is_panic()
            {
                self.supervisor.record_error(format!("a receiver task panicked: {e}"));
            }
        }
        outcome
    }
}
