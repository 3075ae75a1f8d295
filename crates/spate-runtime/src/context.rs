//! [`StreamingContext`]: builds the pipeline from the code that runs now,
//! recovers it from a checkpoint directory (the procedure itself is in the
//! `recovery` module), runs it, and stops it.

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
use spate_dstream::{DStream, Data, FedSource, GraphBuilder, InputSource};
use spate_logstore::{Checkpoint, CheckpointSettings};
use spate_receiver::{Receiver, Record};
use spate_tracker::ReceivedBlockTracker;
use tracing::{info, warn};

use crate::checkpoint_store::{CheckpointStore, SnapshotChain, log_store_error};
use crate::driver::{Engine, Event, InputHooks, SharedStatus, StopMode, StopReport, run_timer};
use crate::error::RuntimeError;
use crate::failpoints::Failpoints;
use crate::http::{HttpServer, Routes};
use crate::inputs::{CheckpointHome, ReceiverInput, ReceiverResume, ReceiverSettings, SpillPlace, TypedReceiverInput};
use crate::progress::{PROGRESS_DIR, ProgressFiles, ProgressListener};
use crate::rate_controller::RateController;
use crate::recovery::{RecoveryReport, recover, recover_tracker};
use crate::settings::StreamingSettings;
use crate::status::{CheckpointRow, StatusBoard};
use crate::telemetry;

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
    pub fn receiver_stream<T, R, F>(&mut self, name: &str, options: ReceiverSettings, make_receiver: F) -> DStream<T>
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

    /// A context of `settings`: on the checkpoint they name
    /// ([`StreamingSettings::checkpoint`], see
    /// [`StreamingContext::get_or_create`]), or without one
    /// ([`StreamingContext::new`]).
    pub fn from_settings<F>(settings: StreamingSettings, build: F) -> Result<Self, RuntimeError>
    where
        F: FnOnce(&mut PipelineBuilder) -> BuildResult,
    {
        match settings.checkpoint.clone() {
            Some(location) => Self::get_or_create(location, settings, build),
            None => Self::new(settings, build),
        }
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
        let mut options = CheckpointSettings::new()
            .with_clock(Arc::clone(&settings.clock))
            .with_retained_batches(settings.retained_batches)
            .with_object_store(settings.object_store.clone());
        if let Some(lease) = settings.lease.clone() {
            options = options.with_lease(lease);
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
            let (tracker, lost) = recover_tracker(&dir, &wal_root, &clock, &fence)?;
            (Some(tracker), lost)
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
        let metrics_routes = || Routes { metrics: self.exporter.clone(), ui: None, process: None };
        let ui_routes = |board: &Arc<StatusBoard>| Routes {
            metrics: None,
            ui: Some((Arc::clone(board), self.exporter.clone())),
            process: None,
        };
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

    /// Waits (real time, up to `timeout`) until `batch` committed and was
    /// reported (metrics, progress listeners, the status page). False on
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
    // Only the disk store's spill changes the graph here.
    #[cfg_attr(not(feature = "disk-store"), allow(unused_mut))] mut graph: spate_dstream::Graph,
    store: Option<CheckpointStore>,
    tracker: Option<Arc<ReceivedBlockTracker>>,
    receivers: Vec<Box<dyn ReceiverInput>>,
    hooks: Vec<InputHooks>,
) -> Result<Engine, RuntimeError> {
    // The sources learn the interval and the budget here, not from a configuration of their own.
    let context = spate_dstream::SourceContext::new(settings.batch_interval, settings.max_memory_bytes);
    graph
        .register_sources(&context)
        .map_err(|e| RuntimeError::InvalidSetting { setting: "input".to_string(), reason: e.to_string() })?;
    // Before any restore: a restored state beyond the budget goes to disk as it is read.
    #[cfg(feature = "disk-store")]
    graph.spill_state(&spate_dstream::StateSpill::new(
        Arc::new(crate::state_spill::RocksStateStore::new(&settings.spill_base())),
        settings.max_memory_bytes / crate::state_spill::STATE_SHARE_OF_MEMORY,
    ));
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
    let chain = SnapshotChain::new(settings.full_snapshot_every);
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
        last_state_incremental: false,
        chain,
        failpoints: Failpoints::from_env()?,
        board,
        memory: Arc::new(MemoryBudget::new(max_memory)),
        spill: Arc::new(MemoryBudget::new(max_spill)),
    })
}
