//! [`ReceivedBlockTracker`]: the [`TrackerState`] wrapped with its event log.
//!
//! Every change is first written to the log, then applied: a change whose
//! write failed never happened. Block additions that arrive together are
//! committed together (group commit): the first caller to reach the log
//! writes every addition queued so far as one record, and the callers that
//! queued them only collect the outcome.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, RwLock};

use spate_core::sync::{lock, read, write};
use spate_core::{Clock, ReceivedBlockInfo, StreamBlockId, StreamId, Time};
use spate_wal::{FileWriteAheadLog, WalSettings, WriteAheadLog};
use tracing::{debug, error, info, warn};

use crate::error::TrackerError;
use crate::event::{TrackerEvent, encode_batch, for_each_event};
use crate::report::RecoveryReport;
use crate::state::{AllocatedBlocks, TrackedBlock, TrackerState};

/// The directory of the tracker's event log inside a checkpoint directory.
pub const EVENT_LOG_DIR: &str = "receivedBlockMetadata";

/// The event log directory of the checkpoint directory `checkpoint_dir`.
pub fn event_log_dir(checkpoint_dir: &Path) -> PathBuf {
    checkpoint_dir.join(EVENT_LOG_DIR)
}

/// Counters of what the tracker wrote, for monitoring group commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackerStats {
    /// Records written to the event log.
    pub log_writes: u64,
    /// Events in those records.
    pub events_logged: u64,
}

/// The driver-side registry of received blocks: which blocks wait for a
/// batch, which batch got which blocks, durable in an event log so a
/// restarted driver rebuilds it (Spark's `ReceivedBlockTracker`).
///
/// Shared between threads: receivers call [`ReceivedBlockTracker::add_block`]
/// concurrently, the job generator allocates and cleans up.
pub struct ReceivedBlockTracker {
    state: RwLock<TrackerState>,
    writer: Mutex<Writer>,
    pending: Mutex<PendingAdditions>,
    /// Signalled when a group commit finished (outcomes published).
    group_done: Condvar,
    clock: Arc<dyn Clock>,
    log_writes: AtomicU64,
    events_logged: AtomicU64,
    /// Set when a panic interrupted a change: what was being done. Whether
    /// the interrupted record reached the log is unknown, so the state may
    /// be behind the log; from then on every change is refused.
    poisoned: OnceLock<&'static str>,
}

impl std::fmt::Debug for ReceivedBlockTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceivedBlockTracker")
            .field("log", &lock(&self.writer).log.as_ref().map(|log| log.dir.clone()))
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The event log and what is needed to clean it safely. Only the holder of
/// the writer lock writes the log or changes the state.
struct Writer {
    log: Option<EventLog>,
    buf: Vec<u8>,
    /// Write time of the oldest addition record whose block is still
    /// unallocated; its record must survive cleaning.
    unallocated_since: Option<Time>,
    /// Write time of each live allocation's record; those must survive too.
    allocation_written_at: BTreeMap<Time, Time>,
}

struct EventLog {
    wal: Arc<dyn WriteAheadLog>,
    dir: PathBuf,
}

/// The outcome of a group commit, shared by every caller in the group.
type GroupOutcome = Result<(), Arc<TrackerError>>;

/// Additions waiting for the next group commit, and the outcomes of the
/// groups committed for callers that have not collected them yet.
#[derive(Default)]
struct PendingAdditions {
    queue: Vec<(u64, Vec<ReceivedBlockInfo>)>,
    next_ticket: u64,
    outcomes: HashMap<u64, GroupOutcome>,
    /// Set while a caller commits a group.
    leader_active: bool,
}

/// Write time standing for "unknown, older than anything": records of
/// recovered blocks are kept until those blocks are allocated or cleaned.
const UNKNOWN_WRITE_TIME: Time = Time::from_millis(i64::MIN);

impl ReceivedBlockTracker {
    /// A tracker without an event log (no checkpoint directory): it forgets
    /// everything when the process ends.
    pub fn in_memory(clock: Arc<dyn Clock>) -> Self {
        Self::with_state(TrackerState::new(), None, clock)
    }

    /// The tracker of a run with checkpoint directory `checkpoint_dir`: its
    /// event log is a [`FileWriteAheadLog`] in `receivedBlockMetadata/`
    /// (with default options and `clock`), replayed first. Without a
    /// checkpoint directory the tracker keeps its state in memory only.
    ///
    /// The event log is written whether or not the receivers write their
    /// own WAL: without it a restarted driver would not know which blocks
    /// each batch had.
    pub fn open(checkpoint_dir: Option<&Path>, clock: Arc<dyn Clock>) -> Result<(Self, RecoveryReport), TrackerError> {
        let options = WalSettings::default().with_clock(clock.clone());
        Self::open_with(checkpoint_dir, options, clock)
    }

    /// [`ReceivedBlockTracker::open`] with the event log's options (rolling
    /// interval, sync policy, fault injection for tests).
    pub fn open_with(
        checkpoint_dir: Option<&Path>,
        options: WalSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, RecoveryReport), TrackerError> {
        let Some(checkpoint_dir) = checkpoint_dir else {
            return Ok((Self::in_memory(clock), RecoveryReport::default()));
        };
        let log_dir = event_log_dir(checkpoint_dir);
        let wal = FileWriteAheadLog::open(&log_dir, options)
            .map_err(|source| TrackerError::LogOpen { log: log_dir.clone(), source: source.into() })?;
        Self::recover(Arc::new(wal), log_dir, clock)
    }

    /// A tracker logging to `wal`, the event log in directory `log_dir`
    /// (named in errors and reports), after replaying what `wal` holds.
    ///
    /// Blocks rebuilt by the replay are marked recovered: their data is read
    /// from the receiver WAL by handle. The report lists the recovered
    /// blocks that have no handle; see [`RecoveryReport::ensure_recoverable`].
    pub fn recover(
        wal: Arc<dyn WriteAheadLog>,
        log_dir: impl Into<PathBuf>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, RecoveryReport), TrackerError> {
        let log_dir = log_dir.into();
        let (state, report) = replay_event_log(wal.as_ref(), &log_dir)?;
        if report.is_complete() {
            info!(%report, "tracker recovered");
        } else {
            warn!(%report, "tracker recovered with data that cannot be recovered");
        }
        let tracker = Self::with_state(state, Some(EventLog { wal, dir: log_dir }), clock);
        Ok((tracker, report))
    }

    fn with_state(state: TrackerState, log: Option<EventLog>, clock: Arc<dyn Clock>) -> Self {
        let unallocated_since = state.has_unallocated_blocks().then_some(UNKNOWN_WRITE_TIME);
        let allocation_written_at = state.allocated_batches().map(|(time, _)| (time, UNKNOWN_WRITE_TIME)).collect();
        let writer = Writer { log, buf: Vec::new(), unallocated_since, allocation_written_at };
        ReceivedBlockTracker {
            state: RwLock::new(state),
            writer: Mutex::new(writer),
            pending: Mutex::new(PendingAdditions::default()),
            group_done: Condvar::new(),
            clock,
            log_writes: AtomicU64::new(0),
            events_logged: AtomicU64::new(0),
            poisoned: OnceLock::new(),
        }
    }

    /// Logs the addition of a received block, then queues it for the next
    /// batch. Returns false, and queues nothing, when the log write failed
    /// (the error is logged); the receiver must then not acknowledge it.
    /// [`ReceivedBlockTracker::try_add_block`] returns the error instead.
    pub fn add_block(&self, info: ReceivedBlockInfo) -> bool {
        self.try_add_block(info).is_ok()
    }

    /// Like [`ReceivedBlockTracker::add_block`] for several blocks, logged in
    /// one record: all are queued, or none.
    pub fn add_blocks(&self, infos: &[ReceivedBlockInfo]) -> bool {
        self.try_add_blocks(infos).is_ok()
    }

    /// Logs the addition of a received block, then queues it for the next
    /// batch; on error nothing is queued and the receiver must not
    /// acknowledge the block. After a panic interrupted a change of the
    /// tracker every addition fails ([`TrackerError::Poisoned`]).
    pub fn try_add_block(&self, info: ReceivedBlockInfo) -> Result<(), TrackerError> {
        self.submit(vec![info])
    }

    /// Like [`ReceivedBlockTracker::try_add_block`] for several blocks,
    /// logged in one record: all are queued, or none.
    pub fn try_add_blocks(&self, infos: &[ReceivedBlockInfo]) -> Result<(), TrackerError> {
        if infos.is_empty() {
            return Ok(());
        }
        self.submit(infos.to_vec())
    }

    /// Queues `infos` for the next group commit and returns its outcome.
    ///
    /// One caller at a time leads: it takes every queued addition, writes
    /// them as one record and publishes the outcome; the others wait for it.
    /// A leader that queues again right after finishing joins the next group
    /// rather than overtaking the callers already waiting. A leader that
    /// panics still publishes an outcome (a failure) to its group and hands
    /// on the lead, so no caller waits forever.
    fn submit(&self, infos: Vec<ReceivedBlockInfo>) -> Result<(), TrackerError> {
        let blocks = infos.len();
        let not_logged = |source| TrackerError::AdditionNotLogged { blocks, source };
        let mut pending = lock(&self.pending);
        let ticket = pending.next_ticket;
        pending.next_ticket += 1;
        pending.queue.push((ticket, infos));
        loop {
            if let Some(outcome) = pending.outcomes.remove(&ticket) {
                return outcome.map_err(not_logged);
            }
            if !pending.leader_active {
                break;
            }
            pending = self.group_done.wait(pending).unwrap_or_else(PoisonError::into_inner);
        }
        pending.leader_active = true;
        drop(pending);
        let mut leadership = Leadership { tracker: self, leader: ticket, group: Vec::new(), outcome: None };
        let outcome = self.commit_group(&mut leadership.group).map_err(|e| {
            error!(error = %e, callers = leadership.group.len(), "block additions not logged; they are not queued");
            Arc::new(e)
        });
        leadership.outcome = Some(outcome.clone());
        drop(leadership);
        outcome.map_err(not_logged)
    }

    /// Takes every queued addition and commits them as one record; `group`
    /// receives their tickets before anything is written.
    fn commit_group(&self, group: &mut Vec<u64>) -> Result<(), TrackerError> {
        let mut writer = lock(&self.writer);
        let queued = std::mem::take(&mut lock(&self.pending).queue);
        group.extend(queued.iter().map(|(t, _)| *t));
        let events = queued.into_iter().flat_map(|(_, infos)| infos).map(TrackerEvent::BlockAddition).collect();
        self.commit(&mut writer, events)
    }

    /// Writes `events` as one log record, then applies them. The caller
    /// holds the writer lock, so log order is apply order. A panic on the
    /// way poisons the tracker: the record may or may not be in the log.
    fn commit(&self, writer: &mut Writer, events: Vec<TrackerEvent>) -> Result<(), TrackerError> {
        self.ensure_not_poisoned()?;
        let guard = PoisonOnPanic { tracker: self, during: events.first().map_or("logging", TrackerEvent::activity) };
        let result = self.write_and_apply(writer, events);
        guard.disarm();
        result
    }

    fn write_and_apply(&self, writer: &mut Writer, events: Vec<TrackerEvent>) -> Result<(), TrackerError> {
        let now = self.clock.now();
        if let Some(log) = &writer.log {
            let describe = || events.first().map(TrackerEvent::describe).unwrap_or_default();
            encode_batch(&events, &mut writer.buf)
                .map_err(|source| TrackerError::Encode { what: describe(), source })?;
            log.wal.write(&writer.buf, now).map_err(|source| TrackerError::LogWrite {
                what: describe(),
                log: log.dir.clone(),
                source: source.into(),
            })?;
            self.log_writes.fetch_add(1, Ordering::Relaxed);
            self.events_logged.fetch_add(events.len() as u64, Ordering::Relaxed);
        }
        let mut state = write(&self.state);
        for event in events {
            writer.note_written(&event, now);
            state.apply(event);
        }
        Ok(())
    }

    /// `Err` once a panic interrupted a change.
    fn ensure_not_poisoned(&self) -> Result<(), TrackerError> {
        match self.poisoned.get() {
            Some(during) => Err(TrackerError::Poisoned { during }),
            None => Ok(()),
        }
    }

    /// Marks the tracker as interrupted by a panic (the first cause stays).
    fn poison(&self, during: &'static str) {
        if self.poisoned.set(during).is_ok() {
            error!(during, "a panic interrupted a change of the tracker; it takes no more changes");
        }
    }

    /// Block additions queued and not yet taken by a group commit.
    #[cfg(test)]
    pub(crate) fn queued_additions(&self) -> usize {
        lock(&self.pending).queue.len()
    }

    /// Allocates every stream's unallocated blocks to the batch at `time`,
    /// logged first. For a time at or before the last allocated batch (a
    /// batch re-run after recovery) nothing changes: the batch keeps the
    /// blocks it had. On error nothing changes either.
    pub fn allocate_blocks_to_batch(&self, time: Time) -> Result<(), TrackerError> {
        let mut writer = lock(&self.writer);
        let event = read(&self.state).allocation_event(time);
        match event {
            Some(event) => self.commit(&mut writer, vec![event]),
            None => {
                info!(%time, "batch at or before the last allocated one: it keeps its blocks (re-run after recovery)");
                Ok(())
            }
        }
    }

    /// The blocks allocated to the batch at `time`, by stream (empty when
    /// the batch has no allocation).
    pub fn get_blocks_of_batch(&self, time: Time) -> AllocatedBlocks {
        read(&self.state).blocks_of_batch(time).cloned().unwrap_or_default()
    }

    /// The blocks of `stream` allocated to the batch at `time`.
    pub fn get_blocks_of_batch_and_stream(&self, time: Time, stream: StreamId) -> Vec<TrackedBlock> {
        read(&self.state).blocks_of_batch(time).and_then(|streams| streams.get(&stream)).cloned().unwrap_or_default()
    }

    /// True when some stream has blocks waiting for a batch.
    pub fn has_unallocated_blocks(&self) -> bool {
        read(&self.state).has_unallocated_blocks()
    }

    /// The blocks of `stream` waiting for a batch, in arrival order.
    pub fn unallocated_blocks(&self, stream: StreamId) -> Vec<TrackedBlock> {
        read(&self.state).unallocated_blocks(stream).cloned().collect()
    }

    /// The blocks either side of `block` among the blocks of `stream`
    /// waiting for a batch, or `None` when it is not waiting (see
    /// [`TrackerState::unallocated_neighbours`]): a neighbour found here
    /// goes to the same batch as `block`, right before or after it.
    pub fn unallocated_neighbours(
        &self,
        stream: StreamId,
        block: StreamBlockId,
    ) -> Option<(Option<StreamBlockId>, Option<StreamBlockId>)> {
        read(&self.state).unallocated_neighbours(stream, block)
    }

    /// The time of the last batch blocks were allocated to.
    pub fn last_allocated_batch_time(&self) -> Option<Time> {
        read(&self.state).last_allocated_batch_time()
    }

    /// A copy of the whole state.
    pub fn state(&self) -> TrackerState {
        read(&self.state).clone()
    }

    /// What the tracker has written so far.
    pub fn stats(&self) -> TrackerStats {
        TrackerStats {
            log_writes: self.log_writes.load(Ordering::Relaxed),
            events_logged: self.events_logged.load(Ordering::Relaxed),
        }
    }

    /// Forgets the allocations of batches before `threshold` (logged first),
    /// then deletes the event log's segments that only hold records no
    /// longer needed; with `wait_for_completion` the deletion is done when
    /// this returns.
    ///
    /// `threshold` must not be after the clock's present: a later one could
    /// delete the records of blocks still waiting for a batch.
    pub fn cleanup_old_batches(&self, threshold: Time, wait_for_completion: bool) -> Result<(), TrackerError> {
        let now = self.clock.now();
        if threshold > now {
            return Err(TrackerError::CleanupThresholdInFuture { threshold, now });
        }
        let mut writer = lock(&self.writer);
        let event = read(&self.state).cleanup_event(threshold);
        debug!(%threshold, event = %event.describe(), "cleaning up old batches");
        self.commit(&mut writer, vec![event])?;
        let clean_before = writer.clean_threshold(threshold);
        let Some(log) = &writer.log else { return Ok(()) };
        log.wal.clean(clean_before, wait_for_completion).map_err(|source| TrackerError::LogClean {
            log: log.dir.clone(),
            threshold: clean_before,
            source: source.into(),
        })
    }

    /// Closes the event log; later changes fail.
    pub fn close(&self) -> Result<(), TrackerError> {
        let writer = lock(&self.writer);
        let Some(log) = &writer.log else { return Ok(()) };
        log.wal.close().map_err(|source| TrackerError::LogClose { log: log.dir.clone(), source: source.into() })
    }
}

/// Poisons the tracker when dropped armed, that is when a panic unwinds
/// through a change before it finished.
struct PoisonOnPanic<'a> {
    tracker: &'a ReceivedBlockTracker,
    during: &'static str,
}

impl PoisonOnPanic<'_> {
    /// The change finished (well or with an error): nothing to poison.
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        self.tracker.poison(self.during);
    }
}

/// The lead of one group commit. Dropping it publishes the group's outcome
/// to the callers waiting for it and hands the lead on, also when the
/// leader panicked (then the outcome is a failure and the tracker is
/// poisoned), so that no caller waits forever.
struct Leadership<'a> {
    tracker: &'a ReceivedBlockTracker,
    /// The leader's own ticket: it takes its outcome itself.
    leader: u64,
    /// The tickets of the group, once taken from the queue.
    group: Vec<u64>,
    /// `None` while the commit has not returned.
    outcome: Option<GroupOutcome>,
}

impl Drop for Leadership<'_> {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or_else(|| {
            self.tracker.poison("logging block additions");
            Err(Arc::new(TrackerError::Poisoned { during: "logging block additions" }))
        });
        let mut pending = lock(&self.tracker.pending);
        let waiting = self.group.iter().copied().filter(|t| *t != self.leader);
        let outcomes: Vec<(u64, GroupOutcome)> = waiting.map(|t| (t, outcome.clone())).collect();
        pending.outcomes.extend(outcomes);
        pending.leader_active = false;
        self.tracker.group_done.notify_all();
    }
}

impl Writer {
    /// Keeps the bookkeeping of which records must survive cleaning.
    fn note_written(&mut self, event: &TrackerEvent, written_at: Time) {
        match event {
            TrackerEvent::BlockAddition(_) => {
                self.unallocated_since.get_or_insert(written_at);
            }
            TrackerEvent::BatchAllocation { time, .. } => {
                self.unallocated_since = None;
                self.allocation_written_at.insert(*time, written_at);
            }
            TrackerEvent::BatchCleanup { times, .. } => {
                for time in times {
                    self.allocation_written_at.remove(time);
                }
            }
        }
    }

    /// The time before which log records may be deleted: `threshold`, held
    /// back so that no record of an unallocated block or of a live
    /// allocation goes (segments hold records of many times; a batch time
    /// says nothing about when its blocks were logged).
    fn clean_threshold(&self, threshold: Time) -> Time {
        let oldest_allocation = self.allocation_written_at.values().min().copied();
        [Some(threshold), self.unallocated_since, oldest_allocation].into_iter().flatten().min().unwrap_or(threshold)
    }
}

/// Replays the event log `wal` (in directory `log_dir`) into a fresh state,
/// with every block marked recovered, and reports what it found.
///
/// A torn record at the end of the log is the log's to drop (it was never
/// acknowledged); every other failure is an error naming the record.
pub fn replay_event_log(
    wal: &dyn WriteAheadLog,
    log_dir: &Path,
) -> Result<(TrackerState, RecoveryReport), TrackerError> {
    let mut state = TrackerState::new();
    let mut records = 0u64;
    let mut events = 0u64;
    let iter = wal.read_all().map_err(|source| TrackerError::LogRead {
        log: log_dir.to_path_buf(),
        record: 0,
        source: source.into(),
    })?;
    for record in iter {
        let bytes = record.map_err(|source| TrackerError::LogRead {
            log: log_dir.to_path_buf(),
            record: records,
            source: source.into(),
        })?;
        let count = for_each_event(&bytes, |event| state.apply(event)).map_err(|source| TrackerError::BadRecord {
            log: log_dir.to_path_buf(),
            record: records,
            source: Box::new(source),
        })?;
        events += count as u64;
        records += 1;
    }
    state.mark_recovered();
    let report = RecoveryReport::of_state(&state, Some(log_dir.to_path_buf()), records, events);
    Ok((state, report))
}
