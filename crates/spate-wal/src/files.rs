//! The file layer: every file operation the log makes goes through the
//! [`FileLayer`] trait, so tests can count `fdatasync`s and inject failures.
//!
//! [`RealFiles`] is the operating system; [`HookedFiles`] wraps it with a
//! public [`FaultInjection`] hook that tests (in this crate and others) hand
//! to the log through [`crate::WalOptions::fault_injection`].

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// An open segment, appended to by the one active writer. A commit syncs
/// it while the next commit may already append (both take `&self`, as the
/// operating system allows).
pub(crate) trait SegmentWriter: Send + Sync {
    /// Writes all of `bufs`, in order, where the last append ended (at
    /// first, where the file was opened to append).
    fn append(&self, bufs: &[&[u8]]) -> io::Result<()>;
    /// `fdatasync`: the appended bytes (and the new length) are durable.
    fn sync_data(&self) -> io::Result<()>;
}

/// The file operations of a log.
pub(crate) trait FileLayer: Send + Sync + std::fmt::Debug {
    /// Creates the log directory (and its parents) when missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens `path` for appending, creating it when missing, and returns
    /// it with the offset appends start at: `at`, or the end of the file
    /// for `None` (a recycled file is longer than what was written to it).
    /// With `direct`, large appends bypass the page cache where the
    /// platform and file system allow it.
    fn open_append(&self, path: &Path, direct: bool, at: Option<u64>) -> io::Result<(Arc<dyn SegmentWriter>, u64)>;
    /// Opens `path` for reading.
    fn open_read(&self, path: &Path) -> io::Result<File>;
    /// The length of `path` in bytes.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Cuts `path` to `len` bytes and syncs it.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Deletes `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes every byte of `path` read as zero, keeping its length and its
    /// blocks allocated, and syncs it. Errors where the file system cannot
    /// (then the file is deleted rather than recycled).
    fn zero(&self, path: &Path) -> io::Result<()>;
    /// Syncs the directory, so that created entries survive a crash.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's files.
#[derive(Debug, Default)]
pub(crate) struct RealFiles;

struct RealSegment(File);

impl SegmentWriter for RealSegment {
    fn append(&self, bufs: &[&[u8]]) -> io::Result<()> {
        write_all_vectored(&self.0, bufs)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

/// `write_all` for several buffers, with as few system calls as the kernel allows.
fn write_all_vectored(mut file: &File, bufs: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bufs.iter().filter(|b| !b.is_empty()).map(|b| IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0 bytes")),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl FileLayer for RealFiles {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            // Names that are not UTF-8 cannot be segments; skip them.
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn open_append(&self, path: &Path, direct: bool, at: Option<u64>) -> io::Result<(Arc<dyn SegmentWriter>, u64)> {
        #[cfg(target_os = "linux")]
        if direct && let Some(segment) = crate::direct::DirectSegment::open(path, at)? {
            let len = segment.len();
            return Ok((Arc::new(segment), len));
        }
        #[cfg(not(target_os = "linux"))]
        let _ = direct;
        // Not `O_APPEND`: appends go where the last one ended, which in a
        // recycled file is before its end. One writer appends at a time.
        let mut file = OpenOptions::new().write(true).create(true).truncate(false).open(path)?;
        let start = file.seek(at.map_or(SeekFrom::End(0), SeekFrom::Start))?;
        Ok((Arc::new(RealSegment(file)), start))
    }

    fn open_read(&self, path: &Path) -> io::Result<File> {
        File::open(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(len)?;
        file.sync_all()
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn zero(&self, path: &Path) -> io::Result<()> {
        zero_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // Opening a directory read-only and fsyncing it is how POSIX makes
        // new entries durable; other platforms have no such call.
        if cfg!(unix) { File::open(dir)?.sync_all() } else { Ok(()) }
    }
}

/// Zeroes a file in place with `FALLOC_FL_ZERO_RANGE`: its blocks stay
/// allocated (marked unwritten), so rewriting them later allocates nothing,
/// which on thin-provisioned and SSD storage is much faster than writing
/// fresh blocks.
#[cfg(target_os = "linux")]
fn zero_file(path: &Path) -> io::Result<()> {
    use rustix::fs::{FallocateFlags, fallocate};
    let file = OpenOptions::new().write(true).open(path)?;
    let len = file.metadata()?.len();
    if len > 0 {
        fallocate(&file, FallocateFlags::ZERO_RANGE, 0, len)?;
    }
    file.sync_data()
}

#[cfg(not(target_os = "linux"))]
fn zero_file(_path: &Path) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "zeroing a file in place needs Linux"))
}

/// A test hook on a log's file layer: counts `fdatasync`s and appends, and
/// fails the k-th `fdatasync` or append on request.
///
/// Clones share their counters, so a test keeps one clone and gives the
/// other to [`crate::WalOptions::with_fault_injection`]. Counting starts at
/// zero when the hook is created; numbers passed to the `fail_*` methods are
/// 1-based positions in that count (the 3rd sync is number 3). A failed
/// operation does nothing and returns an `EIO`-like error.
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
    fail_sync_at: AtomicU64,
    fail_append_at: AtomicU64,
    delay_sync_at: AtomicU64,
    delay_sync_micros: AtomicU64,
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

    /// `fsync` calls on the log directory so far.
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

    /// Makes the `n`-th `fdatasync` fail (0 turns this off).
    pub fn fail_sync_number(&self, n: u64) {
        self.state.fail_sync_at.store(n, Ordering::SeqCst);
    }

    /// Makes the `n`-th `fdatasync` take `delay` longer (0 turns this off),
    /// so a test can make commits overlap.
    pub fn delay_sync_number(&self, n: u64, delay: std::time::Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.state.delay_sync_micros.store(micros, Ordering::SeqCst);
        self.state.delay_sync_at.store(n, Ordering::SeqCst);
    }

    /// Makes the `n`-th append fail without writing anything (0 turns this off).
    pub fn fail_append_number(&self, n: u64) {
        self.state.fail_append_at.store(n, Ordering::SeqCst);
    }

    fn on_sync(&self) -> io::Result<()> {
        let n = self.state.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if self.state.delay_sync_at.load(Ordering::SeqCst) == n {
            let micros = self.state.delay_sync_micros.load(Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(micros));
        }
        injected_failure(n, &self.state.fail_sync_at, "fdatasync")
    }

    fn on_append(&self) -> io::Result<()> {
        let n = self.state.appends.fetch_add(1, Ordering::SeqCst) + 1;
        injected_failure(n, &self.state.fail_append_at, "append")
    }
}

fn injected_failure(n: u64, fail_at: &AtomicU64, op: &str) -> io::Result<()> {
    if fail_at.load(Ordering::SeqCst) == n {
        Err(io::Error::other(format!("injected failure of {op} number {n}")))
    } else {
        Ok(())
    }
}

/// [`RealFiles`] behind a [`FaultInjection`] hook.
#[derive(Debug)]
pub(crate) struct HookedFiles {
    pub(crate) inner: RealFiles,
    pub(crate) hook: FaultInjection,
}

struct HookedSegment {
    inner: Arc<dyn SegmentWriter>,
    hook: FaultInjection,
}

impl SegmentWriter for HookedSegment {
    fn append(&self, bufs: &[&[u8]]) -> io::Result<()> {
        self.hook.on_append()?;
        self.inner.append(bufs)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.hook.on_sync()?;
        self.inner.sync_data()
    }
}

impl FileLayer for HookedFiles {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn open_append(&self, path: &Path, direct: bool, at: Option<u64>) -> io::Result<(Arc<dyn SegmentWriter>, u64)> {
        self.hook.state.opens.fetch_add(1, Ordering::SeqCst);
        let (inner, len) = self.inner.open_append(path, direct, at)?;
        Ok((Arc::new(HookedSegment { inner, hook: self.hook.clone() }), len))
    }

    fn open_read(&self, path: &Path) -> io::Result<File> {
        self.inner.open_read(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        self.inner.truncate(path, len)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn zero(&self, path: &Path) -> io::Result<()> {
        self.inner.zero(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.hook.state.dir_syncs.fetch_add(1, Ordering::SeqCst);
        self.inner.sync_dir(dir)
    }
}

/// The file layer for `hook`: the real one, counted and failed on request when a hook is given.
pub(crate) fn file_layer(hook: Option<&FaultInjection>) -> Arc<dyn FileLayer> {
    match hook {
        Some(hook) => Arc::new(HookedFiles { inner: RealFiles, hook: hook.clone() }),
        None => Arc::new(RealFiles),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_counts_and_fails_the_chosen_sync() {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        let files = file_layer(Some(&hook));
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
