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
#[cfg(test)]
pub(crate) fn decode_batch(record: &[u8]) -> Result<EventBatch, DecodeFailure> {
    let mut events = EventBatch::new();
    for_each_event(record, |event| events.push(event))?;
    Ok(events)
}

/// Decodes one log record and hands its events to `apply` in order; returns
/// how many there were. Nothing is handed over unless the whole record
/// decodes, so a damaged record never half-applies.
///
/// A record of one event (the common shape: a lone block addition) is
/// decoded without building a `Vec` for it: bincode writes the sequence
/// length as a one-byte varint, followed by the event's own encoding.
pub(crate) fn for_each_event(record: &[u8], mut apply: impl FnMut(TrackerEvent)) -> Result<usize, DecodeFailure> {
    let payload = open_record(record)?;
    let codec = event_codec();
    // Version 1 is the only format so far; a later version adds its arm here
    // and keeps this one, so old logs stay readable.
    if let Some((1, event_bytes)) = payload.split_first() {
        apply(codec.decode_payload::<TrackerEvent>(event_bytes).map_err(DecodeFailure::Damaged)?);
        return Ok(1);
    }
    let events = codec.decode_payload::<EventBatch>(payload).map_err(DecodeFailure::Damaged)?;
    let count = events.len();
    events.into_iter().for_each(apply);
    Ok(count)
}

/// Checks the record's frame (CRC, version, no trailing bytes) and returns
/// its payload.
fn open_record(record: &[u8]) -> Result<&[u8], DecodeFailure> {
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
    Ok(raw.payload)
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
    fn one_event_records_decode_as_the_general_path_does() {
        for event in sample_batch() {
            let mut buf = Vec::new();
            encode_batch(std::slice::from_ref(&event), &mut buf).unwrap();
            assert_eq!(decode_batch(&buf).unwrap(), vec![event.clone()]);
            let raw = event_codec().open(&buf).unwrap();
            let general: EventBatch = event_codec().decode_payload(raw.payload).unwrap();
            assert_eq!(general, vec![event]);
        }
        let mut empty = Vec::new();
        encode_batch(&[], &mut empty).unwrap();
        assert_eq!(decode_batch(&empty).unwrap(), EventBatch::new());
    }

    #[test]
    fn one_event_record_with_extra_payload_bytes_is_refused() {
        let mut payload = bincode_payload_of_one(&sample_batch()[0]);
        payload.push(0);
        let frame = FrameCodec::new(EVENT_FORMAT_VERSION).encode(&RawBytes(&payload)).unwrap();
        let mut applied = 0;
        let outcome = for_each_event(&frame, |_| applied += 1);
        assert!(matches!(outcome, Err(DecodeFailure::Damaged(_))), "{outcome:?}");
        assert_eq!(applied, 0);
    }

    /// The payload of a one-event record, taken out of a real frame.
    fn bincode_payload_of_one(event: &TrackerEvent) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_batch(std::slice::from_ref(event), &mut buf).unwrap();
        event_codec().open(&buf).unwrap().payload.to_vec()
    }

    /// Serializes as its bytes verbatim (a tuple of u8 has no length prefix).
    struct RawBytes<'a>(&'a [u8]);

    impl Serialize for RawBytes<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeTuple;
            let mut tuple = serializer.serialize_tuple(self.0.len())?;
            for byte in self.0 {
                tuple.serialize_element(byte)?;
            }
            tuple.end()
        }
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
