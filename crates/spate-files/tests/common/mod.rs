//! What the file sink's tests share: a file manager that "crashes" at a
//! chosen step of the sink's protocol, and a reader that applies the rule
//! the crate documents for readers.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use spate_core::Clock;
use spate_files::CheckpointFileManager;
use spate_logstore::{
    FaultMode, FaultPoint, FaultyFileManager, FileVersion, LeaseSettings, LockStatus, LogListing, LogStoreError,
    PublishCheck, Result, Tightened, WriterLock,
};

/// A record of the tests: an id and an event time.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Event {
    pub id: u64,
    pub at: i64,
}

/// Where a [`Steps`] manager crashes its chosen step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Before the step does anything.
    Before,
    /// Inside an atomic write, at this point of the log store's protocol
    /// (the inner manager must be a [`FaultyFileManager`]).
    Inside(FaultPoint),
}

/// A file manager that numbers the calls that change something (create,
/// replace, move, delete, make a directory) and "crashes" at one of them:
/// that call and every call after it fail, as in a dead process.
#[derive(Debug)]
pub struct Steps {
    inner: Arc<dyn CheckpointFileManager>,
    faulty: Option<Arc<FaultyFileManager>>,
    crash_at: AtomicUsize,
    mode: CrashMode,
    count: AtomicUsize,
    dead: AtomicBool,
    /// The kind of each step taken, in order.
    pub kinds: std::sync::Mutex<Vec<&'static str>>,
}

impl Steps {
    /// Over `inner`, crashing at step `crash_at` (`usize::MAX`: never).
    pub fn new(inner: Arc<dyn CheckpointFileManager>, crash_at: usize) -> Self {
        Steps {
            inner,
            faulty: None,
            crash_at: AtomicUsize::new(crash_at),
            mode: CrashMode::Before,
            count: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            kinds: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Over a local fault-injecting manager that loses what was not synced.
    pub fn local(crash_at: usize, mode: CrashMode) -> Self {
        let faulty = Arc::new(FaultyFileManager::new().losing_unsynced_data());
        let mut steps = Steps::new(Arc::clone(&faulty) as Arc<dyn CheckpointFileManager>, crash_at);
        steps.faulty = Some(faulty);
        steps.mode = mode;
        steps
    }

    /// Crashes at the `steps`-th changing call from now (0: the next one).
    pub fn crash_in(&self, steps: usize) {
        self.crash_at.store(self.taken() + steps, Ordering::SeqCst);
    }

    /// How many changing calls were made.
    pub fn taken(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// True once the crash happened.
    pub fn crashed(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn alive(&self) -> Result<()> {
        if self.crashed() { Err(LogStoreError::Crashed) } else { Ok(()) }
    }

    /// Numbers one changing call of `kind`; crashes here if it is the chosen one.
    fn step(&self, kind: &'static str) -> Result<()> {
        self.alive()?;
        let n = self.count.fetch_add(1, Ordering::SeqCst);
        self.kinds.lock().unwrap().push(kind);
        if n != self.crash_at.load(Ordering::SeqCst) {
            return Ok(());
        }
        match (self.mode, &self.faulty) {
            (CrashMode::Inside(point), Some(faulty)) if kind == "create" => {
                faulty.arm(point, FaultMode::Crash);
                Ok(())
            }
            _ => {
                self.dead.store(true, Ordering::SeqCst);
                Err(LogStoreError::Crashed)
            }
        }
    }

    /// The inner call's result; a crash inside it kills this manager too.
    fn watch<T>(&self, result: Result<T>) -> Result<T> {
        if self.faulty.as_ref().is_some_and(|f| f.has_crashed()) {
            self.dead.store(true, Ordering::SeqCst);
        }
        result
    }
}

impl CheckpointFileManager for Steps {
    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        self.alive()?;
        self.inner.list(dir)
    }
    fn read(&self, path: &Path, max_len: u64) -> Result<Option<Vec<u8>>> {
        self.alive()?;
        self.inner.read(path, max_len)
    }
    fn create_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        self.step("create")?;
        self.watch(self.inner.create_atomic(path, bytes, fence))
    }
    fn replace_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        self.step("replace")?;
        self.watch(self.inner.replace_atomic(path, bytes, fence))
    }
    fn rename_no_replace(&self, from: &Path, to: &Path, fence: PublishCheck<'_>) -> Result<()> {
        self.step("move")?;
        self.watch(self.inner.rename_no_replace(from, to, fence))
    }
    fn delete(&self, path: &Path) -> Result<bool> {
        self.step("delete")?;
        self.watch(self.inner.delete(path))
    }
    fn exists(&self, path: &Path) -> Result<bool> {
        self.alive()?;
        self.inner.exists(path)
    }
    fn mkdirs(&self, dir: &Path) -> Result<()> {
        self.step("mkdirs")?;
        self.watch(self.inner.mkdirs(dir))
    }
    fn list_log(&self, dir: &Path) -> Result<LogListing> {
        self.alive()?;
        self.inner.list_log(dir)
    }
    fn tighten_permissions(&self, dir: &Path) -> Result<Vec<Tightened>> {
        self.alive()?;
        self.inner.tighten_permissions(dir)
    }
    fn clean_temp_files(&self, dir: &Path) -> Result<usize> {
        self.alive()?;
        self.inner.clean_temp_files(dir)
    }
    fn read_versioned(&self, path: &Path, max_len: u64) -> Result<Option<(Vec<u8>, FileVersion)>> {
        self.alive()?;
        self.inner.read_versioned(path, max_len)
    }
    fn append(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<u64> {
        self.step("append")?;
        self.watch(self.inner.append(path, bytes, fence))
    }
    fn list_files_recursive(&self, dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
        self.alive()?;
        self.inner.list_files_recursive(dir)
    }
    fn acquire_lock(&self, dir: &Path, clock: Arc<dyn Clock>, lease: &LeaseSettings) -> Result<WriterLock> {
        self.alive()?;
        self.inner.acquire_lock(dir, clock, lease)
    }
    fn lock_status(&self, dir: &Path, clock: &dyn Clock) -> LockStatus {
        self.inner.lock_status(dir, clock)
    }
    fn is_object_store(&self) -> bool {
        self.inner.is_object_store()
    }
}

/// What a reader following the crate's rule sees under `root`: every file
/// under `dt=…` whose name starts with neither `_` nor `.`, by path, each
/// parsed line by line (a half line fails the parse, so the test).
pub fn visible<T: serde::de::DeserializeOwned>(
    files: &dyn CheckpointFileManager,
    root: &Path,
) -> BTreeMap<PathBuf, Vec<T>> {
    let mut seen = BTreeMap::new();
    for (path, _) in files.list_files_recursive(root).unwrap() {
        let hidden = path.iter().any(|part| part.to_str().is_some_and(|p| p.starts_with('_') || p.starts_with('.')));
        if hidden || !path.iter().next().is_some_and(|p| p.to_str().is_some_and(|p| p.starts_with("dt="))) {
            continue;
        }
        let bytes = files.read(&root.join(&path), 1 << 30).unwrap().unwrap();
        assert!(bytes.ends_with(b"\n"), "{} does not end with a whole line", path.display());
        let events = bytes
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_slice(line).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .collect();
        seen.insert(path, events);
    }
    seen
}

/// Every record a reader sees, sorted.
pub fn visible_records(files: &dyn CheckpointFileManager, root: &Path) -> Vec<Event> {
    let mut all: Vec<Event> = visible::<Event>(files, root).into_values().flatten().collect();
    all.sort();
    all
}

/// Everything under `root/<dir>` (the sink's hidden directories).
pub fn hidden_files(files: &dyn CheckpointFileManager, root: &Path, dir: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> =
        files.list_files_recursive(&root.join(dir)).unwrap().into_iter().map(|(p, _)| p).collect();
    found.sort();
    found
}
