//! The direct stream: plans each batch's offset ranges and reads them
//! partition-parallel through the [`ConsumerPool`].
//!
//! Per batch it asks the broker for the latest offset of every partition,
//! caps each range by `max_rate_per_partition` × batch seconds and by the
//! rate backpressure allows (shared out by lag, as Spark does), and moves its
//! position to the ranges' ends. The ranges are what the batch logs to
//! `offsets/N`; handed back on a re-run they read exactly the same records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration as StdDuration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use spate_core::{Duration, Time};
use tracing::{debug, info};

use crate::consumer::{ConsumerPool, ConsumerSettings, DataLossPolicy, KafkaRecord};
use crate::error::{KafkaError, Result, client};
use crate::offsets::{EARLIEST, LATEST, OffsetRange, OffsetRanges, PartitionOffsets, TopicPartition};
use crate::retry::retry_coordinator;
use crate::store::RocksOffsetStore;

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
pub struct DirectKafkaConfig {
    /// Brokers, group, poll timeout, data-loss policy, librdkafka properties.
    pub consumer: ConsumerSettings,
    /// The partitions read.
    pub topics: TopicSelection,
    /// Where a stream without a stored position starts.
    pub starting_offsets: StartingOffsets,
    /// The batch interval (rates are per second, ranges per batch).
    pub batch_interval: Duration,
    /// At most this many records per second per partition (Spark's `maxRatePerPartition`).
    pub max_rate_per_partition: Option<u64>,
    /// Where offsets are committed.
    pub commit: OffsetCommit,
}

impl DirectKafkaConfig {
    /// A stream over `topics` from the earliest offsets, committing to the checkpoint only.
    pub fn subscribe(
        brokers: impl Into<String>,
        group_id: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
        batch_interval: Duration,
    ) -> Self {
        DirectKafkaConfig {
            consumer: ConsumerSettings::new(brokers, group_id),
            topics: TopicSelection::Subscribe(topics.into_iter().map(Into::into).collect()),
            starting_offsets: StartingOffsets::Earliest,
            batch_interval,
            max_rate_per_partition: None,
            commit: OffsetCommit::CheckpointOnly,
        }
    }

    /// Reads exactly `partitions` instead.
    pub fn assign(mut self, partitions: impl IntoIterator<Item = TopicPartition>) -> Self {
        self.topics = TopicSelection::Assign(partitions.into_iter().collect());
        self
    }

    /// Sets where a stream without a stored position starts.
    pub fn starting_offsets(mut self, starting: StartingOffsets) -> Self {
        self.starting_offsets = starting;
        self
    }

    /// Starting offsets from Spark's JSON spec (`{"topic":{"0":36,"1":-2}}`).
    pub fn starting_offsets_json(self, json: &str) -> Result<Self> {
        Ok(self.starting_offsets(StartingOffsets::Spec(crate::offsets::partition_offsets_from_json(json)?)))
    }

    /// Caps each partition at `records_per_second`.
    pub fn max_rate_per_partition(mut self, records_per_second: u64) -> Self {
        self.max_rate_per_partition = Some(records_per_second);
        self
    }

    /// Sets where offsets are committed.
    pub fn commit(mut self, commit: OffsetCommit) -> Self {
        self.commit = commit;
        self
    }

    /// Sets the data-loss policy.
    pub fn on_data_loss(mut self, policy: DataLossPolicy) -> Self {
        self.consumer.data_loss = policy;
        self
    }

    /// Sets how long a poll waits for a record a range needs.
    pub fn poll_timeout(mut self, timeout: StdDuration) -> Self {
        self.consumer.poll_timeout = timeout;
        self
    }

    /// Adds a librdkafka property for the reading consumers.
    pub fn consumer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.consumer.properties.push((key.into(), value.into()));
        self
    }
}

/// A Kafka source that plans offset ranges per batch and reads them with
/// exclusively owned consumers.
pub struct DirectKafkaStream {
    config: DirectKafkaConfig,
    pool: ConsumerPool,
    /// Metadata, watermarks and group commits only; records go through the pool.
    admin: Mutex<BaseConsumer>,
    /// Where the next batch starts; `None` until resolved from the starting offsets.
    position: Mutex<Option<PartitionOffsets>>,
    /// Records per second backpressure allows the whole stream (0: no limit).
    rate_limit: AtomicU64,
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DirectKafkaStream {
    /// A stream with `config`; nothing is asked of the broker until the first plan.
    pub fn new(config: DirectKafkaConfig) -> Result<Self> {
        if config.batch_interval == Duration::ZERO {
            return Err(KafkaError::Config("the batch interval must be positive".into()));
        }
        let admin: BaseConsumer =
            config.consumer.client_config().create().map_err(client("create the metadata consumer"))?;
        Ok(DirectKafkaStream {
            pool: ConsumerPool::new(config.consumer.clone()),
            config,
            admin: Mutex::new(admin),
            position: Mutex::new(None),
            rate_limit: AtomicU64::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DirectKafkaConfig {
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
        Ok(())
    }

    /// Plans the batch at `time`: one range per partition from the current
    /// position to the latest offset, capped by the rates and by
    /// `max_records` for the whole batch; then moves the position to the ends.
    pub fn plan_batch(&self, time: Time, max_records: Option<u64>) -> Result<OffsetRanges> {
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
        let caps = self.caps(&start, &latest, max_records);
        let ranges: OffsetRanges = partitions
            .iter()
            .map(|tp| {
                let from = start.get(tp).copied().unwrap_or(0);
                let latest = latest.get(tp).copied().unwrap_or(from).max(from);
                let until = caps.get(tp).map_or(latest, |cap| latest.min(from.saturating_add(*cap)));
                OffsetRange::new(tp.topic.clone(), tp.partition, from, until)
            })
            .collect();
        debug!(time = time.as_millis(), records = ranges.count(), "planned batch");
        let mut position = lock(&self.position);
        let mut next = position.take().unwrap_or_default();
        next.extend(ranges.until_offsets());
        *position = Some(next);
        Ok(ranges)
    }

    /// The per-partition caps for this batch (absent: no cap).
    fn caps(&self, start: &PartitionOffsets, latest: &PartitionOffsets, max_records: Option<u64>) -> Caps {
        let secs = self.config.batch_interval.as_secs_f64();
        let backpressure = match self.rate_limit.load(Ordering::Relaxed) {
            0 => None,
            rate => Some(((rate as f64) * secs).ceil() as u64),
        };
        let per_partition = self.config.max_rate_per_partition.map(|r| ((r as f64) * secs).ceil().max(1.0) as u64);
        rate_caps(start, latest, per_partition, min_of(backpressure, max_records))
    }

    /// Reads the batch's ranges, one task per non-empty range, in parallel;
    /// returns the records of each range (one partition of the batch each).
    pub fn read(&self, ranges: &OffsetRanges) -> Result<Vec<Vec<KafkaRecord>>> {
        let work: Vec<&OffsetRange> = ranges.ranges().iter().filter(|r| r.count() > 0).collect();
        std::thread::scope(|scope| {
            let tasks: Vec<_> = work.iter().map(|range| (range, scope.spawn(|| self.read_range(range)))).collect();
            tasks
                .into_iter()
                .map(|(range, task)| {
                    task.join().map_err(|_| KafkaError::TaskPanicked {
                        topic: range.topic.clone(),
                        partition: range.partition,
                    })?
                })
                .collect()
        })
    }

    /// Reads one range with a consumer checked out for this call alone.
    pub fn read_range(&self, range: &OffsetRange) -> Result<Vec<KafkaRecord>> {
        let mut consumer = self.pool.checkout(&range.topic_partition())?;
        consumer.read_range(range)
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
                    let metadata = lock(&self.admin)
                        .fetch_metadata(Some(topic), self.config.consumer.poll_timeout)
                        .map_err(client(format!("fetch metadata of {topic}")))?;
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
        lock(&self.admin)
            .fetch_watermarks(&tp.topic, tp.partition, self.config.consumer.poll_timeout)
            .map_err(client(format!("fetch watermarks of {tp}")))
    }

    fn latest_offsets(&self, partitions: &[TopicPartition]) -> Result<PartitionOffsets> {
        partitions.iter().map(|tp| Ok((tp.clone(), self.watermarks(tp)?.1))).collect()
    }
}

type Caps = std::collections::BTreeMap<TopicPartition, i64>;

fn min_of(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Spark's `maxMessagesPerPartition`: each partition gets at most
/// `per_partition` records, and the batch limit is shared out in proportion
/// to each partition's lag (at least one record for a partition that lags).
fn rate_caps(
    start: &PartitionOffsets,
    latest: &PartitionOffsets,
    per_partition: Option<u64>,
    batch_limit: Option<u64>,
) -> Caps {
    let lag = |tp: &TopicPartition, l: i64| u64::try_from(l - start.get(tp).copied().unwrap_or(l)).unwrap_or(0);
    let total_lag: u64 = latest.iter().map(|(tp, l)| lag(tp, *l)).sum();
    let mut caps = Caps::new();
    for (tp, l) in latest {
        let lag = lag(tp, *l);
        let share = batch_limit.map(|limit| {
            let share =
                if total_lag == 0 { 0 } else { ((limit as f64) * (lag as f64) / (total_lag as f64)).floor() as u64 };
            if limit > 0 && lag > 0 { share.max(1) } else { share }
        });
        if let Some(cap) = min_of(per_partition, share) {
            caps.insert(tp.clone(), i64::try_from(cap).unwrap_or(i64::MAX));
        }
    }
    caps
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

    fn plan(&self, time: Time, max_records: Option<u64>) -> Result<Option<String>, spate_dstream::BoxError> {
        Ok(Some(self.plan_batch(time, max_records)?.to_json()))
    }

    fn compute(&self, _time: Time, planned: Option<&str>) -> Result<Vec<Vec<KafkaRecord>>, spate_dstream::BoxError> {
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
        Ok(self.read(&ranges)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(values: &[(i32, i64)]) -> PartitionOffsets {
        values.iter().map(|(p, o)| (TopicPartition::new("t", *p), *o)).collect()
    }

    #[test]
    fn caps_share_the_batch_limit_by_lag_and_respect_the_partition_rate() {
        let start = offsets(&[(0, 0), (1, 100), (2, 50)]);
        let latest = offsets(&[(0, 300), (1, 200), (2, 50)]); // lags 300, 100, 0
        assert!(rate_caps(&start, &latest, None, None).is_empty());

        let caps = rate_caps(&start, &latest, None, Some(40));
        assert_eq!(caps, offsets(&[(0, 30), (1, 10), (2, 0)]));

        let caps = rate_caps(&start, &latest, Some(20), Some(40));
        assert_eq!(caps, offsets(&[(0, 20), (1, 10), (2, 0)]));

        let caps = rate_caps(&start, &latest, Some(500), None);
        assert_eq!(caps, offsets(&[(0, 500), (1, 500), (2, 500)]));

        // A tiny limit still moves every lagging partition.
        let caps = rate_caps(&start, &latest, None, Some(1));
        assert_eq!(caps, offsets(&[(0, 1), (1, 1), (2, 0)]));
    }
}
