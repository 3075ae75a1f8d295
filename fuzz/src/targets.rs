//! The targets: one function a decoder, and its seeds.

use std::path::Path;

use serde::{Deserialize, Serialize};
use spate_core::{
    BatchId, BlockStoreResult, FrameCodec, ReceivedBlockInfo, StreamBlockId, StreamId, Time, WalRecordHandle,
};
use spate_logstore::{
    CheckpointMetadata, CommitMetadata, LockHolder, OffsetSeq, SourceOffset, StateLink, changes_header, decode_entry,
    decode_lock_file, decode_metadata, encode_entry, encode_lock_file, split_state_file,
};
use spate_tracker::{EVENT_FORMAT_VERSION, StreamBlocks, TrackerEvent};
use spate_wal::{FileWriteAheadLog, WalSettings, WriteAheadLog};

use crate::{Target, mode, raw, wrapped};

/// Every target, by name.
pub static TARGETS: &[Target] = &[
    Target { name: "frame", run: frame, seeds: frame_seeds },
    Target { name: "log_entry", run: log_entry, seeds: log_entry_seeds },
    Target { name: "lock_file", run: lock_file, seeds: lock_file_seeds },
    Target { name: "kafka_offsets", run: kafka_offsets, seeds: kafka_offsets_seeds },
    Target { name: "metadata", run: metadata, seeds: metadata_seeds },
    Target { name: "tracker_event", run: tracker_event, seeds: tracker_event_seeds },
    Target { name: "block", run: block, seeds: block_seeds },
    Target { name: "wal_segment", run: wal_segment, seeds: wal_segment_seeds },
    Target { name: "wal_record", run: wal_record, seeds: wal_record_seeds },
    Target { name: "file_manifest", run: file_manifest, seeds: file_manifest_seeds },
];

/// A record with the shapes frames carry: integers, strings, sequences, options.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Sample {
    batch: BatchId,
    name: String,
    values: Vec<u64>,
    note: Option<Vec<u8>>,
}

const FRAME_CODEC: FrameCodec = FrameCodec::new(2).with_max_payload(1 << 20).with_max_decoded(1 << 20);

/// The record frame of spate-core: header checks, then bincode behind it.
fn frame(input: &[u8]) {
    let (wrap, rest) = mode(input);
    let bytes = if wrap { frame_around(rest) } else { rest.to_vec() };
    if let Ok(decoded) = FRAME_CODEC.decode::<Sample>(&bytes) {
        // What decodes encodes back to a frame that decodes to the same value.
        let again = FRAME_CODEC.encode(&decoded.value).map(|b| FRAME_CODEC.decode::<Sample>(&b).map(|f| f.value));
        assert!(matches!(again, Ok(Ok(ref v)) if *v == decoded.value), "frame round trip changed {decoded:?}");
    }
    let _ = FRAME_CODEC.open(&bytes);
    state_file(&bytes);
}

/// An operator state file: a frame (a whole snapshot), or a header of
/// changes naming its base batch and then a frame.
fn state_file(bytes: &[u8]) {
    if let Ok((_, frame)) = split_state_file(bytes) {
        let _ = FRAME_CODEC.open(frame);
    }
    // What a header is put in front of reads back as that header and the same bytes.
    let base = BatchId(bytes.len() as u64);
    let changes = [changes_header(base).as_slice(), bytes].concat();
    let split = split_state_file(&changes);
    assert_eq!(split, Ok((StateLink::Changes { base }, bytes)), "a header of changes does not read back");
}

/// `payload` inside a valid frame header with its checksum.
fn frame_around(payload: &[u8]) -> Vec<u8> {
    frame_around_with(FRAME_CODEC, payload)
}

/// `payload` inside a valid header of `codec` with its checksum.
fn frame_around_with(codec: FrameCodec, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let written = codec.encode_with(&mut out, |out| {
        out.extend_from_slice(payload);
        Ok(())
    });
    if written.is_err() { payload.to_vec() } else { out }
}

fn frame_seeds() -> Vec<Vec<u8>> {
    let sample =
        Sample { batch: BatchId(7), name: "words".into(), values: vec![1, 300, u64::MAX], note: Some(vec![9]) };
    let mut seeds = Vec::new();
    if let Ok(bytes) = FRAME_CODEC.encode(&sample) {
        seeds.push(wrapped(bytes.get(spate_core::FRAME_HEADER_LEN..).unwrap_or_default().to_vec()));
        seeds.push(raw([changes_header(BatchId(6)).as_slice(), &bytes].concat()));
        seeds.push(raw(bytes));
    }
    seeds
}

/// `offsets/N` and `commits/N` entries (a version line, then JSON).
fn log_entry(input: &[u8]) {
    let (_, rest) = mode(input);
    let path = Path::new("offsets/0");
    if let Ok(entry) = decode_entry::<OffsetSeq>(path, rest) {
        let again = encode_entry(&entry).map(|b| decode_entry::<OffsetSeq>(path, &b).map(|e| e == entry));
        assert!(matches!(again, Ok(Ok(true))), "offsets entry round trip changed {entry:?}");
    }
    let _ = decode_entry::<CommitMetadata>(Path::new("commits/0"), rest);
}

fn log_entry_seeds() -> Vec<Vec<u8>> {
    let offsets = OffsetSeq {
        batch_timestamp: Time::from_millis(1_700_000_000_000),
        sources: vec![
            SourceOffset::new("events", Some(serde_json::json!({"events": {"0": {"from": 0, "until": 36}}}))),
            SourceOffset::new("idle", None),
        ],
        ..OffsetSeq::default()
    };
    let spark = "v1\n{\"batchWatermarkMs\":0,\"batchTimestampMs\":1700000000000,\"conf\":{}}\n{\"t\":{\"0\":36}}";
    [encode_entry(&offsets), encode_entry(&CommitMetadata::default())]
        .into_iter()
        .flatten()
        .chain([spark.as_bytes().to_vec()])
        .map(raw)
        .collect()
}

/// The `LOCK` file: who holds the checkpoint (a `v1` entry, or the bare
/// JSON of older versions).
fn lock_file(input: &[u8]) {
    let (_, rest) = mode(input);
    let path = Path::new("LOCK");
    if let Ok(holder) = decode_lock_file(path, rest) {
        let again = encode_lock_file(path, &holder).map(|b| decode_lock_file(path, &b).map(|h| h == holder));
        assert!(matches!(again, Ok(Ok(true))), "lock file round trip changed {holder:?}");
    }
}

fn lock_holder() -> LockHolder {
    LockHolder { pid: 4242, host: "worker-1".into(), since: Time::from_millis(1_700_000_000_000), epoch: 3 }
}

fn lock_file_seeds() -> Vec<Vec<u8>> {
    let holder = lock_holder();
    let path = Path::new("LOCK");
    [encode_lock_file(path, &holder).ok(), serde_json::to_vec(&holder).ok()].into_iter().flatten().map(raw).collect()
}

/// Kafka offsets as JSON: `--starting-offsets` and the ranges in `offsets/N`.
fn kafka_offsets(input: &[u8]) {
    let (_, rest) = mode(input);
    if let Ok(offsets) = spate_kafka::partition_offsets_from_json_bytes(rest) {
        let json = spate_kafka::partition_offsets_to_json(&offsets);
        let again = spate_kafka::partition_offsets_from_json(&json);
        assert!(matches!(again, Ok(ref o) if *o == offsets), "Kafka offsets round trip changed {offsets:?}");
    }
    if let Ok(ranges) = spate_kafka::OffsetRanges::from_json_bytes(rest) {
        let again = spate_kafka::OffsetRanges::from_json(&ranges.to_json());
        assert!(matches!(again, Ok(ref r) if *r == ranges), "Kafka ranges round trip changed {ranges:?}");
    }
}

fn kafka_offsets_seeds() -> Vec<Vec<u8>> {
    [r#"{"words":{"0":36,"1":-2,"2":-1}}"#, r#"{"words":{"0":{"from":0,"until":36},"5":{"from":7,"until":7}}}"#]
        .into_iter()
        .map(raw)
        .collect()
}

/// A checkpoint's `metadata`: spate's (`v1`, checksummed) or Spark's bare JSON.
fn metadata(input: &[u8]) {
    let (_, rest) = mode(input);
    let path = Path::new("metadata");
    if let Ok(metadata) = decode_metadata(path, rest) {
        let again = encode_entry(&spate_logstore::Json(metadata.clone()))
            .map(|b| decode_metadata(path, &b).map(|m| m == metadata));
        assert!(matches!(again, Ok(Ok(true))), "metadata round trip changed {metadata:?}");
    }
}

fn metadata_seeds() -> Vec<Vec<u8>> {
    let ours =
        CheckpointMetadata { id: "6f1f8a52-4a1b-4c36-9d1e-1f2e3d4c5b6a".into(), created_at: Time::from_millis(7) };
    let spark = br#"{"id":"0b5e5b52-3f7a-4ad4-a2d5-b7a5e0f0c6a1"}"#.to_vec();
    encode_entry(&spate_logstore::Json(ours)).into_iter().chain([spark]).map(raw).collect()
}

/// A file sink's batch manifest (`_manifests/<time>-<id>.json`, and the
/// decided one in a staging directory), checked against the batch it
/// claims; and batch names as the sink parses them from listings.
fn file_manifest(input: &[u8]) {
    let (_, rest) = mode(input);
    if let Some(key) = std::str::from_utf8(rest).ok().and_then(spate_files::BatchKey::parse) {
        assert_eq!(spate_files::BatchKey::parse(&key.name()), Some(key), "batch name round trip changed {key:?}");
    }
    let Ok(claimed) = serde_json::from_slice::<spate_files::Manifest>(rest) else { return };
    if let Ok(manifest) = spate_files::Manifest::decode(rest, claimed.key()) {
        let again = spate_files::Manifest::decode(&manifest.encode(), manifest.key());
        assert!(matches!(again, Ok(ref m) if *m == manifest), "manifest round trip changed {manifest:?}");
    }
}

fn file_manifest_seeds() -> Vec<Vec<u8>> {
    let key = spate_files::BatchKey::new(Time::from_millis(1_796_494_029_000), BatchId(7));
    let file = |index: u32, hour: &str| spate_files::ManifestFile {
        path: format!("dt=2026-12-05/{hour}/{}", key.file_name(index)),
        records: 3,
        bytes: 120,
        crc32c: 0x0bad_cafe,
    };
    let manifest = spate_files::Manifest::new(key, vec![file(0, "hour=18"), file(1, "hm=18%3A07")]);
    [manifest.encode(), key.name().into_bytes()].into_iter().map(raw).collect()
}

const TRACKER_CODEC: FrameCodec = FrameCodec::new(EVENT_FORMAT_VERSION);

/// A record of the block tracker's event log (a frame of events).
fn tracker_event(input: &[u8]) {
    let (wrap, rest) = mode(input);
    let bytes = if wrap { frame_around_with(TRACKER_CODEC, rest) } else { rest.to_vec() };
    if let Ok(events) = spate_tracker::decode_event_record(&bytes) {
        let again = spate_tracker::encode_event_record(&events)
            .map(|b| spate_tracker::decode_event_record(&b).map(|e| e == events));
        assert!(matches!(again, Ok(Ok(true))), "tracker record round trip changed {events:?}");
    }
}

fn tracker_event_seeds() -> Vec<Vec<u8>> {
    let info = |n: u64| ReceivedBlockInfo {
        stream_id: StreamId(1),
        num_records: Some(n),
        metadata: Some(vec![1, 2, 3]),
        store_result: BlockStoreResult {
            block_id: StreamBlockId::new(StreamId(1), n),
            num_records: Some(n),
            wal_handle: Some(WalRecordHandle { segment: "log-0-60000-e1".into(), offset: 4096 * n, length: 512 }),
        },
    };
    let mut blocks = StreamBlocks::new();
    blocks.insert(StreamId(1), vec![info(1), info(2)]);
    let events = vec![
        TrackerEvent::BlockAddition(info(3)),
        TrackerEvent::BatchAllocation { time: Time::from_millis(2_000), blocks },
        TrackerEvent::BatchCleanup {
            times: vec![Time::from_millis(1_000)],
            last_allocated: Some(Time::from_millis(2_000)),
        },
    ];
    let mut seeds = Vec::new();
    if let Ok(bytes) = spate_tracker::encode_event_record(&events) {
        seeds.push(wrapped(bytes.get(spate_core::FRAME_HEADER_LEN..).unwrap_or_default().to_vec()));
        seeds.push(raw(bytes));
    }
    seeds
}

/// A received block (a frame of records), decoded and counted.
fn block(input: &[u8]) {
    let (wrap, rest) = mode(input);
    let codec = FrameCodec::new(spate_receiver::BLOCK_FORMAT_VERSION);
    let bytes = if wrap { frame_around_with(codec, rest) } else { rest.to_vec() };
    let count = spate_receiver::count_block_records(&bytes);
    if let Ok(records) = spate_receiver::decode_block::<String>(&bytes) {
        assert!(matches!(count, Ok(n) if n == records.len() as u64), "count {count:?} for {} records", records.len());
        let again = spate_receiver::encode_block(&records).map(|b| spate_receiver::decode_block::<String>(&b));
        assert!(matches!(again, Ok(Ok(ref r)) if *r == records), "block round trip changed {} records", records.len());
    }
    // Read a chunk at a time (as blocks are on arrival), a block reads as it
    // does whole, or fails as it does whole; through serde too.
    let whole = spate_receiver::decode_block::<String>(&bytes);
    let mut chunked = Vec::new();
    let read = spate_receiver::decode_block_in_chunks::<String>(&bytes, 3, |chunk| chunked.extend(chunk));
    match (&whole, read) {
        (Ok(records), Ok(())) => assert_eq!(*records, chunked, "chunks differ from the whole block"),
        (Err(_), Err(_)) => {}
        (whole, read) => panic!("whole: {:?}, in chunks: {read:?}", whole.as_ref().map(Vec::len)),
    }
    let mut pairs = Vec::new();
    let read = spate_receiver::decode_block_in_chunks::<(String, u64)>(&bytes, 2, |chunk| pairs.extend(chunk));
    if let (Ok(()), Ok(decoded)) = (read, spate_receiver::decode_block::<(String, u64)>(&bytes)) {
        assert_eq!(decoded, pairs, "pairs read in chunks differ from the whole block");
    }
}

fn block_seeds() -> Vec<Vec<u8>> {
    let words: Vec<String> = ["the", "quick", "", "brown", "fox"].iter().map(|w| (*w).to_string()).collect();
    let mut seeds = Vec::new();
    if let Ok(bytes) = spate_receiver::encode_block(&words) {
        seeds.push(wrapped(bytes.get(spate_core::FRAME_HEADER_LEN..).unwrap_or_default().to_vec()));
        seeds.push(raw(bytes));
    }
    seeds
}

/// The segment name every WAL target writes (legacy, unfenced: epoch 0).
const SEGMENT: &str = "log-0-60000";

/// A WAL directory holding one segment of arbitrary bytes: opened (which
/// recovers a torn tail) and read in order.
fn wal_segment(input: &[u8]) {
    let (_, rest) = mode(input);
    let Ok(dir) = tempfile::tempdir() else { return };
    if std::fs::write(dir.path().join(SEGMENT), rest).is_err() {
        return;
    }
    read_back(dir.path());
}

fn wal_segment_seeds() -> Vec<Vec<u8>> {
    valid_segment(&[b"block 1".as_slice(), &[0u8; 300], b"block 3"]).into_iter().map(raw).collect()
}

/// Valid records written through the log, then one byte of the segment
/// changed: the input is `[offset (2 bytes), xor mask, records…]`, the
/// records split at each `0xff`.
fn wal_record(input: &[u8]) {
    let (_, rest) = mode(input);
    let [hi, lo, mask, records @ ..] = rest else { return };
    let records: Vec<&[u8]> = records.split(|b| *b == 0xff).take(16).collect();
    let Ok(dir) = tempfile::tempdir() else { return };
    let Ok(handles) = write_records(dir.path(), &records) else { return };
    let path = dir.path().join(SEGMENT);
    let Ok(mut bytes) = std::fs::read(&path) else { return };
    if let Some(byte) =
        bytes.len().checked_sub(1).and_then(|last| bytes.get_mut(usize::from(u16::from_be_bytes([*hi, *lo])).min(last)))
    {
        *byte ^= *mask;
    }
    if std::fs::write(&path, &bytes).is_err() {
        return;
    }
    if let Some(log) = read_back(dir.path()) {
        for handle in &handles {
            let _ = log.read(handle);
        }
    }
}

fn wal_record_seeds() -> Vec<Vec<u8>> {
    // The offset is past the segment's 4 KiB header page, inside the first record.
    let offset = (4096u16 + 20).to_be_bytes();
    vec![raw([offset[0], offset[1], 0x40]
        .iter()
        .copied()
        .chain(*b"first\xffsecond record\xff\x00\x01")
        .collect::<Vec<u8>>())]
}

/// Opens the log at `dir` and reads every record; `None` when it does not open.
fn read_back(dir: &Path) -> Option<FileWriteAheadLog> {
    let log = FileWriteAheadLog::open(dir, WalSettings::default()).ok()?;
    if let Ok(records) = log.read_all() {
        for record in records.take(1 << 12) {
            if record.is_err() {
                break;
            }
        }
    }
    Some(log)
}

/// Writes `records` through a log at `dir` (all into [`SEGMENT`]) and closes it.
fn write_records(dir: &Path, records: &[&[u8]]) -> Result<Vec<WalRecordHandle>, spate_wal::WalError> {
    let log = FileWriteAheadLog::open(dir, WalSettings::default())?;
    let handles = records.iter().map(|r| log.write(r, Time::from_millis(0))).collect::<Result<Vec<_>, _>>()?;
    log.close()?;
    Ok(handles)
}

/// The bytes of a segment holding `records`, written by the log itself.
fn valid_segment(records: &[&[u8]]) -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().ok()?;
    write_records(dir.path(), records).ok()?;
    std::fs::read(dir.path().join(SEGMENT)).ok()
}
