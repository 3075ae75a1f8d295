//! The operator state snapshots of a checkpoint, as the verdict and repair
//! see them.
//!
//! The runtime keeps the state of its stateful operators in
//! `state/<operator>/<N>` (each operator's snapshot taken after batch N's
//! commit) and names the snapshot a restart restores in the `graph`
//! manifest (`state_batch`, with that batch's time in `state_batch_time`).
//! A snapshot is taken after its batch committed, so none is newer than the
//! last commit; one that is (a commit was removed, by hand or by a repair)
//! would count its batch twice once the batch runs again. The verdict
//! reports it ([`crate::InconsistencyKind::StateAhead`]); a repair moves the
//! snapshots after the last kept commit aside with the log entries and
//! points `graph` at an older snapshot of every operator when there is one
//! the next start can bring up to date, or at none (the next start then
//! rebuilds the state by replaying every batch from 0).
//!
//! Snapshots are incremental: a file is either a whole snapshot (the
//! operator's frame, as it always was) or the changes since an earlier
//! snapshot of the same operator, its *base*, named in a short header
//! ([`changes_header`], [`split_state_file`]). A restore reads the file of
//! the named batch and follows the bases back to a whole snapshot: the
//! chain. An older snapshot a repair points `graph` at is only usable when
//! its whole chain is still there ([`StateShape::links`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use spate_core::{BatchId, Time};

use crate::checkpoint::{MAX_CHECKPOINT_FILE_BYTES, split_epoch_line};
use crate::error::{LogStoreError, Result};
use crate::file_manager::CheckpointFileManager;
use crate::log::parse_batch_file_name;

/// The runtime's manifest: the graph and the batch of the state snapshot to restore.
pub const GRAPH_FILE: &str = "graph";
/// The directory of the operator state snapshots, `state/<operator>/<N>`.
pub const STATE_DIR: &str = "state";

/// The first bytes of a file of changes; a whole snapshot starts with the
/// frame's own magic (`SPTF`), so the two never read as each other.
pub const CHANGES_MAGIC: [u8; 4] = *b"SPTD";
/// The layout version of the header of a file of changes.
const CHANGES_HEADER_VERSION: u8 = 1;
/// The header of a file of changes: magic, version, the base batch
/// (little-endian), and the CRC-32C of those 13 bytes.
pub const CHANGES_HEADER_LEN: usize = 17;

/// What one state file is, as its first bytes say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateLink {
    /// A whole snapshot: a chain starts here.
    Whole,
    /// The changes since the same operator's snapshot of batch `base`.
    Changes {
        /// The batch of the previous link of the chain.
        base: BatchId,
    },
    /// The header cannot be read (damaged, or the file is unreadable):
    /// no chain goes through this file.
    Unreadable {
        /// Why.
        reason: String,
    },
}

/// The header that starts a file of changes taken after the snapshot of
/// batch `base`; the changes' frame follows it.
pub fn changes_header(base: BatchId) -> [u8; CHANGES_HEADER_LEN] {
    let mut header = [0u8; CHANGES_HEADER_LEN];
    header[..4].copy_from_slice(&CHANGES_MAGIC);
    header[4] = CHANGES_HEADER_VERSION;
    header[5..13].copy_from_slice(&base.0.to_le_bytes());
    let crc = crc32c::crc32c(&header[..13]);
    header[13..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Splits a state file into what it is and its frame: a whole snapshot is
/// all frame; a file of changes loses its header. `Err` says why a file
/// that starts like a file of changes is not one (short, another version,
/// a checksum that does not match).
pub fn split_state_file(bytes: &[u8]) -> std::result::Result<(StateLink, &[u8]), String> {
    if !bytes.starts_with(&CHANGES_MAGIC) {
        return Ok((StateLink::Whole, bytes));
    }
    let Some((header, frame)) = bytes.split_first_chunk::<CHANGES_HEADER_LEN>() else {
        return Err(format!("a header of changes needs {CHANGES_HEADER_LEN} bytes, the file has {}", bytes.len()));
    };
    if header[4] != CHANGES_HEADER_VERSION {
        return Err(format!("header of changes version {}, this build reads {CHANGES_HEADER_VERSION}", header[4]));
    }
    let (body, crc) = header.split_at(13);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("the header of changes fails its checksum".to_string());
    }
    let mut base = [0u8; 8];
    base.copy_from_slice(&body[5..13]);
    Ok((StateLink::Changes { base: BatchId(u64::from_le_bytes(base)) }, frame))
}

/// The snapshots a checkpoint holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateShape {
    /// The batch whose snapshot `graph` names (`None`: no `graph`, or it names none).
    pub named: Option<BatchId>,
    /// The batch interval recorded in `graph`, when it records one.
    pub batch_interval_ms: Option<u64>,
    /// Every snapshot: its batch and the operators (directory names) that have one.
    pub snapshots: BTreeMap<BatchId, Vec<String>>,
    /// What each snapshot file is, by operator and batch. Read only when
    /// inspection finds the checkpoint inconsistent (a repair may then
    /// point `graph` at an older snapshot, whose chain must be whole), so
    /// it is empty in a consistent verdict; a file missing from it counts
    /// as a whole snapshot.
    pub links: BTreeMap<(String, BatchId), StateLink>,
}

impl StateShape {
    /// The newest snapshot batch after `last_commit` (any, when nothing committed).
    pub fn newest_after(&self, last_commit: Option<BatchId>) -> Option<BatchId> {
        let after = |batch: &BatchId| last_commit.is_none_or(|c| *batch > c);
        self.named.iter().chain(self.snapshots.keys()).copied().filter(after).max()
    }

    /// The snapshot files after `last_commit`, relative to the checkpoint.
    pub fn files_after(&self, last_commit: Option<BatchId>) -> Vec<PathBuf> {
        let after = |batch: &BatchId| last_commit.is_none_or(|c| *batch > c);
        self.snapshots
            .iter()
            .filter(|(batch, _)| after(batch))
            .flat_map(|(batch, operators)| operators.iter().map(move |op| snapshot_path(op, *batch)))
            .collect()
    }

    /// The batches, at most `at_most` and newest first, with a snapshot of
    /// every operator that the named snapshot has (of every operator seen,
    /// when the named snapshot has no files), each with its whole chain.
    pub(crate) fn complete_at_or_before(&self, at_most: BatchId) -> Vec<BatchId> {
        let named_operators = self.named.and_then(|batch| self.snapshots.get(&batch));
        let all: Vec<&String> = match named_operators {
            Some(operators) => operators.iter().collect(),
            None => self.snapshots.values().flatten().collect(),
        };
        let has_all = |batch: BatchId, operators: &Vec<String>| {
            all.iter().all(|op| operators.contains(op) && self.chain_is_whole(op, batch))
        };
        self.snapshots
            .range(..=at_most)
            .rev()
            .filter(|(batch, operators)| has_all(**batch, operators))
            .map(|(batch, _)| *batch)
            .collect()
    }

    /// True when `operator`'s snapshot of `batch` and every earlier link
    /// its chain goes through are there, down to a whole snapshot.
    fn chain_is_whole(&self, operator: &str, batch: BatchId) -> bool {
        let mut link = batch;
        // Each step goes to an older batch, so the walk ends.
        loop {
            match self.links.get(&(operator.to_string(), link)) {
                None | Some(StateLink::Whole) => return true,
                Some(StateLink::Unreadable { .. }) => return false,
                Some(StateLink::Changes { base }) => {
                    let present = self.snapshots.get(base).is_some_and(|ops| ops.iter().any(|op| op == operator));
                    if *base >= link || !present {
                        return false;
                    }
                    link = *base;
                }
            }
        }
    }
}

/// `state/<operator>/<batch>`.
pub(crate) fn snapshot_path(operator: &str, batch: BatchId) -> PathBuf {
    Path::new(STATE_DIR).join(operator).join(batch.0.to_string())
}

/// Lists the snapshots of the checkpoint `dir` and reads what `graph` names.
/// `Err` carries the file that cannot be read (relative) and why.
pub(crate) fn read_state_shape(
    files: &dyn CheckpointFileManager,
    dir: &Path,
) -> std::result::Result<StateShape, (PathBuf, String)> {
    let mut shape = StateShape::default();
    let listed =
        files.list_files_recursive(&dir.join(STATE_DIR)).map_err(|e| (PathBuf::from(STATE_DIR), e.to_string()))?;
    // Only `<operator>/<N>`: deeper files are not spate's (a Spark checkpoint
    // keeps `state/<operator>/<partition>/<version>.delta`).
    for (relative, _) in listed {
        let parts: Vec<&str> = relative.iter().filter_map(|part| part.to_str()).collect();
        if let [operator, name] = parts.as_slice()
            && let Some(batch) = parse_batch_file_name(name)
        {
            shape.snapshots.entry(batch).or_default().push((*operator).to_string());
        }
    }
    for operators in shape.snapshots.values_mut() {
        operators.sort();
    }
    if let Some(graph) = read_graph(files, dir).map_err(|reason| (PathBuf::from(GRAPH_FILE), reason))? {
        shape.named = graph.get("state_batch").and_then(Value::as_u64).map(BatchId);
        shape.batch_interval_ms = graph.pointer("/descriptor/batch_interval_ms").and_then(Value::as_u64);
    }
    Ok(shape)
}

/// Fills `shape.links` with what each listed snapshot file is, reading
/// only its first bytes.
pub(crate) fn read_state_links(files: &dyn CheckpointFileManager, dir: &Path, shape: &mut StateShape) {
    for (batch, operators) in &shape.snapshots {
        for operator in operators {
            let path = dir.join(snapshot_path(operator, *batch));
            let link = match files.read_prefix(&path, CHANGES_HEADER_LEN as u64) {
                Ok(Some(head)) => {
                    split_state_file(&head).map_or_else(|reason| StateLink::Unreadable { reason }, |(link, _)| link)
                }
                Ok(None) => StateLink::Unreadable { reason: "the file vanished while inspecting".to_string() },
                Err(e) => StateLink::Unreadable { reason: e.to_string() },
            };
            shape.links.insert((operator.clone(), *batch), link);
        }
    }
}

/// The `graph` manifest as JSON, without the writer's epoch line; `None`
/// when absent, or when it is not JSON: the runtime owns its format and
/// refuses such a manifest itself, naming it.
fn read_graph(files: &dyn CheckpointFileManager, dir: &Path) -> std::result::Result<Option<Value>, String> {
    let path = dir.join(GRAPH_FILE);
    let Some(bytes) = files.read(&path, MAX_CHECKPOINT_FILE_BYTES).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let (_, body) = split_epoch_line(&path, &bytes).map_err(|e| e.to_string())?;
    Ok(serde_json::from_slice(body).ok())
}

/// The `graph` manifest `original` (as read, epoch line included) naming
/// the snapshot of `batch` taken at `time` instead, or none.
pub(crate) fn renamed_graph(path: &Path, original: &[u8], named: Option<(BatchId, Time)>) -> Result<Vec<u8>> {
    let (_, body) = split_epoch_line(path, original)?;
    let malformed =
        |reason: String| LogStoreError::Malformed { path: path.to_path_buf(), line: 1, reason: reason.to_string() };
    let mut graph: Value = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    let fields = graph.as_object_mut().ok_or_else(|| malformed("not a JSON object".to_string()))?;
    let (batch, time) = match named {
        Some((batch, time)) => (Value::from(batch.0), Value::from(time.as_millis())),
        None => (Value::Null, Value::Null),
    };
    fields.insert("state_batch".to_string(), batch);
    fields.insert("state_batch_time".to_string(), time);
    serde_json::to_vec_pretty(&graph)
        .map_err(|e| LogStoreError::Encode { path: path.to_path_buf(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(named: Option<u64>, snapshots: &[(u64, &[&str])]) -> StateShape {
        StateShape {
            named: named.map(BatchId),
            batch_interval_ms: Some(20),
            snapshots: snapshots
                .iter()
                .map(|(batch, ops)| (BatchId(*batch), ops.iter().map(|op| op.to_string()).collect()))
                .collect(),
            links: BTreeMap::new(),
        }
    }

    fn changes(state: &mut StateShape, operator: &str, batch: u64, base: u64) {
        state.links.insert((operator.to_string(), BatchId(batch)), StateLink::Changes { base: BatchId(base) });
    }

    #[test]
    fn a_header_of_changes_names_its_base_and_a_whole_snapshot_has_none() {
        let frame = b"SPTF and the rest of a frame";
        assert_eq!(split_state_file(frame), Ok((StateLink::Whole, &frame[..])));
        let mut file = changes_header(BatchId(41)).to_vec();
        file.extend_from_slice(frame);
        assert_eq!(split_state_file(&file), Ok((StateLink::Changes { base: BatchId(41) }, &frame[..])));
        // Only the header, as a prefix read returns it.
        assert_eq!(split_state_file(&file[..CHANGES_HEADER_LEN]).unwrap().0, StateLink::Changes { base: BatchId(41) });
    }

    #[test]
    fn a_damaged_header_of_changes_is_refused_saying_why() {
        let file = changes_header(BatchId(u64::MAX)).to_vec();
        assert!(split_state_file(&file[..10]).unwrap_err().contains("needs 17 bytes"));
        for byte in 5..CHANGES_HEADER_LEN {
            let mut damaged = file.clone();
            damaged[byte] ^= 0x01;
            assert!(split_state_file(&damaged).unwrap_err().contains("checksum"), "byte {byte}");
        }
        let mut later = file.clone();
        later[4] = 2;
        assert!(split_state_file(&later).unwrap_err().contains("version 2"));
    }

    #[test]
    fn an_older_snapshot_counts_only_when_its_whole_chain_is_there() {
        // a: whole at 2, changes at 4 (on 2) and 6 (on 4); whole at 8.
        // b: whole at every snapshot.
        let mut state = shape(Some(8), &[(4, &["a", "b"]), (6, &["a", "b"]), (8, &["a", "b"])]);
        changes(&mut state, "a", 4, 2);
        changes(&mut state, "a", 6, 4);
        // Batch 2 was purged: the chains of 4 and 6 are broken.
        assert_eq!(state.complete_at_or_before(BatchId(8)), [BatchId(8)]);
        state.snapshots.insert(BatchId(2), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(state.complete_at_or_before(BatchId(7)), [BatchId(6), BatchId(4), BatchId(2)]);
        // A link missing in the middle breaks what follows it only.
        state.snapshots.insert(BatchId(4), vec!["b".to_string()]);
        assert_eq!(state.complete_at_or_before(BatchId(7)), [BatchId(2)]);
        // A base that is not older, or a header that cannot be read, breaks it too.
        let mut looped = shape(Some(8), &[(6, &["a"]), (8, &["a"])]);
        changes(&mut looped, "a", 6, 6);
        looped.links.insert(("a".to_string(), BatchId(8)), StateLink::Unreadable { reason: "bad".to_string() });
        assert!(looped.complete_at_or_before(BatchId(8)).is_empty());
    }

    #[test]
    fn the_newest_snapshot_after_a_commit_and_its_files() {
        let state = shape(Some(8), &[(4, &["a", "b"]), (8, &["a", "b"])]);
        assert_eq!(state.newest_after(Some(BatchId(7))), Some(BatchId(8)));
        assert_eq!(state.newest_after(Some(BatchId(8))), None);
        assert_eq!(state.newest_after(None), Some(BatchId(8)));
        assert_eq!(state.files_after(Some(BatchId(7))), [Path::new("state/a/8"), Path::new("state/b/8")]);
        // Named, without files: still after the commit.
        assert_eq!(shape(Some(9), &[]).newest_after(Some(BatchId(8))), Some(BatchId(9)));
    }

    #[test]
    fn an_older_snapshot_counts_only_when_every_operator_of_the_named_one_has_it() {
        let state = shape(Some(8), &[(2, &["a", "b"]), (4, &["a"]), (8, &["a", "b"])]);
        assert_eq!(state.complete_at_or_before(BatchId(8)), [BatchId(8), BatchId(2)]);
        assert_eq!(state.complete_at_or_before(BatchId(7)), [BatchId(2)]);
        assert!(state.complete_at_or_before(BatchId(1)).is_empty());
    }

    #[test]
    fn a_renamed_graph_keeps_everything_else() {
        let original = b"spate-writer-epoch 3\n{\"descriptor\":{\"x\":1},\"state_batch\":8,\"state_batch_time\":160}";
        let path = Path::new("/ck/graph");
        let renamed = renamed_graph(path, original, Some((BatchId(4), Time::from_millis(80)))).unwrap();
        let graph: Value = serde_json::from_slice(&renamed).unwrap();
        assert_eq!(graph, serde_json::json!({"descriptor": {"x": 1}, "state_batch": 4, "state_batch_time": 80}));
        let none: Value = serde_json::from_slice(&renamed_graph(path, original, None).unwrap()).unwrap();
        assert_eq!((none["state_batch"].is_null(), none["state_batch_time"].is_null()), (true, true));
    }
}
