//! Received-block handlers: how a receiver's block is stored, and what the
//! store result says (Spark's `ReceivedBlockHandler`).
//!
//! [`BlockManagerBasedBlockHandler`] keeps the block in the
//! [`BlockManager`] only. [`WriteAheadLogBasedBlockHandler`] serializes the
//! block once, then writes it to the block manager and to the receiver
//! write-ahead log at the same time, and returns only when both are done:
//! the block survives a crash, and the store result carries its WAL handle.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver, Sender, TryRecvError, bounded, unbounded};
use spate_core::sync::lock;
use spate_core::{
    BlockStoreResult, Clock, FrameCodec, StreamBlockId, StreamId, Time, Unfenced, WalRecordHandle, WriterFence,
};
use spate_wal::{FileWriteAheadLog, WalError, WalSettings, WriteAheadLog};
use tracing::{debug, warn};

use crate::block::{BlockData, ReceivedBlock, count_block_records, decode_block, encode_block};
use crate::block_manager::BlockManager;
use crate::codec::Record;
use crate::error::ReceiverError;
use crate::storage::StorageLevel;

/// Work in progress whose result [`Pending::wait`] returns: a block being
/// stored, so that the next block can be serialized meanwhile.
pub struct Pending<R> {
    finish: Box<dyn FnOnce() -> Result<R, ReceiverError> + Send>,
    /// Disconnected once `finish` would return at once.
    done: Option<Receiver<()>>,
}

impl<R: Send + 'static> Pending<R> {
    /// Work that finishes with `finish`; whether it is done is unknown
    /// until then.
    pub fn new(finish: impl FnOnce() -> Result<R, ReceiverError> + Send + 'static) -> Self {
        Pending { finish: Box::new(finish), done: None }
    }

    /// Work that finishes with `finish`, done (`finish` returns at once)
    /// when every sender of `done` is dropped: a waiter can select on it.
    pub fn with_done_signal(
        finish: impl FnOnce() -> Result<R, ReceiverError> + Send + 'static,
        done: Receiver<()>,
    ) -> Self {
        Pending { finish: Box::new(finish), done: Some(done) }
    }

    /// Work already done.
    pub fn ready(result: Result<R, ReceiverError>) -> Self {
        let (_, done) = bounded(0);
        Pending::with_done_signal(move || result, done)
    }

    /// Whether the work is done (so [`Pending::wait`] returns at once);
    /// `None` when this work cannot tell.
    pub fn is_done(&self) -> Option<bool> {
        self.done.as_ref().map(|done| matches!(done.try_recv(), Err(TryRecvError::Disconnected)))
    }

    /// A channel that disconnects when the work is done, to select on;
    /// `None` when this work cannot tell.
    pub fn done_signal(&self) -> Option<&Receiver<()>> {
        self.done.as_ref()
    }

    /// This work followed by `next`, which gets its result; done when this work is.
    pub fn then<S: Send + 'static>(
        self,
        next: impl FnOnce(Result<R, ReceiverError>) -> Result<S, ReceiverError> + Send + 'static,
    ) -> Pending<S> {
        let Pending { finish, done } = self;
        Pending { finish: Box::new(move || next(finish())), done }
    }

    /// Waits until the work is done and returns its result.
    pub fn wait(self) -> Result<R, ReceiverError> {
        (self.finish)()
    }
}

impl<R> std::fmt::Debug for Pending<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// Stores received blocks; shared by the receiver's pushing thread and the
/// runtime's cleanup.
pub trait ReceivedBlockHandler<T>: Send + Sync {
    /// Stores the block and returns once it is stored (durably, for a WAL handler).
    fn store_block(&self, block_id: StreamBlockId, block: ReceivedBlock<T>) -> Result<BlockStoreResult, ReceiverError>;

    /// Starts storing the block; the block is stored once the result's
    /// [`Pending::wait`] returned `Ok`. Blocks started in order finish in
    /// order. By default the block is stored before this returns.
    fn start_store(&self, block_id: StreamBlockId, block: ReceivedBlock<T>) -> Pending<BlockStoreResult> {
        Pending::ready(self.store_block(block_id, block))
    }

    /// Starts storing a block of records, as [`ReceivedBlockHandler::start_store`]
    /// does, and gives their buffer back, emptied, when what is stored does
    /// not keep it (a serialized level): a block generator fills it again
    /// instead of allocating a new one, whose every page would fault in.
    /// By default the buffer is not given back.
    fn start_store_records(
        &self,
        block_id: StreamBlockId,
        records: Vec<T>,
    ) -> (Pending<BlockStoreResult>, Option<Vec<T>>) {
        (self.start_store(block_id, ReceivedBlock::Records(records)), None)
    }

    /// Removes the blocks (and WAL segments) stored before `threshold`.
    fn clean_old_blocks(&self, threshold: Time) -> Result<(), ReceiverError>;

    /// The level blocks are stored at.
    fn storage_level(&self) -> StorageLevel;

    /// Releases what the handler holds (closes its log, joins its threads).
    fn close(&self) -> Result<(), ReceiverError> {
        Ok(())
    }
}

/// The directory of a stream's receiver WAL in a checkpoint:
/// `<checkpoint>/receivedData/<stream>/`.
pub fn receiver_wal_dir(checkpoint_dir: &Path, stream_id: StreamId) -> PathBuf {
    checkpoint_dir.join("receivedData").join(stream_id.to_string())
}

/// Files of cleaned segments a receiver WAL keeps to start new segments in
/// ([`WalSettings::recycled_segments`]): a receiver's segments are cleaned
/// one or two at a time, once their batches are done.
pub const RECEIVER_WAL_SPARES: usize = 2;

/// The options a receiver WAL is opened with. Received blocks are large:
/// direct I/O saves the page cache's copy and writeback, and recycled
/// segment files are rewritten in place rather than allocated anew.
pub fn receiver_wal_options() -> WalSettings {
    WalSettings::default().with_direct_io(true).with_recycled_segments(RECEIVER_WAL_SPARES)
}

/// Opens (creating when missing) the receiver WAL of `stream_id` under
/// `checkpoint_dir`, at [`receiver_wal_dir`], repairing a torn tail.
pub fn open_receiver_wal(
    checkpoint_dir: &Path,
    stream_id: StreamId,
    options: WalSettings,
) -> Result<Arc<FileWriteAheadLog>, ReceiverError> {
    let dir = receiver_wal_dir(checkpoint_dir, stream_id);
    let wal = FileWriteAheadLog::open(&dir, options).map_err(|source| ReceiverError::Wal { stream_id, source })?;
    Ok(Arc::new(wal))
}

/// Reads a block back from a receiver WAL by its handle (after a restart,
/// when the block manager's copy is gone).
pub fn read_block_from_wal<T: Record>(
    wal: &dyn WriteAheadLog,
    stream_id: StreamId,
    handle: &WalRecordHandle,
) -> Result<Vec<T>, ReceiverError> {
    let bytes = wal.read(handle).map_err(|source| ReceiverError::Wal { stream_id, source })?;
    decode_block(&bytes).map_err(|source| ReceiverError::WalRecordNotABlock { handle: handle.clone(), source })
}

/// Splits a block into its shared bytes-or-records form and record count.
fn into_data<T: Record>(
    block_id: StreamBlockId,
    block: ReceivedBlock<T>,
) -> Result<(BlockData<T>, u64), ReceiverError> {
    match block {
        ReceivedBlock::Records(records) => {
            let n = records.len() as u64;
            Ok((BlockData::Records(Arc::new(records)), n))
        }
        ReceivedBlock::Serialized(bytes) => {
            let n = count_block_records(&bytes)
                .map_err(|source| ReceiverError::Codec { block_id: Some(block_id), source })?;
            Ok((BlockData::Bytes(Arc::new(bytes)), n))
        }
    }
}

/// Longest real-time wait for the WAL writer's answer before the clock is
/// read again: the store timeout runs on the handler's [`Clock`].
const TIMEOUT_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Waits for the WAL writer's answer about `block_id` (of `num_records`
/// records) until `deadline` on `clock` (`timeout` after it was submitted).
fn await_wal(
    block: (StreamId, StreamBlockId, u64),
    reply: &Receiver<WalReply>,
    clock: &dyn Clock,
    mut deadline: Time,
    timeout: std::time::Duration,
    fence: &dyn WriterFence,
) -> Result<WalRecordHandle, ReceiverError> {
    let (stream_id, block_id, num_records) = block;
    loop {
        match reply.recv_timeout(TIMEOUT_POLL) {
            Ok(written) => return written.map_err(|source| wal_error(stream_id, block_id, num_records, source)),
            Err(crossbeam::channel::RecvTimeoutError::Timeout) if clock.now() < deadline => {}
            // Paused for the lease: the timeout starts again once writes go on.
            Err(crossbeam::channel::RecvTimeoutError::Timeout) if fence.is_paused() => {
                deadline = deadline_after(clock.now(), timeout);
            }
            Err(crossbeam::channel::RecvTimeoutError::Timeout) => {
                return Err(ReceiverError::WalTimeout {
                    block_id,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            Err(crossbeam::channel::RecvTimeoutError::Disconnected) => {
                return Err(ReceiverError::Runtime {
                    what: format!("receiver WAL writer {stream_id}"),
                    reason: "ended without an answer".into(),
                });
            }
        }
    }
}

/// `start` plus `timeout`, saturating.
fn deadline_after(start: Time, timeout: std::time::Duration) -> Time {
    let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    Time::from_millis(start.as_millis().saturating_add(ms))
}

/// The error of a failed WAL write of a block: a block larger than the
/// log's largest record says what to change.
fn wal_error(stream_id: StreamId, block_id: StreamBlockId, num_records: u64, source: WalError) -> ReceiverError {
    match source {
        WalError::RecordTooLarge { len, max } if num_records <= 1 => {
            ReceiverError::RecordTooLargeForWal { block_id, bytes: len, max }
        }
        WalError::RecordTooLarge { len, max } => {
            ReceiverError::BlockTooLargeForWal { block_id, records: num_records, bytes: len, max }
        }
        source => ReceiverError::Wal { stream_id, source },
    }
}

/// Stores blocks in the block manager only (the WAL is off).
#[derive(Debug)]
pub struct BlockManagerBasedBlockHandler<T> {
    block_manager: Arc<BlockManager<T>>,
    level: StorageLevel,
}

impl<T: Record> BlockManagerBasedBlockHandler<T> {
    /// A handler storing into `block_manager` at `level`.
    pub fn new(block_manager: Arc<BlockManager<T>>, level: StorageLevel) -> Self {
        BlockManagerBasedBlockHandler { block_manager, level }
    }
}

impl<T: Record> ReceivedBlockHandler<T> for BlockManagerBasedBlockHandler<T> {
    fn store_block(&self, block_id: StreamBlockId, block: ReceivedBlock<T>) -> Result<BlockStoreResult, ReceiverError> {
        let (data, num_records) = into_data(block_id, block)?;
        self.block_manager.put(block_id, data, self.level)?;
        Ok(BlockStoreResult { block_id, num_records: Some(num_records), wal_handle: None })
    }

    fn start_store_records(
        &self,
        block_id: StreamBlockId,
        mut records: Vec<T>,
    ) -> (Pending<BlockStoreResult>, Option<Vec<T>>) {
        if self.level.deserialized() {
            return (Pending::ready(self.store_block(block_id, ReceivedBlock::Records(records))), None);
        }
        let num_records = records.len() as u64;
        let stored = encode_block(&records)
            .map_err(|source| ReceiverError::Codec { block_id: Some(block_id), source })
            .and_then(|bytes| self.block_manager.put(block_id, BlockData::Bytes(Arc::new(bytes)), self.level))
            .map(|_| BlockStoreResult { block_id, num_records: Some(num_records), wal_handle: None });
        records.clear();
        (Pending::ready(stored), Some(records))
    }

    fn clean_old_blocks(&self, threshold: Time) -> Result<(), ReceiverError> {
        self.block_manager.remove_older_than(threshold).map(drop)
    }

    fn storage_level(&self) -> StorageLevel {
        self.level
    }
}

/// How a [`WriteAheadLogBasedBlockHandler`] waits and cleans.
#[derive(Clone, Debug)]
pub struct WalHandlerSettings {
    /// How long storing a block waits for both stores, on the handler's
    /// clock, from when the block was handed to the WAL (Spark's
    /// `spark.streaming.receiver.blockStoreTimeout`, 30 s).
    pub store_timeout: std::time::Duration,
    /// Whether cleaning waits until old segments are deleted.
    pub wait_for_cleanup: bool,
    /// The WAL's writer fence. While it says writes are paused (the
    /// checkpoint's lease waits to be renewed in an object store that is
    /// away) the store timeout does not run: the write ends in the block
    /// stored or refused once the store is back, and a block failed for
    /// the wait alone would be a block the receiver has to send again.
    pub fence: Arc<dyn WriterFence>,
}

impl Default for WalHandlerSettings {
    fn default() -> Self {
        WalHandlerSettings {
            store_timeout: std::time::Duration::from_secs(30),
            wait_for_cleanup: false,
            fence: Arc::new(Unfenced),
        }
    }
}

type WalReply = Result<WalRecordHandle, WalError>;
/// A block's bytes, their CRC32C when known, the time, where to answer,
/// and a sender whose drop says the answer was given (also when the
/// writer dies before it could answer).
type WalJob = (Arc<Vec<u8>>, Option<u32>, Time, Sender<WalReply>, Sender<()>);

/// Threads writing a stream's blocks to its WAL: one per block the pusher
/// keeps in flight, so that blocks are appended while earlier ones'
/// `fdatasync`s run (the log lets a commit append while the last one
/// syncs): the disk and the copy into the page cache overlap instead of
/// taking turns.
const WAL_WRITERS: usize = crate::block_generator::MAX_IN_FLIGHT;

/// The queue of blocks to write and the threads writing them.
struct WalWriters {
    jobs: Sender<WalJob>,
    threads: Vec<JoinHandle<()>>,
}

/// Stores blocks in the block manager and in the receiver WAL at once.
pub struct WriteAheadLogBasedBlockHandler<T> {
    block_manager: Arc<BlockManager<T>>,
    wal: Arc<dyn WriteAheadLog>,
    stream_id: StreamId,
    level: StorageLevel,
    config: WalHandlerSettings,
    clock: Arc<dyn Clock>,
    /// Taken on close: the WAL writer thread ends when it is dropped.
    writer: Mutex<Option<WalWriters>>,
}

impl<T> std::fmt::Debug for WriteAheadLogBasedBlockHandler<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteAheadLogBasedBlockHandler")
            .field("stream_id", &self.stream_id)
            .field("level", &self.level)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<T: Record> WriteAheadLogBasedBlockHandler<T> {
    /// A handler writing to `block_manager` and `wal` (the stream's log,
    /// usually opened at [`receiver_wal_dir`]). `level` is adjusted as Spark
    /// does ([`StorageLevel::for_write_ahead_log`]), with one warning.
    pub fn new(
        block_manager: Arc<BlockManager<T>>,
        wal: Arc<dyn WriteAheadLog>,
        stream_id: StreamId,
        level: StorageLevel,
        config: WalHandlerSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ReceiverError> {
        let adjusted = level.for_write_ahead_log();
        if adjusted != level {
            warn!(
                stream = %stream_id, requested = %level, using = %adjusted,
                "the write-ahead log is on: it is the durable copy, so blocks are not replicated, and they are \
                 serialized once for both stores, so they are kept serialized"
            );
        }
        let (tx, rx) = unbounded::<WalJob>();
        let threads = (0..WAL_WRITERS)
            .map(|index| {
                let (jobs, wal) = (rx.clone(), Arc::clone(&wal));
                std::thread::Builder::new()
                    .name(format!("receiver-wal-{stream_id}-{index}"))
                    .spawn(move || {
                        for (bytes, crc32c, time, reply, _answered) in jobs.iter() {
                            let written = match crc32c {
                                Some(crc32c) => wal.write_shared_with_crc32c(bytes, crc32c, time),
                                None => wal.write_shared(bytes, time),
                            };
                            // The caller may have timed out and gone; nothing to tell then.
                            let _ = reply.send(written);
                        }
                    })
                    .map_err(|e| ReceiverError::Runtime {
                        what: format!("receiver WAL writer {stream_id}"),
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(WriteAheadLogBasedBlockHandler {
            block_manager,
            wal,
            stream_id,
            level: adjusted,
            config,
            clock,
            writer: Mutex::new(Some(WalWriters { jobs: tx, threads })),
        })
    }

    /// Reads a block back from this handler's WAL by its handle.
    pub fn read_block(&self, handle: &WalRecordHandle) -> Result<Vec<T>, ReceiverError> {
        read_block_from_wal(self.wal.as_ref(), self.stream_id, handle)
    }

    /// Queues the block for a WAL writer; returns where it will answer and
    /// a channel that disconnects once it has.
    fn submit(
        &self,
        block_id: StreamBlockId,
        bytes: Arc<Vec<u8>>,
    ) -> Result<(Receiver<WalReply>, Receiver<()>), ReceiverError> {
        let (reply_tx, reply_rx) = bounded(1);
        let (answered_tx, answered_rx) = bounded(0);
        let writer = lock(&self.writer);
        let closed = || ReceiverError::Stopped { stream_id: block_id.stream_id, what: "storing a block" };
        let writers = writer.as_ref().ok_or_else(closed)?;
        // The block's own frame checksum gives the log its record checksum
        // without another pass over the bytes (the frame was just encoded,
        // or its checksum verified when its records were counted).
        let crc32c = FrameCodec::whole_frame_crc32c(&bytes);
        writers.jobs.send((bytes, crc32c, self.clock.now(), reply_tx, answered_tx)).map_err(|_| closed())?;
        Ok((reply_rx, answered_rx))
    }

    /// Hands a serialized block to the WAL writer and puts it in the block
    /// manager; the result waits for the WAL.
    fn store_bytes(&self, block_id: StreamBlockId, bytes: Vec<u8>, num_records: u64) -> Pending<BlockStoreResult> {
        let bytes = Arc::new(bytes);
        let deadline = deadline_after(self.clock.now(), self.config.store_timeout);
        let (reply, answered) = match self.submit(block_id, Arc::clone(&bytes)) {
            Ok(submitted) => submitted,
            Err(e) => return Pending::ready(Err(e)),
        };
        let put = self.block_manager.put(block_id, BlockData::Bytes(bytes), self.level);
        let (block_manager, stream_id, timeout) =
            (Arc::clone(&self.block_manager), self.stream_id, self.config.store_timeout);
        let (clock, fence) = (Arc::clone(&self.clock), Arc::clone(&self.config.fence));
        let finish = move || {
            let block = (stream_id, block_id, num_records);
            let written = await_wal(block, &reply, clock.as_ref(), deadline, timeout, fence.as_ref());
            match (put, written) {
                (Ok(_), Ok(handle)) => {
                    debug!(block = %block_id, %handle, records = num_records, "block stored with the WAL");
                    Ok(BlockStoreResult { block_id, num_records: Some(num_records), wal_handle: Some(handle) })
                }
                (put, written) => {
                    if put.is_ok() {
                        // Not reported, so never read: do not keep it.
                        let _ = block_manager.remove(block_id);
                    }
                    Err(put.err().or(written.err()).unwrap_or(ReceiverError::Runtime {
                        what: format!("storing block {block_id}"),
                        reason: "failed without an error".into(),
                    }))
                }
            }
        };
        Pending::with_done_signal(finish, answered)
    }
}

impl<T: Record> ReceivedBlockHandler<T> for WriteAheadLogBasedBlockHandler<T> {
    fn store_block(&self, block_id: StreamBlockId, block: ReceivedBlock<T>) -> Result<BlockStoreResult, ReceiverError> {
        self.start_store(block_id, block).wait()
    }

    /// Serializes the block, hands the bytes to the WAL writer and puts them
    /// in the block manager; waiting on the result waits for the WAL.
    fn start_store(&self, block_id: StreamBlockId, block: ReceivedBlock<T>) -> Pending<BlockStoreResult> {
        match block {
            // The buffer is freed here, while the WAL writes and syncs.
            ReceivedBlock::Records(records) => self.start_store_records(block_id, records).0,
            ReceivedBlock::Serialized(bytes) => match count_block_records(&bytes) {
                Ok(num_records) => self.store_bytes(block_id, bytes, num_records),
                Err(source) => Pending::ready(Err(ReceiverError::Codec { block_id: Some(block_id), source })),
            },
        }
    }

    fn start_store_records(
        &self,
        block_id: StreamBlockId,
        mut records: Vec<T>,
    ) -> (Pending<BlockStoreResult>, Option<Vec<T>>) {
        // Serialized once; the same bytes go to both stores.
        let pending = match encode_block(&records) {
            Ok(bytes) => self.store_bytes(block_id, bytes, records.len() as u64),
            Err(source) => Pending::ready(Err(ReceiverError::Codec { block_id: Some(block_id), source })),
        };
        // Emptying the buffer (dropping records that own memory) overlaps
        // with the WAL's write and sync.
        records.clear();
        (pending, Some(records))
    }

    fn clean_old_blocks(&self, threshold: Time) -> Result<(), ReceiverError> {
        self.block_manager.remove_older_than(threshold)?;
        self.wal
            .clean(threshold, self.config.wait_for_cleanup)
            .map_err(|source| ReceiverError::Wal { stream_id: self.stream_id, source })
    }

    fn storage_level(&self) -> StorageLevel {
        self.level
    }

    fn close(&self) -> Result<(), ReceiverError> {
        let writer = lock(&self.writer).take();
        if let Some(WalWriters { jobs, threads }) = writer {
            drop(jobs);
            let panicked = threads.into_iter().map(JoinHandle::join).filter(Result::is_err).count();
            if panicked > 0 {
                return Err(ReceiverError::Runtime {
                    what: format!("receiver WAL writer {}", self.stream_id),
                    reason: "thread panicked".into(),
                });
            }
            self.wal.close().map_err(|source| ReceiverError::Wal { stream_id: self.stream_id, source })?;
        }
        Ok(())
    }
}
