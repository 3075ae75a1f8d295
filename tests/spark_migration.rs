//! Moving a Spark Structured Streaming query to spate: the log store reads
//! a checkpoint written by Spark (hand-written here in Spark 3's layout),
//! finds where the query stands, and the Kafka source's offsets of the last
//! committed batch become spate-kafka's starting offsets, so the spate job
//! neither skips nor re-reads what Spark committed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use spate::core::{BatchId, Time};
use spate::kafka::{StartingOffsets, TopicPartition, partition_offsets_from_json};
use spate::logstore::{Checkpoint, CheckpointSettings, Verdict};

const CONF: &str = r#"{"spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider","spark.sql.streaming.multipleWatermarkPolicy":"min","spark.sql.shuffle.partitions":"200"}"#;

fn write(dir: &Path, relative: &str, body: &str) {
    let path = dir.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
}

/// Batches 0 and 1 committed, batch 2 planned only: Spark's state after a crash mid-batch.
fn spark_checkpoint(dir: &Path) {
    write(dir, "metadata", r#"{"id":"9d3c0a57-1e2f-4b6a-8c7d-0e1f2a3b4c5d"}"#);
    let batches = [
        (0, r#"{"events":{"1":10,"0":8}}"#),
        (1, r#"{"events":{"1":40,"0":36}}"#),
        (2, r#"{"events":{"1":52,"0":41}}"#),
    ];
    for (id, kafka) in batches {
        let time = 1_700_000_000_000_i64 + 10_000 * id;
        let body = format!("v1\n{{\"batchWatermarkMs\":0,\"batchTimestampMs\":{time},\"conf\":{CONF}}}\n{kafka}");
        write(dir, &format!("offsets/{id}"), &body);
        write(dir, &format!("offsets/.{id}.crc"), "\0\0\0\0");
    }
    for id in 0..2 {
        write(dir, &format!("commits/{id}"), "v1\n{\"nextBatchWatermarkMs\":0}");
    }
    write(dir, "sources/0/0", "v1\n{\"events\":{\"1\":0,\"0\":0}}");
}

#[test]
fn a_spark_checkpoint_gives_the_kafka_starting_offsets_of_its_last_committed_batch() {
    let dir = tempfile::tempdir().unwrap();
    spark_checkpoint(dir.path());

    let checkpoint = Checkpoint::open_read_only(dir.path(), CheckpointSettings::new()).unwrap();
    assert_eq!(checkpoint.metadata().unwrap().id, "9d3c0a57-1e2f-4b6a-8c7d-0e1f2a3b4c5d");
    let Verdict::Rerun { batch, offsets, .. } = checkpoint.verdict().unwrap() else { panic!("expected a re-run") };
    assert_eq!(batch, BatchId(2));
    assert_eq!(offsets.batch_timestamp, Time::from_millis(1_700_000_020_000));
    assert_eq!(offsets.conf.get("spark.sql.shuffle.partitions").map(String::as_str), Some("200"));

    // Spark names sources by position; the Kafka source is source "0".
    let committed = checkpoint.offsets().get(batch.prev().unwrap()).unwrap().unwrap();
    let kafka = committed.offset_of("0").flatten().unwrap().to_string();
    let start = partition_offsets_from_json(&kafka).unwrap();
    let partition = |p: i32| TopicPartition { topic: "events".to_string(), partition: p };
    assert_eq!(start.get(&partition(0)), Some(&36));
    assert_eq!(start.get(&partition(1)), Some(&40));
    assert!(matches!(StartingOffsets::Spec(start), StartingOffsets::Spec(ref s) if s.len() == 2));

    // Reading changed nothing: Spark could still run on it.
    assert!(!dir.path().join("LOCK").exists());
    assert_eq!(std::fs::read_dir(dir.path().join("commits")).unwrap().count(), 2);
}
