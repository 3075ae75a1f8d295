//! [`KafkaError`]: everything that can go wrong in this crate, with the
//! topic, partition, offset or path a person needs to act on it.

use std::path::PathBuf;

use spate_core::BatchId;

/// The errors of spate-kafka.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// librdkafka refused or failed an operation.
    #[error("kafka {operation}: {source}")]
    Client {
        /// What was being done ("create consumer", "fetch watermarks of t/0", …).
        operation: String,
        /// librdkafka's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The records a range needs are gone from the broker (retention or
    /// `delete_records`), and the policy is to fail.
    #[error(
        "records {from}..{until} of {topic}/{partition} are needed but the broker's earliest offset is {earliest}: \
         they were deleted (retention?); set DataLossPolicy::Skip to skip them with a warning"
    )]
    DataLoss {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The first offset the range needs.
        from: i64,
        /// The end of the range (exclusive).
        until: i64,
        /// The broker's earliest offset now.
        earliest: i64,
    },
    /// A poll waited longer than the poll timeout for a record the range needs.
    #[error("no record at offset {offset} of {topic}/{partition} within the poll timeout of {timeout_ms} ms")]
    PollTimeout {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset waited for.
        offset: i64,
        /// The poll timeout.
        timeout_ms: u64,
    },
    /// Offsets JSON (a starting-offsets spec or a logged range) could not be read.
    #[error("bad offsets JSON ({reason}): {json}")]
    BadOffsets {
        /// What is wrong.
        reason: String,
        /// The JSON, clipped.
        json: String,
    },
    /// Offsets from the broker, the consumer group or the starting-offsets
    /// spec would make a range no partition can have.
    #[error("cannot plan a batch of {partition}: {reason}")]
    BadRange {
        /// The partition.
        partition: crate::offsets::TopicPartition,
        /// What is wrong, with the offsets.
        reason: String,
    },
    /// The configuration is inconsistent.
    #[error("bad kafka configuration: {0}")]
    Config(String),
    /// A topic does not exist (or has no partitions).
    #[error("topic {topic} does not exist or has no partitions")]
    UnknownTopic {
        /// The topic.
        topic: String,
    },
    /// The transactional RocksDB offset store failed.
    #[error("offset store {path}: {reason}")]
    Store {
        /// The store's folder.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A Kafka transaction failed and was aborted; the batch must be re-run.
    #[error("kafka transaction for batch {batch} of transactional id {transactional_id} failed: {reason}")]
    Transaction {
        /// The batch being written.
        batch: BatchId,
        /// The producer's transactional id.
        transactional_id: String,
        /// What failed.
        reason: String,
    },
    /// A record could not be delivered by the producer.
    #[error("delivery to {topic} failed: {source}")]
    Delivery {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A worker thread reading a partition panicked.
    #[error("the task reading {topic}/{partition} panicked")]
    TaskPanicked {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
}

/// This crate's result.
pub type Result<T, E = KafkaError> = std::result::Result<T, E>;

/// Wraps a librdkafka error with what was being done.
pub(crate) fn client(operation: impl Into<String>) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError {
    move |source| KafkaError::Client { operation: operation.into(), source }
}

/// Keeps error messages short when they quote input.
pub(crate) fn clip(text: &str) -> String {
    const MAX: usize = 200;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
