//! The segment header: the first page of every segment this version
//! creates, so a reader can tell a segment of this format from any other
//! file and refuse one of a newer format by name.
//!
//! All integers little-endian; the rest of the page is zero:
//!
//! ```text
//! 0..8    magic "SPATEWAL"
//! 8..12   format version (1)
//! 12..20  the writing writer's epoch (the `-e<epoch>` of the name, 0 without)
//! 20..24  CRC32C of bytes 0..20
//! ```
//!
//! A whole page keeps records page-aligned as they were at offset 0, which
//! is what direct I/O's padding is computed for. A segment that does not
//! start with the magic was written before segments had a header: its
//! records start at offset 0.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::WalError;
use crate::record::PAGE;

/// Bytes of the header region: records of a segment with a header start here.
pub(crate) const SEGMENT_HEADER_LEN: u64 = PAGE;

const MAGIC: &[u8; 8] = b"SPATEWAL";

/// The segment format this build writes, and the newest it reads.
pub(crate) const SEGMENT_VERSION: u32 = 1;

/// Bytes of the header that carry fields (magic, version, epoch, CRC).
const FIELDS_LEN: usize = 24;

/// Where the records of a segment start, as its first bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordsStart {
    /// At this offset: after a checked header, or 0 for a legacy segment.
    At(u64),
    /// The segment starts with the magic but ends inside the header: its
    /// creation was cut short, so it holds no records.
    TornHeader,
}

/// The fields at the start of a segment header; zeros fill the rest of its page.
pub(crate) type SegmentHeader = [u8; FIELDS_LEN];

/// The header fields of a segment written by a writer of `epoch`.
pub(crate) fn encode_segment_header(epoch: u64) -> SegmentHeader {
    let mut fields = [0u8; FIELDS_LEN];
    fields[0..8].copy_from_slice(MAGIC);
    fields[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    fields[12..20].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&fields[0..20]);
    fields[20..24].copy_from_slice(&crc.to_le_bytes());
    fields
}

/// Reads and checks the header of the segment at `path` (named with
/// `epoch`) whose first `len` bytes are to be read, and says where its
/// records start. With `salvage`, a header whose checksum fails is
/// skipped with a warning rather than refused.
pub(crate) fn read_segment_header<R: Read + Seek>(
    source: &mut R,
    path: &Path,
    epoch: u64,
    len: u64,
    salvage: bool,
) -> Result<RecordsStart, WalError> {
    let mut bytes = [0u8; FIELDS_LEN];
    let wanted = usize::try_from(len).unwrap_or(FIELDS_LEN).min(FIELDS_LEN);
    let read = read_up_to(source, &mut bytes[..wanted]).map_err(WalError::io("read", path))?;
    if read < MAGIC.len() || &bytes[0..8] != MAGIC {
        return Ok(RecordsStart::At(0));
    }
    if len < SEGMENT_HEADER_LEN {
        return Ok(RecordsStart::TornHeader);
    }
    let bad = |reason: String| WalError::BadSegmentHeader { segment: path.to_path_buf(), reason };
    if read < FIELDS_LEN {
        return Err(bad(format!("the file ends inside its {SEGMENT_HEADER_LEN}-byte header")));
    }
    let field = |range: std::ops::Range<usize>| bytes.get(range).unwrap_or_default();
    let stored = u32::from_le_bytes(field(20..24).try_into().unwrap_or_default());
    let computed = crc32c::crc32c(field(0..20));
    if stored != computed {
        if salvage {
            tracing::warn!(segment = %path.display(), "salvage: the segment header is damaged; reading records after it");
            return Ok(RecordsStart::At(SEGMENT_HEADER_LEN));
        }
        return Err(bad(format!("header checksum mismatch: stored crc32c {stored:#010x}, computed {computed:#010x}")));
    }
    let version = u32::from_le_bytes(field(8..12).try_into().unwrap_or_default());
    if version > SEGMENT_VERSION {
        return Err(WalError::NewerSegmentVersion {
            segment: path.to_path_buf(),
            found: version,
            supported: SEGMENT_VERSION,
        });
    }
    if version == 0 {
        return Err(bad(String::from("format version 0 does not exist")));
    }
    let header_epoch = u64::from_le_bytes(field(12..20).try_into().unwrap_or_default());
    if header_epoch != epoch {
        return Err(bad(format!("the header says epoch {header_epoch} but the file name says epoch {epoch}")));
    }
    Ok(RecordsStart::At(SEGMENT_HEADER_LEN))
}

/// Reads from offset 0 until `buf` is full or the source ends; the bytes read.
fn read_up_to<R: Read + Seek>(source: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    source.seek(SeekFrom::Start(0))?;
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn check(bytes: &[u8], epoch: u64) -> Result<RecordsStart, WalError> {
        read_segment_header(&mut Cursor::new(bytes), Path::new("seg"), epoch, bytes.len() as u64, false)
    }

    /// The header page as the writer appends it.
    fn page(epoch: u64) -> Vec<u8> {
        let mut page = encode_segment_header(epoch).to_vec();
        page.resize(SEGMENT_HEADER_LEN as usize, 0);
        page
    }

    #[test]
    fn a_header_round_trips_and_records_start_after_it() {
        let page = page(7);
        assert_eq!(&page[0..8], b"SPATEWAL");
        assert_eq!(page[8..12], 1u32.to_le_bytes());
        assert_eq!(check(&page, 7).unwrap(), RecordsStart::At(SEGMENT_HEADER_LEN));
    }

    #[test]
    fn other_bytes_are_legacy_and_a_short_header_is_torn() {
        assert_eq!(check(b"", 0).unwrap(), RecordsStart::At(0));
        assert_eq!(check(b"SPATEW", 0).unwrap(), RecordsStart::At(0), "shorter than the magic: scanned as records");
        assert_eq!(check(&[0u8; 100], 0).unwrap(), RecordsStart::At(0));
        let page = page(0);
        for cut in [8, 23, 24, 4095] {
            assert_eq!(check(&page[..cut], 0).unwrap(), RecordsStart::TornHeader, "cut at {cut}");
        }
    }

    #[test]
    fn a_header_of_another_epoch_is_refused() {
        let err = check(&page(3), 4).unwrap_err();
        assert!(err.to_string().contains("epoch 3") && err.to_string().contains("epoch 4"), "{err}");
    }
}
