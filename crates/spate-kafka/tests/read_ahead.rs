//! Reading a batch during its interval, against the local broker: the
//! records read ahead are processed then, the batch's ranges cover them,
//! the result is the whole-batch result, a re-run from the logged offsets
//! gives it again, and the batch's caps hold; an aggregate after the
//! stream combines the chunks read ahead by key to the same counts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::{BATCH, SOURCE, brokers, create_topic, produce, time_of, unique, value, values};
use spate_core::BatchId;
use spate_dstream::{Graph, GraphBuilder};
use spate_kafka::{DirectKafkaSettings, DirectKafkaStream, KafkaRecord, OffsetRanges};

/// A guard against a hang, never an expected duration: the read-ahead is
/// waited for by the records it has read.
const PATIENCE: StdDuration = StdDuration::from_secs(120);

type Row = (i32, i64, String);

/// Batches as the graph's output saw them: per batch, its partitions.
type Seen = Arc<Mutex<BTreeMap<u64, Vec<Vec<Row>>>>>;

fn config(topic: &str) -> DirectKafkaSettings {
    DirectKafkaSettings::subscribe(brokers(), unique("group"), [topic]).with_poll_timeout(StdDuration::from_secs(20))
}

/// The record-wise operator under test: drops a tenth of the records and
/// keeps where the rest came from.
fn operator(record: KafkaRecord) -> Option<Row> {
    let v = value(&record);
    (!v.ends_with('7')).then_some((record.partition, record.offset, v))
}

/// A graph reading `stream` through [`operator`] into `seen`.
fn graph(stream: &Arc<DirectKafkaStream>, seen: &Seen) -> Graph {
    let builder = GraphBuilder::new(BATCH);
    let sink = Arc::clone(seen);
    builder.input(SOURCE, Arc::clone(stream)).flat_map(operator).foreach_batch(move |batch, info| {
        sink.lock().unwrap().insert(info.batch_id.0, batch.partitions().to_vec());
        Ok(())
    });
    builder.build().unwrap()
}

/// Runs batch `batch` of `graph` from `planned` (the offset log's entry).
fn run(graph: &mut Graph, batch: u64, planned: &BTreeMap<String, String>) {
    for job in graph.generate_jobs(time_of(batch), BatchId(batch), planned).unwrap() {
        job.run().unwrap();
    }
}

/// Runs batches 0 to 3 of `graph`, which reads `stream` of `topic`: during
/// each interval `per_batch` more records arrive over `partitions` and are
/// read ahead before the interval ends, then `late` more arrive after them.
/// Returns each batch's planned offsets, as the offset log holds them.
fn run_reading_ahead(
    stream: &DirectKafkaStream,
    graph: &mut Graph,
    topic: &str,
    partitions: i32,
    per_batch: u32,
    late: u32,
) -> Vec<BTreeMap<String, String>> {
    let mut logged = Vec::new();
    for batch in 0..4u64 {
        let planned = graph.plan(time_of(batch), &BTreeMap::new()).unwrap();
        run(graph, batch, &planned);
        logged.push(planned);
        if batch == 3 {
            break;
        }
        let from = per_batch * (batch as u32 + 1);
        produce(topic, partitions, values(from..from + per_batch));
        let read = stream.wait_for_read_ahead(u64::from(per_batch), PATIENCE);
        assert_eq!(read, u64::from(per_batch), "read while the interval is open");
        if late > 0 {
            let late_from = 100_000 + late * batch as u32;
            produce(topic, partitions, values(late_from..late_from + late));
        }
    }
    logged
}

/// Re-runs each batch of `logged` in `graph`, as after a restart.
fn rerun(graph: &mut Graph, logged: &[BTreeMap<String, String>]) {
    for (batch, planned) in logged.iter().enumerate() {
        run(graph, batch as u64, planned);
    }
}

/// What [`operator`] gives over each whole partition of `ranges`, read now.
fn whole_batch(ranges: &OffsetRanges, topic: &str) -> Vec<Vec<Row>> {
    let reader = common::registered(config(topic)).unwrap();
    reader.read(ranges).unwrap().into_iter().map(|part| part.into_iter().filter_map(operator).collect()).collect()
}

#[test]
fn records_read_during_the_interval_give_the_whole_batch_result_and_a_rerun_gives_it_again() {
    let topic = unique("read-ahead");
    create_topic(&topic, 3);
    produce(&topic, 3, values(0..900));
    let stream = Arc::new(common::registered(config(&topic)).unwrap());
    let seen: Seen = Arc::default();
    let mut pipelined = graph(&stream, &seen);
    assert!(stream.reads_ahead(), "a flat_map right after the input reads ahead");

    let logged = run_reading_ahead(&stream, &mut pipelined, &topic, 3, 900, 30);

    let mut previous_ends = None;
    let seen = seen.lock().unwrap().clone();
    for (batch, planned) in logged.iter().enumerate() {
        let ranges = OffsetRanges::from_json(&planned[SOURCE]).unwrap();
        let expected_records = if batch == 0 { 900 } else { 930 };
        assert_eq!(ranges.count(), expected_records, "batch {batch}: what was read ahead and the rest");
        if let Some(ends) = previous_ends.replace(ranges.until_offsets()) {
            assert_eq!(ranges.from_offsets(), ends, "batch {batch} starts where the one before ended");
        }
        // One partition per topic partition, each the operator's result
        // over the whole partition.
        assert_eq!(seen[&(batch as u64)], whole_batch(&ranges, &topic), "batch {batch}");
    }

    // A restart re-runs each batch from its logged offsets, computed at the
    // boundary: the same result.
    let again: Seen = Arc::default();
    let restarted = Arc::new(common::registered(config(&topic)).unwrap());
    rerun(&mut graph(&restarted, &again), &logged);
    assert_eq!(*again.lock().unwrap(), seen);
}

#[test]
fn reading_ahead_stays_within_the_batch_caps_and_reads_every_record_once() {
    let topic = unique("read-ahead-caps");
    create_topic(&topic, 2);
    let stream = Arc::new(common::registered(config(&topic).with_max_rate_per_partition(3_000)).unwrap());
    // 3,000 records a second a partition at 100 ms batches: 300 a batch.
    // The context caps every batch at 500 records.
    let caps = BTreeMap::from([(SOURCE.to_string(), spate_dstream::BatchLimits::records(500))]);
    let seen: Seen = Arc::default();
    let mut pipelined = graph(&stream, &seen);
    let planned = pipelined.plan(time_of(0), &caps).unwrap();
    run(&mut pipelined, 0, &planned);
    assert_eq!(OffsetRanges::from_json(&planned[SOURCE]).unwrap().count(), 0);

    produce(&topic, 2, values(0..2_000));
    assert_eq!(stream.wait_for_read_ahead(500, PATIENCE), 500, "the batch cap holds while reading ahead");
    let mut read = 0;
    let mut batch = 1;
    while read < 2_000 {
        let planned = pipelined.plan(time_of(batch), &caps).unwrap();
        let ranges = OffsetRanges::from_json(&planned[SOURCE]).unwrap();
        assert!(ranges.count() <= 500, "batch {batch}: {}", ranges.count());
        assert!(ranges.ranges().iter().all(|r| r.count() <= 300), "batch {batch}: {ranges:?}");
        run(&mut pipelined, batch, &planned);
        read += ranges.count();
        batch += 1;
    }
    assert_eq!(read, 2_000);
    let mut kept: Vec<String> = seen.lock().unwrap().values().flatten().flatten().map(|r| r.2.clone()).collect();
    kept.sort();
    let mut expected: Vec<String> = values(0..2_000).into_iter().filter(|v| !v.ends_with('7')).collect();
    expected.sort();
    assert_eq!(kept, expected, "every record once, none repeated");
}

#[test]
fn an_operator_panicking_on_records_read_ahead_fails_its_batch_at_the_boundary() {
    let topic = unique("read-ahead-panic");
    create_topic(&topic, 2);
    let stream = Arc::new(common::registered(config(&topic)).unwrap());
    let builder = GraphBuilder::new(BATCH);
    let poison = values(150..151).remove(0);
    builder
        .input(SOURCE, Arc::clone(&stream))
        .map(move |r: KafkaRecord| {
            let v = value(&r);
            assert_ne!(v, poison, "the operator refuses this record");
            v
        })
        .name("refuses")
        .foreach_batch(|_, _| Ok(()));
    let mut graph = builder.build().unwrap();
    let planned = graph.plan(time_of(0), &BTreeMap::new()).unwrap();
    run(&mut graph, 0, &planned);

    produce(&topic, 2, values(0..300));
    // The read-ahead stops at the panic (it waits no longer for records).
    let read_ahead = stream.wait_for_read_ahead(300, PATIENCE);
    assert!(read_ahead < 300, "{read_ahead}");
    let planned = graph.plan(time_of(1), &BTreeMap::new()).unwrap();
    assert_eq!(OffsetRanges::from_json(&planned[SOURCE]).unwrap().count(), 300, "the whole batch is planned");
    let error = graph.generate_jobs(time_of(1), BatchId(1), &planned).map(|_| ()).unwrap_err();
    assert!(error.to_string().contains("refuses"), "the batch fails naming the operator: {error}");
}

/// Per batch, how many records end in each digit, sorted.
type DigitCounts = Arc<Mutex<BTreeMap<u64, Vec<(char, u64)>>>>;

/// The digit a record's value ends in.
fn last_digit(record: &KafkaRecord) -> char {
    value(record).chars().last().unwrap_or('-')
}

/// A graph counting `stream`'s records by last digit: a `map` and the
/// `reduce_by_key` after it, which combines each chunk read ahead by key.
fn counting_graph(stream: &Arc<DirectKafkaStream>, seen: &DigitCounts) -> Graph {
    let builder = GraphBuilder::new(BATCH);
    let sink = Arc::clone(seen);
    let pairs = builder.input(SOURCE, Arc::clone(stream)).map(|r: KafkaRecord| (last_digit(&r), 1u64));
    pairs.reduce_by_key(|a, b| a + b).foreach_batch(move |batch, info| {
        let mut counts: Vec<(char, u64)> = batch.iter().cloned().collect();
        counts.sort();
        sink.lock().unwrap().insert(info.batch_id.0, counts);
        Ok(())
    });
    builder.build().unwrap()
}

#[test]
fn an_aggregate_after_the_stream_combines_what_is_read_ahead_by_key_and_a_rerun_agrees() {
    let topic = unique("read-ahead-counts");
    create_topic(&topic, 2);
    produce(&topic, 2, values(0..600));
    let stream = Arc::new(common::registered(config(&topic)).unwrap());
    let seen: DigitCounts = Arc::default();
    let mut pipelined = counting_graph(&stream, &seen);
    assert!(stream.reads_ahead(), "map > reduce_by_key reads ahead");

    let logged = run_reading_ahead(&stream, &mut pipelined, &topic, 2, 600, 0);

    let seen = seen.lock().unwrap().clone();
    let reader = common::registered(config(&topic)).unwrap();
    for (batch, planned) in logged.iter().enumerate() {
        let ranges = OffsetRanges::from_json(&planned[SOURCE]).unwrap();
        assert_eq!(ranges.count(), 600, "batch {batch}");
        let mut expected: BTreeMap<char, u64> = BTreeMap::new();
        for record in reader.read(&ranges).unwrap().into_iter().flatten() {
            *expected.entry(last_digit(&record)).or_default() += 1;
        }
        assert_eq!(seen[&(batch as u64)], expected.into_iter().collect::<Vec<_>>(), "batch {batch}");
    }

    let again: DigitCounts = Arc::default();
    let restarted = Arc::new(common::registered(config(&topic)).unwrap());
    rerun(&mut counting_graph(&restarted, &again), &logged);
    assert_eq!(*again.lock().unwrap(), seen, "a re-run from the logged offsets gives the same counts");
}
