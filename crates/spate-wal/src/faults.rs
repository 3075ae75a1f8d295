//! Fault injection: [`HookedFiles`] wraps the real file layer with a public
//! [`FaultInjection`] hook that counts operations, fails chosen ones, holds
//! a sync until a test releases it, and simulates a crash.
//!
//! A simulated crash ([`FaultInjection::simulate_crash`], with
//! [`FaultInjection::lose_unsynced_data`] on) undoes what a real one would
//! lose: bytes written since the file's last successful sync, and files
//! whose directory entry no directory sync covered. A missing `fdatasync`
//! or directory `fsync` then shows up in a test as lost data. The model is
//! coarse where the kernel is not deterministic: unsynced bytes are always
//! all lost (a real crash may keep some, in any order), and a rename is
//! taken as durable at once.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use spate_core::sync::lock;

use crate::files::{FileLayer, RealFiles, SegmentWriter};

/// How an append chosen with [`FaultInjection::fault_append_number`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendFault {
    /// The device fills up (`ENOSPC`) after the first `written` bytes of
    /// the append reached the file.
    NoSpace {
        /// Bytes written before the failure.
        written: u64,
    },
    /// The write stops short after `written` bytes, and writing the rest
    /// fails with an I/O error.
    Short {
        /// Bytes written before the failure.
        written: u64,
    },
}

/// A test hook on a log's file layer: counts operations, fails the k-th
/// one of a kind on request, holds a sync until released, and simulates
/// a crash that loses unsynced data.
///
/// Clones share their state, so a test keeps one clone and gives the
/// other to [`crate::WalSettings::with_fault_injection`]. Counting starts at
/// zero when the hook is created; numbers passed to the `fail_*` methods are
/// 1-based positions in that count (the 3rd sync is number 3), and 0 turns
/// a failure off. A failed operation does nothing (unless said otherwise)
/// and returns an `EIO`-like error.
///
/// ```
/// use spate_wal::FaultInjection;
///
/// let hook = FaultInjection::new();
/// hook.fail_sync_number(hook.sync_count() + 1); // the next fdatasync fails
/// assert_eq!(hook.sync_count(), 0);
/// ```
#[derive(Clone, Debug, Default)]
pub struct FaultInjection {
    state: Arc<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    syncs: AtomicU64,
    dir_syncs: AtomicU64,
    appends: AtomicU64,
    opens: AtomicU64,
    truncates: AtomicU64,
    renames: AtomicU64,
    /// Every operation that changes a file or directory.
    operations: AtomicU64,
    fail_sync_at: AtomicU64,
    fail_append_at: AtomicU64,
    fail_truncate_at: AtomicU64,
    fail_dir_sync_at: AtomicU64,
    fail_rename_at: AtomicU64,
    append_fault: Mutex<Option<(u64, AppendFault)>>,
    holds: Mutex<Vec<(HoldPoint, u64, Arc<Gate>)>>,
    /// When set, the operation after this many fails as a crash.
    crash_after: Mutex<Option<u64>>,
    crashed: AtomicBool,
    lose_unsynced: AtomicBool,
    tracked: Mutex<HashMap<PathBuf, Track>>,
}

/// What a crash would leave of a file, as far as the hook saw it written.
#[derive(Clone, Copy, Debug)]
struct Track {
    /// Bytes of the file that are durable whatever happens to later writes
    /// (zeros in a zeroed spare, old contents of a file opened to append).
    base_len: u64,
    /// Written bytes up to here are durable.
    synced: u64,
    /// Where the furthest write ended.
    written_end: u64,
    /// A directory sync covered the file's entry.
    durable_entry: bool,
}

/// The operations a test can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HoldPoint {
    Sync,
    Append,
}

/// A rendezvous between a held operation and the test holding it.
#[derive(Debug, Default)]
struct Gate {
    /// (the sync reached the gate, the test released it)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

/// An operation held by [`FaultInjection::hold_sync_number`] or
/// [`FaultInjection::hold_append_number`]: it waits, inside the call (before
/// it does anything), until [`SyncHold::release`] or until this is dropped.
#[derive(Debug)]
pub struct SyncHold {
    gate: Arc<Gate>,
}

impl SyncHold {
    /// Blocks until the held operation has started (and is waiting).
    pub fn wait_until_reached(&self) {
        let mut state = lock(&self.gate.state);
        while !state.0 {
            state = self.gate.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Lets the held operation go on.
    pub fn release(&self) {
        lock(&self.gate.state).1 = true;
        self.gate.changed.notify_all();
    }
}

impl Drop for SyncHold {
    fn drop(&mut self) {
        self.release();
    }
}

/// Whether an operation runs, or the simulated crash happens now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gatekeeping {
    Proceed,
    CrashNow,
}

impl FaultInjection {
    /// A hook with zeroed counters that fails nothing.
    pub fn new() -> Self {
        FaultInjection::default()
    }

    /// `fdatasync` calls on segment files so far, failed ones included.
    pub fn sync_count(&self) -> u64 {
        self.state.syncs.load(Ordering::SeqCst)
    }

    /// `fsync` calls on the log directory so far, failed ones included.
    pub fn dir_sync_count(&self) -> u64 {
        self.state.dir_syncs.load(Ordering::SeqCst)
    }

    /// Append calls (one per batch of records) so far, failed ones included.
    pub fn append_count(&self) -> u64 {
        self.state.appends.load(Ordering::SeqCst)
    }

    /// Segment files opened for appending so far.
    pub fn open_count(&self) -> u64 {
        self.state.opens.load(Ordering::SeqCst)
    }

    /// Truncations so far, failed ones included.
    pub fn truncate_count(&self) -> u64 {
        self.state.truncates.load(Ordering::SeqCst)
    }

    /// Renames so far, failed ones included.
    pub fn rename_count(&self) -> u64 {
        self.state.renames.load(Ordering::SeqCst)
    }

    /// Operations that change a file or directory so far (appends, syncs,
    /// opens for appending, truncations, renames, deletions, zeroing,
    /// creations and links): what [`FaultInjection::crash_after_operations`] counts.
    pub fn operation_count(&self) -> u64 {
        self.state.operations.load(Ordering::SeqCst)
    }

    /// Makes the `n`-th `fdatasync` fail.
    pub fn fail_sync_number(&self, n: u64) {
        self.state.fail_sync_at.store(n, Ordering::SeqCst);
    }

    /// Makes the `n`-th append fail without writing anything.
    pub fn fail_append_number(&self, n: u64) {
        self.state.fail_append_at.store(n, Ordering::SeqCst);
    }

    /// Makes the `n`-th append fail as `fault` says, after writing part of it.
    pub fn fault_append_number(&self, n: u64, fault: AppendFault) {
        *lock(&self.state.append_fault) = Some((n, fault));
    }

    /// Makes the `n`-th truncation fail.
    pub fn fail_truncate_number(&self, n: u64) {
        self.state.fail_truncate_at.store(n, Ordering::SeqCst);
    }

    /// Makes the `n`-th directory `fsync` fail.
    pub fn fail_dir_sync_number(&self, n: u64) {
        self.state.fail_dir_sync_at.store(n, Ordering::SeqCst);
    }

    /// Makes the `n`-th rename fail.
    pub fn fail_rename_number(&self, n: u64) {
        self.state.fail_rename_at.store(n, Ordering::SeqCst);
    }

    /// Holds the `n`-th `fdatasync` inside the call until the returned
    /// hold is released or dropped, so a test can order other events
    /// around a sync in progress without sleeping.
    pub fn hold_sync_number(&self, n: u64) -> SyncHold {
        self.hold(HoldPoint::Sync, n)
    }

    /// Holds the `n`-th append inside the call, before it writes anything,
    /// until the returned hold is released or dropped: the commit leader
    /// holds the writer lock meanwhile, so writers queue up behind it.
    pub fn hold_append_number(&self, n: u64) -> SyncHold {
        self.hold(HoldPoint::Append, n)
    }

    fn hold(&self, point: HoldPoint, n: u64) -> SyncHold {
        let gate = Arc::new(Gate::default());
        lock(&self.state.holds).push((point, n, Arc::clone(&gate)));
        SyncHold { gate }
    }

    /// Waits at the gate of the `n`-th operation at `point`, if a test holds it.
    fn wait_if_held(&self, point: HoldPoint, n: u64) {
        let gate = lock(&self.state.holds)
            .iter()
            .find(|(p, at, _)| *p == point && *at == n)
            .map(|(_, _, gate)| Arc::clone(gate));
        if let Some(gate) = gate {
            let mut state = lock(&gate.state);
            state.0 = true;
            gate.changed.notify_all();
            while !state.1 {
                state = gate.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    /// Keeps track of what each file would lose in a crash, for
    /// [`FaultInjection::simulate_crash`]; turn it on before the log opens.
    pub fn lose_unsynced_data(&self) {
        self.state.lose_unsynced.store(true, Ordering::SeqCst);
    }

    /// Makes the process "crash" at the operation after the next `n`: it
    /// and every later one fail; a crashing append writes half its bytes
    /// first (a torn write).
    pub fn crash_after_operations(&self, n: u64) {
        *lock(&self.state.crash_after) = Some(self.operation_count() + n);
    }

    /// Whether the simulated crash happened.
    pub fn crashed(&self) -> bool {
        self.state.crashed.load(Ordering::SeqCst)
    }

    /// Crashes now: every later operation through this hook fails, and with
    /// [`FaultInjection::lose_unsynced_data`] on, every byte written since
    /// its file's last successful sync is dropped (zeroed where the file
    /// held zeros before, cut off otherwise), and every file whose entry no
    /// directory sync covered is deleted. Forget the log first
    /// (`std::mem::forget`), as a dead process does not close it; reopen it
    /// with a new hook.
    pub fn simulate_crash(&self) -> io::Result<()> {
        self.state.crashed.store(true, Ordering::SeqCst);
        let tracked = std::mem::take(&mut *lock(&self.state.tracked));
        for (path, track) in tracked {
            lose_unsynced(&path, track)?;
        }
        Ok(())
    }

    /// Counts an operation that changes the file system, and says whether
    /// the simulated crash happens at it.
    fn begin(&self, op: &str) -> io::Result<Gatekeeping> {
        if self.crashed() {
            return Err(io::Error::other(format!("{op} after the simulated crash")));
        }
        let n = self.state.operations.fetch_add(1, Ordering::SeqCst) + 1;
        if lock(&self.state.crash_after).is_some_and(|after| n > after) {
            self.state.crashed.store(true, Ordering::SeqCst);
            return Ok(Gatekeeping::CrashNow);
        }
        Ok(Gatekeeping::Proceed)
    }

    /// [`FaultInjection::begin`] for an operation that does nothing when it crashes.
    fn begin_whole(&self, op: &str) -> io::Result<()> {
        match self.begin(op)? {
            Gatekeeping::Proceed => Ok(()),
            Gatekeeping::CrashNow => Err(io::Error::other(format!("simulated crash at {op}"))),
        }
    }

    fn on_sync(&self) -> io::Result<()> {
        self.begin_whole("fdatasync")?;
        let n = self.state.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        self.wait_if_held(HoldPoint::Sync, n);
        injected_failure(n, &self.state.fail_sync_at, "fdatasync")
    }

    fn tracking(&self) -> Option<MutexGuard<'_, HashMap<PathBuf, Track>>> {
        self.state.lose_unsynced.load(Ordering::SeqCst).then(|| lock(&self.state.tracked))
    }
}

fn injected_failure(n: u64, fail_at: &AtomicU64, op: &str) -> io::Result<()> {
    if fail_at.load(Ordering::SeqCst) == n {
        Err(io::Error::other(format!("injected failure of {op} number {n}")))
    } else {
        Ok(())
    }
}

/// Drops what a crash loses of the file at `path`.
fn lose_unsynced(path: &Path, track: Track) -> io::Result<()> {
    if !track.durable_entry {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    if track.written_end <= track.synced {
        return Ok(());
    }
    let mut file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // Within the old durable bytes (zeros of a spare), the lost writes read
    // as what was there: zeros; beyond them the file is cut.
    let zero_end = track.written_end.min(track.base_len);
    if zero_end > track.synced {
        let zeros = vec![0u8; usize::try_from(zero_end - track.synced).unwrap_or(usize::MAX)];
        file.seek(SeekFrom::Start(track.synced))?;
        file.write_all(&zeros)?;
    }
    if track.written_end > track.base_len {
        file.set_len(track.base_len.max(track.synced))?;
    }
    file.sync_all()
}

/// The first `n` bytes of `bufs`.
fn prefix<'a>(bufs: &[&'a [u8]], mut n: u64) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for buf in bufs {
        let take = (buf.len() as u64).min(n) as usize;
        if take == 0 {
            break;
        }
        out.push(&buf[..take]);
        n -= take as u64;
    }
    out
}

/// The real file layer behind a [`FaultInjection`] hook.
#[derive(Debug)]
pub(crate) struct HookedFiles {
    inner: RealFiles,
    hook: FaultInjection,
}

impl HookedFiles {
    pub(crate) fn new(inner: RealFiles, hook: FaultInjection) -> Self {
        HookedFiles { inner, hook }
    }

    fn track(&self, path: &Path, change: impl FnOnce(&mut Track)) {
        if let Some(mut tracked) = self.hook.tracking()
            && let Some(track) = tracked.get_mut(path)
        {
            change(track);
        }
    }
}

struct HookedSegment {
    inner: Arc<dyn SegmentWriter>,
    hook: FaultInjection,
    path: PathBuf,
    /// Where the next append goes.
    pos: AtomicU64,
}

impl HookedSegment {
    /// Appends the first `written` bytes, records them, and fails with `error`.
    fn append_part(&self, bufs: &[&[u8]], written: u64, error: io::Error) -> io::Result<()> {
        let part = prefix(bufs, written);
        self.inner.append(&part)?;
        self.advance(part.iter().map(|b| b.len() as u64).sum());
        Err(error)
    }

    fn advance(&self, bytes: u64) {
        let end = self.pos.fetch_add(bytes, Ordering::SeqCst) + bytes;
        if let Some(mut tracked) = self.hook.tracking()
            && let Some(track) = tracked.get_mut(&self.path)
        {
            track.written_end = track.written_end.max(end);
        }
    }
}

impl SegmentWriter for HookedSegment {
    fn append(&self, bufs: &[&[u8]]) -> io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if self.hook.begin("append")? == Gatekeeping::CrashNow {
            return self.append_part(bufs, total / 2, io::Error::other("simulated crash during an append"));
        }
        let n = self.hook.state.appends.fetch_add(1, Ordering::SeqCst) + 1;
        self.hook.wait_if_held(HoldPoint::Append, n);
        injected_failure(n, &self.hook.state.fail_append_at, "append")?;
        let fault = *lock(&self.hook.state.append_fault);
        match fault {
            Some((at, AppendFault::NoSpace { written })) if at == n => {
                let error = io::Error::new(io::ErrorKind::StorageFull, format!("injected ENOSPC in append number {n}"));
                self.append_part(bufs, written.min(total), error)
            }
            Some((at, AppendFault::Short { written })) if at == n => {
                let error = io::Error::other(format!("injected short write in append number {n}"));
                self.append_part(bufs, written.min(total), error)
            }
            _ => {
                self.inner.append(bufs)?;
                self.advance(total);
                Ok(())
            }
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        self.hook.on_sync()?;
        self.inner.sync_data()?;
        if let Some(mut tracked) = self.hook.tracking()
            && let Some(track) = tracked.get_mut(&self.path)
        {
            track.synced = track.synced.max(track.written_end);
        }
        Ok(())
    }
}

impl FileLayer for HookedFiles {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn restrict_mode(&self, path: &Path, allowed: u32) -> io::Result<Option<u32>> {
        self.inner.restrict_mode(path, allowed)
    }

    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.hook.begin_whole("create")?;
        self.inner.create_new(path, bytes)?;
        let len = bytes.len() as u64;
        if let Some(mut tracked) = self.hook.tracking() {
            tracked
                .insert(path.to_path_buf(), Track { base_len: 0, synced: len, written_end: len, durable_entry: false });
        }
        Ok(())
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.hook.begin_whole("link")?;
        self.inner.link(from, to)?;
        if let Some(mut tracked) = self.hook.tracking()
            && let Some(track) = tracked.get(from).copied()
        {
            tracked.insert(to.to_path_buf(), Track { durable_entry: false, ..track });
        }
        Ok(())
    }

    fn direct_bytes(&self) -> u64 {
        self.inner.direct_bytes()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn open_append(&self, path: &Path, direct: bool, at: Option<u64>) -> io::Result<(Arc<dyn SegmentWriter>, u64)> {
        self.hook.begin_whole("open")?;
        self.hook.state.opens.fetch_add(1, Ordering::SeqCst);
        let existing = std::fs::metadata(path).ok().map(|m| m.len());
        let (inner, start) = self.inner.open_append(path, direct, at)?;
        if let Some(mut tracked) = self.hook.tracking() {
            tracked.entry(path.to_path_buf()).or_insert_with(|| match existing {
                Some(len) => Track { base_len: len, synced: len, written_end: len, durable_entry: true },
                None => Track { base_len: 0, synced: 0, written_end: 0, durable_entry: false },
            });
        }
        let segment =
            HookedSegment { inner, hook: self.hook.clone(), path: path.to_path_buf(), pos: AtomicU64::new(start) };
        Ok((Arc::new(segment), start))
    }

    fn open_read(&self, path: &Path) -> io::Result<File> {
        self.inner.open_read(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        self.hook.begin_whole("truncate")?;
        let n = self.hook.state.truncates.fetch_add(1, Ordering::SeqCst) + 1;
        injected_failure(n, &self.hook.state.fail_truncate_at, "truncate")?;
        self.inner.truncate(path, len)?;
        // The truncation syncs the whole file.
        self.track(path, |t| *t = Track { base_len: len, synced: len, written_end: len, ..*t });
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.hook.begin_whole("remove")?;
        self.inner.remove(path)?;
        if let Some(mut tracked) = self.hook.tracking() {
            tracked.remove(path);
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.hook.begin_whole("rename")?;
        let n = self.hook.state.renames.fetch_add(1, Ordering::SeqCst) + 1;
        injected_failure(n, &self.hook.state.fail_rename_at, "rename")?;
        self.inner.rename(from, to)?;
        if let Some(mut tracked) = self.hook.tracking() {
            let track = tracked.remove(from);
            tracked.remove(to);
            if let Some(track) = track {
                tracked.insert(to.to_path_buf(), track);
            }
        }
        Ok(())
    }

    fn zero(&self, path: &Path) -> io::Result<()> {
        self.hook.begin_whole("zero")?;
        self.inner.zero(path)?;
        // Zeroing syncs: the whole length is durable zeros.
        let len = self.inner.len(path)?;
        self.track(path, |t| *t = Track { base_len: len, synced: 0, written_end: 0, ..*t });
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.hook.begin_whole("fsync directory")?;
        let n = self.hook.state.dir_syncs.fetch_add(1, Ordering::SeqCst) + 1;
        injected_failure(n, &self.hook.state.fail_dir_sync_at, "fsync directory")?;
        self.inner.sync_dir(dir)?;
        if let Some(mut tracked) = self.hook.tracking() {
            for (path, track) in tracked.iter_mut() {
                if path.parent() == Some(dir) {
                    track.durable_entry = true;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::file_layer;

    #[test]
    fn hook_counts_and_fails_the_chosen_sync() {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        let files = file_layer(&crate::WalSettings::default().with_fault_injection(hook.clone()));
        let (seg, len) = files.open_append(&dir.path().join("f"), false, None).unwrap();
        assert_eq!(len, 0);
        hook.fail_sync_number(2);
        seg.append(&[b"ab", b"", b"cd"]).unwrap();
        seg.sync_data().unwrap();
        assert!(seg.sync_data().is_err());
        seg.sync_data().unwrap();
        assert_eq!(hook.sync_count(), 3);
        assert_eq!(hook.append_count(), 1);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"abcd");
    }
}
