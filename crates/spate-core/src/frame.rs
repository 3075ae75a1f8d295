//! The versioned, CRC-checked binary frame around every binary record spate
//! writes (tracker events, operator state, block payloads).
//!
//! Layout, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `SPTF` |
//! | 2 | format version of the payload |
//! | 2 | flags (zero; reserved: a frame with any flag set is refused) |
//! | 4 | payload length |
//! | 4 | CRC32C of version, flags, length and payload |
//! | n | payload: bincode 2, standard configuration |
//!
//! The version lets a newer spate read what an older one wrote and lets an
//! older one refuse, clearly, what a newer one wrote. The decoder checks the
//! length against a bound *before* it allocates, and bounds what bincode may
//! allocate while decoding, so no input can make it allocate without limit.

use std::io::{Seek, SeekFrom, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crc::crc32c_combine;
use crate::error::CoreError;

/// The four bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 4] = *b"SPTF";
/// Bytes of the header before the payload.
pub const FRAME_HEADER_LEN: usize = 16;

/// A decoded frame: the value and what the header said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<T> {
    /// The payload's format version as written.
    pub version: u16,
    /// The decoded value.
    pub value: T,
    /// Bytes the whole frame took (header and payload).
    pub frame_len: usize,
}

/// A checked frame whose payload is not decoded yet, for callers that pick
/// the payload type by version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame<'a> {
    /// The payload's format version as written.
    pub version: u16,
    /// The payload bytes (checksum verified).
    pub payload: &'a [u8],
    /// Bytes the whole frame took (header and payload).
    pub frame_len: usize,
}

/// Encodes and decodes frames of one record kind.
///
/// `current_version` is what this build writes and the newest it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameCodec {
    current_version: u16,
    max_payload_bytes: u32,
    max_decoded_bytes: usize,
}

impl FrameCodec {
    /// Default largest payload: 64 MiB.
    pub const DEFAULT_MAX_PAYLOAD: u32 = 64 << 20;
    /// Default bound on what decoding one payload may allocate: 256 MiB.
    pub const DEFAULT_MAX_DECODED: usize = 256 << 20;

    /// A codec that writes `current_version` and reads any version up to it.
    pub const fn new(current_version: u16) -> Self {
        FrameCodec {
            current_version,
            max_payload_bytes: Self::DEFAULT_MAX_PAYLOAD,
            max_decoded_bytes: Self::DEFAULT_MAX_DECODED,
        }
    }

    /// Refuses payloads longer than `bytes`, before reading them.
    pub const fn with_max_payload(mut self, bytes: u32) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Bounds what decoding one payload may allocate. The bound is enforced
    /// at the next power of two at or above `bytes` (bincode's limit is a
    /// compile-time constant, so the codec picks from a ladder of them).
    pub const fn with_max_decoded(mut self, bytes: usize) -> Self {
        self.max_decoded_bytes = bytes;
        self
    }

    /// The version this codec writes.
    pub const fn current_version(&self) -> u16 {
        self.current_version
    }

    /// Encodes `value` as one frame.
    pub fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, CoreError> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(value, &mut out)?;
        Ok(out)
    }

    /// Appends one frame holding `value` to `out`. On error `out` is unchanged.
    pub fn encode_into<T: Serialize + ?Sized>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), CoreError> {
        self.encode_with(out, |out| {
            bincode::serde::encode_into_std_write(value, out, bincode_config())
                .map(drop)
                .map_err(|e| CoreError::Encode { reason: e.to_string() })
        })
    }

    /// Appends one frame whose payload `write_payload` appends to `out`, for
    /// a caller with a faster writer of the bincode layout [`Self::decode`]
    /// reads (a hot record type written by hand). On error `out` is unchanged.
    pub fn encode_with(
        &self,
        out: &mut Vec<u8>,
        write_payload: impl FnOnce(&mut Vec<u8>) -> Result<(), CoreError>,
    ) -> Result<(), CoreError> {
        self.encode_framed(out, |out| write_payload(out).map(|()| None))
    }

    /// [`Self::encode_with`] for a writer that also returns the CRC32C of
    /// the payload it appended, computed as it went while the bytes were in
    /// cache: the codec then combines it into the frame's checksum instead
    /// of reading the payload once more. (Checked in debug builds; a wrong
    /// value makes the frame fail its check when read.)
    pub fn encode_with_crc(
        &self,
        out: &mut Vec<u8>,
        write_payload: impl FnOnce(&mut Vec<u8>) -> Result<u32, CoreError>,
    ) -> Result<(), CoreError> {
        self.encode_framed(out, |out| write_payload(out).map(Some))
    }

    /// [`Self::encode_with`] for a writer that may return the CRC32C of the
    /// payload it appended (`Some`, as [`Self::encode_with_crc`] takes it) or
    /// leave it to the codec (`None`): for callers generic over writers of
    /// both kinds.
    pub fn encode_framed(
        &self,
        out: &mut Vec<u8>,
        write_payload: impl FnOnce(&mut Vec<u8>) -> Result<Option<u32>, CoreError>,
    ) -> Result<(), CoreError> {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
        let payload_crc = match write_payload(out) {
            Ok(crc) => crc,
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        };
        let payload_len = out.len() - start - FRAME_HEADER_LEN;
        let Some(len) = u32::try_from(payload_len).ok().filter(|n| *n <= self.max_payload_bytes) else {
            out.truncate(start);
            return Err(CoreError::TooLarge { declared: payload_len as u64, limit: u64::from(self.max_payload_bytes) });
        };
        let header = &mut out[start..start + FRAME_HEADER_LEN];
        header[0..4].copy_from_slice(&FRAME_MAGIC);
        header[4..6].copy_from_slice(&self.current_version.to_le_bytes());
        header[6..8].copy_from_slice(&0u16.to_le_bytes());
        header[8..12].copy_from_slice(&len.to_le_bytes());
        let header_crc = crc32c::crc32c(&out[start + 4..start + 12]);
        let payload = &out[start + FRAME_HEADER_LEN..];
        let crc = match payload_crc {
            Some(payload_crc) => {
                debug_assert_eq!(payload_crc, crc32c::crc32c(payload), "a payload writer's CRC32C is wrong");
                crc32c_combine(header_crc, payload_crc, payload_len as u64)
            }
            None => crc32c::crc32c_append(header_crc, payload),
        };
        out[start + 12..start + 16].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Writes one frame to `out`, its payload appended by `write_payload`
    /// to `chunks`, which pass each full chunk on to `out` as it fills, so
    /// a payload larger than memory can hold twice (a large operator
    /// state) is never in memory whole. The header, whose length and
    /// checksum are known only at the end, is written last, seeking back
    /// to where the frame starts. Returns the bytes the frame took. On error
    /// `out` holds a partial frame: write to something the caller discards
    /// then (a temp file).
    pub fn encode_streamed<W: SeekWrite + ?Sized>(
        &self,
        out: &mut W,
        write_payload: impl FnOnce(&mut PayloadChunks<'_, W>) -> Result<(), CoreError>,
    ) -> Result<u64, CoreError> {
        let start = out.stream_position().map_err(write_error)?;
        out.write_all(&[0u8; FRAME_HEADER_LEN]).map_err(write_error)?;
        let mut chunks = PayloadChunks { chunk: Vec::with_capacity(PAYLOAD_CHUNK), out, crc: 0, len: 0 };
        write_payload(&mut chunks)?;
        chunks.pass_on()?;
        let PayloadChunks { out, crc: payload_crc, len: payload_len, .. } = chunks;
        let Some(len) = u32::try_from(payload_len).ok().filter(|n| *n <= self.max_payload_bytes) else {
            return Err(CoreError::TooLarge { declared: payload_len, limit: u64::from(self.max_payload_bytes) });
        };
        let mut header = [0u8; FRAME_HEADER_LEN];
        header[0..4].copy_from_slice(&FRAME_MAGIC);
        header[4..6].copy_from_slice(&self.current_version.to_le_bytes());
        header[6..8].copy_from_slice(&0u16.to_le_bytes());
        header[8..12].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c_combine(crc32c::crc32c(&header[4..12]), payload_crc, payload_len);
        header[12..16].copy_from_slice(&crc.to_le_bytes());
        let frame_len = FRAME_HEADER_LEN as u64 + payload_len;
        out.seek(SeekFrom::Start(start)).map_err(write_error)?;
        out.write_all(&header).map_err(write_error)?;
        out.seek(SeekFrom::Start(start + frame_len)).map_err(write_error)?;
        Ok(frame_len)
    }

    /// The CRC32C of `bytes` when they are exactly one frame, header
    /// included, derived from the checksum in its header (CRCs combine), so
    /// a log storing the frame need not read it once more. `None` when
    /// `bytes` are not the length their header declares. The result is only
    /// as good as that checksum: use it on a frame just encoded or checked
    /// with [`Self::open`].
    pub fn whole_frame_crc32c(bytes: &[u8]) -> Option<u32> {
        let header = bytes.get(..FRAME_HEADER_LEN)?;
        let len = u32::from_le_bytes(header[8..12].try_into().ok()?) as usize;
        let stored = u32::from_le_bytes(header[12..16].try_into().ok()?);
        if bytes.len() != FRAME_HEADER_LEN.checked_add(len)? {
            return None;
        }
        // stored = crc(version..length ++ payload); take the first part out.
        let payload_crc = stored ^ crc32c_combine(crc32c::crc32c(&header[4..12]), 0, len as u64);
        Some(crc32c_combine(crc32c::crc32c(header), payload_crc, len as u64))
    }

    /// Checks the frame at the start of `bytes` (magic, version, bound, CRC)
    /// without decoding its payload. Bytes after the frame are ignored.
    pub fn open<'a>(&self, bytes: &'a [u8]) -> Result<RawFrame<'a>, CoreError> {
        let header: &[u8; FRAME_HEADER_LEN] = bytes
            .get(..FRAME_HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(CoreError::Truncated { needed: FRAME_HEADER_LEN as u64, available: bytes.len() as u64 })?;
        let header = self.read_header(header)?;
        let frame_len = FRAME_HEADER_LEN + header.len as usize;
        let payload = bytes
            .get(FRAME_HEADER_LEN..frame_len)
            .ok_or(CoreError::Truncated { needed: frame_len as u64, available: bytes.len() as u64 })?;
        header.check(crc32c::crc32c_append(header.crc_seed, payload), self)?;
        Ok(RawFrame { version: header.version, payload, frame_len })
    }

    /// What a frame's header says, its magic and bound checked; the rest is
    /// checked with the payload's checksum ([`FrameHeader::check`]).
    pub(crate) fn read_header(&self, header: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, CoreError> {
        let [m0, m1, m2, m3, v0, v1, f0, f1, l0, l1, l2, l3, c0, c1, c2, c3] = *header;
        if [m0, m1, m2, m3] != FRAME_MAGIC {
            return Err(CoreError::BadMagic { found: [m0, m1, m2, m3] });
        }
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        if len > self.max_payload_bytes {
            return Err(CoreError::TooLarge { declared: u64::from(len), limit: u64::from(self.max_payload_bytes) });
        }
        Ok(FrameHeader {
            version: u16::from_le_bytes([v0, v1]),
            flags: u16::from_le_bytes([f0, f1]),
            len,
            stored_crc: u32::from_le_bytes([c0, c1, c2, c3]),
            crc_seed: crc32c::crc32c(&header[4..12]),
        })
    }

    /// Decodes the frame at the start of `bytes` as a `T`.
    pub fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<Frame<T>, CoreError> {
        let raw = self.open(bytes)?;
        let value = self.decode_payload(raw.payload)?;
        Ok(Frame { version: raw.version, value, frame_len: raw.frame_len })
    }

    /// Decodes a checked payload (from [`FrameCodec::open`]) as a `T`; every
    /// byte must be used.
    pub fn decode_payload<T: DeserializeOwned>(&self, payload: &[u8]) -> Result<T, CoreError> {
        let bound = self.max_decoded_bytes.max(payload.len());
        decode_bounded(payload, bound).map_err(|reason| CoreError::Decode { reason })
    }
}

fn bincode_config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Decodes with bincode's allocation limit set to the smallest power of two
/// at or above `bound` (between 4 KiB and 64 GiB).
fn decode_bounded<T: DeserializeOwned>(payload: &[u8], bound: usize) -> Result<T, String> {
    macro_rules! ladder {
        ($($shift:literal)*) => {
            match bound.checked_next_power_of_two().map_or(64, usize::trailing_zeros) {
                $(s if s <= $shift => decode_limited::<T, { 1usize << $shift }>(payload),)*
                _ => decode_limited::<T, { 1usize << 36 }>(payload),
            }
        };
    }
    ladder!(12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35)
}

fn decode_limited<T: DeserializeOwned, const LIMIT: usize>(payload: &[u8]) -> Result<T, String> {
    let config = bincode_config().with_limit::<LIMIT>();
    let (value, used) = bincode::serde::decode_from_slice(payload, config).map_err(|e| e.to_string())?;
    if used != payload.len() {
        return Err(format!("{} trailing bytes after the value", payload.len() - used));
    }
    Ok(value)
}

/// A frame's header, read and its magic and bound checked.
pub(crate) struct FrameHeader {
    pub(crate) version: u16,
    flags: u16,
    pub(crate) len: u32,
    stored_crc: u32,
    /// The checksum of the header's version, flags and length, which the
    /// payload's checksum continues.
    pub(crate) crc_seed: u32,
}

impl FrameHeader {
    /// Checks the header against `computed`, the checksum of its fields and
    /// the payload, then what only an undamaged header may say.
    pub(crate) fn check(&self, computed: u32, codec: &FrameCodec) -> Result<(), CoreError> {
        if self.stored_crc != computed {
            return Err(CoreError::ChecksumMismatch { stored: self.stored_crc, computed });
        }
        // Checked after the CRC: a damaged version field is damage, not a newer writer.
        if self.version > codec.current_version {
            return Err(CoreError::NewerVersion { found: self.version, supported: codec.current_version });
        }
        // No flag is defined yet: one that is set was written by a writer
        // that means something this build cannot honour.
        if self.flags != 0 {
            return Err(CoreError::UnknownFlags { flags: self.flags });
        }
        Ok(())
    }
}

/// A writer a streamed frame can seek back in, to fill in its header once
/// the payload is written: a file, or a [`std::io::Cursor`] over memory.
pub trait SeekWrite: Write + Seek {}

impl<T: Write + Seek + ?Sized> SeekWrite for T {}

/// Where a payload writer appends its bytes, record by record: a `Vec` in
/// memory, or the [`PayloadChunks`] of a streamed frame.
pub trait PayloadSink {
    /// The buffer to append the next record to.
    fn buffer(&mut self) -> &mut Vec<u8>;

    /// Called after each record: a streamed frame passes its buffer on to
    /// its writer once it holds a chunk.
    fn record_end(&mut self) -> Result<(), CoreError>;
}

impl PayloadSink for Vec<u8> {
    fn buffer(&mut self) -> &mut Vec<u8> {
        self
    }

    fn record_end(&mut self) -> Result<(), CoreError> {
        Ok(())
    }
}

/// Bytes a streamed frame's payload collects before passing them on: large
/// enough that a write is one system call per megabyte, small beside any
/// state worth streaming.
pub(crate) const PAYLOAD_CHUNK: usize = 1 << 20;

/// The payload of a frame [`FrameCodec::encode_streamed`] writes: records
/// are appended to a chunk, which goes to the writer (its checksum and
/// length counted) whenever a record ends with it full.
pub struct PayloadChunks<'a, W: ?Sized> {
    chunk: Vec<u8>,
    out: &'a mut W,
    crc: u32,
    len: u64,
}

impl<W: Write + ?Sized> PayloadChunks<'_, W> {
    fn pass_on(&mut self) -> Result<(), CoreError> {
        self.crc = crc32c::crc32c_append(self.crc, &self.chunk);
        self.len += self.chunk.len() as u64;
        self.out.write_all(&self.chunk).map_err(write_error)?;
        self.chunk.clear();
        Ok(())
    }
}

impl<W: Write + ?Sized> PayloadSink for PayloadChunks<'_, W> {
    fn buffer(&mut self) -> &mut Vec<u8> {
        &mut self.chunk
    }

    fn record_end(&mut self) -> Result<(), CoreError> {
        if self.chunk.len() >= PAYLOAD_CHUNK { self.pass_on() } else { Ok(()) }
    }
}

fn write_error(source: std::io::Error) -> CoreError {
    CoreError::Write { source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: u64,
        name: String,
        bytes: Vec<u8>,
    }

    fn sample() -> Sample {
        Sample { id: 42, name: "spate".into(), bytes: vec![1, 2, 3] }
    }

    #[test]
    fn round_trip_and_length() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let mut buf = codec.encode(&sample())?;
        let len = buf.len();
        buf.extend_from_slice(b"next record");
        let frame = codec.decode::<Sample>(&buf)?;
        assert_eq!(frame, Frame { version: 1, value: sample(), frame_len: len });
        Ok(())
    }

    /// Records of 1 to 300 bytes, as a payload writer appends them.
    fn records(count: usize) -> Vec<Vec<u8>> {
        (0..count).map(|i| (0..1 + i * 7919 % 300).map(|b| (b ^ i) as u8).collect()).collect()
    }

    #[test]
    fn a_streamed_frame_is_the_frame_encode_with_makes() -> Result<(), CoreError> {
        let codec = FrameCodec::new(4);
        // Several chunks' worth, so the chunks' checksums combine.
        let records = records(20_000);
        let mut expected = Vec::new();
        codec.encode_with(&mut expected, |out| {
            records.iter().for_each(|r| out.extend_from_slice(r));
            Ok(())
        })?;
        assert!(expected.len() > 2 * PAYLOAD_CHUNK, "{}", expected.len());
        // After other bytes (a header of changes goes first), and followed by more.
        let mut out = std::io::Cursor::new(b"prefix".to_vec());
        out.seek(SeekFrom::End(0)).map_err(write_error)?;
        let written = codec.encode_streamed(&mut out, |chunks| {
            for record in &records {
                chunks.buffer().extend_from_slice(record);
                chunks.record_end()?;
            }
            Ok(())
        })?;
        out.write_all(b"after").map_err(write_error)?;
        let bytes = out.into_inner();
        assert_eq!(written, expected.len() as u64);
        assert_eq!(&bytes[..6], b"prefix");
        assert_eq!(&bytes[6..6 + expected.len()], expected.as_slice());
        assert_eq!(&bytes[6 + expected.len()..], b"after");
        assert_eq!(codec.open(&bytes[6..])?.payload.len(), expected.len() - FRAME_HEADER_LEN);
        Ok(())
    }

    #[test]
    fn a_streamed_frame_over_the_bound_is_refused() {
        let codec = FrameCodec::new(1).with_max_payload(1000);
        let mut out = std::io::Cursor::new(Vec::new());
        let result = codec.encode_streamed(&mut out, |chunks| {
            chunks.buffer().extend_from_slice(&[7u8; 1001]);
            chunks.record_end()
        });
        assert!(matches!(result, Err(CoreError::TooLarge { declared: 1001, limit: 1000 })), "{result:?}");
    }

    #[test]
    fn a_streamed_frame_reports_its_writer_failing() {
        /// Takes a header and nothing more.
        struct Full(std::io::Cursor<Vec<u8>>);
        impl Write for Full {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if self.0.position() >= FRAME_HEADER_LEN as u64 {
                    return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full"));
                }
                self.0.write(buf)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl Seek for Full {
            fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
                self.0.seek(to)
            }
        }
        let mut out = Full(std::io::Cursor::new(Vec::new()));
        let result = FrameCodec::new(1).encode_streamed(&mut out, |chunks| {
            chunks.buffer().extend_from_slice(b"payload");
            chunks.record_end()
        });
        assert!(matches!(&result, Err(CoreError::Write { source }) if source.to_string() == "disk full"), "{result:?}");
    }

    #[test]
    fn every_truncation_is_a_torn_write() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let buf = codec.encode(&sample())?;
        for cut in 0..buf.len() {
            let err = codec.decode::<Sample>(&buf[..cut]).err();
            assert!(matches!(err, Some(CoreError::Truncated { .. })), "cut at {cut}: {err:?}");
        }
        Ok(())
    }

    #[test]
    fn every_bit_flip_is_detected() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let buf = codec.encode(&sample())?;
        for byte in 0..buf.len() {
            let mut damaged = buf.clone();
            damaged[byte] ^= 0x10;
            assert!(codec.decode::<Sample>(&damaged).is_err(), "flip in byte {byte} went unnoticed");
        }
        Ok(())
    }

    #[test]
    fn newer_version_is_refused_by_name() -> Result<(), CoreError> {
        let buf = FrameCodec::new(3).encode(&sample())?;
        let err = FrameCodec::new(2).decode::<Sample>(&buf).err();
        assert!(matches!(err, Some(CoreError::NewerVersion { found: 3, supported: 2 })));
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("newer spate"), "{message}");
        // An older frame is still read by the newer codec.
        let old = FrameCodec::new(1).encode(&sample())?;
        assert_eq!(FrameCodec::new(2).decode::<Sample>(&old)?.version, 1);
        Ok(())
    }

    #[test]
    fn a_frame_with_an_unknown_flag_is_refused() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let mut bytes = codec.encode(&sample())?;
        bytes[6] = 0x01;
        // Re-checksum, so the refusal is for the flag and not for damage.
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[4..12]), &bytes[FRAME_HEADER_LEN..]);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        let err = codec.decode::<Sample>(&bytes).unwrap_err();
        assert!(matches!(err, CoreError::UnknownFlags { flags: 1 }), "{err}");
        assert!(!err.is_torn_write());
        Ok(())
    }

    #[test]
    fn declared_length_over_the_bound_is_refused_before_reading() -> Result<(), CoreError> {
        let big = Sample { bytes: vec![7; 10_000], ..sample() };
        let buf = FrameCodec::new(1).encode(&big)?;
        let err = FrameCodec::new(1).with_max_payload(1000).decode::<Sample>(&buf).err();
        assert!(matches!(err, Some(CoreError::TooLarge { limit: 1000, .. })));
        assert!(matches!(FrameCodec::new(1).with_max_payload(1000).encode(&big), Err(CoreError::TooLarge { .. })));
        Ok(())
    }

    #[test]
    fn a_payload_written_by_hand_frames_like_an_encoded_value() -> Result<(), CoreError> {
        let codec = FrameCodec::new(3);
        let mut by_hand = vec![0xee];
        // bincode's standard varint of 7 is the byte itself.
        codec.encode_with(&mut by_hand, |out| {
            out.push(7);
            Ok(())
        })?;
        assert_eq!(by_hand[1..], codec.encode(&7u32)?[..]);
        assert_eq!(codec.decode::<u32>(&by_hand[1..])?.value, 7);
        Ok(())
    }

    #[test]
    fn the_whole_frame_crc_derived_from_the_header_equals_a_computed_one() -> Result<(), CoreError> {
        let codec = FrameCodec::new(2);
        for len in [0usize, 1, 7, 64, 1000, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut frame = codec.encode(&payload)?;
            assert_eq!(FrameCodec::whole_frame_crc32c(&frame), Some(crc32c::crc32c(&frame)), "{len}");
            assert_eq!(FrameCodec::whole_frame_crc32c(&frame[..frame.len() - 1]), None, "cut short");
            frame.extend_from_slice(b"next");
            assert_eq!(FrameCodec::whole_frame_crc32c(&frame), None, "more than one frame");
        }
        Ok(())
    }

    #[test]
    fn a_payload_crc_from_the_writer_gives_the_same_frame() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 241) as u8).collect();
        let mut with_crc = Vec::new();
        codec.encode_with_crc(&mut with_crc, |out| {
            out.extend_from_slice(&payload);
            Ok(crc32c::crc32c(&payload))
        })?;
        let mut without = Vec::new();
        codec.encode_with(&mut without, |out| {
            out.extend_from_slice(&payload);
            Ok(())
        })?;
        assert_eq!(with_crc, without);
        assert!(codec.open(&with_crc).is_ok());
        Ok(())
    }

    #[test]
    fn a_failed_or_oversized_payload_leaves_the_output_unchanged() {
        let mut out = vec![1, 2, 3];
        let failed = FrameCodec::new(1).encode_with(&mut out, |out| {
            out.extend_from_slice(b"partial");
            Err(CoreError::Encode { reason: "stopped".into() })
        });
        assert!(matches!(failed, Err(CoreError::Encode { .. })));
        let oversized = FrameCodec::new(1).with_max_payload(4).encode_with(&mut out, |out| {
            out.extend_from_slice(b"too long");
            Ok(())
        });
        assert!(matches!(oversized, Err(CoreError::TooLarge { declared: 8, limit: 4 })));
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn huge_inner_length_does_not_allocate() {
        // A well-formed frame whose payload claims a 2^60-byte vector: the
        // CRC is right, so only the decode bound stands between it and an abort.
        let mut payload = Vec::new();
        payload.push(42u8); // id
        payload.push(0u8); // empty name
        payload.push(255u8); // varint marker for u64
        payload.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let mut frame = Vec::new();
        frame.extend_from_slice(&FRAME_MAGIC);
        frame.extend_from_slice(&1u16.to_le_bytes());
        frame.extend_from_slice(&0u16.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&frame[4..12]), &payload);
        frame.extend_from_slice(&crc.to_le_bytes());
        frame.extend_from_slice(&payload);
        let err = FrameCodec::new(1).decode::<Sample>(&frame).err();
        assert!(matches!(err, Some(CoreError::Decode { .. })), "{err:?}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = FrameCodec::new(1).decode::<Sample>(&bytes);
        }

        #[test]
        fn arbitrary_values_round_trip(id: u64, name in ".{0,40}", bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let value = Sample { id, name, bytes };
            let codec = FrameCodec::new(1);
            let buf = codec.encode(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = codec.decode::<Sample>(&buf).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back.value, value);
        }
    }
}
