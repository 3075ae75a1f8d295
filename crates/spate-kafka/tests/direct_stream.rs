//! The direct stream against the local broker: exactly-once reading, the
//! offset log, windows with concurrent jobs, restarts, starting offsets and
//! deleted records.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use common::{BATCH, SOURCE, brokers, commit, create_topic, log_offsets, produce, time_of, unique, value, values};
use spate_core::BatchId;
use spate_dstream::{GraphBuilder, InputSource};
use spate_kafka::{
    DataLossPolicy, DirectKafkaSettings, KafkaError, KafkaRecord, OffsetCommit, OffsetRange, OffsetRanges,
    StartingOffsets, TopicPartition,
};
use spate_logstore::{Checkpoint, CheckpointSettings, Verdict};

fn config(topic: &str, rate_per_partition: u64) -> DirectKafkaSettings {
    DirectKafkaSettings::subscribe(brokers(), unique("group"), [topic])
        .with_max_rate_per_partition(rate_per_partition)
        .with_poll_timeout(std::time::Duration::from_secs(20))
}

fn assert_within(ranges: &OffsetRanges, records: &[Vec<KafkaRecord>]) {
    let flat: Vec<&KafkaRecord> = records.iter().flatten().collect();
    assert_eq!(flat.len() as u64, ranges.count(), "a batch reads exactly its ranges' records");
    for r in flat {
        let range = ranges.ranges().iter().find(|x| x.partition == r.partition).unwrap();
        assert!(range.from <= r.offset && r.offset < range.until, "{} outside {range}", r.offset);
    }
}

#[test]
fn every_record_is_read_exactly_once_and_the_offset_log_matches() {
    let topic = unique("exactly-once");
    create_topic(&topic, 3);
    produce(&topic, 3, values(0..3_000));
    let stream = common::registered(config(&topic, 4_000)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();

    let mut seen = Vec::new();
    let mut planned = Vec::new();
    for batch in 0.. {
        let ranges = stream.plan_batch(time_of(batch), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        if ranges.is_empty() {
            break;
        }
        assert!(ranges.ranges().iter().all(|r| r.count() <= 400), "rate cap: {ranges:?}");
        log_offsets(&checkpoint, batch, &ranges);
        let records = stream.read(&ranges).unwrap();
        assert_within(&ranges, &records);
        seen.extend(records.iter().flatten().map(value));
        commit(&checkpoint, batch);
        planned.push(ranges);
    }
    assert_eq!(planned.len(), 3, "1,000 records a partition at 400 a batch");
    let mut expected = values(0..3_000);
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected);

    // What the offset log holds is what was read, and the batches are contiguous.
    for (batch, ranges) in planned.iter().enumerate() {
        let entry = checkpoint.offsets().get(BatchId(batch as u64)).unwrap().unwrap();
        assert_eq!(OffsetRanges::from_offset_seq(&entry, SOURCE).unwrap().as_ref(), Some(ranges));
        if let Some(next) = planned.get(batch + 1) {
            assert_eq!(next.from_offsets(), ranges.until_offsets());
        }
    }
}

#[test]
fn windows_and_a_concurrent_job_never_share_a_consumer() {
    let topic = unique("seed-window");
    create_topic(&topic, 3);
    produce(&topic, 3, values(0..10_000));
    // 140 records a partition a batch: 24 batches for 3,334 records a partition.
    let stream = Arc::new(common::registered(config(&topic, 1_400)).unwrap());

    let builder = GraphBuilder::new(BATCH);
    let input = builder.input(SOURCE, Arc::clone(&stream));
    let slide = BATCH.times(12);
    let windows = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&windows);
    input.count_by_window(slide.times(2), slide).foreach_batch(move |batch, info| {
        sink.lock().unwrap().push((info.time, batch.iter().copied().sum::<u64>()));
        Ok(())
    });
    let mut graph = builder.build().unwrap();

    let mut per_batch = Vec::new();
    let mut audit = BTreeSet::new();
    for batch in 0..30u64 {
        let time = time_of(batch);
        let planned = graph.plan(time, &BTreeMap::new()).unwrap();
        let ranges = OffsetRanges::from_json(&planned[SOURCE]).unwrap();
        // Job A (the windowed pipeline) and job B (an audit reading the same
        // partitions of the same batch) run at once, each with its own consumers.
        let (records_b, ()) = std::thread::scope(|s| {
            let job_b = s.spawn(|| stream.read(&ranges).unwrap());
            for job in graph.generate_jobs(time, BatchId(batch), &planned).unwrap() {
                job.run().unwrap();
            }
            (job_b.join().unwrap(), ())
        });
        assert_within(&ranges, &records_b);
        for r in records_b.iter().flatten() {
            assert!(audit.insert(value(r)), "record read twice by job B");
        }
        per_batch.push(ranges.count());
    }
    assert_eq!(audit.len(), 10_000);
    assert_eq!(per_batch.iter().sum::<u64>(), 10_000);
    assert!(stream.pool().consumers_created() >= 3);

    // Every slide (every 12th batch) counts the last 24 batches.
    let windows = windows.lock().unwrap().clone();
    assert!(windows.len() >= 2, "{windows:?}");
    for (time, count) in windows {
        let last = (time.as_millis() as u64 / BATCH.as_millis()) as usize; // batches 0..last-1
        let expected: u64 = per_batch[last.saturating_sub(24)..last].iter().sum();
        assert_eq!(count, expected, "window ending at {time:?}");
    }
}

#[test]
fn a_batch_cut_short_after_its_offsets_were_logged_is_read_again_with_the_same_ranges() {
    let topic = unique("rerun");
    create_topic(&topic, 3);
    produce(&topic, 3, values(0..1_500));
    let dir = tempfile::tempdir().unwrap();
    let group = unique("group");
    let make = || {
        let mut c = config(&topic, 2_000);
        c.consumer.group_id = group.clone();
        common::registered(c).unwrap()
    };
    let mut seen: Vec<String> = Vec::new();
    let first_read;
    {
        let stream = make();
        let checkpoint = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
        for batch in 0..2 {
            let ranges = stream.plan_batch(time_of(batch), spate_dstream::BatchLimits::UNLIMITED).unwrap();
            log_offsets(&checkpoint, batch, &ranges);
            seen.extend(stream.read(&ranges).unwrap().iter().flatten().map(value));
            commit(&checkpoint, batch);
        }
        let ranges = stream.plan_batch(time_of(2), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        log_offsets(&checkpoint, 2, &ranges);
        first_read = stream.read(&ranges).unwrap();
        // The process dies here: no output, no commits/2.
    }

    let stream = make();
    let checkpoint = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
    let Verdict::Rerun { batch, offsets, .. } = checkpoint.verdict().unwrap() else { panic!("expected a re-run") };
    assert_eq!(batch, BatchId(2));
    let planned = offsets.offset_of(SOURCE).unwrap().unwrap().to_string();
    let again = stream.compute(time_of(2), Some(&planned)).unwrap();
    assert_eq!(again, first_read, "the re-run reads exactly the same records");
    seen.extend(again.iter().flatten().map(value));
    commit(&checkpoint, 2);
    for batch in 3.. {
        let ranges = stream.plan_batch(time_of(batch), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        if ranges.is_empty() {
            break;
        }
        if batch == 3 {
            let logged = OffsetRanges::from_json(&planned).unwrap();
            assert_eq!(ranges.from_offsets(), logged.until_offsets(), "the next batch starts where the re-run ended");
        }
        log_offsets(&checkpoint, batch, &ranges);
        seen.extend(stream.read(&ranges).unwrap().iter().flatten().map(value));
        commit(&checkpoint, batch);
    }
    let mut expected = values(0..1_500);
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected);
}

#[test]
fn starting_offsets_from_a_json_spec_and_from_the_groups_commits() {
    let topic = unique("starting");
    create_topic(&topic, 2);
    produce(&topic, 2, values(0..100)); // 50 a partition
    let p0 = TopicPartition::new(topic.clone(), 0);
    let p1 = TopicPartition::new(topic.clone(), 1);

    let spec = format!(r#"{{"{topic}":{{"0":10,"1":-2}}}}"#);
    let stream = common::registered(config(&topic, 1_000_000).with_starting_offsets_json(&spec).unwrap()).unwrap();
    let position = stream.position().unwrap();
    assert_eq!((position[&p0], position[&p1]), (10, 0));
    let ranges = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
    let records = stream.read(&ranges).unwrap();
    assert_eq!(records.iter().flatten().count(), 90);
    assert_eq!(records.iter().flatten().filter(|r| r.partition == 0).map(|r| r.offset).min(), Some(10));

    let spec = format!(r#"{{"{topic}":{{"0":-1,"1":7}}}}"#);
    let stream = common::registered(config(&topic, 1_000_000).with_starting_offsets_json(&spec).unwrap()).unwrap();
    let position = stream.position().unwrap();
    assert_eq!((position[&p0], position[&p1]), (50, 7));

    // Commit a batch of 20 a partition to the group, then start from the group's offsets.
    let group_config = config(&topic, 200).with_commit(OffsetCommit::KafkaGroup);
    let group = group_config.consumer.group_id.clone();
    let stream = common::registered(group_config).unwrap();
    let ranges = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
    assert_eq!(ranges.count(), 40);
    stream.read(&ranges).unwrap();
    stream.on_batch_completed(&ranges).unwrap();

    let fallback = Box::new(StartingOffsets::Latest);
    let mut resumed =
        config(&topic, 200).with_starting_offsets(StartingOffsets::Committed { fallback: fallback.clone() });
    resumed.consumer.group_id = group;
    let position = common::registered(resumed).unwrap().position().unwrap();
    assert_eq!((position[&p0], position[&p1]), (20, 20));
    // A group without commits falls back (here: latest).
    let fresh = config(&topic, 200).with_starting_offsets(StartingOffsets::Committed { fallback });
    let position = common::registered(fresh).unwrap().position().unwrap();
    assert_eq!((position[&p0], position[&p1]), (50, 50));
}

#[test]
fn deleted_records_fail_the_batch_or_are_skipped_as_configured() {
    let topic = unique("deleted");
    create_topic(&topic, 1);
    produce(&topic, 1, values(0..100));
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, rdkafka::Offset::Offset(40)).unwrap();
    let deleted =
        common::block_on(common::admin().delete_records(&list, &rdkafka::admin::AdminOptions::new())).unwrap();
    assert_eq!(deleted.elements()[0].offset(), rdkafka::Offset::Offset(40));

    let range = OffsetRanges::new(vec![OffsetRange::new(topic.clone(), 0, 0, 100)]);
    let failing = common::registered(config(&topic, 1_000)).unwrap();
    match failing.read(&range) {
        Err(KafkaError::DataLoss { from: 0, until: 100, earliest: 40, .. }) => {}
        other => panic!("expected a data-loss error, got {other:?}"),
    }

    let skipping = common::registered(config(&topic, 1_000).with_data_loss_policy(DataLossPolicy::Skip)).unwrap();
    let records = skipping.read(&range).unwrap();
    let offsets: Vec<i64> = records.iter().flatten().map(|r| r.offset).collect();
    assert_eq!(offsets, (40..100).collect::<Vec<_>>());
    // Starting at the earliest offset plans from what is left.
    assert_eq!(skipping.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap().ranges()[0].from, 40);
}

#[test]
fn backpressure_and_the_runtimes_record_limit_cap_a_batch_shared_by_lag() {
    let topic = unique("backpressure");
    create_topic(&topic, 2);
    produce(&topic, 2, values(0..100)); // 50 a partition
    let stream = common::registered(config(&topic, 1_000_000)).unwrap();
    stream.set_rate_limit(Some(200)); // 20 records a 100 ms batch
    let ranges = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
    assert_eq!(ranges.ranges().iter().map(OffsetRange::count).collect::<Vec<_>>(), vec![10, 10]);
    let planned = stream.plan(time_of(1), spate_dstream::BatchLimits::records(6)).unwrap().unwrap(); // the runtime's limit is lower
    let ranges = OffsetRanges::from_json(&planned).unwrap();
    assert_eq!(ranges.ranges().iter().map(|r| (r.from, r.until)).collect::<Vec<_>>(), vec![(10, 13), (10, 13)]);
    stream.set_rate_limit(None);
    assert_eq!(stream.plan_batch(time_of(2), spate_dstream::BatchLimits::UNLIMITED).unwrap().count(), 74);
}

/// Drains `topic` through the runtime's path (plan, log `offsets/N`, compute),
/// checking every batch against the caps; returns each batch's records.
/// Every third batch is also read by a fresh stream from its logged offsets,
/// as a re-run after a crash would, and must give the same records.
fn drain_capped(config: &DirectKafkaSettings, record_cap: u64, byte_cap: u64) -> Vec<Vec<KafkaRecord>> {
    let stream = common::registered(config.clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
    let mut batches = Vec::new();
    let mut previous: Option<OffsetRanges> = None;
    for batch in 0.. {
        let limits = spate_dstream::BatchLimits::new(Some(record_cap), Some(byte_cap));
        let planned = stream.plan(time_of(batch), limits).unwrap().unwrap();
        let ranges = OffsetRanges::from_json(&planned).unwrap();
        if ranges.is_empty() {
            break;
        }
        log_offsets(&checkpoint, batch, &ranges);
        let records = stream.compute(time_of(batch), Some(&planned)).unwrap();
        assert_within(&ranges, &records);
        let flat: Vec<KafkaRecord> = records.into_iter().flatten().collect();
        let bytes: u64 = flat.iter().map(|r| spate_kafka::record_footprint(0, r.value.as_ref().unwrap().len())).sum();
        assert!(flat.len() as u64 <= record_cap, "batch {batch}: {} records, cap {record_cap}", flat.len());
        assert!(bytes <= byte_cap, "batch {batch}: {bytes} bytes, cap {byte_cap}");
        if let Some(previous) = &previous {
            assert_eq!(ranges.from_offsets(), previous.until_offsets(), "batch {batch} starts where the last ended");
        }
        if batch % 3 == 0 {
            let entry = checkpoint.offsets().get(BatchId(batch)).unwrap().unwrap();
            let logged = OffsetRanges::from_offset_seq(&entry, SOURCE).unwrap().unwrap();
            let again = common::registered(config.clone()).unwrap().read(&logged).unwrap();
            assert_eq!(again.into_iter().flatten().collect::<Vec<_>>(), flat, "batch {batch} re-read from offsets/N");
        }
        commit(&checkpoint, batch);
        previous = Some(ranges);
        batches.push(flat);
    }
    batches
}

/// Every value of `batches` once, sorted.
fn assert_each_once(batches: &[Vec<KafkaRecord>], expected: &[String]) {
    let mut seen: Vec<String> = batches.iter().flatten().map(value).collect();
    seen.sort();
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(seen, expected, "every record exactly once");
}

#[test]
fn a_backlog_over_the_record_cap_is_read_over_several_batches_nothing_lost_or_repeated() {
    let topic = unique("record-cap");
    create_topic(&topic, 3);
    let all = values(0..900);
    produce(&topic, 3, all.clone());
    let config = DirectKafkaSettings::subscribe(brokers(), unique("group"), [topic.as_str()])
        .with_poll_timeout(std::time::Duration::from_secs(20));
    let batches = drain_capped(&config, 100, u64::MAX);
    // The cap is shared by lag, what is left over to the partitions that
    // lag most: 100 a batch, never more.
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, [100; 9], "{sizes:?}");
    assert_each_once(&batches, &all);
}

#[test]
fn a_backlog_over_the_byte_cap_is_read_over_several_batches_nothing_lost_or_repeated() {
    let topic = unique("byte-cap");
    create_topic(&topic, 3);
    // 600 records of 200 bytes, 200 a partition.
    let all: Vec<String> = (0..600).map(|i| format!("{i:0>200}")).collect();
    produce(&topic, 3, all.clone());
    let footprint = spate_kafka::record_footprint(0, 200);
    let byte_cap = 45 * footprint; // 15 records a partition a batch
    let config = DirectKafkaSettings::subscribe(brokers(), unique("group"), [topic.as_str()])
        .with_poll_timeout(std::time::Duration::from_secs(20));
    let batches = drain_capped(&config, u64::MAX, byte_cap);
    assert_eq!(batches.len(), 14, "200 records a partition at 15 a batch");
    assert!(batches[..13].iter().all(|b| b.len() == 45), "{:?}", batches.iter().map(Vec::len).collect::<Vec<_>>());
    assert_each_once(&batches, &all);
}

#[test]
fn a_record_larger_than_the_byte_cap_is_still_read_one_at_a_time() {
    let topic = unique("byte-cap-one");
    create_topic(&topic, 2);
    let all = values(0..6);
    produce(&topic, 2, all.clone());
    let config = DirectKafkaSettings::subscribe(brokers(), unique("group"), [topic.as_str()])
        .with_poll_timeout(std::time::Duration::from_secs(20));
    let stream = common::registered(config).unwrap();
    let mut batches = Vec::new();
    for batch in 0.. {
        let ranges = stream.plan_batch(time_of(batch), spate_dstream::BatchLimits::new(None, Some(1))).unwrap();
        if ranges.is_empty() {
            break;
        }
        assert_eq!(ranges.ranges().iter().map(OffsetRange::count).collect::<Vec<_>>(), [1, 1], "batch {batch}");
        batches.push(stream.read(&ranges).unwrap().into_iter().flatten().collect::<Vec<_>>());
    }
    assert_eq!(batches.len(), 3);
    assert_each_once(&batches, &all);
}

/// Produces one record a timestamp to `partition`, the key `k`.
fn produce_at(topic: &str, partition: i32, timestamps: impl IntoIterator<Item = i64>) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let mut count = 0;
    for ts in timestamps {
        count += 1;
        let payload = format!("at-{ts}");
        let record = BaseRecord::<str, String>::to(topic).key("k").payload(&payload).partition(partition).timestamp(ts);
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(std::time::Duration::ZERO);
    }
    producer.flush(std::time::Duration::from_secs(30)).unwrap();
    // A failed delivery is only reported to a callback: check what landed.
    let (low, high) = producer.client().fetch_watermarks(topic, partition, std::time::Duration::from_secs(30)).unwrap();
    assert_eq!(high - low, count, "records on {topic}/{partition}");
}

#[test]
fn event_time_windows_follow_the_record_timestamps_with_a_watermark_per_partition() {
    let topic = unique("event-time");
    create_topic(&topic, 3);
    // Partition 0 is 3 s of event time ahead of partition 1; partition 2
    // stays empty. Times are recent: the broker's retention deletes records
    // stamped long ago.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 60_000) / 1000 * 1000;
    let ahead: Vec<i64> = (0..60).map(|i| base + 3_000 + i * 100).collect();
    let behind: Vec<i64> = (0..60).map(|i| base + i * 100).collect();
    produce_at(&topic, 0, ahead.clone());
    produce_at(&topic, 1, behind.clone());
    let stream = Arc::new(common::registered(config(&topic, 100)).unwrap());

    // A batch has one partition per topic partition, empty ones included,
    // so each keeps its place (and its watermark) from batch to batch.
    let probe = common::registered(config(&topic, 100)).unwrap();
    let ranges = probe.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
    let layout: Vec<usize> = probe.read(&ranges).unwrap().iter().map(Vec::len).collect();
    assert_eq!(layout, [10, 10, 0]);

    let builder = GraphBuilder::new(BATCH).checkpointing(true);
    let idle = spate_dstream::Watermarks::bounded_out_of_orderness(spate_core::Duration::ZERO).with_idle_timeout(BATCH);
    let windowed = builder
        .input(SOURCE, Arc::clone(&stream))
        .map(|r: KafkaRecord| ((), r))
        .aggregate_by_event_time(
            |r: &KafkaRecord| r.event_time().unwrap(),
            idle,
            spate_dstream::EventWindows::tumbling(spate_core::Duration::from_secs(1)),
            |_| 1u64,
            |n: &mut u64, _| *n += 1,
            |n: &mut u64, m: &u64| *n += m,
        )
        .name("per-second");
    let emitted = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&emitted);
    windowed.results().foreach_batch(move |batch, _| {
        sink.lock().unwrap().extend(batch.iter().map(|r| (r.window.start.as_millis(), r.value)));
        Ok(())
    });
    let late = Arc::new(Mutex::new(0usize));
    let late_sink = Arc::clone(&late);
    windowed.late().foreach_batch(move |batch, _| {
        *late_sink.lock().unwrap() += batch.len();
        Ok(())
    });
    let mut graph = builder.build().unwrap();
    // Batches run now, as a job's would: records stamped ahead of the batch
    // time by more than the watermarks' bound on the future are set aside.
    let first = spate_core::Time::from_millis(now).floor(BATCH);
    for batch in 0..8u64 {
        graph.run_batch(first + BATCH.times(batch + 1), BatchId(batch)).unwrap();
    }
    // Partition 1 holds the watermark at its last record, 5.9 s after the
    // base: the windows before base + 5 s
    // are complete, with both partitions' records in them, and nothing of
    // the lagging partition was late.
    let mut expected: BTreeMap<i64, u64> = BTreeMap::new();
    for ts in ahead.iter().chain(&behind) {
        *expected.entry(ts / 1000 * 1000).or_default() += 1;
    }
    expected.retain(|start, _| start + 1000 <= base + 5_900);
    let mut got = emitted.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, expected.into_iter().collect::<Vec<_>>());
    assert_eq!(*late.lock().unwrap(), 0);
}

#[test]
fn a_range_ending_in_a_transaction_marker_is_read_without_waiting_for_a_later_record() {
    let (topic, output) = (unique("txn-in"), unique("txn-out"));
    create_topic(&topic, 1);
    create_topic(&output, 1);
    produce(&topic, 1, values(0..1));
    // Three records and a commit marker after them: the partition's end is
    // one past the marker, which a read_committed consumer never hands out.
    let sink = spate_kafka::TransactionalKafkaSink::new(&brokers(), &output, &unique("txn"), &unique("group")).unwrap();
    let ranges = OffsetRanges::new(vec![OffsetRange::new(topic.clone(), 0, 0, 1)]);
    let records = (0..3).map(|i| spate_kafka::OutputRecord::value(format!("in-txn-{i}")));
    sink.write_batch(BatchId(0), &ranges, records).unwrap();
    let config = DirectKafkaSettings::subscribe(brokers(), unique("group"), [output.clone()])
        .with_consumer_property("isolation.level", "read_committed")
        .with_poll_timeout(std::time::Duration::from_secs(5));
    let stream = common::registered(config).unwrap();
    let planned = stream.plan_batch(time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
    assert_eq!(planned.ranges()[0].until, 4, "three records and the marker");
    let read: Vec<String> = stream.read(&planned).unwrap().iter().flatten().map(value).collect();
    assert_eq!(read, ["in-txn-0", "in-txn-1", "in-txn-2"]);
    // Read again from the log (a re-run): the same records, the marker passed over.
    let again = common::registered(
        DirectKafkaSettings::subscribe(brokers(), unique("group"), [output.clone()])
            .with_consumer_property("isolation.level", "read_committed")
            .with_poll_timeout(std::time::Duration::from_secs(5)),
    )
    .unwrap();
    assert_eq!(again.read(&planned).unwrap().iter().flatten().count(), 3);
}
