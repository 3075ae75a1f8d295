//! Identifiers: batches, input streams and received blocks.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The id of one micro-batch: 0, 1, 2, … in the order batches are planned.
///
/// It names the `offsets/<N>` and `commits/<N>` files of a checkpoint, and
/// sinks receive it so their writes can be idempotent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BatchId(pub u64);

impl BatchId {
    /// The batch after this one; `None` for `BatchId(u64::MAX)`, which has
    /// no successor (an id read from a file can be that large, so callers
    /// must not assume one exists).
    pub const fn next(self) -> Option<BatchId> {
        match self.0.checked_add(1) {
            Some(n) => Some(BatchId(n)),
            None => None,
        }
    }

    /// The batch before this one, if any.
    pub const fn prev(self) -> Option<BatchId> {
        match self.0.checked_sub(1) {
            Some(n) => Some(BatchId(n)),
            None => None,
        }
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of an input stream of the graph (one per receiver or source).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StreamId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of a block of received records: its stream and a number unique
/// within that stream (Spark's `StreamBlockId`, `input-<stream>-<n>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StreamBlockId {
    /// The stream the block was received on.
    pub stream_id: StreamId,
    /// Unique within the stream.
    pub unique_id: u64,
}

impl StreamBlockId {
    /// The block `unique_id` of `stream_id`.
    pub const fn new(stream_id: StreamId, unique_id: u64) -> Self {
        StreamBlockId { stream_id, unique_id }
    }
}

impl fmt::Display for StreamBlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input-{}-{}", self.stream_id.0, self.unique_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_id_neighbours() {
        assert_eq!(BatchId(0).prev(), None);
        assert_eq!(BatchId(7).prev(), Some(BatchId(6)));
        assert_eq!(BatchId(7).next(), Some(BatchId(8)));
        assert_eq!(BatchId(u64::MAX).next(), None);
    }

    #[test]
    fn block_id_reads_like_spark() {
        assert_eq!(StreamBlockId::new(StreamId(2), 17).to_string(), "input-2-17");
    }
}
