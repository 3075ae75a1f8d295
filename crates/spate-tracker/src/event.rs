//! The tracker's events and their encoding in the event log.
//!
//! One log record holds one [`EventBatch`]: the events that were committed
//! together (several block additions that arrived at once, or one
//! allocation, or one cleanup), inside a versioned [`FrameCodec`] frame. A
//! later spate keeps a decoder for every older format version; a record from
//! a newer version is refused by name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, FrameCodec, ReceivedBlockInfo, StreamId, Time};

/// The format version of event records this build writes (and the newest it reads).
pub const EVENT_FORMAT_VERSION: u16 = 1;

/// The blocks of every stream allocated to one batch, as logged.
pub type StreamBlocks = BTreeMap<StreamId, Vec<ReceivedBlockInfo>>;

/// One change of the tracker's state (Spark's `ReceivedBlockTrackerLogEvent`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrackerEvent {
    /// A block was received and waits to be allocated to a batch.
    BlockAddition(ReceivedBlockInfo),
    /// The unallocated blocks of every stream went to the batch at `time`.
    ///
    /// The event carries the blocks themselves, not only the time: the
    /// additions that preceded it may be in log segments that a cleanup has
    /// deleted while this batch is still live.
    BatchAllocation {
        /// The batch time.
        time: Time,
        /// The blocks, by stream; streams without blocks are absent.
        blocks: StreamBlocks,
    },
    /// The allocations of the batches at `times` were forgotten.
    BatchCleanup {
        /// The batch times cleaned.
        times: Vec<Time>,
        /// The last allocated batch time when the cleanup was logged. Cleaning
        /// the log may delete that allocation's record; this keeps the fact
        /// that the batch was allocated, so a re-run cannot take new blocks.
        last_allocated: Option<Time>,
    },
}

impl TrackerEvent {
    /// A short description for error messages and logs.
    pub fn describe(&self) -> String {
        match self {
            TrackerEvent::BlockAddition(info) => format!("addition of block {}", info.block_id()),
            TrackerEvent::BatchAllocation { time, .. } => format!("allocation of batch {time}"),
            TrackerEvent::BatchCleanup { times, .. } => format!("cleanup of {} batch(es)", times.len()),
        }
    }
}

/// The events of one log record, committed together.
pub type EventBatch = Vec<TrackerEvent>;

/// How a record could not be decoded.
#[derive(Debug)]
pub(crate) enum DecodeFailure {
    /// The record's format is newer than this build reads.
    Newer { found: u16 },
    /// The record is not a valid event frame.
    Damaged(CoreError),
}

/// The frame codec of the event log.
pub(crate) const fn event_codec() -> FrameCodec {
    FrameCodec::new(EVENT_FORMAT_VERSION)
}

/// Appends the frame of `events` to `out` (which is cleared first).
pub(crate) fn encode_batch(events: &[TrackerEvent], out: &mut Vec<u8>) -> Result<(), CoreError> {
    out.clear();
    event_codec().encode_into(events, out)
}

/// Decodes one log record into its events, picking the decoder by the
/// record's format version.
pub(crate) fn decode_batch(record: &[u8]) -> Result<EventBatch, DecodeFailure> {
    let codec = event_codec();
    let raw = codec.open(record).map_err(|e| match e {
        CoreError::NewerVersion { found, .. } => DecodeFailure::Newer { found },
        other => DecodeFailure::Damaged(other),
    })?;
    if raw.frame_len != record.len() {
        let trailing = record.len() - raw.frame_len;
        return Err(DecodeFailure::Damaged(CoreError::Decode {
            reason: format!("{trailing} bytes after the event frame"),
        }));
    }
    // Version 1 is the only format so far; a later version adds its arm here
    // and keeps this one, so old logs stay readable.
    codec.decode_payload::<EventBatch>(raw.payload).map_err(DecodeFailure::Damaged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::{BlockStoreResult, StreamBlockId, WalRecordHandle};

    fn info(stream: u32, id: u64) -> ReceivedBlockInfo {
        ReceivedBlockInfo {
            stream_id: StreamId(stream),
            num_records: Some(id * 10),
            metadata: None,
            store_result: BlockStoreResult {
                block_id: StreamBlockId::new(StreamId(stream), id),
                num_records: Some(id * 10),
                wal_handle: Some(WalRecordHandle { segment: "log-0-1000".into(), offset: id * 64, length: 64 }),
            },
        }
    }

    fn sample_batch() -> EventBatch {
        vec![
            TrackerEvent::BlockAddition(info(0, 1)),
            TrackerEvent::BatchAllocation {
                time: Time::from_millis(2000),
                blocks: BTreeMap::from([(StreamId(0), vec![info(0, 1)])]),
            },
            TrackerEvent::BatchCleanup { times: vec![Time::from_millis(1000)], last_allocated: None },
        ]
    }

    #[test]
    fn batch_round_trips() {
        let mut buf = Vec::new();
        encode_batch(&sample_batch(), &mut buf).unwrap();
        assert_eq!(decode_batch(&buf).unwrap(), sample_batch());
    }

    #[test]
    fn newer_format_is_refused_with_its_version() {
        let buf = FrameCodec::new(EVENT_FORMAT_VERSION + 1).encode(&sample_batch()).unwrap();
        match decode_batch(&buf) {
            Err(DecodeFailure::Newer { found }) => assert_eq!(found, EVENT_FORMAT_VERSION + 1),
            other => panic!("expected a newer-format failure, got {other:?}"),
        }
    }

    #[test]
    fn damage_and_trailing_bytes_are_refused() {
        let mut buf = Vec::new();
        encode_batch(&sample_batch(), &mut buf).unwrap();
        let mut damaged = buf.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(matches!(decode_batch(&damaged), Err(DecodeFailure::Damaged(_))));
        buf.push(0);
        assert!(matches!(decode_batch(&buf), Err(DecodeFailure::Damaged(_))));
    }
}
