//! The file layer: every file operation the log makes goes through the
//! [`FileLayer`] trait, so tests can count `fdatasync`s and inject failures.
//!
//! [`RealFiles`] is the operating system; with the `failpoints` feature,
//! `HookedFiles` (in `faults.rs`) wraps it with a public `FaultInjection`
//! hook that tests (in this crate and others) hand to the log through
//! `WalSettings::fault_injection`.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "failpoints")]
use crate::faults::HookedFiles;
use crate::settings::WalSettings;

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
    /// Creates the log directory (and its parents) when missing, readable
    /// by the owner only.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Clears the permission bits of `path` outside `allowed` (0o700 for
    /// a directory, 0o600 for a file); returns the old mode when it changed.
    fn restrict_mode(&self, path: &Path, allowed: u32) -> io::Result<Option<u32>>;
    /// Creates `path`, which must not exist, owner-only, with `bytes` in
    /// it, and syncs it.
    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Links `to` to the file at `from`; fails if `to` exists (unlike a
    /// rename, it never replaces a file).
    fn link(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Bytes written with direct I/O (`O_DIRECT`) through this layer so far.
    fn direct_bytes(&self) -> u64;
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
pub(crate) struct RealFiles {
    /// Bytes its direct segments wrote with `O_DIRECT`.
    direct_bytes: Arc<AtomicU64>,
}

/// The mode of every file the log creates: the owner's only.
#[cfg(unix)]
pub(crate) const FILE_MODE: u32 = 0o600;
/// The mode of every directory the log creates: the owner's only.
#[cfg(unix)]
pub(crate) const DIR_MODE: u32 = 0o700;

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
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
        builder.create(dir)
    }

    #[cfg(unix)]
    fn restrict_mode(&self, path: &Path, allowed: u32) -> io::Result<Option<u32>> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
        if mode & !allowed == 0 {
            return Ok(None);
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & allowed))?;
        Ok(Some(mode))
    }

    #[cfg(not(unix))]
    fn restrict_mode(&self, _path: &Path, _allowed: u32) -> io::Result<Option<u32>> {
        Ok(None)
    }

    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = owner_only(OpenOptions::new().write(true).create_new(true)).open(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::hard_link(from, to)
    }

    fn direct_bytes(&self) -> u64 {
        self.direct_bytes.load(Ordering::Relaxed)
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
        if direct && let Some(segment) = crate::direct::DirectSegment::open(path, at, Arc::clone(&self.direct_bytes))? {
            let len = segment.len();
            return Ok((Arc::new(segment), len));
        }
        #[cfg(not(target_os = "linux"))]
        let _ = direct;
        // Not `O_APPEND`: appends go where the last one ended, which in a
        // recycled file is before its end. One writer appends at a time.
        let mut file = owner_only(OpenOptions::new().write(true).create(true).truncate(false)).open(path)?;
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

/// `options`, creating files readable and writable by the owner only.
pub(crate) fn owner_only(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, FILE_MODE);
    options
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

/// The file layer a log with `options` uses: the real one, counted and
/// failed on request when the options carry a fault-injection hook.
#[cfg(feature = "failpoints")]
pub(crate) fn file_layer(options: &WalSettings) -> Arc<dyn FileLayer> {
    match &options.fault_injection {
        Some(hook) => Arc::new(HookedFiles::new(RealFiles::default(), hook.clone())),
        None => Arc::new(RealFiles::default()),
    }
}

/// The file layer a log with `options` uses: the real one (this build has
/// no fault injection).
#[cfg(not(feature = "failpoints"))]
pub(crate) fn file_layer(_options: &WalSettings) -> Arc<dyn FileLayer> {
    Arc::new(RealFiles::default())
}
