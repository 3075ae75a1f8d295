//! A [`CheckpointFileManager`] that injects faults into atomic writes, for
//! crash tests.
//!
//! Arm it with a [`FaultPoint`] and a [`FaultMode`]; the next atomic write
//! that reaches that point either fails there (an I/O error; the writer
//! cleans up as it would after a real error) or "crashes" there: it stops,
//! leaving the disk exactly as it is, and from then on every call fails with
//! [`LogStoreError::Crashed`], like a dead process. Reopening the directory
//! with a fresh manager is then the recovery under test.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::{LogStoreError, Result};
use crate::file_manager::{self, CheckpointFileManager, Overwrite};

/// A point in the atomic write protocol where a fault can be injected.
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

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultMode {
    /// The step fails with an error; the writer's error handling runs.
    Fail,
    /// The process "dies" here: no clean-up, and the manager is dead afterwards.
    Crash,
}

/// A local file manager with fault injection (see the module docs).
#[derive(Debug, Default)]
pub struct FaultyFileManager {
    armed: Mutex<Option<(FaultPoint, FaultMode)>>,
    crashed: AtomicBool,
}

impl FaultyFileManager {
    /// A manager that behaves like [`file_manager::LocalFileManager`] until armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Injects `mode` at `point` of the next atomic write that reaches it (once).
    pub fn arm(&self, point: FaultPoint, mode: FaultMode) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) = Some((point, mode));
    }

    /// True once a [`FaultMode::Crash`] fired.
    pub fn has_crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    fn alive(&self) -> Result<()> {
        if self.has_crashed() { Err(LogStoreError::Crashed) } else { Ok(()) }
    }

    fn write(&self, path: &Path, bytes: &[u8], overwrite: Overwrite) -> Result<()> {
        self.alive()?;
        file_manager::write_atomic(path, bytes, overwrite, &mut |point| self.maybe_fire(point, path))
    }

    fn maybe_fire(&self, point: FaultPoint, path: &Path) -> Result<()> {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        match *armed {
            Some((at, mode)) if at == point => {
                *armed = None;
                if mode == FaultMode::Crash {
                    self.crashed.store(true, Ordering::SeqCst);
                }
                Err(LogStoreError::InjectedFault { point, mode, path: path.to_path_buf() })
            }
            _ => Ok(()),
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

    fn create_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        self.write(path, bytes, Overwrite::Never)
    }

    fn replace_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        self.write(path, bytes, Overwrite::Replace)
    }

    fn rename_no_replace(&self, from: &Path, to: &Path) -> Result<()> {
        self.alive()?;
        file_manager::rename_no_replace(from, to)
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
        file_manager::mkdirs(dir)
    }

    fn list_batch_ids(&self, dir: &Path) -> Result<Vec<spate_core::BatchId>> {
        self.alive()?;
        file_manager::list_batch_ids(dir)
    }

    fn clean_temp_files(&self, dir: &Path) -> Result<usize> {
        self.alive()?;
        file_manager::clean_temp_files(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn crash_leaves_temp_and_kills_the_manager() {
        let dir = tempfile::tempdir().unwrap();
        let fm = FaultyFileManager::new();
        fm.arm(FaultPoint::PartialTempWrite, FaultMode::Crash);
        let err = fm.create_atomic(&dir.path().join("0"), b"0123456789").unwrap_err();
        assert!(matches!(err, LogStoreError::InjectedFault { point: FaultPoint::PartialTempWrite, .. }));
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
        assert!(fm.create_atomic(&path, b"abc").is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        fm.create_atomic(&path, b"abc").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"abc");
    }
}
