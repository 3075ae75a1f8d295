//! [`Checkpoint`]: one handle on a checkpoint directory — its lock, its
//! `metadata` file, its two logs, its other files, its verdict and repair.
//!
//! Every change a writer makes goes through its fence (the epoch in the lock
//! file), checked immediately before the change becomes visible. Opening a
//! checkpoint for writing also makes everything under it owner-only.

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use spate_core::sync::lock;
use spate_core::{BatchId, Clock, ReadSeek, SystemClock, Time};
use tracing::{debug, info, warn};

use crate::entries::{CommitLog, CommitMetadata, OffsetLog};
use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, ContentWriter, FileVersion, Tightened, parent_of, read_bounded};
use crate::holder::LockHolder;
use crate::location::{ObjectStoreSettings, file_manager_for};
use crate::lock::{EpochFence, LOCK_FILE, LeaseSettings, LockStatus, WriterLock, decode_lock_file};
use crate::log::{Json, decode_entry, encode_entry};
use crate::repair::{QUARANTINE_DIR, RepairPlan, apply_repair_fenced, plan_repair};
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
/// The largest `metadata` file read (spate's and Spark's hold one short id).
pub const MAX_METADATA_BYTES: u64 = 64 * 1024;

/// The content of `<checkpoint>/metadata`: who this checkpoint is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// The query's id, chosen at creation and kept for the checkpoint's life.
    pub id: String,
    /// When the checkpoint was created (zero in a checkpoint created by Spark).
    #[serde(rename = "createdAtMs", default)]
    pub created_at: Time,
}

/// The bytes of `<dir>/metadata` on the local file system, `None` when
/// absent; a file over [`MAX_METADATA_BYTES`] is refused with
/// [`LogStoreError::TooLarge`] rather than read into memory.
pub fn read_metadata_file(dir: &Path) -> Result<Option<Vec<u8>>> {
    read_bounded(&dir.join(METADATA_FILE), MAX_METADATA_BYTES)
}

/// Reads `<dir>/metadata`: `None` when absent. Reads spate's `v1` + JSON and
/// Spark's bare JSON (`{"id":"…"}`).
pub(crate) fn read_metadata(files: &dyn CheckpointFileManager, dir: &Path) -> Result<Option<CheckpointMetadata>> {
    let path = dir.join(METADATA_FILE);
    let Some(bytes) = files.read(&path, MAX_METADATA_BYTES)? else { return Ok(None) };
    decode_metadata(&path, &bytes).map(Some)
}

/// Decodes the content of a checkpoint's `metadata` file at `path`:
/// spate's `v1` + JSON (checksum checked), or Spark's bare JSON (`{"id":"…"}`).
pub fn decode_metadata(path: &Path, bytes: &[u8]) -> Result<CheckpointMetadata> {
    if bytes.first() == Some(&b'{') {
        return serde_json::from_slice(bytes).map_err(|e| LogStoreError::Malformed {
            path: path.to_path_buf(),
            line: e.line(),
            reason: e.to_string(),
        });
    }
    decode_entry::<Json<CheckpointMetadata>>(path, bytes).map(|m| m.0)
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
pub struct CheckpointSettings {
    retain_batches: u64,
    clock: Arc<dyn Clock>,
    /// `None`: chosen by the location (see [`crate::file_manager_for`]).
    files: Option<Arc<dyn CheckpointFileManager>>,
    object_store: ObjectStoreSettings,
    lease: LeaseSettings,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            retain_batches: DEFAULT_RETAIN_BATCHES,
            clock: Arc::new(SystemClock),
            files: None,
            object_store: ObjectStoreSettings::default(),
            lease: LeaseSettings::default(),
        }
    }
}

impl CheckpointSettings {
    /// The defaults: keep 100 batches, system clock, the file manager of the
    /// location (local file system for a path, S3 for `s3://bucket/prefix`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps at least `n` batches (at least 1) when purging.
    pub fn with_retained_batches(mut self, n: u64) -> Self {
        self.retain_batches = n.max(1);
        self
    }

    /// The clock for lock times, leases and quarantine names.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The file manager (a `FaultyFileManager` in crash tests),
    /// instead of the one the location names.
    pub fn with_file_manager(mut self, files: Arc<dyn CheckpointFileManager>) -> Self {
        self.files = Some(files);
        self
    }

    /// How to reach the object store of an `s3://` location.
    pub fn with_object_store(mut self, settings: ObjectStoreSettings) -> Self {
        self.object_store = settings;
        self
    }

    /// The writer's lease on an object store.
    pub fn with_lease(mut self, lease: LeaseSettings) -> Self {
        self.lease = lease;
        self
    }

    /// The file manager for the checkpoint at `location`.
    pub fn files_for(&self, location: &Path) -> Result<Arc<dyn CheckpointFileManager>> {
        match &self.files {
            Some(files) => Ok(Arc::clone(files)),
            None => file_manager_for(location, &self.object_store),
        }
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
    options: CheckpointSettings,
    files: Arc<dyn CheckpointFileManager>,
    lock: Option<WriterLock>,
    metadata: Option<CheckpointMetadata>,
    offsets: OffsetLog,
    commits: CommitLog,
    /// The files this writer replaced (see [`Checkpoint::replace_file`]).
    replaced: Mutex<HashSet<PathBuf>>,
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
    /// the writer lock (failing at once if a live writer holds it), makes
    /// every directory and file under it owner-only (saying in the log what
    /// was wider), writes the `metadata` file on first use and removes temp
    /// files left by a crash. It does not judge the logs: call
    /// [`Checkpoint::verdict`] for that.
    pub fn open_for_write(dir: impl AsRef<Path>, options: CheckpointSettings) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let files = options.files_for(&dir)?;
        files.mkdirs(&dir)?;
        let lock = files.acquire_lock(&dir, Arc::clone(&options.clock), &options.lease)?;
        report_tightened(&dir, &files.tighten_permissions(&dir)?);
        for sub in [Path::new(""), Path::new(OFFSETS_DIR), Path::new(COMMITS_DIR)] {
            files.clean_temp_files(&dir.join(sub))?;
        }
        let metadata = Self::ensure_metadata(files.as_ref(), &dir, options.clock.now(), &lock.fence())?;
        let offsets = OffsetLog::open_fenced(files.clone(), dir.join(OFFSETS_DIR), lock.fence())?;
        let commits = CommitLog::open_fenced(files.clone(), dir.join(COMMITS_DIR), lock.fence())?;
        let replaced = Mutex::new(HashSet::new());
        Ok(Checkpoint { dir, options, files, lock: Some(lock), metadata, offsets, commits, replaced })
    }

    /// Opens the existing checkpoint `dir` without the lock and without
    /// changing anything (for `inspect`); every change is refused.
    pub fn open_read_only(dir: impl AsRef<Path>, options: CheckpointSettings) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let files = options.files_for(&dir)?;
        if !files.exists(&dir)? {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint directory");
            return Err(LogStoreError::io("open", dir, missing));
        }
        let metadata = read_metadata(files.as_ref(), &dir).unwrap_or_else(|e| {
            warn!(error = %e, "checkpoint metadata unreadable");
            None
        });
        let offsets = OffsetLog::open_read_only(files.clone(), dir.join(OFFSETS_DIR));
        let commits = CommitLog::open_read_only(files.clone(), dir.join(COMMITS_DIR));
        let replaced = Mutex::new(HashSet::new());
        Ok(Checkpoint { dir, options, files, lock: None, metadata, offsets, commits, replaced })
    }

    fn ensure_metadata(
        files: &dyn CheckpointFileManager,
        dir: &Path,
        now: Time,
        fence: &EpochFence,
    ) -> Result<Option<CheckpointMetadata>> {
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
        files.create_atomic(&path, &bytes, &|| fence.check())?;
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
        let path = self.dir.join(LOCK_FILE);
        let bytes = self.files.read(&path, crate::lock::MAX_LOCK_FILE_BYTES).ok()??;
        decode_lock_file(&path, &bytes).ok()
    }

    /// Whether a live writer holds the checkpoint (this one included).
    pub fn lock_status(&self) -> LockStatus {
        self.files.lock_status(&self.dir, self.options.clock.as_ref())
    }

    /// Renews this writer's lease now (an object store's lock; nothing to do
    /// for a local one, whose OS lock needs no renewal). A writer renews in
    /// the background unless [`LeaseSettings::renew_in_background`] is off.
    pub fn renew_lease(&self) -> Result<()> {
        self.lock.as_ref().ok_or_else(|| LogStoreError::ReadOnly { path: self.dir.clone() })?.renew()
    }

    /// Renews this writer's lease when a renewal is due by the checkpoint's
    /// clock (the runtime calls it at every batch); nothing to do for a
    /// local checkpoint.
    pub fn renew_lease_if_due(&self) -> Result<()> {
        self.lock.as_ref().ok_or_else(|| LogStoreError::ReadOnly { path: self.dir.clone() })?.renew_if_due()
    }

    /// The file manager this checkpoint reads and writes through, for the
    /// layers that keep files of their own under it (progress).
    pub fn files(&self) -> &Arc<dyn CheckpointFileManager> {
        &self.files
    }

    /// True when the checkpoint lives in an object store.
    pub fn is_object_store(&self) -> bool {
        self.files.is_object_store()
    }

    /// This writer's epoch; `None` when read-only.
    pub fn epoch(&self) -> Option<u64> {
        self.lock.as_ref().map(WriterLock::epoch)
    }

    /// This writer's fence, for the layers that write under the checkpoint
    /// without going through this crate (it is a [`spate_core::WriterFence`]);
    /// `None` when read-only.
    pub fn fence(&self) -> Option<Arc<EpochFence>> {
        self.lock.as_ref().map(WriterLock::fence)
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
        inspect_with(self.files.as_ref(), &self.dir)
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
        let fence = self.writer_fence()?;
        apply_repair_fenced(self.files.as_ref(), plan, &|| fence.check(), Some(fence.epoch()))
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
    ///
    /// The newest commit comes from a listing, so it is trusted only as the
    /// verdict would trust it: it has offsets and a successor. Otherwise (a
    /// stray `commits/18446744073709551615`, a commit ahead of the offsets)
    /// nothing is deleted and the inconsistency is the error.
    pub fn purge_old_batches(&self) -> Result<Option<BatchId>> {
        self.check_writer()?;
        let Some(last_commit) = self.commits.latest_id()? else { return Ok(None) };
        if last_commit.next().is_none() || !self.files.exists(&self.offsets.path_of(last_commit))? {
            return match self.verdict()? {
                Verdict::Inconsistent(inconsistency) => Err(LogStoreError::Inconsistent(inconsistency)),
                _ => Ok(None),
            };
        }
        // (last + 1) - retain, without the + 1 that could overflow.
        let retain = self.options.retain_batches.max(1);
        let threshold = BatchId(last_commit.0.saturating_sub(retain - 1));
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
        self.writer_fence()?.check()
    }

    fn writer_fence(&self) -> Result<Arc<EpochFence>> {
        self.fence().ok_or_else(|| LogStoreError::ReadOnly { path: self.dir.clone() })
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
    /// its directories; [`LogStoreError::AlreadyExists`] if it is there. The
    /// fence is checked first and again immediately before the name appears.
    pub fn write_file(&self, relative: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        let path = self.path_of(relative)?;
        let fence = self.writer_fence()?;
        fence.check()?;
        self.files.mkdirs(parent_of(&path))?;
        self.files.create_atomic(&path, bytes, &|| fence.check())
    }

    /// [`Checkpoint::write_file`] for a file too large to hold in memory
    /// twice (a large operator state): `content` streams it (see
    /// [`CheckpointFileManager::create_atomic_streamed`]). Returns the
    /// bytes written.
    pub fn write_file_streamed(&self, relative: impl AsRef<Path>, content: ContentWriter<'_>) -> Result<u64> {
        let path = self.path_of(relative)?;
        let fence = self.writer_fence()?;
        fence.check()?;
        self.files.mkdirs(parent_of(&path))?;
        self.files.create_atomic_streamed(&path, content, &|| fence.check())
    }

    /// Writes a file (e.g. `graph`) atomically, replacing its old content.
    ///
    /// The file starts with a line carrying this writer's epoch, which
    /// [`Checkpoint::read_file`] removes. The fence is checked before the
    /// write and again immediately before the rename, and a file that carries
    /// a higher epoch (a newer writer replaced it) is never replaced.
    ///
    /// What remains: the last check and the rename are two system calls. A
    /// writer that loses the checkpoint between them still renames its file
    /// over the new writer's. Nothing in a local file system closes that
    /// window, so it is made detectable instead: this writer checks its fence
    /// again after the rename and fails with [`LogStoreError::StaleEpoch`],
    /// and the new writer, reading a file it replaced itself and finding an
    /// older epoch in it, fails with [`LogStoreError::Overwritten`] instead of
    /// using the stale writer's bytes (replacing it again, it warns and writes
    /// its own content back). That memory lasts as long as this handle: a
    /// later process reads the stale writer's file as the last one written.
    pub fn replace_file(&self, relative: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
        let path = self.path_of(relative)?;
        let fence = self.writer_fence()?;
        fence.check()?;
        let mut expected = FileVersion::Absent;
        if let Some((existing, version)) = self.files.read_versioned(&path, MAX_CHECKPOINT_FILE_BYTES)? {
            expected = version;
            let (found, _) = split_epoch_line(&path, &existing)?;
            match self.check_file_epoch(&path, found, fence.epoch()) {
                // Writing ours again puts back what the stale writer replaced.
                Err(overwritten @ LogStoreError::Overwritten { .. }) => warn!(error = %overwritten, "replacing it"),
                other => other?,
            }
        }
        self.files.mkdirs(parent_of(&path))?;
        let stamped = with_epoch_line(fence.epoch(), bytes);
        // On an object store the check of the epoch read and the write are one
        // conditional put: a newer writer's replace in between makes it fail.
        match self.files.replace_if_unchanged(&path, &stamped, &expected, &|| fence.check()) {
            Err(LogStoreError::Changed { path }) => {
                let on_disk = format!(
                    "epoch {} still, but {} was replaced by another writer meanwhile",
                    fence.epoch(),
                    path.display()
                );
                return Err(LogStoreError::StaleEpoch { dir: self.dir.clone(), ours: fence.epoch(), on_disk });
            }
            other => other?,
        };
        lock(&self.replaced).insert(path);
        // A takeover between the last check and the rename: our bytes may now
        // stand in the new writer's file. Say so; the new writer sees it too.
        fence.check()
    }

    /// Reads a file written by [`Checkpoint::write_file`] or
    /// [`Checkpoint::replace_file`] (without the epoch line); `None` when
    /// absent. A writer refuses a file that carries a higher epoch than its
    /// own ([`LogStoreError::StaleEpoch`]), or an older one where it replaced
    /// the file itself ([`LogStoreError::Overwritten`]).
    pub fn read_file(&self, relative: impl AsRef<Path>) -> Result<Option<Vec<u8>>> {
        let path = self.path_of(relative)?;
        let Some(mut bytes) = self.files.read(&path, MAX_CHECKPOINT_FILE_BYTES)? else { return Ok(None) };
        let (found, body) = split_epoch_line(&path, &bytes)?;
        let line_len = bytes.len() - body.len();
        if let Some(ours) = self.epoch() {
            self.check_file_epoch(&path, found, ours)?;
        }
        bytes.drain(..line_len);
        Ok(Some(bytes))
    }

    /// [`Checkpoint::read_file`] as a stream, positioned after the
    /// writer-epoch line, for a file too large to hold in memory (a large
    /// state snapshot); the epoch is checked as `read_file` checks it. On a
    /// local disk or an object store the file is read as it is consumed.
    pub fn open_file(&self, relative: impl AsRef<Path>) -> Result<Option<Box<dyn ReadSeek>>> {
        let path = self.path_of(relative)?;
        let Some(mut reader) = self.files.open_read(&path, MAX_CHECKPOINT_FILE_BYTES)? else { return Ok(None) };
        // The longest epoch line: the prefix, u64::MAX's 20 digits, a newline.
        const LONGEST_LINE: usize = EPOCH_LINE_PREFIX.len() + 21;
        let mut start = Vec::with_capacity(LONGEST_LINE);
        Read::take(&mut *reader, LONGEST_LINE as u64)
            .read_to_end(&mut start)
            .map_err(|e| LogStoreError::io("read", &path, e))?;
        let (found, body) = split_epoch_line(&path, &start)?;
        if let Some(ours) = self.epoch() {
            self.check_file_epoch(&path, found, ours)?;
        }
        let line_len = (start.len() - body.len()) as u64;
        reader.seek(SeekFrom::Start(line_len)).map_err(|e| LogStoreError::io("seek", &path, e))?;
        Ok(Some(reader))
    }

    /// Whether this writer (epoch `ours`) may use or replace `path`, which
    /// carries epoch `found` (`None`: written without one).
    fn check_file_epoch(&self, path: &Path, found: Option<u64>, ours: u64) -> Result<()> {
        let Some(found) = found else { return Ok(()) };
        if found > ours {
            let on_disk = format!("epoch {ours} still, but {} was written by epoch {found}", path.display());
            return Err(LogStoreError::StaleEpoch { dir: self.dir.clone(), ours, on_disk });
        }
        let replaced_by_us = lock(&self.replaced).contains(path);
        if found < ours && replaced_by_us {
            return Err(LogStoreError::Overwritten { path: path.to_path_buf(), ours, found });
        }
        Ok(())
    }

    /// Deletes such a file; false when it was not there. The fence is
    /// checked first, and again immediately before the deletion against the
    /// lock as it is now ([`EpochFence::confirm`]), so a writer that lost
    /// the checkpoint cannot delete a newer writer's file.
    pub fn delete_file(&self, relative: impl AsRef<Path>) -> Result<bool> {
        let path = self.path_of(relative)?;
        let fence = self.writer_fence()?;
        fence.check()?;
        self.files.delete_fenced(&path, &|| fence.confirm())
    }

    /// [`Checkpoint::delete_file`] for a file written by
    /// [`Checkpoint::write_file_streamed`], with the parts an object store
    /// keeps it in (see [`CheckpointFileManager::delete_streamed`]).
    pub fn delete_streamed_file(&self, relative: impl AsRef<Path>) -> Result<bool> {
        let path = self.path_of(relative)?;
        let fence = self.writer_fence()?;
        fence.check()?;
        self.files.delete_streamed(&path, &|| fence.confirm())
    }

    /// The names in a directory of the checkpoint (unsorted; temp files skipped).
    pub fn list(&self, relative: impl AsRef<Path>) -> Result<Vec<String>> {
        self.files.list(&self.path_of(relative)?)
    }
}

/// The start of the first line of a file written by [`Checkpoint::replace_file`].
const EPOCH_LINE_PREFIX: &[u8] = b"spate-writer-epoch ";

/// `bytes` after a line carrying `epoch`.
pub(crate) fn with_epoch_line(epoch: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 40);
    out.extend_from_slice(EPOCH_LINE_PREFIX);
    out.extend_from_slice(format!("{epoch}\n").as_bytes());
    out.extend_from_slice(bytes);
    out
}

/// The epoch line's epoch and the rest; `(None, bytes)` for a file written
/// without one (by [`Checkpoint::write_file`], or before the line existed).
pub(crate) fn split_epoch_line<'a>(path: &Path, bytes: &'a [u8]) -> Result<(Option<u64>, &'a [u8])> {
    let Some(rest) = bytes.strip_prefix(EPOCH_LINE_PREFIX) else { return Ok((None, bytes)) };
    let damaged = || LogStoreError::Malformed {
        path: path.to_path_buf(),
        line: 1,
        reason: "the writer-epoch line is damaged".to_string(),
    };
    let end = rest.iter().position(|b| *b == b'\n').ok_or_else(damaged)?;
    let digits = &rest[..end];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(damaged());
    }
    let epoch = std::str::from_utf8(digits).ok().and_then(|d| d.parse::<u64>().ok()).ok_or_else(damaged)?;
    Ok((Some(epoch), &rest[end + 1..]))
}

/// Says in the log what was wider than owner-only and was tightened: one
/// warning with the count under each top-level part of the checkpoint (a
/// RocksDB or WAL directory can hold thousands of files) and a few examples;
/// every path at debug level (from the file manager).
fn report_tightened(dir: &Path, tightened: &[Tightened]) {
    if tightened.is_empty() {
        return;
    }
    let mut parts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for t in tightened {
        let part = match t.path.strip_prefix(dir).ok().and_then(|p| p.components().next()) {
            Some(first) => first.as_os_str().to_string_lossy().into_owned(),
            None => ".".to_string(),
        };
        *parts.entry(part).or_default() += 1;
    }
    let parts: Vec<String> = parts.iter().map(|(part, n)| format!("{part}: {n}")).collect();
    let examples: Vec<String> =
        tightened.iter().take(5).map(|t| format!("{} {:04o} -> {:04o}", t.path.display(), t.from, t.to)).collect();
    warn!(
        dir = %dir.display(),
        count = tightened.len(),
        parts = %parts.join(", "),
        examples = %examples.join(", "),
        "checkpoint had directories or files open to other users; made them owner-only (0700/0600)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entries::OffsetSeq;
    use spate_core::ManualClock;
    use std::os::unix::fs::PermissionsExt;

    fn options() -> CheckpointSettings {
        CheckpointSettings::new().with_clock(Arc::new(ManualClock::new(Time::from_millis(1_700_000_000_000))))
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
        let ck = Checkpoint::open_for_write(root.path(), options().with_retained_batches(3)).unwrap();
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

    #[test]
    fn open_for_write_tightens_a_checkpoint_readable_by_others() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        drop(Checkpoint::open_for_write(&dir, options()).unwrap());
        let set =
            |path: &Path, mode: u32| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        std::fs::create_dir_all(dir.join("receivedData/0")).unwrap();
        std::fs::write(dir.join("receivedData/0/log-1"), b"private").unwrap();
        std::fs::write(dir.join("graph"), b"{}").unwrap();
        let outside = root.path().join("outside");
        std::fs::write(&outside, b"not ours").unwrap();
        set(&outside, 0o644);
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        set(&dir, 0o755);
        set(&dir.join("receivedData"), 0o775);
        set(&dir.join("receivedData/0"), 0o711);
        set(&dir.join("receivedData/0/log-1"), 0o644);
        set(&dir.join("graph"), 0o666);
        set(&dir.join("metadata"), 0o400);

        drop(Checkpoint::open_for_write(&dir, options()).unwrap());
        for path in [dir.clone(), dir.join("receivedData"), dir.join("receivedData/0")] {
            assert_eq!(mode(&path), 0o700, "{}", path.display());
        }
        for path in [dir.join("receivedData/0/log-1"), dir.join("graph")] {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
        assert_eq!(mode(&dir.join("metadata")), 0o400, "narrower than owner-only stays as it is");
        assert_eq!(mode(&outside), 0o644, "links are not followed out of the checkpoint");
    }

    #[test]
    fn tightening_reports_what_it_changed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), b"x").unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(root.path().join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut changed = crate::LocalFileManager.tighten_permissions(root.path()).unwrap();
        changed.sort_by(|a, b| a.path.cmp(&b.path));
        let expected = [
            Tightened { path: root.path().to_path_buf(), from: 0o755, to: 0o700 },
            Tightened { path: root.path().join("f"), from: 0o644, to: 0o600 },
        ];
        assert_eq!(changed, expected);
        assert!(crate::LocalFileManager.tighten_permissions(root.path()).unwrap().is_empty());
    }

    #[test]
    fn metadata_is_read_with_a_size_limit() {
        let root = tempfile::tempdir().unwrap();
        let huge = format!(r#"{{"id":"{}"}}"#, "a".repeat(MAX_METADATA_BYTES as usize));
        std::fs::write(root.path().join(METADATA_FILE), huge).unwrap();
        let err = read_metadata_file(root.path()).unwrap_err();
        assert!(matches!(err, LogStoreError::TooLarge { limit: MAX_METADATA_BYTES, .. }), "{err:?}");
        let ck = Checkpoint::open_read_only(root.path(), options()).unwrap();
        assert_eq!(ck.metadata(), None);
        let Verdict::Inconsistent(inconsistency) = ck.verdict().unwrap() else { panic!("metadata must be refused") };
        assert!(inconsistency.to_string().contains("exceeds the limit"), "{inconsistency}");
        std::fs::write(root.path().join(METADATA_FILE), br#"{"id":"x"}"#).unwrap();
        assert_eq!(read_metadata_file(root.path()).unwrap(), Some(br#"{"id":"x"}"#.to_vec()));
    }

    #[test]
    fn replaced_files_carry_the_writer_epoch_and_read_back_without_it() {
        let root = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open_for_write(root.path(), options()).unwrap();
        ck.replace_file("graph", b"{\"g\":1}").unwrap();
        assert_eq!(std::fs::read(root.path().join("graph")).unwrap(), b"spate-writer-epoch 1\n{\"g\":1}");
        assert_eq!(ck.read_file("graph").unwrap(), Some(b"{\"g\":1}".to_vec()));
        // A file from before the epoch line existed reads as it is.
        std::fs::write(root.path().join("old"), b"{}").unwrap();
        assert_eq!(ck.read_file("old").unwrap(), Some(b"{}".to_vec()));
        for damaged in [&b"spate-writer-epoch x\n{}"[..], b"spate-writer-epoch 1", b"spate-writer-epoch \n"] {
            std::fs::write(root.path().join("bad"), damaged).unwrap();
            let err = ck.read_file("bad").unwrap_err().to_string();
            assert!(err.contains("writer-epoch line is damaged") && err.contains("bad"), "{err}");
            let err = ck.open_file("bad").err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("writer-epoch line is damaged") && err.contains("bad"), "{err}");
        }
    }

    /// What `open_file` streams is what `read_file` reads, the epoch line
    /// left out, whatever the file's length against the line's.
    #[test]
    fn an_opened_file_streams_what_read_file_reads() {
        use std::io::Read;
        let root = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open_for_write(root.path(), options()).unwrap();
        let long: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for (name, bytes) in [("empty", &b""[..]), ("short", b"{}"), ("long", &long)] {
            ck.replace_file(name, bytes).unwrap();
            let mut streamed = Vec::new();
            ck.open_file(name).unwrap().unwrap().read_to_end(&mut streamed).unwrap();
            assert_eq!(streamed, bytes, "{name}");
            std::fs::write(root.path().join(name), bytes).unwrap();
            let mut streamed = Vec::new();
            ck.open_file(name).unwrap().unwrap().read_to_end(&mut streamed).unwrap();
            assert_eq!(streamed, bytes, "{name} without an epoch line");
        }
        assert!(ck.open_file("absent").unwrap().is_none());
    }
}
