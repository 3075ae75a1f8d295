//! Direct-stream consumption from the local broker against a bare rdkafka
//! consumer reading the same topic in the same run (the bound), and against
//! bare consumers reading one partition each in parallel, as the direct
//! stream does (the stricter bound: what the stream itself costs).
//!
//! Needs the broker (`cargo xtask kafka start`, then
//! `SPATE_KAFKA_BROKERS=… cargo bench -p spate-kafka`); without it, it
//! fails saying so, as the Kafka tests do.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use spate_core::Time;
use spate_kafka::{DirectKafkaSettings, DirectKafkaStream, OffsetRanges};

#[path = "../tests/common/mod.rs"]
mod common;
use common::{brokers, create_topic, unique};

const PARTITIONS: i32 = 3;
const VALUE_BYTES: usize = 100;

fn setup(brokers: &str, records: u64) -> String {
    let topic = unique("bench-consume");
    create_topic(&topic, PARTITIONS);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .create()
        .unwrap();
    let value = vec![b'x'; VALUE_BYTES];
    for i in 0..records {
        let partition = (i % PARTITIONS as u64) as i32;
        while let Err((e, _)) = producer.send(BaseRecord::<(), [u8]>::to(&topic).payload(&value).partition(partition)) {
            assert!(matches!(e, rdkafka::error::KafkaError::MessageProduction(_)), "{e}");
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    topic
}

/// The bound: one consumer assigned every partition from the beginning, reading them all.
fn bare_read(consumer: &BaseConsumer, topic: &str, records: u64) -> u64 {
    let mut list = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        // An explicit offset (the topic starts at 0), as the direct stream
        // seeks: `Beginning` would cost a ListOffsets round trip per run.
        list.add_partition_offset(topic, p, Offset::Offset(0)).unwrap();
    }
    consumer.assign(&list).unwrap();
    let (mut count, mut bytes) = (0u64, 0usize);
    while count < records {
        match consumer.poll(Duration::from_secs(10)) {
            Some(Ok(m)) => {
                // Copy the value as the direct stream does, so both pay for it.
                bytes += m.payload().map(<[u8]>::to_vec).map_or(0, |v| v.len());
                count += 1;
            }
            Some(Err(e)) => panic!("bare consumer: {e}"),
            None => panic!("bare consumer: timed out after {count} records"),
        }
    }
    assert_eq!(bytes, count as usize * VALUE_BYTES);
    count
}

/// A stricter bound: one bare consumer per partition, in parallel, as the
/// direct stream reads (without its pool, planning or record type).
fn bare_parallel_read(consumers: &[BaseConsumer], topic: &str, per_partition: &[u64]) -> u64 {
    std::thread::scope(|s| {
        let tasks: Vec<_> = consumers
            .iter()
            .zip(per_partition)
            .enumerate()
            .map(|(p, (consumer, count))| {
                s.spawn(move || {
                    let mut list = TopicPartitionList::new();
                    list.add_partition_offset(topic, p as i32, Offset::Offset(0)).unwrap();
                    consumer.assign(&list).unwrap();
                    let mut read = 0u64;
                    while read < *count {
                        match consumer.poll(Duration::from_secs(10)) {
                            Some(Ok(m)) => {
                                std::hint::black_box(m.payload().map(<[u8]>::to_vec));
                                read += 1;
                            }
                            Some(Err(e)) => panic!("bare consumer: {e}"),
                            None => panic!("bare consumer: timed out after {read} records"),
                        }
                    }
                    read
                })
            })
            .collect();
        tasks.into_iter().map(|t| t.join().unwrap()).sum()
    })
}

fn direct_read(stream: &DirectKafkaStream, ranges: &OffsetRanges) -> u64 {
    stream.read(ranges).unwrap().iter().map(|p| p.len() as u64).sum()
}

fn rate(records: u64, elapsed: Duration) -> f64 {
    records as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let brokers = brokers();
    let full = std::env::args().any(|a| a == "--bench");
    let records: u64 = if full { 300_000 } else { 3_000 };
    let topic = setup(&brokers, records);

    // One batch covers the whole topic: planned without limits, the ranges are the same as the bare reads'.
    let config = DirectKafkaSettings::subscribe(brokers.as_str(), "bench-direct", [topic.as_str()]);
    let stream = DirectKafkaStream::new(config).unwrap();
    let ranges = stream.plan_batch(Time::from_millis(1_000), spate_dstream::BatchLimits::UNLIMITED).unwrap();
    assert_eq!(ranges.count(), records);
    // Planning read the records; take them, so every measured read goes to the broker.
    assert_eq!(direct_read(&stream, &ranges), records);
    // The same librdkafka settings the direct stream's consumers use.
    let make_bare = || -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", "bench-bare")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "100")
            .create()
            .unwrap()
    };
    let bare = make_bare();
    let bare_per_partition: Vec<BaseConsumer> = (0..PARTITIONS).map(|_| make_bare()).collect();
    let per_partition: Vec<u64> = ranges.ranges().iter().map(|r| r.count()).collect();

    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(if full { 8 } else { 1 }));
    let mut group = criterion.benchmark_group("kafka_consume");
    group.throughput(Throughput::Elements(records));
    group.bench_function("bare_rdkafka_consumer", |b| b.iter(|| bare_read(&bare, &topic, records)));
    group.bench_function("bare_consumer_per_partition", |b| {
        b.iter(|| bare_parallel_read(&bare_per_partition, &topic, &per_partition))
    });
    group.bench_function("direct_stream", |b| b.iter(|| direct_read(&stream, &ranges)));
    group.finish();

    // The BENCH figures: alternate runs of both in the same process, medians.
    let runs = if full { 7 } else { 1 };
    let (mut bare_rates, mut parallel_rates, mut direct_rates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let started = Instant::now();
        let n = bare_read(&bare, &topic, records);
        bare_rates.push(rate(n, started.elapsed()));
        let started = Instant::now();
        let n = bare_parallel_read(&bare_per_partition, &topic, &per_partition);
        parallel_rates.push(rate(n, started.elapsed()));
        let started = Instant::now();
        let n = direct_read(&stream, &ranges);
        direct_rates.push(rate(n, started.elapsed()));
    }
    let (bare_rate, direct_rate) = (median(bare_rates), median(direct_rates));
    let parallel_rate = median(parallel_rates);
    println!(
        "BENCH kafka_direct_stream_consume {direct_rate:.0} records/s bound={bare_rate:.0} ratio={:.2}",
        direct_rate / bare_rate
    );
    println!(
        "BENCH kafka_direct_stream_consume_vs_per_partition {direct_rate:.0} records/s bound={parallel_rate:.0} ratio={:.2}",
        direct_rate / parallel_rate
    );
    criterion.final_summary();
}
