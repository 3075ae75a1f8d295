//! The error type of spate-receiver; every variant names the block, stream,
//! path or peer involved.

use std::path::PathBuf;

use spate_core::{CoreError, StreamBlockId, StreamId, WalRecordHandle};
use spate_wal::WalError;
use thiserror::Error;

/// A boxed error from a collaborator (a block-info sink, a receiver's source).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from receiving, buffering or storing blocks.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReceiverError {
    /// A memory-only block does not fit in the block manager's memory budget.
    #[error(
        "block {block_id} ({needed} bytes) does not fit in the memory budget of {budget} bytes \
         ({used} in use, memory-only blocks cannot spill); raise the budget or use a level with disk"
    )]
    MemoryBudgetExceeded {
        /// The refused block.
        block_id: StreamBlockId,
        /// Estimated bytes of the block.
        needed: u64,
        /// Bytes in memory when it was refused.
        used: u64,
        /// The configured budget.
        budget: u64,
    },
    /// A block larger than the whole spill area: it could never be spilled.
    #[error(
        "block {block_id} ({bytes} bytes serialized) does not fit in the spill limit of {limit} bytes, so it can \
         never be spilled; raise the spill limit (max_spill_bytes, --max-spill) or cut smaller blocks"
    )]
    SpillAreaTooSmall {
        /// The refused block.
        block_id: StreamBlockId,
        /// Its serialized bytes.
        bytes: u64,
        /// The spill area's limit.
        limit: u64,
    },
    /// A block with this id is already stored.
    #[error("block {block_id} is already stored")]
    DuplicateBlock {
        /// The block id.
        block_id: StreamBlockId,
    },
    /// A storage level needs disk but the block manager has no disk store.
    #[error("block {block_id} needs the disk store (level {level}) but the block manager was opened without one")]
    NoDiskStore {
        /// The block id.
        block_id: StreamBlockId,
        /// The requested level, as displayed.
        level: String,
    },
    /// The disk store (RocksDB) failed.
    #[error("disk store {path}: {op} of block {block_id:?} failed: {reason}")]
    DiskStore {
        /// The RocksDB directory.
        path: PathBuf,
        /// What was being done (`open`, `put`, `get`, `delete`).
        op: &'static str,
        /// The block, when one was involved.
        block_id: Option<StreamBlockId>,
        /// What RocksDB said.
        reason: String,
    },
    /// The disk store's directory holds files it did not make: it is never
    /// wiped, so it is refused.
    #[error(
        "disk store {path}: the directory holds {entries} file(s) and no {marker} file, so it is not a spill \
         area spate made; refusing to wipe it: give the block manager a new or empty directory"
    )]
    DiskDirNotOurs {
        /// The directory.
        path: PathBuf,
        /// Entries found in it.
        entries: usize,
        /// The marker file a spill area carries.
        marker: &'static str,
    },
    /// A block's bytes do not encode or decode.
    #[error("block {block_id:?}: {source}")]
    Codec {
        /// The block, when known.
        block_id: Option<StreamBlockId>,
        /// What the frame codec said.
        #[source]
        source: CoreError,
    },
    /// The receiver write-ahead log failed.
    #[error("receiver write-ahead log of stream {stream_id}: {source}")]
    Wal {
        /// The stream whose log failed.
        stream_id: StreamId,
        /// The log's error.
        #[source]
        source: WalError,
    },
    /// A block of one record is larger than the receiver write-ahead log's
    /// largest record: that record can never be stored durably as it is.
    #[error(
        "block {block_id} holds one record of {bytes} bytes (serialized), more than the receiver write-ahead log's \
         largest record of {max} bytes; raise the log's max_record_size (WalSettings::with_max_record_size) above it, \
         or split such records at the source"
    )]
    RecordTooLargeForWal {
        /// The block of the record.
        block_id: StreamBlockId,
        /// Serialized bytes of the block.
        bytes: u64,
        /// The log's largest record.
        max: u64,
    },
    /// A block of several records is larger than the receiver write-ahead
    /// log's largest record.
    #[error(
        "block {block_id} ({records} records, {bytes} bytes serialized) is larger than the receiver write-ahead log's \
         largest record of {max} bytes; lower the block generator's max_block_bytes or max_block_records, or raise \
         the log's max_record_size (WalSettings::with_max_record_size)"
    )]
    BlockTooLargeForWal {
        /// The block.
        block_id: StreamBlockId,
        /// Records in the block.
        records: u64,
        /// Serialized bytes of the block.
        bytes: u64,
        /// The log's largest record.
        max: u64,
    },
    /// The write-ahead log did not confirm a block within the timeout.
    #[error("block {block_id} was not confirmed by the write-ahead log within {timeout_ms} ms")]
    WalTimeout {
        /// The block being written.
        block_id: StreamBlockId,
        /// The configured timeout.
        timeout_ms: u64,
    },
    /// A WAL record could not be read back as a block.
    #[error("record {handle} of the receiver write-ahead log is not a block: {source}")]
    WalRecordNotABlock {
        /// The handle read.
        handle: WalRecordHandle,
        /// Why it does not decode.
        #[source]
        source: CoreError,
    },
    /// The block-info sink (the tracker) refused or failed to take a block.
    #[error("reporting block {block_id} of stream {stream_id} failed: {source}")]
    ReportFailed {
        /// The stream.
        stream_id: StreamId,
        /// The block.
        block_id: StreamBlockId,
        /// What the sink said.
        #[source]
        source: BoxError,
    },
    /// The receiver or block generator is stopping or stopped; data was not taken.
    #[error("stream {stream_id}: {what} after the receiver was stopped")]
    Stopped {
        /// The stream.
        stream_id: StreamId,
        /// What was refused.
        what: &'static str,
    },
    /// A socket operation failed.
    #[error("socket {peer}: {op} failed: {source}")]
    Socket {
        /// The peer address.
        peer: String,
        /// What was being done (`connect`, `read`).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A peer sent bytes that are not UTF-8 and the policy is to fail.
    #[error("socket {peer}: line {line} (starting at byte {byte_offset}) is not valid UTF-8: {reason}")]
    InvalidUtf8 {
        /// The peer address.
        peer: String,
        /// Number of the line (from 1) on this connection.
        line: u64,
        /// Byte offset of the line's start on this connection.
        byte_offset: u64,
        /// What the decoder said.
        reason: String,
    },
    /// A line longer than the configured maximum.
    #[error("socket {peer}: line {line} exceeds the maximum line length of {max} bytes")]
    LineTooLong {
        /// The peer address.
        peer: String,
        /// Number of the line (from 1) on this connection.
        line: u64,
        /// The configured maximum.
        max: usize,
    },
    /// The source closed the connection; the receiver asks to be restarted.
    #[error("source {source_name} closed the stream")]
    SourceClosed {
        /// The source, e.g. a peer address.
        source_name: String,
    },
    /// A receiver reported an error of its own.
    #[error("receiver {receiver} failed: {message}")]
    Receiver {
        /// The receiver's name.
        receiver: String,
        /// What it reported.
        message: String,
    },
    /// A configuration value is not usable.
    #[error("invalid configuration: {what}")]
    InvalidConfig {
        /// What is wrong.
        what: String,
    },
    /// A thread or runtime of the supervisor could not be started or panicked.
    #[error("{what}: {reason}")]
    Runtime {
        /// Which thread or runtime.
        what: String,
        /// What happened.
        reason: String,
    },
}
