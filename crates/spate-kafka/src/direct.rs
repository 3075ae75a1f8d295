//! The direct stream: plans each batch's offset ranges and reads them
//! partition-parallel through the [`ConsumerPool`].
//!
//! Per batch it asks the broker for the latest offset of every partition,
//! caps each range by `max_rate_per_partition` × batch seconds and by the
//! rate backpressure allows (shared out by lag, as Spark does), and moves its
//! position to the ranges' ends. The ranges are what the batch logs to
//! `offsets/N`; handed back on a re-run they read exactly the same records.
//!
//! # Memory: every batch is capped
//!
//! A batch holds its records in memory, so a first batch from `earliest` on
//! a large topic must not be the whole topic. Every batch is planned within
//! the [`BatchLimits`] its streaming context gives (records, and bytes: key,
//! value and the record's own size, see
//! [`record_footprint`](crate::record_footprint)); the context's settings
//! own the caps and their defaults (spate-runtime's `StreamingSettings`:
//! 500,000 records, 64 MiB or a quarter of the memory budget), so the
//! stream is not configured with them a second time. The record cap is
//! shared out by lag like backpressure's limit. The batch interval, which
//! turns `max_rate_per_partition` into records per batch, comes the same
//! way, when the stream is registered ([`DirectKafkaStream::register`]).
//!
//! The byte cap cannot be decided from offsets: a record's size is known
//! only once it is read. Estimating from earlier batches would overshoot on
//! the first batch and whenever record sizes change, so the stream reads
//! while it plans: [`DirectKafkaStream::plan_batch`] reads the record-capped
//! ranges, each partition stopping before the record that would take it past
//! its share of the byte cap (shares in proportion to the records planned
//! for it; the first record of a range is always taken, so a record larger
//! than its share still moves the stream), and returns the ranges actually
//! read. Those are what the runtime logs to `offsets/N`, and the records wait
//! in the stream until [`DirectKafkaStream::read`] (the batch's compute)
//! asks for exactly those ranges. The order the runtime keeps is unchanged:
//! plan, write `offsets/N` durably, compute, run outputs; the early read
//! only moves records into memory, nothing leaves the process before the
//! offsets are durable, and a crash before the write loses nothing (the next
//! run plans again from the last logged ranges).
//!
//! A re-run after a crash reads its logged ranges exactly, without caps:
//! they were read within the caps when planned, and Kafka does not change
//! the records of an offset (compaction only removes some), so it holds no
//! more than the first run did. Only ranges logged with a larger cap (or by
//! a version without caps) can be larger.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration as StdDuration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use spate_core::sync::lock;
use spate_core::{Duration, Time};
use spate_dstream::{ArrivalStage, BatchLimits, ProcessedBlock, SourceContext};
use tracing::{debug, info, warn};

use crate::consumer::{ConsumerPool, ConsumerSettings, DataLossPolicy, KafkaRecord};
use crate::error::{KafkaError, Result, client};
use crate::fetch::{join, read_within, record_input};
use crate::offset_store::RocksOffsetStore;
use crate::offsets::{EARLIEST, LATEST, OffsetRange, OffsetRanges, PartitionOffsets, TopicPartition};
use crate::plan::{AlreadyRead, Limits, batch_record_limit, plan_rest};
use crate::read_ahead::{Ahead, ReadAhead};
use crate::retry::{retry_coordinator, retry_unavailable};

/// Which partitions the stream reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicSelection {
    /// Every partition of these topics, including partitions added later.
    Subscribe(Vec<String>),
    /// Exactly these partitions.
    Assign(Vec<TopicPartition>),
}

/// Where a stream with no stored position starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartingOffsets {
    /// The earliest offset still on the broker.
    Earliest,
    /// The latest offset: only records produced from now on.
    Latest,
    /// The consumer group's committed offsets; partitions without one start
    /// at the fallback (earliest or latest).
    Committed {
        /// Where partitions without a committed offset start.
        fallback: Box<StartingOffsets>,
    },
    /// Per partition, in Spark's JSON shape (`{"topic":{"0":36,"1":-2}}`,
    /// -2 earliest, -1 latest); partitions not named start at the earliest.
    Spec(PartitionOffsets),
}

/// Where the stream's offsets are committed after each batch.
#[derive(Clone, Debug, Default)]
pub enum OffsetCommit {
    /// Only in the checkpoint's offset log (the runtime writes it).
    #[default]
    CheckpointOnly,
    /// Also to the Kafka consumer group after each batch, so monitoring
    /// tools see the lag. The group's offsets are not used for recovery.
    KafkaGroup,
    /// In a transactional RocksDB store, with the batch's results, by the
    /// sink (see [`RocksOffsetStore::commit_batch`]). The stream starts from
    /// the store's offsets whatever the checkpoint says, so the store's sink
    /// is exactly-once even when the checkpoint is lost or the code changes.
    TransactionalStore(Arc<RocksOffsetStore>),
}

/// The configuration of a [`DirectKafkaStream`].
#[derive(Clone, Debug)]
pub struct DirectKafkaSettings {
    /// Brokers, group, poll timeout, data-loss policy, librdkafka properties.
    pub consumer: ConsumerSettings,
    /// The partitions read.
    pub topics: TopicSelection,
    /// Where a stream without a stored position starts.
    pub starting_offsets: StartingOffsets,
    /// At most this many records per second per partition (Spark's `maxRatePerPartition`).
    pub max_rate_per_partition: Option<u64>,
    /// Where offsets are committed.
    pub commit: OffsetCommit,
}

impl DirectKafkaSettings {
    /// A stream over `topics` from the earliest offsets, committing to the checkpoint only.
    pub fn subscribe(
        brokers: impl Into<String>,
        group_id: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        DirectKafkaSettings {
            consumer: ConsumerSettings::new(brokers, group_id),
            topics: TopicSelection::Subscribe(topics.into_iter().map(Into::into).collect()),
            starting_offsets: StartingOffsets::Earliest,
            max_rate_per_partition: None,
            commit: OffsetCommit::CheckpointOnly,
        }
    }

    /// Reads exactly `partitions` instead.
    pub fn with_partitions(mut self, partitions: impl IntoIterator<Item = TopicPartition>) -> Self {
        self.topics = TopicSelection::Assign(partitions.into_iter().collect());
        self
    }

    /// Sets where a stream without a stored position starts.
    pub fn with_starting_offsets(mut self, starting: StartingOffsets) -> Self {
        self.starting_offsets = starting;
        self
    }

    /// Starting offsets from Spark's JSON spec (`{"topic":{"0":36,"1":-2}}`).
    pub fn with_starting_offsets_json(self, json: &str) -> Result<Self> {
        Ok(self.with_starting_offsets(StartingOffsets::Spec(crate::offsets::partition_offsets_from_json(json)?)))
    }

    /// Caps each partition at `records_per_second`.
    pub fn with_max_rate_per_partition(mut self, records_per_second: u64) -> Self {
        self.max_rate_per_partition = Some(records_per_second);
        self
    }

    /// Sets where offsets are committed.
    pub fn with_commit(mut self, commit: OffsetCommit) -> Self {
        self.commit = commit;
        self
    }

    /// Sets the data-loss policy.
    pub fn with_data_loss_policy(mut self, policy: DataLossPolicy) -> Self {
        self.consumer.data_loss = policy;
        self
    }

    /// Sets how long a poll waits for a record a range needs.
    pub fn with_poll_timeout(mut self, timeout: StdDuration) -> Self {
        self.consumer.poll_timeout = timeout;
        self
    }

    /// Adds a librdkafka property for the reading consumers.
    pub fn with_consumer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.consumer.properties.push((key.into(), value.into()));
        self
    }
}

/// A Kafka source that plans offset ranges per batch and reads them with
/// exclusively owned consumers.
///
/// # Reading ahead
///
/// When the stream's only reader in the graph is a record-wise operator
/// (`map`, `flat_map`, `filter`, `map_values`) or a per-key aggregate
/// (`reduce_by_key`, `combine_by_key`, a window by key), the stream reads
/// each batch while its interval is still open: a thread reads what the
/// broker has in chunks of at most 65,536 records, within the batch's caps,
/// runs the operator (and the record-wise operators after it, up to an
/// aggregate that combines the chunk by key) on each chunk and keeps only
/// its result. The plan at the
/// boundary reads what is left, and its ranges start where the batch
/// starts, so `offsets/N` covers the records read ahead too and a re-run
/// reads them again. Nothing read ahead is visible before the batch is
/// planned, logged and computed; the batch's result is the one the
/// operators give over each whole partition. Whatever reads the stream
/// otherwise (`map_partitions`, `window`, `transform`, two operators) is
/// computed at the boundary as before.
pub struct DirectKafkaStream {
    config: DirectKafkaSettings,
    pool: Arc<ConsumerPool>,
    /// Metadata, watermarks and group commits only; records go through the pool.
    admin: Mutex<BaseConsumer>,
    /// Where the next batch starts; `None` until resolved from the starting offsets.
    position: Mutex<Option<PartitionOffsets>>,
    /// Records per second backpressure allows the whole stream (0: no limit).
    rate_limit: AtomicU64,
    /// The records the last plan read, until the batch asks for them.
    prefetched: Mutex<Option<Prefetched>>,
    /// Reads the next batch during its interval, when the graph handed the
    /// stream a chunkable operator chain (see [`crate::read_ahead`]).
    read_ahead: OnceLock<ReadAhead>,
    /// What the streaming context said when the stream was registered.
    context: OnceLock<SourceContext>,
}

/// What was read while planning a batch, with the ranges it covers.
struct Prefetched {
    ranges: OffsetRanges,
    read: Read,
}

/// A batch read before its compute: its records, or, when the stream reads
/// ahead, the operator's result over each partition.
enum Read {
    Records(Vec<Vec<KafkaRecord>>),
    Processed(Vec<ProcessedBlock>),
}

impl std::fmt::Debug for DirectKafkaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectKafkaStream")
            .field("config", &self.config)
            .field("pool", &self.pool)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl DirectKafkaStream {
    /// A stream with `config`; nothing is asked of the broker until the first plan.
    pub fn new(config: DirectKafkaSettings) -> Result<Self> {
        let admin: BaseConsumer =
            config.consumer.client_config().create().map_err(client("create the metadata consumer"))?;
        Ok(DirectKafkaStream {
            pool: Arc::new(ConsumerPool::new(config.consumer.clone())),
            config,
            admin: Mutex::new(admin),
            position: Mutex::new(None),
            rate_limit: AtomicU64::new(0),
            prefetched: Mutex::new(None),
            read_ahead: OnceLock::new(),
            context: OnceLock::new(),
        })
    }

    /// Takes the batch interval (and the memory budget) of the streaming
    /// context that reads the stream; the runtime calls it through
    /// [`spate_dstream::InputSource::register`] when the graph is built. A stream belongs
    /// to one context: registering it again with another interval is an
    /// error.
    pub fn register(&self, context: &SourceContext) -> Result<()> {
        if context.batch_interval == Duration::ZERO {
            return Err(KafkaError::Config("the batch interval must be positive".into()));
        }
        let registered = self.context.get_or_init(|| *context);
        if registered.batch_interval != context.batch_interval {
            return Err(KafkaError::Config(format!(
                "the stream is read with a batch interval of {} already, not {}",
                registered.batch_interval, context.batch_interval
            )));
        }
        if let Some(read_ahead) = self.read_ahead.get() {
            read_ahead.set_batch_interval(context.batch_interval);
        }
        Ok(())
    }

    /// The batch interval of the registered context.
    fn batch_interval(&self) -> Result<Duration> {
        self.context.get().map(|c| c.batch_interval).ok_or_else(|| {
            KafkaError::Config(
                "a rate needs the batch interval: register the stream with its streaming context first".into(),
            )
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DirectKafkaSettings {
        &self.config
    }

    /// The consumer pool the ranges are read through.
    pub fn pool(&self) -> &ConsumerPool {
        &self.pool
    }

    /// Sets the rate backpressure allows, in records per second for the
    /// whole stream (`None`: no limit besides `max_rate_per_partition`).
    pub fn set_rate_limit(&self, records_per_second: Option<u64>) {
        self.rate_limit.store(records_per_second.unwrap_or(0), Ordering::Relaxed);
    }

    /// Where the next batch starts, resolving the starting offsets first if needed.
    pub fn position(&self) -> Result<PartitionOffsets> {
        let mut position = lock(&self.position);
        if let Some(p) = position.as_ref() {
            return Ok(p.clone());
        }
        let resolved = self.resolve_start()?;
        *position = Some(resolved.clone());
        Ok(resolved)
    }

    /// Moves the stream to the ends of `ranges`: after a restart, the runtime
    /// hands the last logged ranges here so the next batch starts where they
    /// ended. In [`OffsetCommit::TransactionalStore`] mode the store wins.
    pub fn resume_after(&self, ranges: &OffsetRanges) -> Result<()> {
        if let OffsetCommit::TransactionalStore(store) = &self.config.commit
            && store.offsets()?.is_some()
        {
            info!("transactional offset store present: ignoring the checkpoint's offsets");
            return Ok(());
        }
        let mut position = lock(&self.position);
        let mut next = position.take().unwrap_or_default();
        next.extend(ranges.until_offsets());
        *position = Some(next);
        drop(position);
        self.forget_read_ahead();
        Ok(())
    }

    /// Whether the stream reads each batch during its interval (the graph
    /// handed it a chunkable operator chain; see *Reading ahead* on [`DirectKafkaStream`]).
    pub fn reads_ahead(&self) -> bool {
        self.read_ahead.get().is_some()
    }

    /// Waits until at least `records` records are read ahead for the next
    /// batch, or `timeout` passed; returns how many are (0 when the stream
    /// does not read ahead). For tests and tools that need the read-ahead
    /// to have happened before they go on.
    pub fn wait_for_read_ahead(&self, records: u64, timeout: StdDuration) -> u64 {
        self.read_ahead.get().map_or(0, |r| r.wait_for_records(records, timeout))
    }

    /// Drops what was read ahead: the position moved otherwise.
    fn forget_read_ahead(&self) {
        if let Some(read_ahead) = self.read_ahead.get() {
            read_ahead.progress().forget();
        }
    }

    /// Plans the batch at `time`: one range per partition from the current
    /// position to the latest offset, capped by the rates and by the records
    /// of `limits`; reads them within its bytes (see the module
    /// documentation) and moves
    /// the position to the ends of what was read, which it returns. The
    /// records wait for [`DirectKafkaStream::read`] of the returned ranges.
    /// When the stream reads ahead, the ranges start with what was read
    /// during the interval and the caps count it.
    pub fn plan_batch(&self, time: Time, limits: BatchLimits) -> Result<OffsetRanges> {
        // The previous batch's records, if nobody took them, go before reading more.
        drop(lock(&self.prefetched).take());
        // Held throughout: the read-ahead does not read while a batch is planned.
        let mut progress = self.read_ahead.get().map(ReadAhead::progress);
        let mut start = self.position()?;
        let partitions = self.partitions()?;
        let latest = self.latest_offsets(&partitions)?;
        for tp in &partitions {
            if !start.contains_key(tp) {
                // A partition added since the stream started: from its beginning.
                let earliest = self.watermarks(tp)?.0;
                info!(partition = %tp, earliest, "new partition discovered");
                start.insert(tp.clone(), earliest);
            }
        }
        let ahead = progress.as_mut().map(|p| p.take(&start)).unwrap_or_default();
        let limits = self.limits(limits)?;
        let already = AlreadyRead { next: &ahead.next, records: &ahead.records, bytes: ahead.bytes };
        let rest = plan_rest(&partitions, &start, &latest, limits, already)?;
        let (rest, records) = read_within(&self.pool, &rest, limits.bytes.saturating_sub(ahead.bytes))?;
        let ranges = OffsetRanges::new(
            rest.ranges()
                .iter()
                .map(|r| {
                    let from = start.get(&r.topic_partition()).copied().unwrap_or(r.from);
                    OffsetRange::new(r.topic.clone(), r.partition, from, r.until)
                })
                .collect(),
        );
        record_lag(&ranges, &latest);
        debug!(time = time.as_millis(), records = ranges.count(), read_ahead = ahead.total_records(), "planned batch");
        let read = match self.read_ahead.get() {
            Some(read_ahead) => processed(read_ahead, &ranges, ahead, records),
            None => Some(Read::Records(records)),
        };
        if let Some(read) = read {
            *lock(&self.prefetched) = Some(Prefetched { ranges: ranges.clone(), read });
        }
        let mut position = lock(&self.position);
        let mut next = position.take().unwrap_or_default();
        next.extend(ranges.until_offsets());
        *position = Some(next.clone());
        drop(position);
        if let Some(progress) = progress.as_mut() {
            progress.restart(next, limits);
        }
        drop(progress);
        if let Some(read_ahead) = self.read_ahead.get() {
            read_ahead.wake();
        }
        Ok(ranges)
    }

    /// The caps of a batch planned now within `limits`.
    fn limits(&self, limits: BatchLimits) -> Result<Limits> {
        let rate = self.rate_limit.load(Ordering::Relaxed);
        let per_second = |rate: u64| -> Result<f64> { Ok((rate as f64) * self.batch_interval()?.as_secs_f64()) };
        let backpressure = if rate == 0 { None } else { Some(per_second(rate)?.ceil() as u64) };
        let per_partition = match self.config.max_rate_per_partition {
            Some(rate) => Some(per_second(rate)?.ceil().max(1.0) as u64),
            None => None,
        };
        Ok(Limits {
            records: batch_record_limit(backpressure, limits.max_records),
            per_partition,
            bytes: limits.max_bytes.unwrap_or(u64::MAX).max(1),
        })
    }

    /// Returns the records of each range of `ranges` (one partition of the
    /// batch each, empty for an empty range, so a partition keeps its place
    /// from batch to batch): the ones [`DirectKafkaStream::plan_batch`]
    /// read for exactly these ranges, or, for other ranges (a re-run after a
    /// restart), read now in full, one task per range, in parallel.
    pub fn read(&self, ranges: &OffsetRanges) -> Result<Vec<Vec<KafkaRecord>>> {
        if let Some(Read::Records(records)) = self.take_prefetched(ranges) {
            return Ok(records);
        }
        std::thread::scope(|scope| {
            let tasks: Vec<_> = ranges
                .ranges()
                .iter()
                .map(|range| (range, (range.count() > 0).then(|| scope.spawn(|| self.read_range(range)))))
                .collect();
            tasks
                .into_iter()
                .map(|(range, task)| task.map_or_else(|| Ok(Vec::new()), |task| join(range, task)))
                .collect()
        })
    }

    /// What was read while planning exactly `ranges`, if it is still waiting.
    fn take_prefetched(&self, ranges: &OffsetRanges) -> Option<Read> {
        let mut prefetched = lock(&self.prefetched);
        if prefetched.as_ref().is_some_and(|p| p.ranges == *ranges) {
            return prefetched.take().map(|p| p.read);
        }
        None
    }

    /// Reads one range with a consumer checked out for this call alone.
    pub fn read_range(&self, range: &OffsetRange) -> Result<Vec<KafkaRecord>> {
        // The range's offsets are fixed: reading it again after an outage reads the same records.
        let records = retry_unavailable(|| self.pool.checkout(&range.topic_partition())?.read_range(range))?;
        record_input(range, &records);
        Ok(records)
    }

    /// Called when a batch's outputs are done: commits its ends to the
    /// consumer group in [`OffsetCommit::KafkaGroup`] mode.
    pub fn on_batch_completed(&self, ranges: &OffsetRanges) -> Result<()> {
        if !matches!(self.config.commit, OffsetCommit::KafkaGroup) || ranges.ranges().is_empty() {
            return Ok(());
        }
        let list = to_list(&ranges.until_offsets())?;
        let admin = lock(&self.admin);
        let operation = format!("commit offsets of group {}", self.config.consumer.group_id);
        retry_coordinator(operation, self.config.consumer.poll_timeout, |_| admin.commit(&list, CommitMode::Sync))
    }

    /// The group's committed offsets for the stream's partitions (absent: none committed).
    pub fn committed_offsets(&self) -> Result<PartitionOffsets> {
        let partitions = self.partitions()?;
        let mut list = TopicPartitionList::new();
        for tp in &partitions {
            list.add_partition(&tp.topic, tp.partition);
        }
        let admin = lock(&self.admin);
        let operation = format!("read committed offsets of group {}", self.config.consumer.group_id);
        let committed = retry_coordinator(operation, self.config.consumer.poll_timeout, |left| {
            admin.committed_offsets(list.clone(), left)
        })?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((TopicPartition::new(e.topic(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    fn resolve_start(&self) -> Result<PartitionOffsets> {
        if let OffsetCommit::TransactionalStore(store) = &self.config.commit
            && let Some(stored) = store.offsets()?
        {
            info!(offsets = ?stored, "starting from the transactional offset store");
            let mut start = self.resolve(&StartingOffsets::Earliest)?;
            start.extend(stored);
            return Ok(start);
        }
        self.resolve(&self.config.starting_offsets)
    }

    fn resolve(&self, starting: &StartingOffsets) -> Result<PartitionOffsets> {
        let partitions = self.partitions()?;
        let mut start = PartitionOffsets::new();
        match starting {
            StartingOffsets::Earliest | StartingOffsets::Latest => {
                let latest = matches!(starting, StartingOffsets::Latest);
                for tp in partitions {
                    let (low, high) = self.watermarks(&tp)?;
                    start.insert(tp, if latest { high } else { low });
                }
            }
            StartingOffsets::Committed { fallback } => {
                let committed = self.committed_offsets()?;
                let fallback = self.resolve(fallback)?;
                for tp in partitions {
                    let offset = committed.get(&tp).or_else(|| fallback.get(&tp)).copied().unwrap_or(0);
                    start.insert(tp, offset);
                }
            }
            StartingOffsets::Spec(spec) => {
                for tp in partitions {
                    let (low, high) = self.watermarks(&tp)?;
                    let offset = match spec.get(&tp).copied().unwrap_or(EARLIEST) {
                        EARLIEST => low,
                        LATEST => high,
                        explicit => explicit,
                    };
                    start.insert(tp, offset);
                }
            }
        }
        info!(offsets = ?start, "starting offsets resolved");
        Ok(start)
    }

    /// The partitions read now (subscribed topics are looked up each time).
    pub fn partitions(&self) -> Result<Vec<TopicPartition>> {
        match &self.config.topics {
            TopicSelection::Assign(partitions) => Ok(partitions.clone()),
            TopicSelection::Subscribe(topics) => {
                let mut partitions = Vec::new();
                for topic in topics {
                    let metadata = retry_unavailable(|| {
                        lock(&self.admin)
                            .fetch_metadata(Some(topic), self.config.consumer.poll_timeout)
                            .map_err(client(format!("fetch metadata of {topic}")))
                    })?;
                    let found = metadata
                        .topics()
                        .iter()
                        .find(|t| t.name() == topic && t.error().is_none())
                        .map(|t| t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>())
                        .unwrap_or_default();
                    if found.is_empty() {
                        return Err(KafkaError::UnknownTopic { topic: topic.clone() });
                    }
                    partitions.extend(found.into_iter().map(|p| TopicPartition::new(topic.clone(), p)));
                }
                partitions.sort();
                Ok(partitions)
            }
        }
    }

    fn watermarks(&self, tp: &TopicPartition) -> Result<(i64, i64)> {
        let fresh = || self.config.consumer.client_config().create().map_err(client("create the metadata consumer"));
        retry_unavailable(|| crate::retry::watermarks(&self.admin, fresh, tp, self.config.consumer.poll_timeout))
    }

    fn latest_offsets(&self, partitions: &[TopicPartition]) -> Result<PartitionOffsets> {
        partitions.iter().map(|tp| Ok((tp.clone(), self.watermarks(tp)?.1))).collect()
    }
}

/// Gauge of `/metrics`: records of a partition not read yet after the batch
/// just planned (its latest offset less the end of the batch's range).
pub(crate) const CONSUMER_LAG: &str = "spate_kafka_consumer_lag";
/// Sets each planned partition's lag: what is left after `ranges`.
fn record_lag(ranges: &OffsetRanges, latest: &PartitionOffsets) {
    for range in ranges.ranges() {
        let Some(latest) = latest.get(&range.topic_partition()) else { continue };
        let lag = latest.saturating_sub(range.until).max(0);
        metrics::gauge!(CONSUMER_LAG, "topic" => range.topic.clone(), "partition" => range.partition.to_string())
            .set(lag as f64);
    }
}

/// A librdkafka partition list of `offsets`.
pub(crate) fn to_list(offsets: &PartitionOffsets) -> Result<TopicPartitionList> {
    let mut list = TopicPartitionList::new();
    for (tp, offset) in offsets {
        list.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*offset))
            .map_err(client(format!("offset list entry {tp}")))?;
    }
    Ok(list)
}

impl spate_dstream::InputSource<KafkaRecord> for DirectKafkaStream {
    fn is_replayable(&self) -> bool {
        true
    }

    fn register(&self, context: &SourceContext) -> std::result::Result<(), spate_dstream::BoxError> {
        Ok(DirectKafkaStream::register(self, context)?)
    }

    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, spate_dstream::BoxError> {
        Ok(Some(self.plan_batch(time, limits)?.to_json()))
    }

    fn compute(&self, time: Time, planned: Option<&str>) -> Result<Vec<Vec<KafkaRecord>>, spate_dstream::BoxError> {
        let Some(planned) = planned else {
            return Err(Box::new(KafkaError::Config("a Kafka batch needs its planned offset ranges".into())));
        };
        let ranges = OffsetRanges::from_json(planned)?;
        // A re-run after a restart: later batches continue from its ends.
        let mut position = lock(&self.position);
        let next = position.get_or_insert_with(PartitionOffsets::new);
        for (tp, until) in ranges.until_offsets() {
            let entry = next.entry(tp).or_insert(until);
            *entry = (*entry).max(until);
        }
        drop(position);
        match (self.take_prefetched(&ranges), self.read_ahead.get()) {
            (Some(Read::Records(records)), _) => Ok(records),
            (Some(Read::Processed(blocks)), Some(read_ahead)) => {
                // Every partition is the operator's result already.
                read_ahead.stage().deliver(time, blocks);
                Ok(Vec::new())
            }
            _ => {
                // Other ranges (a re-run): read in full, computed at the
                // boundary; reading ahead resumes after the next plan.
                self.forget_read_ahead();
                Ok(self.read(&ranges)?)
            }
        }
    }

    /// Taken when the stream's only reader starts a chunkable chain
    /// (record-wise operators, possibly ending in a per-key aggregate): the
    /// stream then reads each batch during its interval and runs the chain
    /// on it chunk by chunk (see *Reading ahead* on [`DirectKafkaStream`]).
    /// Other operators (`map_partitions` sees a partition whole) are
    /// computed at the boundary.
    fn set_arrival_stage(&self, stage: ArrivalStage<KafkaRecord>) -> bool {
        if !stage.is_chunkable() || self.read_ahead.get().is_some() {
            return false;
        }
        let interval = self.context.get().map(|c| c.batch_interval);
        match ReadAhead::start(&self.config.consumer, interval, Arc::clone(&self.pool), stage) {
            Ok(read_ahead) => self.read_ahead.set(read_ahead).is_ok(),
            Err(error) => {
                warn!(%error, "cannot read ahead; batches are read at their boundary");
                false
            }
        }
    }
}

/// Each partition of a batch read ahead as the operator's result: what was
/// read during the interval joined with the rest, read at the boundary,
/// processed now. `None` when the operator panicked: the batch is then
/// read again and computed at its boundary.
fn processed(
    read_ahead: &ReadAhead,
    ranges: &OffsetRanges,
    mut ahead: Ahead,
    rest: Vec<Vec<KafkaRecord>>,
) -> Option<Read> {
    let mut blocks = Vec::with_capacity(ranges.ranges().len());
    for (range, records) in ranges.ranges().iter().zip(rest) {
        let mut chunks = ahead.chunks.remove(&range.topic_partition()).unwrap_or_default();
        if !records.is_empty() {
            chunks.push(read_ahead.process(records)?);
        }
        blocks.push(read_ahead.stage().join(chunks));
    }
    Some(Read::Processed(blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_needs_the_context_and_a_stream_keeps_to_one_interval() {
        let config = DirectKafkaSettings::subscribe("127.0.0.1:1", "g", ["t"]).with_max_rate_per_partition(10);
        let stream = DirectKafkaStream::new(config).unwrap();
        let unregistered = stream.limits(BatchLimits::UNLIMITED).unwrap_err();
        assert!(unregistered.to_string().contains("register"), "{unregistered}");
        assert!(stream.register(&SourceContext::new(Duration::ZERO, 1 << 20)).is_err());
        stream.register(&SourceContext::new(Duration::from_millis(500), 1 << 20)).unwrap();
        assert_eq!(stream.limits(BatchLimits::UNLIMITED).unwrap().per_partition, Some(5));
        stream.register(&SourceContext::new(Duration::from_millis(500), 1 << 20)).unwrap();
        assert!(stream.register(&SourceContext::new(Duration::from_secs(1), 1 << 20)).is_err());
    }
}
