//! One member of an application: joins the application's consumer group
//! and runs a task for every partition the group gives it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration as StdDuration, Instant};

use spate_core::Duration;
use spate_core::SystemClock;
use spate_core::sync::lock;
use spate_dstream::BoxError;
use spate_kafka::{
    AssignmentListener, GroupMember, GroupSettings, MemberTransactions, StartingOffsets, TopicPartition, ensure_topic,
    partition_count,
};
use spate_logstore::{
    LeaseSettings, LogStoreError, ObjectStoreSettings, WriterLock, file_manager_for, is_object_store_location,
};
use spate_runtime::{BackpressureSettings, BatchProgress, StreamingSettings};
use tracing::{info, warn};

use crate::error::AppError;
use crate::memory::MemberMemory;
use crate::task::{RunningTask, StopKind};
use crate::topology::{InternalTopic, Stage, StageInput, TaskId, Topology};
use crate::watch::TaskBoard;

/// How a member runs.
#[derive(Clone, Debug)]
pub struct MemberSettings {
    /// The Kafka brokers.
    pub brokers: String,
    /// The application's checkpoint location, shared by every member: a
    /// directory (members on one machine) or `s3://bucket/prefix`. Each
    /// task's checkpoint is `<location>/tasks/<topic>-<partition>`.
    pub location: PathBuf,
    /// How to reach an `s3://` location.
    pub object_store: ObjectStoreSettings,
    /// What every task's streaming context starts from: the batch
    /// interval, the caps of a batch, the memory budget and how often
    /// state is checkpointed; each task has a context of its own made from
    /// it. The checkpoint, the lease, backpressure and the metric labels
    /// are set per task.
    pub streaming: StreamingSettings,
    /// Session timeout, heartbeat and protocol of the group membership.
    pub group: GroupSettings,
    /// The broker aborts an open transaction of a member that died after
    /// this long; readers of internal topics wait at it until then.
    pub transaction_timeout: StdDuration,
    /// This member's name, unique in the application and the same across
    /// its restarts (its transactional id is `<application>-<member id>`,
    /// so a restarted member fences its earlier incarnation). A member
    /// started under a name a live member uses is refused
    /// ([`AppError::MemberIdInUse`]).
    pub member_id: String,
    /// Where a task with no checkpoint yet starts reading.
    pub starting_offsets: StartingOffsets,
    /// At most this many records a second per partition.
    pub max_rate_per_partition: Option<u64>,
    /// An event time further than this ahead of a batch's time is not
    /// believed: the progress a task reports to the readers of its
    /// internal topics leaves it out (default one hour).
    pub max_future: Duration,
    /// Where the member serves `/metrics` for its whole process, each
    /// task's batch figures labelled with its `task`, `stage` and
    /// `partition`; `None`: not served.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where the member serves the page of its tasks (`/`, with
    /// `/api/status`); `None`: not served. The same address as
    /// [`MemberSettings::metrics_addr`] serves both.
    pub ui_addr: Option<std::net::SocketAddr>,
}

impl MemberSettings {
    /// Settings for a member named `member_id` on `brokers`, with its
    /// application's checkpoints at `location` and its tasks' streaming
    /// contexts made from `streaming` (at least a batch interval:
    /// `StreamingSettings::new(interval)`).
    pub fn new(brokers: &str, location: impl Into<PathBuf>, streaming: StreamingSettings, member_id: &str) -> Self {
        MemberSettings {
            brokers: brokers.to_string(),
            location: location.into(),
            object_store: ObjectStoreSettings::default(),
            streaming,
            group: GroupSettings::default(),
            transaction_timeout: StdDuration::from_secs(10),
            member_id: member_id.to_string(),
            starting_offsets: StartingOffsets::Earliest,
            max_rate_per_partition: None,
            max_future: spate_dstream::DEFAULT_MAX_FUTURE,
            metrics_addr: None,
            ui_addr: None,
        }
    }
}

/// What happens to a member and its tasks, for its listener.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum MemberEvent {
    /// The group gave the member these tasks.
    Assigned {
        /// The tasks.
        tasks: Vec<TaskId>,
    },
    /// The group took these tasks away (`lost`: the member had been
    /// dropped from the group, another may own them already).
    Revoked {
        /// The tasks.
        tasks: Vec<TaskId>,
        /// Whether they were lost rather than handed over.
        lost: bool,
    },
    /// A task opened its checkpoint and recovered.
    TaskStarted {
        /// The task.
        task: TaskId,
        /// What it recovered, as the runtime says it.
        recovery: String,
    },
    /// A task stopped and released its checkpoint.
    TaskStopped {
        /// The task.
        task: TaskId,
    },
    /// A task failed; it is started again while the member owns it.
    TaskFailed {
        /// The task.
        task: TaskId,
        /// The error.
        error: String,
    },
    /// A task met an error that trying again cannot mend (the pipeline it
    /// declares is refused): the member runs it no more and says so once
    /// ([`Member::failure`]); stop the member.
    Failed {
        /// The task.
        task: TaskId,
        /// The error.
        error: String,
    },
    /// A task committed a batch.
    Batch {
        /// The task.
        task: TaskId,
        /// The batch's progress report.
        progress: BatchProgress,
    },
}

/// Told of every [`MemberEvent`]; called from the member's threads, so it should return quickly.
pub type MemberListener = Arc<dyn Fn(&MemberEvent) + Send + Sync>;

/// What a member's tasks share.
pub(crate) struct MemberShared {
    pub(crate) app: String,
    pub(crate) settings: MemberSettings,
    pub(crate) internal: BTreeMap<String, InternalTopic>,
    /// How many tasks each stage has (the partitions of its input).
    pub(crate) stage_tasks: BTreeMap<String, u32>,
    /// The first error of a task that no retry can mend.
    failure: Mutex<Option<String>>,
    transactions: Mutex<Option<Arc<MemberTransactions>>>,
    transactions_ready: Condvar,
    listener: Option<MemberListener>,
    /// The tasks as the member's page shows them.
    board: Arc<TaskBoard>,
    /// The member's memory budget, which every task's batches draw on.
    pub(crate) memory: Arc<MemberMemory>,
}

impl MemberShared {
    /// Records that `task` failed for good and tells the listener.
    pub(crate) fn fail(&self, task: &TaskId, error: &AppError) {
        let text = format!("task {task}: {error}");
        lock(&self.failure).get_or_insert(text);
        self.report(MemberEvent::Failed { task: task.clone(), error: error.to_string() });
    }

    pub(crate) fn report(&self, event: MemberEvent) {
        self.board.record(&event);
        if let Some(listener) = &self.listener {
            listener(&event);
        }
    }

    /// The member's producer, once it is open (a task assigned in the
    /// member's first rebalance may ask before).
    pub(crate) fn transactions(&self) -> Result<Arc<MemberTransactions>, BoxError> {
        let guard = lock(&self.transactions);
        let (guard, _) = self
            .transactions_ready
            .wait_timeout_while(guard, StdDuration::from_secs(60), |t| t.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard.clone().ok_or_else(|| "the member's transactional producer is not open".into())
    }

    fn set_transactions(&self, transactions: Option<Arc<MemberTransactions>>) {
        *lock(&self.transactions) = transactions;
        self.transactions_ready.notify_all();
    }

    /// The settings of the streaming context of task `id`.
    pub(crate) fn streaming_settings(&self, id: &TaskId) -> StreamingSettings {
        crate::watch::labelled(task_settings(&self.settings), id)
    }
}

/// The settings of a task's streaming context under `settings`.
///
/// Backpressure is off: a task's batch time is mostly its wait for the
/// member's one producer, whose transactions the member's tasks share
/// (see `MemberTransactions::write_batch`), so the rate estimator would
/// read the whole member's load as the task's own and hold it at its floor
/// (100 records a second) for as long as the scheduling delay of a
/// backlog's first batches lasted. Each task's batch stays within the
/// stream's records and bytes caps and its share of the member's budget
/// (see `memory.rs`).
fn task_settings(settings: &MemberSettings) -> StreamingSettings {
    let mut streaming = settings
        .streaming
        .clone()
        .with_object_store(settings.object_store.clone())
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() });
    streaming.checkpoint = None;
    streaming.metric_labels.clear();
    if is_object_store_location(&settings.location) {
        streaming = streaming.with_lease(task_lease(settings.group.session_timeout));
    }
    streaming
}

/// A task's lease in an object store: as long as the group's session, so
/// a dead member's tasks can move as soon as the group has noticed.
fn task_lease(session: StdDuration) -> LeaseSettings {
    let ms = u64::try_from(session.as_millis()).unwrap_or(u64::MAX).max(3_000);
    LeaseSettings {
        duration: Duration::from_millis(ms),
        renew_every: Duration::from_millis(ms / 4),
        safety_margin: Duration::from_millis(ms / 5),
        renew_in_background: true,
    }
}

/// Takes the lock of `member_id` at the application's checkpoint location
/// (`<location>/members/<member id>`), held for the member's life.
///
/// Two live processes under one member id would share one transactional
/// id, and each would fence the other's producer on its next transaction,
/// for as long as both ran. The lock refuses the second at start. It is
/// taken where every member of the application meets, the location they
/// share, with the checkpoints' own writer lock, which tells a live holder
/// from a dead one: in a directory an OS lock (a process that died holds
/// nothing); in an object store a lease, which a live holder renews and a
/// dead one's runs out, so a refused lease is asked for again until a
/// dead run's would have run out (see [`lease_patience`]). The group's
/// member list cannot serve: the classic `DescribeGroups` does not list
/// the members of a group of the broker-side protocol, and a run that
/// died stays listed until its session runs out.
fn lock_member_id(app: &str, settings: &MemberSettings) -> Result<WriterLock, AppError> {
    let dir = settings.location.join("members").join(&settings.member_id);
    let location_error = |source| AppError::Location { location: dir.clone(), source: Box::new(source) };
    let files = file_manager_for(&settings.location, &settings.object_store).map_err(location_error)?;
    files.mkdirs(&dir).map_err(location_error)?;
    let lease = task_lease(settings.group.session_timeout);
    let patience =
        if is_object_store_location(&settings.location) { lease_patience(&lease) } else { StdDuration::ZERO };
    let deadline = Instant::now() + patience;
    let mut waiting = false;
    loop {
        match files.acquire_lock(&dir, Arc::new(SystemClock), &lease) {
            Ok(lock) => return Ok(lock),
            Err(LogStoreError::Locked { holder, .. }) if Instant::now() < deadline => {
                if !waiting {
                    info!(member = %settings.member_id, holder = ?holder.map(|h| h.to_string()), ?patience,
                        "the member id's lease is held; waiting for it to run out in case its holder died");
                    waiting = true;
                }
                std::thread::sleep(lease.renew_every.into());
            }
            Err(LogStoreError::Locked { holder, .. }) => {
                return Err(AppError::MemberIdInUse {
                    app: app.to_string(),
                    member_id: settings.member_id.clone(),
                    holder: holder.map_or_else(|| "its lock names no holder".to_string(), |h| h.to_string()),
                });
            }
            Err(other) => return Err(location_error(other)),
        }
    }
}

/// How long a member waits for a held lease of its id: long enough that a
/// dead holder's lease (as long as this member's: the application's
/// members share their session timeout) has run out by this member's
/// clock, while a live holder's, renewed every `renew_every`, never does.
fn lease_patience(lease: &LeaseSettings) -> StdDuration {
    StdDuration::from(lease.duration) + StdDuration::from(lease.safety_margin)
}

/// The member's tasks, started and stopped as the group decides.
struct Tasks {
    shared: Arc<MemberShared>,
    stages: BTreeMap<String, Stage>,
    running: Mutex<Running>,
    /// Told each time a task the member stops on leaving has stopped.
    drained: Condvar,
}

/// The tasks running now, and those the member is stopping as it leaves.
#[derive(Default)]
struct Running {
    tasks: BTreeMap<TopicPartition, RunningTask>,
    /// The member is leaving: it starts no more tasks.
    stopping: bool,
    /// The partitions of the tasks it is stopping, until each has stopped.
    draining: BTreeSet<TopicPartition>,
}

impl Tasks {
    fn task_of(&self, tp: &TopicPartition) -> Option<(TaskId, Stage)> {
        let stage = self.stages.get(&tp.topic)?;
        Some((TaskId { stage: stage.name.clone(), topic: tp.topic.clone(), partition: tp.partition }, stage.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        lock(&self.running)
    }

    fn owned(&self) -> Vec<TaskId> {
        self.lock().tasks.values().map(|t| t.id.clone()).collect()
    }

    /// Stops every task gracefully (each finishes and commits its batch in
    /// flight) while the member is still in the group, and starts none
    /// after. The lock is not held while they stop: the group's callbacks
    /// must still run meanwhile, or the member would miss a new generation
    /// and its tasks' last batches would be refused. A revocation of a
    /// partition whose task is stopping waits for it (see [`Tasks::wait_drained`]).
    fn stop_all(&self) {
        let stopping: Vec<(TopicPartition, RunningTask)> = {
            let mut running = self.lock();
            running.stopping = true;
            let tasks = std::mem::take(&mut running.tasks);
            running.draining.extend(tasks.keys().cloned());
            tasks.into_iter().collect()
        };
        for (_, task) in &stopping {
            task.request_stop(StopKind::Graceful);
        }
        for (tp, task) in stopping {
            task.join();
            self.lock().draining.remove(&tp);
            self.drained.notify_all();
        }
    }

    /// Waits until no task of `partitions` is still stopping for the member's leave.
    fn wait_drained(&self, partitions: &[TopicPartition]) {
        let running = self.lock();
        let _stopped = self
            .drained
            .wait_while(running, |r| partitions.iter().any(|tp| r.draining.contains(tp)))
            .unwrap_or_else(PoisonError::into_inner);
    }
}

impl AssignmentListener for Tasks {
    fn on_revoked(&self, partitions: &[TopicPartition], lost: bool) {
        let stopping: Vec<RunningTask> = {
            let mut running = self.lock();
            partitions.iter().filter_map(|tp| running.tasks.remove(tp)).collect()
        };
        let kind = if lost { StopKind::Now } else { StopKind::Graceful };
        for task in &stopping {
            task.request_stop(kind);
        }
        let tasks: Vec<TaskId> = stopping.iter().map(|t| t.id.clone()).collect();
        // The group waits for this: the next owner starts after these stopped.
        for task in stopping {
            task.join();
        }
        self.wait_drained(partitions);
        self.shared.report(MemberEvent::Revoked { tasks, lost });
    }

    fn on_assigned(&self, partitions: &[TopicPartition]) {
        let mut started = Vec::new();
        let mut running = self.lock();
        if running.stopping {
            info!(partitions = ?partitions, "assigned while the member stops: no task started");
            return;
        }
        for tp in partitions {
            let Some((id, stage)) = self.task_of(tp) else {
                warn!(partition = %tp, "assigned a partition no stage reads");
                continue;
            };
            match RunningTask::start(id.clone(), stage, Arc::clone(&self.shared)) {
                Ok(task) => {
                    running.tasks.insert(tp.clone(), task);
                    started.push(id);
                }
                Err(error) => warn!(task = %id, %error, "cannot start the task"),
            }
        }
        drop(running);
        self.shared.report(MemberEvent::Assigned { tasks: started });
    }
}

/// One member of an application (see the crate docs). Leave the group with
/// [`Member::leave`]: each task finishes its batch, commits and lets its
/// partition go to the members that stay.
pub struct Member {
    shared: Arc<MemberShared>,
    tasks: Arc<Tasks>,
    group: Arc<GroupMember>,
    /// The member's `/metrics` and page, while it lives.
    served: crate::watch::Served,
    /// Held while the member lives: no other live member takes its id (see [`lock_member_id`]).
    _member_lock: WriterLock,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("app", &self.shared.app)
            .field("member_id", &self.shared.settings.member_id)
            .finish_non_exhaustive()
    }
}

impl Member {
    /// Creates the application's internal topics (when missing), joins its
    /// consumer group and opens the member's transactional producer; tasks
    /// start as the group assigns partitions.
    pub fn start(
        topology: Topology,
        settings: MemberSettings,
        listener: Option<MemberListener>,
    ) -> Result<Self, AppError> {
        let app = topology.app.clone();
        let problems = topology.problems();
        if !problems.is_empty() {
            return Err(AppError::Invalid { app, reason: problems.join("; ") });
        }
        let kafka = |what: String| {
            let app = app.clone();
            move |source| AppError::Kafka { app, what, source: Box::new(source) }
        };
        let member_lock = lock_member_id(&app, &settings)?;
        let (internal, stage_tasks) = internal_topics(&topology, &settings.brokers)?;
        for topic in internal.values() {
            ensure_topic(&settings.brokers, &topic.name, topic.partitions)
                .map_err(kafka(format!("create the internal topic {}", topic.name)))?;
        }
        let stages: BTreeMap<String, Stage> =
            topology.stages.iter().map(|stage| (topology.input_topic(stage), stage.clone())).collect();
        let topics: Vec<String> = stages.keys().cloned().collect();
        let memory = MemberMemory::new(settings.streaming.max_memory_bytes);
        let shared = Arc::new(MemberShared {
            app: app.clone(),
            memory,
            settings,
            internal,
            stage_tasks,
            failure: Mutex::new(None),
            transactions: Mutex::new(None),
            transactions_ready: Condvar::new(),
            listener,
            board: Arc::new(TaskBoard::default()),
        });
        let s = &shared.settings;
        let served = crate::watch::serve(&app, &s.member_id, s.metrics_addr, s.ui_addr, &shared.board)?;
        let tasks = Arc::new(Tasks {
            shared: Arc::clone(&shared),
            stages,
            running: Mutex::new(Running::default()),
            drained: Condvar::new(),
        });
        let s = &shared.settings;
        let mut group_settings = s.group.clone();
        group_settings.client_id.get_or_insert_with(|| s.member_id.clone());
        let group = GroupMember::join(&s.brokers, &app, &topics, &group_settings, Arc::clone(&tasks) as _)
            .map_err(kafka(format!("join the group {app}")))?;
        let group = Arc::new(group);
        let transactional_id = format!("{app}-{}", s.member_id);
        let transactions =
            MemberTransactions::new(&s.brokers, &transactional_id, Arc::clone(&group), s.transaction_timeout)
                .map_err(kafka(format!("open the transactional producer {transactional_id}")))?;
        shared.set_transactions(Some(Arc::new(transactions)));
        info!(app = %app, member = %s.member_id, topics = ?topics, "member started");
        Ok(Member { shared, tasks, group, served, _member_lock: member_lock })
    }

    /// Where `/metrics` is served (with the port chosen for port 0), when asked for.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.served.metrics
    }

    /// Where the page of the member's tasks is served, when asked for.
    pub fn ui_addr(&self) -> Option<std::net::SocketAddr> {
        self.served.ui
    }

    /// The tasks this member runs now.
    pub fn tasks(&self) -> Vec<TaskId> {
        self.tasks.owned()
    }

    /// The first error of a task that trying again cannot mend, naming the
    /// task (see [`MemberEvent::Failed`]); the member should be stopped.
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.failure).clone()
    }

    /// The member's name.
    pub fn member_id(&self) -> &str {
        &self.shared.settings.member_id
    }

    /// Leaves the group: every task finishes its batch in flight, commits it
    /// and releases its checkpoint, then the partitions go to the others.
    /// Dropping a member leaves too (and logs a failure to leave).
    pub fn leave(self) -> Result<(), AppError> {
        self.stop()
    }

    /// Stops the tasks while the member is still in the group (their last
    /// batches commit under its current generation), then leaves the group
    /// and lets the producer go. Stopping again does nothing.
    ///
    /// Letting the producer go also breaks the one reference cycle of a
    /// member (the group's listener holds the tasks, which hold what the
    /// member shares, which holds the producer, which holds the group), so
    /// the member's parts are freed with it.
    fn stop(&self) -> Result<(), AppError> {
        self.tasks.stop_all();
        let result = self.group.leave().map_err(|source| AppError::Kafka {
            app: self.shared.app.clone(),
            what: "leave the group".to_string(),
            source: Box::new(source),
        });
        self.shared.set_transactions(None);
        result
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            warn!(member = %self.shared.settings.member_id, %error, "the member could not leave its group");
        }
    }
}

/// Each operator's internal topic, with its partition count (the
/// application's input's for a repartition, one for a single stage), and
/// each stage's number of tasks.
fn internal_topics(topology: &Topology, brokers: &str) -> Result<InternalTopics, AppError> {
    let mut input_partitions = None;
    let mut out = BTreeMap::new();
    let mut tasks = BTreeMap::new();
    for stage in &topology.stages {
        let (operator, partitions) = match &stage.input {
            StageInput::Topic(topic) => {
                let count = partition_count(brokers, topic).map_err(|source| AppError::Kafka {
                    app: topology.app.clone(),
                    what: format!("look up the input topic {topic}"),
                    source: Box::new(source),
                })?;
                input_partitions.get_or_insert(count);
                tasks.insert(stage.name.clone(), u32::try_from(count).unwrap_or(1));
                continue;
            }
            StageInput::Repartition(operator) => (operator, input_partitions.unwrap_or(1)),
            StageInput::Single(operator) => (operator, 1),
        };
        tasks.insert(stage.name.clone(), u32::try_from(partitions).unwrap_or(1));
        out.insert(operator.clone(), InternalTopic { name: topology.internal_topic(operator), partitions });
    }
    Ok((out, tasks))
}

/// The internal topics by operator, and each stage's number of tasks.
type InternalTopics = (BTreeMap<String, InternalTopic>, BTreeMap<String, u32>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_without_backpressure_on_a_directory_and_in_s3() {
        for location in ["/var/lib/app", "s3://bucket/app"] {
            let streaming = StreamingSettings::new(Duration::from_secs(1)).with_metric_label("job", "x");
            let settings = MemberSettings::new("127.0.0.1:9092", location, streaming, "m1");
            let streaming = task_settings(&settings);
            assert!(!streaming.backpressure.enabled, "{location}");
            assert_eq!(streaming.batch_interval, Duration::from_secs(1));
            assert!(streaming.metric_labels.is_empty(), "each task labels its own figures");
        }
    }
}
