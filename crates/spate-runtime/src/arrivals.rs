//! Runs a receiver input's [`ArrivalStage`] on each block as soon as it is
//! stored, on a few threads of the input's own (one a processor), so the
//! records flow through the input's first operator while the batch
//! interval is still open.
//!
//! A block is processed once, either here or at the batch boundary, and
//! its result is the same either way. The block's state says which:
//! `Pending` from before the block is reported to the tracker (so the batch
//! it is allocated to always finds it), `InProgress` while the thread works
//! on it (the batch waits), `Done` with the result (the batch takes it). A
//! batch that finds a block still `Pending` takes it away and processes it
//! itself; the thread then skips it. Once processed, the block's records
//! leave the block manager (the write-ahead log keeps them for a restart)
//! and its result is charged to the memory budget until its batch takes
//! it. Once results waiting for their batch hold more than half the
//! budget, blocks wait encoded for their batch instead, so an operator
//! that grows its input (a `map` to pairs) cannot fill memory ahead of the
//! batch, and the receiver waits for room in the budget, as without the
//! stage. A source faster than the threads waits for them: stored blocks
//! queue for the threads one a thread at most, and the block after waits
//! to be queued, holding up the receiver behind it, rather than the
//! budget filling with encoded blocks (256 MiB of them by default, before
//! a first batch's end gives the source a rate).
//!
//! For a stage whose results merge by key (a chain ending in a per-key
//! aggregate, [`ArrivalStage::merges_by_key`]), the results of
//! consecutive blocks are merged as they finish, while they wait: a
//! block's result is merged into the run of results right before it, and
//! the run right after it into its own, when the tracker has both blocks
//! waiting for a batch side by side (the next allocation then takes them
//! together, one after the other). A run is kept under its first block
//! and names the blocks after it; its batch takes it there and skips them.
//! Waiting results then hold each key about once rather than once a
//! block: a 10 s batch over 10,000 distinct words in 400 blocks holds a
//! table or a few, not 400.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender};
use spate_core::sync::lock;
use spate_core::{CoreError, MemoryBudget, StreamBlockId};
use spate_dstream::{ArrivalStage, ProcessedBlock};
use spate_receiver::{BlockData, BlockManager, Record, block_payload, decode_block_in_chunks};
use tracing::warn;

/// Records of a serialized block decoded at once when the stage takes a
/// block in chunks: a few megabytes of short strings, while each chunk
/// is still large enough that the per-chunk work of an aggregate (a map
/// of the chunk's keys, merged into the block's) stays small beside it.
const DECODED_CHUNK_RECORDS: usize = 128 * 1024;

/// One block's result, processed on arrival, or the merged result of a
/// run of consecutive blocks starting with it.
pub(crate) struct Arrived {
    pub(crate) block: ProcessedBlock,
    /// The serialized bytes of its blocks (0 for blocks kept as records).
    pub(crate) bytes_in: u64,
    /// How long decoding, processing and merging them took: its batch's
    /// work done ahead, which backpressure counts with the batch's own.
    pub(crate) work: Duration,
    /// The blocks after the first whose results are merged into this one,
    /// in order: they follow the first in its batch.
    pub(crate) merged: Vec<StreamBlockId>,
}

impl Arrived {
    /// The last block of the run, `first` being its first.
    fn last(&self, first: StreamBlockId) -> StreamBlockId {
        self.merged.last().copied().unwrap_or(first)
    }
}

/// What became of two runs given to be merged.
enum Merged {
    /// One run of both (or the error the stage's merge panicked with).
    Into(Result<Arrived, String>),
    /// The stage declined: both runs as they were.
    Declined(Arrived, Arrived),
}

/// The blocks of the stream waiting for a batch right before and after a
/// block, `None` once it is allocated (see
/// `ReceivedBlockTracker::unallocated_neighbours`).
pub(crate) type Neighbours =
    dyn Fn(StreamBlockId) -> Option<(Option<StreamBlockId>, Option<StreamBlockId>)> + Send + Sync;

enum State {
    Pending,
    InProgress,
    Done(Result<Arrived, String>),
    /// Its result is merged into the run of the block named (the run's
    /// first), which its batch takes.
    Merged(StreamBlockId),
}

/// What a batch found for one block.
pub(crate) enum Found {
    /// Processed on arrival (or failed there).
    Processed(Result<Arrived, String>),
    /// Not processed yet: the batch processes it itself.
    Unprocessed,
    /// Merged into the result found for a block before it: nothing of
    /// its own.
    Merged,
}

/// The blocks of one input between their arrival and their batch.
pub(crate) struct Arrivals<T> {
    stage: ArrivalStage<T>,
    states: Mutex<HashMap<StreamBlockId, State>>,
    changed: Condvar,
    memory: Arc<MemoryBudget>,
    /// Bytes of results waiting for their batch (charged to `memory`).
    held: AtomicU64,
}

impl<T: Record + Send + 'static> Arrivals<T> {
    pub(crate) fn new(stage: ArrivalStage<T>, memory: Arc<MemoryBudget>) -> Arc<Self> {
        let held = AtomicU64::new(0);
        Arc::new(Arrivals { stage, states: Mutex::new(HashMap::new()), changed: Condvar::new(), memory, held })
    }

    /// The stage this input runs.
    pub(crate) fn stage(&self) -> &ArrivalStage<T> {
        &self.stage
    }

    /// Notes a block about to be reported to the tracker.
    pub(crate) fn expect(&self, block_id: StreamBlockId) {
        self.lock().insert(block_id, State::Pending);
    }

    /// Forgets a block the tracker refused.
    pub(crate) fn forget(&self, block_id: StreamBlockId) {
        self.lock().remove(&block_id);
    }

    /// What there is for each of a batch's blocks, in order (see
    /// [`Arrivals::take`]): a run of results merged ahead is found at its
    /// first block, and the blocks merged into it, which follow it, are
    /// found [`Found::Merged`]. An error when a run holds blocks that do
    /// not follow it in the batch.
    pub(crate) fn take_batch(&self, blocks: &[StreamBlockId]) -> Result<Vec<Found>, String> {
        let mut found = Vec::with_capacity(blocks.len());
        while let Some(&block_id) = blocks.get(found.len()) {
            let taken = self.take(block_id);
            let merged = match &taken {
                Found::Processed(Ok(run)) if !blocks[found.len() + 1..].starts_with(&run.merged) => {
                    return Err(format!("block {block_id}'s result merges blocks its batch has not right after it"));
                }
                Found::Processed(Ok(run)) => run.merged.len(),
                _ => 0,
            };
            found.push(taken);
            found.extend(std::iter::repeat_with(|| Found::Merged).take(merged));
        }
        Ok(found)
    }

    /// What there is for `block_id`, waiting while it is being processed.
    /// The block is this batch's from now on: the thread leaves it alone.
    fn take(&self, block_id: StreamBlockId) -> Found {
        let mut states = self.lock();
        loop {
            match states.remove(&block_id) {
                Some(State::InProgress) => {
                    states.insert(block_id, State::InProgress);
                    states = self.changed.wait(states).unwrap_or_else(PoisonError::into_inner);
                }
                Some(State::Done(result)) => {
                    if let Ok(arrived) = &result {
                        self.let_go(arrived.block.estimated_bytes());
                        for block in &arrived.merged {
                            states.remove(block);
                        }
                    }
                    return Found::Processed(result);
                }
                // Its batch takes a run's first block before the others.
                Some(State::Merged(first)) => {
                    states.insert(block_id, State::Merged(first));
                    let error =
                        format!("block {block_id}'s result is merged into block {first}'s, not taken before it");
                    return Found::Processed(Err(error));
                }
                Some(State::Pending) | None => return Found::Unprocessed,
            }
        }
    }

    /// Runs the stage on `records`, turning a panic of the operator's
    /// function into an error that names the operator.
    pub(crate) fn process(&self, records: Vec<T>) -> Result<ProcessedBlock, String> {
        self.guarded(|| Ok(self.stage.process(records)))
    }

    /// Runs the stage on a stored block: on its encoded payload, read in
    /// place, when the block is serialized and the operator reads in place
    /// (no record is decoded); chunk by chunk of decoded records when the
    /// operator's results of consecutive chunks join into the block's
    /// (one chunk is held decoded at a time, not the block); on its
    /// decoded records otherwise.
    pub(crate) fn process_stored_data(
        &self,
        block_id: StreamBlockId,
        data: BlockData<T>,
    ) -> Result<ProcessedBlock, String> {
        let failed = |e: CoreError| format!("block {block_id}: {e}");
        if let BlockData::Bytes(bytes) = &data
            && self.stage.reads_in_place()
        {
            let payload = block_payload(bytes).map_err(failed)?;
            let in_place = self.guarded(|| self.stage.process_payload(payload).transpose().map_err(failed))?;
            if let Some(block) = in_place {
                return Ok(block);
            }
        }
        if let BlockData::Bytes(bytes) = &data
            && self.stage.is_chunkable()
        {
            return self.guarded(|| {
                let mut joined: Option<ProcessedBlock> = None;
                decode_block_in_chunks::<T>(bytes, DECODED_CHUNK_RECORDS, |records| {
                    let part = self.stage.process(records);
                    joined = Some(match joined.take() {
                        Some(before) => self.stage.join(vec![before, part]),
                        None => part,
                    });
                })
                .map_err(failed)?;
                Ok(joined.unwrap_or_else(|| self.stage.process(Vec::new())))
            });
        }
        let records = data.records().map_err(failed)?;
        drop(data);
        self.process(Arc::try_unwrap(records).unwrap_or_else(|shared| (*shared).clone()))
    }

    /// Runs `run`, turning a panic of the operator's function into an
    /// error that names the operator.
    fn guarded<R>(&self, run: impl FnOnce() -> Result<R, String>) -> Result<R, String> {
        catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(format!("operator {} panicked on a block: {message}", self.stage.operator()))
        })
    }

    /// Starts `threads` threads that process the blocks sent to the
    /// returned sender, taken in the order sent, until each is sent `None`
    /// ([`ArrivalThreads::stop`]). Blocks are independent and each batch
    /// takes its results in block order, so any thread may take any block.
    /// A send waits while a block a thread is queued (see the module doc).
    /// `neighbours` says which blocks go to the same batch side by side,
    /// for merging their results.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        name: &str,
        threads: usize,
        blocks: &Arc<BlockManager<T>>,
        neighbours: Arc<Neighbours>,
    ) -> std::io::Result<ArrivalThreads> {
        let (tx, rx) = crossbeam::channel::bounded(threads.max(1));
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads.max(1) {
            let (arrivals, blocks, rx) = (Arc::clone(self), Arc::clone(blocks), rx.clone());
            let neighbours = Arc::clone(&neighbours);
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || arrivals.run(&rx, &blocks, &*neighbours));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    ArrivalThreads { sender: tx, handles }.stop();
                    return Err(e);
                }
            }
        }
        Ok(ArrivalThreads { sender: tx, handles })
    }

    fn run(&self, arrived: &Receiver<Option<StreamBlockId>>, blocks: &BlockManager<T>, neighbours: &Neighbours) {
        for block_id in arrived.iter().map_while(|sent| sent) {
            self.arrive(block_id, blocks, neighbours);
        }
    }

    /// Processes a stored block unless its batch took it, then merges its
    /// result with its neighbours' (see the module doc).
    fn arrive(&self, block_id: StreamBlockId, blocks: &BlockManager<T>, neighbours: &Neighbours) {
        if !self.start(block_id) {
            return;
        }
        let result = self.process_stored(block_id, blocks);
        let processed = matches!(result, Ok(Some(_)));
        if let Ok(Some(arrived)) = &result {
            self.hold(arrived.block.estimated_bytes());
        }
        let mut states = self.lock();
        match result {
            Ok(Some(arrived)) => states.insert(block_id, State::Done(Ok(arrived))),
            // Not in the block manager (read back from the WAL by its batch).
            Ok(None) => states.remove(&block_id),
            Err(e) => states.insert(block_id, State::Done(Err(e))),
        };
        drop(states);
        self.changed.notify_all();
        if processed && self.stage.merges_by_key() {
            self.merge_with_neighbours(block_id, neighbours);
        }
    }

    /// Merges `block`'s result into the run before it, then the run after
    /// into the one now holding it, each when the tracker has them side by
    /// side for one batch.
    fn merge_with_neighbours(&self, block: StreamBlockId, neighbours: &Neighbours) {
        let Some((before, _)) = neighbours(block) else { return };
        if let Some(before) = before {
            self.merge_runs(before, block);
        }
        let last = {
            let states = self.lock();
            match run_holding(&states, block) {
                Some((first, run)) => run.last(first),
                None => return,
            }
        };
        if let Some((_, Some(after))) = neighbours(last) {
            self.merge_runs(last, after);
        }
    }

    /// Merges the run starting at `next` into the run ending at `last`,
    /// when both are finished and waiting; the caller found them side by
    /// side in one batch.
    fn merge_runs(&self, last: StreamBlockId, next: StreamBlockId) {
        let mut states = self.lock();
        let first = match run_holding(&states, last) {
            Some((first, run)) if run.last(first) == last && first != next => first,
            _ => return,
        };
        let Some(later) = take_finished(&mut states, next) else { return };
        let Some(earlier) = take_finished(&mut states, first) else {
            states.insert(next, State::Done(Ok(later)));
            return;
        };
        // Its batch waits for the merge; the later run's blocks point to it.
        states.insert(first, State::InProgress);
        for block in std::iter::once(&next).chain(&later.merged) {
            states.insert(*block, State::Merged(first));
        }
        drop(states);
        let merged = self.merged_runs(earlier, next, later);
        let mut states = self.lock();
        match merged {
            Merged::Into(result) => {
                states.insert(first, State::Done(result));
            }
            // The stage no longer merges (its blocks stopped shrinking):
            // both runs as they were.
            Merged::Declined(earlier, later) => {
                for block in &later.merged {
                    states.insert(*block, State::Merged(next));
                }
                states.insert(next, State::Done(Ok(later)));
                states.insert(first, State::Done(Ok(earlier)));
            }
        }
        drop(states);
        self.changed.notify_all();
    }

    /// `earlier` with `later` (the run starting at `next`) merged into it,
    /// with the memory they hold charged anew; both back when the stage
    /// declines to merge them.
    fn merged_runs(&self, earlier: Arrived, next: StreamBlockId, later: Arrived) -> Merged {
        let before = earlier.block.estimated_bytes() + later.block.estimated_bytes();
        let started = Instant::now();
        let (first_block, later_block) = (earlier.block, later.block);
        let block = match self.guarded(|| Ok(self.stage.merge_by_key(first_block, later_block))) {
            Ok(Ok(block)) => block,
            Ok(Err((first_block, later_block))) => {
                let earlier = Arrived { block: first_block, ..earlier };
                return Merged::Declined(earlier, Arrived { block: later_block, ..later });
            }
            Err(panicked) => {
                self.let_go(before);
                return Merged::Into(Err(panicked));
            }
        };
        self.let_go(before);
        self.hold(block.estimated_bytes());
        let mut merged = earlier.merged;
        merged.push(next);
        merged.extend(later.merged);
        let work = earlier.work + later.work + started.elapsed();
        Merged::Into(Ok(Arrived { block, bytes_in: earlier.bytes_in + later.bytes_in, work, merged }))
    }

    /// Charges `bytes` of results waiting for their batch to the budget.
    fn hold(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
        self.memory.charge(bytes);
    }

    /// Gives back `bytes` of results charged by [`Arrivals::hold`].
    fn let_go(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        self.memory.release(bytes);
    }

    /// Marks a pending block in progress; false when its batch took it or
    /// the results waiting hold half the budget (it then waits for its
    /// batch, encoded).
    fn start(&self, block_id: StreamBlockId) -> bool {
        let mut states = self.lock();
        if !matches!(states.get(&block_id), Some(State::Pending)) {
            return false;
        }
        if self.held.load(Ordering::Relaxed) > self.memory.limit() / 2 {
            return false;
        }
        states.insert(block_id, State::InProgress);
        true
    }

    fn process_stored(&self, block_id: StreamBlockId, blocks: &BlockManager<T>) -> Result<Option<Arrived>, String> {
        let Some(data) = blocks.get(block_id).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let bytes_in = match &data {
            BlockData::Bytes(bytes) => bytes.len() as u64,
            BlockData::Records(_) => 0,
        };
        let started = Instant::now();
        let block = self.process_stored_data(block_id, data)?;
        let work = started.elapsed();
        // Its records are in the result now (and in the WAL for a restart).
        if let Err(e) = blocks.remove(block_id) {
            warn!(block = %block_id, error = %e, "could not drop a processed block from the block manager");
        }
        Ok(Some(Arrived { block, bytes_in, work, merged: Vec::new() }))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<StreamBlockId, State>> {
        // Every update of the map completes before anything can panic.
        lock(&self.states)
    }
}

/// The first block of the finished run holding `block`, and the run.
fn run_holding(states: &HashMap<StreamBlockId, State>, block: StreamBlockId) -> Option<(StreamBlockId, &Arrived)> {
    let first = match states.get(&block)? {
        State::Merged(first) => *first,
        _ => block,
    };
    match states.get(&first)? {
        State::Done(Ok(run)) => Some((first, run)),
        _ => None,
    }
}

/// The finished run starting at `first`, taken out of `states`; `None`,
/// and `states` unchanged, when there is none.
fn take_finished(states: &mut HashMap<StreamBlockId, State>, first: StreamBlockId) -> Option<Arrived> {
    match states.remove(&first) {
        Some(State::Done(Ok(run))) => Some(run),
        Some(other) => {
            states.insert(first, other);
            None
        }
        None => None,
    }
}

/// The threads processing an input's blocks as they arrive.
pub(crate) struct ArrivalThreads {
    sender: Sender<Option<StreamBlockId>>,
    handles: Vec<JoinHandle<()>>,
}

impl ArrivalThreads {
    /// Where stored blocks are sent to be processed; a send waits while the
    /// threads are a block each behind.
    pub(crate) fn sender(&self) -> Sender<Option<StreamBlockId>> {
        self.sender.clone()
    }

    /// How many threads share the work: their summed work on a batch's
    /// blocks took about this many times less wall time.
    pub(crate) fn threads(&self) -> usize {
        self.handles.len()
    }

    /// Lets the threads finish the blocks sent so far, then ends them.
    /// Returns false when one of them panicked.
    pub(crate) fn stop(self) -> bool {
        for _ in &self.handles {
            let _ = self.sender.send(None);
        }
        self.handles.into_iter().map(JoinHandle::join).fold(true, |ok, joined| ok & joined.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use spate_core::{BatchId, ManualClock, StreamId, Time};
    use spate_dstream::{FedSource, Graph, GraphBuilder};
    use spate_receiver::{BlockManagerSettings, StorageLevel};

    use super::*;

    type Counts = Arc<Mutex<BTreeMap<String, u64>>>;

    /// A word count whose `reduce_by_key` takes the fed blocks on arrival,
    /// with its arrivals and a block manager holding `blocks` (block `n`
    /// is `blocks[n - 1]`).
    struct Job {
        graph: Graph,
        counts: Counts,
        arrivals: Arc<Arrivals<(String, u64)>>,
        blocks: Arc<BlockManager<(String, u64)>>,
        /// The blocks waiting for a batch, as the tracker has them.
        waiting: Arc<Mutex<Vec<StreamBlockId>>>,
    }

    fn id(n: u64) -> StreamBlockId {
        StreamBlockId::new(StreamId(0), n)
    }

    fn job(blocks: &[&[&str]]) -> Job {
        job_reading(blocks, false)
    }

    /// As [`job`]; with `windowed`, the count's only reader is a window
    /// with an inverse, which takes its blocks split by partition.
    fn job_reading(blocks: &[&[&str]], windowed: bool) -> Job {
        let fed = Arc::new(FedSource::<(String, u64)>::new());
        let builder = GraphBuilder::new(spate_core::Duration::from_secs(1)).checkpointing(true);
        let counts: Counts = Arc::default();
        let sink = Arc::clone(&counts);
        let mut counted = builder.input("pairs", Arc::clone(&fed)).reduce_by_key(|a, b| a + b);
        if windowed {
            let (window, slide) = (spate_core::Duration::from_secs(2), spate_core::Duration::from_secs(1));
            counted = counted.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, window, slide);
        }
        counted.foreach_batch(move |batch, _| {
            sink.lock().unwrap().extend(batch.iter().cloned());
            Ok(())
        });
        let graph = builder.build().unwrap();
        let stage = fed.arrival_stage().expect("the count takes the blocks on arrival");
        assert!(stage.merges_by_key());
        let arrivals = Arrivals::new(stage, Arc::new(MemoryBudget::new(1 << 30)));
        let clock = Arc::new(ManualClock::new(Time::ZERO));
        let manager = BlockManager::open(BlockManagerSettings::in_memory(1 << 30), clock).unwrap();
        for (n, words) in (1..).zip(blocks) {
            let pairs = words.iter().map(|w| (w.to_string(), 1)).collect();
            manager.put(id(n), BlockData::Records(Arc::new(pairs)), StorageLevel::MEMORY_ONLY).unwrap();
            arrivals.expect(id(n));
        }
        let waiting = Arc::new(Mutex::new((1..=blocks.len() as u64).map(id).collect()));
        Job { graph, counts, arrivals, blocks: Arc::new(manager), waiting }
    }

    impl Job {
        /// Block `n` processed by an arrival thread.
        fn arrive(&self, n: u64) {
            self.arrivals.arrive(id(n), &self.blocks, &*self.neighbours());
        }

        /// The blocks side by side for one batch, as the tracker says.
        fn neighbours(&self) -> Arc<Neighbours> {
            let waiting = Arc::clone(&self.waiting);
            Arc::new(move |block| {
                let waiting = waiting.lock().unwrap();
                let at = waiting.iter().position(|queued| *queued == block)?;
                Some((at.checked_sub(1).map(|before| waiting[before]), waiting.get(at + 1).copied()))
            })
        }

        /// What the batch of blocks `batch` finds for them: for each, the
        /// blocks merged into its result, `None` for one merged into the
        /// result of a block before it. Every block was processed.
        fn take(&self, batch: &[u64]) -> Vec<Option<Vec<StreamBlockId>>> {
            let ids: Vec<StreamBlockId> = batch.iter().copied().map(id).collect();
            let found = self.arrivals.take_batch(&ids).unwrap();
            let time = Time::ZERO + spate_core::Duration::from_secs(1);
            let stage = self.arrivals.stage();
            let found = found.into_iter().map(|found| match found {
                Found::Processed(result) => {
                    let arrived = result.unwrap();
                    stage.deliver(time, vec![arrived.block]);
                    Some(arrived.merged)
                }
                Found::Merged => None,
                Found::Unprocessed => panic!("a block not processed"),
            });
            found.collect()
        }

        fn counts(mut self) -> BTreeMap<String, u64> {
            self.graph.run_batch(Time::ZERO + spate_core::Duration::from_secs(1), BatchId(1)).unwrap();
            self.counts.lock().unwrap().clone()
        }
    }

    fn words(counts: &[(&str, u64)]) -> BTreeMap<String, u64> {
        counts.iter().map(|(w, n)| (w.to_string(), *n)).collect()
    }

    #[test]
    fn results_of_neighbouring_blocks_merge_into_one_whatever_order_they_finish_in() {
        let job = job(&[&["a", "b"], &["b"], &["c", "a"], &["b", "d"]]);
        for n in [2, 1, 4, 3] {
            job.arrive(n);
        }
        assert_eq!(job.take(&[1, 2, 3, 4]), vec![Some(vec![id(2), id(3), id(4)]), None, None, None], "one run");
        assert_eq!(job.arrivals.held.load(Ordering::Relaxed), 0);
        assert_eq!(job.arrivals.memory.used(), 0, "the run's memory given back once taken");
        assert!(job.arrivals.lock().is_empty(), "nothing is left of the run's blocks");
        assert_eq!(job.counts(), words(&[("a", 2), ("b", 3), ("c", 1), ("d", 1)]));
    }

    #[test]
    fn blocks_queue_for_the_threads_one_a_thread_and_the_next_waits() {
        let job = job(&[&["a"], &["a"], &["b"]]);
        let neighbours = job.neighbours();
        // The thread stops at block 1 while the states are held.
        let states = job.arrivals.lock();
        let threads = job.arrivals.spawn("test-arrive", 1, &job.blocks, neighbours).unwrap();
        let sender = threads.sender();
        sender.send(Some(id(1))).unwrap();
        // Returns once the thread took block 1: block 2 is then its queue.
        sender.send(Some(id(2))).unwrap();
        let refused = sender.try_send(Some(id(3)));
        assert!(matches!(refused, Err(crossbeam::channel::TrySendError::Full(_))), "{refused:?}");
        drop(states);
        sender.send(Some(id(3))).unwrap();
        assert!(threads.stop());
        assert_eq!(job.take(&[1, 2, 3]), vec![Some(vec![id(2), id(3)]), None, None], "all three processed");
        assert_eq!(job.counts(), words(&[("a", 2), ("b", 1)]));
    }

    #[test]
    fn a_run_holds_the_memory_of_its_keys_once() {
        let job = job(&[&["a", "b"], &["b", "a"], &["a"]]);
        job.arrive(1);
        let one_block = job.arrivals.held.load(Ordering::Relaxed);
        job.arrive(2);
        job.arrive(3);
        assert_eq!(job.arrivals.held.load(Ordering::Relaxed), one_block, "a and b once");
        assert_eq!(job.arrivals.memory.used(), one_block);
    }

    #[test]
    fn blocks_not_side_by_side_in_one_batch_stay_apart() {
        let job = job(&[&["a"], &["a"], &["b"]]);
        job.arrive(1);
        // Blocks 1 and 2 go to a batch before block 2 is processed.
        job.waiting.lock().unwrap().retain(|block| *block == id(3));
        job.arrive(2);
        job.arrive(3);
        assert_eq!(job.take(&[1, 2]), vec![Some(vec![]), Some(vec![])], "block 2 was allocated before it finished");
        assert_eq!(job.take(&[3]), vec![Some(vec![])]);
    }

    #[test]
    fn runs_a_stage_declines_to_merge_stay_as_they_were() {
        // Split for the window: merged while a block's keys repeat.
        let job = job_reading(&[&["a", "a", "b", "a"], &["c", "d", "e", "f"]], true);
        job.arrive(1);
        // A block of distinct keys: merging stops paying.
        job.arrivals.stage().process(["x", "y", "z"].map(|w| (w.to_string(), 1)).to_vec());
        job.arrive(2);
        assert!(!job.arrivals.stage().merges_by_key());
        job.arrivals.merge_runs(id(1), id(2));
        assert_eq!(job.take(&[1, 2]), vec![Some(vec![]), Some(vec![])], "both runs as they were");
        let counts = [("a", 3), ("b", 1), ("c", 1), ("d", 1), ("e", 1), ("f", 1)];
        assert_eq!(job.counts(), words(&counts));
    }

    #[test]
    fn a_run_taken_by_a_batch_without_its_blocks_in_order_is_an_error() {
        let job = job(&[&["a"], &["a"], &["b"]]);
        for n in 1..=3 {
            job.arrive(n);
        }
        match job.arrivals.take_batch(&[id(2)]).map(|mut found| found.remove(0)) {
            Ok(Found::Processed(Err(e))) => assert!(e.contains("merged into block"), "{e}"),
            _ => panic!("block 2 is in block 1's run"),
        }
        let error = job.arrivals.take_batch(&[id(1), id(3), id(2)]).err().expect("the run is 1, 2, 3");
        assert!(error.contains("has not right after it"), "{error}");
    }
}
