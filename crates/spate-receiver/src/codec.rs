//! How the records of a block are laid out: the [`Record`] trait.
//!
//! A block's payload is the bincode (standard configuration) encoding of
//! its records as a sequence: a varint count, then each record. Every
//! record type writes and reads that one layout, so a block reads back the
//! same whichever build wrote it. By default a type goes through serde; a
//! hot type writes the layout by hand, in one pass without serde's
//! per-record overhead (`String` and [`SmallWord`] here do), and the bytes
//! are the same.
//!
//! A type of a user's becomes a record with one line, `impl Record for
//! MyEvent {}`, when it derives `Serialize` and `Deserialize`.

use serde::Serialize;
use serde::de::DeserializeOwned;
use spate_core::{CoreError, FrameCodec};

use crate::generator::SmallWord;

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
}

macro_rules! serde_records {
    ($($t:ty),* $(,)?) => { $(impl Record for $t {})* };
}

serde_records!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, bool, char, f32, f64, Vec<u8>);

impl<T: Record> Record for Option<T> {}
impl<A: Record, B: Record> Record for (A, B) {}
impl<A: Record, B: Record, C: Record> Record for (A, B, C) {}
impl<A: Record, B: Record, C: Record, D: Record> Record for (A, B, C, D) {}

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

    fn read_block_payload(payload: &[u8]) -> Result<Vec<Self>, CoreError> {
        read_strings(payload, |index, bytes| {
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|e| CoreError::Decode { reason: format!("string {index} is not UTF-8: {e}") })
        })
    }
}

impl Record for SmallWord {
    /// The layout serde gives a sequence of strings, gathered in a stack
    /// buffer a few thousand bytes at a time: written straight into `out`,
    /// every byte store could alias its length, which the compiler would then
    /// reload per word. The checksum is taken chunk by chunk, in cache.
    fn write_block_payload(records: &[Self], out: &mut Vec<u8>) -> Result<Option<u32>, CoreError> {
        const CHUNK: usize = 4096;
        let mut chunk = [0u8; CHUNK];
        let mut used = 0;
        let payload_start = out.len();
        write_varint(records.len() as u64, out);
        let mut crc = crc32c::crc32c(&out[payload_start..]);
        for word in records {
            let (cell, len) = word.encoded_cell();
            if used + cell.len() > CHUNK {
                crc = crc32c::crc32c_append(crc, &chunk[..used]);
                out.extend_from_slice(&chunk[..used]);
                used = 0;
            }
            // The whole cell is copied (a fixed size); only `len` bytes count.
            chunk[used..used + cell.len()].copy_from_slice(&cell);
            used += len;
        }
        crc = crc32c::crc32c_append(crc, &chunk[..used]);
        out.extend_from_slice(&chunk[..used]);
        Ok(Some(crc))
    }

    fn read_block_payload(payload: &[u8]) -> Result<Vec<Self>, CoreError> {
        let mut reader = VarintReader { rest: payload };
        let count = checked_count(&mut reader, payload.len())?;
        let mut words = Vec::with_capacity(count);
        for index in 0..count {
            let len = reader.varint()?;
            // A whole window when the payload has one: a fixed-size copy stays in
            // registers, where a copy of the word's own length goes through memory.
            let window = reader.rest.first_chunk::<{ SmallWord::CAPACITY }>().copied();
            let word = reader.take(len)?;
            let parsed = match window {
                Some(window) => SmallWord::from_utf8_window(&window, word.len()),
                None => SmallWord::from_utf8_bytes(word),
            };
            words.push(parsed.ok_or_else(|| CoreError::Decode {
                reason: format!("word {index} is not UTF-8 of at most {} bytes (length {len})", SmallWord::CAPACITY),
            })?);
        }
        reader.finish()?;
        Ok(words)
    }
}

/// Reads a payload laid out as a sequence of strings, making each record
/// of its index and bytes.
fn read_strings<T>(
    payload: &[u8],
    mut make: impl FnMut(u64, &[u8]) -> Result<T, CoreError>,
) -> Result<Vec<T>, CoreError> {
    let mut reader = VarintReader { rest: payload };
    let count = checked_count(&mut reader, payload.len())?;
    let mut records = Vec::with_capacity(count);
    for index in 0..count as u64 {
        let len = reader.varint()?;
        records.push(make(index, reader.take(len)?)?);
    }
    reader.finish()?;
    Ok(records)
}

/// The sequence's count, refused when larger than the payload could hold
/// (every string takes at least a byte): damage, not a size to allocate.
fn checked_count(reader: &mut VarintReader<'_>, payload_len: usize) -> Result<usize, CoreError> {
    let count = reader.varint()?;
    usize::try_from(count)
        .ok()
        .filter(|n| *n <= payload_len)
        .ok_or_else(|| CoreError::Decode { reason: format!("block declares {count} strings in {payload_len} bytes") })
}

/// The bytes of bincode's standard varint of `value`.
const fn varint_len(value: u64) -> usize {
    match value {
        0..=250 => 1,
        251..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    }
}

/// Appends bincode's standard varint of `value`.
pub(crate) fn write_varint(value: u64, out: &mut Vec<u8>) {
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

/// Reads bincode's standard varints and byte runs off a payload.
pub(crate) struct VarintReader<'a> {
    pub(crate) rest: &'a [u8],
}

impl<'a> VarintReader<'a> {
    fn take(&mut self, len: u64) -> Result<&'a [u8], CoreError> {
        let truncated = || CoreError::Truncated { needed: len, available: self.rest.len() as u64 };
        let (taken, rest) =
            usize::try_from(len).ok().and_then(|n| self.rest.split_at_checked(n)).ok_or_else(truncated)?;
        self.rest = rest;
        Ok(taken)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CoreError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, CoreError> {
        let [tag] = self.fixed::<1>()?;
        match tag {
            0..=250 => Ok(u64::from(tag)),
            251 => Ok(u64::from(u16::from_le_bytes(self.fixed()?))),
            252 => Ok(u64::from(u32::from_le_bytes(self.fixed()?))),
            253 => Ok(u64::from_le_bytes(self.fixed()?)),
            _ => Err(CoreError::Decode { reason: format!("invalid varint tag {tag}") }),
        }
    }

    fn finish(&self) -> Result<(), CoreError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(CoreError::Decode { reason: format!("{n} trailing bytes after the value") }),
        }
    }
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
    fn small_words_written_by_hand_are_serdes_string_bytes() {
        for n in [0usize, 1, 250, 251, 65_535, 65_536] {
            let words: Vec<String> = (0..n).map(|i| "w".repeat(i % 24)).collect();
            let small: Vec<SmallWord> = words.iter().map(|w| SmallWord::new(w).unwrap()).collect();
            let payload = hand_payload(&small);
            assert_eq!(payload, serde_payload(&words), "{n} words");
            assert_eq!(SmallWord::read_block_payload(&payload).unwrap(), small);
            assert_eq!(String::read_block_payload(&payload).unwrap(), words);
        }
    }

    #[test]
    fn varints_written_by_hand_equal_bincodes() {
        for value in [0u64, 250, 251, 0xffff, 0x1_0000, 0xffff_ffff, 0x1_0000_0000, u64::MAX] {
            let mut by_hand = Vec::new();
            write_varint(value, &mut by_hand);
            assert_eq!(by_hand, serde_payload(&[value])[1..], "{value}");
            assert_eq!(by_hand.len(), varint_len(value), "{value}");
        }
    }

    #[test]
    fn damaged_string_payloads_are_refused_naming_the_damage() {
        let mut payload = hand_payload(&["ab".to_string(), "c".to_string()]);
        payload.push(0);
        let trailing = String::read_block_payload(&payload).unwrap_err();
        assert!(trailing.to_string().contains("1 trailing bytes"), "{trailing}");
        let too_many = String::read_block_payload(&[200, 1, b'a']).unwrap_err();
        assert!(too_many.to_string().contains("declares 200 strings"), "{too_many}");
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
