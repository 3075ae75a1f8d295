//! What a context did when it started from an existing checkpoint.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Time};

/// One operator whose state was restored from the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredOperator {
    /// The operator's stable name.
    pub name: String,
    /// The batch whose snapshot was loaded.
    pub snapshot_batch: BatchId,
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
            write!(f, "; restored state of {}", names.join(", "))?;
        }
        if !self.unrecoverable_blocks.is_empty() {
            write!(f, "; {} blocks could not be recovered", self.unrecoverable_blocks.len())?;
        }
        Ok(())
    }
}
