//! What happened in each batch: the [`BatchProgress`] record, the
//! [`ProgressListener`] trait that receives it, and the rotating JSON-lines
//! files under `<checkpoint>/progress/` that keep it for people and tools
//! (owner-only, each line with the writer's epoch, appended only while the
//! writer fence holds; [`read_progress`] reads them back).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Time, WriterFence};
use spate_logstore::{CheckpointFileManager, LogStoreError};

use crate::checkpoint_store::log_store_error;
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
    /// Records the batch's event-time operators set aside as late: behind
    /// the watermark when their windows were gone, or stamped too far ahead
    /// of the batch time.
    #[serde(default)]
    pub late_records: u64,
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
    /// Bytes the last state checkpoint wrote: every operator's whole state,
    /// or for an incremental one what changed since the one before.
    pub state_bytes: u64,
    /// True when a state checkpoint was taken after this batch.
    pub state_checkpointed: bool,
    /// True when that checkpoint wrote, for at least one operator, only
    /// what changed since the previous one (absent in older lines: false).
    #[serde(default)]
    pub state_incremental: bool,
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

/// A progress file larger than this is not read (rotation keeps them far smaller).
const MAX_READ_FILE_BYTES: u64 = 64 << 20;

/// One line as written: the record and the epoch of the writer that wrote it.
#[derive(Serialize)]
struct LineOut<'a> {
    epoch: u64,
    #[serde(flatten)]
    progress: &'a BatchProgress,
}

/// One line as read; lines written before the epoch was added read as epoch 0.
#[derive(Deserialize)]
struct LineIn {
    #[serde(default)]
    epoch: u64,
    #[serde(flatten)]
    progress: BatchProgress,
}

/// A progress record read back, with the epoch of the writer that wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressRecord {
    /// The writer lock's epoch of the process that wrote the line.
    pub epoch: u64,
    /// The record.
    pub progress: BatchProgress,
}

/// What [`read_progress`] found under `<checkpoint>/progress/`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgressHistory {
    /// The records, oldest first, without the stale ones.
    pub records: Vec<ProgressRecord>,
    /// Lines of a writer whose epoch is lower than one already seen: written
    /// by a writer that had lost the checkpoint to a newer one; ignored.
    pub stale_lines: u64,
    /// Lines that do not parse (a line torn by a crash, a foreign file); ignored.
    pub unreadable_lines: u64,
}

/// Reads the progress files of the checkpoint `checkpoint_dir` through
/// `files` (its file manager: a local directory or an object store), oldest
/// first. A line whose epoch is lower than the newest epoch seen before it
/// came from a writer that had lost the lock when it wrote it, and is
/// skipped (counted in [`ProgressHistory::stale_lines`]).
pub fn read_progress(
    files: &dyn CheckpointFileManager,
    checkpoint_dir: &Path,
) -> Result<ProgressHistory, RuntimeError> {
    let dir = checkpoint_dir.join(PROGRESS_DIR);
    let mut history = ProgressHistory::default();
    let mut newest = 0;
    for seq in existing_sequence_numbers(files, &dir)? {
        let path = file_path(&dir, seq);
        let text = match files.read(&path, MAX_READ_FILE_BYTES) {
            Ok(Some(text)) => text,
            // Rotated away since the listing.
            Ok(None) => continue,
            Err(LogStoreError::TooLarge { len, .. }) => {
                tracing::warn!(file = %path.display(), len, "progress file too large to read; skipped");
                history.unreadable_lines += 1;
                continue;
            }
            Err(e) => return Err(log_store_error(checkpoint_dir, e)),
        };
        for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<LineIn>(line) {
                Ok(line) if line.epoch < newest => history.stale_lines += 1,
                Ok(LineIn { epoch, progress }) => {
                    newest = epoch;
                    history.records.push(ProgressRecord { epoch, progress });
                }
                Err(_) => history.unreadable_lines += 1,
            }
        }
    }
    Ok(history)
}

/// The directory of the progress files in a checkpoint.
pub(crate) const PROGRESS_DIR: &str = "progress";

/// The largest progress file in an object store: an object cannot grow in
/// place, so each append rewrites it, and this bounds what one batch rewrites.
const MAX_OBJECT_FILE_BYTES: u64 = 256 << 10;

/// Appends progress records as JSON lines to `progress-<seq>.jsonl` files in
/// one directory of the checkpoint, through its file manager, rotating by
/// size and keeping a bounded number of files. Every line carries the
/// writer's epoch, and the writer fence is checked before each append, so a
/// writer that lost the checkpoint stops writing; what it wrote in the
/// instant between the check and the write is recognised by its lower epoch
/// and skipped by [`read_progress`].
#[derive(Debug)]
pub(crate) struct ProgressFiles {
    files: Arc<dyn CheckpointFileManager>,
    dir: PathBuf,
    rotation: ProgressRotation,
    seq: u64,
    /// True once the file `seq` was started by this writer.
    started: bool,
    written: u64,
    fence: Arc<dyn WriterFence>,
}

impl ProgressFiles {
    /// Opens (creating, owner only) `dir` and continues after the newest file in it.
    pub(crate) fn open(
        files: Arc<dyn CheckpointFileManager>,
        dir: &Path,
        mut rotation: ProgressRotation,
        fence: Arc<dyn WriterFence>,
    ) -> Result<Self, RuntimeError> {
        let checkpoint = checkpoint_of(dir);
        files.mkdirs(dir).map_err(|e| log_store_error(&checkpoint, e))?;
        for tightened in files.tighten_permissions(dir).map_err(|e| log_store_error(&checkpoint, e))? {
            tracing::info!(path = %tightened.path.display(), from = format!("{:o}", tightened.from), to = format!("{:o}", tightened.to), "tightened permissions to owner only");
        }
        if files.is_object_store() {
            rotation.max_file_bytes = rotation.max_file_bytes.min(MAX_OBJECT_FILE_BYTES);
        }
        let existing = existing_sequence_numbers(files.as_ref(), dir)?;
        let seq = match existing.last() {
            None => 0,
            Some(&last) => last.checked_add(1).ok_or_else(|| last_sequence_error(dir, last))?,
        };
        Ok(ProgressFiles { files, dir: dir.to_path_buf(), rotation, seq, started: false, written: 0, fence })
    }

    /// Appends one record, after checking that this writer still holds the
    /// checkpoint. Progress is advisory: it is written, not fsynced.
    pub(crate) fn append(&mut self, progress: &BatchProgress) -> Result<(), RuntimeError> {
        let mut line = serde_json::to_vec(&LineOut { epoch: self.fence.epoch(), progress }).map_err(|e| {
            RuntimeError::Io { op: "encode progress for", path: self.dir.clone(), source: std::io::Error::other(e) }
        })?;
        line.push(b'\n');
        let checkpoint = checkpoint_of(&self.dir);
        // The error names the checkpoint, as the log store's own does.
        let taken_over = |message| RuntimeError::TakenOver { dir: checkpoint.clone(), message };
        self.fence.check().map_err(taken_over)?;
        if !self.started || self.written + line.len() as u64 > self.rotation.max_file_bytes {
            self.rotate()?;
        }
        let fence = &self.fence;
        let check = || {
            fence.check().map_err(|on_disk| LogStoreError::StaleEpoch {
                dir: checkpoint.clone(),
                ours: fence.epoch(),
                on_disk,
            })
        };
        self.written =
            self.files.append(&self.current_path(), &line, &check).map_err(|e| log_store_error(&checkpoint, e))?;
        Ok(())
    }

    fn current_path(&self) -> PathBuf {
        file_path(&self.dir, self.seq)
    }

    fn rotate(&mut self) -> Result<(), RuntimeError> {
        if self.started {
            self.seq = self.seq.checked_add(1).ok_or_else(|| last_sequence_error(&self.dir, self.seq))?;
        }
        self.started = true;
        self.written = 0;
        let existing = existing_sequence_numbers(self.files.as_ref(), &self.dir)?;
        // The new file is not there yet: keep room for it.
        let excess = (existing.len() + 1).saturating_sub(self.rotation.max_files.max(1));
        for old in existing.iter().take(excess) {
            let old_path = file_path(&self.dir, *old);
            self.files.delete(&old_path).map_err(|e| log_store_error(&checkpoint_of(&self.dir), e))?;
        }
        Ok(())
    }
}

/// The checkpoint a progress directory belongs to.
fn checkpoint_of(dir: &Path) -> PathBuf {
    dir.parent().unwrap_or(dir).to_path_buf()
}

fn file_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("progress-{seq:06}.jsonl"))
}

fn last_sequence_error(dir: &Path, last: u64) -> RuntimeError {
    RuntimeError::Checkpoint {
        dir: dir.to_path_buf(),
        message: format!(
            "{} has the largest sequence number there is, so no progress file can follow it; move it away",
            file_path(dir, last).display()
        ),
    }
}

fn existing_sequence_numbers(files: &dyn CheckpointFileManager, dir: &Path) -> Result<Vec<u64>, RuntimeError> {
    let names = files.list(dir).map_err(|e| log_store_error(&checkpoint_of(dir), e))?;
    let mut seqs: Vec<u64> = names
        .into_iter()
        .filter_map(|name| {
            let digits = name.strip_prefix("progress-")?.strip_suffix(".jsonl")?;
            match digits.parse() {
                Ok(seq) => Some(seq),
                Err(e) => {
                    tracing::warn!(file = %dir.join(&name).display(), error = %e, "not a progress file number; ignored");
                    None
                }
            }
        })
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_logstore::LocalFileManager;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    pub(crate) fn sample(batch: u64) -> BatchProgress {
        BatchProgress {
            late_records: 0,
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
            state_incremental: false,
            rate_limit: None,
            receivers: Vec::new(),
        }
    }

    /// A fence whose holder can be taken away.
    #[derive(Debug)]
    struct TestFence {
        epoch: u64,
        held: std::sync::atomic::AtomicBool,
    }

    impl WriterFence for TestFence {
        fn epoch(&self) -> u64 {
            self.epoch
        }

        fn check(&self) -> Result<(), String> {
            if self.held.load(std::sync::atomic::Ordering::Acquire) {
                Ok(())
            } else {
                Err(format!("epoch {} lost the lock to epoch {}", self.epoch, self.epoch + 1))
            }
        }
    }

    fn fence(epoch: u64) -> Arc<TestFence> {
        Arc::new(TestFence { epoch, held: std::sync::atomic::AtomicBool::new(true) })
    }

    fn open(dir: &Path, rotation: ProgressRotation, epoch: u64) -> ProgressFiles {
        ProgressFiles::open(Arc::new(LocalFileManager), dir, rotation, fence(epoch)).unwrap()
    }

    fn batches_of(checkpoint: &Path) -> Vec<(u64, u64)> {
        read_progress(&LocalFileManager, checkpoint)
            .unwrap()
            .records
            .iter()
            .map(|r| (r.epoch, r.progress.batch_id.0))
            .collect()
    }

    #[test]
    fn lines_parse_back_and_files_rotate_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let line_len = serde_json::to_vec(&LineOut { epoch: 7, progress: &sample(1) }).unwrap().len() as u64 + 1;
        let rotation = ProgressRotation { max_file_bytes: line_len * 3, max_files: 2 };
        let mut files = open(&dir.path().join(PROGRESS_DIR), rotation, 7);
        for batch in 0..10 {
            files.append(&sample(batch)).unwrap();
        }
        let progress_dir = dir.path().join(PROGRESS_DIR);
        let seqs = existing_sequence_numbers(&LocalFileManager, &progress_dir).unwrap();
        assert_eq!(seqs, vec![2, 3]);
        let newest = fs::read_to_string(file_path(&progress_dir, 3)).unwrap();
        let batches: Vec<u64> =
            newest.lines().map(|l| serde_json::from_str::<BatchProgress>(l).unwrap().batch_id.0).collect();
        assert_eq!(batches, vec![9]);
        for seq in seqs {
            let len = fs::metadata(file_path(&progress_dir, seq)).unwrap().len();
            assert!(len <= rotation.max_file_bytes);
        }
        assert_eq!(batches_of(dir.path()), vec![(7, 6), (7, 7), (7, 8), (7, 9)]);
    }

    #[test]
    fn reopening_continues_in_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let progress_dir = dir.path().join(PROGRESS_DIR);
        let mut files = open(&progress_dir, ProgressRotation::default(), 1);
        files.append(&sample(0)).unwrap();
        drop(files);
        let mut files = open(&progress_dir, ProgressRotation::default(), 2);
        files.append(&sample(1)).unwrap();
        assert_eq!(existing_sequence_numbers(&LocalFileManager, &progress_dir).unwrap(), vec![0, 1]);
        assert_eq!(batches_of(dir.path()), vec![(1, 0), (2, 1)]);
    }

    #[test]
    fn a_writer_that_lost_the_lock_appends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let progress_dir = dir.path().join(PROGRESS_DIR);
        let fence = fence(3);
        let mut files =
            ProgressFiles::open(Arc::new(LocalFileManager), &progress_dir, ProgressRotation::default(), fence.clone())
                .unwrap();
        files.append(&sample(0)).unwrap();
        let before = fs::read(file_path(&progress_dir, 0)).unwrap();
        fence.held.store(false, std::sync::atomic::Ordering::Release);
        let error = files.append(&sample(1)).unwrap_err();
        assert!(matches!(error, RuntimeError::TakenOver { .. }), "{error}");
        assert_eq!(fs::read(file_path(&progress_dir, 0)).unwrap(), before);
        assert_eq!(existing_sequence_numbers(&LocalFileManager, &progress_dir).unwrap(), vec![0]);
    }

    #[test]
    fn readers_skip_lines_of_an_older_epoch_after_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let progress_dir = dir.path().join(PROGRESS_DIR);
        // Epoch 4 wrote batches 0 and 1, epoch 5 took over and wrote batch 2;
        // epoch 4's last line landed after that in the same file.
        let lines: Vec<String> = [(4, 0), (4, 1), (5, 2), (4, 2), (5, 3)]
            .iter()
            .map(|(epoch, batch)| serde_json::to_string(&LineOut { epoch: *epoch, progress: &sample(*batch) }).unwrap())
            .collect();
        fs::create_dir_all(&progress_dir).unwrap();
        fs::write(file_path(&progress_dir, 0), lines.join("\n") + "\n{\"torn").unwrap();
        let history = read_progress(&LocalFileManager, dir.path()).unwrap();
        let read: Vec<(u64, u64)> = history.records.iter().map(|r| (r.epoch, r.progress.batch_id.0)).collect();
        assert_eq!(read, vec![(4, 0), (4, 1), (5, 2), (5, 3)]);
        assert_eq!((history.stale_lines, history.unreadable_lines), (1, 1));
    }

    #[test]
    fn the_largest_sequence_number_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let last = dir.path().join(format!("progress-{}.jsonl", u64::MAX));
        fs::write(&last, b"").unwrap();
        fs::write(dir.path().join("progress-99999999999999999999999.jsonl"), b"").unwrap();
        let error = ProgressFiles::open(Arc::new(LocalFileManager), dir.path(), ProgressRotation::default(), fence(1))
            .unwrap_err();
        assert!(error.to_string().contains(&last.display().to_string()), "{error}");
    }

    #[test]
    fn the_directory_and_files_are_owner_only_and_an_open_one_is_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let progress_dir = dir.path().join(PROGRESS_DIR);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let mut files = open(&progress_dir, ProgressRotation::default(), 1);
        files.append(&sample(0)).unwrap();
        assert_eq!(mode(&progress_dir), 0o700);
        assert_eq!(mode(&file_path(&progress_dir, 0)), 0o600);
        drop(files);
        fs::set_permissions(&progress_dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(file_path(&progress_dir, 0), fs::Permissions::from_mode(0o644)).unwrap();
        let _files = open(&progress_dir, ProgressRotation::default(), 2);
        assert_eq!(mode(&progress_dir), 0o700);
        assert_eq!(mode(&file_path(&progress_dir, 0)), 0o600);
    }
}
