//! The error type of spate-core: what can go wrong encoding or decoding a
//! record frame. Callers add the file and byte offset when they report it.

use thiserror::Error;

/// An error from encoding or decoding a [`crate::FrameCodec`] frame.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CoreError {
    /// Fewer bytes than a frame header; at the end of a file this is a torn write.
    #[error("frame truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes the frame (header and payload) declares or needs.
        needed: u64,
        /// Bytes actually there.
        available: u64,
    },
    /// The first bytes are not a spate frame.
    #[error("not a spate frame: bad magic {found:02x?}")]
    BadMagic {
        /// The four bytes found where the magic belongs.
        found: [u8; 4],
    },
    /// The frame was written by a newer spate with a format this build cannot read.
    #[error("written by a newer spate: record format version {found}, this build reads up to {supported}")]
    NewerVersion {
        /// The version in the frame.
        found: u16,
        /// The newest version this build reads.
        supported: u16,
    },
    /// The frame has a flag set that this build does not know (flags are reserved).
    #[error("frame has unknown flags {flags:#06x}: written by a newer spate, or damaged")]
    UnknownFlags {
        /// The flags field as written.
        flags: u16,
    },
    /// More bytes than a whole [`MemoryBudget`](crate::MemoryBudget) were
    /// asked for at once: they could never fit, however long one waited.
    #[error(
        "{needed} bytes were asked of a memory budget of {limit} bytes: raise --max-memory or make the unit smaller"
    )]
    OverMemoryBudget {
        /// The bytes asked for.
        needed: u64,
        /// The budget's limit.
        limit: u64,
    },
    /// The declared payload is larger than the configured bound.
    #[error("record of {declared} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Payload length declared by the header (or produced by the encoder).
        declared: u64,
        /// The configured maximum.
        limit: u64,
    },
    /// The checksum does not match the bytes: the record is damaged.
    #[error("checksum mismatch: stored crc32c {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The CRC in the header.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
    /// The payload passed its checksum but is not a valid encoding of the type.
    #[error("record payload does not decode: {reason}")]
    Decode {
        /// What the decoder said.
        reason: String,
    },
    /// The value could not be encoded (for example a map with non-string keys).
    #[error("record does not encode: {reason}")]
    Encode {
        /// What the encoder said.
        reason: String,
    },
    /// A frame streamed to a writer could not be written.
    #[error("writing the frame failed: {source}")]
    Write {
        /// What the writer said.
        #[source]
        source: std::io::Error,
    },
    /// A frame read from a stream could not be read.
    #[error("reading the frame failed: {source}")]
    Read {
        /// What the reader said.
        #[source]
        source: std::io::Error,
    },
}

impl CoreError {
    /// True for damage that a torn write at the end of a file explains
    /// (a short frame, or a checksum that fails because the tail is missing).
    pub fn is_torn_write(&self) -> bool {
        matches!(self, CoreError::Truncated { .. } | CoreError::ChecksumMismatch { .. })
    }
}
