//! [`KafkaReceiver`]: Spark's receiver model for Kafka, made safe.
//!
//! The receiver consumes with a consumer group, gathers records into a
//! block (at most `max_block_records` and `max_block_bytes`, or whatever
//! arrived within `block_interval`), stores the block through the receiver's context —
//! durably, in the receiver write-ahead log when it is on — and only after
//! `store_block` returned commits the block's offsets to the group. A crash
//! between the two re-delivers the block (at-least-once into the WAL, never a
//! loss); the direct stream is the exactly-once path.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use spate_receiver::{Receiver, ReceiverContext, ReceiverError, StorageLevel};
use tracing::debug;

use crate::consumer::{KafkaRecord, record_footprint};
use crate::direct::to_list;
use crate::offsets::{PartitionOffsets, TopicPartition};

/// The bytes a block holds at most by default: 16 MiB. A block is one
/// record of the receiver write-ahead log, whose default limit is 64 MiB;
/// the footprint counted here (about 100 bytes a record besides key and
/// value) is larger than the block's encoding, so even a block that ends
/// with a large record stays well inside the log's limit.
pub const DEFAULT_MAX_BLOCK_BYTES: u64 = 16 << 20;

/// The configuration of a [`KafkaReceiver`].
#[derive(Clone, Debug)]
pub struct KafkaReceiverSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// The consumer group whose committed offsets mark what is stored.
    pub group_id: String,
    /// The topics subscribed to.
    pub topics: Vec<String>,
    /// The most records in one block.
    pub max_block_records: usize,
    /// The most bytes in one block ([`record_footprint`] of each record);
    /// a record larger than this is stored alone in its own block.
    pub max_block_bytes: u64,
    /// The longest a block waits for more records before it is stored.
    pub block_interval: Duration,
    /// Where a group without committed offsets starts: `earliest` or `latest`.
    pub auto_offset_reset: String,
}

impl KafkaReceiverSettings {
    /// Subscribes `group_id` to `topics`; blocks of up to 10,000 records,
    /// [`DEFAULT_MAX_BLOCK_BYTES`] or 200 ms.
    pub fn new(brokers: impl Into<String>, group_id: impl Into<String>, topics: Vec<String>) -> Self {
        KafkaReceiverSettings {
            brokers: brokers.into(),
            group_id: group_id.into(),
            topics,
            max_block_records: 10_000,
            max_block_bytes: DEFAULT_MAX_BLOCK_BYTES,
            block_interval: Duration::from_millis(200),
            auto_offset_reset: "earliest".into(),
        }
    }
}

/// A receiver reading Kafka topics through a consumer group.
#[derive(Debug)]
pub struct KafkaReceiver {
    config: KafkaReceiverSettings,
    stored_records: u64,
    /// A record received but left out of the last block (it would have
    /// passed the byte cap): the first of the next block.
    pending: Option<KafkaRecord>,
}

impl KafkaReceiver {
    /// A receiver with `config`.
    pub fn new(config: KafkaReceiverSettings) -> Self {
        KafkaReceiver { config, stored_records: 0, pending: None }
    }

    /// Records stored (and committed) so far, across restarts.
    pub fn stored_records(&self) -> u64 {
        self.stored_records
    }

    fn failure(&self, message: impl std::fmt::Display) -> ReceiverError {
        ReceiverError::Receiver { receiver: self.name_str(), message: message.to_string() }
    }

    fn name_str(&self) -> String {
        format!("kafka[{}:{}]", self.config.group_id, self.config.topics.join(","))
    }

    fn consumer(&self) -> Result<StreamConsumer, ReceiverError> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.config.brokers)
            .set("group.id", &self.config.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", &self.config.auto_offset_reset)
            .create()
            .map_err(|e| self.failure(format!("create consumer: {e}")))?;
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(|e| self.failure(format!("subscribe: {e}")))?;
        Ok(consumer)
    }

    /// Gathers one block: up to `max_block_records` and `max_block_bytes`,
    /// waiting at most the block interval. A record that would pass the byte
    /// cap is kept for the next block, so a block exceeds the cap only when
    /// its one record does.
    async fn next_block(
        &mut self,
        consumer: &StreamConsumer,
    ) -> Result<(Vec<KafkaRecord>, PartitionOffsets), ReceiverError> {
        let mut records = Vec::new();
        let mut next = BTreeMap::new();
        let mut bytes: u64 = 0;
        let deadline = tokio::time::Instant::now() + self.config.block_interval;
        while records.len() < self.config.max_block_records {
            let record = match self.pending.take() {
                Some(record) => record,
                None => match tokio::time::timeout_at(deadline, consumer.recv()).await {
                    Err(_elapsed) => break,
                    Ok(Err(e)) => return Err(self.failure(format!("poll: {e}"))),
                    Ok(Ok(message)) => KafkaRecord {
                        topic: message.topic().into(),
                        partition: message.partition(),
                        offset: message.offset(),
                        timestamp: message.timestamp().to_millis(),
                        key: message.key().map(<[u8]>::to_vec),
                        value: message.payload().map(<[u8]>::to_vec),
                    },
                },
            };
            let footprint =
                record_footprint(record.key.as_ref().map_or(0, Vec::len), record.value.as_ref().map_or(0, Vec::len));
            if !block_has_room(records.len(), bytes, footprint, self.config.max_block_bytes) {
                self.pending = Some(record);
                break;
            }
            bytes = bytes.saturating_add(footprint);
            // The broker's offset: at i64::MAX there is nothing after it to commit.
            next.insert(TopicPartition::new(&*record.topic, record.partition), record.offset.saturating_add(1));
            records.push(record);
        }
        Ok((records, next))
    }
}

/// Whether a record of `footprint` bytes joins a block of `records`
/// records and `bytes` bytes: always into an empty block (so a record larger
/// than the cap is still stored), otherwise only within `max_bytes`.
fn block_has_room(records: usize, bytes: u64, footprint: u64, max_bytes: u64) -> bool {
    records == 0 || bytes.saturating_add(footprint) <= max_bytes
}

#[async_trait]
impl Receiver<KafkaRecord> for KafkaReceiver {
    fn name(&self) -> String {
        self.name_str()
    }

    fn storage_level(&self) -> StorageLevel {
        StorageLevel::default()
    }

    async fn run(&mut self, ctx: ReceiverContext<KafkaRecord>) -> Result<(), ReceiverError> {
        let consumer = self.consumer()?;
        // A new consumer starts at the group's committed offsets, which a
        // record held back by an earlier run never passed: it comes again.
        self.pending = None;
        while !ctx.is_stopped() {
            let (records, next) = self.next_block(&consumer).await?;
            if records.is_empty() {
                continue;
            }
            let count = records.len() as u64;
            // Durable (WAL) before the offsets move: a crash re-delivers, never loses.
            let info = ctx.store_block(records, None)?;
            let list = to_list(&next).map_err(|e| self.failure(e))?;
            consumer.commit(&list, CommitMode::Sync).map_err(|e| self.failure(format!("commit offsets: {e}")))?;
            self.stored_records += count;
            debug!(block = %info.block_id(), records = count, "block stored, offsets committed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_takes_records_within_its_byte_cap_and_always_its_first() {
        assert!(block_has_room(0, 0, 500, 100), "a record larger than the cap goes alone");
        assert!(block_has_room(3, 60, 40, 100));
        assert!(!block_has_room(3, 61, 40, 100));
        assert!(!block_has_room(1, u64::MAX, 1, u64::MAX - 1), "no overflow near the top");
        let config = KafkaReceiverSettings::new("b", "g", vec!["t".into()]);
        assert_eq!(config.max_block_bytes, DEFAULT_MAX_BLOCK_BYTES);
        assert!(
            DEFAULT_MAX_BLOCK_BYTES < u64::from(spate_wal::DEFAULT_MAX_RECORD_SIZE),
            "a default block fits the WAL"
        );
    }
}
