//! Appends with direct I/O (`O_DIRECT`, Linux): the whole pages of an
//! append go from a page-aligned staging buffer straight to the device,
//! bypassing the page cache; the partial pages at its two ends go through
//! the page cache as usual.
//!
//! For a log of large records (received blocks), buffered appends spend
//! more processor time than anything else in the log: the kernel copies
//! every byte into freshly allocated page-cache pages, then tracks, writes
//! back and reclaims them. A copy into a staging buffer that stays in cache
//! costs a fraction of that, and the device then reads the buffer itself.
//!
//! Every page of the file is written one way only (a page an append shares
//! with the next is always buffered), so the two paths never overlap, and
//! `fdatasync` makes both durable: it writes the dirty pages and the file
//! size, and flushes the device's write cache, which direct writes may
//! still sit in. The file layout is the same as with buffered appends.
//!
//! A file system that refuses direct I/O (at open, or on the first write)
//! gets buffered appends, with one warning.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::files::SegmentWriter;

/// The alignment direct I/O needs of file offsets, lengths and buffer
/// addresses: a page satisfies every common device.
const ALIGN: u64 = 4096;

/// The most bytes one direct write takes: enough to keep the device
/// streaming, small enough that the staging buffer stays in cache.
const CHUNK: usize = 4 << 20;

/// The fewest bytes worth writing directly. A direct write waits for the
/// device while the writer lock is held; below this, a buffered write (and
/// its share of the `fdatasync`) costs less.
const MIN_DIRECT: u64 = 256 << 10;

/// A segment file appended to with direct I/O; see the module documentation.
pub(crate) struct DirectSegment {
    /// Takes the partial pages at the ends of each append, and the syncs.
    buffered: File,
    /// The same file, opened with `O_DIRECT`.
    direct: File,
    state: Mutex<DirectState>,
    /// Bytes written with direct I/O so far (a figure for tests).
    direct_bytes: AtomicU64,
}

struct DirectState {
    /// Bytes in the file: where the next append starts.
    len: u64,
    /// Page-aligned staging for direct writes, allocated on first use.
    staging: Vec<u8>,
    /// Cleared when the file system refuses a direct write.
    direct_ok: bool,
}

impl DirectSegment {
    /// Opens `path` for appending (creating it when missing) with direct
    /// I/O; `None` when its file system does not support direct I/O.
    pub(crate) fn open(path: &Path) -> io::Result<Option<Self>> {
        let buffered = OpenOptions::new().write(true).create(true).truncate(false).open(path)?;
        let direct = match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "the file system refuses direct I/O: buffered appends");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let len = buffered.metadata()?.len();
        let state = DirectState { len, staging: Vec::new(), direct_ok: true };
        Ok(Some(DirectSegment { buffered, direct, state: Mutex::new(state), direct_bytes: AtomicU64::new(0) }))
    }

    /// The file's length as this writer appended it.
    pub(crate) fn len(&self) -> u64 {
        self.lock().len
    }

    /// Bytes written with direct I/O so far.
    #[cfg(test)]
    pub(crate) fn direct_bytes(&self) -> u64 {
        self.direct_bytes.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DirectState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the next `bytes` of `source` at `pos` through the page cache.
    fn write_buffered(&self, source: &mut Gather<'_>, mut pos: u64, bytes: u64) -> io::Result<u64> {
        for slice in source.take(bytes) {
            self.buffered.write_all_at(slice, pos)?;
            pos += slice.len() as u64;
        }
        Ok(pos)
    }

    /// Writes the next `bytes` (whole pages, at a page-aligned `pos`) of
    /// `source` with direct I/O, through the staging buffer.
    fn write_direct(&self, state: &mut DirectState, source: &mut Gather<'_>, pos: u64, bytes: u64) -> io::Result<u64> {
        let n = usize::try_from(bytes).unwrap_or(usize::MAX);
        let staging = if state.direct_ok { aligned(&mut state.staging, n) } else { None };
        let Some(staging) = staging else {
            return self.write_buffered(source, pos, bytes);
        };
        source.copy_to(staging);
        let written = write_at_most(&self.direct, staging, pos)?;
        self.direct_bytes.fetch_add(written as u64, Ordering::Relaxed);
        // What the direct write left (all of it when refused, or the end of
        // a short write) goes through the page cache.
        if let Some(rest) = staging.get(written..).filter(|rest| !rest.is_empty()) {
            self.buffered.write_all_at(rest, pos + written as u64)?;
        }
        if written == 0 {
            tracing::warn!("the file system refused a direct write: buffered appends from here on");
            state.direct_ok = false;
        }
        Ok(pos + bytes)
    }
}

impl SegmentWriter for DirectSegment {
    fn append(&self, bufs: &[&[u8]]) -> io::Result<()> {
        let mut state = self.lock();
        let mut source = Gather::new(bufs);
        let start = state.len;
        let end = start + source.remaining();
        let (body_start, body_end) = direct_span(start, end);
        let mut pos = self.write_buffered(&mut source, start, body_start - start)?;
        while pos < body_end {
            let bytes = (body_end - pos).min(CHUNK as u64);
            pos = self.write_direct(&mut state, &mut source, pos, bytes)?;
        }
        self.write_buffered(&mut source, pos, end - pos)?;
        state.len = end;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        // The same file: this syncs the pages, the size and the device cache.
        self.buffered.sync_data()
    }
}

/// The whole pages of `start..end` to write directly, or an empty span at
/// `end` when they are too few to be worth it.
fn direct_span(start: u64, end: u64) -> (u64, u64) {
    let body_start = start.next_multiple_of(ALIGN);
    let body_end = end / ALIGN * ALIGN;
    if body_end >= body_start + MIN_DIRECT { (body_start, body_end) } else { (end, end) }
}

/// `n` bytes of `staging` at a page-aligned address, growing it as needed.
fn aligned(staging: &mut Vec<u8>, n: usize) -> Option<&mut [u8]> {
    let align = ALIGN as usize;
    if staging.len() < n + align {
        *staging = vec![0; n.max(CHUNK) + align];
    }
    let offset = staging.as_ptr().align_offset(align);
    staging.get_mut(offset..offset.checked_add(n)?)
}

/// Writes as much of `buf` at `pos` as direct I/O takes: all of it, or
/// what a short write left off at, or nothing when the file system refuses.
fn write_at_most(file: &File, buf: &[u8], pos: u64) -> io::Result<usize> {
    let mut written = 0;
    while written < buf.len() {
        let rest = buf.get(written..).unwrap_or_default();
        match file.write_at(rest, pos + written as u64) {
            Ok(0) => break,
            Ok(n) if n % ALIGN as usize != 0 => return Ok(written + n),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// The bytes of several buffers, taken in order.
struct Gather<'a> {
    rest: &'a [&'a [u8]],
    /// Bytes of `rest[0]` already taken.
    offset: usize,
}

impl<'a> Gather<'a> {
    fn new(bufs: &'a [&'a [u8]]) -> Self {
        Gather { rest: bufs, offset: 0 }
    }

    fn remaining(&self) -> u64 {
        self.rest.iter().map(|b| b.len() as u64).sum::<u64>() - self.offset as u64
    }

    /// The next `bytes` bytes (fewer at the end), as slices of the buffers.
    fn take(&mut self, mut bytes: u64) -> Vec<&'a [u8]> {
        let mut slices = Vec::new();
        while bytes > 0 {
            let Some((first, others)) = self.rest.split_first() else { break };
            let available = first.get(self.offset..).unwrap_or_default();
            let n = available.len().min(usize::try_from(bytes).unwrap_or(usize::MAX));
            if n > 0 {
                slices.push(available.get(..n).unwrap_or_default());
            }
            bytes -= n as u64;
            self.offset += n;
            if self.offset >= first.len() {
                self.rest = others;
                self.offset = 0;
            }
        }
        slices
    }

    /// Fills `out` with the next bytes.
    fn copy_to(&mut self, out: &mut [u8]) {
        let mut at = 0;
        for slice in self.take(out.len() as u64) {
            if let Some(target) = out.get_mut(at..at + slice.len()) {
                target.copy_from_slice(slice);
            }
            at += slice.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that differ at every position (a misplaced chunk shows).
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed).collect()
    }

    #[test]
    fn appends_of_every_shape_leave_exactly_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        std::fs::write(&path, b"existing, unaligned").unwrap();
        let Some(segment) = DirectSegment::open(&path).unwrap() else {
            eprintln!("this file system has no direct I/O: nothing to test");
            return;
        };
        let mut expected = std::fs::read(&path).unwrap();
        // Small (all buffered), several chunks from an unaligned start,
        // split over buffers at odd places, and one ending on a page.
        let sizes = [(100, 3), (9 << 20, 1), (700_000, 5), (1 << 20, 2)];
        for (index, (len, parts)) in sizes.into_iter().enumerate() {
            let bytes = pattern(len, index as u8);
            let bufs: Vec<&[u8]> = bytes.chunks(len / parts + 1).collect();
            segment.append(&bufs).unwrap();
            expected.extend_from_slice(&bytes);
        }
        let to_page = ALIGN as usize - expected.len() % ALIGN as usize;
        segment.append(&[&vec![7u8; to_page + (512 << 10)]]).unwrap();
        expected.extend(std::iter::repeat_n(7u8, to_page + (512 << 10)));
        segment.sync_data().unwrap();
        assert_eq!(segment.len(), expected.len() as u64);
        assert!(segment.direct_bytes() > 10 << 20, "the large appends went direct: {}", segment.direct_bytes());
        assert!(std::fs::read(&path).unwrap() == expected, "file contents differ");
        // Reopened, it appends at the end.
        drop(segment);
        let reopened = DirectSegment::open(&path).unwrap().unwrap();
        assert_eq!(reopened.len(), expected.len() as u64);
    }

    #[test]
    fn the_direct_span_is_whole_pages_and_only_when_worth_it() {
        assert_eq!(direct_span(0, 100), (100, 100));
        assert_eq!(direct_span(10, 10 + MIN_DIRECT), (10 + MIN_DIRECT, 10 + MIN_DIRECT));
        assert_eq!(direct_span(10, 10 + 2 * MIN_DIRECT), (ALIGN, (10 + 2 * MIN_DIRECT) / ALIGN * ALIGN));
        assert_eq!(direct_span(ALIGN, ALIGN + MIN_DIRECT), (ALIGN, ALIGN + MIN_DIRECT));
    }

    #[test]
    fn gather_takes_across_buffer_boundaries() {
        let bufs: [&[u8]; 4] = [b"abc", b"", b"defg", b"h"];
        let mut gather = Gather::new(&bufs);
        assert_eq!(gather.remaining(), 8);
        assert_eq!(gather.take(2), vec![&b"ab"[..]]);
        let mut out = [0u8; 4];
        gather.copy_to(&mut out);
        assert_eq!(&out, b"cdef");
        assert_eq!(gather.remaining(), 2);
        assert_eq!(gather.take(10), vec![&b"g"[..], &b"h"[..]]);
        assert!(gather.take(1).is_empty());
    }
}
