//! [`StreamingContext`]: builds the pipeline from the code that runs now,
//! recovers it from a checkpoint directory, runs it, and stops it.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver as EventReceiver, Sender, unbounded};
use metrics_exporter_prometheus::PrometheusHandle;
use spate_core::{BatchId, MemoryBudget, StreamId, Time};
use spate_dstream::{DStream, Data, FedSource, GraphBuilder, InputSource, RestorePolicy};
use spate_logstore::{Checkpoint, CheckpointOptions, OffsetSeq, Verdict};
use spate_receiver::{Receiver, Record};
use spate_tracker::{ReceivedBlockTracker, event_log_dir};
use spate_wal::{FileWriteAheadLog, WalOptions};
use tracing::{info, warn};

use crate::driver::{Engine, Event, InputHooks, QueuedBatch, SharedStatus, StopMode, StopReport, run_timer};
use crate::error::RuntimeError;
use crate::failpoints::Failpoints;
use crate::http::{HttpServer, Routes};
use crate::inputs::{CheckpointHome, ReceiverInput, ReceiverOptions, ReceiverResume, SpillPlace, TypedReceiverInput};
use crate::progress::{PROGRESS_DIR, ProgressFiles, ProgressListener};
use crate::rate_controller::RateController;
use crate::recovery::{RecoveryReport, RestoredOperator};
use crate::settings::StreamingSettings;
use crate::status::{CheckpointRow, StatusBoard};
use crate::store::{CheckpointStore, GraphManifest, log_store_error};
use crate::telemetry;

/// Missed batch times run after a restart at most; older ones are skipped
/// (their input is read by the first batch that runs).
const MAX_PENDING_BATCHES: u64 = 1000;

/// A hook called with an input's offsets (the JSON its source planned).
pub type OffsetsHook = Box<dyn Fn(&str) -> Result<(), String> + Send>;

/// What the code declares a pipeline with: the dstream [`GraphBuilder`] plus
/// the inputs the runtime drives (receivers, replayable sources with hooks).
pub struct PipelineBuilder {
    graph: GraphBuilder,
    receivers: Vec<Box<dyn ReceiverInput>>,
    hooks: Vec<InputHooks>,
}

impl fmt::Debug for PipelineBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineBuilder").field("receivers", &self.receivers.len()).finish_non_exhaustive()
    }
}

impl PipelineBuilder {
    /// The graph being built, for anything the runtime does not wrap.
    pub fn graph(&self) -> &GraphBuilder {
        &self.graph
    }

    /// An input read from `source` (replayable sources plan offsets that are
    /// logged before each batch and handed back on a re-run).
    pub fn input<T: Data, S: InputSource<T> + 'static>(&self, name: &str, source: Arc<S>) -> DStream<T> {
        self.graph.input(name, source)
    }

    /// A replayable input with hooks: `on_resume` gets the last logged
    /// offsets when the context resumes from a checkpoint (so the source
    /// continues after them), `on_commit` gets each batch's offsets once the
    /// batch committed (to commit them to the source).
    pub fn replayable_input<T: Data, S: InputSource<T> + 'static>(
        &mut self,
        name: &str,
        source: Arc<S>,
        on_resume: Option<OffsetsHook>,
        on_commit: Option<OffsetsHook>,
    ) -> DStream<T> {
        self.hooks.push(InputHooks { name: name.to_string(), on_resume, on_commit });
        self.graph.input(name, source)
    }

    /// An input fed by a receiver: `make_receiver` is called once when the
    /// context starts, with where the stream resumes after a restart.
    pub fn receiver_stream<T, R, F>(&mut self, name: &str, options: ReceiverOptions, make_receiver: F) -> DStream<T>
    where
        T: Record + Data,
        R: Receiver<T>,
        F: FnOnce(ReceiverResume) -> R + Send + 'static,
    {
        let source = Arc::new(FedSource::new());
        let stream_id = StreamId(u32::try_from(self.receivers.len()).unwrap_or(u32::MAX));
        let input = TypedReceiverInput::new(name, stream_id, options, Arc::clone(&source), Box::new(make_receiver));
        self.receivers.push(Box::new(input));
        self.graph.input(name, source)
    }
}

/// Stops a running context from any thread (a signal handler, a test).
/// Cloning shares it.
#[derive(Clone)]
pub struct StopHandle {
    events: Sender<Event>,
    requests: Arc<AtomicUsize>,
}

impl fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopHandle").field("requests", &self.requests.load(Ordering::Relaxed)).finish()
    }
}

impl StopHandle {
    /// Stops receiving, processes what was received and the queued batches,
    /// commits, and releases the checkpoint. Calling it again changes
    /// nothing: several parts of a program (a timer, a batch limit, a
    /// signal) may each ask for a graceful stop without turning it into an
    /// immediate one; only [`StopHandle::stop_now`] does that.
    pub fn stop_gracefully(&self) {
        self.requests.fetch_add(1, Ordering::AcqRel);
        // The driver may have ended already; then there is nothing to stop.
        let _ = self.events.send(Event::Stop(StopMode::Graceful));
    }

    /// Stops at once: no queued output starts, the running ones are waited
    /// for, the batch in flight is not committed and is re-run, with its
    /// logged offsets, on the next start.
    pub fn stop_now(&self) {
        self.requests.fetch_add(1, Ordering::AcqRel);
        let _ = self.events.send(Event::Stop(StopMode::Now));
    }

    /// Stops on SIGINT and SIGTERM: the first signal stops gracefully, the
    /// second at once. Listens on a thread of its own.
    pub fn stop_on_signals(&self) -> Result<(), RuntimeError> {
        let handle = self.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RuntimeError::Lifecycle { what: format!("could not start the signal listener: {e}") })?;
        std::thread::Builder::new()
            .name("spate-signals".into())
            .spawn(move || runtime.block_on(handle.listen_for_signals()))
            .map_err(|e| RuntimeError::Lifecycle { what: format!("could not start the signal listener: {e}") })?;
        Ok(())
    }

    async fn listen_for_signals(self) {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
        else {
            warn!("could not listen for SIGINT/SIGTERM");
            return;
        };
        // Only signals count here: a graceful stop asked for by other code
        // does not make the first signal the second.
        let mut first = true;
        loop {
            tokio::select! {
                _ = interrupt.recv() => info!("SIGINT received"),
                _ = terminate.recv() => info!("SIGTERM received"),
            }
            if std::mem::take(&mut first) {
                self.stop_gracefully();
            } else {
                self.stop_now();
            }
        }
    }
}

/// A streaming query: built with [`StreamingContext::new`] (no checkpoint)
/// or [`StreamingContext::get_or_create`], then [`StreamingContext::start`]ed
/// and awaited with [`StreamingContext::await_termination`].
pub struct StreamingContext {
    engine: Option<Engine>,
    recovery: Option<RecoveryReport>,
    resume: BTreeMap<String, ReceiverResume>,
    first_tick: Time,
    events_tx: Sender<Event>,
    events_rx: EventReceiver<Event>,
    status: Arc<SharedStatus>,
    driver: Option<JoinHandle<Result<StopReport, RuntimeError>>>,
    timer_stop: Arc<AtomicBool>,
    stop_requests: Arc<AtomicUsize>,
    checkpoint_dir: Option<PathBuf>,
    /// The process's Prometheus recorder, when metrics or the page are served.
    exporter: Option<PrometheusHandle>,
    /// The servers of `/metrics` and of the page, once started.
    servers: Vec<HttpServer>,
    metrics_addr: Option<SocketAddr>,
    ui_addr: Option<SocketAddr>,
}

impl fmt::Debug for StreamingContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamingContext")
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("started", &self.engine.is_none())
            .finish_non_exhaustive()
    }
}

type BuildResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

impl StreamingContext {
    /// A context without a checkpoint directory: nothing survives a restart,
    /// and stateful operators are refused.
    pub fn new<F>(settings: StreamingSettings, build: F) -> Result<Self, RuntimeError>
    where
        F: FnOnce(&mut PipelineBuilder) -> BuildResult,
    {
        settings.validate()?;
        let exporter = exporter_for(&settings)?;
        let (graph, receivers, hooks) = build_pipeline(&settings, false, build)?;
        let clock = Arc::clone(&settings.clock);
        let tracker = (!receivers.is_empty()).then(|| Arc::new(ReceivedBlockTracker::in_memory(Arc::clone(&clock))));
        let mut engine = new_engine(settings, graph, None, tracker, receivers, hooks)?;
        let spill_base = engine.settings.spill_base();
        let spill = SpillPlace { base: &spill_base, budget: &engine.spill };
        for receiver in &mut engine.receivers {
            receiver.open(None, &clock, &engine.memory, spill)?;
        }
        let first_tick = clock.now().floor(engine.settings.batch_interval) + engine.settings.batch_interval;
        Ok(Self::from_engine(engine, None, BTreeMap::new(), first_tick, None, exporter))
    }

    /// Builds the pipeline from `build` (the code running now) and, when
    /// `checkpoint_dir` holds a checkpoint, recovers into it: takes the
    /// writer lock, refuses an inconsistent directory (the error names the
    /// repair command), restores operator state by name, replays the block
    /// tracker, rebuilds state past the last snapshot, and queues the
    /// uncommitted batch (with exactly its logged offsets) and the batches
    /// missed while down before live batches. [`StreamingContext::recovery`]
    /// says what it did.
    pub fn get_or_create<F>(
        checkpoint_dir: impl AsRef<Path>,
        settings: StreamingSettings,
        build: F,
    ) -> Result<Self, RuntimeError>
    where
        F: FnOnce(&mut PipelineBuilder) -> BuildResult,
    {
        settings.validate()?;
        // Before any log opens: they register their metrics when they open.
        let exporter = exporter_for(&settings)?;
        let dir = checkpoint_dir.as_ref().to_path_buf();
        let mut options = CheckpointOptions::new()
            .clock(Arc::clone(&settings.clock))
            .retain_batches(settings.retained_batches)
            .object_store(settings.object_store.clone());
        if let Some(lease) = settings.lease.clone() {
            options = options.lease(lease);
        }
        let checkpoint = Checkpoint::open_for_write(&dir, options).map_err(|e| log_store_error(&dir, e))?;
        let store = CheckpointStore::new(checkpoint);
        let fence = store.fence();
        let verdict = store.consistent_verdict()?;
        let (graph, receivers, hooks) = build_pipeline(&settings, true, build)?;
        let clock = Arc::clone(&settings.clock);
        let wal_root = wal_root(&settings, store.checkpoint(), !receivers.is_empty())?;
        let (tracker, unrecoverable) = if receivers.is_empty() {
            (None, Vec::new())
        } else {
            let log_dir = event_log_dir(&wal_root);
            let options = WalOptions::default().with_clock(Arc::clone(&clock)).with_fence(Arc::clone(&fence));
            let wal = FileWriteAheadLog::open(&log_dir, options)
                .map_err(|e| RuntimeError::Checkpoint { dir: dir.clone(), message: e.to_string() })?;
            let (tracker, report) = ReceivedBlockTracker::recover(Arc::new(wal), log_dir, Arc::clone(&clock))
                .map_err(|e| RuntimeError::Checkpoint { dir: dir.clone(), message: e.to_string() })?;
            let lost = report.unrecoverable.iter().map(|b| b.block_id.to_string()).collect();
            (Some(Arc::new(tracker)), lost)
        };
        let mut engine = new_engine(settings, graph, Some(store), tracker, receivers, hooks)?;
        let spill_base = engine.settings.spill_base();
        let spill = SpillPlace { base: &spill_base, budget: &engine.spill };
        for receiver in &mut engine.receivers {
            let home = CheckpointHome { dir: &wal_root, fence: &fence };
            receiver.open(Some(home), &clock, &engine.memory, spill)?;
        }
        let (report, resume, first_tick) = recover(&mut engine, verdict, unrecoverable)?;
        info!(%report, "checkpoint opened");
        Ok(Self::from_engine(engine, Some(report), resume, first_tick, Some(dir), exporter))
    }

    fn from_engine(
        engine: Engine,
        recovery: Option<RecoveryReport>,
        resume: BTreeMap<String, ReceiverResume>,
        first_tick: Time,
        checkpoint_dir: Option<PathBuf>,
        exporter: Option<PrometheusHandle>,
    ) -> Self {
        let (events_tx, events_rx) = unbounded();
        StreamingContext {
            engine: Some(engine),
            recovery,
            resume,
            first_tick,
            events_tx,
            events_rx,
            status: Arc::new(SharedStatus::default()),
            driver: None,
            timer_stop: Arc::new(AtomicBool::new(false)),
            stop_requests: Arc::new(AtomicUsize::new(0)),
            checkpoint_dir,
            exporter,
            servers: Vec::new(),
            metrics_addr: None,
            ui_addr: None,
        }
    }

    /// Where `/metrics` is served, once started (with the port chosen for port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where the web page is served, once started (with the port chosen for port 0).
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        self.ui_addr
    }

    /// Binds and starts the servers of `/metrics` and of the page; one
    /// server when both have the same address.
    fn start_servers(&mut self, engine: &Engine) -> Result<(), RuntimeError> {
        let (metrics, ui) = (engine.settings.metrics_addr, engine.settings.ui_addr);
        let metrics_routes = || Routes { metrics: self.exporter.clone(), ui: None };
        let ui_routes =
            |board: &Arc<StatusBoard>| Routes { metrics: None, ui: Some((Arc::clone(board), self.exporter.clone())) };
        let mut planned: Vec<(SocketAddr, Routes, bool, bool)> = Vec::new();
        match (metrics, ui, &engine.board) {
            (Some(m), Some(u), Some(board)) if m == u => {
                planned.push((m, Routes { metrics: self.exporter.clone(), ..ui_routes(board) }, true, true));
            }
            (m, u, board) => {
                if let Some(m) = m {
                    planned.push((m, metrics_routes(), true, false));
                }
                if let (Some(u), Some(board)) = (u, board) {
                    planned.push((u, ui_routes(board), false, true));
                }
            }
        }
        for (addr, routes, serves_metrics, serves_ui) in planned {
            let server = HttpServer::start(addr, routes)?;
            let bound = server.addr();
            if serves_metrics {
                info!(url = %format!("http://{bound}/metrics"), "serving metrics");
                self.metrics_addr = Some(bound);
            }
            if serves_ui {
                info!(url = %format!("http://{bound}/"), "serving the web page");
                self.ui_addr = Some(bound);
            }
            self.servers.push(server);
        }
        Ok(())
    }

    /// What recovery did (`None` without a checkpoint directory). For a new
    /// checkpoint it says the query starts at batch 0.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }

    /// The checkpoint directory, if any.
    pub fn checkpoint_dir(&self) -> Option<&Path> {
        self.checkpoint_dir.as_deref()
    }

    /// Adds a listener for progress reports (before [`StreamingContext::start`]).
    pub fn add_progress_listener(&mut self, listener: Arc<dyn ProgressListener>) {
        if let Some(engine) = &mut self.engine {
            engine.listeners.push(listener);
        }
    }

    /// A handle that stops the context; take it before or after starting.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle { events: self.events_tx.clone(), requests: Arc::clone(&self.stop_requests) }
    }

    /// Starts the receivers, the batch timer and the driver.
    pub fn start(&mut self) -> Result<(), RuntimeError> {
        let Some(mut engine) = self.engine.take() else {
            return Err(RuntimeError::Lifecycle { what: "already started".into() });
        };
        if let Err(e) = self.start_servers(&engine) {
            // Not started: the context can be dropped as it was.
            self.servers.clear();
            self.engine = Some(engine);
            return Err(e);
        }
        if let Some(board) = &engine.board {
            engine.listeners.push(Arc::clone(board) as Arc<dyn ProgressListener>);
        }
        if let Some(report) = &self.recovery {
            telemetry::record_recovery(report);
            for listener in &engine.listeners {
                listener.on_recovery(report);
            }
        }
        if let Some(tracker) = engine.tracker.clone() {
            let clock = Arc::clone(&engine.settings.clock);
            let initial_rate = engine.rate.current().map(|r| engine.rate_share(r));
            for receiver in &mut engine.receivers {
                let resume = self.resume.get(receiver.name()).copied().unwrap_or_default();
                receiver.start(Arc::clone(&tracker), resume, Arc::clone(&clock))?;
                receiver.set_rate_limit(initial_rate);
            }
        }
        let (clock, interval) = (Arc::clone(&engine.settings.clock), engine.settings.batch_interval);
        let first_tick = engine.last_time.map_or(self.first_tick, |last| self.first_tick.max(last + interval));
        let (tx, stop) = (self.events_tx.clone(), Arc::clone(&self.timer_stop));
        std::thread::Builder::new()
            .name("spate-timer".into())
            .spawn(move || run_timer(clock, interval, first_tick, tx, stop))
            .map_err(|e| RuntimeError::Lifecycle { what: format!("could not start the batch timer: {e}") })?;
        let (rx, tx, status) = (self.events_rx.clone(), self.events_tx.clone(), Arc::clone(&self.status));
        let driver = std::thread::Builder::new()
            .name("spate-driver".into())
            .spawn(move || engine.run(&rx, &tx, &status))
            .map_err(|e| RuntimeError::Lifecycle { what: format!("could not start the driver: {e}") })?;
        self.driver = Some(driver);
        Ok(())
    }

    /// The last committed batch of this run (or of the checkpoint before it).
    pub fn last_committed(&self) -> Option<BatchId> {
        self.status.last_committed().or_else(|| self.recovery.as_ref().and_then(|r| r.last_committed))
    }

    /// Waits (real time, up to `timeout`) until `batch` committed. False on
    /// timeout or when the context stopped before.
    pub fn await_committed(&self, batch: BatchId, timeout: std::time::Duration) -> bool {
        self.status.wait_committed(batch, timeout)
    }

    /// Why the context failed, if it did (while or after running).
    pub fn failure(&self) -> Option<String> {
        self.status.failure()
    }

    /// Waits until the context stops (a stop handle, or a failure) and
    /// returns how it ended. The writer lock is released when it returns.
    pub fn await_termination(mut self) -> Result<StopReport, RuntimeError> {
        let result = match self.driver.take() {
            Some(driver) => {
                driver.join().unwrap_or_else(|_| Err(RuntimeError::Lifecycle { what: "driver thread panicked".into() }))
            }
            None => Err(RuntimeError::Lifecycle { what: "awaited before it was started".into() }),
        };
        self.timer_stop.store(true, Ordering::Release);
        result
    }
}

impl Drop for StreamingContext {
    fn drop(&mut self) {
        self.timer_stop.store(true, Ordering::Release);
        if let Some(driver) = self.driver.take() {
            let _ = self.events_tx.send(Event::Stop(StopMode::Now));
            let _ = driver.join();
        }
        if let Some(mut engine) = self.engine.take() {
            engine.memory.stop_waiting();
            engine.spill.stop_waiting();
            for receiver in &mut engine.receivers {
                let _ = receiver.stop();
            }
        }
    }
}

/// The process's Prometheus recorder when `settings` serve metrics or the page.
fn exporter_for(settings: &StreamingSettings) -> Result<Option<PrometheusHandle>, RuntimeError> {
    if settings.metrics_addr.is_none() && settings.ui_addr.is_none() {
        return Ok(None);
    }
    telemetry::exporter().map(Some)
}

type Built = (spate_dstream::Graph, Vec<Box<dyn ReceiverInput>>, Vec<InputHooks>);

fn build_pipeline<F>(settings: &StreamingSettings, checkpointing: bool, build: F) -> Result<Built, RuntimeError>
where
    F: FnOnce(&mut PipelineBuilder) -> BuildResult,
{
    let graph = GraphBuilder::new(settings.batch_interval).checkpointing(checkpointing);
    let mut builder = PipelineBuilder { graph, receivers: Vec::new(), hooks: Vec::new() };
    build(&mut builder).map_err(|e| RuntimeError::InvalidGraph { reason: e.to_string() })?;
    let PipelineBuilder { graph, receivers, hooks } = builder;
    let graph = graph.build().map_err(|e| RuntimeError::InvalidGraph { reason: e.to_string() })?;
    Ok((graph, receivers, hooks))
}

/// Where the receiver write-ahead logs and the tracker's event log live:
/// the WAL directory when one is set (tied to this checkpoint by its id),
/// else the checkpoint directory. An object store cannot hold them (they
/// are appended to many times a second), so a pipeline with receivers on
/// an `s3://` checkpoint must name a local WAL directory.
fn wal_root(
    settings: &StreamingSettings,
    checkpoint: &Checkpoint,
    has_receivers: bool,
) -> Result<PathBuf, RuntimeError> {
    let Some(wal_dir) = &settings.wal_dir else {
        if checkpoint.is_object_store() && has_receivers {
            return Err(RuntimeError::InvalidSetting {
                setting: "wal_dir".into(),
                reason: format!(
                    "the checkpoint {} is in an object store, which cannot hold the receivers' write-ahead logs; \
                     name a local directory for them (--wal-dir)",
                    checkpoint.dir().display()
                ),
            });
        }
        return Ok(checkpoint.dir().to_path_buf());
    };
    if let Some(metadata) = checkpoint.metadata() {
        bind_wal_dir(wal_dir, &metadata.id)?;
    }
    Ok(wal_dir.clone())
}

/// The file in a WAL directory naming the checkpoint its logs belong to.
const WAL_DIR_CHECKPOINT_FILE: &str = "CHECKPOINT_ID";

/// Ties `wal_dir` to the checkpoint `id`: the logs of one checkpoint must
/// never be replayed into another.
fn bind_wal_dir(wal_dir: &Path, id: &str) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(spate_logstore::DIR_MODE)
        .create(wal_dir)
        .map_err(|e| RuntimeError::io("create", wal_dir, e))?;
    let path = wal_dir.join(WAL_DIR_CHECKPOINT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(found) if found.trim() == id => Ok(()),
        Ok(found) => Err(RuntimeError::InvalidSetting {
            setting: "wal_dir".into(),
            reason: format!(
                "{} holds the write-ahead logs of another checkpoint (id {}, this one is {id}); \
                 give each checkpoint its own WAL directory",
                wal_dir.display(),
                found.trim()
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(spate_logstore::FILE_MODE)
                .open(&path)
                .map_err(|e| RuntimeError::io("create", &path, e))?;
            std::io::Write::write_all(&mut file, format!("{id}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| RuntimeError::io("write", &path, e))
        }
        Err(e) => Err(RuntimeError::io("read", &path, e)),
    }
}

fn new_engine(
    settings: StreamingSettings,
    graph: spate_dstream::Graph,
    store: Option<CheckpointStore>,
    tracker: Option<Arc<ReceivedBlockTracker>>,
    receivers: Vec<Box<dyn ReceiverInput>>,
    hooks: Vec<InputHooks>,
) -> Result<Engine, RuntimeError> {
    let rate = RateController::new(settings.batch_interval, &settings.backpressure)?;
    let (max_memory, max_spill) = (settings.max_memory_bytes, settings.spill_limit());
    let progress_files = match &store {
        Some(store) => {
            let files = Arc::clone(store.checkpoint().files());
            Some(ProgressFiles::open(
                files,
                &store.dir().join(PROGRESS_DIR),
                settings.progress_rotation,
                store.fence(),
            )?)
        }
        None => None,
    };
    let board = settings.ui_addr.map(|_| Arc::new(StatusBoard::new(settings.batch_interval.as_millis())));
    if let (Some(board), Some(store)) = (&board, &store) {
        let checkpoint = store.checkpoint();
        board.set_checkpoint(CheckpointRow {
            location: store.dir().display().to_string(),
            lock_holder: checkpoint.writer().cloned(),
            epoch: checkpoint.epoch(),
        });
    }
    Ok(Engine {
        settings,
        graph,
        store,
        tracker,
        receivers,
        hooks,
        listeners: Vec::new(),
        progress_files,
        rate,
        queue: VecDeque::new(),
        next_batch: BatchId(0),
        last_time: None,
        records_through: BTreeMap::new(),
        state_batch: None,
        batch_times: BTreeMap::new(),
        last_state_bytes: 0,
        failpoints: Failpoints::from_env()?,
        board,
        memory: Arc::new(MemoryBudget::new(max_memory)),
        spill: Arc::new(MemoryBudget::new(max_spill)),
    })
}

/// The last logged batch, its offsets, and the last committed batch, from the verdict.
struct Logged {
    last: Option<(BatchId, OffsetSeq)>,
    committed: Option<BatchId>,
    rerun: bool,
}

fn logged_of(verdict: Verdict) -> Logged {
    match verdict {
        Verdict::Resume { next, last_offsets, .. } => {
            let last = next.prev();
            Logged { last: last.map(|b| (b, last_offsets)), committed: last, rerun: false }
        }
        Verdict::Rerun { batch, offsets, .. } => {
            Logged { last: Some((batch, offsets)), committed: batch.prev(), rerun: true }
        }
        _ => Logged { last: None, committed: None, rerun: false },
    }
}

/// The batch after `batch`, an id read from the checkpoint, which may be the
/// largest there is.
fn successor(dir: &Path, batch: BatchId) -> Result<BatchId, RuntimeError> {
    batch.next().ok_or_else(|| RuntimeError::Checkpoint {
        dir: dir.to_path_buf(),
        message: format!("batch {batch} is the largest batch id; no batch can follow it"),
    })
}

/// Recovers `engine` from its checkpoint: state, replay, queue, resume positions.
fn recover(
    engine: &mut Engine,
    verdict: Verdict,
    unrecoverable_blocks: Vec<String>,
) -> Result<(RecoveryReport, BTreeMap<String, ReceiverResume>, Time), RuntimeError> {
    let Some(store) = &engine.store else {
        return Err(RuntimeError::Lifecycle { what: "recovery without a checkpoint".into() });
    };
    let dir = store.dir().to_path_buf();
    let writer_epoch = store.checkpoint().epoch().unwrap_or(0);
    let logged = logged_of(verdict);
    let resumed_at = match &logged.last {
        Some((batch, _)) => successor(&dir, *batch)?,
        None => BatchId(0),
    };
    let manifest = store.read_manifest()?;
    let mut report = RecoveryReport {
        checkpoint_dir: dir.clone(),
        writer_epoch,
        took_over_from: None,
        last_committed: logged.committed,
        rerun_batch: logged.rerun.then(|| logged.last.as_ref().map(|(b, _)| *b)).flatten(),
        pending_batch_times: Vec::new(),
        resumed_at,
        restored_operators: Vec::new(),
        new_operators: Vec::new(),
        dropped_operators: Vec::new(),
        replayed_for_state: Vec::new(),
        unrecoverable_blocks,
    };
    refuse_state_past_commit(&dir, manifest.as_ref(), logged.committed)?;
    restore_state(engine, manifest.as_ref(), &mut report)?;
    replay_committed(engine, logged.committed, &mut report)?;
    let resume = resume_positions(engine, logged.last.as_ref());
    if let Some((batch, offsets)) = &logged.last {
        call_resume_hooks(engine, offsets);
        engine.next_batch = resumed_at;
        if logged.rerun {
            engine.queue.push_back(QueuedBatch::Rerun { batch: *batch, offsets: offsets.clone() });
        }
        engine.last_time = Some(engine.last_time.map_or(offsets.batch_timestamp, |t| t.max(offsets.batch_timestamp)));
    }
    let first_tick = queue_pending(engine, &mut report);
    if manifest.is_none()
        && let Some(store) = &engine.store
    {
        let descriptor = engine.graph.descriptor();
        store.write_manifest(&GraphManifest { descriptor, state_batch: None, state_batch_time: None })?;
    }
    Ok((report, resume, first_tick))
}

/// A state snapshot is taken after its batch's commit, so one newer than the
/// last commit means `commits/` lost an entry (removed by hand): restoring it
/// and re-running the batch would count the batch twice.
fn refuse_state_past_commit(
    dir: &std::path::Path,
    manifest: Option<&GraphManifest>,
    committed: Option<BatchId>,
) -> Result<(), RuntimeError> {
    let Some(state) = manifest.and_then(|m| m.state_batch) else { return Ok(()) };
    if committed.is_some_and(|c| state <= c) {
        return Ok(());
    }
    let last = committed.map_or_else(|| "none".to_string(), |c| c.to_string());
    Err(RuntimeError::Checkpoint {
        dir: dir.to_path_buf(),
        message: format!(
            "the operator state is a snapshot of batch {state}, but the last commit is {last}: commits/{state} \
             is missing although the batch committed; put it back, or remove the state snapshot from `graph`"
        ),
    })
}

/// Restores operator state from the snapshot the manifest names.
fn restore_state(
    engine: &mut Engine,
    manifest: Option<&GraphManifest>,
    report: &mut RecoveryReport,
) -> Result<(), RuntimeError> {
    let (Some(manifest), Some(store)) = (manifest, &engine.store) else { return Ok(()) };
    let (Some(batch), Some(time)) = (manifest.state_batch, manifest.state_batch_time) else { return Ok(()) };
    let mut states = Vec::new();
    for op in manifest.descriptor.operators.iter().filter(|op| op.stateful) {
        states.push((op.name.clone(), store.read_state(&op.name, batch)?));
    }
    let restored = engine
        .graph
        .restore(&manifest.descriptor, states, &RestorePolicy::strict())
        .map_err(|e| RuntimeError::IncompatibleGraph { dir: store.dir().to_path_buf(), reason: e.to_string() })?;
    report.restored_operators =
        restored.resumed.into_iter().map(|name| RestoredOperator { name, snapshot_batch: batch }).collect();
    report.new_operators = restored.started_empty;
    report.dropped_operators = restored.dropped;
    engine.state_batch = Some((batch, time));
    engine.last_time = Some(time);
    engine.batch_times.insert(batch, time);
    Ok(())
}

/// Recomputes the committed batches after the state snapshot, outputs off.
fn replay_committed(
    engine: &mut Engine,
    committed: Option<BatchId>,
    report: &mut RecoveryReport,
) -> Result<(), RuntimeError> {
    let Some(committed) = committed else { return Ok(()) };
    if !engine.graph.descriptor().operators.iter().any(|op| op.stateful) {
        return Ok(());
    }
    let first = match (engine.state_batch, &engine.store) {
        (Some((batch, _)), Some(store)) => successor(store.dir(), batch)?,
        _ => BatchId(0),
    };
    for n in first.0..=committed.0 {
        let batch = BatchId(n);
        let Some(store) = &engine.store else { break };
        let offsets = store.read_offsets(batch)?;
        engine.replay_for_state(batch, &offsets)?;
        report.replayed_for_state.push(batch);
    }
    Ok(())
}

/// Where each receiver stream resumes: its records in logged batches plus
/// those the tracker holds beyond them.
fn resume_positions(engine: &mut Engine, last: Option<&(BatchId, OffsetSeq)>) -> BTreeMap<String, ReceiverResume> {
    let mut resume = BTreeMap::new();
    let Some(tracker) = &engine.tracker else { return resume };
    let state = tracker.state();
    let last_time = last.map(|(_, offsets)| offsets.batch_timestamp);
    for receiver in &engine.receivers {
        let name = receiver.name().to_string();
        let logged = last
            .and_then(|(_, offsets)| offsets.offset_of(&name).flatten())
            .and_then(|v| v.get("recordsThrough"))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let stream = receiver.stream_id();
        let unallocated: u64 = state.unallocated_blocks(stream).filter_map(|b| b.info().num_records).sum();
        let allocated_later: u64 = state
            .allocated_batches()
            .filter(|(time, _)| last_time.is_none_or(|last| *time > last))
            .flat_map(|(_, streams)| streams.get(&stream).into_iter().flatten())
            .filter_map(|b| b.info().num_records)
            .sum();
        engine.records_through.insert(name.clone(), logged);
        resume.insert(name, ReceiverResume { records_stored: logged + unallocated + allocated_later });
    }
    resume
}

fn call_resume_hooks(engine: &Engine, offsets: &OffsetSeq) {
    for hook in &engine.hooks {
        if let (Some(on_resume), Some(Some(value))) = (&hook.on_resume, offsets.offset_of(&hook.name)) {
            let text = value.as_str().map_or_else(|| value.to_string(), str::to_string);
            if let Err(e) = on_resume(&text) {
                warn!(input = %hook.name, error = %e, "resuming the source from the logged offsets failed");
            }
        }
    }
}

/// Queues the batches a restart owes: one for an allocation the tracker
/// logged after the last logged batch, then every batch time missed while
/// down. Returns the first live tick.
fn queue_pending(engine: &mut Engine, report: &mut RecoveryReport) -> Time {
    let interval = engine.settings.batch_interval;
    let now_floor = engine.settings.clock.now().floor(interval);
    let Some(mut last) = engine.last_time else { return now_floor + interval };
    if let Some(orphan) = engine.tracker.as_ref().and_then(|t| t.last_allocated_batch_time()).filter(|t| *t > last) {
        engine.queue.push_back(QueuedBatch::New(orphan));
        report.pending_batch_times.push(orphan);
        last = orphan;
    }
    let missed = now_floor.since(last).div_duration(interval);
    if missed > MAX_PENDING_BATCHES {
        warn!(missed, "more batches missed while down than are re-run; the oldest are folded into the first");
        last = now_floor - interval.times(MAX_PENDING_BATCHES);
    }
    let mut time = last + interval;
    while time <= now_floor {
        engine.queue.push_back(QueuedBatch::New(time));
        report.pending_batch_times.push(time);
        time = time + interval;
    }
    engine.last_time = Some(last.max(now_floor));
    now_floor.max(last) + interval
}
