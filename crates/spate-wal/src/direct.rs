//! Appends with direct I/O (`O_DIRECT`, Linux): the whole pages of an
//! append go straight to the device, bypassing the page cache; partial
//! pages, and runs too short to be worth a direct write, go through the
//! page cache as usual.
//!
//! For a log of large records (received blocks), buffered appends spend
//! more processor time than anything else in the log: the kernel copies
//! every byte into freshly allocated page-cache pages, then tracks, writes
//! back and reclaims them. Direct writes let the device read the bytes
//! where they are. The log pads a large record so that its bytes sit at
//! the same offset within a page in the file as in the caller's buffer
//! (see `record`), and its whole pages are then written from that buffer;
//! a large run that is not so aligned is copied through a page-aligned
//! staging buffer first, which still costs far less than the page cache.
//! The direct pieces of an append (the caller's pages and the staged ones
//! between them) go out as one vectored write, so the device sees one
//! stream of requests per append rather than a wait per piece.
//!
//! Every page of the file is written one way only (a page an append shares
//! with the next is always buffered), so the two paths never overlap, and
//! `fdatasync` makes both durable: it writes the dirty pages and the file
//! size, and flushes the device's write cache, which direct writes may
//! still sit in.
//!
//! A file system that refuses direct I/O (at open, or on a write) gets
//! buffered appends, with one warning.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::sync::lock;

use crate::files::{SegmentWriter, owner_only};
use crate::record::{MIN_DIRECT, PAGE};

/// The most bytes staged and written at once: enough to keep the device
/// streaming, small enough that the staging buffer stays in cache.
const CHUNK: usize = 4 << 20;

/// A segment file appended to with direct I/O; see the module documentation.
pub(crate) struct DirectSegment {
    /// Takes the partial pages and short runs of each append, and the syncs.
    buffered: File,
    /// The same file, opened with `O_DIRECT`.
    direct: File,
    state: Mutex<DirectState>,
    /// Bytes written with direct I/O, and of those, copied through the
    /// staging buffer first (figures for tests).
    direct_bytes: AtomicU64,
    staged_bytes: AtomicU64,
    /// Bytes written with direct I/O by every segment of the log.
    log_direct_bytes: Arc<AtomicU64>,
}

struct DirectState {
    /// Bytes in the file: where the next append starts.
    len: u64,
    /// Page-aligned staging for direct writes, allocated on first use.
    staging: Vec<u8>,
    /// Cleared when the file system refuses a direct write.
    direct_ok: bool,
}

/// How the next bytes of an append are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    /// Through the page cache.
    Buffered(u64),
    /// Directly, from the caller's buffer (page-aligned there).
    FromSource(u64),
    /// Directly, copied through the staging buffer.
    Staged(u64),
}

impl DirectSegment {
    /// Opens `path` for appending (creating it when missing) with direct
    /// I/O, at `at` or at its end; `None` when its file system does not
    /// support direct I/O.
    pub(crate) fn open(path: &Path, at: Option<u64>, log_direct_bytes: Arc<AtomicU64>) -> io::Result<Option<Self>> {
        let buffered = owner_only(OpenOptions::new().write(true).create(true).truncate(false)).open(path)?;
        let direct = match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path = %path.display(), "the file system refuses direct I/O: buffered appends");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let len = match at {
            Some(at) => at,
            None => buffered.metadata()?.len(),
        };
        let state = DirectState { len, staging: Vec::new(), direct_ok: true };
        Ok(Some(DirectSegment {
            buffered,
            direct,
            state: Mutex::new(state),
            direct_bytes: AtomicU64::new(0),
            staged_bytes: AtomicU64::new(0),
            log_direct_bytes,
        }))
    }

    /// The file's length as this writer appended it.
    pub(crate) fn len(&self) -> u64 {
        self.lock().len
    }

    /// Bytes written with direct I/O so far, and how many of them were staged.
    #[cfg(test)]
    fn direct_and_staged_bytes(&self) -> (u64, u64) {
        (self.direct_bytes.load(Ordering::Relaxed), self.staged_bytes.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DirectState> {
        lock(&self.state)
    }

    /// Writes the next `bytes` of `source` at `pos` through the page cache.
    fn write_buffered(&self, source: &mut Gather<'_>, mut pos: u64, bytes: u64) -> io::Result<u64> {
        for slice in source.take(bytes) {
            self.buffered.write_all_at(slice, pos)?;
            pos += slice.len() as u64;
        }
        Ok(pos)
    }

    /// Writes the direct pieces gathered so far with one vectored write (a
    /// single stream of requests to the device, not one per piece); what
    /// the file system does not take goes through the page cache.
    fn write_pieces(&self, state: &mut DirectState, pieces: &mut DirectPieces<'_>) -> io::Result<()> {
        if pieces.list.is_empty() {
            return Ok(());
        }
        let staging: &[u8] = match pieces.staged {
            0 => &[],
            _ => state.staging_area().map_or(&[], |area| &*area),
        };
        let slices: Vec<&[u8]> = pieces.list.iter().map(|piece| piece.bytes(staging)).collect();
        let written = write_vectored_at_most(&self.direct, &slices, pieces.start)?;
        self.direct_bytes.fetch_add(written, Ordering::Relaxed);
        self.log_direct_bytes.fetch_add(written, Ordering::Relaxed);
        self.staged_bytes.fetch_add(pieces.staged as u64, Ordering::Relaxed);
        let mut skip = written;
        let mut pos = pieces.start;
        for slice in slices {
            let taken = usize::try_from(skip).unwrap_or(usize::MAX).min(slice.len());
            if let Some(rest) = slice.get(taken..).filter(|rest| !rest.is_empty()) {
                self.buffered.write_all_at(rest, pos + taken as u64)?;
            }
            skip -= taken as u64;
            pos += slice.len() as u64;
        }
        if written == 0 {
            tracing::warn!("the file system refused a direct write: buffered appends from here on");
            state.direct_ok = false;
        }
        *pieces = DirectPieces::at(pos);
        Ok(())
    }

    /// Adds the next `bytes` of `source` (page-aligned in memory) to the
    /// direct pieces as they are, writing the pieces out when the list is full.
    fn gather_source<'a>(
        &self,
        state: &mut DirectState,
        source: &mut Gather<'a>,
        pieces: &mut DirectPieces<'a>,
        bytes: u64,
    ) -> io::Result<()> {
        pieces.list.extend(source.take(bytes).into_iter().map(Piece::Source));
        self.write_if_full(state, pieces)
    }

    /// Copies the next `bytes` of `source` into the staging area and adds
    /// them to the direct pieces, writing the pieces out whenever the
    /// staging area or the list is full.
    fn gather_staged<'a>(
        &self,
        state: &mut DirectState,
        source: &mut Gather<'a>,
        pieces: &mut DirectPieces<'a>,
        mut bytes: u64,
    ) -> io::Result<()> {
        while bytes > 0 {
            if pieces.staged == CHUNK {
                self.write_pieces(state, pieces)?;
            }
            let n = (CHUNK - pieces.staged).min(usize::try_from(bytes).unwrap_or(usize::MAX));
            let Some(area) = state.staging_area() else {
                return Err(io::Error::other("no page-aligned staging area"));
            };
            source.copy_to(area.get_mut(pieces.staged..pieces.staged + n).unwrap_or_default());
            pieces.list.push(Piece::Staged(pieces.staged..pieces.staged + n));
            pieces.staged += n;
            bytes -= n as u64;
        }
        self.write_if_full(state, pieces)
    }

    fn write_if_full(&self, state: &mut DirectState, pieces: &mut DirectPieces<'_>) -> io::Result<()> {
        if pieces.list.len() >= MAX_PIECES { self.write_pieces(state, pieces) } else { Ok(()) }
    }
}

/// The most pieces in one vectored write (the kernel takes up to 1024).
const MAX_PIECES: usize = 256;

/// Whole pages gathered for one vectored direct write, from `start`.
struct DirectPieces<'a> {
    start: u64,
    list: Vec<Piece<'a>>,
    /// Bytes of the staging area in use.
    staged: usize,
}

impl DirectPieces<'_> {
    fn at(start: u64) -> Self {
        DirectPieces { start, list: Vec::new(), staged: 0 }
    }
}

/// Page-aligned bytes for a direct write: a caller's, or staged.
enum Piece<'a> {
    Source(&'a [u8]),
    Staged(std::ops::Range<usize>),
}

impl<'p> Piece<'p> {
    fn bytes<'s>(&'s self, staging: &'s [u8]) -> &'s [u8]
    where
        'p: 's,
    {
        match self {
            Piece::Source(bytes) => bytes,
            Piece::Staged(range) => staging.get(range.clone()).unwrap_or_default(),
        }
    }
}

impl DirectState {
    /// The page-aligned staging area of [`CHUNK`] bytes, allocated on
    /// first use; `None` only if the allocation could not be aligned.
    fn staging_area(&mut self) -> Option<&mut [u8]> {
        let align = PAGE as usize;
        if self.staging.len() < CHUNK + align {
            self.staging = vec![0; CHUNK + align];
        }
        let offset = self.staging.as_ptr().align_offset(align);
        self.staging.get_mut(offset..offset.checked_add(CHUNK)?)
    }
}

impl SegmentWriter for DirectSegment {
    fn append(&self, bufs: &[&[u8]]) -> io::Result<()> {
        let mut state = self.lock();
        let mut source = Gather::new(bufs);
        let mut pos = state.len;
        let end = pos + source.remaining();
        let mut pieces = DirectPieces::at(pos);
        while pos < end {
            match next_run(source.current(), pos, end, state.direct_ok) {
                Run::Buffered(bytes) => {
                    // Direct pieces gathered so far come before these bytes.
                    self.write_pieces(&mut state, &mut pieces)?;
                    pos = self.write_buffered(&mut source, pos, bytes)?;
                    pieces = DirectPieces::at(pos);
                }
                Run::FromSource(bytes) => {
                    self.gather_source(&mut state, &mut source, &mut pieces, bytes)?;
                    pos += bytes;
                }
                Run::Staged(bytes) => {
                    self.gather_staged(&mut state, &mut source, &mut pieces, bytes)?;
                    pos += bytes;
                }
            }
        }
        self.write_pieces(&mut state, &mut pieces)?;
        state.len = end;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        // The same file: this syncs the pages, the size and the device cache.
        self.buffered.sync_data()
    }
}

/// How to write the bytes from file offset `pos` (of an append ending at
/// `end`), where `current` is the rest of the buffer they start in.
///
/// A partial page, or a run of whole pages shorter than [`MIN_DIRECT`], is
/// buffered. Whole pages are written from `current` when it is
/// page-aligned in memory, and otherwise staged, up to the page where
/// `current` ends (the next buffer may be aligned: a padded record).
fn next_run(current: &[u8], pos: u64, end: u64, direct_ok: bool) -> Run {
    let page_end = pos.next_multiple_of(PAGE).min(end);
    if !pos.is_multiple_of(PAGE) || !direct_ok {
        return Run::Buffered(if direct_ok { page_end - pos } else { end - pos });
    }
    let whole_pages = (end - pos) / PAGE * PAGE;
    if whole_pages == 0 {
        return Run::Buffered(end - pos);
    }
    let in_current = current.len() as u64;
    let from_source = in_current >= PAGE && current.as_ptr().align_offset(PAGE as usize) == 0;
    let run = if from_source {
        whole_pages.min(in_current / PAGE * PAGE)
    } else {
        whole_pages.min(in_current.next_multiple_of(PAGE))
    };
    match run {
        // An append of whole pages (a padded one) goes direct throughout.
        run if run < MIN_DIRECT && !end.is_multiple_of(PAGE) => Run::Buffered(run),
        run if from_source => Run::FromSource(run),
        run => Run::Staged(run),
    }
}

/// Writes as much of `bufs` at `pos` as direct I/O takes: all of it, or
/// up to where a short write left off, or nothing when the file system
/// refuses. One system call per write, so the device sees one stream.
fn write_vectored_at_most(file: &File, bufs: &[&[u8]], pos: u64) -> io::Result<u64> {
    use std::io::{IoSlice, Seek, SeekFrom, Write};
    let mut slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    let mut file = file;
    // The direct file is only written under the segment's lock, so its
    // position is ours between the seek and the write.
    file.seek(SeekFrom::Start(pos))?;
    let mut written = 0u64;
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => break,
            Ok(n) => {
                written += n as u64;
                IoSlice::advance_slices(&mut rest, n);
                if !written.is_multiple_of(PAGE) {
                    break;
                }
            }
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

    /// The rest of the buffer the next byte is in (empty at the end).
    fn current(&self) -> &'a [u8] {
        let mut rest = self.rest;
        let mut offset = self.offset;
        while let Some((first, others)) = rest.split_first() {
            match first.get(offset..) {
                Some(left) if !left.is_empty() => return left,
                _ => (rest, offset) = (others, 0),
            }
        }
        &[]
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

    /// A direct segment on a file in `dir` that starts with `existing`, or
    /// `None` (with a note) where the file system has no direct I/O.
    fn segment_in(dir: &tempfile::TempDir, existing: &[u8]) -> Option<(DirectSegment, std::path::PathBuf)> {
        let path = dir.path().join("segment");
        std::fs::write(&path, existing).unwrap();
        let segment = DirectSegment::open(&path, None, Arc::default()).unwrap();
        if segment.is_none() {
            eprintln!("this file system has no direct I/O: nothing to test");
        }
        segment.map(|segment| (segment, path))
    }

    #[test]
    fn appends_of_every_shape_leave_exactly_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let Some((segment, path)) = segment_in(&dir, b"existing, unaligned") else { return };
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
        let to_page = PAGE as usize - expected.len() % PAGE as usize;
        segment.append(&[&vec![7u8; to_page + (512 << 10)]]).unwrap();
        expected.extend(std::iter::repeat_n(7u8, to_page + (512 << 10)));
        segment.sync_data().unwrap();
        assert_eq!(segment.len(), expected.len() as u64);
        let (direct, _) = segment.direct_and_staged_bytes();
        assert!(direct > 10 << 20, "the large appends went direct: {direct}");
        assert!(std::fs::read(&path).unwrap() == expected, "file contents differ");
        // Reopened, it appends at the end.
        drop(segment);
        let reopened = DirectSegment::open(&path, None, Arc::default()).unwrap().unwrap();
        assert_eq!(reopened.len(), expected.len() as u64);
    }

    #[test]
    fn aligned_buffers_go_direct_without_a_copy_and_others_are_staged() {
        let dir = tempfile::tempdir().unwrap();
        let Some((segment, path)) = segment_in(&dir, b"") else { return };
        let memory = pattern((3 << 20) + 2 * PAGE as usize, 9);
        let offset = memory.as_ptr().align_offset(PAGE as usize);
        let aligned = &memory[offset..offset + (1 << 20)];
        // At offset 0 of the file, page-aligned in memory: no copy.
        segment.append(&[aligned]).unwrap();
        assert_eq!(segment.direct_and_staged_bytes(), (1 << 20, 0));
        // A header, then a payload whose address matches its file offset
        // within a page (as the log pads a record), ending on a page: the
        // first page is staged, the payload's other pages go straight from memory.
        let payload = &memory[offset + 12..offset + (2 << 20)];
        segment.append(&[&[1u8; 12], payload]).unwrap();
        assert_eq!(segment.direct_and_staged_bytes(), ((1 << 20) + (2 << 20), PAGE));
        // Misaligned in memory: staged.
        let misaligned = &memory[offset + 1..offset + 1 + (1 << 20)];
        segment.append(&[&[2u8; 8], misaligned]).unwrap();
        assert!(segment.direct_and_staged_bytes().1 > 0);
        let expected = [aligned, &[1u8; 12], payload, &[2u8; 8], misaligned].concat();
        assert!(std::fs::read(&path).unwrap() == expected, "file contents differ");
    }

    #[test]
    fn an_append_of_several_padded_records_stages_only_the_pages_between_them() {
        let dir = tempfile::tempdir().unwrap();
        let Some((segment, path)) = segment_in(&dir, b"") else { return };
        let (first, second) = (pattern(3 << 20, 1), pattern(3 << 20, 2));
        let at = |memory: &Vec<u8>| memory.as_ptr().align_offset(PAGE as usize) + 12;
        // Each payload sits 12 bytes into a page in memory, and in the file
        // after its 12-byte header (the first after 100 bytes of the page).
        let p1 = &first[at(&first)..at(&first) + (1 << 20) + 88];
        let p2 = &second[at(&second)..at(&second) + (1 << 20) - 12];
        let gap = vec![0u8; PAGE as usize - 100];
        let bufs: [&[u8]; 5] = [&[1u8; 12], p1, &gap, &[2u8; 12], p2];
        segment.append(&bufs).unwrap();
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        assert_eq!(total % PAGE, 0);
        // Staged: the first page, the one after the first payload's last
        // whole page, and the one holding the second header.
        assert_eq!(segment.direct_and_staged_bytes(), (total, 3 * PAGE));
        assert!(std::fs::read(&path).unwrap() == bufs.concat(), "file contents differ");
    }

    #[test]
    fn runs_are_direct_only_for_whole_pages_worth_it() {
        let memory = vec![0u8; 4 << 20];
        let offset = memory.as_ptr().align_offset(PAGE as usize);
        let aligned = &memory[offset..offset + (2 << 20)];
        let unaligned = &memory[offset + 1..offset + 1 + (2 << 20)];
        let big = 2 << 20;
        // A partial page first: buffered up to the page boundary.
        assert_eq!(next_run(aligned, 10, 10 + big, true), Run::Buffered(PAGE - 10));
        assert_eq!(next_run(aligned, PAGE, PAGE + big, true), Run::FromSource(big));
        assert_eq!(next_run(aligned, 0, big + 100, true), Run::FromSource(big));
        // The pages of an unaligned buffer, up to the page where it ends.
        assert_eq!(next_run(unaligned, 0, 3 << 20, true), Run::Staged(big));
        assert_eq!(next_run(&unaligned[..big as usize - 1], 0, 3 << 20, true), Run::Staged(big));
        // The last bytes of an aligned buffer (under a page) and the next
        // buffer's start share a page, written alone (staged when the
        // append is whole pages), never the rest of the append with it.
        let tail = &aligned[..100];
        assert_eq!(next_run(tail, 0, 3 << 20, true), Run::Staged(PAGE));
        assert_eq!(next_run(tail, 0, (3 << 20) - 100, true), Run::Buffered(PAGE));
        // Short runs and the tail are buffered; so is everything once refused.
        assert_eq!(next_run(&aligned[..PAGE as usize], 0, big + 100, true), Run::Buffered(PAGE));
        assert_eq!(next_run(&aligned[..PAGE as usize], 0, big, true), Run::FromSource(PAGE));
        assert_eq!(next_run(aligned, 0, 100, true), Run::Buffered(100));
        assert_eq!(next_run(aligned, 0, big, false), Run::Buffered(big));
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
        assert_eq!(gather.current(), b"g");
        assert_eq!(gather.take(10), vec![&b"g"[..], &b"h"[..]]);
        assert!(gather.current().is_empty());
        assert!(gather.take(1).is_empty());
        let with_empty: [&[u8]; 3] = [b"ab", b"", b"c"];
        let mut gather = Gather::new(&with_empty);
        gather.take(2);
        assert_eq!(gather.current(), b"c", "empty buffers are skipped");
    }
}
