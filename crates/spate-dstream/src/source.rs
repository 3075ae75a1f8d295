//! Input sources: where a batch's records come from.
//!
//! The runtime asks every source, before a batch, to [`InputSource::plan`]
//! it. A replayable source (Kafka) answers with the offsets the batch will
//! cover as a JSON string (`{"topic":{"0":36,"1":42}}`); the runtime writes
//! them to the offset log and, on a re-run after a crash, hands the logged
//! string back to [`InputSource::compute`] so exactly the same records are
//! read. A non-replayable source answers `None` and reads whatever the
//! runtime fed it for that batch time.
//!
//! A source is not configured a second time with what its streaming
//! context already says: when the graph is built it is told the batch
//! interval and the memory budget ([`InputSource::register`], with a
//! [`SourceContext`]), and each plan gets the limits the batch must stay
//! within ([`BatchLimits`]: backpressure's share and the context's
//! per-batch caps).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use spate_core::sync::lock;
use spate_core::{Duration, Time};

use crate::arrival::ArrivalStage;
use crate::error::BoxError;

/// What a source is told of its streaming context when its graph is
/// built, so that it is not configured with it a second time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceContext {
    /// The batch interval (a rate per second becomes records per batch by it).
    pub batch_interval: Duration,
    /// The bytes the whole job may hold in memory.
    pub max_memory_bytes: u64,
}

impl SourceContext {
    /// A context of `batch_interval` and a memory budget of `max_memory_bytes`.
    pub fn new(batch_interval: Duration, max_memory_bytes: u64) -> Self {
        SourceContext { batch_interval, max_memory_bytes }
    }
}

/// What one batch of a source may read, all of its partitions together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchLimits {
    /// Records, at most: the smaller of backpressure's share and the
    /// context's per-batch cap; `None`: no limit.
    pub max_records: Option<u64>,
    /// Bytes, at most, as the source counts them; `None`: no limit.
    pub max_bytes: Option<u64>,
}

impl BatchLimits {
    /// No limit.
    pub const UNLIMITED: BatchLimits = BatchLimits { max_records: None, max_bytes: None };

    /// At most `max_records` records and `max_bytes` bytes (`None`: no limit).
    pub fn new(max_records: Option<u64>, max_bytes: Option<u64>) -> Self {
        BatchLimits { max_records, max_bytes }
    }

    /// At most `records` records, no byte limit.
    pub fn records(records: u64) -> Self {
        BatchLimits { max_records: Some(records), max_bytes: None }
    }
}

/// A source of batches for one input stream.
pub trait InputSource<T>: Send + Sync {
    /// True when the source can read a batch again from its planned offsets.
    /// Replayable sources must return `Some` from [`InputSource::plan`].
    fn is_replayable(&self) -> bool {
        false
    }

    /// Told, once the graph is built and before the first plan, what the
    /// streaming context says of the batch interval and the memory budget;
    /// an error refuses the context (a source that cannot work with them).
    fn register(&self, context: &SourceContext) -> Result<(), BoxError> {
        let _ = context;
        Ok(())
    }

    /// Decides what batch `time` will read, within `limits`, and returns
    /// the offsets it covers as a JSON string, or `None` for a
    /// non-replayable source.
    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let _ = (time, limits);
        Ok(None)
    }

    /// Produces the partitions of batch `time`. `planned` is what
    /// [`InputSource::plan`] returned for this time (or the logged copy of
    /// it when the batch is re-run after a crash).
    fn compute(&self, time: Time, planned: Option<&str>) -> Result<Vec<Vec<T>>, BoxError>;

    /// Offered, when the graph is built, the function of the operator that
    /// reads this input, to run on its records as they arrive (see
    /// [`ArrivalStage`]); true when the source keeps it and will deliver
    /// that operator's results. Most sources decline.
    fn set_arrival_stage(&self, stage: ArrivalStage<T>) -> bool {
        let _ = stage;
        false
    }
}

/// An in-memory queue of batches, for tests (Spark's `queueStream`): each
/// batch time takes the next queued batch, or an empty batch when the queue
/// is empty. Not replayable.
#[derive(Debug)]
pub struct QueueSource<T> {
    queue: Mutex<VecDeque<Vec<Vec<T>>>>,
}

impl<T> Default for QueueSource<T> {
    fn default() -> Self {
        QueueSource { queue: Mutex::new(VecDeque::new()) }
    }
}

impl<T> QueueSource<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues one batch given as one partition.
    pub fn push(&self, records: Vec<T>) {
        lock(&self.queue).push_back(vec![records]);
    }

    /// Queues one batch given as partitions.
    pub fn push_partitions(&self, partitions: Vec<Vec<T>>) {
        lock(&self.queue).push_back(partitions);
    }

    /// Batches still queued.
    pub fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Send> InputSource<T> for QueueSource<T> {
    fn compute(&self, _time: Time, _planned: Option<&str>) -> Result<Vec<Vec<T>>, BoxError> {
        Ok(lock(&self.queue).pop_front().unwrap_or_default())
    }
}

/// A source the runtime feeds: before running batch `time` it hands over
/// that batch's records (for example the blocks the receiver tracker
/// allocated to it). A batch time nobody fed is empty; records fed for a
/// time that already ran are dropped with a warning. Not replayable: after
/// a crash the runtime feeds the same records again from its own log.
///
/// It takes the [`ArrivalStage`] the graph offers: whoever feeds it may run
/// [`FedSource::arrival_stage`] on each block as it arrives and deliver the
/// results instead of feeding the records.
#[derive(Debug)]
pub struct FedSource<T> {
    batches: Mutex<BTreeMap<Time, Vec<Vec<T>>>>,
    stage: Mutex<Option<ArrivalStage<T>>>,
}

impl<T> Default for FedSource<T> {
    fn default() -> Self {
        FedSource { batches: Mutex::new(BTreeMap::new()), stage: Mutex::new(None) }
    }
}

impl<T> FedSource<T> {
    /// A source with nothing fed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `partitions` to batch `time` (feeding twice appends).
    pub fn feed(&self, time: Time, partitions: Vec<Vec<T>>) {
        lock(&self.batches).entry(time).or_default().extend(partitions);
    }

    /// Batch times fed but not yet consumed.
    pub fn pending_times(&self) -> Vec<Time> {
        lock(&self.batches).keys().copied().collect()
    }

    /// The stage to run on each block as it arrives, when the graph built
    /// on this source handed it one.
    pub fn arrival_stage(&self) -> Option<ArrivalStage<T>> {
        lock(&self.stage).clone()
    }
}

impl<T: Send> InputSource<T> for FedSource<T> {
    fn compute(&self, time: Time, _planned: Option<&str>) -> Result<Vec<Vec<T>>, BoxError> {
        let mut batches = lock(&self.batches);
        // Anything fed for an earlier time belongs to a batch that already
        // ran; say so loudly and drop it so it cannot pile up.
        let later = batches.split_off(&time);
        for (stale, partitions) in std::mem::replace(&mut *batches, later) {
            let records: usize = partitions.iter().map(Vec::len).sum();
            tracing::warn!(stale_time = %stale, batch_time = %time, records, "records fed for a batch that already ran were dropped");
        }
        Ok(batches.remove(&time).unwrap_or_default())
    }

    fn set_arrival_stage(&self, stage: ArrivalStage<T>) -> bool {
        *lock(&self.stage) = Some(stage);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fed_source_returns_what_was_fed_for_each_time() {
        let source = FedSource::new();
        source.feed(Time::from_millis(2000), vec![vec![1, 2]]);
        source.feed(Time::from_millis(2000), vec![vec![3]]);
        source.feed(Time::from_millis(3000), vec![vec![4]]);
        assert_eq!(source.compute(Time::from_millis(1000), None).unwrap(), Vec::<Vec<i32>>::new());
        assert_eq!(source.compute(Time::from_millis(2000), None).unwrap(), vec![vec![1, 2], vec![3]]);
        assert_eq!(source.pending_times(), vec![Time::from_millis(3000)]);
        // A time that was skipped is dropped when a later batch runs.
        source.feed(Time::from_millis(3500), vec![vec![5]]);
        assert_eq!(source.compute(Time::from_millis(4000), None).unwrap(), Vec::<Vec<i32>>::new());
        assert!(source.pending_times().is_empty());
    }

    #[test]
    fn queue_source_hands_out_one_batch_per_time() {
        let queue = QueueSource::new();
        queue.push(vec!["a"]);
        queue.push_partitions(vec![vec!["b"], vec!["c"]]);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.compute(Time::ZERO, None).unwrap(), vec![vec!["a"]]);
        assert_eq!(queue.compute(Time::ZERO, None).unwrap(), vec![vec!["b"], vec!["c"]]);
        assert!(queue.compute(Time::ZERO, None).unwrap().is_empty());
        assert!(queue.is_empty());
    }
}
