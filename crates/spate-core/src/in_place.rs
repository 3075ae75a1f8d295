//! Records read in place: borrowed views of the records of an encoded
//! sequence, instead of a decoded record, with its own allocation, per
//! record.
//!
//! A block of received records is stored encoded: bincode's standard
//! layout of a sequence, a varint count and then each record (a string is a
//! varint length and its bytes). A type that implements [`InPlace`] can be
//! read as a view borrowed from those bytes, `&str` for a `String` and
//! `&[u8]` for a `Vec<u8>`, so an operator that folds records into a few
//! results (a count per word) copies only what it keeps, not every record.
//! [`Views`] iterates the views of a payload, or of records already decoded,
//! the same way, so one function serves both.
//!
//! [`PayloadReader`] and [`write_varint`] are the layout's primitives, for
//! the codecs that write and read it by hand.

use std::cell::Cell;

use crate::CoreError;

/// A record type that can be read in place from its encoded form.
pub trait InPlace: Sized {
    /// What a record is read as: `str` for a `String`.
    type View: ?Sized;

    /// This record's view.
    fn view(&self) -> &Self::View;

    /// Reads the next record off `reader` as a view borrowed from its bytes.
    fn read_view<'a>(reader: &mut PayloadReader<'a>) -> Result<&'a Self::View, CoreError>;

    /// Appends the encoding of the record `view` is a view of: a source
    /// writes records into a block this way without making them first.
    fn write_view(view: &Self::View, out: &mut Vec<u8>);
}

impl InPlace for String {
    type View = str;

    fn view(&self) -> &str {
        self
    }

    fn read_view<'a>(reader: &mut PayloadReader<'a>) -> Result<&'a str, CoreError> {
        let len = reader.varint()?;
        let bytes = reader.take(len)?;
        std::str::from_utf8(bytes).map_err(|e| CoreError::Decode { reason: format!("a string is not UTF-8: {e}") })
    }

    fn write_view(view: &str, out: &mut Vec<u8>) {
        write_bytes(view.as_bytes(), out);
    }
}

impl InPlace for Vec<u8> {
    type View = [u8];

    fn view(&self) -> &[u8] {
        self
    }

    fn read_view<'a>(reader: &mut PayloadReader<'a>) -> Result<&'a [u8], CoreError> {
        let len = reader.varint()?;
        reader.take(len)
    }

    fn write_view(view: &[u8], out: &mut Vec<u8>) {
        write_bytes(view, out);
    }
}

/// A length-prefixed byte run, the layout of a string and of bytes.
fn write_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    write_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The views of one partition's records, in order: read off an encoded
/// payload, or taken of records already decoded.
///
/// Reading a payload stops at the first record that does not read (the
/// frame's checksum passed, so that is a payload of another layout, not
/// damage), and a payload read to its end must hold nothing after its
/// records; whoever made the iterator reports the error after it is done.
pub struct Views<'a, T: InPlace> {
    source: Source<'a, T>,
}

enum Source<'a, T> {
    Records(std::slice::Iter<'a, T>),
    Payload { reader: PayloadReader<'a>, left: u64, failure: &'a Cell<Option<CoreError>> },
}

impl<'a, T: InPlace> Views<'a, T> {
    /// The views of decoded `records`.
    pub fn of_records(records: &'a [T]) -> Self {
        Views { source: Source::Records(records.iter()) }
    }

    /// The views of the records of `payload` (a varint count, then the
    /// records). A record that does not read ends the iteration and is
    /// left in `failure`.
    pub fn of_payload(payload: &'a [u8], failure: &'a Cell<Option<CoreError>>) -> Result<Self, CoreError> {
        let mut reader = PayloadReader::new(payload);
        let left = reader.count()?;
        Ok(Views { source: Source::Payload { reader, left, failure } })
    }
}

impl<'a, T: InPlace> Iterator for Views<'a, T> {
    type Item = &'a T::View;

    fn next(&mut self) -> Option<&'a T::View> {
        match &mut self.source {
            Source::Records(records) => records.next().map(T::view),
            Source::Payload { reader, left, failure } => {
                if *left == 0 {
                    // Read to the end: bytes after the declared records
                    // mean the payload is not the sequence it claims.
                    if let Err(e) = reader.finish() {
                        *reader = PayloadReader::new(&[]);
                        failure.set(Some(e));
                    }
                    return None;
                }
                *left -= 1;
                match T::read_view(reader) {
                    Ok(view) => Some(view),
                    Err(e) => {
                        (*left, *reader) = (0, PayloadReader::new(&[]));
                        failure.set(Some(e));
                        None
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = match &self.source {
            Source::Records(records) => records.len(),
            Source::Payload { left, .. } => usize::try_from(*left).unwrap_or(usize::MAX),
        };
        (left, Some(left))
    }
}

/// The count is the records declared (or left); a payload whose record does
/// not read ends before it.
impl<T: InPlace> ExactSizeIterator for Views<'_, T> {}

/// Where a varint's fixed-size fields are read from: a payload in memory
/// or one read from a stream.
pub(crate) trait VarintSource {
    /// The next `N` bytes.
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CoreError>;

    /// The next bincode standard varint.
    fn read_varint(&mut self) -> Result<u64, CoreError> {
        let [tag] = self.fixed::<1>()?;
        match tag {
            0..=250 => Ok(u64::from(tag)),
            251 => Ok(u64::from(u16::from_le_bytes(self.fixed()?))),
            252 => Ok(u64::from(u32::from_le_bytes(self.fixed()?))),
            253 => Ok(u64::from_le_bytes(self.fixed()?)),
            _ => Err(CoreError::Decode { reason: format!("invalid varint tag {tag}") }),
        }
    }
}

impl VarintSource for PayloadReader<'_> {
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CoreError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }
}

/// Reads bincode's standard varints and byte runs off a payload.
#[derive(Clone, Copy, Debug)]
pub struct PayloadReader<'a> {
    rest: &'a [u8],
}

impl<'a> PayloadReader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        PayloadReader { rest: bytes }
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// The next `len` bytes.
    pub fn take(&mut self, len: u64) -> Result<&'a [u8], CoreError> {
        let truncated = || CoreError::Truncated { needed: len, available: self.rest.len() as u64 };
        let (taken, rest) =
            usize::try_from(len).ok().and_then(|n| self.rest.split_at_checked(n)).ok_or_else(truncated)?;
        self.rest = rest;
        Ok(taken)
    }

    /// The next varint.
    pub fn varint(&mut self) -> Result<u64, CoreError> {
        self.read_varint()
    }

    /// A sequence's count, refused when larger than the bytes left could
    /// hold (every record takes at least a byte): damage, not a size to
    /// allocate.
    pub fn count(&mut self) -> Result<u64, CoreError> {
        let count = self.varint()?;
        let available = self.rest.len();
        if usize::try_from(count).is_ok_and(|n| n <= available) {
            Ok(count)
        } else {
            Err(CoreError::Decode { reason: format!("a sequence declares {count} records in {available} bytes") })
        }
    }

    /// Checks that everything was read.
    pub fn finish(&self) -> Result<(), CoreError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(CoreError::Decode { reason: format!("{n} trailing bytes after the value") }),
        }
    }
}

/// The bytes of bincode's standard varint of `value`.
pub const fn varint_len(value: u64) -> usize {
    match value {
        0..=250 => 1,
        251..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

/// Appends bincode's standard varint of `value`.
pub fn write_varint(value: u64, out: &mut Vec<u8>) {
    match value {
        0..=250 => out.push(value as u8),
        251..=0xffff => {
            out.push(251);
            out.extend_from_slice(&(value as u16).to_le_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(252);
            out.extend_from_slice(&(value as u32).to_le_bytes());
        }
        _ => {
            out.push(253);
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload<T: serde::Serialize>(records: &[T]) -> Vec<u8> {
        bincode::serde::encode_to_vec(records, bincode::config::standard()).unwrap()
    }

    #[test]
    fn views_of_a_payload_are_the_views_of_its_decoded_records() {
        for n in [0usize, 1, 251, 70_000] {
            let words: Vec<String> = (0..n).map(|i| "wé".repeat(i % 150)).collect();
            let bytes = payload(&words);
            let mut written = Vec::new();
            write_varint(n as u64, &mut written);
            words.iter().for_each(|word| String::write_view(word, &mut written));
            assert_eq!(written, bytes, "{n} words written as views");
            let failure = Cell::new(None);
            let read: Vec<&str> = Views::<String>::of_payload(&bytes, &failure).unwrap().collect();
            assert!(failure.take().is_none());
            let of_records: Vec<&str> = Views::of_records(&words).collect();
            assert_eq!(read, of_records, "{n} words");
            assert_eq!(Views::<String>::of_payload(&bytes, &failure).unwrap().len(), n);
        }
        let blobs = vec![vec![1u8, 2], vec![], vec![255; 300]];
        let bytes = payload(&blobs);
        let mut written = Vec::new();
        write_varint(blobs.len() as u64, &mut written);
        blobs.iter().for_each(|blob| Vec::<u8>::write_view(blob, &mut written));
        assert_eq!(written, bytes, "views are written in the layout they are read from");
        let failure = Cell::new(None);
        let read: Vec<&[u8]> = Views::<Vec<u8>>::of_payload(&bytes, &failure).unwrap().collect();
        assert_eq!(read, blobs.iter().map(Vec::as_slice).collect::<Vec<_>>());
    }

    #[test]
    fn a_record_that_does_not_read_ends_the_views_and_is_reported() {
        let mut bytes = payload(&["ok".to_string(), "no".to_string(), "later".to_string()]);
        bytes[5] = 0xff; // the second string's first byte: not UTF-8
        let failure = Cell::new(None);
        let read: Vec<&str> = Views::<String>::of_payload(&bytes, &failure).unwrap().collect();
        assert_eq!(read, ["ok"]);
        assert!(failure.take().unwrap().to_string().contains("not UTF-8"));
        let truncated = payload(&["abc".to_string()]);
        let read: Vec<&str> = Views::<String>::of_payload(&truncated[..3], &failure).unwrap().collect();
        assert!(read.is_empty());
        assert!(matches!(failure.take(), Some(CoreError::Truncated { .. })));
        let err = Views::<String>::of_payload(&[200, 1], &failure).err().unwrap();
        assert!(err.to_string().contains("declares 200 records"), "{err}");
    }

    #[test]
    fn bytes_after_the_records_are_reported_once_the_views_are_read_to_the_end() {
        let mut bytes = payload(&["ok".to_string()]);
        bytes.push(7);
        let failure = Cell::new(None);
        let mut views = Views::<String>::of_payload(&bytes, &failure).unwrap();
        assert_eq!(views.next(), Some("ok"));
        assert!(failure.take().is_none(), "nothing is wrong with what was read so far");
        assert_eq!(views.next(), None);
        assert!(failure.take().unwrap().to_string().contains("1 trailing bytes"));
        assert_eq!(views.next(), None);
        assert!(failure.take().is_none(), "reported once");
    }

    #[test]
    fn varints_written_are_bincodes() {
        for value in [0u64, 250, 251, 0xffff, 0x1_0000, 0xffff_ffff, 0x1_0000_0000, u64::MAX] {
            let mut by_hand = Vec::new();
            write_varint(value, &mut by_hand);
            assert_eq!(by_hand, payload(&[value])[1..], "{value}");
            assert_eq!(by_hand.len(), varint_len(value), "{value}");
            let mut reader = PayloadReader::new(&by_hand);
            assert_eq!(reader.varint().unwrap(), value);
            reader.finish().unwrap();
        }
    }
}
