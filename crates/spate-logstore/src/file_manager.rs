//! The file operations a checkpoint needs, behind a trait, and their
//! implementation on a local POSIX file system.
//!
//! The one subtle operation is [`CheckpointFileManager::create_atomic`]: a
//! put-if-absent that leaves either no file or the whole file, whatever
//! happens. It writes a temp file in the same directory, fsyncs it, then
//! hard-links it to the target name (`link(2)` fails when the target exists,
//! so it never overwrites, even when two writers race), unlinks the temp file
//! and fsyncs the directory so the new name is durable.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use spate_core::{BatchId, Clock, ReadSeek, SeekWrite};
use tracing::{debug, warn};

use crate::error::{LogStoreError, Result};
use crate::lock::{LeaseSettings, LockStatus, WriterLock};
use crate::log::{BatchName, batch_name};

/// Permission bits of every directory spate creates: owner only, since
/// offsets and state can hold private data.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits of every file spate creates.
pub const FILE_MODE: u32 = 0o600;

/// What an object store's parts of a streamed file `<name>` are kept
/// under: `<name>.parts/`, beside it (see
/// [`CheckpointFileManager::delete_streamed`]).
pub const PARTS_SUFFIX: &str = ".parts";

/// Writes a file's content as [`CheckpointFileManager::create_atomic_streamed`]
/// streams it.
pub type ContentWriter<'a> = &'a mut dyn FnMut(&mut dyn SeekWrite) -> io::Result<()>;

/// File operations on a checkpoint directory (Spark's `CheckpointFileManager`).
///
/// Paths are full paths. Implementations must be safe to share between threads.
pub trait CheckpointFileManager: Send + Sync + std::fmt::Debug {
    /// The names of the entries of `dir`, unsorted, without temp files.
    /// A missing directory has no entries.
    fn list(&self, dir: &Path) -> Result<Vec<String>>;

    /// The whole content of `path`, or `None` when it does not exist.
    /// A file longer than `max_len` bytes is refused with [`LogStoreError::TooLarge`].
    fn read(&self, path: &Path, max_len: u64) -> Result<Option<Vec<u8>>>;

    /// Writes `bytes` to `path` atomically, only if `path` does not exist
    /// ([`LogStoreError::AlreadyExists`] otherwise). After a crash at any
    /// point, `path` is either absent or complete. `fence` runs immediately
    /// before the new name is published (after the temp file is durable); its
    /// error stops the write and leaves `path` untouched.
    fn create_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()>;

    /// [`CheckpointFileManager::create_atomic`] for content too large to
    /// hold in memory twice: `content` writes it (and may seek back in what
    /// it wrote, to fill in a header). Returns the bytes written. A local
    /// disk streams it into the temp file; by default it is collected in
    /// memory first.
    fn create_atomic_streamed(&self, path: &Path, content: ContentWriter<'_>, fence: PublishCheck<'_>) -> Result<u64> {
        let mut collected = io::Cursor::new(Vec::new());
        content(&mut collected).map_err(|e| LogStoreError::io("write", path, e))?;
        let bytes = collected.into_inner();
        self.create_atomic(path, &bytes, fence)?;
        Ok(bytes.len() as u64)
    }

    /// Writes `bytes` to `path` atomically, replacing any previous content;
    /// `fence` runs immediately before the rename, as for [`CheckpointFileManager::create_atomic`].
    fn replace_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()>;

    /// Moves `from` to `to` (same file system), failing with
    /// [`LogStoreError::AlreadyExists`] when `to` exists; both directories are
    /// fsynced. `fence` runs immediately before the move.
    fn rename_no_replace(&self, from: &Path, to: &Path, fence: PublishCheck<'_>) -> Result<()>;

    /// Deletes the file `path`; false when it was not there.
    fn delete(&self, path: &Path) -> Result<bool>;

    /// [`CheckpointFileManager::delete`] for a writer: `fence` runs
    /// immediately before the deletion, and its error leaves `path` in place.
    fn delete_fenced(&self, path: &Path, fence: PublishCheck<'_>) -> Result<bool> {
        fence()?;
        self.delete(path)
    }

    /// Deletes a file written by
    /// [`CheckpointFileManager::create_atomic_streamed`] with whatever
    /// else it was written as (an object store's parts), as
    /// [`CheckpointFileManager::delete_fenced`] does; false when the file
    /// was not there.
    fn delete_streamed(&self, path: &Path, fence: PublishCheck<'_>) -> Result<bool> {
        self.delete_fenced(path, fence)
    }

    /// True when `path` exists.
    fn exists(&self, path: &Path) -> Result<bool>;

    /// Creates `dir` and its missing parents, owner-only.
    fn mkdirs(&self, dir: &Path) -> Result<()>;

    /// The entries of the log directory `dir`: the batch ids its names stand
    /// for (canonical decimal names, see [`crate::parse_batch_file_name`]),
    /// unsorted, and the decimal names too large to be a batch id. A missing
    /// directory has none.
    fn list_log(&self, dir: &Path) -> Result<LogListing> {
        let mut listing = LogListing::default();
        for name in self.list(dir)? {
            listing.add(name.as_bytes());
        }
        Ok(listing)
    }

    /// The batch ids of [`CheckpointFileManager::list_log`], unsorted.
    fn list_batch_ids(&self, dir: &Path) -> Result<Vec<BatchId>> {
        Ok(self.list_log(dir)?.ids)
    }

    /// Makes `dir` and everything under it owner-only: directories wider than
    /// [`DIR_MODE`] and files wider than [`FILE_MODE`] lose their group and
    /// other bits. Symbolic links are not followed. Returns what changed.
    fn tighten_permissions(&self, dir: &Path) -> Result<Vec<Tightened>>;

    /// Removes the temp files a crash left in `dir`; returns how many.
    /// Only the writer holding the checkpoint lock may call this, since a
    /// temp file may belong to a write in progress.
    fn clean_temp_files(&self, dir: &Path) -> Result<usize>;

    /// The first `len` bytes of `path` (all of it when shorter), or `None`
    /// when it does not exist: to tell what a large file is from its
    /// header. By default the whole file is read and cut; a manager that
    /// can read a part only does so.
    fn read_prefix(&self, path: &Path, len: u64) -> Result<Option<Vec<u8>>> {
        let mut bytes = self.read(path, crate::checkpoint::MAX_CHECKPOINT_FILE_BYTES)?;
        if let Some(bytes) = &mut bytes {
            bytes.truncate(usize::try_from(len).unwrap_or(usize::MAX));
        }
        Ok(bytes)
    }

    /// `path` as a stream from its start, or `None` when it does not
    /// exist: a file larger than memory can hold (a large state snapshot)
    /// is read without being held whole. A file longer than `max_len` bytes
    /// is refused with [`LogStoreError::TooLarge`]. By default the whole
    /// file is read into memory; a local disk opens the file, an object
    /// store reads it a range at a time.
    fn open_read(&self, path: &Path, max_len: u64) -> Result<Option<Box<dyn ReadSeek>>> {
        Ok(self.read(path, max_len)?.map(|bytes| Box::new(io::Cursor::new(bytes)) as Box<dyn ReadSeek>))
    }

    /// [`CheckpointFileManager::read`] with the version of what was read,
    /// for [`CheckpointFileManager::replace_if_unchanged`].
    fn read_versioned(&self, path: &Path, max_len: u64) -> Result<Option<(Vec<u8>, FileVersion)>> {
        Ok(self.read(path, max_len)?.map(|bytes| (bytes, FileVersion::Unknown)))
    }

    /// Replaces `path` only while it is still as read with `expected`
    /// ([`FileVersion::Absent`]: only while there is no such file), failing
    /// with [`LogStoreError::Changed`] when another writer changed it in
    /// between. An object store checks this atomically with the write (a
    /// conditional put); a local file system cannot (two system calls), so
    /// there it is [`CheckpointFileManager::replace_atomic`] and the caller's
    /// fence is what protects the file.
    ///
    /// Returns the version of what it wrote.
    fn replace_if_unchanged(
        &self,
        path: &Path,
        bytes: &[u8],
        expected: &FileVersion,
        fence: PublishCheck<'_>,
    ) -> Result<FileVersion> {
        match expected {
            FileVersion::Absent => self.create_atomic(path, bytes, fence)?,
            FileVersion::Tag(_) | FileVersion::Unknown => self.replace_atomic(path, bytes, fence)?,
        }
        Ok(FileVersion::Unknown)
    }

    /// Appends `bytes` to `path` (created owner-only when absent) after
    /// `fence` passed, and returns the file's length after it. Not synced:
    /// for advisory records such as progress.
    fn append(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<u64>;

    /// Every file under `dir` with its length in bytes, paths relative to
    /// `dir`; none when `dir` does not exist.
    fn list_files_recursive(&self, dir: &Path) -> Result<Vec<(PathBuf, u64)>>;

    /// Takes the writer lock of the checkpoint `dir` (see [`crate::WriterLock`]).
    fn acquire_lock(&self, dir: &Path, clock: Arc<dyn Clock>, lease: &LeaseSettings) -> Result<WriterLock>;

    /// Whether a live writer holds the lock of `dir`, without changing anything.
    fn lock_status(&self, dir: &Path, clock: &dyn Clock) -> LockStatus;

    /// True when the checkpoint lives in an object store rather than on a
    /// local file system (no directories, no permissions, no `fsync`).
    fn is_object_store(&self) -> bool {
        false
    }
}

/// The version of a file as read, for a conditional replace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileVersion {
    /// There was no such file.
    Absent,
    /// The object store's tag for the content read (an S3 ETag).
    Tag(String),
    /// The store keeps no versions (a local file system).
    Unknown,
}

/// A path whose permissions [`CheckpointFileManager::tighten_permissions`] narrowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tightened {
    /// The directory or file.
    pub path: PathBuf,
    /// Its permission bits before.
    pub from: u32,
    /// Its permission bits now.
    pub to: u32,
}

/// What a log directory holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogListing {
    /// The batch ids, unsorted.
    pub ids: Vec<BatchId>,
    /// Canonical decimal names too large for a batch id (never written by
    /// spate; the verdict reports them).
    pub too_large: Vec<String>,
}

impl LogListing {
    pub(crate) fn add(&mut self, name: &[u8]) {
        let Ok(name) = std::str::from_utf8(name) else { return };
        match batch_name(name) {
            BatchName::Id(id) => self.ids.push(id),
            BatchName::TooLarge => self.too_large.push(name.to_string()),
            BatchName::Other => {}
        }
    }
}

/// A check run immediately before a write becomes visible under its name
/// (the writer's fence); [`NO_FENCE`] for writers that are alone.
pub type PublishCheck<'a> = &'a dyn Fn() -> Result<()>;

/// The [`PublishCheck`] of a writer that is alone by construction.
pub const NO_FENCE: PublishCheck<'static> = &|| Ok(());

/// [`CheckpointFileManager`] on the local file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalFileManager;

impl CheckpointFileManager for LocalFileManager {
    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        list_dir(dir)
    }

    fn read(&self, path: &Path, max_len: u64) -> Result<Option<Vec<u8>>> {
        read_bounded(path, max_len)
    }

    fn read_prefix(&self, path: &Path, len: u64) -> Result<Option<Vec<u8>>> {
        read_prefix(path, len)
    }

    fn open_read(&self, path: &Path, max_len: u64) -> Result<Option<Box<dyn ReadSeek>>> {
        open_bounded(path, max_len)
    }

    fn create_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        write_atomic(path, Content::Bytes(bytes), Overwrite::Never, fence, &Unobserved).map(drop)
    }

    fn create_atomic_streamed(&self, path: &Path, content: ContentWriter<'_>, fence: PublishCheck<'_>) -> Result<u64> {
        write_atomic(path, Content::Streamed(content), Overwrite::Never, fence, &Unobserved)
    }

    fn replace_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        write_atomic(path, Content::Bytes(bytes), Overwrite::Replace, fence, &Unobserved).map(drop)
    }

    fn rename_no_replace(&self, from: &Path, to: &Path, fence: PublishCheck<'_>) -> Result<()> {
        fence()?;
        rename_no_replace(from, to, &Unobserved)
    }

    fn delete(&self, path: &Path) -> Result<bool> {
        delete_file(path)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        path.try_exists().map_err(|e| LogStoreError::io("stat", path, e))
    }

    fn mkdirs(&self, dir: &Path) -> Result<()> {
        mkdirs(dir, &Unobserved)
    }

    fn list_log(&self, dir: &Path) -> Result<LogListing> {
        list_log(dir)
    }

    fn tighten_permissions(&self, dir: &Path) -> Result<Vec<Tightened>> {
        tighten_permissions(dir)
    }

    fn clean_temp_files(&self, dir: &Path) -> Result<usize> {
        clean_temp_files(dir)
    }

    fn append(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<u64> {
        append(path, bytes, fence)
    }

    fn list_files_recursive(&self, dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
        list_files_recursive(dir)
    }

    fn acquire_lock(&self, dir: &Path, clock: Arc<dyn Clock>, _lease: &LeaseSettings) -> Result<WriterLock> {
        WriterLock::acquire(dir, clock.as_ref())
    }

    fn lock_status(&self, dir: &Path, _clock: &dyn Clock) -> LockStatus {
        crate::lock::local_lock_status(dir)
    }
}

pub(crate) fn append(path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<u64> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|e| LogStoreError::io("open", path, e))?;
    fence()?;
    file.write_all(bytes).map_err(|e| LogStoreError::io("append to", path, e))?;
    Ok(file.metadata().map_err(|e| LogStoreError::io("stat", path, e))?.len())
}

/// Walks `root` iteratively (without following links): each file with its length.
pub(crate) fn list_files_recursive(root: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(LogStoreError::io("list", &dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| LogStoreError::io("list", &dir, e))?;
            let Ok(meta) = entry.metadata() else { continue };
            let path = entry.path();
            if meta.is_dir() {
                pending.push(path);
            } else if meta.is_file() && !entry.file_name().to_str().is_some_and(is_temp_name) {
                let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                files.push((relative, meta.len()));
            }
        }
    }
    Ok(files)
}

/// True for the names of temp files (`.<target>.<pid>.<n>.tmp`), which
/// listings skip.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

pub(crate) fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LogStoreError::io("list", dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LogStoreError::io("list", dir, e))?;
        // Names that are not UTF-8 cannot be batch ids; skip them like any other stranger.
        if let Ok(name) = entry.file_name().into_string()
            && !is_temp_name(&name)
        {
            names.push(name);
        }
    }
    Ok(names)
}

/// Lists a log directory straight into ids, without making strings of the
/// names: `inspect` on a long log is mostly this loop.
pub(crate) fn list_log(dir: &Path) -> Result<LogListing> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LogListing::default()),
        Err(e) => return Err(LogStoreError::io("list", dir, e)),
    };
    let mut listing = LogListing::default();
    for entry in entries {
        let entry = entry.map_err(|e| LogStoreError::io("list", dir, e))?;
        listing.add(entry.file_name().as_bytes());
    }
    Ok(listing)
}

/// The first `len` bytes of `path`, reading no more.
pub(crate) fn read_prefix(path: &Path, len: u64) -> Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogStoreError::io("open", path, e)),
    };
    let mut bytes = Vec::new();
    file.take(len).read_to_end(&mut bytes).map_err(|e| LogStoreError::io("read", path, e))?;
    Ok(Some(bytes))
}

/// `path` opened for reading, its length checked against `max_len`.
pub(crate) fn open_bounded(path: &Path, max_len: u64) -> Result<Option<Box<dyn ReadSeek>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogStoreError::io("open", path, e)),
    };
    let len = file.metadata().map_err(|e| LogStoreError::io("stat", path, e))?.len();
    if len > max_len {
        return Err(LogStoreError::TooLarge { path: path.to_path_buf(), len, limit: max_len });
    }
    Ok(Some(Box::new(file)))
}

pub(crate) fn read_bounded(path: &Path, max_len: u64) -> Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogStoreError::io("open", path, e)),
    };
    let mut bytes = Vec::new();
    // Read one byte past the limit to tell "exactly the limit" from "more".
    file.take(max_len.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| LogStoreError::io("read", path, e))?;
    let len = bytes.len() as u64;
    if len > max_len {
        return Err(LogStoreError::TooLarge { path: path.to_path_buf(), len, limit: max_len });
    }
    Ok(Some(bytes))
}

/// Creates `dir` and its missing parents, owner-only, and fsyncs the parent
/// of each one created: a new directory's name is only durable once its
/// parent is, and without it a crash can take the directory and every entry
/// written into it since.
pub(crate) fn mkdirs(dir: &Path, observer: &dyn Observer) -> Result<()> {
    let mut missing = Vec::new();
    let mut next = Some(dir);
    while let Some(current) = next {
        if current.as_os_str().is_empty() || current.try_exists().map_err(|e| LogStoreError::io("stat", current, e))? {
            break;
        }
        missing.push(current);
        next = current.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| LogStoreError::io("create directory", dir, e))?;
    for created in missing.iter().rev() {
        observer.created_dir(created);
        fsync_dir_observed(parent_of(created), observer)?;
    }
    Ok(())
}

pub(crate) fn delete_file(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(LogStoreError::io("delete", path, e)),
    }
}

/// Walks `root` (without following links) and narrows what is wider than
/// owner-only. Iterative, so a deep tree cannot exhaust the stack.
pub(crate) fn tighten_permissions(root: &Path) -> Result<Vec<Tightened>> {
    let mut tightened = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Removed while walking (a temp file): nothing to tighten.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(LogStoreError::io("stat", &path, e)),
        };
        let kind = meta.file_type();
        let allowed = if kind.is_dir() {
            DIR_MODE
        } else if kind.is_file() {
            FILE_MODE
        } else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if mode & !allowed != 0 {
            let to = mode & allowed;
            fs::set_permissions(&path, fs::Permissions::from_mode(to))
                .map_err(|e| LogStoreError::io("tighten permissions of", &path, e))?;
            debug!(path = %path.display(), from = format!("{mode:04o}"), to = format!("{to:04o}"), "tightened");
            tightened.push(Tightened { path: path.clone(), from: mode, to });
        }
        if kind.is_dir() {
            for entry in fs::read_dir(&path).map_err(|e| LogStoreError::io("list", &path, e))? {
                pending.push(entry.map_err(|e| LogStoreError::io("list", &path, e))?.path());
            }
        }
    }
    Ok(tightened)
}

pub(crate) fn clean_temp_files(dir: &Path) -> Result<usize> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(LogStoreError::io("list", dir, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| LogStoreError::io("list", dir, e))?;
        let name = entry.file_name();
        if name.to_str().is_some_and(is_temp_name) && delete_file(&entry.path())? {
            debug!(path = %entry.path().display(), "removed leftover temp file");
            removed += 1;
        }
    }
    Ok(removed)
}

/// Fsyncs a directory so the names created or removed in it are durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    let handle = File::open(dir).map_err(|e| LogStoreError::io("open directory", dir, e))?;
    handle.sync_all().map_err(|e| LogStoreError::io("fsync directory", dir, e))
}

/// [`fsync_dir`], telling `observer` once it succeeded.
fn fsync_dir_observed(dir: &Path, observer: &dyn Observer) -> Result<()> {
    fsync_dir(dir)?;
    observer.synced_dir(dir);
    Ok(())
}

pub(crate) fn rename_no_replace(from: &Path, to: &Path, observer: &dyn Observer) -> Result<()> {
    // link(2) refuses an existing target; then the old name goes.
    fs::hard_link(from, to).map_err(|e| link_error(to, e))?;
    fs::remove_file(from).map_err(|e| LogStoreError::io("remove after move", from, e))?;
    fsync_dir_observed(parent_of(to), observer)?;
    fsync_dir_observed(parent_of(from), observer)
}

/// A step of the atomic write protocol, as the protocol reports it to an
/// observer: where a fault-injecting layer (feature `failpoints`) can fail
/// or crash a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultPoint {
    /// Before the temp file is created.
    BeforeTempWrite,
    /// After half of the bytes reached the temp file.
    PartialTempWrite,
    /// After all bytes were written, before the fsync.
    AfterTempWrite,
    /// In place of the temp file's fsync (a failing fsync, or a crash just before it).
    TempFsync,
    /// In place of the link/rename to the target name.
    Rename,
    /// After the target name exists, before the temp name is removed.
    AfterRename,
    /// In place of the directory fsync.
    DirFsync,
    /// After everything, before the call returns.
    AfterDirFsync,
}

impl FaultPoint {
    /// Every point, in the order a write reaches them.
    pub const ALL: [FaultPoint; 8] = [
        FaultPoint::BeforeTempWrite,
        FaultPoint::PartialTempWrite,
        FaultPoint::AfterTempWrite,
        FaultPoint::TempFsync,
        FaultPoint::Rename,
        FaultPoint::AfterRename,
        FaultPoint::DirFsync,
        FaultPoint::AfterDirFsync,
    ];
}

/// What the write protocol tells a fault-injecting layer as it goes; the
/// local manager uses [`Unobserved`].
pub(crate) trait Observer {
    /// The write of `target` through the temp file `temp` reached `point`;
    /// an error stops it there.
    fn at(&self, point: FaultPoint, target: &Path, temp: &Path) -> Result<()>;

    /// The most bytes one `write(2)` call takes (fewer than asked is a short write).
    fn max_write(&self) -> usize {
        usize::MAX
    }

    /// `dir` was created; its name is durable once its parent is fsynced.
    fn created_dir(&self, _dir: &Path) {}

    /// `dir` was fsynced: the names in it are durable.
    fn synced_dir(&self, _dir: &Path) {}
}

/// The [`Observer`] of the local file manager: no faults, full writes.
pub(crate) struct Unobserved;

impl Observer for Unobserved {
    fn at(&self, _point: FaultPoint, _target: &Path, _temp: &Path) -> Result<()> {
        Ok(())
    }
}

/// A file whose `write` takes at most `max` bytes a call, as a kernel may.
struct ShortWrites<'a> {
    file: &'a mut File,
    max: usize,
}

impl Write for ShortWrites<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.max.max(1));
        self.file.write(&buf[..n])
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl io::Seek for ShortWrites<'_> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        self.file.seek(to)
    }
}

fn link_error(target: &Path, e: io::Error) -> LogStoreError {
    if e.kind() == io::ErrorKind::AlreadyExists {
        LogStoreError::AlreadyExists { path: target.to_path_buf() }
    } else {
        LogStoreError::io("link", target, e)
    }
}

pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Whether an atomic write may replace an existing target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overwrite {
    /// Put-if-absent.
    Never,
    /// Replace atomically.
    Replace,
}

fn temp_path(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    parent_of(target).join(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// The atomic write protocol. `fence` is checked once the temp file is
/// durable, immediately before the link or rename, so the window in which a
/// writer that has just lost the checkpoint can still publish is the length
/// of one system call. `observer` is told every step; the local manager
/// passes [`Unobserved`] and the fault-injecting manager makes a step fail
/// or "crash". On a crash nothing is cleaned up, as if the process had died.
/// What [`write_atomic`] writes into its temp file.
pub(crate) enum Content<'a> {
    /// Bytes in memory, written in two halves (a fault point between them).
    Bytes(&'a [u8]),
    /// Bytes a writer streams.
    Streamed(ContentWriter<'a>),
}

/// Writes `content` to a temp file beside `target`, makes it durable and
/// publishes it under `target`. Returns the bytes written.
pub(crate) fn write_atomic(
    target: &Path,
    content: Content<'_>,
    overwrite: Overwrite,
    fence: PublishCheck<'_>,
    observer: &dyn Observer,
) -> Result<u64> {
    let temp = temp_path(target);
    observer.at(FaultPoint::BeforeTempWrite, target, &temp)?;
    let result = write_temp_then_publish(target, &temp, content, overwrite, fence, observer);
    if let Err(err) = &result
        && !err.is_crash()
        && let Err(cleanup) = delete_file(&temp)
    {
        warn!(path = %temp.display(), error = %cleanup, "could not remove temp file after a failed write");
    }
    result
}

fn write_temp_then_publish(
    target: &Path,
    temp: &Path,
    content: Content<'_>,
    overwrite: Overwrite,
    fence: PublishCheck<'_>,
    observer: &dyn Observer,
) -> Result<u64> {
    let at = |point| observer.at(point, target, temp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(temp)
        .map_err(|e| LogStoreError::io("create", temp, e))?;
    // write_all goes on after a short write; a plain write would lose the rest.
    let mut writer = ShortWrites { file: &mut file, max: observer.max_write() };
    let written = match content {
        Content::Bytes(bytes) => {
            let (head, tail) = bytes.split_at(bytes.len() / 2);
            writer.write_all(head).map_err(|e| LogStoreError::io("write", temp, e))?;
            at(FaultPoint::PartialTempWrite)?;
            writer.write_all(tail).map_err(|e| LogStoreError::io("write", temp, e))?;
            bytes.len() as u64
        }
        Content::Streamed(write) => {
            write(&mut writer).map_err(|e| LogStoreError::io("write", temp, e))?;
            at(FaultPoint::PartialTempWrite)?;
            writer.stream_position().map_err(|e| LogStoreError::io("write", temp, e))?
        }
    };
    at(FaultPoint::AfterTempWrite)?;
    at(FaultPoint::TempFsync)?;
    file.sync_all().map_err(|e| LogStoreError::io("fsync", temp, e))?;
    drop(file);
    fence()?;
    at(FaultPoint::Rename)?;
    match overwrite {
        Overwrite::Never => {
            fs::hard_link(temp, target).map_err(|e| link_error(target, e))?;
            at(FaultPoint::AfterRename)?;
            fs::remove_file(temp).map_err(|e| LogStoreError::io("remove temp", temp, e))?;
        }
        Overwrite::Replace => {
            fs::rename(temp, target).map_err(|e| LogStoreError::io("rename", target, e))?;
            at(FaultPoint::AfterRename)?;
        }
    }
    at(FaultPoint::DirFsync)?;
    fsync_dir_observed(parent_of(target), observer)?;
    at(FaultPoint::AfterDirFsync)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_atomic_is_put_if_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7");
        LocalFileManager.create_atomic(&path, b"first", NO_FENCE).unwrap();
        let again = LocalFileManager.create_atomic(&path, b"second", NO_FENCE);
        assert!(matches!(again, Err(LogStoreError::AlreadyExists { .. })), "{again:?}");
        assert_eq!(fs::read(&path).unwrap(), b"first");
        // The losing write leaves no temp file behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn replace_atomic_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("graph");
        LocalFileManager.replace_atomic(&path, b"one", NO_FENCE).unwrap();
        LocalFileManager.replace_atomic(&path, b"two", NO_FENCE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
    }

    #[test]
    fn files_and_dirs_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        LocalFileManager.mkdirs(&sub).unwrap();
        let file = sub.join("f");
        LocalFileManager.create_atomic(&file, b"x", NO_FENCE).unwrap();
        let dir_mode = fs::metadata(&sub).unwrap().permissions().mode() & 0o777;
        let file_mode = fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(file_mode, 0o600);
    }

    #[test]
    fn listing_skips_temp_files_and_cleaning_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("3"), b"x").unwrap();
        fs::write(dir.path().join(".3.99.0.tmp"), b"partial").unwrap();
        assert_eq!(LocalFileManager.list(dir.path()).unwrap(), vec!["3".to_string()]);
        assert_eq!(LocalFileManager.clean_temp_files(dir.path()).unwrap(), 1);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn read_refuses_files_over_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        fs::write(&path, vec![b'x'; 11]).unwrap();
        assert!(LocalFileManager.read(&path, 11).unwrap().is_some());
        let err = LocalFileManager.read(&path, 10).unwrap_err();
        assert!(matches!(err, LogStoreError::TooLarge { len: 11, limit: 10, .. }), "{err:?}");
        assert_eq!(LocalFileManager.read(&dir.path().join("missing"), 10).unwrap(), None);
    }

    #[test]
    fn rename_no_replace_refuses_existing_target() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::write(&a, b"a").unwrap();
        fs::write(&b, b"b").unwrap();
        assert!(matches!(
            LocalFileManager.rename_no_replace(&a, &b, NO_FENCE),
            Err(LogStoreError::AlreadyExists { .. })
        ));
        fs::remove_file(&b).unwrap();
        LocalFileManager.rename_no_replace(&a, &b, NO_FENCE).unwrap();
        assert!(!a.exists());
        assert_eq!(fs::read(&b).unwrap(), b"a");
    }
}
