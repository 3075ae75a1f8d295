//! The tracker's events and their encoding in the event log.
//!
//! One log record holds one [`EventBatch`]: the events that were committed
//! together (several block additions that arrived at once, or one
//! allocation, or one cleanup), inside a versioned, checksummed
//! [`FrameCodec`] frame. The frame's version picks the decoder
//! ([`decode_event_record`]); a later spate keeps a decoder for every older
//! format version, and a record of a newer or unknown version is refused
//! naming its version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, FrameCodec, RawFrame, ReceivedBlockInfo, StreamId, Time};

use crate::error::TrackerError;

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

impl TrackerEvent {
    /// What logging this event is, for the error of a tracker that a panic
    /// interrupted while it did so.
    pub(crate) fn activity(&self) -> &'static str {
        match self {
            TrackerEvent::BlockAddition(_) => "logging block additions",
            TrackerEvent::BatchAllocation { .. } => "logging a batch allocation",
            TrackerEvent::BatchCleanup { .. } => "logging a batch cleanup",
        }
    }
}

/// The events of one log record, committed together.
pub type EventBatch = Vec<TrackerEvent>;

/// The frame codec of the event log.
pub(crate) const fn event_codec() -> FrameCodec {
    FrameCodec::new(EVENT_FORMAT_VERSION)
}

/// Appends the frame of `events` to `out` (which is cleared first).
pub(crate) fn encode_batch(events: &[TrackerEvent], out: &mut Vec<u8>) -> Result<(), CoreError> {
    out.clear();
    event_codec().encode_into(events, out)
}

/// Encodes `events` as one event-log record, in the current format
/// ([`EVENT_FORMAT_VERSION`]): what the tracker appends to its log.
pub fn encode_event_record(events: &[TrackerEvent]) -> Result<Vec<u8>, TrackerError> {
    let mut out = Vec::new();
    encode_batch(events, &mut out).map_err(|source| TrackerError::Encode {
        what: events.first().map(TrackerEvent::describe).unwrap_or_else(|| "an empty record".into()),
        source,
    })?;
    Ok(out)
}

/// Decodes one event-log record into its events: a pure function of the
/// bytes, for replay and for fuzzing.
///
/// The record is a [`FrameCodec`] frame; the decoder is picked by the
/// format version in its (checksummed) header, never by the shape of the
/// payload. A version above [`EVENT_FORMAT_VERSION`] is
/// [`TrackerError::NewerFormat`], one no spate wrote (0) is
/// [`TrackerError::UnknownFormat`], and anything else that does not decode
/// (checksum, flags, bounds, trailing bytes) is [`TrackerError::CorruptRecord`].
/// Decoding is bounded by the codec's payload and allocation limits.
pub fn decode_event_record(record: &[u8]) -> Result<EventBatch, TrackerError> {
    let mut events = EventBatch::new();
    for_each_event(record, |event| events.push(event))?;
    Ok(events)
}

/// Decodes one log record and hands its events to `apply` in order; returns
/// how many there were. Nothing is handed over unless the whole record
/// decodes, so a damaged record never half-applies.
pub(crate) fn for_each_event(record: &[u8], apply: impl FnMut(TrackerEvent)) -> Result<usize, TrackerError> {
    let raw = open_record(record)?;
    // One arm per format ever written; a later format adds its arm and
    // keeps the older ones, so old logs stay readable.
    match raw.version {
        1 => for_each_event_v1(raw.payload, apply)
            .map_err(|source| TrackerError::CorruptRecord { version: Some(raw.version), source }),
        found => Err(TrackerError::UnknownFormat { found, supported: EVENT_FORMAT_VERSION }),
    }
}

/// Format 1: the payload is the bincode (standard configuration) encoding
/// of an [`EventBatch`], a sequence of events.
///
/// A sequence of one event (the common record: a lone block addition) is
/// decoded without building a `Vec` for it. That is the same layout read
/// faster, not another format: bincode writes the sequence length as a
/// varint, one byte (1) for a single element, followed by the element.
fn for_each_event_v1(payload: &[u8], mut apply: impl FnMut(TrackerEvent)) -> Result<usize, CoreError> {
    let codec = event_codec();
    if let Some((1, event_bytes)) = payload.split_first() {
        apply(codec.decode_payload::<TrackerEvent>(event_bytes)?);
        return Ok(1);
    }
    let events = codec.decode_payload::<EventBatch>(payload)?;
    let count = events.len();
    events.into_iter().for_each(apply);
    Ok(count)
}

/// Checks the record's frame (magic, CRC, version bound, flags, no
/// trailing bytes) and returns it.
fn open_record(record: &[u8]) -> Result<RawFrame<'_>, TrackerError> {
    let raw = event_codec().open(record).map_err(|e| match e {
        CoreError::NewerVersion { found, supported } => TrackerError::NewerFormat { found, supported },
        source => TrackerError::CorruptRecord { version: None, source },
    })?;
    if raw.frame_len != record.len() {
        let trailing = record.len() - raw.frame_len;
        return Err(TrackerError::CorruptRecord {
            version: Some(raw.version),
            source: CoreError::Decode { reason: format!("{trailing} bytes after the event frame") },
        });
    }
    Ok(raw)
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
        assert_eq!(decode_event_record(&buf).unwrap(), sample_batch());
    }

    #[test]
    fn one_event_records_decode_as_the_general_path_does() {
        for event in sample_batch() {
            let mut buf = Vec::new();
            encode_batch(std::slice::from_ref(&event), &mut buf).unwrap();
            assert_eq!(decode_event_record(&buf).unwrap(), vec![event.clone()]);
            let raw = event_codec().open(&buf).unwrap();
            let general: EventBatch = event_codec().decode_payload(raw.payload).unwrap();
            assert_eq!(general, vec![event]);
        }
        let mut empty = Vec::new();
        encode_batch(&[], &mut empty).unwrap();
        assert_eq!(decode_event_record(&empty).unwrap(), EventBatch::new());
    }

    #[test]
    fn one_event_record_with_extra_payload_bytes_is_refused() {
        let mut payload = bincode_payload_of_one(&sample_batch()[0]);
        payload.push(0);
        let frame = FrameCodec::new(EVENT_FORMAT_VERSION).encode(&RawBytes(&payload)).unwrap();
        let mut applied = 0;
        let outcome = for_each_event(&frame, |_| applied += 1);
        assert!(matches!(outcome, Err(TrackerError::CorruptRecord { version: Some(1), .. })), "{outcome:?}");
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
        match decode_event_record(&buf) {
            Err(err @ TrackerError::NewerFormat { found, .. }) => {
                assert_eq!(found, EVENT_FORMAT_VERSION + 1);
                assert!(err.to_string().contains(&format!("event format {found}")), "{err}");
            }
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
        assert!(matches!(decode_event_record(&damaged), Err(TrackerError::CorruptRecord { .. })));
        buf.push(0);
        assert!(matches!(decode_event_record(&buf), Err(TrackerError::CorruptRecord { .. })));
    }

    #[test]
    fn a_record_of_a_format_no_spate_wrote_is_refused_naming_its_version() {
        // A valid format-1 payload under version 0: the version, not the
        // payload's shape, decides how a record is read.
        let buf = FrameCodec::new(0).encode(&sample_batch()).unwrap();
        match decode_event_record(&buf) {
            Err(err @ TrackerError::UnknownFormat { found: 0, .. }) => {
                assert!(err.to_string().contains("event format 0 is unknown"), "{err}");
            }
            other => panic!("expected an unknown-format failure, got {other:?}"),
        }
        let one = FrameCodec::new(0).encode(&sample_batch()[..1]).unwrap();
        assert!(matches!(decode_event_record(&one), Err(TrackerError::UnknownFormat { found: 0, .. })));
    }

    /// A record as spate has written it to `receivedBlockMetadata/` since
    /// format 1 (a block addition with a WAL handle): it must stay readable.
    const FORMAT_1_RECORD: &str =
        "53505446010000001a000000f3d5bfe101000201460002070146010a6c6f672d302d31303030fbc00140";

    #[test]
    fn a_format_1_record_written_before_stays_readable() {
        let bytes = hex_decode(FORMAT_1_RECORD);
        assert_eq!(decode_event_record(&bytes).unwrap(), vec![TrackerEvent::BlockAddition(info(2, 7))]);
        assert_eq!(encode_event_record(&[TrackerEvent::BlockAddition(info(2, 7))]).unwrap(), bytes);
    }

    fn hex_decode(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }
}
