//! Exactly-once outputs across crashes: the transactional RocksDB offset
//! store and the transactional Kafka sink, against the local broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{
    SOURCE, brokers, commit, create_topic, log_offsets, produce, read_committed, time_of, unique, value, values,
};
use spate_core::BatchId;
use spate_dstream::InputSource;
use spate_kafka::{
    CommitOutcome, DirectKafkaSettings, KafkaRecord, OffsetCommit, OffsetRanges, OutputRecord, RocksOffsetStore,
    StartingOffsets, TransactionalKafkaSink,
};
use spate_logstore::{Checkpoint, CheckpointSettings, Verdict};

/// The re-run a restart must do: the logged ranges of the batch after the last commit.
fn rerun_of(checkpoint: &Checkpoint) -> (u64, String) {
    let Verdict::Rerun { batch, offsets, .. } = checkpoint.verdict().unwrap() else { panic!("expected a re-run") };
    (batch.0, offsets.offset_of(SOURCE).unwrap().unwrap().to_string())
}

/// The sink of the store test: counts each record value, in the same write as the offsets.
fn apply_to_store(
    store: &RocksOffsetStore,
    batch: u64,
    ranges: &OffsetRanges,
    records: &[Vec<KafkaRecord>],
) -> CommitOutcome {
    store
        .commit_batch(BatchId(batch), ranges, |writes| {
            for record in records.iter().flatten() {
                let key = value(record);
                let seen = store.get(key.as_bytes())?.map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
                writes.put(key, (seen + 1).to_be_bytes());
            }
            Ok(())
        })
        .unwrap()
}

#[test]
fn the_transactional_store_holds_every_record_once_across_crashes_and_a_lost_checkpoint() {
    let topic = unique("store-eo");
    create_topic(&topic, 3);
    produce(&topic, 3, values(0..1_200));
    let store_dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RocksOffsetStore::open(store_dir.path()).unwrap());
    let checkpoint_dir = tempfile::tempdir().unwrap();
    let make = |group: &str, starting: StartingOffsets| {
        let config = DirectKafkaSettings::subscribe(brokers(), group, [topic.as_str()])
            .with_max_rate_per_partition(2_000)
            .with_starting_offsets(starting)
            .with_commit(OffsetCommit::TransactionalStore(Arc::clone(&store)));
        common::registered(config).unwrap()
    };

    {
        let stream = make("app-v1", StartingOffsets::Earliest);
        let checkpoint = Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();
        let ranges = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 0, &ranges);
        assert_eq!(apply_to_store(&store, 0, &ranges, &stream.read(&ranges).unwrap()), CommitOutcome::Committed);
        commit(&checkpoint, 0);
        // Batch 1: the store commits, then the process dies before commits/1.
        let ranges = stream.plan_batch(time_of(1), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 1, &ranges);
        assert_eq!(apply_to_store(&store, 1, &ranges, &stream.read(&ranges).unwrap()), CommitOutcome::Committed);
    }
    {
        // Restart: batch 1 is re-run with its logged ranges and recognised by the store.
        let stream = make("app-v1", StartingOffsets::Earliest);
        let checkpoint = Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();
        let (batch, planned) = rerun_of(&checkpoint);
        assert_eq!(batch, 1);
        let records = stream.compute(time_of(1), Some(&planned)).unwrap();
        let ranges = OffsetRanges::from_json(&planned).unwrap();
        assert_eq!(apply_to_store(&store, 1, &ranges, &records), CommitOutcome::AlreadyCommitted);
        commit(&checkpoint, 1);
        // Batch 2: offsets logged, the process dies before the store commit.
        let ranges = stream.plan_batch(time_of(2), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 2, &ranges);
        stream.read(&ranges).unwrap();
    }
    // The checkpoint directory is lost, and the code changed (another group,
    // starting at the latest offsets): the store's offsets still win.
    drop(checkpoint_dir);
    let checkpoint_dir = tempfile::tempdir().unwrap();
    let stream = make("app-v2", StartingOffsets::Latest);
    let checkpoint = Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();
    assert_eq!(checkpoint.verdict().unwrap(), Verdict::Fresh);
    for batch in 0.. {
        let ranges = stream.plan_batch(time_of(batch), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        if ranges.is_empty() {
            break;
        }
        log_offsets(&checkpoint, batch, &ranges);
        assert_eq!(apply_to_store(&store, batch, &ranges, &stream.read(&ranges).unwrap()), CommitOutcome::Committed);
        commit(&checkpoint, batch);
    }

    let results: BTreeMap<String, u64> = store
        .results()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).unwrap(), u64::from_be_bytes(v.try_into().unwrap())))
        .collect();
    assert_eq!(results.len(), 1_200, "every record is in the store");
    assert!(results.values().all(|count| *count == 1), "no record is counted twice");
    assert_eq!(results.keys().cloned().collect::<Vec<_>>(), {
        let mut v = values(0..1_200);
        v.sort();
        v
    });
}

#[test]
fn the_transactional_kafka_sink_writes_every_record_once_across_crashes_and_fences_zombies() {
    let input = unique("txn-in");
    let output = unique("txn-out");
    create_topic(&input, 3);
    create_topic(&output, 2);
    produce(&input, 3, values(0..900));
    let group = unique("txn-group");
    let transactional_id = unique("txn-app");
    let checkpoint_dir = tempfile::tempdir().unwrap();
    let make_stream = || {
        let config = DirectKafkaSettings::subscribe(brokers(), group.as_str(), [input.as_str()])
            .with_max_rate_per_partition(1_000)
            .with_starting_offsets(StartingOffsets::Committed { fallback: Box::new(StartingOffsets::Earliest) });
        common::registered(config).unwrap()
    };
    let make_sink = || TransactionalKafkaSink::new(&brokers(), output.as_str(), &transactional_id, &group).unwrap();
    let outputs = |records: &[Vec<KafkaRecord>]| -> Vec<OutputRecord> {
        records.iter().flatten().map(|r| OutputRecord::value(format!("out-{}", value(r)))).collect()
    };

    {
        let (stream, sink) = (make_stream(), make_sink());
        let checkpoint = Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();
        let ranges = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 0, &ranges);
        let records = stream.read(&ranges).unwrap();
        assert_eq!(sink.write_batch(BatchId(0), &ranges, outputs(&records)).unwrap(), CommitOutcome::Committed);
        commit(&checkpoint, 0);
        // Batch 1: the transaction commits, the process dies before commits/1.
        let ranges = stream.plan_batch(time_of(1), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 1, &ranges);
        let records = stream.read(&ranges).unwrap();
        assert_eq!(sink.write_batch(BatchId(1), &ranges, outputs(&records)).unwrap(), CommitOutcome::Committed);
    }
    {
        let (stream, sink) = (make_stream(), make_sink());
        let checkpoint = Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();
        let (batch, planned) = rerun_of(&checkpoint);
        assert_eq!(batch, 1);
        let records = stream.compute(time_of(1), Some(&planned)).unwrap();
        let ranges = OffsetRanges::from_json(&planned).unwrap();
        assert_eq!(sink.write_batch(BatchId(1), &ranges, outputs(&records)).unwrap(), CommitOutcome::AlreadyCommitted);
        commit(&checkpoint, 1);
        // Batch 2: offsets logged, the process dies before the transaction.
        let ranges = stream.plan_batch(time_of(2), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 2, &ranges);
        stream.read(&ranges).unwrap();
    }
    let zombie = make_sink();
    let stream = make_stream();
    let sink = make_sink(); // fences the zombie
    let checkpoint = Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();
    let (batch, planned) = rerun_of(&checkpoint);
    assert_eq!(batch, 2);
    let records = stream.compute(time_of(2), Some(&planned)).unwrap();
    let ranges = OffsetRanges::from_json(&planned).unwrap();
    assert!(zombie.write_batch(BatchId(2), &ranges, outputs(&records)).is_err(), "a fenced instance cannot commit");
    assert_eq!(sink.write_batch(BatchId(2), &ranges, outputs(&records)).unwrap(), CommitOutcome::Committed);
    commit(&checkpoint, 2);
    for batch in 3.. {
        let ranges = stream.plan_batch(time_of(batch), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        if ranges.is_empty() {
            break;
        }
        log_offsets(&checkpoint, batch, &ranges);
        let records = stream.read(&ranges).unwrap();
        assert_eq!(sink.write_batch(BatchId(batch), &ranges, outputs(&records)).unwrap(), CommitOutcome::Committed);
        commit(&checkpoint, batch);
    }

    let mut written = read_committed(&output, 2);
    written.sort();
    let mut expected: Vec<String> = values(0..900).into_iter().map(|v| format!("out-{v}")).collect();
    expected.sort();
    assert_eq!(written, expected, "every input exactly once in the committed output");
}

/// A process that dies inside its transaction: the batch's records are sent
/// under `transactional_id`, then the producer goes away without committing.
fn die_mid_transaction(transactional_id: &str, output: &str, records: &[OutputRecord]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", transactional_id)
        .create()
        .unwrap();
    let timeout = std::time::Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    producer.begin_transaction().unwrap();
    for record in records {
        producer.send(BaseRecord::<(), Vec<u8>>::to(output).payload(&record.value)).unwrap();
    }
    producer.flush(timeout).unwrap();
}

#[test]
fn the_transactional_kafka_sink_recognises_a_committed_empty_batch_after_a_crash() {
    let input = unique("txn-empty-in");
    let output = unique("txn-empty-out");
    create_topic(&input, 2);
    create_topic(&output, 1);
    let group = unique("txn-empty-group");
    let transactional_id = unique("txn-empty-app");
    let checkpoint_dir = tempfile::tempdir().unwrap();
    let make_stream = || {
        let config = DirectKafkaSettings::subscribe(brokers(), group.as_str(), [input.as_str()])
            .with_starting_offsets(StartingOffsets::Committed { fallback: Box::new(StartingOffsets::Earliest) });
        common::registered(config).unwrap()
    };
    let make_sink = || TransactionalKafkaSink::new(&brokers(), output.as_str(), &transactional_id, &group).unwrap();
    // Like `spate run`: one summary record a batch, even for a batch that read nothing.
    let outputs = |batch: u64, records: &[Vec<KafkaRecord>]| -> Vec<OutputRecord> {
        let mut out: Vec<OutputRecord> =
            records.iter().flatten().map(|r| OutputRecord::value(format!("out-{}", value(r)))).collect();
        out.push(OutputRecord::value(format!("summary-{batch}")));
        out
    };
    let open = || Checkpoint::open_for_write(checkpoint_dir.path(), CheckpointSettings::new()).unwrap();

    produce(&input, 2, values(0..100));
    {
        let (stream, sink, checkpoint) = (make_stream(), make_sink(), open());
        let ranges = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        assert_eq!(ranges.count(), 100);
        log_offsets(&checkpoint, 0, &ranges);
        let records = stream.read(&ranges).unwrap();
        assert_eq!(sink.write_batch(BatchId(0), &ranges, outputs(0, &records)).unwrap(), CommitOutcome::Committed);
        commit(&checkpoint, 0);
        // Batch 1 reads nothing; its transaction commits, the process dies before commits/1.
        let ranges = stream.plan_batch(time_of(1), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        assert!(ranges.is_empty() && ranges.ranges().len() == 2, "{ranges:?}");
        log_offsets(&checkpoint, 1, &ranges);
        assert_eq!(sink.write_batch(BatchId(1), &ranges, outputs(1, &[])).unwrap(), CommitOutcome::Committed);
    }
    produce(&input, 2, values(100..160));
    {
        // The re-run of the empty batch is recognised by the batch id its transaction recorded.
        let (stream, sink, checkpoint) = (make_stream(), make_sink(), open());
        let (batch, planned) = rerun_of(&checkpoint);
        assert_eq!(batch, 1);
        let records = stream.compute(time_of(1), Some(&planned)).unwrap();
        let ranges = OffsetRanges::from_json(&planned).unwrap();
        assert_eq!(
            sink.write_batch(BatchId(1), &ranges, outputs(1, &records)).unwrap(),
            CommitOutcome::AlreadyCommitted
        );
        commit(&checkpoint, 1);
        // Batch 2 reads 60 records; the process dies inside its transaction.
        let ranges = stream.plan_batch(time_of(2), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        assert_eq!(ranges.count(), 60);
        log_offsets(&checkpoint, 2, &ranges);
        let records = stream.read(&ranges).unwrap();
        die_mid_transaction(&transactional_id, &output, &outputs(2, &records));
    }
    {
        // The re-run of batch 2 commits (the dead transaction is aborted); then batch 3, empty,
        // dies inside its transaction too.
        let (stream, sink, checkpoint) = (make_stream(), make_sink(), open());
        let (batch, planned) = rerun_of(&checkpoint);
        assert_eq!(batch, 2);
        let records = stream.compute(time_of(2), Some(&planned)).unwrap();
        let ranges = OffsetRanges::from_json(&planned).unwrap();
        assert_eq!(sink.write_batch(BatchId(2), &ranges, outputs(2, &records)).unwrap(), CommitOutcome::Committed);
        commit(&checkpoint, 2);
        let ranges = stream.plan_batch(time_of(3), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        assert!(ranges.is_empty(), "{ranges:?}");
        log_offsets(&checkpoint, 3, &ranges);
        drop(sink);
        die_mid_transaction(&transactional_id, &output, &outputs(3, &[]));
    }
    {
        // The empty batch whose transaction died is written by its re-run; batch 4 follows.
        let (stream, sink, checkpoint) = (make_stream(), make_sink(), open());
        let (batch, planned) = rerun_of(&checkpoint);
        assert_eq!(batch, 3);
        let ranges = OffsetRanges::from_json(&planned).unwrap();
        assert_eq!(sink.write_batch(BatchId(3), &ranges, outputs(3, &[])).unwrap(), CommitOutcome::Committed);
        commit(&checkpoint, 3);
        let ranges = stream.plan_batch(time_of(4), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 4, &ranges);
        assert_eq!(sink.write_batch(BatchId(4), &ranges, outputs(4, &[])).unwrap(), CommitOutcome::Committed);
        commit(&checkpoint, 4);
    }

    let mut written = read_committed(&output, 1);
    written.sort();
    let mut expected: Vec<String> = values(0..160).into_iter().map(|v| format!("out-{v}")).collect();
    expected.extend((0..5).map(|b| format!("summary-{b}")));
    expected.sort();
    assert_eq!(written, expected, "every output exactly once in the committed output");
}

/// A producer that dies with `offsets` sent to its open transaction for
/// `group`, as a killed group member's last batch: the broker holds them
/// pending until it aborts the transaction after `timeout_ms`. Returned so
/// it is not dropped before the test ends.
fn die_with_offsets_in_a_transaction(
    group: &str,
    offsets: &rdkafka::TopicPartitionList,
    timeout_ms: u64,
) -> rdkafka::producer::BaseProducer {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, Producer};
    let timeout = std::time::Duration::from_secs(30);
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", unique("txn-dead"))
        .set("transaction.timeout.ms", timeout_ms.to_string())
        .create()
        .unwrap();
    producer.init_transactions(timeout).unwrap();
    producer.begin_transaction().unwrap();
    let consumer: BaseConsumer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).set("group.id", group).create().unwrap();
    producer.send_offsets_to_transaction(offsets, &consumer.group_metadata().unwrap(), timeout).unwrap();
    producer
}

#[test]
fn a_batch_waiting_for_a_dead_producers_pending_offsets_holds_up_no_other_batch_of_the_sink() {
    let input = unique("txn-pending-in");
    let output = unique("txn-pending-out");
    create_topic(&input, 2);
    create_topic(&output, 1);
    produce(&input, 2, values(0..20));
    let group = unique("txn-pending-group");
    let mut pending = rdkafka::TopicPartitionList::new();
    pending.add_partition_offset(&input, 0, rdkafka::Offset::Offset(10)).unwrap();
    // Long enough that partition 1's batch commits, even on a loaded
    // machine, well before the broker aborts the dead transaction (the
    // test broker looks for timed-out ones every second).
    let _dead = die_with_offsets_in_a_transaction(&group, &pending, 10_000);
    let sink =
        Arc::new(TransactionalKafkaSink::new(&brokers(), output.as_str(), &unique("txn-pending-app"), &group).unwrap());
    let ranges = |partition| OffsetRanges::new(vec![spate_kafka::OffsetRange::new(input.clone(), partition, 0, 10)]);
    // Partition 0's batch asks whether it committed before: the answer waits
    // until the broker aborts the dead producer's transaction.
    let waiting = {
        let (sink, ranges) = (Arc::clone(&sink), ranges(0));
        std::thread::spawn(move || sink.write_batch(BatchId(0), &ranges, [OutputRecord::value("p0")]).unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Partition 1's batch has no pending offsets: it commits meanwhile.
    assert_eq!(
        sink.write_batch(BatchId(1), &ranges(1), [OutputRecord::value("p1")]).unwrap(),
        CommitOutcome::Committed
    );
    assert!(!waiting.is_finished(), "partition 0's batch commits only once the dead transaction is aborted");
    assert_eq!(waiting.join().unwrap(), CommitOutcome::Committed);
    let mut written = read_committed(&output, 1);
    written.sort();
    assert_eq!(written, ["p0", "p1"]);
}

#[test]
fn a_delivery_error_of_an_aborted_transaction_does_not_fail_the_next_commit() {
    let input = unique("txn-stale-in");
    let output = unique("txn-stale-out");
    create_topic(&input, 1);
    create_topic(&output, 1);
    produce(&input, 1, values(0..10));
    let group = unique("txn-stale-group");
    let sink = TransactionalKafkaSink::new(&brokers(), output.as_str(), &unique("txn-stale-app"), &group).unwrap();
    let range = |from, until| OffsetRanges::new(vec![spate_kafka::OffsetRange::new(input.clone(), 0, from, until)]);

    // Batch 0 queues 20 MB, more than the producer has in flight at once,
    // then a record to a partition the topic does not have: the transaction
    // aborts, and the records still queued fail with it.
    let mut records: Vec<OutputRecord> = (0..200).map(|_| OutputRecord::value(vec![b'x'; 100_000])).collect();
    records.push(OutputRecord::value("nowhere").to_partition(99));
    let refused = sink.write_batch(BatchId(0), &range(0, 5), records);
    assert!(refused.is_err(), "a record to no partition fails its batch: {refused:?}");
    // The re-run of batch 0 commits, and says so.
    let rerun = sink.write_batch(BatchId(0), &range(0, 5), [OutputRecord::value("small")]);
    assert_eq!(rerun.unwrap(), CommitOutcome::Committed, "the aborted transaction's errors are not this one's");
    let next = sink.write_batch(BatchId(1), &range(5, 10), [OutputRecord::value("next")]);
    assert_eq!(next.unwrap(), CommitOutcome::Committed);
    assert_eq!(read_committed(&output, 1), ["small", "next"]);
}
