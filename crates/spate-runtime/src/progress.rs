//! What happened in each batch: the [`BatchProgress`] record, the
//! [`ProgressListener`] trait that receives it, and the rotating JSON-lines
//! files under `<checkpoint>/progress/` that keep it for people and tools.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Time};

use crate::error::RuntimeError;
use crate::recovery::RecoveryReport;

/// Milliseconds spent in each phase of a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseTimes {
    /// Planning the batch and writing `offsets/N` durably.
    pub offsets_logged_ms: u64,
    /// Computing the batch through the graph (inputs, windows, state).
    pub jobs_ms: u64,
    /// Running every output of the batch.
    pub outputs_ms: u64,
    /// Writing `commits/N` durably.
    pub commit_ms: u64,
    /// Snapshotting operator state (zero when no checkpoint was due).
    pub state_checkpoint_ms: u64,
}

/// One receiver's status at the end of a batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReceiverStatus {
    /// The input stream the receiver feeds.
    pub stream_id: u32,
    /// The receiver's name.
    pub name: String,
    /// True while it runs.
    pub active: bool,
    /// The rate limit it runs under, records per second (`None`: unlimited).
    pub rate_limit: Option<f64>,
    /// The last error it reported, if any.
    pub last_error: Option<String>,
}

/// The progress record of one completed batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchProgress {
    /// The batch.
    pub batch_id: BatchId,
    /// The batch time (a multiple of the batch interval), ms since the epoch.
    pub batch_time: Time,
    /// True when the batch was re-run from the checkpoint after a restart.
    pub recovered: bool,
    /// Records the batch read from all inputs.
    pub input_records: u64,
    /// Input records per second of batch interval.
    pub input_rate: f64,
    /// Input records per second of processing time.
    pub processing_rate: f64,
    /// From the batch time to the start of its processing, ms.
    pub scheduling_delay_ms: u64,
    /// From the start of processing to the commit, ms.
    pub processing_time_ms: u64,
    /// The processing time split by phase.
    pub phases: PhaseTimes,
    /// Bytes of operator state after the batch (as last snapshotted or estimated).
    pub state_bytes: u64,
    /// True when a state checkpoint was taken after this batch.
    pub state_checkpointed: bool,
    /// The backpressure rate limit in force for the next batch, records/s.
    pub rate_limit: Option<f64>,
    /// The receivers' status.
    pub receivers: Vec<ReceiverStatus>,
}

/// Receives the engine's reports. Called on the engine's driver thread, so
/// implementations should return quickly.
pub trait ProgressListener: Send + Sync {
    /// A batch committed.
    fn on_batch_completed(&self, progress: &BatchProgress);

    /// The context recovered from a checkpoint (called once, before the
    /// first batch runs).
    fn on_recovery(&self, report: &RecoveryReport) {
        let _ = report;
    }
}

/// How big the progress files may grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressRotation {
    /// A file is closed and a new one started past this many bytes.
    pub max_file_bytes: u64,
    /// At most this many files are kept; the oldest are deleted.
    pub max_files: usize,
}

impl Default for ProgressRotation {
    fn default() -> Self {
        ProgressRotation { max_file_bytes: 4 << 20, max_files: 5 }
    }
}

/// Appends progress records as JSON lines to `progress-<seq>.jsonl` files in
/// one directory, rotating by size and keeping a bounded number of files.
#[derive(Debug)]
pub(crate) struct ProgressFiles {
    dir: PathBuf,
    rotation: ProgressRotation,
    seq: u64,
    file: Option<File>,
    written: u64,
}

impl ProgressFiles {
    /// Opens (creating) `dir` and continues after the newest file in it.
    pub(crate) fn open(dir: &Path, rotation: ProgressRotation) -> Result<Self, RuntimeError> {
        fs::create_dir_all(dir).map_err(|e| RuntimeError::io("create", dir, e))?;
        let seq = existing_sequence_numbers(dir)?.last().map_or(0, |last| last + 1);
        Ok(ProgressFiles { dir: dir.to_path_buf(), rotation, seq, file: None, written: 0 })
    }

    /// Appends one record. Progress is advisory: it is written, not fsynced.
    pub(crate) fn append(&mut self, progress: &BatchProgress) -> Result<(), RuntimeError> {
        let mut line = serde_json::to_vec(progress).map_err(|e| RuntimeError::Io {
            op: "encode progress for",
            path: self.dir.clone(),
            source: std::io::Error::other(e),
        })?;
        line.push(b'\n');
        if self.file.is_none() || self.written + line.len() as u64 > self.rotation.max_file_bytes {
            self.rotate()?;
        }
        let path = self.current_path();
        if let Some(file) = self.file.as_mut() {
            file.write_all(&line).map_err(|e| RuntimeError::io("write", &path, e))?;
            self.written += line.len() as u64;
        }
        Ok(())
    }

    fn current_path(&self) -> PathBuf {
        self.dir.join(format!("progress-{:06}.jsonl", self.seq))
    }

    fn rotate(&mut self) -> Result<(), RuntimeError> {
        if self.file.take().is_some() {
            self.seq += 1;
        }
        let path = self.current_path();
        let file =
            OpenOptions::new().create(true).append(true).open(&path).map_err(|e| RuntimeError::io("open", &path, e))?;
        self.written = file.metadata().map_err(|e| RuntimeError::io("stat", &path, e))?.len();
        self.file = Some(file);
        let existing = existing_sequence_numbers(&self.dir)?;
        let excess = existing.len().saturating_sub(self.rotation.max_files.max(1));
        for old in existing.iter().take(excess) {
            let old_path = self.dir.join(format!("progress-{old:06}.jsonl"));
            fs::remove_file(&old_path).map_err(|e| RuntimeError::io("remove", &old_path, e))?;
        }
        Ok(())
    }
}

fn existing_sequence_numbers(dir: &Path) -> Result<Vec<u64>, RuntimeError> {
    let entries = fs::read_dir(dir).map_err(|e| RuntimeError::io("list", dir, e))?;
    let mut seqs: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix("progress-")?.strip_suffix(".jsonl")?.parse().ok()
        })
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(batch: u64) -> BatchProgress {
        BatchProgress {
            batch_id: BatchId(batch),
            batch_time: Time::from_millis(1000 * batch as i64),
            recovered: false,
            input_records: 10,
            input_rate: 10.0,
            processing_rate: 100.0,
            scheduling_delay_ms: 0,
            processing_time_ms: 100,
            phases: PhaseTimes::default(),
            state_bytes: 0,
            state_checkpointed: false,
            rate_limit: None,
            receivers: Vec::new(),
        }
    }

    #[test]
    fn lines_parse_back_and_files_rotate_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let line_len = serde_json::to_vec(&sample(1)).unwrap().len() as u64 + 1;
        let rotation = ProgressRotation { max_file_bytes: line_len * 3, max_files: 2 };
        let mut files = ProgressFiles::open(dir.path(), rotation).unwrap();
        for batch in 0..10 {
            files.append(&sample(batch)).unwrap();
        }
        let seqs = existing_sequence_numbers(dir.path()).unwrap();
        assert_eq!(seqs, vec![2, 3]);
        let newest = fs::read_to_string(dir.path().join("progress-000003.jsonl")).unwrap();
        let batches: Vec<u64> =
            newest.lines().map(|l| serde_json::from_str::<BatchProgress>(l).unwrap().batch_id.0).collect();
        assert_eq!(batches, vec![9]);
        for seq in seqs {
            let len = fs::metadata(dir.path().join(format!("progress-{seq:06}.jsonl"))).unwrap().len();
            assert!(len <= rotation.max_file_bytes);
        }
    }

    #[test]
    fn reopening_continues_in_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = ProgressFiles::open(dir.path(), ProgressRotation::default()).unwrap();
        files.append(&sample(0)).unwrap();
        drop(files);
        let mut files = ProgressFiles::open(dir.path(), ProgressRotation::default()).unwrap();
        files.append(&sample(1)).unwrap();
        assert_eq!(existing_sequence_numbers(dir.path()).unwrap(), vec![0, 1]);
    }
}
