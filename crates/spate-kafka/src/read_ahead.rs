//! Reading the next batch while its interval is still open.
//!
//! When the operator that reads a [`DirectKafkaStream`](crate::DirectKafkaStream)
//! works record by record (`map`, `flat_map`, `filter`) or is a per-key
//! aggregate (`reduce_by_key`, a window by key), possibly after a chain of
//! record-wise operators (see [`ArrivalStage::is_chunkable`]), and is the
//! stream's only consumer, the graph hands the stream that chain, and the
//! stream starts a read-ahead thread. Once a plan has fixed where the next batch starts, the
//! thread reads what the broker has from there in bounded chunks (at most
//! [`CHUNK_RECORDS`] records), runs each chunk through the operator and keeps
//! only its result: the records are dropped as soon as they are processed.
//! It stays within the caps of a batch (records, bytes, the per-partition
//! rate, backpressure) as they stood at the last plan.
//!
//! The batch is still the unit of exactly-once. Nothing read ahead is
//! visible: the results wait in the stream. The next plan takes them, reads
//! what is left within the remaining caps, and returns ranges that start
//! where the batch starts and end where the reading stopped; those ranges
//! are what the runtime logs to `offsets/N` before it computes the batch.
//! The batch then delivers one joined result per partition, the same as the
//! chain computed over the whole partition at the boundary (a chunk is a
//! consecutive piece of a partition, and the chunks' results concatenate
//! or, for an aggregate, merge by key). A
//! re-run after a crash reads its logged ranges in full and computes the
//! operator at the boundary: the same result again.
//!
//! The thread and a plan never read at once: the plan holds the progress
//! lock for all of its work, and the thread holds it while it reads a
//! chunk. A panic of the operator on the thread stops the read-ahead for
//! that batch; the batch is then read and computed at its boundary, where
//! the panic fails it as it would without reading ahead.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration as StdDuration;

use rdkafka::consumer::BaseConsumer;
use spate_core::Duration;
use spate_core::sync::lock;
use spate_dstream::{ArrivalStage, ProcessedBlock};
use tracing::warn;

use crate::consumer::{ConsumerPool, ConsumerSettings, KafkaRecord, record_footprint};
use crate::error::{Result, client};
use crate::fetch::read_within;
use crate::offsets::{OffsetRanges, PartitionOffsets, TopicPartition};
use crate::plan::{Limits, ranges_within};
use crate::retry::{BROKER_UNAVAILABLE, is_outage};

/// The records one chunk reads at most, all partitions together: small
/// enough that a plan waiting for the chunk in flight waits little (tens of
/// milliseconds), large enough that a chunk's broker round trips are a
/// small part of its reading.
pub(crate) const CHUNK_RECORDS: u64 = 65_536;

/// The thread's pause when there is nothing to read: a twentieth of the
/// batch interval, so a batch's records are mostly read before it ends, but
/// not a busy loop on short intervals (50 ms until the interval is known).
fn idle_millis(interval: Option<Duration>) -> u64 {
    interval.map_or(50, |interval| (interval.as_millis() / 20).clamp(5, 100))
}

/// What has been read ahead for the next batch.
#[derive(Default)]
pub(crate) struct Progress {
    /// Where the next batch starts; `None` until a plan fixed it, and after
    /// the position moved otherwise (a re-run, a resume).
    origin: Option<PartitionOffsets>,
    /// Where reading continues, per partition.
    next: PartitionOffsets,
    /// Each partition's processed chunks, in offset order.
    chunks: BTreeMap<TopicPartition, Vec<ProcessedBlock>>,
    /// Records read ahead per partition.
    records: BTreeMap<TopicPartition, u64>,
    bytes: u64,
    limits: Option<Limits>,
    /// The operator panicked on a chunk: nothing read ahead is used.
    failed: bool,
}

/// What a plan takes of the read-ahead: where its reading stopped and the
/// processed chunks, per partition.
#[derive(Default)]
pub(crate) struct Ahead {
    pub(crate) next: PartitionOffsets,
    pub(crate) chunks: BTreeMap<TopicPartition, Vec<ProcessedBlock>>,
    pub(crate) records: BTreeMap<TopicPartition, u64>,
    pub(crate) bytes: u64,
}

impl Ahead {
    /// Records read ahead, all partitions.
    pub(crate) fn total_records(&self) -> u64 {
        self.records.values().sum()
    }
}

impl Progress {
    /// Takes what was read ahead for a batch starting at `start`; nothing
    /// when the reading started elsewhere or the operator failed.
    pub(crate) fn take(&mut self, start: &PartitionOffsets) -> Ahead {
        let progress = std::mem::take(self);
        if progress.failed || progress.origin.as_ref() != Some(start) {
            return Ahead::default();
        }
        Ahead { next: progress.next, chunks: progress.chunks, records: progress.records, bytes: progress.bytes }
    }

    /// Reading ahead starts again at `start` (the next batch's start), within `limits`.
    pub(crate) fn restart(&mut self, start: PartitionOffsets, limits: Limits) {
        *self = Progress { origin: Some(start.clone()), next: start, limits: Some(limits), ..Progress::default() };
    }

    /// Stops reading ahead until the next plan fixes a start again.
    pub(crate) fn forget(&mut self) {
        *self = Progress::default();
    }

    fn total_records(&self) -> u64 {
        self.records.values().sum()
    }
}

/// The read-ahead of one stream: its thread and what it shares with it.
pub(crate) struct ReadAhead {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    stage: ArrivalStage<KafkaRecord>,
    pool: Arc<ConsumerPool>,
    /// Latest offsets for the thread (the stream's own is busy planning).
    admin: Mutex<BaseConsumer>,
    /// How to open a new one when its metadata goes stale.
    consumer: ConsumerSettings,
    poll_timeout: StdDuration,
    /// How long the thread waits when there is nothing to read, ms.
    idle: AtomicU64,
    progress: Mutex<Progress>,
    /// Signalled after each chunk (for [`ReadAhead::wait_for_records`]).
    advanced: Condvar,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl ReadAhead {
    /// Starts reading ahead for a stream whose consumers have `consumer`
    /// settings and whose batches last `interval` (when known yet), through
    /// `pool`, running `stage`.
    pub(crate) fn start(
        consumer: &ConsumerSettings,
        interval: Option<Duration>,
        pool: Arc<ConsumerPool>,
        stage: ArrivalStage<KafkaRecord>,
    ) -> Result<Self> {
        let admin: BaseConsumer =
            consumer.client_config().create().map_err(client("create the read-ahead metadata consumer"))?;
        let idle = AtomicU64::new(idle_millis(interval));
        let shared = Arc::new(Shared {
            stage,
            pool,
            admin: Mutex::new(admin),
            consumer: consumer.clone(),
            poll_timeout: consumer.poll_timeout,
            idle,
            progress: Mutex::new(Progress::default()),
            advanced: Condvar::new(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("spate-kafka-read-ahead".into())
            .spawn(move || thread_shared.run())
            .map_err(|e| crate::error::KafkaError::Config(format!("start the read-ahead thread: {e}")))?;
        Ok(ReadAhead { shared, thread: Some(thread) })
    }

    /// Paces the thread by the context's batch interval, once it is known.
    pub(crate) fn set_batch_interval(&self, interval: spate_core::Duration) {
        self.shared.idle.store(idle_millis(Some(interval)), Ordering::Relaxed);
    }

    /// The operator run on each chunk.
    pub(crate) fn stage(&self) -> &ArrivalStage<KafkaRecord> {
        &self.shared.stage
    }

    /// The progress, locked: the thread does not read while it is held.
    pub(crate) fn progress(&self) -> MutexGuard<'_, Progress> {
        lock(&self.shared.progress)
    }

    /// Wakes the thread (a plan fixed a new start).
    pub(crate) fn wake(&self) {
        self.shared.wake.notify_all();
    }

    /// Runs the operator on one partition's records read at the boundary;
    /// `None` when it panicked.
    pub(crate) fn process(&self, records: Vec<KafkaRecord>) -> Option<ProcessedBlock> {
        process(&self.shared.stage, records)
    }

    /// Waits until at least `records` records are read ahead for the next
    /// batch, or `timeout` passed; returns how many are.
    pub(crate) fn wait_for_records(&self, records: u64, timeout: StdDuration) -> u64 {
        let progress = self.progress();
        let (progress, _) = self
            .shared
            .advanced
            .wait_timeout_while(progress, timeout, |p| !p.failed && p.total_records() < records)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        progress.total_records()
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            warn!("the Kafka read-ahead thread panicked");
        }
    }
}

impl Shared {
    fn run(&self) {
        // Whether the last attempt met the broker away: an outage is said
        // once when it starts, not at every attempt.
        let mut away = false;
        loop {
            let read = match self.read_chunk() {
                Ok(read) => {
                    away = false;
                    read
                }
                // The batch reads what is left at its boundary, where an
                // error that persists fails it.
                Err(error) if is_outage(&error) => {
                    metrics::counter!(BROKER_UNAVAILABLE).increment(1);
                    if !away {
                        warn!(%error, "the Kafka broker is unreachable or not ready; reading ahead waits for it");
                    }
                    away = true;
                    false
                }
                Err(error) => {
                    warn!(%error, "reading ahead failed; retrying");
                    false
                }
            };
            let stop = lock(&self.stop);
            if *stop {
                return;
            }
            if !read {
                let idle = StdDuration::from_millis(self.idle.load(Ordering::Relaxed));
                drop(self.wake.wait_timeout(stop, idle).unwrap_or_else(std::sync::PoisonError::into_inner));
            }
        }
    }

    /// Reads, processes and keeps one chunk; false when there was nothing
    /// to read (no start yet, caps reached, nothing new on the broker).
    fn read_chunk(&self) -> Result<bool> {
        let mut progress = lock(&self.progress);
        let Some(limits) = progress.limits.filter(|_| progress.origin.is_some() && !progress.failed) else {
            return Ok(false);
        };
        let records_left = limits.records.saturating_sub(progress.total_records());
        let bytes_left = limits.bytes.saturating_sub(progress.bytes);
        if records_left == 0 || bytes_left == 0 {
            return Ok(false);
        }
        let wanted = self.chunk_ranges(&progress, limits, records_left.min(CHUNK_RECORDS))?;
        if wanted.count() == 0 {
            return Ok(false);
        }
        let chunk_bytes = bytes_left.min(limits.bytes.div_ceil(8));
        let (read, records) = read_within(&self.pool, &wanted, chunk_bytes)?;
        for (range, records) in read.ranges().iter().zip(records) {
            if range.count() == 0 {
                continue;
            }
            let bytes: u64 = records.iter().map(footprint).sum();
            let Some(block) = process(&self.stage, records) else {
                warn!(
                    operator = self.stage.operator(),
                    "the operator panicked on records read ahead; the batch is computed at its boundary"
                );
                progress.failed = true;
                break;
            };
            let tp = range.topic_partition();
            progress.next.insert(tp.clone(), range.until);
            *progress.records.entry(tp.clone()).or_default() += range.count();
            progress.bytes = progress.bytes.saturating_add(bytes);
            progress.chunks.entry(tp).or_default().push(block);
        }
        self.advanced.notify_all();
        Ok(true)
    }

    /// One chunk's ranges: from where each partition's reading stopped to
    /// its latest offset, within `chunk` records shared by lag and what is
    /// left of the partition's own cap.
    fn chunk_ranges(&self, progress: &Progress, limits: Limits, chunk: u64) -> Result<OffsetRanges> {
        let fresh =
            || self.consumer.client_config().create().map_err(client("create the read-ahead metadata consumer"));
        let mut latest = PartitionOffsets::new();
        for tp in progress.next.keys() {
            let (_, high) = crate::retry::watermarks(&self.admin, fresh, tp, self.poll_timeout)?;
            latest.insert(tp.clone(), high);
        }
        let partitions: Vec<TopicPartition> = progress.next.keys().cloned().collect();
        ranges_within(&partitions, &progress.next, &latest, chunk, limits.per_partition, &progress.records)
    }
}

/// A record's size as the byte cap counts it.
fn footprint(record: &KafkaRecord) -> u64 {
    record_footprint(record.key.as_ref().map_or(0, Vec::len), record.value.as_ref().map_or(0, Vec::len))
}

/// `stage` run on `records`; `None` when the user's function panicked.
fn process(stage: &ArrivalStage<KafkaRecord>, records: Vec<KafkaRecord>) -> Option<ProcessedBlock> {
    catch_unwind(AssertUnwindSafe(|| stage.process(records))).ok()
}
