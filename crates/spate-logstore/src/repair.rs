//! Repair of an inconsistent checkpoint: a pure plan, then its application.
//!
//! [`plan_repair`] decides, from what inspection saw, which files to move
//! aside so the directory becomes consistent. Nothing is deleted: each file
//! goes to `_quarantine/<timestamp>/<its relative path>`, where a person can
//! look at it or move it back. The plan says where the next run will start
//! and which batches will run again, whose output may then be written twice
//! unless the sink is idempotent. The operator state follows the logs: the
//! snapshots after the last kept commit are moved aside too, and `graph` is
//! rewritten to name an older snapshot the next start can bring up to date
//! by replaying the kept batches, or none (the state is then rebuilt from
//! batch 0), its original kept in quarantine; the plan says which, so what
//! it promises is what the next start does. [`apply_repair`] carries the
//! plan out.

use std::fmt;
use std::path::{Path, PathBuf};

use spate_core::{BatchId, Time};
use tracing::info;

use crate::checkpoint::{COMMITS_DIR, MAX_CHECKPOINT_FILE_BYTES, OFFSETS_DIR, with_epoch_line};
use crate::entries::OffsetSeq;
use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, NO_FENCE, PublishCheck, parent_of};
use crate::log::{MAX_LOG_FILE_BYTES, decode_entry};
use crate::state::{GRAPH_FILE, StateShape, renamed_graph};
use crate::verdict::{Inconsistency, InconsistencyKind, RecoveryPoint, classify, repair_command};

/// The directory, under a checkpoint, that holds files moved aside by repairs.
pub const QUARANTINE_DIR: &str = "_quarantine";
/// The note written into each quarantine directory, explaining the repair.
pub const REPAIR_NOTE: &str = "REPAIR.txt";

/// One step of a repair: move a file into quarantine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairAction {
    /// The file, relative to the checkpoint directory.
    pub from: PathBuf,
    /// Where it goes, relative to the checkpoint directory.
    pub to: PathBuf,
    /// Why it is moved.
    pub reason: String,
}

/// What [`plan_repair`] decided; display it to show a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairPlan {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// What was wrong.
    pub problem: String,
    /// The quarantine directory of this repair, relative to the checkpoint.
    pub quarantine: PathBuf,
    /// The moves, in order.
    pub actions: Vec<RepairAction>,
    /// Where the next run starts once the plan is applied.
    pub after: RecoveryPoint,
    /// Batches that ran (at least partly) before and will run again, first and last.
    pub rerun: Option<(BatchId, BatchId)>,
    /// Batches among them that had committed: their output is already written.
    pub recommitted: Vec<BatchId>,
    /// How `graph` changes when it names a snapshot after the last kept commit.
    pub state: Option<StateRollback>,
}

/// How a repair brings the operator state back to the last kept commit:
/// `graph` is rewritten to name an older snapshot, or none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateRollback {
    /// The snapshot `graph` named, after the last kept commit.
    pub from: BatchId,
    /// The older snapshot `graph` names instead (`None`: none).
    pub to: Option<BatchId>,
    /// The committed batches the next start replays to bring the state up
    /// to the last kept commit, first and last.
    pub replay: Option<(BatchId, BatchId)>,
    /// Why the next start cannot rebuild the state, when it cannot.
    pub unrecoverable: Option<String>,
}

/// The simulated state of the two logs while planning.
struct Logs {
    offsets: Vec<BatchId>,
    commits: Vec<BatchId>,
}

/// Plans the repair of `inconsistency`; `now` names the quarantine directory.
/// Pure: it reads and changes nothing.
pub fn plan_repair(inconsistency: &Inconsistency, now: Time) -> RepairPlan {
    let quarantine = Path::new(QUARANTINE_DIR).join(now.to_compact_utc());
    let shape = &inconsistency.shape;
    let mut logs = Logs { offsets: shape.offsets.clone(), commits: shape.commits.clone() };
    let mut actions = Vec::new();
    let mut quarantine_file = |relative: PathBuf, reason: String| {
        let to = quarantine.join(&relative);
        actions.push(RepairAction { from: relative, to, reason });
    };
    for (file, reason) in &shape.unreadable {
        logs.forget(file);
        quarantine_file(file.clone(), format!("unreadable: {reason}"));
    }
    // Each round moves at least one file, so this ends.
    let after = loop {
        match classify(&logs.offsets, &logs.commits) {
            Ok(point) => break point,
            Err(kind) => {
                for (file, reason) in logs.resolve(&kind) {
                    quarantine_file(file, reason);
                }
            }
        }
    };
    let kept_commit = logs.commits.last().copied();
    for file in shape.state.files_after(kept_commit) {
        quarantine_file(file, "state snapshot of a batch after the last kept commit".to_string());
    }
    let state = plan_state(&shape.state, kept_commit, &logs.offsets);
    let first_to_run = match after {
        RecoveryPoint::Fresh => BatchId(0),
        RecoveryPoint::Resume { next } => next,
        RecoveryPoint::Rerun { batch } => batch,
    };
    let last_seen = shape.offsets.iter().chain(&shape.commits).max().copied();
    let rerun = last_seen.filter(|last| *last >= first_to_run).map(|last| (first_to_run, last));
    let recommitted = shape.commits.iter().copied().filter(|id| *id >= first_to_run).collect();
    RepairPlan {
        dir: inconsistency.dir.clone(),
        problem: inconsistency.kind.to_string(),
        quarantine,
        actions,
        after,
        rerun,
        recommitted,
        state,
    }
}

/// The rollback of `graph` when it names a snapshot after `kept_commit`:
/// to the newest older snapshot of every operator whose following batches
/// have kept offsets to replay and whose time is known, or to none.
fn plan_state(state: &StateShape, kept_commit: Option<BatchId>, kept_offsets: &[BatchId]) -> Option<StateRollback> {
    let from = state.named.filter(|named| kept_commit.is_none_or(|c| *named > c))?;
    let Some(last) = kept_commit else {
        // Nothing committed is kept: nothing to replay.
        return Some(StateRollback { from, to: None, replay: None, unrecoverable: None });
    };
    let kept = |id: BatchId| kept_offsets.binary_search(&id).is_ok();
    let after = |id: BatchId| id.next().filter(|next| kept(*next));
    // The snapshot's time: from its offsets, or its successor's less the batch interval.
    let time_known = |id: BatchId| kept(id) || (state.batch_interval_ms.is_some() && after(id).is_some());
    let usable = |id: &BatchId| (*id == last || after(*id).is_some()) && time_known(*id);
    if let Some(to) = state.complete_at_or_before(last).into_iter().find(usable) {
        let replay = after(to).filter(|_| to < last).map(|first| (first, last));
        return Some(StateRollback { from, to: Some(to), replay, unrecoverable: None });
    }
    let unrecoverable = (!kept(BatchId(0))).then(|| {
        format!(
            "no older snapshot of every operator can be brought up to batch {last}, and the offsets before batch {} \
             were purged, so the state cannot be rebuilt by replaying from batch 0",
            kept_offsets.first().copied().unwrap_or_default()
        )
    });
    let replay = unrecoverable.is_none().then_some((BatchId(0), last));
    Some(StateRollback { from, to: None, replay, unrecoverable })
}

impl Logs {
    fn forget(&mut self, file: &Path) {
        let id = file.file_name().and_then(|n| n.to_str()).and_then(crate::log::parse_batch_file_name);
        let Some(id) = id else { return };
        if file.starts_with(OFFSETS_DIR) {
            self.offsets.retain(|x| *x != id);
        } else if file.starts_with(COMMITS_DIR) {
            self.commits.retain(|x| *x != id);
        }
    }

    /// Drops the files that cause `kind` and says which and why.
    fn resolve(&mut self, kind: &InconsistencyKind) -> Vec<(PathBuf, String)> {
        let mut moved = Vec::new();
        let mut take = |ids: &mut Vec<BatchId>, dir: &str, keep: &dyn Fn(BatchId) -> bool, why: &str| {
            for id in ids.iter().filter(|id| !keep(**id)) {
                moved.push((Path::new(dir).join(id.0.to_string()), why.to_string()));
            }
            ids.retain(|id| keep(*id));
        };
        match kind {
            InconsistencyKind::CommitAhead { last_offsets, .. } => {
                let keep = |id: BatchId| last_offsets.is_some_and(|o| id <= o);
                take(&mut self.commits, COMMITS_DIR, &keep, "commit without offsets");
            }
            InconsistencyKind::OffsetsGap { missing, .. } => {
                let keep = |id: BatchId| id < *missing;
                take(&mut self.offsets, OFFSETS_DIR, &keep, "offsets after a gap in the offsets log");
                take(&mut self.commits, COMMITS_DIR, &keep, "commit at or after a gap in the offsets log");
            }
            InconsistencyKind::CommitsGap { missing, .. } => {
                let keep = |id: BatchId| id < *missing;
                take(&mut self.commits, COMMITS_DIR, &keep, "commit after a gap in the commit log");
            }
            InconsistencyKind::GapBetween { last_commit, .. } => {
                // Keep the first uncommitted batch: it re-runs with its logged offsets.
                // (classify reports an id without a successor before any gap, so `next` exists.)
                let first_pending = match last_commit {
                    Some(c) => c.next().unwrap_or(*c),
                    None => self.offsets.first().copied().unwrap_or_default(),
                };
                let keep = |id: BatchId| id <= first_pending;
                take(&mut self.offsets, OFFSETS_DIR, &keep, "offsets of a batch after the first uncommitted one");
            }
            InconsistencyKind::IdOutOfRange { .. } => {
                let keep = |id: BatchId| id.next().is_some();
                let why = "batch id out of range: no batch could follow it";
                take(&mut self.offsets, OFFSETS_DIR, &keep, why);
                take(&mut self.commits, COMMITS_DIR, &keep, why);
            }
            // Unreadable files were moved before the loop, and the state after
            // it; classify never returns these kinds.
            InconsistencyKind::Unreadable { .. } | InconsistencyKind::StateAhead { .. } => {}
        }
        moved
    }
}

impl RepairPlan {
    /// True when there is nothing to move or rewrite.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty() && self.state.is_none()
    }
}

impl fmt::Display for StateRollback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Rewrite {GRAPH_FILE} (the original is kept in the quarantine): it names the operator state of batch {}, after the last kept commit; ",
            self.from
        )?;
        match self.to {
            Some(to) => write!(f, "it will name the state of batch {to}")?,
            None => write!(f, "it will name no state")?,
        }
        match (self.replay, &self.unrecoverable) {
            (_, Some(why)) => write!(f, ". Warning: the next run cannot rebuild the operator state: {why}"),
            (Some((first, last)), None) => {
                write!(f, ", and the next run rebuilds the state by replaying batches {first} to {last} (outputs off)")
            }
            (None, None) => write!(f, ", which is up to date with the last kept commit"),
        }
    }
}

impl fmt::Display for RepairPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Repair plan for checkpoint {}", self.dir.display())?;
        writeln!(f, "Problem: {}", self.problem)?;
        writeln!(f, "Move to {} (nothing is deleted):", self.quarantine.display())?;
        for action in &self.actions {
            writeln!(f, "  {} -> {}   ({})", action.from.display(), action.to.display(), action.reason)?;
        }
        if let Some(state) = &self.state {
            writeln!(f, "{state}")?;
        }
        writeln!(f, "After the repair the next run will {}.", self.after)?;
        if let Some((first, last)) = self.rerun {
            let span = if first == last { format!("Batch {first}") } else { format!("Batches {first} to {last}") };
            writeln!(
                f,
                "{span} ran before and will run again (offsets planned anew where theirs were moved); \
                 the output of these batches may be written twice unless the sink is idempotent or transactional."
            )?;
        }
        if !self.recommitted.is_empty() {
            let ids: Vec<String> = self.recommitted.iter().map(BatchId::to_string).collect();
            writeln!(f, "Committed before, so their output was complete and is written again: {}.", ids.join(", "))?;
        }
        if self.after == RecoveryPoint::Fresh {
            writeln!(f, "Warning: the next run starts from the sources' initial positions.")?;
        }
        write!(f, "To apply: {}", repair_command(&self.dir))
    }
}

/// Carries out `plan` on its directory: checks first that every file to move
/// is still there and no target exists (so a stale plan changes nothing),
/// then moves them and leaves a note explaining the repair. Call it only while
/// no writer runs (hold the writer lock: [`crate::Checkpoint::apply_repair`],
/// which also checks the writer's fence before each move).
pub fn apply_repair(files: &dyn CheckpointFileManager, plan: &RepairPlan) -> Result<()> {
    apply_repair_fenced(files, plan, NO_FENCE, None)
}

/// [`apply_repair`] with `fence` checked immediately before each move and
/// before the note is written; a rewritten `graph` carries `epoch` when given.
pub(crate) fn apply_repair_fenced(
    files: &dyn CheckpointFileManager,
    plan: &RepairPlan,
    fence: PublishCheck<'_>,
    epoch: Option<u64>,
) -> Result<()> {
    check_still_planned(files, plan)?;
    let quarantine = plan.dir.join(&plan.quarantine);
    files.mkdirs(&quarantine)?;
    for action in &plan.actions {
        let (from, to) = (plan.dir.join(&action.from), plan.dir.join(&action.to));
        files.mkdirs(parent_of(&to))?;
        files.rename_no_replace(&from, &to, fence)?;
        info!(from = %from.display(), to = %to.display(), reason = %action.reason, "moved to quarantine");
    }
    if let Some(state) = &plan.state {
        rewrite_graph(files, plan, state, fence, epoch)?;
    }
    files.create_atomic(&quarantine.join(REPAIR_NOTE), plan.to_string().as_bytes(), fence)
}

/// A stale plan changes nothing: every file to move or rewrite is still
/// there, and nothing is in its place in the quarantine.
fn check_still_planned(files: &dyn CheckpointFileManager, plan: &RepairPlan) -> Result<()> {
    let graph = plan.state.as_ref().map(|_| (PathBuf::from(GRAPH_FILE), plan.quarantine.join(GRAPH_FILE)));
    let moves = plan.actions.iter().map(|a| (a.from.clone(), a.to.clone())).chain(graph);
    for (from, to) in moves {
        let (from, to) = (plan.dir.join(from), plan.dir.join(to));
        if !files.exists(&from)? {
            return Err(LogStoreError::StalePlan { path: from, reason: "the file to move is gone".to_string() });
        }
        if files.exists(&to)? {
            return Err(LogStoreError::StalePlan { path: to, reason: "the quarantine target exists".to_string() });
        }
    }
    Ok(())
}

/// Keeps `graph` in the quarantine, then replaces it with one naming the
/// state the plan chose; the checkpoint has a `graph` at every moment.
fn rewrite_graph(
    files: &dyn CheckpointFileManager,
    plan: &RepairPlan,
    state: &StateRollback,
    fence: PublishCheck<'_>,
    epoch: Option<u64>,
) -> Result<()> {
    let path = plan.dir.join(GRAPH_FILE);
    let missing = || LogStoreError::StalePlan { path: path.clone(), reason: "the file to rewrite is gone".to_string() };
    let original = files.read(&path, MAX_CHECKPOINT_FILE_BYTES)?.ok_or_else(missing)?;
    let kept = plan.dir.join(&plan.quarantine).join(GRAPH_FILE);
    files.create_atomic(&kept, &original, fence)?;
    let named = match state.to {
        Some(batch) => Some((batch, snapshot_time(files, &plan.dir, batch)?)),
        None => None,
    };
    let body = renamed_graph(&path, &original, named)?;
    let bytes = match epoch {
        Some(epoch) => with_epoch_line(epoch, &body),
        None => body,
    };
    files.replace_atomic(&path, &bytes, fence)?;
    info!(graph = %path.display(), from = %state.from, to = ?state.to, "rewrote the state the graph names");
    Ok(())
}

/// The time of batch `batch`: from its offsets, or from the next batch's less the batch interval.
fn snapshot_time(files: &dyn CheckpointFileManager, dir: &Path, batch: BatchId) -> Result<Time> {
    let offsets = |id: BatchId| -> Result<Option<OffsetSeq>> {
        let path = dir.join(OFFSETS_DIR).join(id.0.to_string());
        files.read(&path, MAX_LOG_FILE_BYTES)?.map(|bytes| decode_entry(&path, &bytes)).transpose()
    };
    if let Some(own) = offsets(batch)? {
        return Ok(own.batch_timestamp);
    }
    let interval = crate::state::read_state_shape(files, dir).ok().and_then(|state| state.batch_interval_ms);
    let next = match batch.next() {
        Some(next) => offsets(next)?,
        None => None,
    };
    match (next, interval) {
        (Some(next), Some(interval)) => Ok(next.batch_timestamp - spate_core::Duration::from_millis(interval)),
        _ => Err(LogStoreError::StalePlan {
            path: dir.join(OFFSETS_DIR).join(batch.0.to_string()),
            reason: format!("the time of batch {batch} can no longer be found"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{CheckpointShape, files_involved};

    fn inconsistency(offsets: &[u64], commits: &[u64]) -> Inconsistency {
        let shape = CheckpointShape {
            offsets: offsets.iter().map(|i| BatchId(*i)).collect(),
            commits: commits.iter().map(|i| BatchId(*i)).collect(),
            ..CheckpointShape::default()
        };
        let kind = classify(&shape.offsets, &shape.commits).unwrap_err();
        let files = files_involved(&kind, &shape);
        Inconsistency { dir: PathBuf::from("/ck"), kind, files, shape }
    }

    fn moved(plan: &RepairPlan) -> Vec<String> {
        plan.actions.iter().map(|a| a.from.display().to_string()).collect()
    }

    #[test]
    fn commit_ahead_moves_the_commit_and_replans_the_batch() {
        let plan = plan_repair(&inconsistency(&[0, 1, 2], &[0, 1, 2, 3]), Time::from_millis(1_700_000_000_000));
        assert_eq!(moved(&plan), ["commits/3"]);
        assert_eq!(plan.actions[0].to, PathBuf::from("_quarantine/20231114T221320.000Z/commits/3"));
        assert_eq!(plan.after, RecoveryPoint::Resume { next: BatchId(3) });
        assert_eq!(plan.rerun, Some((BatchId(3), BatchId(3))));
        assert_eq!(plan.recommitted, vec![BatchId(3)]);
        let text = plan.to_string();
        assert!(text.contains("idempotent") && text.contains("spate checkpoint repair /ck --apply"), "{text}");
    }

    #[test]
    fn gaps_keep_everything_before_them() {
        let plan = plan_repair(&inconsistency(&[0, 1, 3, 4], &[0, 1, 3]), Time::ZERO);
        assert_eq!(moved(&plan), ["offsets/3", "offsets/4", "commits/3"]);
        assert_eq!(plan.after, RecoveryPoint::Resume { next: BatchId(2) });

        let plan = plan_repair(&inconsistency(&[0, 1, 2, 3], &[0, 2]), Time::ZERO);
        assert_eq!(moved(&plan), ["commits/2", "offsets/2", "offsets/3"]);
        assert_eq!(plan.after, RecoveryPoint::Rerun { batch: BatchId(1) });

        let plan = plan_repair(&inconsistency(&[0, 1, 2, 3], &[0]), Time::ZERO);
        assert_eq!(moved(&plan), ["offsets/2", "offsets/3"]);
        assert_eq!(plan.after, RecoveryPoint::Rerun { batch: BatchId(1) });
        assert_eq!(plan.rerun, Some((BatchId(1), BatchId(3))));
        assert!(plan.recommitted.is_empty());
    }

    #[test]
    fn commits_without_offsets_leave_a_fresh_start_with_a_warning() {
        let plan = plan_repair(&inconsistency(&[], &[0, 1]), Time::ZERO);
        assert_eq!(moved(&plan), ["commits/0", "commits/1"]);
        assert_eq!(plan.after, RecoveryPoint::Fresh);
        assert!(plan.to_string().contains("initial positions"));
    }
}
