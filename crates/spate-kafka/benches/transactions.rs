//! Output on the local broker, a batch at a time: exactly once through the
//! transactional sink (each batch a transaction of its records and its
//! consumed offsets), against a bare rdkafka transactional producer
//! committing the same records and offsets in the same run (the bound),
//! alternately; and at least once through the idempotent sink, against a
//! bare producer sending and flushing the same records. Each batch: 10
//! records of 100 bytes to one partition (and, exactly once, the offsets of
//! one input partition). The bare producers flush as the client does,
//! which waits up to 100 ms for a record in flight; the sinks do not.
//!
//! Needs the broker (`cargo xtask kafka start`, then
//! `SPATE_KAFKA_BROKERS=… cargo bench -p spate-kafka --bench transactions`);
//! without it, it fails saying so, as the Kafka tests do.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use spate_core::BatchId;
use spate_kafka::{KafkaSink, OffsetRange, OffsetRanges, OutputRecord, TransactionalKafkaSink};

#[path = "../tests/common/mod.rs"]
mod common;
use common::{brokers, create_topic, unique};

const RECORDS_PER_BATCH: i64 = 10;
const VALUE_BYTES: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(30);

/// The bound: a transactional producer serving its own delivery reports,
/// committing `RECORDS_PER_BATCH` records and an offset per transaction.
struct Bare {
    producer: BaseProducer,
    group: BaseConsumer,
    output: String,
    input: String,
}

impl Bare {
    fn open(brokers: &str, output: &str, input: &str) -> Self {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("transactional.id", unique("bench-bare"))
            .create()
            .unwrap();
        producer.init_transactions(TIMEOUT).unwrap();
        let group: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", unique("bench-bare"))
            .create()
            .unwrap();
        Bare { producer, group, output: output.to_string(), input: input.to_string() }
    }

    fn commit(&self, batch: i64, value: &[u8]) {
        self.producer.begin_transaction().unwrap();
        for _ in 0..RECORDS_PER_BATCH {
            self.producer.send(BaseRecord::<(), [u8]>::to(&self.output).payload(value)).unwrap();
        }
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(&self.input, 0, Offset::Offset((batch + 1) * RECORDS_PER_BATCH)).unwrap();
        let metadata = self.group.group_metadata().unwrap();
        self.producer.send_offsets_to_transaction(&offsets, &metadata, TIMEOUT).unwrap();
        self.producer.commit_transaction(TIMEOUT).unwrap();
    }
}

/// The at-least-once bound: records sent, then the producer flushed.
fn bare_write(producer: &BaseProducer, topic: &str, value: &[u8]) {
    for _ in 0..RECORDS_PER_BATCH {
        producer.send(BaseRecord::<(), [u8]>::to(topic).payload(value)).unwrap();
    }
    producer.flush(TIMEOUT).unwrap();
}

fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

fn main() {
    let brokers = brokers();
    let full = std::env::args().any(|a| a == "--bench");
    let batches: i64 = if full { 200 } else { 5 };
    let (input, output, bare_output) = (unique("bench-txn-in"), unique("bench-txn-out"), unique("bench-txn-bare"));
    let (plain, bare_plain) = (unique("bench-plain-out"), unique("bench-plain-bare"));
    for topic in [&input, &output, &bare_output, &plain, &bare_plain] {
        create_topic(topic, 1);
    }
    let sink = TransactionalKafkaSink::new(&brokers, &output, &unique("bench-sink"), &unique("bench-sink")).unwrap();
    let bare = Bare::open(&brokers, &bare_output, &input);
    let value = vec![b'x'; VALUE_BYTES];
    let (mut through_sink, mut through_bare) = (Vec::new(), Vec::new());
    for batch in 0..batches {
        let ranges = OffsetRanges::new(vec![OffsetRange::new(
            &input,
            0,
            batch * RECORDS_PER_BATCH,
            (batch + 1) * RECORDS_PER_BATCH,
        )]);
        let records = (0..RECORDS_PER_BATCH).map(|_| OutputRecord::value(value.clone()));
        let started = Instant::now();
        sink.write_batch(BatchId(batch as u64), &ranges, records).unwrap();
        through_sink.push(started.elapsed());
        let started = Instant::now();
        bare.commit(batch, &value);
        through_bare.push(started.elapsed());
    }
    // The first of each opens connections and finds the coordinators.
    let (sink_ms, bare_ms) = (median_ms(through_sink.split_off(1)), median_ms(through_bare.split_off(1)));
    println!(
        "kafka transactions: {batches} batches of {RECORDS_PER_BATCH} records of {VALUE_BYTES} bytes and one input \
         partition's offsets, alternately through the transactional sink and a bare transactional producer: \
         median {sink_ms:.1} ms a batch against {bare_ms:.1} ms"
    );
    let plain_sink = KafkaSink::new(&brokers, &plain).unwrap();
    let bare_producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let (mut through_plain, mut through_bare_plain) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        let started = Instant::now();
        plain_sink.write((0..RECORDS_PER_BATCH).map(|_| OutputRecord::value(value.clone()))).unwrap();
        through_plain.push(started.elapsed());
        let started = Instant::now();
        bare_write(&bare_producer, &bare_plain, &value);
        through_bare_plain.push(started.elapsed());
    }
    let (plain_ms, bare_plain_ms) = (median_ms(through_plain.split_off(1)), median_ms(through_bare_plain.split_off(1)));
    println!(
        "kafka at-least-once: {batches} batches of {RECORDS_PER_BATCH} records of {VALUE_BYTES} bytes, alternately \
         through the idempotent sink and a bare producer: median {plain_ms:.1} ms a batch against {bare_plain_ms:.1} ms"
    );
    if full {
        println!(
            "BENCH kafka_transactional_batch_ms {sink_ms:.1} ms bound={bare_ms:.1} ratio={:.2}",
            sink_ms / bare_ms
        );
        println!(
            "BENCH kafka_sink_batch_ms {plain_ms:.1} ms bound={bare_plain_ms:.1} ratio={:.2}",
            plain_ms / bare_plain_ms
        );
    }
}
