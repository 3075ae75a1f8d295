//! Types that cross from the receiver side to the driver side: where a
//! block's data was stored and what the tracker needs to know about it.
//!
//! They live here, below both `spate-receiver` and `spate-tracker`, so that
//! neither has to depend sideways on the other.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{StreamBlockId, StreamId};

/// Where one record lives in a write-ahead log: the segment, the byte offset
/// of its frame and the frame's length.
///
/// The segment is named relative to the log's directory (its file name), so
/// handles stay valid when a checkpoint directory is moved or copied.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WalRecordHandle {
    /// The segment's file name inside the log directory, e.g. `log-1000-61000`.
    pub segment: String,
    /// Byte offset of the record's frame in the segment.
    pub offset: u64,
    /// Length of the record's frame in bytes (header included).
    pub length: u32,
}

impl fmt::Display for WalRecordHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}+{}", self.segment, self.offset, self.length)
    }
}

/// What storing a block produced: its id, its size in records, and, when the
/// receiver write-ahead log is on, the handle to read it back after a crash.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockStoreResult {
    /// The stored block.
    pub block_id: StreamBlockId,
    /// Records in the block, when known.
    pub num_records: Option<u64>,
    /// Set when the block is also in the receiver WAL.
    pub wal_handle: Option<WalRecordHandle>,
}

/// The description of a stored block that a receiver reports to the driver's
/// `ReceivedBlockTracker`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReceivedBlockInfo {
    /// The input stream the block belongs to.
    pub stream_id: StreamId,
    /// Records in the block, when known.
    pub num_records: Option<u64>,
    /// Source metadata a receiver attaches (for example the offsets it covers).
    pub metadata: Option<Vec<u8>>,
    /// Where the block was stored.
    pub store_result: BlockStoreResult,
}

impl ReceivedBlockInfo {
    /// The id of the described block.
    pub fn block_id(&self) -> StreamBlockId {
        self.store_result.block_id
    }

    /// The handle to read the block from the receiver WAL, if it was written there.
    pub fn wal_handle(&self) -> Option<&WalRecordHandle> {
        self.store_result.wal_handle.as_ref()
    }
}
