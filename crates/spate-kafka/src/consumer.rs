//! The consumer pool: one consumer per task, checked out exclusively.
//!
//! Spark caches one `KafkaConsumer` per (group, topic, partition) and hands
//! it to whichever task asks; a window and a concurrent job reading the same
//! partition in the same batch then share it and fail with *KafkaConsumer is
//! not safe for multi-threaded access*. Here a [`PartitionConsumer`] is
//! checked out of the [`ConsumerPool`] by value: while a task holds its
//! [`CheckedOutConsumer`] guard nobody else can have it, a second task asking
//! for the same partition gets another consumer, and the guard returns it to
//! the pool when dropped. The consumer type is `Send` but not `Sync`, so even
//! a reference to it cannot cross into another thread:
//!
//! ```compile_fail
//! fn read_in_two_threads(consumer: &spate_kafka::PartitionConsumer) {
//!     // Sharing a consumer between threads does not compile: it is not `Sync`.
//!     std::thread::scope(|s| {
//!         s.spawn(|| consumer.next_offset());
//!         s.spawn(|| consumer.next_offset());
//!     });
//! }
//! ```

use std::cell::Cell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spate_core::sync::lock;

/// How long one poll waits before the consumer's position is looked at:
/// a range that ends in transaction markers is done once the position
/// passes its end, though no record arrives.
const POLL_SLICE: Duration = Duration::from_millis(100);

use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::error::{KafkaError, Result, client};
use crate::offsets::{OffsetRange, TopicPartition};

/// What to do when a range needs records the broker no longer has
/// (retention, `delete_records`): Spark's `failOnDataLoss`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataLossPolicy {
    /// Fail the batch with [`KafkaError::DataLoss`] (the default).
    #[default]
    Fail,
    /// Skip the missing records with a warning and read what is left.
    Skip,
}

/// One record read from Kafka.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KafkaRecord {
    /// The topic (shared by every record of a range).
    #[serde(with = "spate_core::shared_str")]
    pub topic: Arc<str>,
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The record's timestamp in milliseconds, when it has one.
    pub timestamp: Option<i64>,
    /// The key.
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Option<Vec<u8>>,
}

/// Through a receiver's blocks and write-ahead log by serde.
impl spate_receiver::Record for KafkaRecord {}

impl KafkaRecord {
    /// The record's timestamp as an event time (for event-time windows:
    /// `|r: &KafkaRecord| r.event_time().unwrap_or(Time::ZERO)`), or `None`
    /// for a record written without one (message format before Kafka 0.10).
    pub fn event_time(&self) -> Option<spate_core::Time> {
        self.timestamp.map(spate_core::Time::from_millis)
    }
}

/// The bytes a record holds in memory, as the byte cap of a batch counts
/// them: its key and value plus the record itself (topic, offsets, the
/// vectors' headers). Counting the record's own size keeps a batch of many
/// tiny records within the cap too.
pub fn record_footprint(key_len: usize, value_len: usize) -> u64 {
    let total = std::mem::size_of::<KafkaRecord>().saturating_add(key_len).saturating_add(value_len);
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// How consumers are made: the brokers, the group and librdkafka settings.
#[derive(Clone, Debug)]
pub struct ConsumerSettings {
    /// Bootstrap servers, `host:port[,host:port]`.
    pub brokers: String,
    /// The consumer group (pool key and the group offsets are committed to).
    pub group_id: String,
    /// How long one poll waits for a record a range needs.
    pub poll_timeout: Duration,
    /// What to do when records are gone from the broker.
    pub data_loss: DataLossPolicy,
    /// Extra librdkafka properties (e.g. `isolation.level`), applied last.
    pub properties: Vec<(String, String)>,
}

impl ConsumerSettings {
    /// Settings for `brokers` and `group_id`, poll timeout 10 s, failing on data loss.
    pub fn new(brokers: impl Into<String>, group_id: impl Into<String>) -> Self {
        ConsumerSettings {
            brokers: brokers.into(),
            group_id: group_id.into(),
            poll_timeout: Duration::from_secs(10),
            data_loss: DataLossPolicy::Fail,
            properties: Vec::new(),
        }
    }

    /// The librdkafka configuration of a reading consumer: no automatic
    /// commits or offset stores (offsets are the stream's business), and an
    /// out-of-range offset is an error rather than a silent jump.
    pub(crate) fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "100");
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }
}

/// A consumer reading one partition, owned by one task at a time.
///
/// It remembers where it stands, so consecutive ranges of the same partition
/// are read without a seek; a range starting elsewhere re-seeks.
pub struct PartitionConsumer {
    consumer: BaseConsumer,
    partition: TopicPartition,
    topic_name: Arc<str>,
    next_offset: Option<i64>,
    settings: Arc<ConsumerSettings>,
    /// `Cell` is `Send` but not `Sync`: the consumer may move to another
    /// thread with its owner, but can never be reached from two at once.
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for PartitionConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionConsumer")
            .field("partition", &self.partition)
            .field("next_offset", &self.next_offset)
            .finish_non_exhaustive()
    }
}

impl PartitionConsumer {
    fn new(settings: Arc<ConsumerSettings>, partition: TopicPartition) -> Result<Self> {
        let consumer: BaseConsumer =
            settings.client_config().create().map_err(client(format!("create a consumer for {partition}")))?;
        Ok(PartitionConsumer {
            consumer,
            topic_name: Arc::from(partition.topic.as_str()),
            partition,
            next_offset: None,
            settings,
            _not_sync: PhantomData,
        })
    }

    /// The partition this consumer reads.
    pub fn partition(&self) -> &TopicPartition {
        &self.partition
    }

    /// The offset the next poll returns, when the consumer is positioned.
    pub fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    fn seek(&mut self, offset: i64) -> Result<()> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.partition.topic, self.partition.partition, Offset::Offset(offset))
            .map_err(client(format!("seek {} to {offset}", self.partition)))?;
        self.consumer.assign(&list).map_err(client(format!("assign {} at {offset}", self.partition)))?;
        debug!(partition = %self.partition, offset, "consumer positioned");
        self.next_offset = Some(offset);
        Ok(())
    }

    /// Where the consumer stands in its partition: past the last record it
    /// handed out and past any markers and aborted records after it.
    fn position(&self) -> Option<i64> {
        let list = self.consumer.position().ok()?;
        let element = list.find_partition(&self.partition.topic, self.partition.partition)?;
        match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }
    }

    fn earliest_offset(&self) -> Result<i64> {
        // A failed read poisons this consumer: its pool opens a new one.
        let (low, _) = self
            .consumer
            .fetch_watermarks(&self.partition.topic, self.partition.partition, self.settings.poll_timeout)
            .map_err(client(format!("fetch watermarks of {}", self.partition)))?;
        Ok(low)
    }

    /// Reads the range `[from, until)` into memory.
    pub fn read_range(&mut self, range: &OffsetRange) -> Result<Vec<KafkaRecord>> {
        let mut records = Vec::with_capacity(usize::try_from(range.count()).unwrap_or(0).min(1 << 20));
        self.for_each_in_range(range, |record| records.push(record))?;
        Ok(records)
    }

    /// Reads `range` from its start while the records' [`record_footprint`]s
    /// sum to at most `max_bytes`, stopping before the first record that
    /// would pass it; the range's first record is always read, so a record
    /// larger than `max_bytes` still moves the stream. Returns the records
    /// and where reading stopped: what was read is `[range.from, stop)`.
    pub fn read_range_within(&mut self, range: &OffsetRange, max_bytes: u64) -> Result<(Vec<KafkaRecord>, i64)> {
        let mut records = Vec::new();
        let mut bytes: u64 = 0;
        let accept = |footprint: u64| {
            let first = bytes == 0;
            let sum = bytes.saturating_add(footprint);
            if first || sum <= max_bytes {
                bytes = sum;
                return true;
            }
            false
        };
        let stop = self.scan(range, accept, |record| records.push(record))?;
        Ok((records, stop))
    }

    /// Reads the range `[from, until)`, handing each record to `f` in offset
    /// order. Offsets missing inside the range (compaction, transaction
    /// markers) are passed over; offsets missing because the broker deleted
    /// them are handled by the [`DataLossPolicy`].
    pub fn for_each_in_range(&mut self, range: &OffsetRange, f: impl FnMut(KafkaRecord)) -> Result<()> {
        self.scan(range, |_| true, f).map(drop)
    }

    /// Reads `range` in offset order, asking `accept` with each record's
    /// [`record_footprint`] before handing it to `f`; stops at the end of
    /// the range or before the first record refused. Returns where it
    /// stopped (`range.until`, or the offset of the refused record).
    fn scan(
        &mut self,
        range: &OffsetRange,
        mut accept: impl FnMut(u64) -> bool,
        mut f: impl FnMut(KafkaRecord),
    ) -> Result<i64> {
        if range.topic != self.partition.topic || range.partition != self.partition.partition {
            return Err(KafkaError::Config(format!("range {range} given to the consumer of {}", self.partition)));
        }
        let mut wanted = range.from;
        if wanted >= range.until {
            return Ok(range.until);
        }
        if self.next_offset != Some(wanted) {
            self.seek(wanted)?;
        }
        let mut waited = Duration::ZERO;
        while wanted < range.until {
            match self.consumer.poll(POLL_SLICE) {
                None if self.position().is_some_and(|p| p >= range.until) => {
                    // What is left of the range is no record for the
                    // application: transaction markers, records of aborted
                    // transactions (read_committed), which the consumer
                    // steps over without handing them out.
                    self.next_offset = None;
                    return Ok(range.until);
                }
                None if waited < self.settings.poll_timeout => waited += POLL_SLICE,
                None => {
                    self.next_offset = None;
                    return Err(KafkaError::PollTimeout {
                        topic: range.topic.clone(),
                        partition: range.partition,
                        offset: wanted,
                        timeout_ms: u64::try_from(self.settings.poll_timeout.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                Some(Err(e)) if is_out_of_range(&e) => {
                    wanted = self.after_data_loss(range, wanted)?;
                }
                Some(Err(e)) => {
                    self.next_offset = None;
                    return Err(client(format!("poll {} at {wanted}", self.partition))(e));
                }
                Some(Ok(message)) => {
                    let offset = message.offset();
                    if offset < wanted {
                        continue; // left over from before a seek
                    }
                    if offset > wanted
                        && offset < range.until
                        && let Err(e) = self.check_gap(range, wanted, offset)
                    {
                        drop(message);
                        self.next_offset = None;
                        return Err(e);
                    }
                    if offset >= range.until {
                        // The broker's offset: at i64::MAX there is no next one to expect.
                        self.next_offset = offset.checked_add(1);
                        return Ok(range.until);
                    }
                    let footprint = record_footprint(
                        message.key().map_or(0, <[u8]>::len),
                        message.payload().map_or(0, <[u8]>::len),
                    );
                    if !accept(footprint) {
                        // This record was polled but not taken: the next read must seek back to it.
                        self.next_offset = None;
                        return Ok(offset);
                    }
                    f(KafkaRecord {
                        topic: Arc::clone(&self.topic_name),
                        partition: range.partition,
                        offset,
                        timestamp: message.timestamp().to_millis(),
                        key: message.key().map(<[u8]>::to_vec),
                        value: message.payload().map(<[u8]>::to_vec),
                    });
                    wanted = offset + 1;
                }
            }
        }
        self.next_offset = Some(wanted);
        Ok(range.until)
    }

    /// The consumer was asked for an offset the broker no longer has.
    /// Returns where reading goes on (Skip), or the data-loss error (Fail).
    fn after_data_loss(&mut self, range: &OffsetRange, wanted: i64) -> Result<i64> {
        let earliest = self.earliest_offset()?;
        if earliest <= wanted {
            // Not a loss after all (e.g. the log was truncated and refilled): retry.
            self.seek(wanted)?;
            return Ok(wanted);
        }
        if let Err(e) = self.data_loss(range, wanted, earliest) {
            self.next_offset = None;
            return Err(e);
        }
        let resume = earliest.min(range.until);
        if resume < range.until {
            self.seek(resume)?;
        } else {
            self.next_offset = None;
        }
        Ok(resume)
    }

    /// Offsets `[wanted, got)` were skipped by the broker: fine when they
    /// are compacted away or transaction markers, a loss when deleted.
    fn check_gap(&self, range: &OffsetRange, wanted: i64, got: i64) -> Result<()> {
        let earliest = self.earliest_offset()?;
        if earliest > wanted { self.data_loss(range, wanted, earliest.min(got)) } else { Ok(()) }
    }

    fn data_loss(&self, range: &OffsetRange, wanted: i64, earliest: i64) -> Result<()> {
        match self.settings.data_loss {
            DataLossPolicy::Fail => Err(KafkaError::DataLoss {
                topic: range.topic.clone(),
                partition: range.partition,
                from: wanted,
                until: range.until,
                earliest,
            }),
            DataLossPolicy::Skip => {
                warn!(
                    partition = %self.partition,
                    lost_from = wanted,
                    lost_until = earliest.min(range.until),
                    "records deleted from the broker before they were read; skipping them"
                );
                Ok(())
            }
        }
    }
}

fn is_out_of_range(error: &RdKafkaError) -> bool {
    matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange))
}

type PoolKey = (String, TopicPartition);

/// Consumers kept between batches, keyed by (group, topic, partition).
#[derive(Debug)]
pub struct ConsumerPool {
    settings: Arc<ConsumerSettings>,
    idle: Mutex<HashMap<PoolKey, Vec<PartitionConsumer>>>,
    max_idle_per_partition: usize,
    created: AtomicU64,
}

impl ConsumerPool {
    /// An empty pool making consumers with `settings`.
    pub fn new(settings: ConsumerSettings) -> Self {
        ConsumerPool {
            settings: Arc::new(settings),
            idle: Mutex::new(HashMap::new()),
            max_idle_per_partition: 4,
            created: AtomicU64::new(0),
        }
    }

    /// The settings consumers are made with.
    pub fn settings(&self) -> &ConsumerSettings {
        &self.settings
    }

    /// Takes an idle consumer of `partition` out of the pool, or makes one.
    /// The caller owns it until the guard is dropped.
    pub fn checkout(&self, partition: &TopicPartition) -> Result<CheckedOutConsumer<'_>> {
        let key = (self.settings.group_id.clone(), partition.clone());
        let pooled = lock(&self.idle).get_mut(&key).and_then(Vec::pop);
        let consumer = match pooled {
            Some(consumer) => consumer,
            None => {
                self.created.fetch_add(1, Ordering::Relaxed);
                PartitionConsumer::new(Arc::clone(&self.settings), partition.clone())?
            }
        };
        Ok(CheckedOutConsumer { pool: self, key: Some(key), consumer: Some(consumer), poisoned: false })
    }

    /// How many consumers the pool has made so far.
    pub fn consumers_created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// How many consumers wait in the pool now.
    pub fn idle_count(&self) -> usize {
        lock(&self.idle).values().map(Vec::len).sum()
    }

    fn give_back(&self, key: PoolKey, consumer: PartitionConsumer) {
        let mut idle = lock(&self.idle);
        let list = idle.entry(key).or_default();
        if list.len() < self.max_idle_per_partition {
            list.push(consumer);
        }
    }
}

/// A consumer checked out of a [`ConsumerPool`]: exclusively the holder's
/// until dropped, when it goes back to the pool (or is closed, after an error).
#[derive(Debug)]
pub struct CheckedOutConsumer<'pool> {
    pool: &'pool ConsumerPool,
    key: Option<PoolKey>,
    consumer: Option<PartitionConsumer>,
    poisoned: bool,
}

impl CheckedOutConsumer<'_> {
    /// Reads `range` (see [`PartitionConsumer::read_range`]); after an error
    /// the consumer is closed instead of going back to the pool.
    pub fn read_range(&mut self, range: &OffsetRange) -> Result<Vec<KafkaRecord>> {
        let result = self.deref_mut().read_range(range);
        self.poisoned |= result.is_err();
        result
    }

    /// Reads `range` within `max_bytes` (see [`PartitionConsumer::read_range_within`]).
    pub fn read_range_within(&mut self, range: &OffsetRange, max_bytes: u64) -> Result<(Vec<KafkaRecord>, i64)> {
        let result = self.deref_mut().read_range_within(range, max_bytes);
        self.poisoned |= result.is_err();
        result
    }

    /// Streams `range` into `f` (see [`PartitionConsumer::for_each_in_range`]).
    pub fn for_each_in_range(&mut self, range: &OffsetRange, f: impl FnMut(KafkaRecord)) -> Result<()> {
        let result = self.deref_mut().for_each_in_range(range, f);
        self.poisoned |= result.is_err();
        result
    }
}

impl Deref for CheckedOutConsumer<'_> {
    type Target = PartitionConsumer;

    fn deref(&self) -> &PartitionConsumer {
        // Only `drop` takes the consumer out.
        self.consumer.as_ref().unwrap_or_else(|| unreachable!("consumer taken before drop"))
    }
}

impl DerefMut for CheckedOutConsumer<'_> {
    fn deref_mut(&mut self) -> &mut PartitionConsumer {
        self.consumer.as_mut().unwrap_or_else(|| unreachable!("consumer taken before drop"))
    }
}

impl Drop for CheckedOutConsumer<'_> {
    fn drop(&mut self) {
        if let (Some(key), Some(consumer)) = (self.key.take(), self.consumer.take())
            && !self.poisoned
        {
            self.pool.give_back(key, consumer);
        }
    }
}
