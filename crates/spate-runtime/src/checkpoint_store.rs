//! The runtime's side of a checkpoint directory: the offsets and commit logs
//! through `spate-logstore`, the `graph` manifest and the operator state
//! snapshots `state/<operator>/<N>`, and purging past retention.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Time, Unfenced, WriterFence};
use spate_dstream::GraphDescriptor;
use spate_logstore::{Checkpoint, CommitMetadata, LogStoreError, OffsetSeq, Verdict};
use tracing::{debug, warn};

use crate::error::RuntimeError;

/// The `graph` file: the graph's descriptor and the batch of the state
/// snapshot taken with it. Data, never code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GraphManifest {
    /// The graph as it was when the state was taken.
    pub(crate) descriptor: GraphDescriptor,
    /// The batch after which the state in `state/<operator>/<N>` was taken.
    pub(crate) state_batch: Option<BatchId>,
    /// That batch's time.
    pub(crate) state_batch_time: Option<Time>,
}

const GRAPH_FILE: &str = "graph";
const STATE_DIR: &str = "state";

/// A checkpoint directory opened for writing by this context.
pub(crate) struct CheckpointStore {
    checkpoint: Checkpoint,
}

impl CheckpointStore {
    pub(crate) fn new(checkpoint: Checkpoint) -> Self {
        CheckpointStore { checkpoint }
    }

    pub(crate) fn dir(&self) -> &Path {
        self.checkpoint.dir()
    }

    pub(crate) fn error(&self, e: LogStoreError) -> RuntimeError {
        log_store_error(self.dir(), e)
    }

    pub(crate) fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// This writer's fence, for what is written under the checkpoint
    /// outside the log store (the WALs, the progress files). A checkpoint
    /// opened for writing always has one; the unfenced fallback is for a
    /// read-only one, which writes nothing.
    pub(crate) fn fence(&self) -> Arc<dyn WriterFence> {
        match self.checkpoint.fence() {
            Some(fence) => fence,
            None => Arc::new(Unfenced),
        }
    }

    /// The recovery verdict, refusing an inconsistent directory.
    pub(crate) fn consistent_verdict(&self) -> Result<Verdict, RuntimeError> {
        self.checkpoint.verdict().and_then(Verdict::into_consistent).map_err(|e| self.error(e))
    }

    /// Writes `offsets/<batch>` durably; refuses to overwrite. First renews
    /// the writer's lease when one is due (a checkpoint in an object store).
    pub(crate) fn write_offsets(&self, batch: BatchId, offsets: &OffsetSeq) -> Result<(), RuntimeError> {
        self.checkpoint.renew_lease_if_due().map_err(|e| self.error(e))?;
        let written = self.checkpoint.offsets().add(batch, offsets).map_err(|e| self.error(e))?;
        if written {
            return Ok(());
        }
        // Already there: only acceptable when it is exactly what we meant to write.
        match self.checkpoint.offsets().get(batch).map_err(|e| self.error(e))? {
            Some(existing) if existing == *offsets => Ok(()),
            _ => Err(RuntimeError::Checkpoint {
                dir: self.dir().to_path_buf(),
                message: format!("offsets/{batch} already exists with other content; another writer may have run"),
            }),
        }
    }

    /// The logged offsets of `batch`.
    pub(crate) fn read_offsets(&self, batch: BatchId) -> Result<OffsetSeq, RuntimeError> {
        self.checkpoint.offsets().get(batch).map_err(|e| self.error(e))?.ok_or_else(|| RuntimeError::Checkpoint {
            dir: self.dir().to_path_buf(),
            message: format!("offsets/{batch} is needed to rebuild state but is missing"),
        })
    }

    /// Writes `commits/<batch>` durably.
    pub(crate) fn write_commit(&self, batch: BatchId) -> Result<(), RuntimeError> {
        let written = self.checkpoint.commits().add(batch, &CommitMetadata::default()).map_err(|e| self.error(e))?;
        if !written {
            return Err(RuntimeError::Checkpoint {
                dir: self.dir().to_path_buf(),
                message: format!("commits/{batch} already exists; another writer may have run"),
            });
        }
        Ok(())
    }

    /// The `graph` manifest, if one was written.
    pub(crate) fn read_manifest(&self) -> Result<Option<GraphManifest>, RuntimeError> {
        let Some(bytes) = self.checkpoint.read_file(GRAPH_FILE).map_err(|e| self.error(e))? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| RuntimeError::Checkpoint {
            dir: self.dir().to_path_buf(),
            message: format!("{GRAPH_FILE} does not parse: {e}"),
        })
    }

    /// Replaces the `graph` manifest (after the state files it names are durable).
    pub(crate) fn write_manifest(&self, manifest: &GraphManifest) -> Result<(), RuntimeError> {
        let bytes = serde_json::to_vec_pretty(manifest).map_err(|e| RuntimeError::Checkpoint {
            dir: self.dir().to_path_buf(),
            message: format!("cannot encode {GRAPH_FILE}: {e}"),
        })?;
        self.checkpoint.replace_file(GRAPH_FILE, &bytes).map_err(|e| self.error(e))
    }

    fn state_path(operator: &str, batch: BatchId) -> PathBuf {
        Path::new(STATE_DIR).join(operator).join(batch.0.to_string())
    }

    /// Writes one operator's snapshot taken after `batch`; returns its size.
    pub(crate) fn write_state(&self, operator: &str, batch: BatchId, bytes: &[u8]) -> Result<(), RuntimeError> {
        match self.checkpoint.write_file(Self::state_path(operator, batch), bytes) {
            Ok(()) => Ok(()),
            // A previous run crashed after writing it; the state of a committed batch is the same.
            Err(LogStoreError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(state_error(operator, batch, e)),
        }
    }

    /// Reads one operator's snapshot taken after `batch`.
    pub(crate) fn read_state(&self, operator: &str, batch: BatchId) -> Result<Vec<u8>, RuntimeError> {
        match self.checkpoint.read_file(Self::state_path(operator, batch)) {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(RuntimeError::State {
                operator: operator.to_string(),
                batch,
                reason: format!("state/{operator}/{batch} is missing"),
            }),
            Err(e) => Err(state_error(operator, batch, e)),
        }
    }

    /// Deletes snapshots older than `keep` (the one in the manifest is never older).
    pub(crate) fn purge_state(&self, keep: BatchId) {
        let operators = match self.checkpoint.list(STATE_DIR) {
            Ok(operators) => operators,
            Err(e) => return warn!(error = %e, "listing state snapshots failed"),
        };
        for operator in operators {
            let Ok(batches) = self.checkpoint.list(Path::new(STATE_DIR).join(&operator)) else { continue };
            for batch in batches.iter().filter_map(|b| b.parse::<u64>().ok()).filter(|b| *b < keep.0) {
                if let Err(e) = self.checkpoint.delete_file(Self::state_path(&operator, BatchId(batch))) {
                    warn!(error = %e, operator, batch, "deleting an old state snapshot failed");
                }
            }
        }
    }

    /// Deletes offsets and commits before `threshold` (offsets first, so the
    /// commit log is never ahead).
    pub(crate) fn purge_logs(&self, threshold: BatchId) {
        if threshold == BatchId(0) {
            return;
        }
        let purged = self
            .checkpoint
            .offsets()
            .purge(threshold)
            .and_then(|offsets| self.checkpoint.commits().purge(threshold).map(|commits| (offsets, commits)));
        match purged {
            Ok((offsets, commits)) => debug!(%threshold, offsets, commits, "purged old batches"),
            Err(e) => warn!(error = %e, %threshold, "purging old batches failed; retried after the next batch"),
        }
    }
}

fn state_error(operator: &str, batch: BatchId, e: LogStoreError) -> RuntimeError {
    RuntimeError::State { operator: operator.to_string(), batch, reason: e.to_string() }
}

/// Maps a log store error: a held lock becomes [`RuntimeError::Locked`]
/// naming the holder, a lock taken over by another writer
/// [`RuntimeError::TakenOver`], an inconsistent directory
/// [`RuntimeError::Inconsistent`] (its message names the files and the
/// repair command); everything else keeps the log store's message.
pub(crate) fn log_store_error(dir: &Path, e: LogStoreError) -> RuntimeError {
    match e {
        LogStoreError::Locked { dir, holder } => RuntimeError::Locked { dir, holder },
        stale @ LogStoreError::StaleEpoch { .. } => {
            RuntimeError::TakenOver { dir: dir.to_path_buf(), message: stale.to_string() }
        }
        LogStoreError::Inconsistent(inconsistency) => RuntimeError::Inconsistent(inconsistency),
        other => RuntimeError::Checkpoint { dir: dir.to_path_buf(), message: other.to_string() },
    }
}

#[cfg(all(test, feature = "s3"))]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use spate_core::ManualClock;
    use spate_logstore::{CheckpointSettings, LeaseSettings, ObjectStoreFileManager};

    const LOCATION: &str = "s3://bucket/ck";

    /// A checkpoint in an in-memory object store (the same keys as S3).
    fn store_in_memory() -> CheckpointStore {
        let files = ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", Arc::new(InMemory::new())).unwrap();
        let lease = LeaseSettings { renew_in_background: false, ..LeaseSettings::default() };
        let options = CheckpointSettings::new()
            .with_clock(Arc::new(ManualClock::new(Time::from_millis(0))))
            .with_file_manager(Arc::new(files))
            .with_lease(lease);
        CheckpointStore::new(Checkpoint::open_for_write(LOCATION, options).unwrap())
    }

    #[test]
    fn old_snapshots_in_an_object_store_are_purged_whatever_the_operator_is_called() {
        let store = store_in_memory();
        // Each of these needs percent-encoding in an object key.
        let operators = ["counts[by word]", "top~10", "50% sample", "plain"];
        for operator in operators {
            for batch in 0..3 {
                store.write_state(operator, BatchId(batch), b"state").unwrap();
            }
        }
        store.purge_state(BatchId(2));
        for operator in operators {
            let left = store.checkpoint().list(Path::new(STATE_DIR).join(operator)).unwrap();
            assert_eq!(left, ["2"], "{operator}: the snapshots before batch 2 are purged");
            assert_eq!(store.read_state(operator, BatchId(2)).unwrap(), b"state");
        }
    }
}
