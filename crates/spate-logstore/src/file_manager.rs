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
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use spate_core::BatchId;
use tracing::{debug, warn};

use crate::error::{LogStoreError, Result};
use crate::fault::FaultPoint;
use crate::log::parse_batch_file_name;

/// Permission bits of every directory spate creates: owner only, since
/// offsets and state can hold private data.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits of every file spate creates.
pub const FILE_MODE: u32 = 0o600;

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
    /// point, `path` is either absent or complete.
    fn create_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()>;

    /// Writes `bytes` to `path` atomically, replacing any previous content.
    fn replace_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()>;

    /// Moves `from` to `to` (same file system), failing with
    /// [`LogStoreError::AlreadyExists`] when `to` exists; both directories are fsynced.
    fn rename_no_replace(&self, from: &Path, to: &Path) -> Result<()>;

    /// Deletes the file `path`; false when it was not there.
    fn delete(&self, path: &Path) -> Result<bool>;

    /// True when `path` exists.
    fn exists(&self, path: &Path) -> Result<bool>;

    /// Creates `dir` and its missing parents, owner-only.
    fn mkdirs(&self, dir: &Path) -> Result<()>;

    /// The batch ids that the entries of `dir` name (canonical decimal names,
    /// see [`crate::parse_batch_file_name`]), unsorted. A missing directory has none.
    fn list_batch_ids(&self, dir: &Path) -> Result<Vec<BatchId>> {
        Ok(self.list(dir)?.iter().filter_map(|name| parse_batch_file_name(name)).collect())
    }

    /// Removes the temp files a crash left in `dir`; returns how many.
    /// Only the writer holding the checkpoint lock may call this, since a
    /// temp file may belong to a write in progress.
    fn clean_temp_files(&self, dir: &Path) -> Result<usize>;
}

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

    fn create_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        write_atomic(path, bytes, Overwrite::Never, &mut |_| Ok(()))
    }

    fn replace_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        write_atomic(path, bytes, Overwrite::Replace, &mut |_| Ok(()))
    }

    fn rename_no_replace(&self, from: &Path, to: &Path) -> Result<()> {
        rename_no_replace(from, to)
    }

    fn delete(&self, path: &Path) -> Result<bool> {
        delete_file(path)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        path.try_exists().map_err(|e| LogStoreError::io("stat", path, e))
    }

    fn mkdirs(&self, dir: &Path) -> Result<()> {
        mkdirs(dir)
    }

    fn list_batch_ids(&self, dir: &Path) -> Result<Vec<BatchId>> {
        list_batch_ids(dir)
    }

    fn clean_temp_files(&self, dir: &Path) -> Result<usize> {
        clean_temp_files(dir)
    }
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
pub(crate) fn list_batch_ids(dir: &Path) -> Result<Vec<BatchId>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LogStoreError::io("list", dir, e)),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LogStoreError::io("list", dir, e))?;
        let name = entry.file_name();
        if let Some(id) = std::str::from_utf8(name.as_bytes()).ok().and_then(parse_batch_file_name) {
            ids.push(id);
        }
    }
    Ok(ids)
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

pub(crate) fn mkdirs(dir: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| LogStoreError::io("create directory", dir, e))
}

pub(crate) fn delete_file(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(LogStoreError::io("delete", path, e)),
    }
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

pub(crate) fn rename_no_replace(from: &Path, to: &Path) -> Result<()> {
    // link(2) refuses an existing target; then the old name goes.
    fs::hard_link(from, to).map_err(|e| link_error(to, e))?;
    fs::remove_file(from).map_err(|e| LogStoreError::io("remove after move", from, e))?;
    fsync_dir(parent_of(to))?;
    fsync_dir(parent_of(from))
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

/// The atomic write protocol. `fault` is called at every step; the local
/// manager passes a no-op and the fault-injecting manager makes it fail or
/// "crash". On a crash nothing is cleaned up, as if the process had died.
pub(crate) fn write_atomic(
    target: &Path,
    bytes: &[u8],
    overwrite: Overwrite,
    fault: &mut dyn FnMut(FaultPoint) -> Result<()>,
) -> Result<()> {
    let temp = temp_path(target);
    fault(FaultPoint::BeforeTempWrite)?;
    let result = write_temp_then_publish(target, &temp, bytes, overwrite, fault);
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
    bytes: &[u8],
    overwrite: Overwrite,
    fault: &mut dyn FnMut(FaultPoint) -> Result<()>,
) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(temp)
        .map_err(|e| LogStoreError::io("create", temp, e))?;
    let half = bytes.len() / 2;
    let (head, tail) = bytes.split_at(half);
    file.write_all(head).map_err(|e| LogStoreError::io("write", temp, e))?;
    fault(FaultPoint::PartialTempWrite)?;
    file.write_all(tail).map_err(|e| LogStoreError::io("write", temp, e))?;
    fault(FaultPoint::AfterTempWrite)?;
    fault(FaultPoint::TempFsync)?;
    file.sync_all().map_err(|e| LogStoreError::io("fsync", temp, e))?;
    drop(file);
    fault(FaultPoint::Rename)?;
    match overwrite {
        Overwrite::Never => {
            fs::hard_link(temp, target).map_err(|e| link_error(target, e))?;
            fault(FaultPoint::AfterRename)?;
            fs::remove_file(temp).map_err(|e| LogStoreError::io("remove temp", temp, e))?;
        }
        Overwrite::Replace => {
            fs::rename(temp, target).map_err(|e| LogStoreError::io("rename", target, e))?;
            fault(FaultPoint::AfterRename)?;
        }
    }
    fault(FaultPoint::DirFsync)?;
    fsync_dir(parent_of(target))?;
    fault(FaultPoint::AfterDirFsync)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn create_atomic_is_put_if_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7");
        LocalFileManager.create_atomic(&path, b"first").unwrap();
        let again = LocalFileManager.create_atomic(&path, b"second");
        assert!(matches!(again, Err(LogStoreError::AlreadyExists { .. })), "{again:?}");
        assert_eq!(fs::read(&path).unwrap(), b"first");
        // The losing write leaves no temp file behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn replace_atomic_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("graph");
        LocalFileManager.replace_atomic(&path, b"one").unwrap();
        LocalFileManager.replace_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
    }

    #[test]
    fn files_and_dirs_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        LocalFileManager.mkdirs(&sub).unwrap();
        let file = sub.join("f");
        LocalFileManager.create_atomic(&file, b"x").unwrap();
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
        assert!(matches!(LocalFileManager.rename_no_replace(&a, &b), Err(LogStoreError::AlreadyExists { .. })));
        fs::remove_file(&b).unwrap();
        LocalFileManager.rename_no_replace(&a, &b).unwrap();
        assert!(!a.exists());
        assert_eq!(fs::read(&b).unwrap(), b"a");
    }
}
