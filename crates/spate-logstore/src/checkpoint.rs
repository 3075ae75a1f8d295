//! [`Checkpoint`]: one handle on a checkpoint directory — its lock, its
//! `metadata` file, its two logs, its other files, its verdict and repair.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Clock, SystemClock, Time};
use tracing::{debug, info, warn};

use crate::entries::{CommitLog, CommitMetadata, OffsetLog};
use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, LocalFileManager, parent_of};
use crate::lock::{LOCK_FILE, LockHolder, WriterLock};
use crate::log::{Json, MAX_LOG_FILE_BYTES, decode_entry, encode_entry};
use crate::repair::{QUARANTINE_DIR, RepairPlan, apply_repair, plan_repair};
use crate::verdict::{Verdict, inspect_with};

/// The checkpoint's identity file.
pub const METADATA_FILE: &str = "metadata";
/// The offsets log directory.
pub const OFFSETS_DIR: &str = "offsets";
/// The commit log directory.
pub const COMMITS_DIR: &str = "commits";
/// How many batches are kept by default when old ones are purged.
pub const DEFAULT_RETAIN_BATCHES: u64 = 100;
/// The largest file [`Checkpoint::read_file`] reads.
pub const MAX_CHECKPOINT_FILE_BYTES: u64 = 1 << 30;

/// The content of `<checkpoint>/metadata`: who this checkpoint is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// The query's id, chosen at creation and kept for the checkpoint's life.
    pub id: String,
    /// When the checkpoint was created (zero in a checkpoint created by Spark).
    #[serde(rename = "createdAtMs", default)]
    pub created_at: Time,
}

/// Reads `<dir>/metadata`: `None` when absent. Reads spate's `v1` + JSON and
/// Spark's bare JSON (`{"id":"…"}`).
pub(crate) fn read_metadata(files: &dyn CheckpointFileManager, dir: &Path) -> Result<Option<CheckpointMetadata>> {
    let path = dir.join(METADATA_FILE);
    let Some(bytes) = files.read(&path, MAX_LOG_FILE_BYTES)? else { return Ok(None) };
    if bytes.first() == Some(&b'{') {
        return serde_json::from_slice(&bytes).map(Some).map_err(|e| LogStoreError::Malformed {
            path,
            line: e.line(),
            reason: e.to_string(),
        });
    }
    decode_entry::<Json<CheckpointMetadata>>(&path, &bytes).map(|m| Some(m.0))
}

/// A random id in the shape of a UUID (v4), from the standard library's
/// randomly seeded hasher, so no extra dependency is needed.
fn new_query_id(now: Time) -> String {
    let random = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_i64(now.as_millis());
        h.write_u32(std::process::id());
        h.write_u64(salt);
        h.finish()
    };
    let (hi, lo) = (random(1), random(2));
    let hi = (hi & !0xf000) | 0x4000;
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// How a [`Checkpoint`] is opened.
#[derive(Clone, Debug)]
pub struct CheckpointOptions {
    retain_batches: u64,
    clock: Arc<dyn Clock>,
    files: Arc<dyn CheckpointFileManager>,
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        CheckpointOptions {
            retain_batches: DEFAULT_RETAIN_BATCHES,
            clock: Arc::new(SystemClock),
            files: Arc::new(LocalFileManager),
        }
    }
}

impl CheckpointOptions {
    /// The defaults: keep 100 batches, system clock, local file system.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps at least `n` batches (at least 1) when purging.
    pub fn retain_batches(mut self, n: u64) -> Self {
        self.retain_batches = n.max(1);
        self
    }

    /// The clock for lock times and quarantine names.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The file manager (a [`crate::FaultyFileManager`] in crash tests).
    pub fn file_manager(mut self, files: Arc<dyn CheckpointFileManager>) -> Self {
        self.files = files;
        self
    }
}

/// A checkpoint directory, opened for writing (holding its lock) or read-only.
///
/// ```text
/// <checkpoint>/metadata   LOCK   offsets/<N>   commits/<N>   graph   state/…
///              receivedBlockMetadata/   receivedData/<stream>/   _quarantine/<time>/
/// ```
pub struct Checkpoint {
    dir: PathBuf,
    options: CheckpointOptions,
    lock: Option<WriterLock>,
    metadata: Option<CheckpointMetadata>,
    offsets: OffsetLog,
    commits: CommitLog,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("writer", &self.lock.as_ref().map(WriterLock::holder))
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl Checkpoint {
    /// Opens (creating it, owner-only) the checkpoint `dir` for writing: takes
    /// the writer lock (failing at once if a live writer holds it), writes the
    /// `metadata` file on first use and removes temp files left by a crash.
    /// It does not judge the logs: call [`Checkpoint::verdict`] for that.
    pub fn open_for_write(dir: impl AsRef<Path>, options: CheckpointOptions) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let files = options.files.clone();
        files.mkdirs(&dir)?;
        let lock = WriterLock::acquire(&dir, options.clock.as_ref())?;
        for sub in [Path::new(""), Path::new(OFFSETS_DIR), Path::new(COMMITS_DIR)] {
            files.clean_temp_files(&dir.join(sub))?;
        }
        let metadata = Self::ensure_metadata(files.as_ref(), &dir, options.clock.now())?;
        let offsets = OffsetLog::open_fenced(files.clone(), dir.join(OFFSETS_DIR), lock.fence())?;
        let commits = CommitLog::open_fenced(files, dir.join(COMMITS_DIR), lock.fence())?;
        Ok(Checkpoint { dir, options, lock: Some(lock), metadata, offsets, commits })
    }

    /// Opens the existing checkpoint `dir` without the lock and without
    /// changing anything (for `inspect`); every change is refused.
    pub fn open_read_only(dir: impl AsRef<Path>, options: CheckpointOptions) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let files = options.files.clone();
        if !files.exists(&dir)? {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint directory");
            return Err(LogStoreError::io("open", dir, missing));
        }
        let metadata = read_metadata(files.as_ref(), &dir).unwrap_or_else(|e| {
            warn!(error = %e, "checkpoint metadata unreadable");
            None
        });
        let offsets = OffsetLog::open_read_only(files.clone(), dir.join(OFFSETS_DIR));
        let commits = CommitLog::open_read_only(files, dir.join(COMMITS_DIR));
        Ok(Checkpoint { dir, options, lock: None, metadata, offsets, commits })
    }

    fn ensure_metadata(files: &dyn CheckpointFileManager, dir: &Path, now: Time) -> Result<Option<CheckpointMetadata>> {
        match read_metadata(files, dir) {
            Ok(Some(metadata)) => return Ok(Some(metadata)),
            Ok(None) => {}
            Err(e) => {
                // Left for the verdict to report, with the repair that moves it aside.
                warn!(error = %e, "checkpoint metadata unreadable");
                return Ok(None);
            }
        }
        let metadata = CheckpointMetadata { id: new_query_id(now), created_at: now };
        let path = dir.join(METADATA_FILE);
        let bytes = encode_entry(&Json(metadata.clone()))
            .map_err(|reason| LogStoreError::Encode { path: path.clone(), reason })?;
        files.create_atomic(&path, &bytes)?;
        info!(dir = %dir.display(), id = %metadata.id, "created checkpoint");
        Ok(Some(metadata))
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint's identity (`None` when the file is unreadable, or absent in a read-only open).
    pub fn metadata(&self) -> Option<&CheckpointMetadata> {
        self.metadata.as_ref()
    }

    /// This writer as written in the lock file; `None` when read-only.
    pub fn writer(&self) -> Option<&LockHolder> {
        self.lock.as_ref().map(WriterLock::holder)
    }

    /// The last writer recorded in the lock file, alive or not.
    pub fn last_writer(&self) -> Option<LockHolder> {
        crate::lock::read_lock_holder(&self.dir)
    }

    /// This writer's epoch; `None` when read-only.
    pub fn epoch(&self) -> Option<u64> {
        self.lock.as_ref().map(WriterLock::epoch)
    }

    /// The offsets log (`offsets/`).
    pub fn offsets(&self) -> &OffsetLog {
        &self.offsets
    }

    /// The commit log (`commits/`).
    pub fn commits(&self) -> &CommitLog {
        &self.commits
    }

    /// The recovery verdict (reads only the newest entries).
    pub fn verdict(&self) -> Result<Verdict> {
        inspect_with(self.options.files.as_ref(), &self.dir)
    }

    /// The repair plan, or `None` when the directory is consistent.
    pub fn repair_plan(&self) -> Result<Option<RepairPlan>> {
        Ok(match self.verdict()? {
            Verdict::Inconsistent(inconsistency) => Some(plan_repair(&inconsistency, self.options.clock.now())),
            _ => None,
        })
    }

    /// Applies `plan` (writer only: no other writer may run during a repair).
    pub fn apply_repair(&self, plan: &RepairPlan) -> Result<()> {
        self.check_writer()?;
        if plan.dir != self.dir {
            return Err(LogStoreError::StalePlan {
                path: plan.dir.clone(),
                reason: "planned for another directory".into(),
            });
        }
        apply_repair(self.options.files.as_ref(), plan)
    }

    /// Records that `batch` finished (after all its outputs), then purges
    /// batches beyond the retention. False when `commits/<batch>` already existed.
    pub fn commit_batch(&self, batch: BatchId, commit: &CommitMetadata) -> Result<bool> {
        let added = self.commits.add(batch, commit)?;
        self.purge_old_batches()?;
        Ok(added)
    }

    /// Deletes offsets and commits older than the newest `retain_batches`
    /// committed batches; returns the threshold (ids below it are gone), if any.
    pub fn purge_old_batches(&self) -> Result<Option<BatchId>> {
        self.check_writer()?;
        let Some(last_commit) = self.commits.latest_id()? else { return Ok(None) };
        let threshold = BatchId((last_commit.0 + 1).saturating_sub(self.options.retain_batches));
        if threshold == BatchId(0) {
            return Ok(None);
        }
        // Offsets first: if interrupted, the commit log is never ahead of the offsets.
        let offsets = self.offsets.purge(threshold)?;
        let commits = self.commits.purge(threshold)?;
        debug!(%threshold, offsets, commits, "purged old batches");
        Ok(Some(threshold))
    }

    fn check_writer(&self) -> Result<()> {
        match &self.lock {
            Some(lock) => lock.fence().check(),
            None => Err(LogStoreError::ReadOnly { path: self.dir.clone() }),
        }
    }

    /// The full path of `relative`, refused when it is absolute, climbs out
    /// with `..`, or names a file this crate manages (`metadata`, `LOCK`, the logs, the quarantine).
    pub fn path_of(&self, relative: impl AsRef<Path>) -> Result<PathBuf> {
        let relative = relative.as_ref();
        let invalid = |reason| Err(LogStoreError::InvalidPath { path: relative.to_path_buf(), reason });
        if relative.as_os_str().is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
            return invalid("must be a relative path inside the checkpoint, without `..`");
        }
        let reserved = [METADATA_FILE, LOCK_FILE, OFFSETS_DIR, COMMITS_DIR, QUARANTINE_DIR];
        if reserved.iter().any(|r| relative.starts_with(r)) {
            return invalid("is managed by the checkpoint itself (metadata, LOCK, offsets, commits, _quarantine)");
        }
        Ok(self.dir.join(relative))
    }

    /// Writes a new file (e.g. `state/<operator>/<N>`) atomically, creating
    /// its directories; [`LogStoreError::AlreadyExists`] if it is there.
    pub fn write_file(&self, relative: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        let path = self.path_of(relative)?;
        self.check_writer()?;
        self.options.files.mkdirs(parent_of(&path))?;
        self.options.files.create_atomic(&path, bytes)
    }

    /// Writes a file (e.g. `graph`) atomically, replacing its old content.
    pub fn replace_file(&self, relative: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        let path = self.path_of(relative)?;
        self.check_writer()?;
        self.options.files.mkdirs(parent_of(&path))?;
        self.options.files.replace_atomic(&path, bytes)
    }

    /// Reads a file written by [`Checkpoint::write_file`] or [`Checkpoint::replace_file`]; `None` when absent.
    pub fn read_file(&self, relative: impl AsRef<Path>) -> Result<Option<Vec<u8>>> {
        self.options.files.read(&self.path_of(relative)?, MAX_CHECKPOINT_FILE_BYTES)
    }

    /// Deletes such a file; false when it was not there.
    pub fn delete_file(&self, relative: impl AsRef<Path>) -> Result<bool> {
        let path = self.path_of(relative)?;
        self.check_writer()?;
        self.options.files.delete(&path)
    }

    /// The names in a directory of the checkpoint (unsorted; temp files skipped).
    pub fn list(&self, relative: impl AsRef<Path>) -> Result<Vec<String>> {
        self.options.files.list(&self.path_of(relative)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entries::OffsetSeq;
    use spate_core::ManualClock;
    use std::os::unix::fs::PermissionsExt;

    fn options() -> CheckpointOptions {
        CheckpointOptions::new().clock(Arc::new(ManualClock::new(Time::from_millis(1_700_000_000_000))))
    }

    #[test]
    fn open_for_write_creates_an_owner_only_directory_with_metadata() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        let ck = Checkpoint::open_for_write(&dir, options()).unwrap();
        let metadata = ck.metadata().unwrap().clone();
        assert_eq!(metadata.id.len(), 36);
        assert_eq!(metadata.created_at, Time::from_millis(1_700_000_000_000));
        ck.offsets().add(BatchId(0), &OffsetSeq::default()).unwrap();
        ck.write_file("state/counts/0", b"s").unwrap();
        for path in [dir.clone(), dir.join("offsets"), dir.join("state/counts")] {
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700, "{}", path.display());
        }
        for path in [dir.join("metadata"), dir.join("LOCK"), dir.join("offsets/0"), dir.join("state/counts/0")] {
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "{}", path.display());
        }
        drop(ck);
        let again = Checkpoint::open_for_write(&dir, options()).unwrap();
        assert_eq!(again.metadata(), Some(&metadata));
        assert_eq!(again.epoch(), Some(2));
    }

    #[test]
    fn reserved_and_escaping_paths_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open_for_write(root.path(), options()).unwrap();
        for bad in ["offsets/3", "LOCK", "../x", "/etc/passwd", "", "_quarantine/a", "metadata"] {
            assert!(matches!(ck.write_file(bad, b"x"), Err(LogStoreError::InvalidPath { .. })), "{bad}");
        }
        ck.replace_file("graph", b"one").unwrap();
        ck.replace_file("graph", b"two").unwrap();
        assert_eq!(ck.read_file("graph").unwrap(), Some(b"two".to_vec()));
        assert!(matches!(ck.write_file("graph", b"x"), Err(LogStoreError::AlreadyExists { .. })));
    }

    #[test]
    fn purge_keeps_the_newest_batches() {
        let root = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open_for_write(root.path(), options().retain_batches(3)).unwrap();
        assert_eq!(ck.purge_old_batches().unwrap(), None);
        for id in 0..9 {
            ck.offsets().add(BatchId(id), &OffsetSeq::default()).unwrap();
            ck.commits().add(BatchId(id), &CommitMetadata::default()).unwrap();
        }
        ck.offsets().add(BatchId(9), &OffsetSeq::default()).unwrap();
        assert!(ck.commit_batch(BatchId(9), &CommitMetadata::default()).unwrap());
        assert_eq!(ck.commits().ids().unwrap(), (7..=9).map(BatchId).collect::<Vec<_>>());
        ck.offsets().add(BatchId(10), &OffsetSeq::default()).unwrap();
        assert_eq!(ck.purge_old_batches().unwrap(), Some(BatchId(7)));
        assert_eq!(ck.offsets().ids().unwrap(), (7..=10).map(BatchId).collect::<Vec<_>>());
        assert_eq!(ck.commits().ids().unwrap(), (7..=9).map(BatchId).collect::<Vec<_>>());
        assert!(matches!(ck.verdict().unwrap(), Verdict::Rerun { batch: BatchId(10), .. }));
    }

    #[test]
    fn read_only_open_changes_nothing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        assert!(Checkpoint::open_read_only(&dir, options()).is_err());
        let writer = Checkpoint::open_for_write(&dir, options()).unwrap();
        let reader = Checkpoint::open_read_only(&dir, options()).unwrap();
        assert_eq!(reader.metadata(), writer.metadata());
        assert_eq!(reader.last_writer().as_ref(), writer.writer());
        assert!(matches!(reader.offsets().add(BatchId(0), &OffsetSeq::default()), Err(LogStoreError::ReadOnly { .. })));
        assert!(matches!(reader.replace_file("graph", b"g"), Err(LogStoreError::ReadOnly { .. })));
        assert_eq!(reader.verdict().unwrap(), Verdict::Fresh);
    }

    #[test]
    fn handles_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Checkpoint>();
        shareable::<OffsetLog>();
        shareable::<CommitLog>();
    }

    #[test]
    fn spark_metadata_file_is_read() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("metadata"), br#"{"id":"0b8f9d1e-2f0a-4c56-9a1b-3c0e5f7d9a11"}"#).unwrap();
        let ck = Checkpoint::open_read_only(root.path(), options()).unwrap();
        assert_eq!(ck.metadata().map(|m| m.id.as_str()), Some("0b8f9d1e-2f0a-4c56-9a1b-3c0e5f7d9a11"));
    }
}
