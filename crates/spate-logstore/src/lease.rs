//! The writer lock of a checkpoint in an object store: a lease object.
//!
//! An object store has no OS lock and no process that dies with its lock,
//! so the lock is a `LOCK` object naming the holder (pid, host, start time,
//! epoch) and an expiry time. It is created with put-if-absent, taken over
//! once expired with a conditional put on the ETag read (so of two writers
//! racing for it exactly one wins), renewed the same way while the job runs,
//! and released on a clean stop by writing an expiry of now.
//!
//! The holder checks its lease before every change ([`LeaseState::check`]):
//! it must have been renewed, not taken, and run out no sooner than the
//! safety margin from now by the holder's own clock. A holder that was
//! paused past its lease fails that check when it wakes; what it had already
//! started to publish is refused by put-if-absent (the new holder's
//! `offsets/N` and `commits/N` are never overwritten), and the epoch in each
//! entry tells it that a newer writer wrote it.

// Reached only through an object store's file manager (the `s3` feature).
#![cfg_attr(not(feature = "s3"), allow(dead_code))]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use spate_core::{Clock, Time};
use tracing::{info, warn};

use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, FileVersion, NO_FENCE};
use crate::lock::{
    LOCK_FILE, LeaseOptions, LockHolder, LockStatus, MAX_LOCK_FILE_BYTES, OnDisk, WriterLock, host_name, next_epoch,
};
use crate::log::{Json, decode_entry, encode_entry};

/// The lease object: the holder and when its lease runs out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    #[serde(flatten)]
    holder: LockHolder,
    #[serde(rename = "leaseExpiresMs")]
    expires: Time,
}

fn encode_lease(path: &Path, lease: &Lease) -> Result<Vec<u8>> {
    encode_entry(&Json(lease.clone())).map_err(|reason| LogStoreError::Encode { path: path.to_path_buf(), reason })
}

fn decode_lease(path: &Path, bytes: &[u8]) -> Result<Lease> {
    decode_entry::<Json<Lease>>(path, bytes).map(|json| json.0)
}

/// What the lease object says now.
enum Found {
    Missing,
    Unreadable(String, FileVersion),
    Lease(Lease, FileVersion),
}

fn read_lease(files: &dyn CheckpointFileManager, path: &Path) -> Result<Found> {
    Ok(match files.read_versioned(path, MAX_LOCK_FILE_BYTES)? {
        None => Found::Missing,
        Some((bytes, version)) => match decode_lease(path, &bytes) {
            Ok(lease) => Found::Lease(lease, version),
            Err(e) => Found::Unreadable(e.to_string(), version),
        },
    })
}

/// Takes the lease of the checkpoint `dir`: refused with
/// [`LogStoreError::Locked`] while another writer's lease runs; taken over
/// with the next epoch once it ran out.
pub(crate) fn acquire(
    files: Arc<dyn CheckpointFileManager>,
    dir: &Path,
    clock: Arc<dyn Clock>,
    options: &LeaseOptions,
) -> Result<WriterLock> {
    let path = dir.join(LOCK_FILE);
    let now = clock.now();
    let (previous, expected) = match read_lease(files.as_ref(), &path)? {
        Found::Missing => (OnDisk::Missing, FileVersion::Absent),
        Found::Unreadable(reason, version) => (OnDisk::Unreadable(reason), version),
        Found::Lease(lease, _) if lease.expires > now => {
            return Err(LogStoreError::Locked { dir: dir.to_path_buf(), holder: Some(lease.holder) });
        }
        Found::Lease(lease, version) => (OnDisk::Holder(lease.holder), version),
    };
    let used = files.exists(&dir.join(crate::checkpoint::METADATA_FILE))?;
    let epoch = next_epoch(dir, &previous, used, clock.as_ref())?;
    let holder = LockHolder { pid: std::process::id(), host: host_name(), since: now, epoch };
    let lease = Lease { holder: holder.clone(), expires: now + options.duration };
    let version = match files.replace_if_unchanged(&path, &encode_lease(&path, &lease)?, &expected, NO_FENCE) {
        Ok(version) => version,
        // Another writer took it between our read and our put: theirs stands.
        Err(LogStoreError::AlreadyExists { .. } | LogStoreError::Changed { .. }) => {
            let holder = match read_lease(files.as_ref(), &path)? {
                Found::Lease(lease, _) => Some(lease.holder),
                Found::Missing | Found::Unreadable(..) => None,
            };
            return Err(LogStoreError::Locked { dir: dir.to_path_buf(), holder });
        }
        Err(e) => return Err(e),
    };
    info!(dir = %dir.display(), %holder, expires = %lease.expires.to_iso8601(), "took the checkpoint lease");
    let state = Arc::new(LeaseState {
        files,
        dir: dir.to_path_buf(),
        path,
        holder,
        clock,
        options: options.clone(),
        current: Mutex::new(Current { version, renewed: now, expires: lease.expires, lost: None }),
    });
    Ok(WriterLock::leased(dir, LeaseKeeper::start(state)))
}

/// [`LockStatus`] of a checkpoint in an object store: held while the lease runs.
pub(crate) fn status(files: &dyn CheckpointFileManager, dir: &Path, clock: &dyn Clock) -> LockStatus {
    match read_lease(files, &dir.join(LOCK_FILE)) {
        Ok(Found::Missing) => LockStatus::Never,
        Ok(Found::Lease(lease, _)) if lease.expires > clock.now() => LockStatus::Held(Some(lease.holder)),
        Ok(Found::Lease(lease, _)) => LockStatus::Free(Some(lease.holder)),
        // Cannot tell: held, the safe assumption.
        Ok(Found::Unreadable(..)) | Err(_) => LockStatus::Held(None),
    }
}

/// The lease a writer holds: what it last wrote, and whether it lost it.
#[derive(Debug)]
pub(crate) struct LeaseState {
    files: Arc<dyn CheckpointFileManager>,
    dir: PathBuf,
    path: PathBuf,
    holder: LockHolder,
    clock: Arc<dyn Clock>,
    options: LeaseOptions,
    current: Mutex<Current>,
}

#[derive(Debug)]
struct Current {
    /// The version of the lease object as this writer last wrote it.
    version: FileVersion,
    /// When this writer last wrote it.
    renewed: Time,
    expires: Time,
    /// Why the lease is gone, once it is.
    lost: Option<String>,
}

impl LeaseState {
    pub(crate) fn holder(&self) -> &LockHolder {
        &self.holder
    }

    fn stale(&self, on_disk: String) -> LogStoreError {
        LogStoreError::StaleEpoch { dir: self.dir.clone(), ours: self.holder.epoch, on_disk }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ok while the lease is ours and runs for longer than the safety margin.
    pub(crate) fn check(&self) -> Result<()> {
        let current = self.current();
        if let Some(lost) = &current.lost {
            return Err(self.stale(lost.clone()));
        }
        let now = self.clock.now();
        if now + self.options.safety_margin >= current.expires {
            return Err(self.stale(format!(
                "our lease, which runs out at {}, was not renewed in time (now {}); another writer may hold it",
                current.expires.to_iso8601(),
                now.to_iso8601()
            )));
        }
        Ok(())
    }

    /// [`LeaseState::renew`] once `renew_every` has passed since the last
    /// renewal by the writer's clock: the driver calls this at each batch,
    /// so a job renews on the clock it runs on, not only from the
    /// background thread's wall-clock timer.
    pub(crate) fn renew_if_due(&self) -> Result<()> {
        let due = {
            let current = self.current();
            self.clock.now() >= current.renewed + self.options.renew_every
        };
        if due { self.renew() } else { self.check() }
    }

    /// Extends the lease from now, only if nobody changed the lease object
    /// since this writer last wrote it.
    pub(crate) fn renew(&self) -> Result<()> {
        let mut current = self.current();
        if let Some(lost) = &current.lost {
            return Err(self.stale(lost.clone()));
        }
        // A lease that ran out while the store was away is still ours as
        // long as its object is the one we wrote: another writer takes it
        // over only by changing it, and then the conditional put below is
        // refused. Until it is renewed, `check` refuses every write.
        // A renewal the store held up so long that the lease it wrote has
        // (nearly) run out by the time it landed is written again at once.
        for _ in 0..2 {
            let now = self.clock.now();
            let lease = Lease { holder: self.holder.clone(), expires: now + self.options.duration };
            let bytes = encode_lease(&self.path, &lease)?;
            match self.files.replace_if_unchanged(&self.path, &bytes, &current.version, NO_FENCE) {
                Ok(version) => {
                    if now >= current.expires {
                        warn!(
                            dir = %self.dir.display(),
                            ran_out = %current.expires.to_iso8601(),
                            "renewed the checkpoint lease after it ran out: nobody took it meanwhile"
                        );
                    }
                    current.version = version;
                    current.renewed = now;
                    current.expires = lease.expires;
                    if self.clock.now() + self.options.safety_margin < current.expires {
                        return Ok(());
                    }
                }
                Err(LogStoreError::Changed { .. } | LogStoreError::AlreadyExists { .. }) => {
                    let lost = match read_lease(self.files.as_ref(), &self.path) {
                        Ok(Found::Lease(lease, _)) => {
                            format!("epoch {}, held by {}", lease.holder.epoch, lease.holder)
                        }
                        _ => "a lease object changed by another writer".to_string(),
                    };
                    current.lost = Some(lost.clone());
                    return Err(self.stale(lost));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Ends the lease now, so the next writer need not wait for it to run out.
    fn release(&self) {
        let current = self.current();
        if current.lost.is_some() {
            return;
        }
        let lease = Lease { holder: self.holder.clone(), expires: self.clock.now() };
        let released = encode_lease(&self.path, &lease)
            .and_then(|bytes| self.files.replace_if_unchanged(&self.path, &bytes, &current.version, NO_FENCE));
        match released {
            Ok(_) => info!(dir = %self.dir.display(), holder = %self.holder, "released the checkpoint lease"),
            Err(e) => warn!(dir = %self.dir.display(), error = %e, "could not release the checkpoint lease"),
        }
    }
}

/// Renews a lease from a background thread while it lives; releases it on drop.
#[derive(Debug)]
pub(crate) struct LeaseKeeper {
    state: Arc<LeaseState>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    fn start(state: Arc<LeaseState>) -> LeaseKeeper {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = state.options.renew_in_background.then(|| {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("spate-lease".into())
                .spawn(move || renew_until_stopped(&state, &stop))
                .ok()
        });
        LeaseKeeper { state, stop, thread: thread.flatten() }
    }

    pub(crate) fn state(&self) -> Arc<LeaseState> {
        Arc::clone(&self.state)
    }
}

fn renew_until_stopped(state: &LeaseState, stop: &(Mutex<bool>, Condvar)) {
    let (stopped, wake) = stop;
    let mut guard = stopped.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        // Real time here: the renewal cadence is the one thing that must follow the wall clock.
        let every = std::time::Duration::from_millis(state.options.renew_every.as_millis());
        guard = wake.wait_timeout(guard, every).unwrap_or_else(PoisonError::into_inner).0;
        if *guard {
            return;
        }
        match state.renew() {
            Ok(()) => {}
            Err(e @ LogStoreError::StaleEpoch { .. }) => {
                warn!(error = %e, "lost the checkpoint lease; this writer stops writing");
                return;
            }
            // A failed request: retried at the next renewal; the fence stops writes if it never succeeds.
            Err(e) => warn!(error = %e, "could not renew the checkpoint lease; retrying"),
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.state.release();
    }
}
