//! The runtime's side of a checkpoint directory: the offsets and commit logs
//! through `spate-logstore`, the `graph` manifest and the operator state
//! snapshots `state/<operator>/<N>`, and purging past retention.
//!
//! A state snapshot is whole (the operator's frame) or the changes since
//! the previous snapshot (a header naming that snapshot's batch, then the
//! frame), so each operator's snapshot is a chain: a whole snapshot and the
//! changes after it. [`SnapshotChain`] decides which to take and remembers
//! where each operator's chain starts, so a purge keeps every link.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, ReadSeek, SeekWrite, Time, Unfenced, WriterFence};
use spate_dstream::{GraphDescriptor, StateWriter};
use spate_logstore::{
    CHANGES_HEADER_LEN, Checkpoint, CommitMetadata, LogStoreError, OffsetSeq, PARTS_SUFFIX, StateLink, Verdict,
    changes_header, split_state_file,
};
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

    /// Writes one operator's snapshot taken after `batch`, streamed from
    /// the operator to the file, so a state larger than memory is never in
    /// memory whole: a whole one as it is, changes behind a header naming
    /// `base`, the batch of the snapshot they follow. Returns the bytes
    /// written.
    pub(crate) fn write_state_streamed(
        &self,
        operator: &str,
        batch: BatchId,
        state: &mut StateWriter<'_>,
        base: Option<BatchId>,
    ) -> Result<u64, RuntimeError> {
        let header = match (state.is_changes(), base) {
            (false, _) => None,
            (true, Some(base)) => Some(changes_header(base)),
            (true, None) => {
                let reason = "changes taken without a snapshot before them".to_string();
                return Err(RuntimeError::State { operator: operator.to_string(), batch, reason });
            }
        };
        let mut failure = None;
        let written = self.write_state_file(operator, batch, |path| {
            // The operator's own error is kept whole; the file manager only
            // needs to know that the content failed.
            let mut content = |out: &mut dyn SeekWrite| {
                if let Some(header) = &header {
                    out.write_all(header)?;
                }
                state.write_to(out).map(drop).map_err(|e| {
                    failure = Some(e);
                    std::io::Error::other("the operator's state did not encode")
                })
            };
            self.checkpoint.write_file_streamed(path, &mut content)
        });
        match failure {
            Some(e) => Err(RuntimeError::State { operator: operator.to_string(), batch, reason: e.to_string() }),
            None => written,
        }
    }

    /// Writes `state/<operator>/<batch>` with `write`.
    fn write_state_file(
        &self,
        operator: &str,
        batch: BatchId,
        mut write: impl FnMut(&Path) -> Result<u64, LogStoreError>,
    ) -> Result<u64, RuntimeError> {
        let path = Self::state_path(operator, batch);
        match write(&path) {
            Ok(written) => Ok(written),
            // A previous run wrote it and crashed before `graph` named it, so
            // nothing needs it; it may be a link of another chain, so it is
            // replaced rather than kept.
            Err(LogStoreError::AlreadyExists { .. }) => {
                debug!(operator, %batch, "replacing a state snapshot no manifest named");
                self.checkpoint.delete_streamed_file(&path).map_err(|e| state_error(operator, batch, e))?;
                write(&path).map_err(|e| state_error(operator, batch, e))
            }
            Err(e) => Err(state_error(operator, batch, e)),
        }
    }

    /// Opens one operator's snapshot of `batch` and the links before it,
    /// back to a whole snapshot, each file read only as far as its header:
    /// the files oldest first, each at the start of its frame, as
    /// `Graph::restore_chains_from` reads them.
    pub(crate) fn open_state_chain(&self, operator: &str, batch: BatchId) -> Result<StateChain, RuntimeError> {
        let mut files = Vec::new();
        let (mut link, mut needed_by) = (batch, None::<BatchId>);
        loop {
            let error = |reason: String| RuntimeError::State {
                operator: operator.to_string(),
                batch: needed_by.unwrap_or(batch),
                reason,
            };
            let mut file = match self.checkpoint.open_file(Self::state_path(operator, link)) {
                Ok(Some(file)) => file,
                Ok(None) => {
                    return Err(error(match needed_by {
                        None => format!("state/{operator}/{link} is missing"),
                        Some(by) => format!(
                            "state/{operator}/{link} is missing, and state/{operator}/{by} holds the changes since \
                             it (a link of the snapshot of batch {batch})"
                        ),
                    }));
                }
                Err(e) => return Err(state_error(operator, link, e)),
            };
            let kind =
                read_link_kind(&mut *file).map_err(|reason| error(format!("state/{operator}/{link}: {reason}")))?;
            match kind {
                StateLink::Changes { base } if base < link => {
                    files.push(file);
                    (needed_by, link) = (Some(link), base);
                }
                StateLink::Changes { base } => {
                    return Err(error(format!(
                        "state/{operator}/{link} holds changes since batch {base}, which is not an earlier snapshot"
                    )));
                }
                StateLink::Whole => {
                    files.push(file);
                    files.reverse();
                    return Ok(StateChain { files, start: link });
                }
                StateLink::Unreadable { reason } => return Err(error(format!("state/{operator}/{link}: {reason}"))),
            }
        }
    }

    /// Deletes the snapshots no restart can need: of each operator, those
    /// older than the whole snapshot its chain in force starts at
    /// (`chain_starts`; an operator not in it, one the graph no longer
    /// has, keeps nothing older than `keep`, the snapshot `graph` names).
    /// Newer files, written but not yet named, are kept.
    pub(crate) fn purge_state(&self, keep: BatchId, chain_starts: &BTreeMap<String, BatchId>) {
        let operators = match self.checkpoint.list(STATE_DIR) {
            Ok(operators) => operators,
            Err(e) => return warn!(error = %e, "listing state snapshots failed"),
        };
        for operator in operators {
            let oldest_needed = chain_starts.get(&operator).map_or(keep, |start| (*start).min(keep));
            let Ok(names) = self.checkpoint.list(Path::new(STATE_DIR).join(&operator)) else { continue };
            // A snapshot, or the parts an upload of one left on an object
            // store (`<batch>.parts`) without publishing it: deleting the
            // snapshot takes those too.
            let batches: BTreeSet<u64> =
                names.iter().filter_map(|name| name.strip_suffix(PARTS_SUFFIX).unwrap_or(name).parse().ok()).collect();
            for batch in batches.into_iter().filter(|b| *b < oldest_needed.0) {
                if let Err(e) = self.checkpoint.delete_streamed_file(Self::state_path(&operator, BatchId(batch))) {
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

/// One operator's snapshot as a chain: a whole snapshot, then the changes
/// after it, oldest first.
pub(crate) struct StateChain {
    /// The files, the whole snapshot first, each at the start of its frame
    /// (open, read only as far as its header).
    pub(crate) files: Vec<Box<dyn ReadSeek>>,
    /// The batch of the whole snapshot the chain starts at.
    pub(crate) start: BatchId,
}

impl std::fmt::Debug for StateChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateChain").field("files", &self.files.len()).field("start", &self.start).finish()
    }
}

/// What a state file is, from its first bytes; `file` is left at the start
/// of its frame (after the header of a file of changes).
fn read_link_kind(file: &mut dyn ReadSeek) -> Result<StateLink, String> {
    let frame_start = file.stream_position().map_err(|e| format!("cannot tell its position: {e}"))?;
    let mut head = Vec::with_capacity(CHANGES_HEADER_LEN);
    Read::take(&mut *file, CHANGES_HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(|e| format!("cannot be read: {e}"))?;
    let (kind, _) = split_state_file(&head)?;
    if kind == StateLink::Whole {
        file.seek(SeekFrom::Start(frame_start)).map_err(|e| format!("cannot be read again: {e}"))?;
    }
    Ok(kind)
}

/// Which snapshot to take next, whole or the changes since the previous
/// one, and where each operator's chain in force starts.
///
/// A snapshot of changes needs its base durable and named where a restore
/// finds it, so a whole snapshot is taken first after a start or a restore
/// (a chain never starts from something this process did not write or
/// restore), every `full_every`-th time (so a restore reads a bounded
/// chain), and after a snapshot that was not completed (its changes were
/// taken relative to a snapshot that may not be durable).
#[derive(Debug)]
pub(crate) struct SnapshotChain {
    full_every: u64,
    /// Snapshots of changes taken since the last whole one.
    changes_since_whole: u64,
    /// The last snapshot completed (written and named in `graph`) or restored.
    last: Option<BatchId>,
    /// True until a snapshot completes: set when one begins.
    whole_due: bool,
    /// Each operator's whole snapshot that its chain in force starts at.
    starts: BTreeMap<String, BatchId>,
}

impl SnapshotChain {
    /// No snapshot yet; the first will be whole. `full_every` 0 counts as 1.
    pub(crate) fn new(full_every: u64) -> Self {
        SnapshotChain {
            full_every: full_every.max(1),
            changes_since_whole: 0,
            last: None,
            whole_due: true,
            starts: BTreeMap::new(),
        }
    }

    /// The state was restored from the snapshot of `batch`, each operator's
    /// chain starting at `starts`.
    pub(crate) fn restored(&mut self, batch: BatchId, starts: BTreeMap<String, BatchId>) {
        self.last = Some(batch);
        self.starts = starts;
        self.whole_due = true;
    }

    /// Begins a snapshot: `None` when it must be whole, else the batch of
    /// the snapshot its changes follow. Until [`SnapshotChain::completed`],
    /// the next one is whole.
    pub(crate) fn begin(&mut self) -> Option<BatchId> {
        let whole = self.whole_due || self.changes_since_whole + 1 >= self.full_every;
        self.whole_due = true;
        self.last.filter(|_| !whole)
    }

    /// The snapshot of `batch` begun last is durable and named in `graph`.
    /// `states` names each operator snapshotted, true where it wrote changes.
    pub(crate) fn completed(&mut self, batch: BatchId, states: &[(String, bool)]) {
        let mut starts = BTreeMap::new();
        for (operator, changes) in states {
            let start = if *changes { self.starts.get(operator).copied().unwrap_or(batch) } else { batch };
            starts.insert(operator.clone(), start);
        }
        let any_changes = states.iter().any(|(_, changes)| *changes);
        self.changes_since_whole = if any_changes { self.changes_since_whole + 1 } else { 0 };
        self.starts = starts;
        self.last = Some(batch);
        self.whole_due = false;
    }

    /// Each operator's whole snapshot that its chain in force starts at.
    pub(crate) fn starts(&self) -> &BTreeMap<String, BatchId> {
        &self.starts
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

#[cfg(test)]
use spate_dstream::StateSnapshot;

/// Chains of the tests' own bytes.
#[cfg(test)]
impl CheckpointStore {
    /// Writes one operator's snapshot taken after `batch` from its bytes:
    /// a whole one as it is, changes behind a header naming `base`, as
    /// [`CheckpointStore::write_state_streamed`] writes an operator's.
    pub(crate) fn write_state(
        &self,
        operator: &str,
        batch: BatchId,
        snapshot: &StateSnapshot,
        base: Option<BatchId>,
    ) -> Result<u64, RuntimeError> {
        let changes;
        let bytes = match (snapshot, base) {
            (StateSnapshot::Whole(bytes), _) => bytes.as_slice(),
            (StateSnapshot::Changes(frame), Some(base)) => {
                changes = [changes_header(base).as_slice(), frame].concat();
                changes.as_slice()
            }
            (StateSnapshot::Changes(_), None) => {
                let reason = "changes taken without a snapshot before them".to_string();
                return Err(RuntimeError::State { operator: operator.to_string(), batch, reason });
            }
        };
        self.write_state_file(operator, batch, |path| {
            self.checkpoint.write_file(path, bytes).map(|()| bytes.len() as u64)
        })
    }
}

#[cfg(all(test, feature = "s3"))]
mod tests {
    use super::*;
    use object_store::ObjectStore;
    use object_store::memory::InMemory;
    use spate_core::ManualClock;
    use spate_logstore::{CheckpointFileManager, CheckpointSettings, LeaseSettings, ObjectStoreFileManager};

    const LOCATION: &str = "s3://bucket/ck";

    /// A chain's frames, read whole.
    pub(super) fn frames(chain: StateChain) -> Vec<Vec<u8>> {
        let read = |mut file: Box<dyn ReadSeek>| {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).unwrap();
            bytes
        };
        chain.files.into_iter().map(read).collect()
    }

    /// A checkpoint in an in-memory object store (the same keys as S3).
    fn store_in_memory() -> CheckpointStore {
        store_in_memory_with_parts(Arc::new(InMemory::new()), 8 << 20)
    }

    /// A checkpoint in `objects`, streamed files uploaded in parts of `part_bytes`.
    fn store_in_memory_with_parts(objects: Arc<dyn ObjectStore>, part_bytes: usize) -> CheckpointStore {
        let files =
            ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", objects).unwrap().with_part_bytes(part_bytes);
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
        let whole = StateSnapshot::Whole(b"state".to_vec());
        for operator in operators {
            for batch in 0..3 {
                store.write_state(operator, BatchId(batch), &whole, None).unwrap();
            }
        }
        store.purge_state(BatchId(2), &BTreeMap::new());
        for operator in operators {
            let left = store.checkpoint().list(Path::new(STATE_DIR).join(operator)).unwrap();
            assert_eq!(left, ["2"], "{operator}: the snapshots before batch 2 are purged");
            assert_eq!(frames(store.open_state_chain(operator, BatchId(2)).unwrap()), [b"state"]);
        }
    }

    #[test]
    fn snapshots_in_parts_and_parts_an_upload_left_are_purged_with_their_batch() {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let store = store_in_memory_with_parts(Arc::clone(&objects), 1000);
        let snapshot = vec![5u8; 2500];
        for batch in [0, 2] {
            let path = CheckpointStore::state_path("op", BatchId(batch));
            store.checkpoint().write_file_streamed(path, &mut |out| out.write_all(&snapshot)).unwrap();
        }
        // Uploads that crashed before their manifest: batch 1's is old, batch 3's may be under way.
        for batch in [1, 3] {
            store.checkpoint().write_file(format!("{STATE_DIR}/op/{batch}.parts/crashed-1"), b"part").unwrap();
        }
        store.purge_state(BatchId(2), &BTreeMap::new());
        let files = ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", objects).unwrap();
        let mut left: Vec<String> = files
            .list_files_recursive(&Path::new(LOCATION).join(STATE_DIR).join("op"))
            .unwrap()
            .into_iter()
            // A part's name: its directory and its index.
            .map(|(path, _)| {
                let name = path.display().to_string();
                name.split_once('/').map_or(name.clone(), |(dir, part)| {
                    format!("{dir}/{}", part.rsplit('-').next().unwrap_or_default())
                })
            })
            .collect();
        left.sort();
        assert_eq!(left, ["2", "2.parts/0", "2.parts/1", "2.parts/2", "3.parts/1"], "what batches 2 and 3 need");
        let chain = frames(store.open_state_chain("op", BatchId(2)).unwrap());
        assert!(chain == [snapshot], "batch 2's snapshot is restored through its parts");
    }
}

#[cfg(test)]
mod chain_tests {
    use super::tests::frames;
    use super::*;
    use spate_logstore::CheckpointSettings;

    fn store(dir: &Path) -> CheckpointStore {
        CheckpointStore::new(Checkpoint::open_for_write(dir, CheckpointSettings::new()).unwrap())
    }

    fn whole(text: &str) -> StateSnapshot {
        StateSnapshot::Whole(text.as_bytes().to_vec())
    }

    fn changes(text: &str) -> StateSnapshot {
        StateSnapshot::Changes(text.as_bytes().to_vec())
    }

    fn left(store: &CheckpointStore, operator: &str) -> Vec<u64> {
        let mut batches: Vec<u64> = store
            .checkpoint()
            .list(Path::new(STATE_DIR).join(operator))
            .unwrap()
            .iter()
            .map(|b| b.parse().unwrap())
            .collect();
        batches.sort_unstable();
        batches
    }

    #[test]
    fn a_chain_is_read_back_from_its_last_link_to_its_whole_snapshot_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        assert_eq!(store.write_state("a", BatchId(2), &whole("w2"), None).unwrap(), 2);
        store.write_state("a", BatchId(4), &changes("c4"), Some(BatchId(2))).unwrap();
        let written = store.write_state("a", BatchId(6), &changes("c6"), Some(BatchId(4))).unwrap();
        assert_eq!(written, CHANGES_HEADER_LEN as u64 + 2, "the header, then the frame");
        let chain = store.open_state_chain("a", BatchId(6)).unwrap();
        assert_eq!(chain.start, BatchId(2));
        assert_eq!(frames(chain), [b"w2", b"c4", b"c6"]);
        // A whole snapshot is its own chain, and its file is the bare frame.
        let chain = store.open_state_chain("a", BatchId(2)).unwrap();
        assert_eq!(chain.start, BatchId(2));
        assert_eq!(frames(chain), [b"w2"]);
        assert_eq!(std::fs::read(dir.path().join("state/a/2")).unwrap(), b"w2");
    }

    #[test]
    fn a_missing_link_names_the_file_and_the_batch_that_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store.write_state("a", BatchId(4), &changes("c4"), Some(BatchId(2))).unwrap();
        store.write_state("a", BatchId(6), &changes("c6"), Some(BatchId(4))).unwrap();
        let err = store.open_state_chain("a", BatchId(6)).unwrap_err();
        assert!(matches!(&err, RuntimeError::State { operator, batch: BatchId(4), .. } if operator == "a"), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("state/a/2 is missing") && text.contains("state/a/4 holds the changes"), "{text}");
        let err = store.open_state_chain("a", BatchId(8)).unwrap_err();
        assert!(err.to_string().contains("state/a/8 is missing"), "{err}");
    }

    #[test]
    fn a_link_to_a_base_that_is_not_older_or_a_damaged_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store.write_state("a", BatchId(4), &changes("c4"), Some(BatchId(4))).unwrap();
        let err = store.open_state_chain("a", BatchId(4)).unwrap_err();
        assert!(err.to_string().contains("not an earlier snapshot"), "{err}");
        let mut damaged = changes_header(BatchId(2)).to_vec();
        damaged[6] ^= 0xff;
        store.checkpoint().write_file("state/b/4", &damaged).unwrap();
        let err = store.open_state_chain("b", BatchId(4)).unwrap_err();
        assert!(err.to_string().contains("state/b/4: the header of changes fails its checksum"), "{err}");
    }

    #[test]
    fn changes_without_a_base_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = store(dir.path()).write_state("a", BatchId(4), &changes("c4"), None).unwrap_err();
        assert!(err.to_string().contains("without a snapshot before them"), "{err}");
    }

    #[test]
    fn a_snapshot_a_crashed_run_left_unnamed_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store.write_state("a", BatchId(6), &changes("old"), Some(BatchId(4))).unwrap();
        store.write_state("a", BatchId(6), &whole("new"), None).unwrap();
        assert_eq!(frames(store.open_state_chain("a", BatchId(6)).unwrap()), [b"new"]);
    }

    #[test]
    fn a_purge_keeps_every_link_of_the_chains_in_force_and_what_is_newer() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        // `a` takes changes: whole at 0 and 2, changes at 4 and 6, and at 8 (not named yet).
        for batch in [0, 2] {
            store.write_state("a", BatchId(batch), &whole("w"), None).unwrap();
        }
        for batch in [4, 6, 8] {
            store.write_state("a", BatchId(batch), &changes("c"), Some(BatchId(batch - 2))).unwrap();
        }
        // `b` snapshots whole; `gone` is an operator the graph no longer has.
        for batch in [0, 2, 4, 6, 8] {
            store.write_state("b", BatchId(batch), &whole("w"), None).unwrap();
            store.write_state("gone", BatchId(batch), &whole("w"), None).unwrap();
        }
        let starts = BTreeMap::from([("a".to_string(), BatchId(2)), ("b".to_string(), BatchId(6))]);
        store.purge_state(BatchId(6), &starts);
        assert_eq!(left(&store, "a"), [2, 4, 6, 8]);
        assert_eq!(left(&store, "b"), [6, 8]);
        assert_eq!(left(&store, "gone"), [6, 8]);
        assert_eq!(store.open_state_chain("a", BatchId(6)).unwrap().files.len(), 3);
    }

    /// What `SnapshotChain` asks for at each of `n` snapshots completed in turn: whole (`W`) or changes (`C`).
    fn pattern(chain: &mut SnapshotChain, first: u64, n: u64) -> String {
        (first..first + n)
            .map(|batch| {
                let base = chain.begin();
                chain.completed(BatchId(batch), &[("a".to_string(), base.is_some())]);
                if base.is_some() { 'C' } else { 'W' }
            })
            .collect()
    }

    #[test]
    fn every_full_snapshot_every_th_snapshot_is_whole_and_the_first_of_a_run() {
        assert_eq!(pattern(&mut SnapshotChain::new(3), 0, 7), "WCCWCCW");
        assert_eq!(pattern(&mut SnapshotChain::new(1), 0, 4), "WWWW");
        assert_eq!(pattern(&mut SnapshotChain::new(0), 0, 2), "WW", "0 counts as 1");
        let mut chain = SnapshotChain::new(10);
        assert_eq!(pattern(&mut chain, 0, 3), "WCC");
        assert_eq!(chain.starts(), &BTreeMap::from([("a".to_string(), BatchId(0))]));
        // Changes follow the last snapshot completed.
        assert_eq!(chain.begin(), Some(BatchId(2)));
    }

    #[test]
    fn after_a_snapshot_that_did_not_complete_or_a_restore_the_next_is_whole() {
        let mut chain = SnapshotChain::new(10);
        assert_eq!(pattern(&mut chain, 0, 2), "WC");
        // Begun, never completed: its changes may be lost with it.
        assert!(chain.begin().is_some());
        assert_eq!(pattern(&mut chain, 5, 2), "WC");
        let mut chain = SnapshotChain::new(10);
        chain.restored(BatchId(7), BTreeMap::from([("a".to_string(), BatchId(3))]));
        assert_eq!(chain.starts()["a"], BatchId(3), "the restored chain is kept until the next snapshot");
        assert_eq!(pattern(&mut chain, 8, 2), "WC");
        assert_eq!(chain.starts()["a"], BatchId(8));
    }
}
