//! Reading a frame from a stream: a frame larger than memory (a large
//! operator state) is checked and then decoded record by record, never
//! held whole.
//!
//! The checksum covers the whole payload, so nothing of it can be trusted
//! before all of it was read: [`FrameCodec::open_streamed`] reads the
//! payload once in chunks to check it, seeks back, and hands out a
//! [`PayloadStream`] that decodes from the same source. A source read
//! twice costs a file's second read from the page cache; holding it whole
//! would cost the frame's size in memory.

use std::io::{BufReader, Read, Seek, SeekFrom, Take};

use serde::de::DeserializeOwned;

use crate::error::CoreError;
use crate::frame::{FRAME_HEADER_LEN, FrameCodec, PAYLOAD_CHUNK};
use crate::in_place::VarintSource;

/// A reader a streamed frame is checked in and then decoded from: a file,
/// or a [`std::io::Cursor`] over memory.
pub trait ReadSeek: Read + Seek + Send {}

impl<T: Read + Seek + Send + ?Sized> ReadSeek for T {}

/// Bytes a payload stream reads from its source at a time.
const READ_BUFFER: usize = 64 * 1024;

/// The most one record of a streamed payload may allocate while it
/// decodes: a frame's payload is at most 4 GiB.
const MAX_RECORD_BYTES: usize = 1 << 32;

impl FrameCodec {
    /// [`FrameCodec::open`] for the frame at `reader`'s position: header,
    /// bound and checksum are checked reading the payload in chunks, and
    /// the payload is then read from the returned stream. Bytes after the
    /// frame are not read.
    pub fn open_streamed<R: Read + Seek>(&self, mut reader: R) -> Result<PayloadStream<R>, CoreError> {
        let mut header = [0u8; FRAME_HEADER_LEN];
        let read = read_up_to(&mut reader, &mut header)?;
        if read < FRAME_HEADER_LEN {
            return Err(CoreError::Truncated { needed: FRAME_HEADER_LEN as u64, available: read as u64 });
        }
        let header = self.read_header(&header)?;
        let payload_start = reader.stream_position().map_err(read_error)?;
        let (len, mut crc) = (u64::from(header.len), header.crc_seed);
        let mut chunk = vec![0u8; PAYLOAD_CHUNK.min(header.len as usize)];
        let mut checked = 0u64;
        while checked < len {
            let want = usize::try_from(len - checked).map_or(chunk.len(), |left| left.min(chunk.len()));
            let got = read_up_to(&mut reader, &mut chunk[..want])?;
            crc = crc32c::crc32c_append(crc, &chunk[..got]);
            checked += got as u64;
            if got < want {
                let frame_len = FRAME_HEADER_LEN as u64 + len;
                return Err(CoreError::Truncated { needed: frame_len, available: FRAME_HEADER_LEN as u64 + checked });
            }
        }
        header.check(crc, self)?;
        reader.seek(SeekFrom::Start(payload_start)).map_err(read_error)?;
        Ok(PayloadStream { version: header.version, reader: BufReader::with_capacity(READ_BUFFER, reader.take(len)) })
    }
}

/// The checked payload of a frame read from a stream (see
/// [`FrameCodec::open_streamed`]), decoded record by record.
pub struct PayloadStream<R> {
    version: u16,
    reader: BufReader<Take<R>>,
}

impl<R: Read> PayloadStream<R> {
    /// The payload's format version as written.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The payload's bytes not read yet.
    pub fn remaining(&self) -> u64 {
        self.reader.get_ref().limit() + self.reader.buffer().len() as u64
    }

    /// A sequence's count, refused when larger than the bytes left could
    /// hold (every record takes at least a byte), as
    /// [`crate::PayloadReader::count`] refuses it.
    pub fn count(&mut self) -> Result<u64, CoreError> {
        let count = self.varint()?;
        let available = self.remaining();
        if count <= available {
            Ok(count)
        } else {
            Err(CoreError::Decode { reason: format!("a sequence declares {count} records in {available} bytes") })
        }
    }

    /// A bincode varint (the standard configuration's integer encoding).
    pub fn varint(&mut self) -> Result<u64, CoreError> {
        self.read_varint()
    }

    /// Decodes the next record as a `T`.
    pub fn record<T: DeserializeOwned>(&mut self) -> Result<T, CoreError> {
        let config = bincode::config::standard().with_limit::<MAX_RECORD_BYTES>();
        bincode::serde::decode_from_std_read(&mut self.reader, config)
            .map_err(|e| CoreError::Decode { reason: e.to_string() })
    }

    /// Checks that everything was read.
    pub fn finish(&self) -> Result<(), CoreError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(CoreError::Decode { reason: format!("{n} trailing bytes after the value") }),
        }
    }
}

impl<R: Read> VarintSource for PayloadStream<R> {
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CoreError> {
        let mut out = [0u8; N];
        let available = self.remaining();
        if read_up_to(&mut self.reader, &mut out)? == N {
            return Ok(out);
        }
        Err(CoreError::Truncated { needed: N as u64, available })
    }
}

/// Reads into `buf` until it is full or the source ends; the bytes read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize, CoreError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e)),
        }
    }
    Ok(filled)
}

fn read_error(source: std::io::Error) -> CoreError {
    CoreError::Read { source }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A frame of `count` string records after a `count` varint, as a
    /// keyed state's snapshot is laid out.
    fn frame_of(codec: &FrameCodec, count: usize) -> Result<Vec<u8>, CoreError> {
        let mut bytes = Vec::new();
        codec.encode_with(&mut bytes, |out| {
            crate::write_varint(count as u64, out);
            for i in 0..count {
                bincode::serde::encode_into_std_write(format!("key-{i}"), out, bincode::config::standard())
                    .map_err(|e| CoreError::Encode { reason: e.to_string() })?;
            }
            Ok(())
        })?;
        Ok(bytes)
    }

    #[test]
    fn a_streamed_frame_reads_as_the_frame_in_memory() -> Result<(), CoreError> {
        let codec = FrameCodec::new(3);
        // More than a chunk, so the check reads several.
        let frame = frame_of(&codec, 200_000)?;
        assert!(frame.len() > PAYLOAD_CHUNK);
        let mut source = b"prefix".to_vec();
        source.extend_from_slice(&frame);
        source.extend_from_slice(b"after");
        let mut cursor = Cursor::new(source);
        cursor.seek(SeekFrom::Start(6)).map_err(read_error)?;
        let mut stream = codec.open_streamed(cursor)?;
        assert_eq!(stream.version(), 3);
        assert_eq!(stream.remaining(), (frame.len() - FRAME_HEADER_LEN) as u64);
        let count = stream.count()?;
        assert_eq!(count, 200_000);
        for i in 0..count {
            assert_eq!(stream.record::<String>()?, format!("key-{i}"));
        }
        stream.finish()
    }

    #[test]
    fn a_damaged_or_short_streamed_frame_is_refused_before_any_record() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let frame = frame_of(&codec, 50_000)?;
        let mut damaged = frame.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(matches!(codec.open_streamed(Cursor::new(damaged)), Err(CoreError::ChecksumMismatch { .. })));
        let short = frame[..frame.len() - 1].to_vec();
        let err = codec.open_streamed(Cursor::new(short)).err();
        assert!(matches!(err, Some(CoreError::Truncated { .. })), "{err:?}");
        let header_only = frame[..10].to_vec();
        assert!(matches!(codec.open_streamed(Cursor::new(header_only)), Err(CoreError::Truncated { .. })));
        let newer = FrameCodec::new(2).encode(&1u8)?;
        assert!(matches!(codec.open_streamed(Cursor::new(newer)), Err(CoreError::NewerVersion { .. })));
        Ok(())
    }

    #[test]
    fn a_streamed_payload_refuses_a_count_past_its_bytes_and_trailing_bytes() -> Result<(), CoreError> {
        let codec = FrameCodec::new(1);
        let mut bytes = Vec::new();
        codec.encode_with(&mut bytes, |out| {
            crate::write_varint(1_000, out);
            out.push(7);
            Ok(())
        })?;
        let mut stream = codec.open_streamed(Cursor::new(bytes.clone()))?;
        assert!(matches!(stream.count(), Err(CoreError::Decode { .. })));
        let mut stream = codec.open_streamed(Cursor::new(bytes))?;
        assert_eq!(stream.varint()?, 1_000);
        assert!(stream.finish().is_err());
        assert_eq!(stream.record::<u8>()?, 7);
        stream.finish()?;
        assert!(matches!(stream.varint(), Err(CoreError::Truncated { .. })));
        Ok(())
    }
}
