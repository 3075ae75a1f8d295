//! The record frame and the segment scanner.
//!
//! A record on disk is a 12-byte header followed by the payload:
//!
//! ```text
//! 0..4   payload length, u32 little-endian
//! 4..8   CRC32C of the payload
//! 8..12  CRC32C of bytes 0..8 (so a damaged length is caught before it is used)
//! ```
//!
//! The header has its own checksum so that a flipped length is recognised
//! as damage rather than trusted; the scanner checks every length against
//! the configured maximum and against the bytes left in the segment before
//! it allocates anything.
//!
//! A length word with its top bit set ([`PADDING`]) frames padding rather
//! than a record: that many zero bytes, checksummed like a payload, which
//! readers skip. A log with direct I/O puts padding (under two pages)
//! before a large record so that the record's bytes sit at the same offset
//! within a page in the file as in the caller's memory: its whole pages
//! then go to the device straight from the caller's buffer, with no copy.

use std::fmt;
use std::io::{self, Read, Seek, SeekFrom};

/// Bytes in a record header.
pub(crate) const HEADER_LEN: usize = 12;

/// The bit of a header's length word that marks padding.
pub(crate) const PADDING: u32 = 1 << 31;

/// The page that direct I/O aligns file offsets, lengths and buffers to.
pub(crate) const PAGE: u64 = 4096;

/// The fewest whole pages of a record worth writing directly (and padding
/// for). A direct write waits for the device while the writer lock is
/// held; below this, a buffered write and its share of the sync cost less.
pub(crate) const MIN_DIRECT: u64 = 256 << 10;

/// The longest padding: it is always shorter than two pages.
const MAX_PADDING: u32 = 2 * PAGE as u32;

/// Zero bytes that padding is made of.
pub(crate) static ZEROS: [u8; MAX_PADDING as usize] = [0; MAX_PADDING as usize];

/// The header of `payload` (whose length the caller has checked fits a u32).
pub(crate) fn encode_header(payload: &[u8]) -> [u8; HEADER_LEN] {
    header_with_crc(payload.len(), crc32c::crc32c(payload))
}

/// The header of a payload of `len` bytes whose CRC32C is `payload_crc`.
pub(crate) fn header_with_crc(len: usize, payload_crc: u32) -> [u8; HEADER_LEN] {
    header_of_word(u32::try_from(len).unwrap_or(u32::MAX), payload_crc)
}

/// The header of `len` bytes of padding, `len` at most [`ZEROS`]' length.
pub(crate) fn padding_header(len: usize) -> [u8; HEADER_LEN] {
    let zeros = ZEROS.get(..len).unwrap_or(&ZEROS);
    header_of_word(zeros.len() as u32 | PADDING, crc32c::crc32c(zeros))
}

fn header_of_word(word: u32, payload_crc: u32) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&word.to_le_bytes());
    header[4..8].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&header[0..8]);
    header[8..12].copy_from_slice(&header_crc.to_le_bytes());
    header
}

/// A record as it is appended: header then payload, in one buffer.
pub(crate) fn encode_frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(&encode_header(payload));
    frame.extend_from_slice(payload);
    frame
}

/// Reads exactly `len` payload bytes into a new vector, without zeroing it
/// first (the caller has checked `len` against its bounds).
pub(crate) fn read_payload(source: &mut impl Read, len: u32) -> io::Result<Vec<u8>> {
    let mut payload = Vec::with_capacity(len as usize);
    source.take(u64::from(len)).read_to_end(&mut payload)?;
    if payload.len() != len as usize {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "segment ended inside a record"));
    }
    Ok(payload)
}

/// A header whose own checksum matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Bytes after the header (the [`PADDING`] bit cleared).
    pub(crate) len: u32,
    pub(crate) payload_crc: u32,
    /// Whether it frames padding rather than a record.
    pub(crate) padding: bool,
}

impl Header {
    /// The longest the bytes after this header may be.
    fn max_len(&self, max_record_size: u32) -> u32 {
        if self.padding { MAX_PADDING } else { max_record_size }
    }
}

/// The header in `bytes`, or `None` when its checksum does not match.
pub(crate) fn decode_header(bytes: &[u8; HEADER_LEN]) -> Option<Header> {
    let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    (crc32c::crc32c(&bytes[0..8]) == word(8)).then(|| Header {
        len: word(0) & !PADDING,
        payload_crc: word(4),
        padding: word(0) & PADDING != 0,
    })
}

/// Why the bytes at an offset are not a good record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BadRecord {
    /// The segment ends inside the header or the payload: a torn write when it is the tail.
    Truncated {
        /// Bytes the record needs from its offset.
        needed: u64,
        /// Bytes left in the segment.
        available: u64,
    },
    /// The header's own checksum does not match.
    HeaderChecksum,
    /// The header is intact but declares more than the maximum record size.
    TooLong {
        /// The declared payload length.
        len: u32,
        /// The configured maximum.
        max: u32,
    },
    /// The payload does not match its checksum.
    PayloadChecksum {
        /// The CRC in the header.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
}

impl BadRecord {
    /// True when nothing after the record can be a separate record: the
    /// segment simply ends inside it.
    pub(crate) fn is_truncation(&self) -> bool {
        matches!(self, BadRecord::Truncated { .. })
    }
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadRecord::Truncated { needed, available } => {
                write!(f, "record truncated: {needed} bytes needed, {available} left in the segment")
            }
            BadRecord::HeaderChecksum => write!(f, "record header checksum mismatch"),
            BadRecord::TooLong { len, max } => {
                write!(f, "record length {len} exceeds the maximum record size {max}")
            }
            BadRecord::PayloadChecksum { stored, computed } => {
                write!(f, "payload checksum mismatch: stored crc32c {stored:#010x}, computed {computed:#010x}")
            }
        }
    }
}

/// One step of a scan.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A good record at `offset`.
    Record {
        /// Where its header starts.
        offset: u64,
        /// Its payload.
        payload: Vec<u8>,
    },
    /// The scan reached the end of the segment exactly at a record boundary.
    End,
    /// The bytes at `offset` are not a good record.
    Bad {
        /// Where the bad record starts.
        offset: u64,
        /// What is wrong with it.
        problem: BadRecord,
    },
}

/// Reads the records of one segment in order, up to a byte limit.
///
/// After [`Step::Bad`] the scanner stays at the bad record; the caller
/// either stops or moves on with [`RecordScanner::resync`] and
/// [`RecordScanner::seek`].
pub(crate) struct RecordScanner<R> {
    source: R,
    pos: u64,
    end: u64,
    max_record_size: u32,
    in_sync: bool,
}

/// Bytes examined per read while looking for the next good record.
const RESYNC_WINDOW: usize = 64 * 1024;

impl<R: Read + Seek> RecordScanner<R> {
    /// A scanner over the first `end` bytes of `source`, which must be at offset 0.
    pub(crate) fn new(source: R, end: u64, max_record_size: u32) -> Self {
        RecordScanner { source, pos: 0, end, max_record_size, in_sync: true }
    }

    /// The byte limit of the scan.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Moves to `offset` (which the caller knows to be a record boundary).
    pub(crate) fn seek(&mut self, offset: u64) {
        self.pos = offset.min(self.end);
        self.in_sync = false;
    }

    /// The next record, the end, or what is wrong at the current offset;
    /// padding is skipped.
    pub(crate) fn next_step(&mut self) -> io::Result<Step> {
        loop {
            if let Some(step) = self.next_frame()? {
                return Ok(step);
            }
        }
    }

    /// The frame at the current offset as a step, or `None` for padding
    /// (checked, and moved past).
    fn next_frame(&mut self) -> io::Result<Option<Step>> {
        let offset = self.pos;
        let available = self.end - offset;
        if available == 0 {
            return Ok(Some(Step::End));
        }
        let bad = |problem| Ok(Some(Step::Bad { offset, problem }));
        if available < HEADER_LEN as u64 {
            return bad(BadRecord::Truncated { needed: HEADER_LEN as u64, available });
        }
        self.position_source()?;
        let mut header_bytes = [0u8; HEADER_LEN];
        self.read_exact_tracked(&mut header_bytes)?;
        let Some(header) = decode_header(&header_bytes) else {
            return bad(BadRecord::HeaderChecksum);
        };
        let max = header.max_len(self.max_record_size);
        if header.len > max {
            return bad(BadRecord::TooLong { len: header.len, max });
        }
        let needed = HEADER_LEN as u64 + u64::from(header.len);
        if needed > available {
            return bad(BadRecord::Truncated { needed, available });
        }
        // Both bounds are checked above, so this allocation is at most
        // min(max_record_size, bytes left in the segment).
        let payload = read_payload(&mut self.source, header.len).inspect_err(|_| self.in_sync = false)?;
        let computed = crc32c::crc32c(&payload);
        if computed != header.payload_crc {
            return bad(BadRecord::PayloadChecksum { stored: header.payload_crc, computed });
        }
        self.pos = offset + needed;
        Ok((!header.padding).then_some(Step::Record { offset, payload }))
    }

    /// The offset of the first good record that starts after `after`, if
    /// any. Looks at every byte position; a match needs an intact header
    /// and an intact payload, so random bytes practically never qualify.
    pub(crate) fn resync(&mut self, after: u64) -> io::Result<Option<u64>> {
        let mut window = vec![0u8; RESYNC_WINDOW + HEADER_LEN];
        let mut start = after.saturating_add(1);
        while start.saturating_add(HEADER_LEN as u64) <= self.end {
            let len = usize::try_from(self.end - start).unwrap_or(usize::MAX).min(window.len());
            self.read_at(start, &mut window[..len])?;
            let candidates = len - (HEADER_LEN - 1);
            // No good record has an all-zero header, and a recycled segment
            // holds zeros after its last record: skip them a window at a time.
            if window[..len].iter().all(|&b| b == 0) {
                start += candidates as u64;
                continue;
            }
            for i in 0..candidates {
                let offset = start + i as u64;
                if self.is_good_record_at(offset, &window[i..i + HEADER_LEN])? {
                    return Ok(Some(offset));
                }
            }
            start += candidates as u64;
        }
        Ok(None)
    }

    fn is_good_record_at(&mut self, offset: u64, header_bytes: &[u8]) -> io::Result<bool> {
        let Ok(bytes) = <&[u8; HEADER_LEN]>::try_from(header_bytes) else {
            return Ok(false);
        };
        let Some(header) = decode_header(bytes) else {
            return Ok(false);
        };
        let needed = HEADER_LEN as u64 + u64::from(header.len);
        if header.len > header.max_len(self.max_record_size) || needed > self.end - offset {
            return Ok(false);
        }
        let mut payload = vec![0u8; header.len as usize];
        self.read_at(offset + HEADER_LEN as u64, &mut payload)?;
        Ok(crc32c::crc32c(&payload) == header.payload_crc)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.in_sync = false;
        self.source.seek(SeekFrom::Start(offset))?;
        self.source.read_exact(buf)
    }

    /// Puts the source at `pos` when an earlier seek or resync moved it.
    fn position_source(&mut self) -> io::Result<()> {
        if !self.in_sync {
            self.source.seek(SeekFrom::Start(self.pos))?;
            self.in_sync = true;
        }
        Ok(())
    }

    fn read_exact_tracked(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let result = self.source.read_exact(buf);
        if result.is_err() {
            self.in_sync = false;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use proptest::prelude::*;

    use super::*;

    fn segment(records: &[&[u8]]) -> Vec<u8> {
        records.iter().flat_map(|r| encode_frame(r)).collect()
    }

    fn scan_all(bytes: &[u8], max: u32) -> (Vec<Vec<u8>>, Option<(u64, BadRecord)>) {
        let mut scanner = RecordScanner::new(Cursor::new(bytes), bytes.len() as u64, max);
        let mut records = Vec::new();
        loop {
            match scanner.next_step().unwrap() {
                Step::Record { payload, .. } => records.push(payload),
                Step::End => return (records, None),
                Step::Bad { offset, problem } => return (records, Some((offset, problem))),
            }
        }
    }

    #[test]
    fn frames_round_trip_including_empty_records() {
        let bytes = segment(&[b"one", b"", b"three"]);
        let (records, bad) = scan_all(&bytes, 1024);
        assert_eq!(records, vec![b"one".to_vec(), vec![], b"three".to_vec()]);
        assert_eq!(bad, None);
    }

    #[test]
    fn zero_filled_bytes_are_not_a_record() {
        assert_eq!(decode_header(&[0u8; HEADER_LEN]), None);
    }

    #[test]
    fn huge_declared_length_is_refused_before_allocating() {
        // An intact header that claims 2 GiB: the scanner must refuse it on
        // the numbers alone (a 2 GiB allocation would abort this test).
        let longest = !PADDING;
        let header = header_with_crc(longest as usize, 0);
        let (_, bad) = scan_all(&header, longest);
        assert_eq!(
            bad,
            Some((0, BadRecord::Truncated { needed: HEADER_LEN as u64 + u64::from(longest), available: 12 }))
        );
        let (_, bad) = scan_all(&header, 1 << 20);
        assert_eq!(bad, Some((0, BadRecord::TooLong { len: longest, max: 1 << 20 })));
        // Padding is bounded by its own maximum, whatever the record maximum.
        let padding = header_of_word(PADDING | (MAX_PADDING + 1), 0);
        let (_, bad) = scan_all(&padding, longest);
        assert_eq!(bad, Some((0, BadRecord::TooLong { len: MAX_PADDING + 1, max: MAX_PADDING })));
    }

    /// `len` bytes of padding as a log appends it.
    fn padding_frame(len: usize) -> Vec<u8> {
        let mut frame = padding_header(len).to_vec();
        frame.extend_from_slice(&ZEROS[..len]);
        frame
    }

    #[test]
    fn padding_is_skipped_checked_and_found_by_resync() {
        let mut bytes = padding_frame(100);
        bytes.extend(segment(&[b"first"]));
        bytes.extend(padding_frame(0));
        bytes.extend(padding_frame(MAX_PADDING as usize));
        let second = bytes.len() as u64;
        bytes.extend(segment(&[b"second"]));
        let (records, bad) = scan_all(&bytes, 1024);
        assert_eq!(records, vec![b"first".to_vec(), b"second".to_vec()]);
        assert_eq!(bad, None);
        // Damaged padding is damage like any other, and a resync lands on
        // the next frame (padding or record) after it.
        let mut damaged = bytes.clone();
        damaged[HEADER_LEN + 50] = 1;
        let (records, bad) = scan_all(&damaged, 1024);
        assert!(records.is_empty());
        assert!(matches!(bad, Some((0, BadRecord::PayloadChecksum { .. }))), "{bad:?}");
        let mut scanner = RecordScanner::new(Cursor::new(&damaged), damaged.len() as u64, 1024);
        assert_eq!(scanner.resync(0).unwrap(), Some(HEADER_LEN as u64 + 100));
        // Cut inside padding at the end: a truncation, as for a record.
        let (_, bad) = scan_all(&bytes[..second as usize - 10], 1024);
        assert!(bad.is_some_and(|(_, problem)| problem.is_truncation()));
    }

    #[test]
    fn flipped_payload_byte_is_reported_at_its_record() {
        let mut bytes = segment(&[b"first", b"second", b"third"]);
        let second = (HEADER_LEN + 5) as u64;
        bytes[second as usize + HEADER_LEN + 2] ^= 0x40;
        let (records, bad) = scan_all(&bytes, 1024);
        assert_eq!(records, vec![b"first".to_vec()]);
        let (offset, problem) = bad.unwrap();
        assert_eq!(offset, second);
        assert!(matches!(problem, BadRecord::PayloadChecksum { .. }), "{problem}");
    }

    #[test]
    fn resync_finds_the_record_after_damage_and_nothing_after_the_last() {
        let mut bytes = segment(&[b"first", b"second", b"third"]);
        let second = HEADER_LEN + 5;
        bytes[second + 1] ^= 0xff; // the length of the second record
        let third = (second + HEADER_LEN + 6) as u64;
        let mut scanner = RecordScanner::new(Cursor::new(&bytes), bytes.len() as u64, 1024);
        assert_eq!(scanner.resync(second as u64).unwrap(), Some(third));
        assert_eq!(scanner.resync(third).unwrap(), None);
        scanner.seek(third);
        assert_eq!(scanner.next_step().unwrap(), Step::Record { offset: third, payload: b"third".to_vec() });
        assert_eq!(scanner.next_step().unwrap(), Step::End);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Arbitrary bytes never panic the scanner; every record it accepts
        /// fits both the maximum and the input, and the scan always ends.
        #[test]
        fn arbitrary_bytes_scan_safely(bytes in proptest::collection::vec(any::<u8>(), 0..2048), max in 0u32..4096) {
            let mut scanner = RecordScanner::new(Cursor::new(&bytes), bytes.len() as u64, max);
            let mut last = None;
            for _ in 0..=bytes.len() {
                match scanner.next_step().unwrap() {
                    Step::Record { offset, payload } => {
                        prop_assert!(payload.len() as u64 <= u64::from(max));
                        prop_assert!(offset + (HEADER_LEN + payload.len()) as u64 <= bytes.len() as u64);
                        last = Some(offset);
                    }
                    Step::End => break,
                    Step::Bad { offset, .. } => {
                        if let Some(next) = scanner.resync(offset).unwrap() {
                            prop_assert!(next > offset && next < bytes.len() as u64);
                            scanner.seek(next);
                        } else {
                            break;
                        }
                    }
                }
            }
            prop_assert!(last.is_none_or(|l| l < bytes.len() as u64));
        }

        /// Valid records, arbitrarily cut: the scan returns exactly the
        /// records that fit before the cut, then reports a truncation (or the end).
        #[test]
        fn cut_segments_keep_whole_records(records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8), cut in any::<prop::sample::Index>()) {
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            let bytes = segment(&refs);
            let cut = if bytes.is_empty() { 0 } else { cut.index(bytes.len() + 1) };
            let (read, bad) = scan_all(&bytes[..cut], 1024);
            let mut boundary = 0;
            let mut whole_len = 0;
            let whole = records.iter().take_while(|r| {
                boundary += HEADER_LEN + r.len();
                let fits = boundary <= cut;
                if fits { whole_len = boundary; }
                fits
            }).count();
            prop_assert_eq!(&read[..], &records[..whole]);
            match bad {
                None => prop_assert_eq!(whole_len, cut),
                Some((offset, problem)) => {
                    prop_assert!(problem.is_truncation());
                    prop_assert_eq!(offset, whole_len as u64);
                    prop_assert!(whole_len < cut);
                }
            }
        }
    }
}
