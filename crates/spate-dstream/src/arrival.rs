//! The part of a fed input's work that runs on each block as it arrives,
//! while the batch interval is still open.
//!
//! When the only consumer of a [`FedSource`](crate::FedSource) input is a
//! partition-local operator (`map`, `filter`, `flat_map`,
//! `map_partitions`) or a per-key aggregate (`reduce_by_key`,
//! `combine_by_key`, `reduce_by_key_and_window` and the operators built on
//! them), the built graph hands that operator's function to the source as
//! an [`ArrivalStage`], followed by the operators after it that are each
//! the only reader of the one before, as long as they are partition-local;
//! a per-key aggregate ends the chain (`filter` then `map` then
//! `reduce_by_key`). The whole chain runs on each block, and its last
//! operator takes the results: a partition-local operator its output
//! partition, an aggregate the block's values combined by key (the
//! map-side combine, one entry per key). A Kafka stream takes the longest
//! chain whose work on a partition may be split into chunks
//! ([`ArrivalStage::is_chunkable`]). The runtime runs it on each received
//! block as the block comes in and keeps only its result
//! ([`ProcessedBlock`]); at the batch boundary it hands the results of
//! exactly the blocks allocated to the batch back with
//! [`ArrivalStage::deliver`], and the operator takes them in place of
//! computing them. The result is the same as computing the whole batch at
//! its end: a block is one partition either way, the functions see the
//! same records in the same order, and an aggregate merges the blocks'
//! combined values by key as it would have merged its partitions'. What
//! changes is when the work happens, and that a block whose chain shrinks
//! it (a count per word, a filter) is held as that result rather than as
//! its records until the batch ends.
//!
//! A stream read by more than one operator, or whose consumer needs the
//! whole batch (a join, `transform`, `repartition`), is computed at the
//! batch boundary as before.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use spate_core::sync::lock;
use spate_core::{CoreError, PayloadReader, Time};

/// One block's result of an [`ArrivalStage`], waiting for its batch.
pub struct ProcessedBlock {
    part: Box<dyn Any + Send>,
    records_in: usize,
    estimated_bytes: u64,
}

impl ProcessedBlock {
    /// Records of the block it was computed from.
    pub fn records_in(&self) -> usize {
        self.records_in
    }

    /// The result's size in memory as far as its records' own size goes
    /// (what they point to, a string's bytes, is not counted).
    pub fn estimated_bytes(&self) -> u64 {
        self.estimated_bytes
    }
}

impl fmt::Debug for ProcessedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessedBlock")
            .field("records_in", &self.records_in)
            .field("estimated_bytes", &self.estimated_bytes)
            .finish_non_exhaustive()
    }
}

/// Processed blocks by batch time, between the runtime that delivers them
/// and the operator that takes them.
#[derive(Default)]
pub(crate) struct Delivered {
    by_time: Mutex<BTreeMap<Time, Vec<Box<dyn Any + Send>>>>,
}

impl Delivered {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Time, Vec<Box<dyn Any + Send>>>> {
        lock(&self.by_time)
    }

    /// The parts delivered for `time`, in delivery order; parts of earlier
    /// times (a batch that never ran) are dropped with a warning.
    pub(crate) fn take(&self, time: Time) -> Vec<Box<dyn Any + Send>> {
        let mut by_time = self.lock();
        let later = by_time.split_off(&time);
        for (stale, parts) in std::mem::replace(&mut *by_time, later) {
            tracing::warn!(stale_time = %stale, batch_time = %time, blocks = parts.len(), "processed blocks delivered for a batch that already ran were dropped");
        }
        by_time.remove(&time).unwrap_or_default()
    }
}

type StageFn<T> = dyn Fn(Vec<T>) -> (Box<dyn Any + Send>, u64) + Send + Sync;

/// An operator's function over one partition's records read in place off
/// an encoded payload (see [`spate_core::Views`]).
pub(crate) type PayloadFn<U> = dyn Fn(&[u8]) -> Result<Vec<U>, CoreError> + Send + Sync;

type PayloadStageFn = dyn Fn(&[u8]) -> Result<(Box<dyn Any + Send>, u64, usize), CoreError> + Send + Sync;

pub(crate) type JoinFn = dyn Fn(Vec<Box<dyn Any + Send>>) -> Box<dyn Any + Send> + Send + Sync;

pub(crate) type StepFn = dyn Fn(Box<dyn Any + Send>) -> (Box<dyn Any + Send>, u64) + Send + Sync;

/// Two results merged by key into one, with its estimated size (see
/// [`KeyedMerge::merge`]).
pub(crate) type KeyedMergeFn =
    dyn Fn(Box<dyn Any + Send>, Box<dyn Any + Send>) -> (Box<dyn Any + Send>, u64) + Send + Sync;

/// How the results of a chain ending in a per-key aggregate merge by key
/// ahead of their batch (see [`ArrivalStage::merge_by_key`]).
pub(crate) struct KeyedMerge {
    /// Whether merging pays now: false while an aggregate handed over to
    /// a reader leaves its blocks uncombined (their keys nearly all
    /// distinct, so merged they would shrink nothing).
    pub(crate) applies: Box<dyn Fn() -> bool + Send + Sync>,
    /// The second result merged into the first, the first's values first,
    /// with the merged result's estimated size.
    pub(crate) merge: Box<KeyedMergeFn>,
}

/// A later operator of an arrival chain: its function over the result of
/// the operator before it, type-erased (see [`ArrivalStage::then`]).
#[derive(Clone)]
pub(crate) struct ArrivalStep {
    operator: Arc<str>,
    run: Arc<StepFn>,
    join: Arc<JoinFn>,
    keyed_merge: Option<Arc<KeyedMerge>>,
    chunkable: bool,
    /// Where the chain's results go when this step ends it.
    pub(crate) delivered: Arc<Delivered>,
}

impl ArrivalStep {
    /// The step running `f`, the function over one partition of the
    /// operator named `operator`.
    pub(crate) fn new<T, U, F>(operator: &str, f: Arc<F>, chunkable: bool, delivered: Arc<Delivered>) -> Self
    where
        T: Send + 'static,
        U: Send + 'static,
        F: Fn(Vec<T>) -> Vec<U> + Send + Sync + ?Sized + 'static,
    {
        let run = move |part: Box<dyn Any + Send>| match part.downcast::<Vec<T>>() {
            Ok(records) => result_part(f(*records)),
            // Not in a built graph (each step takes what the one before
            // gives); the operator taking the part reports the mismatch.
            Err(other) => (other, 0),
        };
        ArrivalStep::from_parts(operator, Arc::new(run), Arc::new(concatenate::<U>), chunkable, delivered)
    }

    /// A step from its type-erased parts: `run` maps the result of the
    /// operator before to this one's with its estimated size, `join` joins
    /// the results of a partition's chunks.
    pub(crate) fn from_parts(
        operator: &str,
        run: Arc<StepFn>,
        join: Arc<JoinFn>,
        chunkable: bool,
        delivered: Arc<Delivered>,
    ) -> Self {
        ArrivalStep { operator: operator.into(), run, join, keyed_merge: None, chunkable, delivered }
    }

    /// This step, whose results of consecutive blocks merge by key as
    /// `keyed_merge` says.
    pub(crate) fn with_keyed_merge(mut self, keyed_merge: KeyedMerge) -> Self {
        self.keyed_merge = Some(Arc::new(keyed_merge));
        self
    }
}

/// The function of the operator that follows a fed input, to run on each of
/// its blocks as the block arrives (see the module doc).
pub struct ArrivalStage<T> {
    operator: Arc<str>,
    run: Arc<StageFn<T>>,
    /// The same function reading the records in place, when the operator
    /// has one (`map_partitions_in_place`).
    run_payload: Option<Arc<PayloadStageFn>>,
    /// Joins the results of a partition's chunks (see [`ArrivalStage::join`]).
    join: Arc<JoinFn>,
    keyed_merge: Option<Arc<KeyedMerge>>,
    chunkable: bool,
    delivered: Arc<Delivered>,
}

impl<T> Clone for ArrivalStage<T> {
    fn clone(&self) -> Self {
        ArrivalStage {
            operator: Arc::clone(&self.operator),
            run: Arc::clone(&self.run),
            run_payload: self.run_payload.clone(),
            join: Arc::clone(&self.join),
            keyed_merge: self.keyed_merge.clone(),
            chunkable: self.chunkable,
            delivered: Arc::clone(&self.delivered),
        }
    }
}

impl<T> fmt::Debug for ArrivalStage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrivalStage")
            .field("operator", &self.operator)
            .field("chunkable", &self.chunkable)
            .finish_non_exhaustive()
    }
}

impl<T> ArrivalStage<T> {
    /// A stage running `f`, an operator's function over one partition, for
    /// the operator named `operator`; `chunkable` when `f` of a partition
    /// is the concatenation of `f` of its pieces (see
    /// [`ArrivalStage::is_chunkable`]).
    pub(crate) fn new<U, F>(
        operator: &str,
        f: Arc<F>,
        in_place: Option<Arc<PayloadFn<U>>>,
        chunkable: bool,
        delivered: Arc<Delivered>,
    ) -> Self
    where
        U: Send + 'static,
        F: Fn(Vec<T>) -> Vec<U> + Send + Sync + ?Sized + 'static,
    {
        let run = move |records: Vec<T>| result_part(f(records));
        let run_payload = in_place.map(|g| {
            Arc::new(move |payload: &[u8]| {
                let records_in = PayloadReader::new(payload).varint()? as usize;
                let (part, bytes) = result_part(g(payload)?);
                Ok((part, bytes, records_in))
            }) as Arc<PayloadStageFn>
        });
        ArrivalStage {
            operator: operator.into(),
            run: Arc::new(run),
            run_payload,
            join: Arc::new(concatenate::<U>),
            keyed_merge: None,
            chunkable,
            delivered,
        }
    }

    /// The stage running `step` alone on records of type `T`, for an
    /// operator whose step takes a `Vec<T>`.
    pub(crate) fn from_step(step: &ArrivalStep) -> Self
    where
        T: Send + 'static,
    {
        let run = Arc::clone(&step.run);
        ArrivalStage {
            operator: Arc::clone(&step.operator),
            run: Arc::new(move |records: Vec<T>| run(Box::new(records))),
            run_payload: None,
            join: Arc::clone(&step.join),
            keyed_merge: step.keyed_merge.clone(),
            chunkable: step.chunkable,
            delivered: Arc::clone(&step.delivered),
        }
    }

    /// This stage followed by `step`: the chain of operators runs on each
    /// block as it arrives, and its results go to `step`'s operator. The
    /// chain is chunkable when every operator of it is.
    pub(crate) fn then(&self, step: &ArrivalStep) -> Self
    where
        T: 'static,
    {
        let (first, next) = (Arc::clone(&self.run), Arc::clone(&step.run));
        let run = move |records: Vec<T>| next(first(records).0);
        let run_payload = self.run_payload.as_ref().map(|first| {
            let (first, next) = (Arc::clone(first), Arc::clone(&step.run));
            Arc::new(move |payload: &[u8]| {
                let (part, _, records_in) = first(payload)?;
                let (part, bytes) = next(part);
                Ok((part, bytes, records_in))
            }) as Arc<PayloadStageFn>
        });
        ArrivalStage {
            operator: format!("{} > {}", self.operator, step.operator).into(),
            run: Arc::new(run),
            run_payload,
            join: Arc::clone(&step.join),
            keyed_merge: step.keyed_merge.clone(),
            chunkable: self.chunkable && step.chunkable,
            delivered: Arc::clone(&step.delivered),
        }
    }

    /// The operator whose function this is (`a > b` for a chain).
    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// Runs the operator's function on one block's records. It runs user
    /// code: a panic in it comes out of here.
    pub fn process(&self, records: Vec<T>) -> ProcessedBlock {
        let records_in = records.len();
        let (part, estimated_bytes) = (self.run)(records);
        ProcessedBlock { part, records_in, estimated_bytes }
    }

    /// Whether the operator reads records in place: then
    /// [`ArrivalStage::process_payload`] takes a block's encoded payload
    /// and no record is decoded.
    pub fn reads_in_place(&self) -> bool {
        self.run_payload.is_some()
    }

    /// Runs the operator's function on the records of one block's encoded
    /// payload (bincode's layout of the sequence), read in place; `None`
    /// when the operator does not read in place
    /// ([`ArrivalStage::reads_in_place`]). A payload whose records do not
    /// read is an error. It runs user code: a panic in it comes out of here.
    pub fn process_payload(&self, payload: &[u8]) -> Option<Result<ProcessedBlock, CoreError>> {
        let run = self.run_payload.as_ref()?;
        Some(run(payload).map(|(part, estimated_bytes, records_in)| ProcessedBlock {
            part,
            records_in,
            estimated_bytes,
        }))
    }

    /// Whether a source may process a partition in consecutive chunks and
    /// [`ArrivalStage::join`] their results into the one result it would
    /// have computed from the partition whole. True when every operator of
    /// the chain works record by record (`map`, `flat_map`, `filter`),
    /// whose results concatenate, with at most a per-key aggregate at its
    /// end, whose chunks' combined values merge by key; false with a
    /// `map_partitions` function in it, which sees the partition whole.
    pub fn is_chunkable(&self) -> bool {
        self.chunkable
    }

    /// One processed block of `blocks`, in order: their results
    /// concatenated, or merged by key for a chain that ends in an
    /// aggregate. For a chunkable stage, joining the results of
    /// consecutive chunks of a partition gives the result of the whole
    /// partition; for any other, it is only their concatenation.
    pub fn join(&self, blocks: Vec<ProcessedBlock>) -> ProcessedBlock {
        let records_in = blocks.iter().map(|b| b.records_in).sum();
        let estimated_bytes = blocks.iter().map(|b| b.estimated_bytes).sum();
        let part = (self.join)(blocks.into_iter().map(|b| b.part).collect());
        ProcessedBlock { part, records_in, estimated_bytes }
    }

    /// Whether the results of two consecutive blocks of one batch may be
    /// merged by key before the batch takes them
    /// ([`ArrivalStage::merge_by_key`]): true for a chain that ends in a
    /// per-key aggregate, whose blocks' tables (or, handed over to a
    /// reader, blocks split by partition) are merged by key in the end
    /// anyway. False for a partition-local chain (each block is a
    /// partition of the batch), and while a handed-over aggregate leaves
    /// its blocks uncombined because their keys hardly repeat. It may
    /// change from one block to the next.
    pub fn merges_by_key(&self) -> bool {
        self.keyed_merge.as_ref().is_some_and(|keyed| (keyed.applies)())
    }

    /// `first` and `then`, the results of consecutive blocks of one batch
    /// (`first` the earlier), merged by key into one result: each key once,
    /// its values merged in block order, so the batch's result is the one
    /// it would have computed from the two. Merging as blocks come holds a
    /// batch's keys once rather than once a block. Both come back
    /// unchanged when the stage does not merge by key
    /// ([`ArrivalStage::merges_by_key`]). It runs user code: a panic in it
    /// comes out of here.
    pub fn merge_by_key(
        &self,
        first: ProcessedBlock,
        then: ProcessedBlock,
    ) -> Result<ProcessedBlock, (ProcessedBlock, ProcessedBlock)> {
        match &self.keyed_merge {
            Some(keyed) if (keyed.applies)() => {
                let records_in = first.records_in + then.records_in;
                let (part, estimated_bytes) = (keyed.merge)(first.part, then.part);
                Ok(ProcessedBlock { part, records_in, estimated_bytes })
            }
            _ => Err((first, then)),
        }
    }

    /// Hands the processed blocks of batch `time` to the operator, in block
    /// order (the order of the blocks allocated to the batch).
    pub fn deliver(&self, time: Time, blocks: Vec<ProcessedBlock>) {
        self.delivered.lock().entry(time).or_default().extend(blocks.into_iter().map(|b| b.part));
    }
}

/// The results in `parts` (each a `Vec<U>`, as [`result_part`] makes
/// them) as one, in order.
fn concatenate<U: Send + 'static>(parts: Vec<Box<dyn Any + Send>>) -> Box<dyn Any + Send> {
    let mut parts = parts.into_iter().filter_map(|part| part.downcast::<Vec<U>>().ok());
    let mut all = parts.next().map(|first| *first).unwrap_or_default();
    for part in parts {
        all.extend(*part);
    }
    Box::new(all)
}

/// A partition's result as a delivered part, with its estimated size.
fn result_part<U: Send + 'static>(out: Vec<U>) -> (Box<dyn Any + Send>, u64) {
    let bytes = (out.len() * std::mem::size_of::<U>()) as u64;
    (Box::new(out), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivered_parts_come_out_for_their_time_once_and_stale_ones_are_dropped() {
        let delivered = Arc::new(Delivered::default());
        let stage = ArrivalStage::new(
            "double",
            Arc::new(|v: Vec<u32>| v.into_iter().map(|x| x * 2).collect::<Vec<_>>()),
            None,
            true,
            Arc::clone(&delivered),
        );
        let block = stage.process(vec![1, 2, 3]);
        assert_eq!((block.records_in(), block.estimated_bytes()), (3, 12));
        stage.deliver(Time::from_millis(1000), vec![block]);
        stage.deliver(Time::from_millis(2000), vec![stage.process(vec![5])]);
        let parts = delivered.take(Time::from_millis(2000));
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].downcast_ref::<Vec<u32>>(), Some(&vec![10]));
        assert!(delivered.take(Time::from_millis(1000)).is_empty(), "time 1000 was dropped as stale");
        assert!(delivered.take(Time::from_millis(2000)).is_empty(), "taken once");
    }

    #[test]
    fn joined_chunks_of_a_chunkable_stage_equal_the_whole_partition_processed() {
        let delivered = Arc::new(Delivered::default());
        let evens_doubled = |v: Vec<u32>| v.into_iter().filter(|x| x % 2 == 0).map(|x| x * 2).collect::<Vec<_>>();
        let stage = ArrivalStage::new("evens", Arc::new(evens_doubled), None, true, Arc::clone(&delivered));
        assert!(stage.is_chunkable());
        let records: Vec<u32> = (0..50).collect();
        for cuts in [vec![], vec![0], vec![1, 7, 7, 30], vec![49, 50]] {
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([records.len()]) {
                chunks.push(stage.process(records[from..cut].to_vec()));
                from = cut;
            }
            let joined = stage.join(chunks);
            assert_eq!(joined.records_in(), 50);
            assert_eq!(joined.estimated_bytes(), 25 * 4);
            stage.deliver(Time::ZERO, vec![joined]);
            let parts = delivered.take(Time::ZERO);
            assert_eq!(parts[0].downcast_ref::<Vec<u32>>(), Some(&evens_doubled(records.clone())));
        }
        assert_eq!(stage.join(Vec::new()).records_in(), 0, "no chunks join into an empty block");
    }

    #[test]
    fn a_chain_runs_each_operator_in_turn_and_delivers_to_the_last() {
        let first = Arc::new(Delivered::default());
        let last = Arc::new(Delivered::default());
        let stage = ArrivalStage::new(
            "split",
            Arc::new(|v: Vec<u32>| v.into_iter().flat_map(|x| [x, x + 100]).collect::<Vec<_>>()),
            None,
            true,
            Arc::clone(&first),
        );
        let to_text = ArrivalStep::new(
            "text",
            Arc::new(|v: Vec<u32>| v.into_iter().map(|x| x.to_string()).collect::<Vec<_>>()),
            true,
            Arc::clone(&last),
        );
        let whole = ArrivalStep::new("whole", Arc::new(|v: Vec<String>| vec![v.concat()]), false, Arc::clone(&last));
        let chain = stage.then(&to_text);
        assert_eq!((chain.operator(), chain.is_chunkable()), ("split > text", true));
        let block = chain.process(vec![1, 2]);
        assert_eq!(block.records_in(), 2);
        chain.deliver(Time::ZERO, vec![block]);
        let parts = last.take(Time::ZERO);
        assert_eq!(
            parts[0].downcast_ref::<Vec<String>>(),
            Some(&vec!["1".into(), "101".into(), "2".into(), "102".into()])
        );
        assert!(first.take(Time::ZERO).is_empty(), "the chain delivers to its last operator only");
        assert!(!chain.then(&whole).is_chunkable(), "a whole-partition operator makes the chain whole-partition");
    }
}
