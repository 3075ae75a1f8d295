//! Damaged log files give clear errors that name the file, and no input
//! makes the parsers panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};
use spate_core::{BatchId, Time};
use spate_logstore::{
    CommitLog, CommitMetadata, LocalFileManager, LogStoreError, OffsetLog, OffsetSeq, SourceOffset, decode_entry,
    encode_entry,
};

fn sample() -> OffsetSeq {
    OffsetSeq {
        batch_watermark: Time::from_millis(12_000),
        batch_timestamp: Time::from_millis(1_700_000_000_000),
        conf: BTreeMap::from([("spate.state.partitions".to_string(), "4".to_string())]),
        sources: vec![
            SourceOffset::new("kafka-in", Some(json!({"topic": {"0": 36, "1": 12}}))),
            SourceOffset::new("socket", None),
        ],
    }
}

#[test]
fn damaged_files_in_a_log_give_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = OffsetLog::open(Arc::new(LocalFileManager), dir.path()).unwrap();
    let cases: [(&[u8], &str); 6] = [
        (b"", "the file is empty"),
        (b"v2\n{}\n-", "written by a newer spate (log format v2, this build reads up to v1)"),
        (b"v1", "missing the metadata line"),
        (b"v1\n{\"batchWatermarkMs\":", "metadata"),
        (b"v1\n{}\n{\"topic\":", "line 3"),
        (b"\x89PNG\r\n", "not UTF-8"),
    ];
    for (id, (bytes, expected)) in cases.iter().enumerate() {
        let path = log.path_of(BatchId(id as u64));
        std::fs::write(&path, bytes).unwrap();
        let message = log.get(BatchId(id as u64)).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(expected), "{bytes:?}: {message}");
    }
    let newer = log.get(BatchId(1)).unwrap_err();
    assert!(matches!(newer, LogStoreError::NewerVersion { found: 2, supported: 1, .. }));
}

#[test]
fn every_truncation_of_an_offsets_file_is_an_error() {
    let bytes = encode_entry(&sample()).unwrap();
    let path = Path::new("/ck/offsets/5");
    assert_eq!(decode_entry::<OffsetSeq>(path, &bytes).unwrap(), sample());
    for len in 0..bytes.len() {
        let err = decode_entry::<OffsetSeq>(path, &bytes[..len]).expect_err("a torn offsets file must not decode");
        assert!(err.to_string().contains("/ck/offsets/5"), "{err}");
    }
}

#[test]
fn truncated_commit_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = CommitLog::open(Arc::new(LocalFileManager), dir.path()).unwrap();
    assert!(log.add(BatchId(0), &CommitMetadata::new(Time::from_millis(99))).unwrap());
    let full = std::fs::read(log.path_of(BatchId(0))).unwrap();
    for len in 0..full.len() {
        std::fs::write(log.path_of(BatchId(1)), &full[..len]).unwrap();
        let err = log.get(BatchId(1)).unwrap_err();
        assert!(err.to_string().contains(&log.path_of(BatchId(1)).display().to_string()), "{err}");
    }
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(".{0,6}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn offset_seq() -> impl Strategy<Value = OffsetSeq> {
    let sources = prop::collection::btree_map("[^\\n]{1,10}", prop::option::of(json_value()), 0..4);
    (any::<i64>(), any::<i64>(), prop::collection::btree_map(".{0,8}", ".{0,8}", 0..3), sources).prop_map(
        |(watermark, timestamp, conf, sources)| OffsetSeq {
            batch_watermark: Time::from_millis(watermark),
            batch_timestamp: Time::from_millis(timestamp),
            conf,
            sources: sources.into_iter().map(|(name, offset)| SourceOffset::new(name, offset)).collect(),
        },
    )
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_and_errors_name_the_file(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let path = Path::new("/ck/offsets/17");
        if let Err(e) = decode_entry::<OffsetSeq>(path, &bytes) {
            prop_assert!(e.to_string().contains("/ck/offsets/17"));
        }
        if let Err(e) = decode_entry::<CommitMetadata>(path, &bytes) {
            prop_assert!(e.to_string().contains("/ck/offsets/17"));
        }
    }

    #[test]
    fn text_that_looks_like_a_log_never_panics(
        version in "v[0-9]{0,3}",
        lines in prop::collection::vec("[-{}\":,0-9a-z\\[\\] ]{0,30}", 0..5),
    ) {
        let text = format!("{version}\n{}", lines.join("\n"));
        let path = Path::new("/ck/commits/3");
        if let Err(e) = decode_entry::<OffsetSeq>(path, text.as_bytes()) {
            prop_assert!(e.to_string().contains("/ck/commits/3"));
        }
        let _ = decode_entry::<CommitMetadata>(path, text.as_bytes());
    }

    #[test]
    fn offsets_round_trip(seq in offset_seq()) {
        let bytes = encode_entry(&seq).unwrap();
        let back: OffsetSeq = decode_entry(Path::new("offsets/0"), &bytes).unwrap();
        prop_assert_eq!(back, seq);
    }
}

#[test]
fn entries_spate_writes_carry_a_checksum_that_catches_a_changed_digit() {
    let dir = tempfile::tempdir().unwrap();
    let log = OffsetLog::open(Arc::new(LocalFileManager), dir.path()).unwrap();
    assert!(log.add(BatchId(0), &sample()).unwrap());
    let path = log.path_of(BatchId(0));
    let text = std::fs::read_to_string(&path).unwrap();
    let meta_line = text.lines().nth(1).unwrap();
    assert!(meta_line.contains(r#","crc32c":""#) && meta_line.ends_with("\"}"), "{meta_line}");
    // Still a JSON object with Spark's fields, which Spark's reader takes as it is.
    let meta: Value = serde_json::from_str(meta_line).unwrap();
    assert_eq!(meta["batchTimestampMs"], json!(1_700_000_000_000i64));

    // Still valid JSON, still a plausible offset: only the checksum can tell.
    std::fs::write(&path, text.replace(r#""0":36"#, r#""0":37"#)).unwrap();
    let err = log.get(BatchId(0)).unwrap_err();
    assert!(matches!(err, LogStoreError::ChecksumMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}

#[test]
fn commit_checksums_catch_damage_and_a_damaged_field_is_named() {
    let bytes = encode_entry(&CommitMetadata::new(Time::from_millis(42))).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let path = Path::new("/ck/commits/9");
    assert_eq!(
        decode_entry::<CommitMetadata>(path, text.as_bytes()).unwrap(),
        CommitMetadata::new(Time::from_millis(42))
    );
    let changed = text.replace(":42,", ":43,");
    assert!(matches!(
        decode_entry::<CommitMetadata>(path, changed.as_bytes()),
        Err(LogStoreError::ChecksumMismatch { .. })
    ));
    let hex_at = text.find(r#""crc32c":""#).unwrap() + r#""crc32c":""#.len();
    for damaged in [
        format!("{}zz{}", &text[..hex_at], &text[hex_at + 2..]),
        format!("{}{}", &text[..hex_at + 4], &text[hex_at + 8..]),
        text.replace(r#","crc32c""#, r#" "crc32c""#),
    ] {
        let err = decode_entry::<CommitMetadata>(path, damaged.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("/ck/commits/9") && err.contains("checksum"), "{damaged}: {err}");
    }
}

#[test]
fn entries_without_a_checksum_are_read_as_spark_writes_them() {
    let path = Path::new("/ck/offsets/1");
    let spark = "v1\n{\"batchWatermarkMs\":0,\"batchTimestampMs\":5,\"conf\":{}}\n{\"t\":{\"0\":1}}";
    let seq: OffsetSeq = decode_entry(path, spark.as_bytes()).unwrap();
    assert_eq!(seq.offset_of("0"), Some(Some(&json!({"t": {"0": 1}}))));
    let commit: CommitMetadata = decode_entry(path, b"v1\n{\"nextBatchWatermarkMs\":3}").unwrap();
    assert_eq!(commit, CommitMetadata::new(Time::from_millis(3)));
    // An empty object gets its checksum too, and reads back.
    let bytes = encode_entry(&spate_logstore::Json(serde_json::Map::new())).unwrap();
    assert!(
        bytes.starts_with(
            br#"v1
{"crc32c":""#
        ),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let back: spate_logstore::Json<serde_json::Map<String, Value>> = decode_entry(path, &bytes).unwrap();
    assert!(back.0.is_empty());
}

#[test]
fn unknown_versions_are_refused_before_the_checksum() {
    let bytes = encode_entry(&CommitMetadata::default()).unwrap();
    let newer = [b"v7".as_slice(), &bytes[2..]].concat();
    let err = decode_entry::<CommitMetadata>(Path::new("/ck/commits/1"), &newer).unwrap_err();
    assert!(matches!(err, LogStoreError::NewerVersion { found: 7, supported: 1, .. }), "{err:?}");
}
