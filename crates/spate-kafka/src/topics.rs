//! Topics an application makes for itself: looking up a topic's partition
//! count and creating an internal topic with a given count.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::info;

use crate::error::{KafkaError, Result, client};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The number of partitions of `topic`.
pub fn partition_count(brokers: &str, topic: &str) -> Result<i32> {
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", brokers).create().map_err(client("create a metadata client"))?;
    let metadata =
        consumer.fetch_metadata(Some(topic), TIMEOUT).map_err(client(format!("fetch metadata of {topic}")))?;
    let count =
        metadata.topics().iter().find(|t| t.name() == topic && t.error().is_none()).map_or(0, |t| t.partitions().len());
    match i32::try_from(count) {
        Ok(count) if count > 0 => Ok(count),
        _ => Err(KafkaError::UnknownTopic { topic: topic.to_string() }),
    }
}

/// Creates `topic` with `partitions` partitions (the broker's default
/// replication) unless it exists; an existing topic with another count is
/// an error naming both, since keys would go to other partitions than
/// before. Returns once the topic's partitions are known.
pub fn ensure_topic(brokers: &str, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().map_err(client("create an admin client"))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| KafkaError::Config(format!("cannot start a runtime to create {topic}: {e}")))?;
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let results = runtime.block_on(admin.create_topics([&new], &options)).map_err(client(format!("create {topic}")))?;
    for result in results {
        match result {
            Ok(_) => info!(topic, partitions, "internal topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(KafkaError::Config(format!("cannot create topic {topic}: {code}")));
            }
        }
    }
    let found = wait_for_partitions(brokers, topic)?;
    if found != partitions {
        return Err(KafkaError::Config(format!(
            "topic {topic} has {found} partitions, the application needs {partitions}: \
             delete it, or give the application the partition count it was made with"
        )));
    }
    Ok(())
}

/// The partition count of a topic just created, once its metadata shows it.
fn wait_for_partitions(brokers: &str, topic: &str) -> Result<i32> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match partition_count(brokers, topic) {
            Ok(count) => return Ok(count),
            Err(KafkaError::UnknownTopic { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}
