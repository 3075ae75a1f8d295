//! The writer lock of a checkpoint in an object store: a lease object.
//!
//! An object store has no OS lock and no process that dies with its lock,
//! so the lock is a `LOCK` object naming the holder (pid, host, start time,
//! epoch, and the process's identity on its host) and an expiry time. It is
//! created with put-if-absent, taken over once expired with a conditional
//! put on the ETag read (so of two writers racing for it exactly one wins),
//! renewed the same way while the job runs, and released on a clean stop by
//! writing an expiry of now.
//!
//! A writer that finds the lease held does not give up at once: a holder
//! that was a process of this host and is gone (a crash, `kill -9`) is
//! taken over at once; a live one of this host is refused; any other is
//! waited for until its lease runs out, and refused only if renewed
//! meanwhile. A lease that cannot be read (damaged, or written by a newer
//! format) is held until it has gone a whole lease without changing.
//!
//! A write of the lease whose answer is lost (the PUT landed, the answer
//! did not, or the client's repeat of it was refused as a conflict) is read
//! back: a lease naming this holder and epoch is still ours.
//!
//! The holder checks its lease before every change ([`LeaseState::check`]):
//! it must have been renewed, not taken, and run out no sooner than the
//! safety margin from now by the holder's own clock. The check reads only
//! memory and never waits for a renewal's request. A lease that ran short
//! while the store was away is not lost: the writer's changes wait
//! ([`LeaseState::await_held`]) until the renewal, retried in the
//! background, lands or finds the lease taken. A holder that was paused
//! past its lease fails that check when it wakes; what it had already
//! started to publish is refused by put-if-absent (the new holder's
//! `offsets/N` and `commits/N` are never overwritten), and the epoch in each
//! entry tells it that a newer writer wrote it.

// Reached only through an object store's file manager (the `s3` feature).
#![cfg_attr(not(feature = "s3"), allow(dead_code))]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use spate_core::sync::lock;
use spate_core::{Clock, Time};
use tracing::{info, warn};

use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, FileVersion, NO_FENCE};
use crate::holder::LockHolder;
use crate::lock::{
    LOCK_FILE, LeaseSettings, LockStatus, MAX_LOCK_FILE_BYTES, OnDisk, WriterLock, host_name, next_epoch,
};
use crate::log::{Json, decode_entry, encode_entry};
use crate::process::{Liveness, ProcessIdentity, liveness};

/// How long a write waits for a lease that ran short to be renewed: as
/// long as a request to the store is retried while the store is away (the
/// object store's outage limit), so a write outlasts any outage its
/// renewal does.
const RENEWAL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// The lease object: the holder and when its lease runs out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    #[serde(flatten)]
    holder: LockHolder,
    #[serde(rename = "leaseExpiresMs")]
    expires: Time,
    /// The holder's process, so that a writer on its host can tell it is gone.
    #[serde(rename = "process", default, skip_serializing_if = "Option::is_none")]
    process: Option<ProcessIdentity>,
}

fn encode_lease(path: &Path, lease: &Lease) -> Result<Vec<u8>> {
    encode_entry(&Json(lease.clone())).map_err(|reason| LogStoreError::Encode { path: path.to_path_buf(), reason })
}

fn decode_lease(path: &Path, bytes: &[u8]) -> Result<Lease> {
    decode_entry::<Json<Lease>>(path, bytes).map(|json| json.0)
}

/// What the lease object says now.
#[derive(Debug, PartialEq)]
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

/// What a writer that wants the lease may do, given what the lease object says.
enum Decision {
    /// Take it over from `previous`, replacing the object at `version`.
    Take(OnDisk, FileVersion),
    /// Wait until this time, then look again.
    Wait(Time),
    /// A live writer holds it.
    Refuse,
}

fn decide(found: &Found, now: Time, options: &LeaseSettings) -> Decision {
    let lease = match found {
        Found::Missing => return Decision::Take(OnDisk::Missing, FileVersion::Absent),
        // Its expiry cannot be read: held until it has not changed for a whole lease.
        Found::Unreadable(..) => return Decision::Wait(now + options.duration),
        Found::Lease(lease, version) if lease.expires <= now => {
            return Decision::Take(OnDisk::Holder(lease.holder.clone()), version.clone());
        }
        Found::Lease(lease, version) if lease.holder.host == host_name() => {
            match liveness(lease.holder.pid, lease.process.as_ref()) {
                Liveness::Gone => {
                    info!(holder = %lease.holder, "the lease's holder, a process of this host, is gone");
                    return Decision::Take(OnDisk::Holder(lease.holder.clone()), version.clone());
                }
                Liveness::Alive => return Decision::Refuse,
                Liveness::Unknown => lease,
            }
        }
        Found::Lease(lease, _) => lease,
    };
    // Longer than any lease this writer would write: a holder whose clock is
    // far ahead, or with a much longer lease; not waited for.
    if lease.expires > now + options.duration + options.safety_margin {
        Decision::Refuse
    } else {
        Decision::Wait(lease.expires)
    }
}

/// The holder recorded in what was found (`None` when unreadable or missing).
fn recorded_holder(found: &Found) -> Option<LockHolder> {
    match found {
        Found::Lease(lease, _) => Some(lease.holder.clone()),
        Found::Missing | Found::Unreadable(..) => None,
    }
}

/// What became of a write of the lease object.
enum Written {
    /// It is on the store as written (its answer may have been lost), at this version.
    Landed(FileVersion),
    /// The store holds an earlier lease of the same holder, at this version
    /// and expiry: a write whose answer was lost had landed before this one.
    Earlier(FileVersion, Time),
    /// It failed; what the lease object holds, when it could be read back.
    Failed(LogStoreError, Option<Found>),
}

/// Replaces the lease object at version `expected` with `lease`. When the
/// answer is an error, the object is read back: a PUT that landed although
/// its answer was lost (or whose repeat by the client was refused as a
/// conflict) shows this holder, and the lease is still ours.
fn write_lease(files: &dyn CheckpointFileManager, path: &Path, lease: &Lease, expected: &FileVersion) -> Written {
    let error = match encode_lease(path, lease)
        .and_then(|bytes| files.replace_if_unchanged(path, &bytes, expected, NO_FENCE))
    {
        Ok(version) => return Written::Landed(version),
        Err(e) => e,
    };
    match read_lease(files, path) {
        Ok(Found::Lease(found, version)) if found == *lease => Written::Landed(version),
        Ok(Found::Lease(found, version)) if found.holder == lease.holder => Written::Earlier(version, found.expires),
        Ok(found) => Written::Failed(error, Some(found)),
        Err(_) => Written::Failed(error, None),
    }
}

fn is_conflict(error: &LogStoreError) -> bool {
    matches!(error, LogStoreError::AlreadyExists { .. } | LogStoreError::Changed { .. })
}

/// Takes the lease of the checkpoint `dir`. A lease that has run out, or
/// whose holder is a process of this host that is gone, is taken over at
/// once with the next epoch; one held by a live process of this host is
/// refused with [`LogStoreError::Locked`]. Any other lease (another host,
/// or a holder this host cannot tell about) is waited for until it runs
/// out, once: if its holder renewed it meanwhile, it is alive, and it is
/// refused rather than waited for without end.
pub(crate) fn acquire(
    files: Arc<dyn CheckpointFileManager>,
    dir: &Path,
    clock: Arc<dyn Clock>,
    options: &LeaseSettings,
) -> Result<WriterLock> {
    let path = dir.join(LOCK_FILE);
    let (previous, expected) = wait_until_free(files.as_ref(), dir, &path, clock.as_ref(), options)?;
    let now = clock.now();
    let used = files.exists(&dir.join(crate::checkpoint::METADATA_FILE))?;
    let epoch = next_epoch(dir, &previous, used, clock.as_ref())?;
    let holder = LockHolder { pid: std::process::id(), host: host_name(), since: now, epoch };
    let process = ProcessIdentity::current();
    let lease = Lease { holder: holder.clone(), expires: now + options.duration, process: process.clone() };
    let (version, expires) = match write_lease(files.as_ref(), &path, &lease, &expected) {
        Written::Landed(version) => (version, lease.expires),
        Written::Earlier(version, expires) => (version, expires),
        // Another writer took it between our read and our put: theirs stands.
        Written::Failed(e, found) if is_conflict(&e) => {
            let holder = found.as_ref().and_then(recorded_holder);
            return Err(LogStoreError::Locked { dir: dir.to_path_buf(), holder });
        }
        Written::Failed(e, _) => return Err(e),
    };
    info!(dir = %dir.display(), %holder, expires = %expires.to_iso8601(), "took the checkpoint lease");
    let state = Arc::new(LeaseState {
        files,
        dir: dir.to_path_buf(),
        path,
        holder,
        process,
        clock,
        options: options.clone(),
        renewing: Mutex::new(()),
        current: Mutex::new(Current { version, renewed: now, expires, lost: None }),
        changed: Condvar::new(),
        waiting: std::sync::atomic::AtomicUsize::new(0),
    });
    Ok(WriterLock::leased(dir, LeaseKeeper::start(state)))
}

/// Reads the lease until it may be taken, waiting at most once for it to
/// run out; returns the previous holder and the version to replace.
fn wait_until_free(
    files: &dyn CheckpointFileManager,
    dir: &Path,
    path: &Path,
    clock: &dyn Clock,
    options: &LeaseSettings,
) -> Result<(OnDisk, FileVersion)> {
    let locked = |found: &Found| LogStoreError::Locked { dir: dir.to_path_buf(), holder: recorded_holder(found) };
    let found = read_lease(files, path)?;
    let until = match decide(&found, clock.now(), options) {
        Decision::Take(previous, version) => return Ok((previous, version)),
        Decision::Refuse => return Err(locked(&found)),
        Decision::Wait(until) => until,
    };
    say_waiting(dir, &found, until, clock.now());
    clock.sleep_until(until);
    let again = read_lease(files, path)?;
    if let Found::Unreadable(reason, version) = &found
        && again == found
    {
        // Not changed for a whole lease: nobody renews it.
        return Ok((OnDisk::Unreadable(reason.clone()), version.clone()));
    }
    match decide(&again, clock.now(), options) {
        Decision::Take(previous, version) => Ok((previous, version)),
        // Renewed while waited for: its holder is alive.
        Decision::Wait(_) | Decision::Refuse => Err(locked(&again)),
    }
}

/// The log line of a writer that waits for a lease: whose, until when, how long.
fn say_waiting(dir: &Path, found: &Found, until: Time, now: Time) {
    let seconds = until.since(now).as_millis() as f64 / 1000.0;
    let until = until.to_iso8601();
    match found {
        Found::Lease(lease, _) => warn!(
            dir = %dir.display(),
            holder = %lease.holder,
            %until,
            "the checkpoint is held by {}; waiting {seconds:.1} s for its lease to run out", lease.holder
        ),
        Found::Unreadable(reason, _) => warn!(
            dir = %dir.display(),
            %until,
            "the checkpoint's lease cannot be read ({reason}); waiting {seconds:.1} s to see that nobody renews it"
        ),
        Found::Missing => {}
    }
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
    /// This process, as each lease it writes records it.
    process: Option<ProcessIdentity>,
    clock: Arc<dyn Clock>,
    options: LeaseSettings,
    /// Held across a renewal's or the release's request, so that two never
    /// race; never taken by [`LeaseState::check`].
    renewing: Mutex<()>,
    /// Held only to read or update, never across a request to the store.
    current: Mutex<Current>,
    /// Told each time `current` changes (renewed, adopted, lost).
    changed: Condvar,
    /// Writes waiting in [`LeaseState::await_held`] now (seen by tests).
    waiting: std::sync::atomic::AtomicUsize,
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
        lock(&self.current)
    }

    /// Ok while the lease is ours and runs for longer than the safety margin.
    pub(crate) fn check(&self) -> Result<()> {
        match self.standing(&self.current()) {
            Standing::Held => Ok(()),
            Standing::Lost(e) | Standing::Unconfirmed(e) => Err(e),
        }
    }

    /// [`LeaseState::check`], waiting up to `patience` while the lease is
    /// short but not lost: the store was away and the renewal, retried in
    /// the background, has not landed yet. Writes pause through an outage
    /// of the store instead of failing for good, and go on as soon as the
    /// renewal lands; a lease another writer took fails at once.
    pub(crate) fn await_held(&self, patience: std::time::Duration) -> Result<()> {
        // Real time: the wait follows the renewal thread's wall-clock cadence.
        let deadline = std::time::Instant::now() + patience;
        let mut current = self.current();
        let mut said = false;
        loop {
            let error = match self.standing(&current) {
                Standing::Held => return Ok(()),
                Standing::Lost(e) => return Err(e),
                Standing::Unconfirmed(e) => e,
            };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(error);
            }
            if !said {
                warn!(dir = %self.dir.display(), reason = %error,
                    "writes to the checkpoint wait until its lease is renewed (the object store may be away)");
                said = true;
            }
            let slice = left.min(std::time::Duration::from_millis(500));
            self.waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            current = self.changed.wait_timeout(current, slice).unwrap_or_else(PoisonError::into_inner).0;
            self.waiting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// [`LeaseState::await_held`] for as long as the store may be away
    /// ([`RENEWAL_PATIENCE`]) when a background thread renews the lease;
    /// at once otherwise, since nothing would renew it meanwhile.
    pub(crate) fn check_patiently(&self) -> Result<()> {
        let patience = if self.options.renew_in_background { RENEWAL_PATIENCE } else { std::time::Duration::ZERO };
        self.await_held(patience)
    }

    /// Whether the lease ran short without being lost: writes wait for its renewal.
    pub(crate) fn is_unconfirmed(&self) -> bool {
        matches!(self.standing(&self.current()), Standing::Unconfirmed(_))
    }

    /// Whether `current` lets this writer change the checkpoint now.
    fn standing(&self, current: &Current) -> Standing {
        if let Some(lost) = &current.lost {
            return Standing::Lost(self.stale(lost.clone()));
        }
        let now = self.clock.now();
        if now + self.options.safety_margin >= current.expires {
            return Standing::Unconfirmed(self.stale(format!(
                "our lease, which runs out at {}, was not renewed in time (now {}); another writer may hold it",
                current.expires.to_iso8601(),
                now.to_iso8601()
            )));
        }
        Standing::Held
    }

    /// [`LeaseState::check`], then the lease object as it is on the store:
    /// it must still name this holder. A delete cannot be made conditional,
    /// so this read is what keeps a paused writer's purge from landing after
    /// a newer writer took over.
    pub(crate) fn confirm(&self) -> Result<()> {
        self.check()?;
        match read_lease(self.files.as_ref(), &self.path)? {
            Found::Lease(lease, _) if lease.holder == self.holder => Ok(()),
            found => {
                let lost = match found {
                    Found::Lease(lease, _) => format!("epoch {}, held by {}", lease.holder.epoch, lease.holder),
                    Found::Missing => "nothing (the lease object is gone)".to_string(),
                    Found::Unreadable(reason, _) => format!("something unreadable ({reason})"),
                };
                self.lose(lost.clone());
                Err(self.stale(lost))
            }
        }
    }

    /// Marks the lease lost and wakes the writes waiting for it.
    fn lose(&self, lost: String) {
        self.current().lost = Some(lost);
        self.changed.notify_all();
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
    /// since this writer last wrote it. A conflict with a lease of this
    /// holder (an earlier renewal whose answer was lost had landed) is not
    /// a loss: that version is taken and the renewal made again, once.
    pub(crate) fn renew(&self) -> Result<()> {
        let _renewing = lock(&self.renewing);
        for _ in 0..2 {
            let (now, expected) = self.before_renewal()?;
            let lease = Lease {
                holder: self.holder.clone(),
                expires: now + self.options.duration,
                process: self.process.clone(),
            };
            match write_lease(self.files.as_ref(), &self.path, &lease, &expected) {
                Written::Landed(version) => {
                    self.renewed(version, now, lease.expires);
                    return Ok(());
                }
                Written::Earlier(version, expires) => self.adopt(version, expires),
                Written::Failed(e, found) => return Err(self.failed(e, found)),
            }
        }
        // Our own earlier lease twice in a row: what is on the store is known; renewed at the next turn.
        self.check()
    }

    /// The time of a renewal and the version it replaces; an error once the lease is lost.
    fn before_renewal(&self) -> Result<(Time, FileVersion)> {
        let current = self.current();
        if let Some(lost) = &current.lost {
            return Err(self.stale(lost.clone()));
        }
        let now = self.clock.now();
        if now >= current.expires {
            // A lease that ran out while the store was away is still ours as
            // long as its object is the one we wrote: another writer takes
            // it over only by changing it, and then this renewal's
            // conditional put is refused. Until it is renewed, `check`
            // refuses every write.
            warn!(
                dir = %self.dir.display(),
                ran_out = %current.expires.to_iso8601(),
                "renewing the checkpoint lease after it ran out: it stays ours unless another writer changed it"
            );
        }
        Ok((now, current.version.clone()))
    }

    fn renewed(&self, version: FileVersion, at: Time, expires: Time) {
        let mut current = self.current();
        current.version = version;
        current.renewed = at;
        current.expires = expires;
        self.changed.notify_all();
    }

    /// Takes what the store holds of our own lease as the truth.
    fn adopt(&self, version: FileVersion, expires: Time) {
        info!(dir = %self.dir.display(), expires = %expires.to_iso8601(), "an earlier renewal of the lease had landed");
        let mut current = self.current();
        current.version = version;
        current.expires = expires;
        self.changed.notify_all();
    }

    /// A failed renewal: a conflict with another writer's lease loses it; any other error is retried later.
    fn failed(&self, error: LogStoreError, found: Option<Found>) -> LogStoreError {
        if !is_conflict(&error) {
            return error;
        }
        let lost = match found {
            Some(Found::Lease(lease, _)) => format!("epoch {}, held by {}", lease.holder.epoch, lease.holder),
            _ => "a lease object changed by another writer".to_string(),
        };
        self.lose(lost.clone());
        self.stale(lost)
    }

    /// Ends the lease now, so the next writer need not wait for it to run
    /// out. From here on this writer's fence refuses.
    fn release(&self) {
        let _renewing = lock(&self.renewing);
        let now = self.clock.now();
        let version = {
            let mut current = self.current();
            if current.lost.is_some() {
                return;
            }
            current.lost = Some(format!("this writer released its lease at {}", now.to_iso8601()));
            self.changed.notify_all();
            current.version.clone()
        };
        let lease = Lease { holder: self.holder.clone(), expires: now, process: self.process.clone() };
        match write_lease(self.files.as_ref(), &self.path, &lease, &version) {
            Written::Landed(_) => {
                info!(dir = %self.dir.display(), holder = %self.holder, "released the checkpoint lease")
            }
            Written::Earlier(..) => {
                warn!(dir = %self.dir.display(), "could not release the checkpoint lease: it changed")
            }
            Written::Failed(e, _) => {
                warn!(dir = %self.dir.display(), error = %e, "could not release the checkpoint lease")
            }
        }
    }
}

/// What [`LeaseState::standing`] found.
enum Standing {
    Held,
    /// Taken by another writer or released: no wait mends it.
    Lost(LogStoreError),
    /// Running out, or out, but not taken: a renewal may still land.
    Unconfirmed(LogStoreError),
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
    let mut guard = lock(stopped);
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
        *lock(stopped) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.state.release();
    }
}

#[cfg(all(test, feature = "s3"))]
mod tests {
    use std::sync::mpsc;

    use object_store::ObjectStore;
    use object_store::memory::InMemory;
    use spate_core::{Duration, ManualClock};

    use super::*;
    use crate::object_faults::{FaultyObjectStore, ObjectFault};
    use crate::object_files::ObjectStoreFileManager;

    const START: i64 = 1_700_000_000_000;
    const LOCATION: &str = "s3://bucket/ck";

    fn options() -> LeaseSettings {
        LeaseSettings {
            duration: Duration::from_millis(10_000),
            renew_every: Duration::from_millis(3_000),
            safety_margin: Duration::from_millis(2_000),
            renew_in_background: false,
        }
    }

    fn files_on(store: Arc<dyn ObjectStore>) -> Arc<dyn CheckpointFileManager> {
        Arc::new(ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", store).unwrap())
    }

    fn lock_path() -> PathBuf {
        Path::new(LOCATION).join(LOCK_FILE)
    }

    fn put_lease(files: &dyn CheckpointFileManager, lease: &Lease) {
        let bytes = encode_lease(&lock_path(), lease).unwrap();
        files.replace_atomic(&lock_path(), &bytes, NO_FENCE).unwrap();
    }

    fn stored_lease(files: &dyn CheckpointFileManager) -> Lease {
        match read_lease(files, &lock_path()).unwrap() {
            Found::Lease(lease, _) => lease,
            Found::Missing | Found::Unreadable(..) => panic!("no readable lease"),
        }
    }

    /// A lease of a writer on another host, running until `expires`.
    fn foreign(expires: i64) -> Lease {
        let holder = LockHolder { pid: 4242, host: "elsewhere".into(), since: Time::from_millis(START), epoch: 7 };
        Lease { holder, expires: Time::from_millis(expires), process: None }
    }

    /// What the test sees of an acquisition running in a thread.
    enum Event {
        /// The acquisition waits until this time.
        Sleeping(Time),
        /// It returned.
        Done(Result<WriterLock>),
    }

    /// A clock that reports each wait to the test and waits until the test says go.
    #[derive(Debug)]
    struct GatedClock {
        time: ManualClock,
        events: Mutex<mpsc::Sender<Event>>,
        go: Mutex<mpsc::Receiver<()>>,
    }

    impl Clock for GatedClock {
        fn now(&self) -> Time {
            self.time.now()
        }

        fn sleep_until(&self, deadline: Time) -> Time {
            let _ = self.events.lock().unwrap().send(Event::Sleeping(deadline));
            let _ = self.go.lock().unwrap().recv();
            self.time.set(self.time.now().max(deadline));
            self.time.now()
        }
    }

    /// Starts an acquisition on `files` at START; returns its events and the go signal.
    fn acquire_in_thread(files: Arc<dyn CheckpointFileManager>) -> (mpsc::Receiver<Event>, mpsc::Sender<()>) {
        let (events, seen) = mpsc::channel();
        let (go, gate) = mpsc::channel();
        let clock = Arc::new(GatedClock {
            time: ManualClock::new(Time::from_millis(START)),
            events: Mutex::new(events.clone()),
            go: Mutex::new(gate),
        });
        std::thread::spawn(move || {
            let acquired = acquire(files, Path::new(LOCATION), clock, &options());
            let _ = events.send(Event::Done(acquired));
        });
        (seen, go)
    }

    fn expect_sleep(events: &mpsc::Receiver<Event>) -> Time {
        match events.recv().unwrap() {
            Event::Sleeping(until) => until,
            Event::Done(Ok(lock)) => panic!("took the lease at once (epoch {}) instead of waiting", lock.epoch()),
            Event::Done(Err(e)) => panic!("failed at once instead of waiting: {e}"),
        }
    }

    fn expect_done(events: &mpsc::Receiver<Event>) -> Result<WriterLock> {
        match events.recv().unwrap() {
            Event::Done(acquired) => acquired,
            Event::Sleeping(until) => panic!("waited until {} instead of deciding at once", until.to_iso8601()),
        }
    }

    #[test]
    fn a_lease_held_on_another_host_is_waited_for_and_taken_over_once_it_ran_out() {
        let files = files_on(Arc::new(InMemory::new()));
        put_lease(files.as_ref(), &foreign(START + 10_000));
        let (events, go) = acquire_in_thread(files.clone());
        assert_eq!(expect_sleep(&events), Time::from_millis(START + 10_000));
        go.send(()).unwrap();
        let lock = expect_done(&events).unwrap();
        assert_eq!(lock.epoch(), 8);
        assert_eq!(stored_lease(files.as_ref()).holder, *lock.holder());
    }

    #[test]
    fn a_lease_renewed_while_it_is_waited_for_is_refused_naming_its_holder() {
        let files = files_on(Arc::new(InMemory::new()));
        put_lease(files.as_ref(), &foreign(START + 10_000));
        let (events, go) = acquire_in_thread(files.clone());
        expect_sleep(&events);
        put_lease(files.as_ref(), &foreign(START + 20_000)); // its live holder renews it
        go.send(()).unwrap();
        let err = expect_done(&events).unwrap_err();
        assert!(matches!(err, LogStoreError::Locked { holder: Some(ref h), .. } if h.host == "elsewhere"), "{err}");
        assert_eq!(stored_lease(files.as_ref()), foreign(START + 20_000));
    }

    #[test]
    fn a_lease_in_a_newer_format_is_held_until_it_has_not_changed_for_a_whole_lease() {
        let files = files_on(Arc::new(InMemory::new()));
        let newer = b"v2\n{\"somethingNew\":1}";
        files.replace_atomic(&lock_path(), newer, NO_FENCE).unwrap();
        let (events, go) = acquire_in_thread(files.clone());
        assert_eq!(expect_sleep(&events), Time::from_millis(START) + options().duration);
        go.send(()).unwrap();
        let lock = expect_done(&events).unwrap();
        assert_eq!(stored_lease(files.as_ref()).holder, *lock.holder());

        // Changed while waited for: its writer is alive.
        files.replace_atomic(&lock_path(), newer, NO_FENCE).unwrap();
        let (events, go) = acquire_in_thread(files.clone());
        expect_sleep(&events);
        files.replace_atomic(&lock_path(), b"v2\n{\"somethingNew\":2}", NO_FENCE).unwrap();
        go.send(()).unwrap();
        let err = expect_done(&events).unwrap_err();
        assert!(matches!(err, LogStoreError::Locked { holder: None, .. }), "{err}");
    }

    #[test]
    fn a_restart_on_this_host_takes_over_at_once_when_the_holder_is_gone() {
        let ours = ProcessIdentity::current().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        // A pid that is free, and our own pid recorded with another start time (reused).
        let reused = ProcessIdentity { start_ticks: ours.start_ticks.wrapping_add(1), ..ours.clone() };
        for (pid, process) in [(dead, ours.clone()), (std::process::id(), reused)] {
            let files = files_on(Arc::new(InMemory::new()));
            let holder = LockHolder { pid, host: host_name(), since: Time::from_millis(START), epoch: 3 };
            put_lease(
                files.as_ref(),
                &Lease { holder, expires: Time::from_millis(START + 10_000), process: Some(process) },
            );
            let (events, _go) = acquire_in_thread(files.clone());
            let lock = expect_done(&events).unwrap();
            assert_eq!(lock.epoch(), 4, "pid {pid}");
        }
    }

    #[test]
    fn a_live_holder_on_this_host_is_refused_at_once() {
        let files = files_on(Arc::new(InMemory::new()));
        let (events, _go) = acquire_in_thread(files.clone());
        let first = expect_done(&events).unwrap();
        let (events, _go) = acquire_in_thread(files.clone());
        let err = expect_done(&events).unwrap_err();
        assert!(matches!(err, LogStoreError::Locked { holder: Some(ref h), .. } if h == first.holder()), "{err}");
    }

    fn acquire_now(files: Arc<dyn CheckpointFileManager>, clock: &Arc<ManualClock>) -> Result<WriterLock> {
        acquire(files, Path::new(LOCATION), clock.clone(), &options())
    }

    #[test]
    fn a_takeover_whose_answer_was_lost_keeps_the_lease() {
        for fault in [ObjectFault::AfterApply, ObjectFault::AfterApplyRetried] {
            let memory = Arc::new(InMemory::new());
            let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
            let faulty = Arc::new(FaultyObjectStore::fail_write(memory.clone(), 0, fault, false));
            let lock = acquire_now(files_on(faulty.clone()), &clock).unwrap_or_else(|e| panic!("{fault:?}: {e}"));
            assert!(faulty.fired());
            lock.fence().check().unwrap();
            clock.advance(Duration::from_millis(3_000));
            lock.renew().unwrap_or_else(|e| panic!("{fault:?}: {e}"));
            assert_eq!(stored_lease(files_on(memory).as_ref()).holder, *lock.holder());
        }
    }

    #[test]
    fn a_renewal_whose_answer_was_lost_keeps_the_lease() {
        for fault in [ObjectFault::AfterApply, ObjectFault::AfterApplyRetried] {
            let memory = Arc::new(InMemory::new());
            let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
            let faulty = Arc::new(FaultyObjectStore::fail_write(memory.clone(), 1, fault, false));
            let lock = acquire_now(files_on(faulty.clone()), &clock).unwrap();
            for step in 1..=3 {
                clock.advance(Duration::from_millis(3_000));
                lock.renew().unwrap_or_else(|e| panic!("{fault:?}, renewal {step}: {e}"));
                lock.fence().check().unwrap_or_else(|e| panic!("{fault:?}, renewal {step}: {e}"));
            }
            assert!(faulty.fired());
            let stored = stored_lease(files_on(memory).as_ref());
            assert_eq!((stored.holder, stored.expires), (lock.holder().clone(), clock.now() + options().duration));
        }
    }

    #[test]
    fn fence_checks_do_not_wait_behind_a_renewal_in_flight() {
        let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let (slow, held) = FaultyObjectStore::hold_write(Arc::new(InMemory::new()), 1);
        let lock = acquire_now(files_on(Arc::new(slow)), &clock).unwrap();
        let fence = lock.fence();
        let state = Arc::clone(fence.lease().unwrap());
        clock.advance(Duration::from_millis(3_000));
        std::thread::scope(|scope| {
            let renewal = scope.spawn(|| lock.renew());
            held.wait_until_reached();
            // The renewal's PUT is on its way: the lease's state must stay free.
            let free = state.current.try_lock().is_ok();
            held.release();
            assert!(free, "the renewal holds the lease's state across its PUT");
            fence.check().unwrap();
            renewal.join().unwrap().unwrap();
        });
    }

    /// Returns once a write waits in `state`'s [`LeaseState::await_held`].
    fn until_a_write_waits(state: &LeaseState) {
        while state.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_write_waits_through_an_outage_until_the_renewal_lands() {
        let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let lock = acquire_now(files_on(Arc::new(InMemory::new())), &clock).unwrap();
        let state = Arc::clone(lock.fence().lease().unwrap());
        // The store was away past the lease's end: nothing renewed it.
        clock.advance(Duration::from_millis(25_000));
        assert!(state.check().is_err(), "a lease that ran out lets no write through unchecked");
        std::thread::scope(|scope| {
            let write = scope.spawn(|| state.await_held(std::time::Duration::from_secs(600)));
            until_a_write_waits(&state);
            // Back: the lease object is still ours, so the renewal lands and the write goes on.
            lock.renew().unwrap();
            write.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_write_waiting_for_the_renewal_fails_at_once_when_another_writer_took_the_lease() {
        let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let files = files_on(Arc::new(InMemory::new()));
        let lock = acquire_now(Arc::clone(&files), &clock).unwrap();
        let state = Arc::clone(lock.fence().lease().unwrap());
        clock.advance(Duration::from_millis(25_000));
        put_lease(files.as_ref(), &foreign(START + 60_000));
        std::thread::scope(|scope| {
            let write = scope.spawn(|| state.await_held(std::time::Duration::from_secs(600)));
            until_a_write_waits(&state);
            assert!(matches!(lock.renew(), Err(LogStoreError::StaleEpoch { .. })));
            let refused = write.join().unwrap().unwrap_err();
            assert!(refused.to_string().contains("epoch 7"), "{refused}");
        });
    }

    #[test]
    fn without_a_background_renewal_a_short_lease_is_refused_without_waiting() {
        let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let lock = acquire_now(files_on(Arc::new(InMemory::new())), &clock).unwrap();
        clock.advance(Duration::from_millis(25_000));
        assert!(matches!(lock.fence().check(), Err(LogStoreError::StaleEpoch { .. })));
    }
}
