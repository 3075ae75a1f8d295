//! The writer lock of a checkpoint directory: one live writer at a time,
//! and a fencing epoch so a writer that lost the lock can never write.
//!
//! `<checkpoint>/LOCK` carries an OS file lock (`flock`), held for the life
//! of the [`WriterLock`] and released by the kernel when the process dies,
//! and, as JSON, who holds it: pid, host, start time and the **epoch**. The
//! epoch goes up by one at every acquisition, so each writer has its own.
//! Before each change, a writer reads the lock file again by name and checks
//! the epoch is still its own ([`EpochFence::check`]); if another writer took
//! over (the OS lock was lost: the file was deleted, or a shared file system
//! does not honour locks) the stale writer gets [`LogStoreError::StaleEpoch`].
//! [`EpochFence`] is also a [`spate_core::WriterFence`], so layers below the
//! log store (the write-ahead log, the block tracker) check the same epoch.
//!
//! The lock file is a versioned log entry: a `v1` line, then the holder as
//! JSON with its checksum (see [`crate::encode_entry`]). Lock files written
//! before the version line existed (bare JSON) are still read.
//!
//! In an object store there is no OS lock: `LOCK` is a lease with an expiry
//! time, renewed while the writer runs (see [`LeaseSettings`] and the
//! `lease` module); the fence then checks the lease instead of the file.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spate_core::{Clock, Duration, WriterFence};
use tracing::{info, warn};

use crate::error::{LogStoreError, Result};
use crate::file_manager::{FILE_MODE, fsync_dir};
use crate::holder::LockHolder;
use crate::log::{Json, decode_entry, encode_entry};

/// The lock file's name in a checkpoint directory.
pub const LOCK_FILE: &str = "LOCK";
pub(crate) const MAX_LOCK_FILE_BYTES: u64 = 4096;

/// What the lock file says now, read by name.
#[derive(Debug)]
pub(crate) enum OnDisk {
    Missing,
    Unreadable(String),
    Holder(LockHolder),
}

fn read_lock_file(path: &Path) -> OnDisk {
    match crate::file_manager::read_bounded(path, MAX_LOCK_FILE_BYTES) {
        Ok(None) => OnDisk::Missing,
        Ok(Some(bytes)) if bytes.is_empty() => OnDisk::Unreadable("empty".to_string()),
        Ok(Some(bytes)) => decode_holder(path, &bytes),
        Err(e) => OnDisk::Unreadable(e.to_string()),
    }
}

pub(crate) fn decode_holder(path: &Path, bytes: &[u8]) -> OnDisk {
    match decode_lock_file(path, bytes) {
        Ok(holder) => OnDisk::Holder(holder),
        Err(e) => OnDisk::Unreadable(e.to_string()),
    }
}

/// Decodes the bytes of a lock file: a `v1` entry with its checksum, or the
/// bare JSON that builds before the version line wrote. `path` names the
/// file in errors.
pub fn decode_lock_file(path: &Path, bytes: &[u8]) -> Result<LockHolder> {
    if bytes.first() == Some(&b'{') {
        return serde_json::from_slice(bytes).map_err(|e| LogStoreError::Malformed {
            path: path.to_path_buf(),
            line: e.line(),
            reason: e.to_string(),
        });
    }
    decode_entry::<Json<LockHolder>>(path, bytes).map(|json| json.0)
}

/// The bytes of a lock file naming `holder` (`path` names the file in errors).
pub fn encode_lock_file(path: &Path, holder: &LockHolder) -> Result<Vec<u8>> {
    encode_entry(&Json(holder.clone())).map_err(|reason| LogStoreError::Encode { path: path.to_path_buf(), reason })
}

/// The last holder recorded in `<dir>/LOCK`, whether or not it is alive.
/// `None` when there is no lock file or it cannot be read.
pub fn read_lock_holder(dir: &Path) -> Option<LockHolder> {
    match read_lock_file(&dir.join(LOCK_FILE)) {
        OnDisk::Holder(holder) => Some(holder),
        OnDisk::Missing | OnDisk::Unreadable(_) => None,
    }
}

/// A writer's proof that it still owns the checkpoint: its epoch, checked
/// against the lock file before every change.
#[derive(Debug)]
pub struct EpochFence {
    dir: PathBuf,
    epoch: u64,
    /// On an object store: the lease this writer holds, checked instead of a lock file.
    lease: Option<Arc<crate::lease::LeaseState>>,
}

impl EpochFence {
    /// The epoch this writer acquired.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Ok while the lock file still shows this writer's epoch (on an object
    /// store: while this writer's lease has not run out nor been taken;
    /// a lease that ran short while the store was away is waited for until
    /// its renewal lands, see the `lease` module).
    pub fn check(&self) -> Result<()> {
        if let Some(lease) = &self.lease {
            return lease.check_patiently();
        }
        let stale = |on_disk: String| LogStoreError::StaleEpoch { dir: self.dir.clone(), ours: self.epoch, on_disk };
        match read_lock_file(&self.dir.join(LOCK_FILE)) {
            OnDisk::Holder(holder) if holder.epoch == self.epoch => Ok(()),
            OnDisk::Holder(holder) => Err(stale(format!("epoch {}, held by {holder}", holder.epoch))),
            OnDisk::Missing => Err(stale("nothing (the lock file is gone)".to_string())),
            OnDisk::Unreadable(reason) => Err(stale(format!("something unreadable ({reason})"))),
        }
    }
}

#[cfg(all(test, feature = "s3"))]
impl EpochFence {
    /// The lease behind this fence, for tests of its locking.
    pub(crate) fn lease(&self) -> Option<&Arc<crate::lease::LeaseState>> {
        self.lease.as_ref()
    }
}

impl EpochFence {
    /// [`EpochFence::check`], and on an object store also the lease as it is
    /// on the store now (a request): for a change that nothing else would
    /// refuse once a newer writer holds the checkpoint, such as a delete.
    pub fn confirm(&self) -> Result<()> {
        match &self.lease {
            Some(lease) => lease.confirm(),
            None => self.check(),
        }
    }
}

impl WriterFence for EpochFence {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn check(&self) -> std::result::Result<(), String> {
        EpochFence::check(self).map_err(|e| e.to_string())
    }

    fn is_paused(&self) -> bool {
        self.lease.as_ref().is_some_and(|lease| lease.is_unconfirmed())
    }
}

/// The held writer lock of a checkpoint directory. Dropping it releases the lock.
#[derive(Debug)]
pub struct WriterLock {
    held: Held,
    holder: LockHolder,
    fence: Arc<EpochFence>,
}

/// What keeps the lock while the [`WriterLock`] lives.
#[derive(Debug)]
enum Held {
    /// The open lock file: its OS lock lives as long as the file is open.
    File(#[allow(dead_code)] File),
    /// The lease object, renewed in the background and released on drop.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
    Lease(crate::lease::LeaseKeeper),
}

/// How a writer holds a checkpoint in an object store, where there is no OS
/// lock: a lease object (`LOCK`) naming it until an expiry time, renewed
/// with a conditional put while the job runs.
///
/// The clock assumption: the clocks of any two machines that run writers
/// of one checkpoint differ by less than `safety_margin`. A writer stops
/// writing `safety_margin` before its lease runs out by its own clock; a
/// new writer takes the lease over only once it has run out by the new
/// writer's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// How long a lease lasts from its last renewal.
    pub duration: Duration,
    /// How often the holder renews it.
    pub renew_every: Duration,
    /// How long before the expiry the holder stops writing.
    pub safety_margin: Duration,
    /// Renew from a background thread (off in tests that drive the clock
    /// and call [`crate::Checkpoint::renew_lease`] themselves).
    pub renew_in_background: bool,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            duration: Duration::from_millis(15_000),
            renew_every: Duration::from_millis(4_000),
            safety_margin: Duration::from_millis(3_000),
            renew_in_background: true,
        }
    }
}

/// Whether a live writer holds a checkpoint's lock, as a reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockStatus {
    /// No lock file: no spate writer ever opened the checkpoint.
    Never,
    /// A live writer holds it (the holder as recorded; `None` when unreadable).
    Held(Option<LockHolder>),
    /// Nobody holds it; the last writer is shown when recorded.
    Free(Option<LockHolder>),
}

/// [`LockStatus`] of a local checkpoint, found by asking for a shared
/// `flock` (refused while a writer holds its exclusive one) and releasing it
/// at once: the lock file is not changed.
pub(crate) fn local_lock_status(dir: &Path) -> LockStatus {
    let path = dir.join(LOCK_FILE);
    let Ok(file) = File::open(&path) else { return LockStatus::Never };
    let recorded = read_lock_holder(dir);
    match file.try_lock_shared() {
        Ok(()) => LockStatus::Free(recorded),
        // Cannot tell (or held): report what the file says, as held, the safe assumption.
        Err(TryLockError::WouldBlock | TryLockError::Error(_)) => LockStatus::Held(recorded),
    }
}

impl WriterLock {
    /// Takes the writer lock of the existing directory `dir`. Fails at once with
    /// [`LogStoreError::Locked`] when a live process holds it; takes over the
    /// lock of a dead holder with the next epoch.
    pub fn acquire(dir: &Path, clock: &dyn Clock) -> Result<WriterLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&path)
            .map_err(|e| LogStoreError::io("open lock file", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LogStoreError::Locked { dir: dir.to_path_buf(), holder: read_lock_holder(dir) });
            }
            Err(TryLockError::Error(e)) => return Err(LogStoreError::io("lock", &path, e)),
        }
        let previous = read_previous(&mut file, &path)?;
        let used = dir.join(crate::checkpoint::METADATA_FILE).exists();
        let epoch = next_epoch(dir, &previous, used, clock)?;
        let holder = LockHolder { pid: std::process::id(), host: host_name(), since: clock.now(), epoch };
        write_holder(&file, &path, &holder)?;
        fsync_dir(dir)?;
        info!(dir = %dir.display(), %holder, "took the checkpoint writer lock");
        let fence = Arc::new(EpochFence { dir: dir.to_path_buf(), epoch, lease: None });
        Ok(WriterLock { held: Held::File(file), holder, fence })
    }

    /// A lock held as a lease in an object store (see [`LeaseSettings`]).
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
    pub(crate) fn leased(dir: &Path, keeper: crate::lease::LeaseKeeper) -> WriterLock {
        let state = keeper.state();
        let holder = state.holder().clone();
        let fence = Arc::new(EpochFence { dir: dir.to_path_buf(), epoch: holder.epoch, lease: Some(state) });
        WriterLock { held: Held::Lease(keeper), holder, fence }
    }

    /// Renews the lease now (object stores; nothing to do for a local lock).
    pub fn renew(&self) -> Result<()> {
        match &self.held {
            Held::File(_) => Ok(()),
            Held::Lease(keeper) => keeper.state().renew(),
        }
    }

    /// Renews the lease when a renewal is due by the writer's clock.
    pub fn renew_if_due(&self) -> Result<()> {
        match &self.held {
            Held::File(_) => Ok(()),
            Held::Lease(keeper) => keeper.state().renew_if_due(),
        }
    }

    /// This writer, as written in the lock file.
    pub fn holder(&self) -> &LockHolder {
        &self.holder
    }

    /// This writer's epoch.
    pub fn epoch(&self) -> u64 {
        self.holder.epoch
    }

    /// The fence that logs opened by this writer check before each change.
    pub fn fence(&self) -> Arc<EpochFence> {
        self.fence.clone()
    }
}

fn read_previous(file: &mut File, path: &Path) -> Result<OnDisk> {
    let mut bytes = Vec::new();
    // One byte past the limit tells a whole file from a cut one.
    let limit = MAX_LOCK_FILE_BYTES + 1;
    file.take(limit).read_to_end(&mut bytes).map_err(|e| LogStoreError::io("read lock file", path, e))?;
    if bytes.is_empty() {
        return Ok(OnDisk::Missing);
    }
    if bytes.len() as u64 > MAX_LOCK_FILE_BYTES {
        return Ok(OnDisk::Unreadable(format!("longer than {MAX_LOCK_FILE_BYTES} bytes")));
    }
    Ok(decode_holder(path, &bytes))
}

/// The previous epoch plus one. Without a readable previous epoch in a
/// directory that was used before (the lock file was deleted or damaged), a
/// stale writer may still hold a small epoch, so the new one is taken from
/// the clock (milliseconds), far above any count of takeovers. A previous
/// epoch of `u64::MAX` has no successor: the new writer could not be told
/// apart from the old one, so it is refused.
pub(crate) fn next_epoch(dir: &Path, previous: &OnDisk, used: bool, clock: &dyn Clock) -> Result<u64> {
    match previous {
        OnDisk::Holder(holder) => {
            info!(dir = %dir.display(), previous = %holder, "taking over from a writer that is gone");
            holder.epoch.checked_add(1).ok_or_else(|| LogStoreError::OutOfRange {
                path: dir.join(LOCK_FILE),
                reason: format!(
                    "the last writer's epoch {} is the largest there is, so a new writer cannot get a higher one; \
                     with no writer running, delete the lock file and start again",
                    holder.epoch
                ),
            })
        }
        OnDisk::Missing if !used => Ok(1),
        OnDisk::Missing | OnDisk::Unreadable(_) => {
            warn!(dir = %dir.display(), "lock file empty or unreadable in a used checkpoint; epoch taken from the clock");
            Ok(u64::try_from(clock.now().as_millis()).unwrap_or(1).max(1))
        }
    }
}

fn write_holder(file: &File, path: &Path, holder: &LockHolder) -> Result<()> {
    let bytes = encode_lock_file(path, holder)?;
    file.set_len(0).map_err(|e| LogStoreError::io("truncate lock file", path, e))?;
    file.write_all_at(&bytes, 0).map_err(|e| LogStoreError::io("write lock file", path, e))?;
    file.sync_all().map_err(|e| LogStoreError::io("fsync lock file", path, e))
}

pub(crate) fn host_name() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    from_kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::{ManualClock, Time};

    #[test]
    fn second_writer_in_process_is_refused_with_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(1_700_000_000_000));
        let first = WriterLock::acquire(dir.path(), &clock).unwrap();
        assert_eq!(first.epoch(), 1);
        let err = WriterLock::acquire(dir.path(), &clock).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LogStoreError::Locked { holder: Some(ref h), .. } if h.pid == std::process::id()));
        assert!(
            text.contains(&format!("pid {}", std::process::id())) && text.contains("2023-11-14T22:13:20"),
            "{text}"
        );
        drop(first);
        let second = WriterLock::acquire(dir.path(), &clock).unwrap();
        assert_eq!(second.epoch(), 2);
    }

    #[test]
    fn stale_writer_is_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(1_000));
        let old = WriterLock::acquire(dir.path(), &clock).unwrap();
        std::fs::write(dir.path().join(crate::checkpoint::METADATA_FILE), b"v1\n{}").unwrap();
        old.fence().check().unwrap();
        // The lock file is deleted under the old writer (its OS lock is now on an orphan inode).
        std::fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
        let err = old.fence().check().unwrap_err();
        assert!(matches!(err, LogStoreError::StaleEpoch { ours: 1, .. }), "{err}");
        let new = WriterLock::acquire(dir.path(), &clock).unwrap();
        assert_ne!(new.epoch(), old.epoch());
        let err = old.fence().check().unwrap_err().to_string();
        assert!(err.contains("our epoch is 1") && err.contains(&format!("epoch {}", new.epoch())), "{err}");
        new.fence().check().unwrap();
    }

    #[test]
    fn the_lock_file_is_a_versioned_checked_entry_and_old_ones_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(1_000));
        let path = dir.path().join(LOCK_FILE);
        let first = WriterLock::acquire(dir.path(), &clock).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("v1\n{") && text.contains(r#""epoch":1,"crc32c":""#), "{text}");
        assert_eq!(read_lock_holder(dir.path()).as_ref(), Some(first.holder()));
        drop(first);

        // A lock file from before the version line: bare JSON.
        std::fs::write(&path, br#"{"pid":7,"host":"h","sinceMs":0,"epoch":41}"#).unwrap();
        assert_eq!(read_lock_holder(dir.path()).map(|h| h.epoch), Some(41));
        assert_eq!(WriterLock::acquire(dir.path(), &clock).unwrap().epoch(), 42);

        // A damaged one is unreadable, never a holder with another epoch.
        let damaged = std::fs::read_to_string(&path).unwrap().replace(r#""epoch":42"#, r#""epoch":43"#);
        std::fs::write(&path, damaged).unwrap();
        assert_eq!(read_lock_holder(dir.path()), None);
        let err = decode_lock_file(&path, &std::fs::read(&path).unwrap()).unwrap_err();
        assert!(matches!(err, LogStoreError::ChecksumMismatch { .. }) && err.to_string().contains("LOCK"), "{err}");
        std::fs::write(&path, b"v2\n{}").unwrap();
        assert_eq!(read_lock_holder(dir.path()), None);
    }
}
