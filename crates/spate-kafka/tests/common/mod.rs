//! Helpers for the tests that run against the local broker.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

/// The broker the tests use. Fails (never skips) when none is configured.
pub fn brokers() -> String {
    match std::env::var("SPATE_KAFKA_BROKERS") {
        Ok(b) if !b.trim().is_empty() => b,
        _ => panic!(
            "this test needs a Kafka broker: run through `cargo xtask test` or set SPATE_KAFKA_BROKERS \
             (e.g. after `cargo xtask kafka start`)"
        ),
    }
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
}

pub fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap()
}

/// Creates `topic` with `partitions` partitions and waits until its leaders are known.
pub fn create_topic(topic: &str, partitions: i32) {
    let admin = admin();
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
    for r in results {
        r.unwrap();
    }
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for _ in 0..100 {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)).unwrap();
        let ready = metadata.topics().iter().any(|t| {
            t.name() == topic
                && t.error().is_none()
                && t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0)
        });
        if ready {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("topic {topic} did not become ready");
}

/// Produces `values` round-robin over `partitions` partitions and waits for every ack.
pub fn produce(topic: &str, partitions: i32, values: impl IntoIterator<Item = String>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for (i, value) in values.into_iter().enumerate() {
        let partition = (i as i32) % partitions;
        loop {
            match producer.send(BaseRecord::<(), String>::to(topic).payload(&value).partition(partition)) {
                Ok(()) => break,
                Err((rdkafka::error::KafkaError::MessageProduction(_), _)) => {
                    producer.poll(Duration::from_millis(20));
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// `record-<i>` for `i` in `range`.
pub fn values(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("record-{i}")).collect()
}

/// Every committed value of `topic` (read with `isolation.level=read_committed`).
pub fn read_committed(topic: &str, partitions: i32) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", unique("reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, p, Offset::Beginning).unwrap();
        // With read_committed the high watermark query returns the last stable offset.
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(5)).unwrap();
        ends.push(high);
    }
    consumer.assign(&list).unwrap();
    let mut out = Vec::new();
    let mut positions = vec![0i64; partitions as usize];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while positions.iter().zip(&ends).any(|(p, e)| p < e) && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                positions[m.partition() as usize] = m.offset() + 1;
                out.push(String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap());
            }
            Some(Err(e)) => panic!("read committed: {e}"),
            None => {
                // Transaction markers take offsets no record has: move on when the position passed them.
                let position = consumer.position().unwrap();
                for e in position.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        let p = &mut positions[e.partition() as usize];
                        *p = (*p).max(o);
                    }
                }
            }
        }
    }
    out
}

/// The name the tests give the Kafka source in `offsets/N`.
pub const SOURCE: &str = "kafka-in";
/// The batch interval of the tests' streams.
pub const BATCH: spate_core::Duration = spate_core::Duration::from_millis(100);

/// The batch time of batch `batch` (batch 0 at one interval after the epoch).
pub fn time_of(batch: u64) -> spate_core::Time {
    spate_core::Time::from_millis(((batch + 1) * BATCH.as_millis()) as i64)
}

/// Writes `offsets/<batch>` with the ranges the batch reads.
pub fn log_offsets(checkpoint: &spate_logstore::Checkpoint, batch: u64, ranges: &spate_kafka::OffsetRanges) {
    let entry = spate_logstore::OffsetSeq {
        batch_timestamp: time_of(batch),
        sources: vec![ranges.to_source_offset(SOURCE)],
        ..spate_logstore::OffsetSeq::default()
    };
    assert!(checkpoint.offsets().add(spate_core::BatchId(batch), &entry).unwrap());
}

/// Writes `commits/<batch>`.
pub fn commit(checkpoint: &spate_logstore::Checkpoint, batch: u64) {
    let done = spate_logstore::CommitMetadata::default();
    assert!(checkpoint.commits().add(spate_core::BatchId(batch), &done).unwrap());
}

/// A record's value as text.
pub fn value(record: &spate_kafka::KafkaRecord) -> String {
    String::from_utf8(record.value.clone().unwrap()).unwrap()
}

/// A direct stream of `config`, registered as a streaming context of
/// [`BATCH`] would (a rate needs the batch interval).
#[allow(dead_code)]
pub fn registered(config: spate_kafka::DirectKafkaSettings) -> spate_kafka::Result<spate_kafka::DirectKafkaStream> {
    registered_every(config, BATCH)
}

/// A direct stream of `config`, registered as a streaming context with
/// batches of `interval` would.
#[allow(dead_code)]
pub fn registered_every(
    config: spate_kafka::DirectKafkaSettings,
    interval: spate_core::Duration,
) -> spate_kafka::Result<spate_kafka::DirectKafkaStream> {
    let stream = spate_kafka::DirectKafkaStream::new(config)?;
    stream.register(&spate_dstream::SourceContext::new(interval, 256 << 20))?;
    Ok(stream)
}
