//! Receiver-fed inputs: each runs a receiver under a supervisor, stores its
//! blocks (in the block manager and, with the write-ahead log on, in
//! `receivedData/<stream>/`), reports them to the tracker, and at batch
//! time feeds the blocks the tracker allocated to the graph's [`FedSource`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spate_core::{Clock, Duration, MemoryBudget, StreamBlockId, StreamId, Time, WalRecordHandle, WriterFence};
use spate_dstream::{Data, FedSource, ProcessedBlock};
use spate_receiver::{
    BlockData, BlockGeneratorSettings, BlockInfoSink, BlockManager, BlockManagerBasedBlockHandler,
    BlockManagerSettings, DEFAULT_MAX_BLOCK_BYTES, DEFAULT_MAX_BLOCK_MEMORY, FnSink, ReceivedBlockHandler, Receiver,
    ReceiverError, ReceiverState, ReceiverSupervisor, Record, StorageLevel, SupervisorSettings, WalHandlerSettings,
    WriteAheadLogBasedBlockHandler, read_block_from_wal, receiver_wal_dir, receiver_wal_options,
};
use spate_tracker::{BlockLocation, ReceivedBlockTracker, TrackedBlock};
use spate_wal::{FileWriteAheadLog, WriteAheadLog};
use tracing::warn;

use crate::arrivals::{ArrivalThreads, Arrivals, Found, Neighbours};
use crate::error::RuntimeError;
use crate::progress::ReceiverStatus;
use crate::telemetry;

/// How a receiver input stores what it receives.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiverSettings {
    /// Write every block to the receiver write-ahead log before it is
    /// acknowledged (needs a checkpoint directory): nothing received is lost
    /// in a crash.
    pub write_ahead_log: bool,
    /// A block is cut every interval.
    pub block_interval: Duration,
    /// The highest rate the receiver may store at, records per second;
    /// backpressure sets lower rates.
    pub max_rate: Option<u64>,
    /// The largest block, in records (a fast source cuts blocks early).
    pub max_block_records: Option<usize>,
}

impl Default for ReceiverSettings {
    fn default() -> Self {
        ReceiverSettings {
            write_ahead_log: true,
            block_interval: Duration::from_millis(200),
            max_rate: None,
            max_block_records: None,
        }
    }
}

/// Where a receiver resumes after a restart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverResume {
    /// Records of this stream already stored and tracked: a receiver with
    /// positions (a generator, a file) continues after them and neither
    /// loses nor repeats a record.
    pub records_stored: u64,
}

/// A checkpoint as the receivers see it: where their write-ahead logs live
/// and the writer fence those logs check.
#[derive(Clone, Copy)]
pub(crate) struct CheckpointHome<'a> {
    /// The directory of the write-ahead logs: the checkpoint directory, or
    /// the local WAL directory of a checkpoint in an object store.
    pub(crate) dir: &'a Path,
    /// This writer's fence.
    pub(crate) fence: &'a Arc<dyn WriterFence>,
}

/// Where an input's blocks spill beyond the memory budget: the folder its
/// spill area is made in, and the bytes the spill areas of every input
/// may hold together.
#[derive(Clone, Copy)]
pub(crate) struct SpillPlace<'a> {
    /// The folder spill areas are made in.
    pub(crate) base: &'a Path,
    /// The bytes every input's spilled blocks may take together.
    pub(crate) budget: &'a Arc<MemoryBudget>,
}

/// What feeding a batch's blocks to the graph gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fed {
    /// The records the blocks held.
    pub(crate) records: u64,
    /// The time the input's arrival stage spent on them before the batch
    /// began (zero without one).
    pub(crate) ahead: std::time::Duration,
}

/// A receiver input with its record type erased, as the driver drives it.
pub(crate) trait ReceiverInput: Send {
    /// The input's name in the graph.
    fn name(&self) -> &str;
    /// Its stream id.
    fn stream_id(&self) -> StreamId;
    /// Opens its block store and, with the WAL on, the receiver WAL (so
    /// recovered blocks can be read before the receiver starts).
    /// `checkpoint` is the checkpoint directory and the writer fence its
    /// WAL checks before every change.
    /// Its blocks draw on `memory`, the budget every input shares; those
    /// of an input whose reader gathers the whole batch spill beyond it to
    /// `spill`, within its budget.
    fn open(
        &mut self,
        checkpoint: Option<CheckpointHome<'_>>,
        clock: &Arc<dyn Clock>,
        memory: &Arc<MemoryBudget>,
        spill: SpillPlace<'_>,
    ) -> Result<(), RuntimeError>;
    /// Starts the receiver, reporting blocks to `tracker`.
    fn start(
        &mut self,
        tracker: Arc<ReceivedBlockTracker>,
        resume: ReceiverResume,
        clock: Arc<dyn Clock>,
    ) -> Result<(), RuntimeError>;
    /// Hands the records of `blocks` to the graph for batch `time`; returns
    /// how many records they held and the work done on them as they arrived.
    fn feed(&self, time: Time, blocks: &[TrackedBlock]) -> Result<Fed, RuntimeError>;
    /// Sets the backpressure rate limit.
    fn set_rate_limit(&self, records_per_sec: Option<u64>);
    /// Its status for progress reports.
    fn status(&self) -> ReceiverStatus;
    /// Drops stored blocks (and WAL segments) older than `threshold`.
    fn clean_old_blocks(&self, threshold: Time);
    /// Stops the receiver, pushing its last block.
    fn stop(&mut self) -> Result<(), RuntimeError>;
}

type HandlerAndLog<T> = (Arc<dyn ReceivedBlockHandler<T>>, Option<Arc<dyn WriteAheadLog>>);

type ReceiverFactory<R> = Box<dyn FnOnce(ReceiverResume) -> R + Send>;

struct Stores<T> {
    blocks: Arc<BlockManager<T>>,
    handler: Arc<dyn ReceivedBlockHandler<T>>,
    wal: Option<Arc<dyn WriteAheadLog>>,
}

/// A [`ReceiverInput`] for records of type `T` from receivers of type `R`.
pub(crate) struct TypedReceiverInput<T, R> {
    name: String,
    stream_id: StreamId,
    options: ReceiverSettings,
    source: Arc<FedSource<T>>,
    factory: Option<ReceiverFactory<R>>,
    stores: Option<Stores<T>>,
    supervisor: Option<ReceiverSupervisor<T>>,
    receiver_name: String,
    stopped: bool,
    /// The largest block, in bytes: a part of the shared memory budget, so
    /// no single block can be larger than the budget and never fit.
    max_block_bytes: u64,
    /// The largest block as records in memory, in bytes: what a reader
    /// that decodes a block (one a processor, as blocks arrive) holds of
    /// it at once, a part of the budget too.
    max_block_memory: u64,
    /// Blocks cut and waiting for the pusher, at most: they are encoded
    /// and outside the budget, so together at most an eighth of it.
    queue_capacity: usize,
    /// The input's first operator, run on each block as it arrives.
    arrivals: Option<Arc<Arrivals<T>>>,
    /// The thread running it, and how to tell it a block arrived (`None`: stop).
    arrival_threads: Option<ArrivalThreads>,
    /// Records and bytes fed to batches, for `/metrics`.
    input_records: metrics::Counter,
    input_bytes: metrics::Counter,
    /// Where blocks beyond the memory budget go, for an input whose
    /// reader gathers the whole batch; after `stores`, so it is removed
    /// once the block manager is closed.
    spill_area: Option<SpillArea>,
}

/// A folder of this process's own for an input's spilled blocks, removed
/// when the input goes. A crash leaves it behind (its name is random and
/// new, so no later run reuses it) to the system's cleaning of its
/// temporary folder, or to whoever looks after `--spill-dir`. Nothing
/// durable is in it: with the WAL on, the log holds the blocks.
struct SpillArea(PathBuf);

impl SpillArea {
    /// Makes a new spill area for stream `stream` in `base`: created there
    /// exclusively (never a directory someone else made first), owner-only
    /// (0700) from the start, under a random name no other user can guess
    /// and plant in a shared temporary folder beforehand.
    fn create(base: &Path, stream: StreamId) -> Result<Self, RuntimeError> {
        let prefix = format!("spate-spill-{}-", stream.0);
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700));
        let dir = builder.tempdir_in(base).map_err(|e| RuntimeError::io("create a spill area in", base, e))?;
        // Removed by this area's own drop, which says when it cannot.
        Ok(SpillArea(dir.keep()))
    }
}

impl Drop for SpillArea {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            warn!(dir = %self.0.display(), %error, "could not remove the spill area of received blocks");
        }
    }
}

impl<T: Record + Data, R: Receiver<T>> TypedReceiverInput<T, R> {
    pub(crate) fn new(
        name: &str,
        stream_id: StreamId,
        options: ReceiverSettings,
        source: Arc<FedSource<T>>,
        factory: ReceiverFactory<R>,
    ) -> Self {
        let labels = [("source", name.to_string()), ("partition", stream_id.0.to_string())];
        TypedReceiverInput {
            input_records: metrics::counter!(telemetry::INPUT_RECORDS, &labels),
            input_bytes: metrics::counter!(telemetry::INPUT_BYTES, &labels),
            name: name.to_string(),
            stream_id,
            options,
            source,
            factory: Some(factory),
            stores: None,
            supervisor: None,
            receiver_name: name.to_string(),
            stopped: false,
            max_block_bytes: DEFAULT_MAX_BLOCK_BYTES,
            max_block_memory: DEFAULT_MAX_BLOCK_MEMORY,
            queue_capacity: BlockGeneratorSettings::default().queue_capacity,
            arrivals: None,
            arrival_threads: None,
            spill_area: None,
        }
    }

    /// The threads sharing the work on arrived blocks: a batch's blocks
    /// were processed this many at a time, so the wall time of the work
    /// done on them ahead is their summed work divided by it.
    fn arrival_parallelism(&self) -> u32 {
        self.arrival_threads.as_ref().map_or(1, |t| u32::try_from(t.threads()).unwrap_or(u32::MAX).max(1))
    }

    fn receiver_error(&self, reason: impl ToString) -> RuntimeError {
        RuntimeError::Receiver { stream: self.name.clone(), reason: reason.to_string() }
    }

    fn open_handler(
        &self,
        blocks: &Arc<BlockManager<T>>,
        level: StorageLevel,
        checkpoint: Option<CheckpointHome<'_>>,
        clock: &Arc<dyn Clock>,
    ) -> Result<HandlerAndLog<T>, RuntimeError> {
        let (dir, fence) = match checkpoint {
            Some(home) if self.options.write_ahead_log => (home.dir, home.fence),
            _ => {
                if self.options.write_ahead_log {
                    warn!(input = %self.name, "receiver write-ahead log requested without a checkpoint directory: off");
                }
                let handler = BlockManagerBasedBlockHandler::new(Arc::clone(blocks), level);
                return Ok((Arc::new(handler), None));
            }
        };
        let wal_dir = receiver_wal_dir(dir, self.stream_id);
        let options = receiver_wal_options().with_clock(Arc::clone(clock)).with_fence(Arc::clone(fence));
        let wal: Arc<dyn WriteAheadLog> =
            Arc::new(FileWriteAheadLog::open(&wal_dir, options).map_err(|e| self.receiver_error(e))?);
        let handler = WriteAheadLogBasedBlockHandler::new(
            Arc::clone(blocks),
            Arc::clone(&wal),
            self.stream_id,
            level,
            WalHandlerSettings { fence: Arc::clone(fence), ..WalHandlerSettings::default() },
            Arc::clone(clock),
        )
        .map_err(|e| self.receiver_error(e))?;
        Ok((Arc::new(handler), Some(wal)))
    }

    /// `block` in the receiver WAL at `handle`, to be read when its turn comes.
    fn in_wal(&self, block: &TrackedBlock, handle: &WalRecordHandle) -> Result<TakenBlock<T>, RuntimeError> {
        let wal = self.stores.as_ref().and_then(|s| s.wal.as_ref()).ok_or_else(|| {
            self.receiver_error(format!("block {} is in the receiver WAL, which is not open", block.block_id()))
        })?;
        Ok(TakenBlock::InWal { wal: Arc::clone(wal), stream_id: self.stream_id, handle: handle.clone() })
    }

    /// Takes `block` out of its store: from memory as it is kept there, or
    /// where it is in the WAL; the records are read and decoded later, in
    /// parallel, a block at a time.
    fn take_block(&self, block: &TrackedBlock) -> Result<TakenBlock<T>, RuntimeError> {
        match block.location() {
            BlockLocation::BlockManager(id) => {
                // A block is read once: its batch is computed now, and a
                // restart reads it from the WAL, so the memory is freed at once.
                let in_memory = match &self.stores {
                    Some(stores) => {
                        let data = stores.blocks.get(id).map_err(|e| self.receiver_error(e))?;
                        stores.blocks.remove(id).map_err(|e| self.receiver_error(e))?;
                        data
                    }
                    None => None,
                };
                match (in_memory, block.info().wal_handle()) {
                    (Some(data), _) => Ok(TakenBlock::Stored(id, data)),
                    (None, Some(handle)) => self.in_wal(block, handle),
                    (None, None) => Err(self.receiver_error(format!("block {id} is no longer stored"))),
                }
            }
            BlockLocation::ReceiverWal(handle) => self.in_wal(block, handle),
            BlockLocation::Lost => Err(self.receiver_error(format!(
                "block {} was received before a restart without the write-ahead log; its records are lost",
                block.block_id()
            ))),
        }
    }

    /// Decodes `taken` into one partition per block, in block order, on up
    /// to one thread per core; each block's bytes are freed as soon as it is
    /// decoded, so a batch is never held both serialized and decoded.
    fn decode_blocks(&self, taken: Vec<TakenBlock<T>>) -> Result<Vec<Vec<T>>, RuntimeError> {
        self.per_block_in_parallel(taken, |block| block.decode().map_err(|e| e.to_string()))
    }

    /// `each` of every block of `taken`, in block order, on up to one thread
    /// per core; a thread finishes one block before it decodes the next.
    fn per_block_in_parallel<O: Send>(
        &self,
        taken: Vec<TakenBlock<T>>,
        each: impl Fn(TakenBlock<T>) -> Result<O, String> + Sync,
    ) -> Result<Vec<O>, RuntimeError> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from).min(taken.len());
        if threads <= 1 {
            return taken.into_iter().map(|block| each(block).map_err(|e| self.receiver_error(e))).collect();
        }
        let per_thread = taken.len().div_ceil(threads);
        let mut chunks = Vec::with_capacity(threads);
        let mut rest = taken;
        while !rest.is_empty() {
            let tail = rest.split_off(per_thread.min(rest.len()));
            chunks.push(rest);
            rest = tail;
        }
        let each = &each;
        let decoded = std::thread::scope(|scope| {
            let workers: Vec<_> = chunks
                .into_iter()
                .map(|chunk| {
                    std::thread::Builder::new()
                        .name(format!("decode-{}", self.stream_id.0))
                        .spawn_scoped(scope, move || chunk.into_iter().map(each).collect::<Vec<_>>())
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| match worker {
                    Ok(handle) => handle.join().map_err(|_| "a decoding thread panicked".to_string()),
                    Err(e) => Err(format!("could not start a decoding thread: {e}")),
                })
                .collect::<Vec<_>>()
        });
        let mut partitions = Vec::new();
        for chunk in decoded {
            for block in chunk.map_err(|e| self.receiver_error(e))? {
                partitions.push(block.map_err(|e| self.receiver_error(e))?);
            }
        }
        Ok(partitions)
    }
}

impl<T: Record + Data, R: Receiver<T>> TypedReceiverInput<T, R> {
    /// Hands batch `time` the results of its blocks' first operator: each
    /// block's as processed on arrival, or processed now (blocks that came
    /// in as the interval ended, or back from the WAL after a restart).
    fn feed_processed(&self, time: Time, blocks: &[TrackedBlock], arrivals: &Arrivals<T>) -> Result<Fed, RuntimeError> {
        let mut processed: Vec<Option<ProcessedBlock>> = Vec::with_capacity(blocks.len());
        let mut unprocessed = Vec::new();
        let (mut bytes, mut ahead) = (0, std::time::Duration::ZERO);
        let ids: Vec<StreamBlockId> = blocks.iter().map(TrackedBlock::block_id).collect();
        let found = arrivals.take_batch(&ids).map_err(|e| self.receiver_error(e))?;
        for (block, found) in blocks.iter().zip(found) {
            match found {
                Found::Processed(result) => {
                    let arrived = result.map_err(|e| self.receiver_error(e))?;
                    bytes += arrived.bytes_in;
                    ahead += arrived.work / self.arrival_parallelism();
                    processed.push(Some(arrived.block));
                }
                Found::Unprocessed => {
                    let taken = self.take_block(block)?;
                    bytes += taken.serialized_len();
                    unprocessed.push((processed.len(), taken));
                    processed.push(None);
                }
                // In the result of a block before it.
                Found::Merged => {}
            }
        }
        let (indices, taken): (Vec<usize>, Vec<TakenBlock<T>>) = unprocessed.into_iter().unzip();
        // Each block is decoded and processed before the next is decoded:
        // a batch of many blocks (a backlog, a restart) is never held decoded.
        let now = self.per_block_in_parallel(taken, |block| match block {
            TakenBlock::Stored(block_id, data) => arrivals.process_stored_data(block_id, data),
            in_wal @ TakenBlock::InWal { .. } => arrivals.process(in_wal.decode().map_err(|e| e.to_string())?),
        })?;
        for (index, block) in indices.into_iter().zip(now) {
            processed[index] = Some(block);
        }
        let processed: Vec<ProcessedBlock> = processed.into_iter().flatten().collect();
        let records = processed.iter().map(|block| block.records_in() as u64).sum();
        self.input_records.increment(records);
        self.input_bytes.increment(bytes);
        arrivals.stage().deliver(time, processed);
        Ok(Fed { records, ahead })
    }
}

/// A block taken out of its store for a batch.
enum TakenBlock<T> {
    /// As the block manager kept it (records or serialized bytes).
    Stored(StreamBlockId, BlockData<T>),
    /// In the receiver WAL: read and decoded on the thread that processes
    /// it, so a batch read back after a restart (or a backlog) is decoded
    /// in parallel and never held decoded whole.
    InWal { wal: Arc<dyn WriteAheadLog>, stream_id: StreamId, handle: WalRecordHandle },
}

impl<T> TakenBlock<T> {
    /// The block's serialized size: its bytes, or its frame in the WAL;
    /// 0 for a block kept as records (the write-ahead log off).
    fn serialized_len(&self) -> u64 {
        match self {
            TakenBlock::Stored(_, BlockData::Bytes(bytes)) => bytes.len() as u64,
            TakenBlock::Stored(_, BlockData::Records(_)) => 0,
            TakenBlock::InWal { handle, .. } => u64::from(handle.length),
        }
    }
}

impl<T: Record> TakenBlock<T> {
    /// The block's records; the serialized bytes are dropped here.
    fn decode(self) -> Result<Vec<T>, ReceiverError> {
        match self {
            TakenBlock::Stored(block_id, data) => {
                let records =
                    data.records().map_err(|source| ReceiverError::Codec { block_id: Some(block_id), source })?;
                drop(data);
                Ok(Arc::try_unwrap(records).unwrap_or_else(|shared| (*shared).clone()))
            }
            TakenBlock::InWal { wal, stream_id, handle } => read_block_from_wal(wal.as_ref(), stream_id, &handle),
        }
    }
}

impl<T: Record + Data, R: Receiver<T>> ReceiverInput for TypedReceiverInput<T, R> {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream_id(&self) -> StreamId {
        self.stream_id
    }

    fn open(
        &mut self,
        checkpoint: Option<CheckpointHome<'_>>,
        clock: &Arc<dyn Clock>,
        memory: &Arc<MemoryBudget>,
        spill: SpillPlace<'_>,
    ) -> Result<(), RuntimeError> {
        let mut config = BlockManagerSettings::in_memory(memory.limit()).with_shared_budget(Arc::clone(memory));
        // An eighth: a block's size in memory may be several times its
        // serialized size, which is what the cap estimates.
        self.max_block_bytes = DEFAULT_MAX_BLOCK_BYTES.min(memory.limit() / 8).max(1);
        // Decoded, a block of short strings is ten times its encoded size
        // (a 24-byte string and a 32-byte allocation for a 6-byte word).
        // A stage that takes blocks in chunks holds one chunk decoded, but
        // one that needs the block whole holds it all: a quarter at most.
        self.max_block_memory = DEFAULT_MAX_BLOCK_MEMORY.min(memory.limit() / 4).max(1);
        // Two blocks queued at least, so that one is cut while another waits.
        let queued = usize::try_from(memory.limit() / 8 / self.max_block_bytes).unwrap_or(usize::MAX);
        self.queue_capacity = queued.clamp(2, BlockGeneratorSettings::default().queue_capacity);
        self.arrivals = self.source.arrival_stage().map(|stage| Arrivals::new(stage, Arc::clone(memory)));
        // Blocks processed as they arrive leave the store at once; the
        // budget slows the receiver when processing falls behind. Blocks
        // that wait for a whole-batch reader stay encoded and spill.
        // Without the disk store (a build without the feature) they are
        // held back by the budget like the others.
        let level = if self.arrivals.is_some() || !cfg!(feature = "disk-store") {
            // Memory only: with the WAL on, the log is the durable copy;
            // without it, a restart loses unprocessed blocks whatever the
            // level. Serialized either way: records are encoded as they are
            // stored and a block holds a few bytes a record, which is what
            // the budget counts, instead of a record each (a `String` and
            // its allocation); blocks written in place are read in place.
            StorageLevel::MEMORY_ONLY_SER
        } else {
            let area = SpillArea::create(spill.base, self.stream_id)?;
            config.disk_dir = Some(area.0.clone());
            config.spill_budget = Some(Arc::clone(spill.budget));
            self.spill_area = Some(area);
            StorageLevel::MEMORY_AND_DISK_SER
        };
        let blocks = Arc::new(BlockManager::open(config, Arc::clone(clock)).map_err(|e| self.receiver_error(e))?);
        let (handler, wal) = self.open_handler(&blocks, level, checkpoint, clock)?;
        self.stores = Some(Stores { blocks, handler, wal });
        Ok(())
    }

    fn start(
        &mut self,
        tracker: Arc<ReceivedBlockTracker>,
        resume: ReceiverResume,
        clock: Arc<dyn Clock>,
    ) -> Result<(), RuntimeError> {
        let (Some(factory), Some(stores)) = (self.factory.take(), self.stores.as_ref()) else {
            return Err(RuntimeError::Lifecycle {
                what: format!("receiver input {} started twice or before it was opened", self.name),
            });
        };
        let handler = Arc::clone(&stores.handler);
        let receiver = factory(resume);
        self.receiver_name = receiver.name();
        if let Some(arrivals) = &self.arrivals {
            let name = format!("arrive-{}", self.stream_id.0);
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let (tracker, stream) = (Arc::clone(&tracker), self.stream_id);
            let neighbours: Arc<Neighbours> = Arc::new(move |block| tracker.unallocated_neighbours(stream, block));
            let started = arrivals.spawn(&name, threads, &stores.blocks, neighbours).map_err(|e| {
                self.receiver_error(format!("could not start the threads processing arrived blocks: {e}"))
            })?;
            self.arrival_threads = Some(started);
        }
        let arrivals = self.arrivals.clone();
        let arrived = self.arrival_threads.as_ref().map(ArrivalThreads::sender);
        let sink: Arc<dyn BlockInfoSink> = Arc::new(FnSink(move |info: spate_core::ReceivedBlockInfo| {
            let block_id = info.block_id();
            // Known before the tracker can allocate it, so its batch finds it.
            if let Some(arrivals) = &arrivals {
                arrivals.expect(block_id);
            }
            // The tracker's own error says why (a fenced or poisoned event log), so pass it on.
            let added = tracker.try_add_block(info);
            match (&added, &arrivals, &arrived) {
                (Ok(()), _, Some(arrived)) => {
                    let _ = arrived.send(Some(block_id));
                }
                (Err(_), Some(arrivals), _) => arrivals.forget(block_id),
                _ => {}
            }
            added.map_err(|e| e.into())
        }));
        let mut config = SupervisorSettings::new(self.stream_id);
        config.block_generator = BlockGeneratorSettings {
            block_interval: self.options.block_interval,
            max_rate: self.options.max_rate,
            max_block_records: self.options.max_block_records,
            max_block_bytes: Some(self.max_block_bytes),
            max_block_memory: Some(self.max_block_memory),
            queue_capacity: self.queue_capacity,
            ..BlockGeneratorSettings::default()
        };
        let supervisor =
            ReceiverSupervisor::start(receiver, config, handler, sink, clock).map_err(|e| self.receiver_error(e))?;
        self.supervisor = Some(supervisor);
        Ok(())
    }

    fn feed(&self, time: Time, blocks: &[TrackedBlock]) -> Result<Fed, RuntimeError> {
        if let Some(arrivals) = &self.arrivals {
            return self.feed_processed(time, blocks, arrivals);
        }
        let taken = blocks.iter().map(|block| self.take_block(block)).collect::<Result<Vec<_>, _>>()?;
        let bytes: u64 = taken.iter().map(TakenBlock::serialized_len).sum();
        let partitions = self.decode_blocks(taken)?;
        let records = partitions.iter().map(|p| p.len() as u64).sum();
        self.input_records.increment(records);
        self.input_bytes.increment(bytes);
        self.source.feed(time, partitions);
        Ok(Fed { records, ahead: std::time::Duration::ZERO })
    }

    fn set_rate_limit(&self, records_per_sec: Option<u64>) {
        if let Some(supervisor) = &self.supervisor {
            supervisor.set_rate_limit(records_per_sec);
        }
    }

    fn status(&self) -> ReceiverStatus {
        let (active, rate_limit, last_error) = match &self.supervisor {
            Some(supervisor) => (
                matches!(supervisor.state(), ReceiverState::Running | ReceiverState::BackingOff { .. }),
                supervisor.rate_limit().map(|r| r as f64),
                supervisor.errors().pop(),
            ),
            None => (false, None, None),
        };
        ReceiverStatus { stream_id: self.stream_id.0, name: self.receiver_name.clone(), active, rate_limit, last_error }
    }

    fn clean_old_blocks(&self, threshold: Time) {
        if let Some(stores) = &self.stores
            && let Err(e) = stores.handler.clean_old_blocks(threshold)
        {
            warn!(input = %self.name, error = %e, "cleaning old received blocks failed; retried after the next batch");
        }
    }

    fn stop(&mut self) -> Result<(), RuntimeError> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        let stopped = match self.supervisor.take() {
            Some(supervisor) => supervisor.stop().map_err(|e| self.receiver_error(e)),
            // Never started: the handler (and its WAL) is still ours to close.
            None => match &self.stores {
                Some(stores) => stores.handler.close().map_err(|e| self.receiver_error(e)),
                None => Ok(()),
            },
        };
        // The receiver pushed its last block: the threads finish the
        // blocks sent to them before they end.
        if let Some(threads) = self.arrival_threads.take()
            && !threads.stop()
        {
            warn!(input = %self.name, "a thread processing arrived blocks panicked");
        }
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spill_area_is_a_new_owner_only_directory_under_a_name_no_one_can_guess() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let one = SpillArea::create(base.path(), StreamId(3)).unwrap();
        let other = SpillArea::create(base.path(), StreamId(3)).unwrap();
        assert_ne!(one.0, other.0);
        for area in [&one, &other] {
            let meta = std::fs::symlink_metadata(&area.0).expect("the area is made, not only named");
            assert!(meta.is_dir(), "{}", area.0.display());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{}", area.0.display());
            let name = area.0.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with("spate-spill-3-"), "{name}");
            assert!(!name.contains(&std::process::id().to_string()), "{name} carries the process id");
        }
        let path = one.0.clone();
        drop(one);
        assert!(!path.exists(), "the area goes with its input");
    }
}
