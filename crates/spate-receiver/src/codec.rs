//! How the records of a block are laid out: the [`Record`] trait.
//!
//! A block's payload is the bincode (standard configuration) encoding of
//! its records as a sequence: a varint count, then each record. Every
//! record type writes and reads that one layout, so a block reads back the
//! same whichever build wrote it. By default a type goes through serde; a
//! hot type writes the layout by hand, in one pass without serde's
//! per-record overhead (`String` here does), and the bytes are the same.
//! A type that also implements [`spate_core::InPlace`] (`String`,
//! `Vec<u8>`) can be written into a block and read back in place, as views,
//! without a record made per record.
//!
//! A type of a user's becomes a record with one line, `impl Record for
//! MyEvent {}`, when it derives `Serialize` and `Deserialize`.

use serde::Serialize;
use serde::de::DeserializeOwned;
use spate_core::{CoreError, FrameCodec, PayloadReader, varint_len, write_varint};

/// The format version of serialized blocks this build writes.
pub const BLOCK_FORMAT_VERSION: u16 = 1;

/// The codec of serialized blocks: blocks may be large (a block interval of
/// a fast source), but decoding is still bounded.
pub(crate) const fn block_codec() -> FrameCodec {
    FrameCodec::new(BLOCK_FORMAT_VERSION).with_max_payload(1 << 30).with_max_decoded(4 << 30)
}

/// What a record must be to travel through receivers, blocks and logs, and
/// how a block of them is written and read.
///
/// The provided methods go through serde; a type overrides both to write
/// the same bytes faster.
pub trait Record: Serialize + DeserializeOwned + Send + Sync + Clone + 'static {
    /// Appends the payload of a block of `records` to `out`: the bincode
    /// layout of the sequence. Returns the CRC32C of what it appended when
    /// it computed it on the way (`None`: the frame computes it).
    fn write_block_payload(records: &[Self], out: &mut Vec<u8>) -> Result<Option<u32>, CoreError> {
        bincode::serde::encode_into_std_write(records, out, bincode::config::standard())
            .map(|_| None)
            .map_err(|e| CoreError::Encode { reason: e.to_string() })
    }

    /// Reads the records of a block's payload, refusing damage and bounding
    /// what decoding may allocate.
    fn read_block_payload(payload: &[u8]) -> Result<Vec<Self>, CoreError> {
        block_codec().decode_payload::<Vec<Self>>(payload)
    }

    /// Appends this record's encoding alone: its part of a block's payload
    /// after the count (a block generator encodes records as they are
    /// stored, so their owned form is dropped at once).
    fn write_record(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        bincode::serde::encode_into_std_write(self, out, bincode::config::standard())
            .map(drop)
            .map_err(|e| CoreError::Encode { reason: e.to_string() })
    }

    /// The bytes this record holds on the heap, beyond its inline size,
    /// estimated: what a decoded block costs over its records' inline
    /// size. By default its encoded size stands in for it (Spark's
    /// `SizeEstimator` samples the same way); a type that knows its
    /// allocations counts them with the allocator's overhead
    /// ([`allocation_bytes`]), as `String` and `Vec<u8>` do.
    fn heap_bytes(&self) -> u64 {
        crate::block::encoded_record_size(self)
    }

    /// Reads the next `n` records off `reader`, at a record of a block's
    /// payload: a block read in chunks holds one chunk decoded at a time.
    /// Each record's allocations are bounded as a whole block's are.
    fn read_records(reader: &mut PayloadReader<'_>, n: usize) -> Result<Vec<Self>, CoreError> {
        let config = bincode::config::standard().with_limit::<{ 1 << 30 }>();
        let mut records = Vec::with_capacity(n.min(reader.rest().len()));
        for _ in 0..n {
            let (record, used) = bincode::serde::decode_from_slice::<Self, _>(reader.rest(), config)
                .map_err(|e| CoreError::Decode { reason: e.to_string() })?;
            reader.take(used as u64)?;
            records.push(record);
        }
        Ok(records)
    }
}

/// The memory an allocation of `requested` bytes takes, as glibc's malloc
/// lays it out: the request and an 8-byte header rounded up to 16 bytes,
/// 32 at least (none for an empty request). Allocators with size classes
/// (mimalloc, jemalloc) take no more for the small sizes records have, so
/// a count made with it is not below what a record really holds.
pub const fn allocation_bytes(requested: u64) -> u64 {
    if requested == 0 {
        return 0;
    }
    let chunk = (requested + 8).div_ceil(16) * 16;
    if chunk < 32 { 32 } else { chunk }
}

macro_rules! serde_records {
    ($($t:ty),* $(,)?) => { $(impl Record for $t {})* };
}

serde_records!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, bool, char, f32, f64);

impl<T: Record> Record for Option<T> {}
impl<A: Record, B: Record> Record for (A, B) {}
impl<A: Record, B: Record, C: Record> Record for (A, B, C) {}
impl<A: Record, B: Record, C: Record, D: Record> Record for (A, B, C, D) {}

impl Record for Vec<u8> {
    /// serde's layout of bytes: a varint length, then the bytes.
    fn write_record(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        write_varint(self.len() as u64, out);
        out.extend_from_slice(self);
        Ok(())
    }

    fn heap_bytes(&self) -> u64 {
        allocation_bytes(self.capacity() as u64)
    }

    fn read_records(reader: &mut PayloadReader<'_>, n: usize) -> Result<Vec<Self>, CoreError> {
        let mut records = Vec::with_capacity(n.min(reader.rest().len()));
        for _ in 0..n {
            let len = reader.varint()?;
            records.push(reader.take(len)?.to_vec());
        }
        Ok(records)
    }
}

impl Record for String {
    /// The layout serde gives a sequence of strings, written with one
    /// reservation for the whole block and one copy per string.
    fn write_block_payload(records: &[Self], out: &mut Vec<u8>) -> Result<Option<u32>, CoreError> {
        let bytes: usize = records.iter().map(|s| s.len() + varint_len(s.len() as u64)).sum();
        out.reserve(bytes + varint_len(records.len() as u64));
        write_varint(records.len() as u64, out);
        for record in records {
            write_varint(record.len() as u64, out);
            out.extend_from_slice(record.as_bytes());
        }
        Ok(None)
    }

    fn write_record(&self, out: &mut Vec<u8>) -> Result<(), CoreError> {
        write_varint(self.len() as u64, out);
        out.extend_from_slice(self.as_bytes());
        Ok(())
    }

    fn heap_bytes(&self) -> u64 {
        allocation_bytes(self.capacity() as u64)
    }

    fn read_records(reader: &mut PayloadReader<'_>, n: usize) -> Result<Vec<Self>, CoreError> {
        let mut records = Vec::with_capacity(n.min(reader.rest().len()));
        for index in 0..n {
            let len = reader.varint()?;
            let text = std::str::from_utf8(reader.take(len)?)
                .map_err(|e| CoreError::Decode { reason: format!("string {index} of a chunk is not UTF-8: {e}") })?;
            records.push(text.to_owned());
        }
        Ok(records)
    }

    fn read_block_payload(payload: &[u8]) -> Result<Vec<Self>, CoreError> {
        read_strings(payload, |index, bytes| {
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|e| CoreError::Decode { reason: format!("string {index} is not UTF-8: {e}") })
        })
    }
}

/// Reads a payload laid out as a sequence of strings, making each record
/// of its index and bytes.
fn read_strings<T>(
    payload: &[u8],
    mut make: impl FnMut(u64, &[u8]) -> Result<T, CoreError>,
) -> Result<Vec<T>, CoreError> {
    let mut reader = PayloadReader::new(payload);
    let count = reader.count()?;
    let mut records = Vec::with_capacity(count as usize);
    for index in 0..count {
        let len = reader.varint()?;
        records.push(make(index, reader.take(len)?)?);
    }
    reader.finish()?;
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_payload<T: Serialize>(records: &[T]) -> Vec<u8> {
        bincode::serde::encode_to_vec(records, bincode::config::standard()).unwrap()
    }

    fn hand_payload<T: Record>(records: &[T]) -> Vec<u8> {
        let mut out = Vec::new();
        let crc = T::write_block_payload(records, &mut out).unwrap();
        if let Some(crc) = crc {
            assert_eq!(crc, crc32c::crc32c(&out), "the checksum returned is the payload's");
        }
        out
    }

    #[test]
    fn strings_written_by_hand_are_serdes_bytes_and_read_back() {
        for n in [0usize, 1, 250, 251, 65_535, 65_536] {
            let words: Vec<String> = (0..n).map(|i| "wé".repeat(i % 140)).collect();
            let payload = hand_payload(&words);
            assert_eq!(payload, serde_payload(&words), "{n} strings");
            assert_eq!(String::read_block_payload(&payload).unwrap(), words);
        }
    }

    #[test]
    fn damaged_string_payloads_are_refused_naming_the_damage() {
        let mut payload = hand_payload(&["ab".to_string(), "c".to_string()]);
        payload.push(0);
        let trailing = String::read_block_payload(&payload).unwrap_err();
        assert!(trailing.to_string().contains("1 trailing bytes"), "{trailing}");
        let too_many = String::read_block_payload(&[200, 1, b'a']).unwrap_err();
        assert!(too_many.to_string().contains("declares 200 records"), "{too_many}");
        let not_utf8 = String::read_block_payload(&[1, 2, 0xff, 0xfe]).unwrap_err();
        assert!(not_utf8.to_string().contains("string 0 is not UTF-8"), "{not_utf8}");
        assert!(String::read_block_payload(&[1, 5, b'a']).is_err(), "a string past the payload's end");
    }

    #[test]
    fn a_type_of_a_users_is_a_record_through_serde() {
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Event {
            user: String,
            amount: u64,
        }
        impl Record for Event {}
        let events = vec![Event { user: "a".into(), amount: 3 }, Event { user: "b".into(), amount: 5 }];
        let payload = hand_payload(&events);
        assert_eq!(payload, serde_payload(&events));
        assert_eq!(Event::read_block_payload(&payload).unwrap(), events);
    }
}
