//! The run's Kafka side: its topics, the backlog and the live input
//! produced into them, its output read back, and the group's offsets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::reference::{Draws, Reference, line, vocabulary};
use super::{EVENT_SPAN_MS, LIVE_RATE, PARTITIONS};

pub(super) fn brokers() -> String {
    match std::env::var("SPATE_KAFKA_BROKERS") {
        Ok(b) if !b.trim().is_empty() => b,
        _ => panic!(
            "this benchmark needs a Kafka broker: run it through `cargo xtask bench app` or set \
             SPATE_KAFKA_BROKERS (e.g. after `cargo xtask kafka start`)"
        ),
    }
}

pub(super) fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

pub(super) fn create_topics(topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1))).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for result in runtime.block_on(admin.create_topics(&new, &AdminOptions::new())).unwrap() {
        result.unwrap();
    }
}

pub(super) fn producer(linger_ms: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("linger.ms", linger_ms)
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap()
}

pub(super) fn send(producer: &BaseProducer, topic: &str, partition: i32, ts: i64, payload: &str) {
    let mut record = BaseRecord::<(), str>::to(topic).payload(payload).partition(partition).timestamp(ts);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((rdkafka::error::KafkaError::MessageProduction(_), back)) => {
                record = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => panic!("producing to {topic}: {e}"),
        }
    }
}

/// `lines` lines, round-robin over the partitions, their timestamps
/// rising evenly over [`EVENT_SPAN_MS`] ending ten minutes ago; returns
/// each word's count per window, computed from what was sent.
pub(super) fn produce_backlog(topic: &str, lines: u64) -> Reference {
    let producer = producer("50");
    let words = vocabulary();
    let mut draws = Draws(42);
    let base = (now_ms() - 600_000 - EVENT_SPAN_MS) / 10_000 * 10_000;
    let mut reference = Reference::default();
    for i in 0..lines {
        let ts = base + (i as i64 * EVENT_SPAN_MS) / lines as i64;
        let line = line(&words, &mut draws);
        let partition = (i % PARTITIONS as u64) as i32;
        reference.add(partition, ts, &line);
        send(&producer, topic, partition, ts, &line);
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    reference
}

/// Every committed record of `topic` as JSON, read until it has been quiet
/// for a second (the run has committed everything before this is called).
pub(super) fn read_all(topic: &str) -> Vec<serde_json::Value> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", unique("bench-app-reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer
        .assign(&{
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
            list
        })
        .unwrap();
    let (_, end) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10)).unwrap();
    let mut values = Vec::new();
    let mut quiet_since = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(message) => {
                let message = message.unwrap();
                values.push(serde_json::from_slice(message.payload().unwrap_or_default()).unwrap());
                quiet_since = Instant::now();
                if message.offset() + 1 >= end {
                    return values;
                }
            }
            None if end == 0 || quiet_since.elapsed() > Duration::from_secs(1) => return values,
            None => {}
        }
    }
}

/// The last revision of each word's count per window: (count, revision).
pub(super) fn latest_counts(values: &[serde_json::Value]) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut latest: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for v in values {
        let key = (v["word"].as_str().unwrap().to_string(), v["windowStart"].as_i64().unwrap());
        let (count, revision) = (v["count"].as_u64().unwrap(), v["revision"].as_u64().unwrap());
        let entry = latest.entry(key).or_insert((count, revision));
        if revision >= entry.1 {
            *entry = (count, revision);
        }
    }
    latest
}

/// Writes lines at [`LIVE_RATE`] stamped with the current time until stopped.
pub(super) fn live_producer(topic: String, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let producer = producer("5");
        let words = vocabulary();
        let mut draws = Draws(99);
        let started = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = (started.elapsed().as_secs_f64() * LIVE_RATE as f64) as u64;
            while sent < due {
                send(&producer, &topic, (sent % PARTITIONS as u64) as i32, now_ms(), &line(&words, &mut draws));
                sent += 1;
            }
            producer.poll(Duration::from_millis(10));
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        sent
    })
}

/// Reads the group's committed offsets and the topics' ends.
pub(super) struct Offsets {
    consumer: BaseConsumer,
    partitions: TopicPartitionList,
}

impl Offsets {
    pub(super) fn new(group: &str, topics: &[(String, i32)]) -> Offsets {
        // read_uncommitted: the committed offsets as they stand (not waiting
        // for transactions in flight) and the topics' high watermarks.
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", group)
            .set("isolation.level", "read_uncommitted")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut partitions = TopicPartitionList::new();
        for (topic, count) in topics {
            for p in 0..*count {
                partitions.add_partition(topic, p);
            }
        }
        Offsets { consumer, partitions }
    }

    /// Each partition's committed offset (0 before its first commit).
    pub(super) fn committed(&self) -> BTreeMap<(String, i32), i64> {
        let list = self.consumer.committed_offsets(self.partitions.clone(), Duration::from_secs(10)).unwrap();
        list.elements()
            .iter()
            .map(|e| {
                let offset = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                ((e.topic().to_string(), e.partition()), offset)
            })
            .collect()
    }

    /// Each partition's high watermark.
    pub(super) fn ends(&self) -> BTreeMap<(String, i32), i64> {
        self.partitions
            .elements()
            .iter()
            .map(|e| {
                let (_, high) =
                    self.consumer.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(10)).unwrap();
                ((e.topic().to_string(), e.partition()), high)
            })
            .collect()
    }
}

/// Asks the group for the committed offsets of the killed member's
/// partitions, requiring stable ones (`read_committed`), as a new owner's
/// first transaction does: the broker answers only once no transaction
/// holds offsets of them pending, here the killed member's open one,
/// which it aborts after the transaction timeout.
pub(super) struct PendingOffsets {
    consumer: BaseConsumer,
    partitions: TopicPartitionList,
}

impl PendingOffsets {
    pub(super) fn new(group: &str, tasks: &[String]) -> PendingOffsets {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut partitions = TopicPartitionList::new();
        for task in tasks {
            let (topic, partition) = task.rsplit_once('-').unwrap();
            partitions.add_partition(topic, partition.parse().unwrap());
        }
        PendingOffsets { consumer, partitions }
    }

    /// When the offsets were first stable.
    pub(super) fn wait(self) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if self.consumer.committed_offsets(self.partitions.clone(), Duration::from_millis(200)).is_ok() {
                return Instant::now();
            }
        }
        panic!("the killed member's partitions still had pending offsets after 120 s");
    }
}
