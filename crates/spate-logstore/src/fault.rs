//! A [`CheckpointFileManager`] that injects faults into atomic writes, for
//! crash tests.
//!
//! Arm it with a [`FaultPoint`] and a [`FaultMode`]; the next atomic write
//! that reaches that point fails there (an injected error, or a real
//! `ENOSPC`; the writer cleans up as it would after a real error) or
//! "crashes" there: it stops, leaving the disk as it is, and from then on
//! every call fails with [`LogStoreError::Crashed`], like a dead process.
//! Reopening the directory with a fresh manager is then the recovery under
//! test. Failing at [`FaultPoint::Rename`] or [`FaultPoint::DirFsync`] is a
//! failed rename or directory fsync.
//!
//! Two settings change every write: [`FaultyFileManager::short_writes`]
//! makes each `write(2)` take only a few bytes, and
//! [`FaultyFileManager::losing_unsynced_data`] makes a crash drop what was
//! not yet synced, as a power cut would: the data of files not fsynced
//! (truncated to nothing), and the names created or replaced in directories
//! not fsynced since, including new directories whose parent was not
//! fsynced. A missing fsync then shows up as lost data. (Deletions are not
//! undone: a deleted entry coming back is old data, not lost data.)

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::sync::lock;
use tracing::warn;

use crate::error::{LogStoreError, Result};
use crate::file_manager::{
    self, CheckpointFileManager, Content, ContentWriter, FaultPoint, Observer, Overwrite, PublishCheck, parent_of,
};
use crate::lock::{LeaseSettings, LockStatus, WriterLock};
use spate_core::Clock;

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultMode {
    /// The step fails with an error; the writer's error handling runs.
    Fail,
    /// The step fails as a full disk does (`ENOSPC`, an I/O error of kind
    /// `StorageFull`); at [`FaultPoint::PartialTempWrite`] half the bytes
    /// are written first, as in a short write cut off by the full disk.
    NoSpace,
    /// The process "dies" here: no clean-up, and the manager is dead afterwards.
    Crash,
}

/// Code a test runs when a write reaches a point (another writer taking
/// the checkpoint over in the middle of a write, say).
type Hook = Box<dyn FnOnce() + Send>;

/// Something written and not yet durable, and how a crash undoes it.
#[derive(Debug)]
enum Unsynced {
    /// A temp file's data, not fsynced: lost (truncated to nothing).
    Data(PathBuf),
    /// A name linked or renamed into place, its directory not fsynced: the
    /// target goes back to what it was (`old`) and the temp name returns.
    Name { target: PathBuf, temp: PathBuf, old: Option<Vec<u8>> },
    /// A directory created, its parent not fsynced: gone with all it holds.
    Dir(PathBuf),
}

impl Unsynced {
    /// Undoes this change on disk, as a crash before it was synced would.
    fn undo(self) -> std::io::Result<()> {
        match self {
            Unsynced::Data(temp) => match fs::OpenOptions::new().write(true).open(&temp) {
                Ok(file) => file.set_len(0),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            },
            Unsynced::Name { target, temp, old } => {
                // The temp name comes back with the new bytes; the target with its old ones.
                if !temp.exists() && target.exists() {
                    match old {
                        Some(_) => fs::rename(&target, &temp)?,
                        None => fs::hard_link(&target, &temp)?,
                    }
                }
                match old {
                    Some(bytes) => fs::write(&target, bytes),
                    None => fs::remove_file(&target).or_else(ignore_missing),
                }
            }
            Unsynced::Dir(dir) => fs::remove_dir_all(&dir).or_else(ignore_missing),
        }
    }
}

fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) }
}

/// A local file manager with fault injection (see the module docs).
#[derive(Default)]
pub struct FaultyFileManager {
    armed: Mutex<Option<(FaultPoint, FaultMode)>>,
    hook: Mutex<Option<(FaultPoint, Hook)>>,
    crashed: AtomicBool,
    max_write: AtomicUsize,
    lose_unsynced: AtomicBool,
    unsynced: Mutex<Vec<Unsynced>>,
    /// The old content of the target of the write in progress (read before its rename).
    replaced: Mutex<Option<Vec<u8>>>,
}

impl std::fmt::Debug for FaultyFileManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyFileManager")
            .field("armed", &self.armed)
            .field("crashed", &self.crashed)
            .field("unsynced", &self.unsynced)
            .finish_non_exhaustive()
    }
}

impl FaultyFileManager {
    /// A manager that behaves like [`file_manager::LocalFileManager`] until armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Injects `mode` at `point` of the next atomic write that reaches it (once).
    pub fn arm(&self, point: FaultPoint, mode: FaultMode) {
        *lock(&self.armed) = Some((point, mode));
    }

    /// Runs `hook` when the next atomic write reaches `point` (once), then
    /// lets the write go on. [`FaultPoint::Rename`] comes after the writer's
    /// fence check and before the rename, so a hook there plays a takeover in
    /// the window the fence cannot close; a hook at an earlier point plays
    /// one the fence must catch.
    pub fn on(&self, point: FaultPoint, hook: impl FnOnce() + Send + 'static) {
        *lock(&self.hook) = Some((point, Box::new(hook)));
    }

    /// Every `write(2)` from now on takes at most `max_bytes` (at least 1).
    pub fn short_writes(&self, max_bytes: usize) {
        self.max_write.store(max_bytes.max(1), Ordering::SeqCst);
    }

    /// A crash from now on loses everything not yet synced (see the module docs).
    pub fn losing_unsynced_data(self) -> Self {
        self.lose_unsynced.store(true, Ordering::SeqCst);
        self
    }

    /// True once a [`FaultMode::Crash`] fired.
    pub fn has_crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    fn alive(&self) -> Result<()> {
        if self.has_crashed() { Err(LogStoreError::Crashed) } else { Ok(()) }
    }

    fn write(&self, path: &Path, content: Content<'_>, overwrite: Overwrite, fence: PublishCheck<'_>) -> Result<u64> {
        self.alive()?;
        file_manager::write_atomic(path, content, overwrite, fence, self)
    }

    fn run_hook(&self, point: FaultPoint) {
        let mut slot = lock(&self.hook);
        let hook = match slot.take() {
            Some((at, hook)) if at == point => Some(hook),
            other => {
                *slot = other;
                None
            }
        };
        // Run it without holding the lock: the hook may write through another manager.
        drop(slot);
        if let Some(hook) = hook {
            hook();
        }
    }

    fn tracking(&self) -> bool {
        self.lose_unsynced.load(Ordering::SeqCst)
    }

    fn unsynced(&self) -> std::sync::MutexGuard<'_, Vec<Unsynced>> {
        lock(&self.unsynced)
    }

    /// Records what the write has made (not yet) durable on reaching `point`.
    fn track(&self, point: FaultPoint, target: &Path, temp: &Path) {
        if !self.tracking() {
            return;
        }
        let mut replaced = lock(&self.replaced);
        match point {
            // The temp file exists from here, its data not synced.
            FaultPoint::PartialTempWrite => self.unsynced().push(Unsynced::Data(temp.to_path_buf())),
            // Its data was fsynced; the target is about to change.
            FaultPoint::Rename => {
                self.unsynced().retain(|u| !matches!(u, Unsynced::Data(t) if t == temp));
                *replaced = fs::read(target).ok();
            }
            FaultPoint::AfterRename => self.unsynced().push(Unsynced::Name {
                target: target.to_path_buf(),
                temp: temp.to_path_buf(),
                old: replaced.take(),
            }),
            _ => {}
        }
    }

    /// Drops what was not synced, as the crash that just happened would.
    fn lose_unsynced(&self) {
        let lost = std::mem::take(&mut *self.unsynced());
        for change in lost.into_iter().rev() {
            let what = format!("{change:?}");
            if let Err(e) = change.undo() {
                warn!(change = what, error = %e, "could not drop unsynced data at a simulated crash");
            }
        }
    }

    fn maybe_fire(&self, point: FaultPoint, path: &Path, temp: &Path) -> Result<()> {
        self.run_hook(point);
        let mut armed = lock(&self.armed);
        match *armed {
            Some((at, mode)) if at == point => {
                *armed = None;
                drop(armed);
                match mode {
                    FaultMode::Crash => {
                        self.crashed.store(true, Ordering::SeqCst);
                        if self.tracking() {
                            self.lose_unsynced();
                        }
                    }
                    FaultMode::NoSpace => {
                        let full = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device");
                        return Err(LogStoreError::io("write", temp, full));
                    }
                    FaultMode::Fail => {}
                }
                Err(LogStoreError::InjectedFault {
                    point: format!("{point:?}"),
                    crash: mode == FaultMode::Crash,
                    path: path.to_path_buf(),
                })
            }
            _ => Ok(()),
        }
    }
}

impl Observer for FaultyFileManager {
    fn at(&self, point: FaultPoint, target: &Path, temp: &Path) -> Result<()> {
        self.track(point, target, temp);
        self.maybe_fire(point, target, temp)
    }

    fn max_write(&self) -> usize {
        match self.max_write.load(Ordering::SeqCst) {
            0 => usize::MAX,
            n => n,
        }
    }

    fn created_dir(&self, dir: &Path) {
        if self.tracking() {
            self.unsynced().push(Unsynced::Dir(dir.to_path_buf()));
        }
    }

    fn synced_dir(&self, dir: &Path) {
        if self.tracking() {
            self.unsynced().retain(|u| match u {
                Unsynced::Dir(created) => parent_of(created) != dir,
                Unsynced::Name { target, .. } => parent_of(target) != dir,
                Unsynced::Data(_) => true,
            });
        }
    }
}

impl CheckpointFileManager for FaultyFileManager {
    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        self.alive()?;
        file_manager::list_dir(dir)
    }

    fn read(&self, path: &Path, max_len: u64) -> Result<Option<Vec<u8>>> {
        self.alive()?;
        file_manager::read_bounded(path, max_len)
    }

    fn create_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        self.write(path, Content::Bytes(bytes), Overwrite::Never, fence).map(drop)
    }

    fn create_atomic_streamed(&self, path: &Path, content: ContentWriter<'_>, fence: PublishCheck<'_>) -> Result<u64> {
        self.write(path, Content::Streamed(content), Overwrite::Never, fence)
    }

    fn replace_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        self.write(path, Content::Bytes(bytes), Overwrite::Replace, fence).map(drop)
    }

    fn rename_no_replace(&self, from: &Path, to: &Path, fence: PublishCheck<'_>) -> Result<()> {
        self.alive()?;
        fence()?;
        file_manager::rename_no_replace(from, to, self)
    }

    fn delete(&self, path: &Path) -> Result<bool> {
        self.alive()?;
        file_manager::delete_file(path)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        self.alive()?;
        path.try_exists().map_err(|e| LogStoreError::io("stat", path, e))
    }

    fn mkdirs(&self, dir: &Path) -> Result<()> {
        self.alive()?;
        file_manager::mkdirs(dir, self)
    }

    fn list_log(&self, dir: &Path) -> Result<file_manager::LogListing> {
        self.alive()?;
        file_manager::list_log(dir)
    }

    fn tighten_permissions(&self, dir: &Path) -> Result<Vec<file_manager::Tightened>> {
        self.alive()?;
        file_manager::tighten_permissions(dir)
    }

    fn clean_temp_files(&self, dir: &Path) -> Result<usize> {
        self.alive()?;
        file_manager::clean_temp_files(dir)
    }

    fn append(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<u64> {
        self.alive()?;
        file_manager::append(path, bytes, fence)
    }

    fn list_files_recursive(&self, dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
        self.alive()?;
        file_manager::list_files_recursive(dir)
    }

    fn acquire_lock(&self, dir: &Path, clock: Arc<dyn Clock>, _lease: &LeaseSettings) -> Result<WriterLock> {
        self.alive()?;
        WriterLock::acquire(dir, clock.as_ref())
    }

    fn lock_status(&self, dir: &Path, _clock: &dyn Clock) -> LockStatus {
        crate::lock::local_lock_status(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_manager::NO_FENCE;
    use std::fs;

    #[test]
    fn crash_leaves_temp_and_kills_the_manager() {
        let dir = tempfile::tempdir().unwrap();
        let fm = FaultyFileManager::new();
        fm.arm(FaultPoint::PartialTempWrite, FaultMode::Crash);
        let err = fm.create_atomic(&dir.path().join("0"), b"0123456789", NO_FENCE).unwrap_err();
        assert!(
            matches!(err, LogStoreError::InjectedFault { ref point, crash: true, .. } if point == "PartialTempWrite")
        );
        assert!(fm.has_crashed());
        assert!(matches!(fm.list(dir.path()), Err(LogStoreError::Crashed)));
        // The half-written temp file is left on disk, as a dead process would leave it.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1);
        let temp = dir.path().join(&names[0]);
        assert_eq!(fs::read(temp).unwrap(), b"01234");
    }

    #[test]
    fn fail_cleans_up_and_fires_once() {
        let dir = tempfile::tempdir().unwrap();
        let fm = FaultyFileManager::new();
        fm.arm(FaultPoint::TempFsync, FaultMode::Fail);
        let path = dir.path().join("0");
        assert!(fm.create_atomic(&path, b"abc", NO_FENCE).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        fm.create_atomic(&path, b"abc", NO_FENCE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"abc");
    }
}
