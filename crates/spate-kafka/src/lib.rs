//! Kafka for spate: a direct stream with safely stored offsets, an exclusive
//! consumer pool and exactly-once sinks.
//!
//! It features:
//!
//! - [`DirectKafkaStream`]: per batch, one [`OffsetRange`] per partition from
//!   the stream's position to the latest offset, capped by
//!   `max_rate_per_partition`, by backpressure and by the records and bytes
//!   its streaming context allows a batch (the context's settings own the
//!   caps and the batch interval; the stream is told them through
//!   [`spate_dstream::InputSource`]); the ranges are logged to
//!   `offsets/N` as JSON ([`OffsetRanges::to_json`]) and a re-run reads exactly
//!   them. It implements spate-dstream's [`spate_dstream::InputSource`];
//! - starting offsets: earliest, latest, the group's committed offsets, or
//!   Spark's JSON spec `{"topic":{"0":36,"1":-2}}`; both JSON shapes are
//!   decoded with bounds and checks ([`partition_offsets_from_json_bytes`],
//!   [`OffsetRanges::from_json_bytes`]);
//! - a [`ConsumerPool`] keyed by (group, topic, partition) whose consumers are
//!   checked out exclusively and are not `Sync`: Spark's *KafkaConsumer is
//!   not safe for multi-threaded access* cannot happen, it does not compile;
//! - offsets committed where you choose ([`OffsetCommit`]): the checkpoint
//!   only, also the Kafka group (for lag monitoring), or a transactional
//!   RocksDB store ([`RocksOffsetStore`]) holding the results and offsets in
//!   one write batch, exactly-once even when the checkpoint is lost;
//! - sinks: an idempotent [`KafkaSink`] and the exactly-once
//!   [`TransactionalKafkaSink`] (records and consumed offsets, marked with
//!   the batch id, in one Kafka transaction; a re-run of a committed batch,
//!   even one that read nothing, writes nothing; zombies fenced on restart);
//! - [`KafkaReceiver`], for Spark's receiver model: records go through the
//!   receiver's write-ahead log in blocks capped in records and bytes
//!   ([`DEFAULT_MAX_BLOCK_BYTES`]), and offsets are committed only after
//!   they are stored;
//! - offset reads and commits that retry while the group coordinator moves
//!   or loads (a fresh or restarting broker), within the call's timeout.
//!
//! It is not a Kafka client (that is librdkafka, through `rdkafka`) and it
//! does not schedule batches or write the offset log (`spate-runtime` does).
//!
//! ```
//! use spate_kafka::{OffsetRange, OffsetRanges, RocksOffsetStore, CommitOutcome};
//! use spate_core::BatchId;
//!
//! // What batch 0 reads, as logged in offsets/0.
//! let ranges = OffsetRanges::new(vec![
//!     OffsetRange::new("events", 0, 0, 36),
//!     OffsetRange::new("events", 1, 0, 12),
//! ]);
//! let json = ranges.to_json();
//! assert_eq!(OffsetRanges::from_json(&json)?, ranges);
//!
//! // The sink's results and the offsets they cover, in one write.
//! let dir = tempfile::tempdir()?;
//! let store = RocksOffsetStore::open(dir.path())?;
//! let outcome = store.commit_batch(BatchId(0), &ranges, |w| {
//!     w.put("events", ranges.count().to_string());
//!     Ok(())
//! })?;
//! assert_eq!(outcome, CommitOutcome::Committed);
//! // A re-run of the same batch after a crash is recognised.
//! assert_eq!(store.commit_batch(BatchId(0), &ranges, |_| Ok(()))?, CommitOutcome::AlreadyCommitted);
//! assert_eq!(store.offsets()?.map(|o| o.len()), Some(2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod consumer;
mod direct;
mod error;
mod fetch;
mod group;
mod offset_store;
mod offsets;
mod plan;
mod read_ahead;
mod receiver;
mod retry;
mod sink;
mod topics;

pub use consumer::{
    CheckedOutConsumer, ConsumerPool, ConsumerSettings, DataLossPolicy, KafkaRecord, PartitionConsumer,
    record_footprint,
};
pub use direct::{DirectKafkaSettings, DirectKafkaStream, OffsetCommit, StartingOffsets, TopicSelection};
pub use error::{KafkaError, Result};
pub use group::{AssignmentListener, GroupMember, GroupProtocol, GroupSettings};
pub use offset_store::{CommitOutcome, ResultWrites, RocksOffsetStore};
pub use offsets::{
    EARLIEST, LATEST, MAX_OFFSETS_JSON_BYTES, OffsetRange, OffsetRanges, PartitionOffsets, TopicPartition,
    partition_offsets_from_json, partition_offsets_from_json_bytes, partition_offsets_to_json,
};
pub use receiver::{DEFAULT_MAX_BLOCK_BYTES, KafkaReceiver, KafkaReceiverSettings};
pub use sink::{KafkaSink, MemberTransactions, OutputRecord, TransactionalKafkaSink};
pub use topics::{ensure_topic, partition_count};
