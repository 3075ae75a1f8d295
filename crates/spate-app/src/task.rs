//! One task: a stage's pipeline on one partition, in a streaming context
//! of its own with its own checkpoint (`<location>/tasks/<topic>-<partition>`),
//! kept running by a supervisor thread while the member owns the partition.
//!
//! Every batch of a task ends with one transaction of the member's
//! producer: the records the stage emitted and the batch's offsets, under
//! the member's current group metadata; only then is `commits/N` written.
//! So a member the group dropped cannot commit a batch, and a task's new
//! owner resumes from its checkpoint with exactly the logged offsets. The
//! checkpoint's writer lock (a lease in an object store) keeps two owners
//! from writing it at once: a new owner waits for the old one's lock.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration as StdDuration;

use spate_core::Time;
use spate_core::sync::lock;
use spate_dstream::{ArrivalStage, BatchLimits, BoxError, InputSource, SourceContext};
use spate_kafka::{DirectKafkaSettings, DirectKafkaStream, KafkaRecord, OffsetCommit, OffsetRanges, TopicPartition};
use spate_runtime::{
    BatchProgress, OffsetsHook, PipelineBuilder, ProgressListener, RuntimeError, StopHandle, StreamingContext,
};
use tracing::{debug, info, warn};

use crate::error::AppError;
use crate::internal::progress_marks;
use crate::member::{MemberEvent, MemberShared};
use crate::memory::{BatchSize, TaskMemory};
use crate::topology::{Emit, InternalTopic, Stage, TaskBuilder, TaskId};

/// The offsets key of a task's input in `offsets/N`.
pub(crate) const INPUT: &str = "kafka";

/// How long a task waits before opening its checkpoint again after it
/// failed, or while another member still holds it.
const RETRY: StdDuration = StdDuration::from_millis(250);

/// The direct stream of one partition, remembering the offsets of each
/// batch time so the batch's transaction commits exactly them, on a re-run
/// too (the runtime hands the logged offsets to `compute`).
struct OnePartition {
    stream: Arc<DirectKafkaStream>,
    planned: Mutex<BTreeMap<Time, String>>,
    /// The task's claim on the member's memory budget.
    memory: TaskMemory,
}

impl InputSource<KafkaRecord> for OnePartition {
    fn is_replayable(&self) -> bool {
        true
    }

    fn register(&self, context: &SourceContext) -> Result<(), BoxError> {
        Ok(self.stream.register(context)?)
    }

    /// Plans within the task's share of the member's budget as well as
    /// the context's limits.
    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let share = self.memory.batch_records();
        let max_records = Some(limits.max_records.map_or(share, |records| records.min(share)));
        self.stream.plan(time, BatchLimits::new(max_records, limits.max_bytes))
    }

    fn compute(&self, time: Time, planned: Option<&str>) -> Result<Vec<Vec<KafkaRecord>>, BoxError> {
        if let Some(planned) = planned {
            let mut by_time = lock(&self.planned);
            by_time.insert(time, planned.to_string());
            // Batches before the last few are done; keep the map small.
            while by_time.len() > 64 {
                by_time.pop_first();
            }
        }
        self.stream.compute(time, planned)
    }

    fn set_arrival_stage(&self, stage: ArrivalStage<KafkaRecord>) -> bool {
        self.stream.set_arrival_stage(stage)
    }
}

impl OnePartition {
    fn offsets_of(&self, time: Time) -> Result<OffsetRanges, BoxError> {
        let by_time = lock(&self.planned);
        let json = by_time.get(&time).ok_or_else(|| format!("no planned offsets for batch time {time}"))?;
        Ok(OffsetRanges::from_json(json)?)
    }
}

/// How a task is asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopKind {
    /// The partition is revoked: finish the batch in flight and commit it.
    Graceful,
    /// The partition is lost (another member may own it): stop at once.
    Now,
}

/// What the member and a task's supervisor share.
#[derive(Default)]
struct Control {
    state: Mutex<ControlState>,
    changed: Condvar,
}

#[derive(Default)]
struct ControlState {
    stop: Option<StopKind>,
    handle: Option<StopHandle>,
}

impl Control {
    fn lock(&self) -> std::sync::MutexGuard<'_, ControlState> {
        lock(&self.state)
    }

    fn stopping(&self) -> bool {
        self.lock().stop.is_some()
    }

    /// Waits `timeout` or until a stop is asked; true when it was.
    fn wait_for_stop(&self, timeout: StdDuration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| s.stop.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        state.stop.is_some()
    }
}

/// A running task, as the member holds it.
pub(crate) struct RunningTask {
    pub(crate) id: TaskId,
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

impl RunningTask {
    /// Starts the supervisor of `id`.
    pub(crate) fn start(id: TaskId, stage: Stage, shared: Arc<MemberShared>) -> Result<Self, AppError> {
        let control = Arc::new(Control::default());
        let supervisor = Supervisor { id: id.clone(), stage, shared, control: Arc::clone(&control) };
        let thread = std::thread::Builder::new()
            .name(format!("task-{}", id.partition))
            .spawn(move || supervisor.run())
            .map_err(|e| AppError::Invalid { app: String::new(), reason: format!("cannot start task {id}: {e}") })?;
        Ok(RunningTask { id, control, thread: Some(thread) })
    }

    /// Asks the task to stop; [`RunningTask::join`] waits for it.
    pub(crate) fn request_stop(&self, kind: StopKind) {
        let mut state = self.control.lock();
        state.stop.get_or_insert(kind);
        if let Some(handle) = &state.handle {
            match kind {
                StopKind::Graceful => handle.stop_gracefully(),
                StopKind::Now => handle.stop_now(),
            }
        }
        self.control.changed.notify_all();
    }

    /// Waits until the task has stopped and released its checkpoint.
    pub(crate) fn join(mut self) {
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            warn!(task = %self.id, "the task's supervisor panicked");
        }
    }
}

/// Keeps one task's streaming context running until it is asked to stop.
struct Supervisor {
    id: TaskId,
    stage: Stage,
    shared: Arc<MemberShared>,
    control: Arc<Control>,
}

impl Supervisor {
    fn run(self) {
        let mut waited_for_lock = false;
        // The stream of an attempt that found the checkpoint held, kept for
        // the next: waiting for a lock opens no Kafka client for each look.
        let mut idle_stream = None;
        while !self.control.stopping() {
            match self.open(&mut idle_stream) {
                Ok(ctx) => {
                    waited_for_lock = false;
                    self.run_context(ctx);
                }
                Err(AppError::Task { source, .. }) if matches!(*source, RuntimeError::Locked { .. }) => {
                    let holder = match *source {
                        RuntimeError::Locked { holder, .. } => holder,
                        _ => None,
                    };
                    if !waited_for_lock {
                        info!(task = %self.id, holder = ?holder, "waiting for the task's previous owner to let its checkpoint go");
                        waited_for_lock = true;
                    }
                    debug!(task = %self.id, "the task's checkpoint is still held; trying again");
                    self.control.wait_for_stop(RETRY);
                }
                Err(error) if error.is_lasting() => {
                    // The same code declares the same pipeline again: say it
                    // once and stop, rather than fail every second.
                    tracing::error!(task = %self.id, %error, "the task's pipeline is refused; the task stops");
                    self.shared.fail(&self.id, &error);
                    break;
                }
                Err(error) => {
                    warn!(task = %self.id, %error, "the task could not start; trying again");
                    self.shared.report(MemberEvent::TaskFailed { task: self.id.clone(), error: error.to_string() });
                    self.control.wait_for_stop(RETRY * 4);
                }
            }
        }
        self.shared.report(MemberEvent::TaskStopped { task: self.id.clone() });
    }

    /// Runs an opened context until it stops, on request or by failing.
    fn run_context(&self, mut ctx: StreamingContext) {
        {
            let mut state = self.control.lock();
            state.handle = Some(ctx.stop_handle());
            match state.stop {
                Some(StopKind::Graceful) => ctx.stop_handle().stop_gracefully(),
                Some(StopKind::Now) => ctx.stop_handle().stop_now(),
                None => {}
            }
        }
        let started = ctx.start();
        let result = started.and_then(|()| ctx.await_termination().map(|_| ()));
        self.control.lock().handle = None;
        if let Err(error) = result
            && !self.control.stopping()
        {
            // A failed transaction (a rebalance under way, a broker restart)
            // ends the context; the batch re-runs from its logged offsets.
            warn!(task = %self.id, %error, "the task stopped with an error; starting it again");
            self.shared.report(MemberEvent::TaskFailed { task: self.id.clone(), error: error.to_string() });
            self.control.wait_for_stop(RETRY);
        }
    }

    fn checkpoint(&self) -> PathBuf {
        self.shared.settings.location.join("tasks").join(self.id.to_string())
    }

    /// Opens the task's context on its checkpoint, with the stream in
    /// `idle_stream` when there is one. When the checkpoint is held by
    /// another writer, the stream (which the pipeline never took) is left
    /// in `idle_stream` for the next attempt.
    fn open(&self, idle_stream: &mut Option<Arc<DirectKafkaStream>>) -> Result<StreamingContext, AppError> {
        let checkpoint = self.checkpoint();
        let task_error = |source| AppError::Task {
            app: self.shared.app.clone(),
            task: self.id.to_string(),
            checkpoint: checkpoint.clone(),
            source: Box::new(source),
        };
        let stream = match idle_stream.take() {
            Some(stream) => stream,
            None => Arc::new(self.stream()?),
        };
        let source = Arc::new(OnePartition {
            stream: Arc::clone(&stream),
            planned: Mutex::new(BTreeMap::new()),
            memory: self.shared.memory.join(),
        });
        let settings = self.shared.streaming_settings(&self.id);
        let declared: Mutex<Option<AppError>> = Mutex::new(None);
        let mut ctx = StreamingContext::get_or_create(&checkpoint, settings, |p| {
            if let Err(e) = self.declare(p, &stream, &source) {
                let reason = e.to_string();
                *lock(&declared) = Some(e);
                return Err(reason.into());
            }
            Ok(())
        })
        .map_err(|source| match lock(&declared).take() {
            Some(declare_error) => declare_error,
            None => {
                // The writer lock is taken before the pipeline is declared:
                // a held checkpoint leaves the stream as it was opened.
                if matches!(source, RuntimeError::Locked { .. }) {
                    *idle_stream = Some(Arc::clone(&stream));
                }
                task_error(source)
            }
        })?;
        ctx.add_progress_listener(Arc::new(TaskProgress { task: self.id.clone(), shared: Arc::clone(&self.shared) }));
        info!(task = %self.id, recovery = ?ctx.recovery().map(ToString::to_string), "task started");
        self.shared.report(MemberEvent::TaskStarted {
            task: self.id.clone(),
            recovery: ctx.recovery().map(ToString::to_string).unwrap_or_default(),
        });
        Ok(ctx)
    }

    /// The direct stream of the task's one partition. Internal topics are
    /// read with `read_committed`, so only committed transactions count;
    /// what the client fetches ahead is bounded by the member's budget.
    fn stream(&self) -> Result<DirectKafkaStream, AppError> {
        let settings = &self.shared.settings;
        let mut config = DirectKafkaSettings::subscribe(&settings.brokers, &self.shared.app, [self.id.topic.clone()])
            .with_partitions([TopicPartition::new(self.id.topic.clone(), self.id.partition)])
            .with_starting_offsets(settings.starting_offsets.clone())
            .with_commit(OffsetCommit::CheckpointOnly)
            .with_consumer_property("isolation.level", "read_committed");
        for (key, value) in self.shared.memory.read_ahead().properties() {
            config = config.with_consumer_property(key, value);
        }
        if let Some(rate) = settings.max_rate_per_partition {
            config = config.with_max_rate_per_partition(rate);
        }
        let stream = DirectKafkaStream::new(config).map_err(|source| AppError::Kafka {
            app: self.shared.app.clone(),
            what: format!("open the stream of task {}", self.id),
            source: Box::new(source),
        })?;
        debug!(task = %self.id, "opened the task's Kafka stream");
        Ok(stream)
    }

    /// Declares the stage's pipeline on the task's partition and the batch
    /// transaction that ends every batch.
    fn declare(
        &self,
        p: &mut PipelineBuilder,
        stream: &Arc<DirectKafkaStream>,
        source: &Arc<OnePartition>,
    ) -> Result<(), AppError> {
        let resume = Arc::clone(stream);
        let on_resume: OffsetsHook = Box::new(move |offsets: &str| {
            let ranges = OffsetRanges::from_json(offsets).map_err(|e| e.to_string())?;
            resume.resume_after(&ranges).map_err(|e| e.to_string())
        });
        let records = p.replayable_input(INPUT, Arc::clone(source), Some(on_resume), None);
        let internal = self.shared.internal.clone();
        let mut builder = TaskBuilder {
            task: &self.id,
            records,
            internal: &internal,
            app: &self.shared.app,
            writes: RefCell::new(BTreeMap::new()),
        };
        let emitted = (self.stage.declare)(&mut builder)?;
        let writes: Vec<InternalTopic> = builder.writes.into_inner().into_values().collect();
        let interval = self.shared.settings.streaming.batch_interval;
        if emitted.slide_duration() != interval {
            return Err(AppError::Invalid {
                app: self.shared.app.clone(),
                reason: format!(
                    "stage {} emits every {}, not every batch ({interval}): each batch must end in its transaction",
                    self.stage.name,
                    emitted.slide_duration()
                ),
            });
        }
        let (task, shared, source) = (self.id.to_string(), Arc::clone(&self.shared), Arc::clone(source));
        let writer = self.writer();
        let was_idle = Mutex::new(None);
        emitted
            .foreach_batch_owned(move |batch, info| {
                let ranges = source.offsets_of(info.time)?;
                let mut marks = Vec::new();
                for topic in &writes {
                    let (group, index, writers) = (writer.0.as_str(), writer.1, writer.2);
                    let max_future = shared.settings.max_future;
                    marks.extend(progress_marks(topic, (group, index, writers), batch.iter(), info.time, max_future)?);
                }
                report_idle(&task, &was_idle, &writes, &batch, info.batch_id);
                let horizon = info.time + shared.settings.max_future;
                let output_records = batch.len() as u64;
                // The records move to the producer's queue, not copied: a
                // batch's output is held once until its transaction ends.
                // Their bytes are counted on the way.
                let mut output_bytes = 0;
                let sent = batch
                    .into_partitions()
                    .into_iter()
                    .flatten()
                    .inspect(|e| output_bytes += e.encoded_len())
                    .map(|e| e.within_horizon(horizon, &writes))
                    .chain(marks)
                    .map(Emit::into_output);
                let transactions = shared.transactions()?;
                transactions.write_batch(&task, info.batch_id, &ranges, sent)?;
                source.memory.observe(BatchSize { input_records: ranges.count(), output_records, output_bytes });
                Ok(())
            })
            .name("batch-transaction");
        Ok(())
    }
}

/// Says when a task that writes internal topics goes idle (it sent them
/// nothing in a batch) and when it has records for them again.
fn report_idle(
    task: &str,
    was_idle: &Mutex<Option<bool>>,
    writes: &[InternalTopic],
    batch: &spate_dstream::Batch<Emit>,
    batch_id: spate_core::BatchId,
) {
    if writes.is_empty() {
        return;
    }
    let idle = !batch.iter().any(|e| writes.iter().any(|w| w.name == e.topic()));
    let mut was = lock(was_idle);
    if *was != Some(idle) {
        if idle {
            info!(task, batch = %batch_id, "sent nothing on: idle (readers hold their watermark at what it sent last, or leave it out after their idle timeout)");
        } else if was.is_some() {
            info!(task, batch = %batch_id, "sends records on again");
        }
        *was = Some(idle);
    }
}

impl Supervisor {
    /// Who this task is among the writers of the internal topics it
    /// writes: its stage, its index (the partition it reads) and how many
    /// tasks the stage has.
    fn writer(&self) -> (String, u32, u32) {
        let index = u32::try_from(self.id.partition).unwrap_or(0);
        let tasks = self.shared.stage_tasks.get(&self.stage.name).copied().unwrap_or(index + 1);
        (self.stage.name.clone(), index, tasks)
    }
}

/// Passes a task's batches on to the member's listener.
struct TaskProgress {
    task: TaskId,
    shared: Arc<MemberShared>,
}

impl ProgressListener for TaskProgress {
    fn on_batch_completed(&self, progress: &BatchProgress) {
        self.shared.report(MemberEvent::Batch { task: self.task.clone(), progress: progress.clone() });
    }
}
