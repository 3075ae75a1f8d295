//! Repair of an inconsistent checkpoint: a pure plan, then its application.
//!
//! [`plan_repair`] decides, from what inspection saw, which files to move
//! aside so the directory becomes consistent. Nothing is deleted: each file
//! goes to `_quarantine/<timestamp>/<its relative path>`, where a person can
//! look at it or move it back. The plan says where the next run will start
//! and which batches will run again, whose output may then be written twice
//! unless the sink is idempotent. [`apply_repair`] carries the plan out.

use std::fmt;
use std::path::{Path, PathBuf};

use spate_core::{BatchId, Time};
use tracing::info;

use crate::checkpoint::{COMMITS_DIR, OFFSETS_DIR};
use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, NO_FENCE, PublishCheck, parent_of};
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
    }
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
            // Unreadable files were moved before the loop; classify never returns this kind.
            InconsistencyKind::Unreadable { .. } => {}
        }
        moved
    }
}

impl RepairPlan {
    /// True when there is nothing to move.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
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
    apply_repair_fenced(files, plan, NO_FENCE)
}

/// [`apply_repair`] with `fence` checked immediately before each move and
/// before the note is written.
pub(crate) fn apply_repair_fenced(
    files: &dyn CheckpointFileManager,
    plan: &RepairPlan,
    fence: PublishCheck<'_>,
) -> Result<()> {
    for action in &plan.actions {
        let (from, to) = (plan.dir.join(&action.from), plan.dir.join(&action.to));
        if !files.exists(&from)? {
            return Err(LogStoreError::StalePlan { path: from, reason: "the file to move is gone".to_string() });
        }
        if files.exists(&to)? {
            return Err(LogStoreError::StalePlan { path: to, reason: "the quarantine target exists".to_string() });
        }
    }
    let quarantine = plan.dir.join(&plan.quarantine);
    files.mkdirs(&quarantine)?;
    for action in &plan.actions {
        let (from, to) = (plan.dir.join(&action.from), plan.dir.join(&action.to));
        files.mkdirs(parent_of(&to))?;
        files.rename_no_replace(&from, &to, fence)?;
        info!(from = %from.display(), to = %to.display(), reason = %action.reason, "moved to quarantine");
    }
    files.create_atomic(&quarantine.join(REPAIR_NOTE), plan.to_string().as_bytes(), fence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{CheckpointShape, files_involved};

    fn inconsistency(offsets: &[u64], commits: &[u64]) -> Inconsistency {
        let shape = CheckpointShape {
            offsets: offsets.iter().map(|i| BatchId(*i)).collect(),
            commits: commits.iter().map(|i| BatchId(*i)).collect(),
            unreadable: Vec::new(),
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
