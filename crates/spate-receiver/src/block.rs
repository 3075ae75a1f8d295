//! Blocks of received records and their one serialized form.
//!
//! A serialized block is a spate frame (magic, version, length, CRC32C)
//! whose payload is the bincode encoding of the records as a sequence. The
//! same bytes go to the block manager, to its disk store and to the receiver
//! write-ahead log, so a block is serialized once, in one pass.

use std::sync::Arc;

use serde::Serialize;
use spate_core::{CoreError, PayloadReader, write_varint};

use crate::codec::{BLOCK_FORMAT_VERSION, Record, block_codec};

/// Serializes `records` as one block, in one pass (the records' own
/// [`Record::write_block_payload`]).
pub fn encode_block<T: Record>(records: &[T]) -> Result<Vec<u8>, CoreError> {
    let mut out = Vec::with_capacity(64 + records.len() * 12);
    block_codec().encode_framed(&mut out, |payload| T::write_block_payload(records, payload))?;
    Ok(out)
}

/// Serializes a block of `count` records already encoded one after the
/// other in `encoded` (each in the records' layout, as
/// [`InPlace::write_view`](spate_core::InPlace::write_view) writes them).
pub(crate) fn frame_encoded_records(count: u64, encoded: &[u8]) -> Result<Vec<u8>, CoreError> {
    let mut out = Vec::with_capacity(64 + encoded.len());
    block_codec().encode_framed(&mut out, |payload| {
        write_varint(count, payload);
        payload.extend_from_slice(encoded);
        Ok(None)
    })?;
    Ok(out)
}

/// Reads the records of a serialized block: a pure function of the bytes,
/// for every reader of blocks and for fuzzing.
///
/// Checks the frame (magic, checksum, flags, payload bound, no bytes after
/// it), picks the decoder by the frame's format version (only 1 so far; a
/// newer or unknown one is an error naming it), and bounds what decoding
/// may allocate.
pub fn decode_block<T: Record>(bytes: &[u8]) -> Result<Vec<T>, CoreError> {
    T::read_block_payload(open_block(bytes)?)
}

/// Reads the records of a serialized block in consecutive chunks of at most
/// `chunk` records, handing each chunk to `each` as soon as it is decoded:
/// a reader that folds records into a few results holds one chunk
/// decoded at a time, not the whole block. Checks what [`decode_block`]
/// checks; an error after some chunks were handed over says the block is
/// damaged, and what was made of those chunks should be dropped.
pub fn decode_block_in_chunks<T: Record>(
    bytes: &[u8],
    chunk: usize,
    mut each: impl FnMut(Vec<T>),
) -> Result<(), CoreError> {
    let mut reader = PayloadReader::new(open_block(bytes)?);
    let mut left = reader.count()?;
    let chunk = chunk.max(1) as u64;
    while left > 0 {
        let n = left.min(chunk);
        each(T::read_records(&mut reader, n as usize)?);
        left -= n;
    }
    reader.finish()
}

/// Checks a serialized block's frame and returns the payload of its format
/// version, the only one so far: the bincode (standard configuration)
/// encoding of the records as a sequence, which
/// [`Views::of_payload`](spate_core::Views::of_payload) reads in place.
pub fn block_payload(bytes: &[u8]) -> Result<&[u8], CoreError> {
    open_block(bytes)
}

fn open_block(bytes: &[u8]) -> Result<&[u8], CoreError> {
    let raw = block_codec().open(bytes)?;
    if raw.frame_len != bytes.len() {
        let trailing = bytes.len() - raw.frame_len;
        return Err(CoreError::Decode { reason: format!("{trailing} bytes after the block's frame") });
    }
    match raw.version {
        1 => Ok(raw.payload),
        found => Err(CoreError::Decode {
            reason: format!("block format {found} is unknown (this build reads formats 1 to {BLOCK_FORMAT_VERSION})"),
        }),
    }
}

/// The number of records in a serialized block, from its checked header
/// and the sequence length, without decoding the records.
pub fn count_block_records(bytes: &[u8]) -> Result<u64, CoreError> {
    let payload = open_block(bytes)?;
    let truncated = |needed: usize| CoreError::Truncated { needed: needed as u64, available: payload.len() as u64 };
    // bincode's standard configuration writes the length as a varint.
    let (&tag, rest) = payload.split_first().ok_or(truncated(1))?;
    let wide = |n: usize| rest.get(..n).ok_or(truncated(n + 1));
    match tag {
        0..=250 => Ok(u64::from(tag)),
        251 => Ok(u64::from(u16::from_le_bytes(wide(2)?.try_into().map_err(|_| truncated(3))?))),
        252 => Ok(u64::from(u32::from_le_bytes(wide(4)?.try_into().map_err(|_| truncated(5))?))),
        253 => Ok(u64::from_le_bytes(wide(8)?.try_into().map_err(|_| truncated(9))?)),
        _ => Err(CoreError::Decode { reason: format!("block does not start with a record count (tag {tag})") }),
    }
}

/// A block as a receiver hands it over: records, or bytes already in the
/// serialized block format (for example read back from a log).
#[derive(Clone, Debug, PartialEq)]
pub enum ReceivedBlock<T> {
    /// Records as they are.
    Records(Vec<T>),
    /// A block in the format of [`encode_block`].
    Serialized(Vec<u8>),
}

/// A block as the block manager keeps it in memory; cloning is cheap.
#[derive(Debug)]
pub enum BlockData<T> {
    /// Records, kept as they are.
    Records(Arc<Vec<T>>),
    /// A serialized block ([`encode_block`]).
    Bytes(Arc<Vec<u8>>),
}

impl<T> Clone for BlockData<T> {
    fn clone(&self) -> Self {
        match self {
            BlockData::Records(r) => BlockData::Records(Arc::clone(r)),
            BlockData::Bytes(b) => BlockData::Bytes(Arc::clone(b)),
        }
    }
}

impl<T: Record> BlockData<T> {
    /// The records, decoding bytes when the block is serialized.
    pub fn records(&self) -> Result<Arc<Vec<T>>, CoreError> {
        match self {
            BlockData::Records(r) => Ok(Arc::clone(r)),
            BlockData::Bytes(b) => Ok(Arc::new(decode_block(b)?)),
        }
    }

    /// The serialized block, encoding records when needed.
    pub fn bytes(&self) -> Result<Arc<Vec<u8>>, CoreError> {
        match self {
            BlockData::Records(r) => Ok(Arc::new(encode_block(r)?)),
            BlockData::Bytes(b) => Ok(Arc::clone(b)),
        }
    }

    /// What keeping this block in memory costs, estimated.
    pub(crate) fn estimated_size(&self) -> u64 {
        match self {
            BlockData::Records(r) => estimate_records_size(r),
            BlockData::Bytes(b) => b.len() as u64,
        }
    }
}

/// The serialized size of one record in a block (0 for a record that does
/// not encode: encoding its block reports that properly).
pub(crate) fn encoded_record_size<T: Serialize>(record: &T) -> u64 {
    let mut counter = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(record, &mut counter, bincode::config::standard()) {
        Ok(()) => counter.bytes_written as u64,
        Err(_) => 0,
    }
}

/// Estimates the serialized size of `records` in a block from a few
/// evenly spaced samples, so that the cost does not grow with the count.
pub(crate) fn estimate_encoded_size<T: Serialize>(records: &[T]) -> u64 {
    const SAMPLES: usize = 8;
    let n = records.len();
    if n <= SAMPLES {
        return records.iter().map(encoded_record_size).sum();
    }
    let step = n.div_ceil(SAMPLES);
    let (sampled, bytes) = records
        .iter()
        .step_by(step)
        .fold((0u64, 0u64), |(count, bytes), r| (count + 1, bytes + encoded_record_size(r)));
    (bytes * n as u64).div_ceil(sampled.max(1))
}

/// Estimates the memory `records` take: their inline size plus what a few
/// sampled records hold on the heap ([`Record::heap_bytes`], with the
/// allocator's overhead where the type counts it), scaled to the count
/// (Spark samples the same way in its `SizeEstimator`).
pub(crate) fn estimate_records_size<T: Record>(records: &[T]) -> u64 {
    const SAMPLES: usize = 8;
    let n = records.len();
    if n == 0 {
        return 0;
    }
    let step = n.div_ceil(SAMPLES).max(1);
    let (sampled, heap) =
        records.iter().step_by(step).fold((0u64, 0u64), |(count, heap), r| (count + 1, heap + r.heap_bytes()));
    let inline = std::mem::size_of::<T>() as u64;
    n as u64 * inline + (heap * n as u64).div_ceil(sampled.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::FrameCodec;

    #[test]
    fn round_trip_and_count() {
        for n in [0usize, 1, 250, 251, 70_000] {
            let records: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
            let bytes = encode_block(&records).unwrap();
            assert_eq!(count_block_records(&bytes).unwrap(), n as u64);
            assert_eq!(decode_block::<String>(&bytes).unwrap(), records);
        }
    }

    #[test]
    fn a_block_read_in_chunks_is_the_block_decoded_whole() {
        let words: Vec<String> = (0..1000).map(|i| "wé".repeat(i % 7)).collect();
        let bytes = encode_block(&words).unwrap();
        for chunk in [1usize, 7, 999, 1000, 5000] {
            let mut chunks = Vec::new();
            decode_block_in_chunks::<String>(&bytes, chunk, |records| chunks.push(records)).unwrap();
            assert_eq!(chunks.len(), 1000usize.div_ceil(chunk), "chunks of {chunk}");
            assert!(chunks.iter().all(|c| c.len() <= chunk));
            assert_eq!(chunks.concat(), words, "chunks of {chunk}");
        }
        let pairs: Vec<(String, u64)> = (0..300).map(|i| (format!("k{i}"), i)).collect();
        let mut read = Vec::new();
        decode_block_in_chunks::<(String, u64)>(&encode_block(&pairs).unwrap(), 64, |c| read.extend(c)).unwrap();
        assert_eq!(read, pairs, "a type through serde reads record by record the same");
        let mut damaged = bytes.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 0x40;
        assert!(decode_block_in_chunks::<String>(&damaged, 10, |_| {}).is_err());
    }

    #[test]
    fn damaged_block_is_an_error() {
        let mut bytes = encode_block(&["a".to_string(), "b".to_string()]).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        assert!(decode_block::<String>(&bytes).is_err());
        assert!(count_block_records(&bytes).is_err());
        assert!(decode_block::<String>(&bytes[..5]).is_err());
    }

    #[test]
    fn the_counted_size_of_string_records_is_at_least_what_they_hold() {
        // Each string holds its inline 24 bytes and an allocation of its
        // capacity, which malloc rounds up and heads: never less than the
        // capacity plus 8, and 32 bytes at the least.
        for len in [0usize, 1, 5, 15, 24, 25, 100, 1000] {
            let records: Vec<String> = (0..1000).map(|_| "x".repeat(len)).collect();
            let held: u64 = records
                .iter()
                .map(|s| {
                    let heap = if s.capacity() == 0 { 0 } else { (s.capacity() as u64 + 8).max(32) };
                    std::mem::size_of::<String>() as u64 + heap
                })
                .sum();
            let counted = estimate_records_size(&records);
            assert!(counted >= held, "{len}-byte strings: counted {counted} < held {held}");
            // Not wildly more either: within a malloc rounding (16 B) a record.
            assert!(counted <= held + 16 * 1000, "{len}-byte strings: counted {counted}, held {held}");
        }
        let words: Vec<String> = (0..10_000).map(|i| format!("w{i}")).collect();
        assert_eq!(estimate_records_size(&words), 10_000 * (24 + 32), "a short word costs 24 + 32 bytes");
    }

    #[test]
    fn size_estimate_grows_with_content() {
        let short: Vec<String> = vec!["a".into(); 100];
        let long: Vec<String> = vec!["a".repeat(1000); 100];
        assert!(estimate_records_size(&long) > estimate_records_size(&short) + 90_000);
        assert_eq!(estimate_records_size::<String>(&[]), 0);
    }

    #[test]
    fn a_block_of_a_format_no_spate_wrote_is_refused_naming_it() {
        // Today's layout under version 0: the version decides, not the shape.
        let words = vec!["a".to_string(), "b".to_string()];
        let zero = FrameCodec::new(0).encode(&words).unwrap();
        let err = decode_block::<String>(&zero).unwrap_err();
        assert!(err.to_string().contains("block format 0 is unknown"), "{err}");
        assert!(block_payload(&zero).is_err());
        assert!(count_block_records(&zero).is_err());
        let newer = FrameCodec::new(BLOCK_FORMAT_VERSION + 1).encode(&words).unwrap();
        assert!(matches!(decode_block::<String>(&newer), Err(CoreError::NewerVersion { found: 2, .. })));
    }

    #[test]
    fn bytes_after_a_blocks_frame_are_refused() {
        let mut bytes = encode_block(&["a".to_string()]).unwrap();
        bytes.push(0);
        assert!(decode_block::<String>(&bytes).is_err());
        assert!(block_payload(&bytes).is_err());
        assert!(count_block_records(&bytes).is_err());
    }
}
