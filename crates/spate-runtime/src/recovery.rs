//! The recovery procedure of a context started from an existing checkpoint,
//! and the report of what it did.
//!
//! [`recover_tracker`] replays the block tracker's event log; [`recover`]
//! then turns the checkpoint's verdict into a running position: it refuses
//! a state snapshot newer than the last commit, restores operator state by
//! name, replays the committed batches past the snapshot (outputs off),
//! works out where each receiver resumes, and queues the uncommitted batch
//! and the batch times missed while down.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Clock, CoreError, Time, WriterFence};
use spate_dstream::{DStreamError, RestorePolicy, StateFile};
use spate_logstore::{OffsetSeq, Verdict};
use spate_tracker::{ReceivedBlockTracker, event_log_dir};
use spate_wal::{FileWriteAheadLog, WalSettings};
use tracing::warn;

use crate::checkpoint_store::GraphManifest;
use crate::driver::{Engine, QueuedBatch, elapsed_ms};
use crate::error::RuntimeError;
use crate::inputs::ReceiverResume;

/// One operator whose state was restored from the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredOperator {
    /// The operator's stable name.
    pub name: String,
    /// The batch whose snapshot was loaded.
    pub snapshot_batch: BatchId,
    /// Files of changes applied after the whole snapshot the operator's
    /// chain starts at (0: the snapshot was whole).
    #[serde(default)]
    pub changes_applied: usize,
}

/// The account of a recovery, for the CLI to print and tests to check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecoveryReport {
    /// The checkpoint directory.
    pub checkpoint_dir: PathBuf,
    /// The writer epoch this context holds.
    pub writer_epoch: u64,
    /// Who held the lock before, when a dead holder's lock was taken over.
    pub took_over_from: Option<String>,
    /// The last committed batch found (`None`: nothing was committed yet).
    pub last_committed: Option<BatchId>,
    /// The batch logged in `offsets/` but not committed, re-run first with
    /// exactly its logged offsets.
    pub rerun_batch: Option<BatchId>,
    /// Batch times missed while the query was down, run after the re-run
    /// and before live batches.
    pub pending_batch_times: Vec<Time>,
    /// The first batch id that is planned anew.
    pub resumed_at: BatchId,
    /// Operators whose state was restored.
    pub restored_operators: Vec<RestoredOperator>,
    /// Operators of the running code that the checkpoint has no state for
    /// (new operators start empty).
    pub new_operators: Vec<String>,
    /// Operators the checkpoint has state for that the running code no
    /// longer has (their state is kept on disk, not loaded).
    pub dropped_operators: Vec<String>,
    /// Batches whose state had to be rebuilt by recomputing logged batches
    /// after the last snapshot, without running their outputs.
    pub replayed_for_state: Vec<BatchId>,
    /// Blocks the tracker had allocated or received that could not be read
    /// back (the receiver WAL was off or lost them), as the tracker names them.
    pub unrecoverable_blocks: Vec<String>,
    /// Milliseconds (wall clock) reading the operators' state snapshots.
    #[serde(default)]
    pub restore_ms: u64,
    /// Milliseconds (wall clock) recomputing [`RecoveryReport::replayed_for_state`].
    #[serde(default)]
    pub replay_ms: u64,
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.last_committed.is_none() && self.rerun_batch.is_none() && self.resumed_at == BatchId(0) {
            write!(f, "started checkpoint {} at batch 0", self.checkpoint_dir.display())?;
        } else {
            write!(f, "resumed from checkpoint {} at batch {}", self.checkpoint_dir.display(), self.resumed_at)?;
        }
        if let Some(rerun) = self.rerun_batch {
            write!(f, ", re-running uncommitted batch {rerun} with its logged offsets")?;
        }
        if !self.pending_batch_times.is_empty() {
            write!(f, ", {} batches missed while down", self.pending_batch_times.len())?;
        }
        if !self.restored_operators.is_empty() {
            let names: Vec<&str> = self.restored_operators.iter().map(|o| o.name.as_str()).collect();
            write!(f, "; restored state of {} in {} ms", names.join(", "), self.restore_ms)?;
        }
        if !self.replayed_for_state.is_empty() {
            write!(f, "; recomputed {} batches for state in {} ms", self.replayed_for_state.len(), self.replay_ms)?;
        }
        if !self.unrecoverable_blocks.is_empty() {
            write!(f, "; {} blocks could not be recovered", self.unrecoverable_blocks.len())?;
        }
        Ok(())
    }
}

/// Missed batch times run after a restart at most; older ones are skipped
/// (their input is read by the first batch that runs).
const MAX_PENDING_BATCHES: u64 = 1000;

/// Opens the block tracker's event log under `wal_root` and replays it.
/// Returns the tracker and the ids of the blocks it could not recover.
pub(crate) fn recover_tracker(
    dir: &Path,
    wal_root: &Path,
    clock: &Arc<dyn Clock>,
    fence: &Arc<dyn WriterFence>,
) -> Result<(Arc<ReceivedBlockTracker>, Vec<String>), RuntimeError> {
    let log_dir = event_log_dir(wal_root);
    let options = WalSettings::default().with_clock(Arc::clone(clock)).with_fence(Arc::clone(fence));
    let checkpoint_error = |message: String| RuntimeError::Checkpoint { dir: dir.to_path_buf(), message };
    let wal = FileWriteAheadLog::open(&log_dir, options).map_err(|e| checkpoint_error(e.to_string()))?;
    let (tracker, report) = ReceivedBlockTracker::recover(Arc::new(wal), log_dir, Arc::clone(clock))
        .map_err(|e| checkpoint_error(e.to_string()))?;
    let lost = report.unrecoverable.iter().map(|b| b.block_id.to_string()).collect();
    Ok((Arc::new(tracker), lost))
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
pub(crate) fn recover(
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
        restore_ms: 0,
        replay_ms: 0,
    };
    refuse_state_past_commit(&dir, manifest.as_ref(), logged.committed)?;
    // Wall-clock durations, for the report only: a restart at a million
    // keys spends seconds here, and the user is told where they went.
    let restoring = Instant::now();
    restore_state(engine, manifest.as_ref(), &mut report)?;
    report.restore_ms = elapsed_ms(restoring);
    let replaying = Instant::now();
    replay_committed(engine, logged.committed, &mut report)?;
    report.replay_ms = elapsed_ms(replaying);
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

/// Restores operator state from the snapshot the manifest names: each
/// operator's chain, its whole snapshot and the changes after it.
fn restore_state(
    engine: &mut Engine,
    manifest: Option<&GraphManifest>,
    report: &mut RecoveryReport,
) -> Result<(), RuntimeError> {
    let (Some(manifest), Some(store)) = (manifest, &engine.store) else { return Ok(()) };
    let (Some(batch), Some(time)) = (manifest.state_batch, manifest.state_batch_time) else { return Ok(()) };
    let (mut chains, mut starts, mut changes) = (Vec::new(), BTreeMap::new(), BTreeMap::new());
    for op in manifest.descriptor.operators.iter().filter(|op| op.stateful) {
        let chain = store.open_state_chain(&op.name, batch)?;
        starts.insert(op.name.clone(), chain.start);
        changes.insert(op.name.clone(), chain.files.len().saturating_sub(1));
        let files = chain.files.into_iter().map(|file| StateFile::new(move || Ok(file))).collect();
        chains.push((op.name.clone(), files));
    }
    let restored = engine.graph.restore_chains_from(&manifest.descriptor, chains, &RestorePolicy::strict()).map_err(
        |e| match e {
            // The storage failed while a file was read: not the graph's fault.
            DStreamError::StateDecode { operator, source: source @ CoreError::Read { .. } } => {
                RuntimeError::State { operator, batch, reason: source.to_string() }
            }
            e => RuntimeError::IncompatibleGraph { dir: store.dir().to_path_buf(), reason: e.to_string() },
        },
    )?;
    report.restored_operators = restored
        .resumed
        .into_iter()
        .map(|name| {
            let changes_applied = changes.get(&name).copied().unwrap_or(0);
            RestoredOperator { name, snapshot_batch: batch, changes_applied }
        })
        .collect();
    report.new_operators = restored.started_empty;
    report.dropped_operators = restored.dropped;
    // A dropped operator's chain stays on disk until a snapshot is taken without it.
    engine.chain.restored(batch, starts);
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
