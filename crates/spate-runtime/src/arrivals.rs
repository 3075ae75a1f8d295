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
//! batch; a source faster than the thread fills the budget with encoded
//! blocks, and the receiver waits for room, as without the stage.

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

/// One block's result, processed on arrival.
pub(crate) struct Arrived {
    pub(crate) block: ProcessedBlock,
    /// The block's serialized bytes (0 when it was kept as records).
    pub(crate) bytes_in: u64,
    /// How long decoding and processing it took: its batch's work done
    /// ahead, which backpressure counts with the batch's own.
    pub(crate) work: Duration,
}

enum State {
    Pending,
    InProgress,
    Done(Result<Arrived, String>),
}

/// What a batch found for one block.
pub(crate) enum Found {
    /// Processed on arrival (or failed there).
    Processed(Result<Arrived, String>),
    /// Not processed yet: the batch processes it itself.
    Unprocessed,
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

    /// What there is for `block_id`, waiting while it is being processed.
    /// The block is this batch's from now on: the thread leaves it alone.
    pub(crate) fn take(&self, block_id: StreamBlockId) -> Found {
        let mut states = self.lock();
        loop {
            match states.remove(&block_id) {
                Some(State::InProgress) => {
                    states.insert(block_id, State::InProgress);
                    states = self.changed.wait(states).unwrap_or_else(PoisonError::into_inner);
                }
                Some(State::Done(result)) => {
                    if let Ok(arrived) = &result {
                        self.held.fetch_sub(arrived.block.estimated_bytes(), Ordering::Relaxed);
                        self.memory.release(arrived.block.estimated_bytes());
                    }
                    return Found::Processed(result);
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
    pub(crate) fn spawn(
        self: &Arc<Self>,
        name: &str,
        threads: usize,
        blocks: &Arc<BlockManager<T>>,
    ) -> std::io::Result<ArrivalThreads> {
        let (tx, rx) = crossbeam::channel::unbounded();
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads.max(1) {
            let (arrivals, blocks, rx) = (Arc::clone(self), Arc::clone(blocks), rx.clone());
            let spawned =
                std::thread::Builder::new().name(format!("{name}-{index}")).spawn(move || arrivals.run(&rx, &blocks));
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

    fn run(&self, arrived: &Receiver<Option<StreamBlockId>>, blocks: &BlockManager<T>) {
        for block_id in arrived.iter().map_while(|sent| sent) {
            if !self.start(block_id) {
                continue;
            }
            let result = self.process_stored(block_id, blocks);
            if let Ok(Some(arrived)) = &result {
                self.held.fetch_add(arrived.block.estimated_bytes(), Ordering::Relaxed);
                self.memory.charge(arrived.block.estimated_bytes());
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
        }
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
        Ok(Some(Arrived { block, bytes_in, work }))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<StreamBlockId, State>> {
        // Every update of the map completes before anything can panic.
        lock(&self.states)
    }
}

/// The threads processing an input's blocks as they arrive.
pub(crate) struct ArrivalThreads {
    sender: Sender<Option<StreamBlockId>>,
    handles: Vec<JoinHandle<()>>,
}

impl ArrivalThreads {
    /// Where stored blocks are sent to be processed.
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
