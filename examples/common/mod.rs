//! What the examples share: running a context until it is done or its time
//! is up, logging, and the Kafka chores around a pipeline (the broker's
//! address, creating topics, producing sample records, reading a topic back
//! the way a downstream consumer of exactly-once output does).
//!
//! Each example uses part of it, so the parts it does not use are allowed
//! to be dead code there.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration as StdDuration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use spate::runtime::{BatchProgress, ProgressListener, StopReport, StreamingContext};

/// The error type of the examples: anything, with its message.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// Engine logs on stderr, filtered by `RUST_LOG` (warnings by default).
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second call (several tests in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Sends every committed batch's progress to a channel.
struct Committed(std::sync::Mutex<Sender<BatchProgress>>);

impl ProgressListener for Committed {
    fn on_batch_completed(&self, progress: &BatchProgress) {
        let sender = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The receiving side is gone once the run is over: nothing to tell.
        let _ = sender.send(progress.clone());
    }
}

/// How a run ended.
#[derive(Debug)]
pub(crate) struct RunOutcome {
    /// What the context said when it stopped.
    pub(crate) stop: StopReport,
    /// True when `done` said so (for a batch committed before the stop, or
    /// while stopping); false when the time ran out first.
    pub(crate) done: bool,
    /// Batches committed in this run.
    pub(crate) batches: u64,
}

/// Starts `ctx`, hands every committed batch to `done` until it returns
/// true or `seconds` have passed, then stops gracefully (what was received
/// is processed and committed) and waits for the stop. A failed context is
/// an error.
pub(crate) fn run_until(
    mut ctx: StreamingContext,
    seconds: u64,
    mut done: impl FnMut(&BatchProgress) -> bool,
) -> Result<RunOutcome, Error> {
    let (sender, receiver): (Sender<BatchProgress>, Receiver<BatchProgress>) = channel();
    ctx.add_progress_listener(Arc::new(Committed(std::sync::Mutex::new(sender))));
    ctx.start()?;
    let deadline = Instant::now() + StdDuration::from_secs(seconds);
    let (mut finished, mut batches) = (false, 0);
    while !finished {
        if let Some(failure) = ctx.failure() {
            return Err(format!("the pipeline failed: {failure}").into());
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
        // Wake up now and then to notice a failure, which sends no progress.
        match receiver.recv_timeout(left.min(StdDuration::from_millis(500))) {
            Ok(progress) => {
                batches += 1;
                finished = done(&progress);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    ctx.stop_handle().stop_gracefully();
    let stop = ctx.await_termination()?;
    // The batches committed while stopping count too.
    for progress in receiver.try_iter() {
        batches += 1;
        finished |= done(&progress);
    }
    Ok(RunOutcome { stop, done: finished, batches })
}

/// The broker from `SPATE_KAFKA_BROKERS`, or an error saying how to start one.
pub(crate) fn brokers() -> Result<String, Error> {
    match std::env::var("SPATE_KAFKA_BROKERS") {
        Ok(brokers) if !brokers.trim().is_empty() => Ok(brokers),
        _ => Err("this example needs a Kafka broker: start one with `cargo xtask kafka start` and export the \
                  SPATE_KAFKA_BROKERS=... line it prints (`cargo xtask test` exports it to the tests)"
            .into()),
    }
}

/// Creates `topic` with `partitions` partitions unless it exists, and waits
/// until every partition has a leader. Returns whether it was created.
pub(crate) fn ensure_topic(brokers: &str, topic: &str, partitions: i32) -> Result<bool, Error> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let mut created = false;
    for result in runtime.block_on(admin.create_topics([&new], &AdminOptions::new()))? {
        match result {
            Ok(_) => created = true,
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => return Err(format!("cannot create topic {name}: {code}").into()),
        }
    }
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let deadline = Instant::now() + StdDuration::from_secs(30);
    while Instant::now() < deadline {
        let metadata = consumer.fetch_metadata(Some(topic), StdDuration::from_secs(5))?;
        let ready = metadata.topics().iter().any(|t| {
            t.name() == topic
                && t.error().is_none()
                && !t.partitions().is_empty()
                && t.partitions().iter().all(|p| p.leader() >= 0)
        });
        if ready {
            return Ok(created);
        }
        std::thread::sleep(StdDuration::from_millis(100));
    }
    Err(format!("topic {topic} has no leader for every partition after 30 s").into())
}

/// One record to produce.
#[derive(Clone, Debug)]
pub(crate) struct Produced {
    /// The partition (`None`: by key).
    pub(crate) partition: Option<i32>,
    /// The key.
    pub(crate) key: Option<String>,
    /// The value.
    pub(crate) value: String,
}

/// Produces `records` to `topic` with an idempotent producer and waits for every acknowledgement.
pub(crate) fn produce(brokers: &str, topic: &str, records: &[Produced]) -> Result<(), Error> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    for record in records {
        loop {
            let mut base = BaseRecord::<String, String>::to(topic).payload(&record.value);
            if let Some(key) = &record.key {
                base = base.key(key);
            }
            if let Some(partition) = record.partition {
                base = base.partition(partition);
            }
            match producer.send(base) {
                Ok(()) => break,
                Err((rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(StdDuration::from_millis(20));
                }
                Err((e, _)) => return Err(format!("produce to {topic}: {e}").into()),
            }
        }
    }
    producer.flush(StdDuration::from_secs(30))?;
    Ok(())
}

/// The end (high watermark) of every partition of `topic`.
pub(crate) fn end_offsets(brokers: &str, topic: &str) -> Result<std::collections::BTreeMap<i32, i64>, Error> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), StdDuration::from_secs(10))?;
    let mut ends = std::collections::BTreeMap::new();
    for partition in metadata.topics().iter().filter(|t| t.name() == topic).flat_map(|t| t.partitions()) {
        let (_, high) = consumer.fetch_watermarks(topic, partition.id(), StdDuration::from_secs(10))?;
        ends.insert(partition.id(), high);
    }
    Ok(ends)
}

/// One record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadBack {
    /// Its partition.
    pub(crate) partition: i32,
    /// Its offset.
    pub(crate) offset: i64,
    /// Its key, as text.
    pub(crate) key: Option<String>,
    /// Its value, as text.
    pub(crate) value: String,
}

/// Every committed record of `topic`, read with `isolation.level=read_committed`
/// (records of aborted or open transactions are not returned).
pub(crate) fn read_committed(brokers: &str, topic: &str) -> Result<Vec<ReadBack>, Error> {
    let group = format!("spate-example-reader-{}", std::process::id());
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", &group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), StdDuration::from_secs(10))?;
    let partitions: Vec<i32> =
        metadata.topics().iter().filter(|t| t.name() == topic).flat_map(|t| t.partitions()).map(|p| p.id()).collect();
    let mut list = TopicPartitionList::new();
    let mut ends = std::collections::BTreeMap::new();
    for &partition in &partitions {
        list.add_partition_offset(topic, partition, Offset::Beginning)?;
        // Under read_committed this is the last stable offset.
        let (_, high) = consumer.fetch_watermarks(topic, partition, StdDuration::from_secs(10))?;
        ends.insert(partition, high);
    }
    consumer.assign(&list)?;
    let mut positions: std::collections::BTreeMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
    let mut out = Vec::new();
    let deadline = Instant::now() + StdDuration::from_secs(60);
    while positions.iter().any(|(p, at)| ends.get(p).is_some_and(|end| at < end)) {
        if Instant::now() > deadline {
            return Err(format!("reading {topic} back did not reach its end offsets {ends:?} in 60 s").into());
        }
        match consumer.poll(StdDuration::from_millis(200)) {
            Some(Ok(m)) => {
                positions.insert(m.partition(), m.offset() + 1);
                out.push(ReadBack {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                });
            }
            Some(Err(e)) => return Err(format!("read {topic}: {e}").into()),
            None => {
                // Transaction markers take offsets no record has: the position moves past them.
                for element in consumer.position()?.elements() {
                    if let Offset::Offset(at) = element.offset() {
                        let position = positions.entry(element.partition()).or_insert(0);
                        *position = (*position).max(at);
                    }
                }
            }
        }
    }
    Ok(out)
}
