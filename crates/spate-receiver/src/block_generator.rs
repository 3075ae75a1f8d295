//! The block generator: buffers the records a receiver stores and cuts them
//! into a block every block interval, then pushes the blocks, in order, from
//! a bounded queue (Spark's `BlockGenerator`).
//!
//! Two threads: a timer that cuts blocks on the [`Clock`], and a pusher that
//! hands each block to a [`BlockGeneratorListener`]. When the pusher is
//! slow the queue fills, cutting blocks waits, and so does the receiver
//! adding records: memory stays bounded by the queue and the rate limit.
//!
//! A block is also cut early when it reaches a cap of records, of bytes or
//! of memory (by default [`DEFAULT_MAX_BLOCK_RECORDS`],
//! [`DEFAULT_MAX_BLOCK_BYTES`], well under the receiver WAL's largest
//! record, and [`DEFAULT_MAX_BLOCK_MEMORY`]), so one interval of a fast
//! source cannot make a block that memory or the WAL cannot take, nor one
//! whose records, decoded by a reader, take more than the memory cap.
//!
//! When the listener stores blocks serialized (the write-ahead log on, or
//! a serialized storage level), records stored as they are (`add_record`,
//! `add_records`, `add_with`) are encoded into the block as they are
//! added and dropped at once: the block being filled and the blocks
//! queued hold a few bytes a record, not each record's allocations.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver, Sender};
use spate_core::sync::lock;
use spate_core::{Clock, Duration, InPlace, StreamBlockId, StreamId, Time};
use tracing::{debug, warn};

use crate::block::{
    decode_block, encoded_record_size, estimate_encoded_size, estimate_records_size, frame_encoded_records,
};
use crate::codec::Record;
use crate::error::ReceiverError;
use crate::handler::Pending;
use crate::rate_limiter::RateLimiter;
use crate::signal::StopSignal;

/// How a [`BlockGenerator`] cuts and queues blocks.
#[derive(Clone, Debug)]
pub struct BlockGeneratorSettings {
    /// A block is cut every interval (Spark's `spark.streaming.blockInterval`).
    pub block_interval: Duration,
    /// Blocks cut but not yet pushed, at most (Spark's `blockQueueSize`).
    pub queue_capacity: usize,
    /// Cuts a block early when the buffer holds this many records, so one
    /// interval of a fast source cannot grow a block without bound.
    /// `None`: [`DEFAULT_MAX_BLOCK_RECORDS`]. Raise it for larger blocks.
    pub max_block_records: Option<usize>,
    /// Cuts a block early before its records' serialized size would pass
    /// this many bytes (estimated from samples of the records), so a block
    /// stays under the receiver WAL's largest record
    /// ([`spate_wal::WalSettings::max_record_size`], 64 MiB by default).
    /// `None`: [`DEFAULT_MAX_BLOCK_BYTES`]. Raising it past the WAL's
    /// limit needs that limit raised too. One record larger than the cap
    /// still makes a block of its own.
    pub max_block_bytes: Option<u64>,
    /// Cuts a block early before its records, as records in memory
    /// (inline size and heap, [`crate::Record::heap_bytes`], estimated from
    /// samples), would pass this many bytes: what a reader that decodes
    /// the block holds at once. `None`: [`DEFAULT_MAX_BLOCK_MEMORY`]. Not
    /// applied to records added in place, which a reader reads in place.
    pub max_block_memory: Option<u64>,
    /// The highest rate, records per second, the receiver may store at;
    /// backpressure may set lower rates (Spark's `receiver.maxRate`).
    pub max_rate: Option<u64>,
    /// The rate to start at, below the maximum, until backpressure sets one
    /// (Spark's `backpressure.initialRate`); `None`: start at the maximum.
    pub initial_rate: Option<u64>,
}

impl Default for BlockGeneratorSettings {
    fn default() -> Self {
        BlockGeneratorSettings {
            block_interval: Duration::from_millis(200),
            queue_capacity: 10,
            max_block_records: None,
            max_block_bytes: None,
            max_block_memory: None,
            max_rate: None,
            initial_rate: None,
        }
    }
}

/// The records a block holds at most unless
/// [`BlockGeneratorSettings::max_block_records`] says otherwise.
pub const DEFAULT_MAX_BLOCK_RECORDS: usize = 1_000_000;

/// The serialized bytes a block holds at most unless
/// [`BlockGeneratorSettings::max_block_bytes`] says otherwise: 16 MiB, a
/// quarter of the receiver WAL's default largest record, leaving room for
/// the sampled size estimate to be wrong.
pub const DEFAULT_MAX_BLOCK_BYTES: u64 = 16 << 20;

/// The memory a block's records take at most, as records, unless
/// [`BlockGeneratorSettings::max_block_memory`] says otherwise: 64 MiB.
pub const DEFAULT_MAX_BLOCK_MEMORY: u64 = 64 << 20;

impl BlockGeneratorSettings {
    /// The record cap in force.
    pub fn block_records_cap(&self) -> usize {
        self.max_block_records.unwrap_or(DEFAULT_MAX_BLOCK_RECORDS).max(1)
    }

    /// The byte cap in force.
    pub fn block_bytes_cap(&self) -> u64 {
        self.max_block_bytes.unwrap_or(DEFAULT_MAX_BLOCK_BYTES).max(1)
    }

    /// The memory cap in force.
    pub fn block_memory_cap(&self) -> u64 {
        self.max_block_memory.unwrap_or(DEFAULT_MAX_BLOCK_MEMORY).max(1)
    }

    /// Sets [`BlockGeneratorSettings::max_block_memory`].
    pub fn with_max_block_memory(mut self, bytes: u64) -> Self {
        self.max_block_memory = Some(bytes);
        self
    }

    /// Sets [`BlockGeneratorSettings::max_block_records`].
    pub fn with_max_block_records(mut self, records: usize) -> Self {
        self.max_block_records = Some(records);
        self
    }

    /// Sets [`BlockGeneratorSettings::max_block_bytes`].
    pub fn with_max_block_bytes(mut self, bytes: u64) -> Self {
        self.max_block_bytes = Some(bytes);
        self
    }
}

/// Receives the blocks a [`BlockGenerator`] cuts, on its pushing thread.
pub trait BlockGeneratorListener<T>: Send + Sync + 'static {
    /// Stores the block; returns once it is stored (durably, when the WAL is on).
    fn on_push_block(&self, block_id: StreamBlockId, records: Vec<T>) -> Result<(), ReceiverError>;

    /// Starts pushing a block the generator serialized itself (records
    /// added in place, [`BlockGenerator::add_in_place_with`]), as
    /// [`BlockGeneratorListener::start_push`] does. By default the block is
    /// decoded and pushed as records.
    fn start_push_serialized(&self, block_id: StreamBlockId, bytes: Vec<u8>) -> Pending<()>
    where
        T: Record,
    {
        match decode_block(&bytes) {
            Ok(records) => self.start_push(block_id, records),
            Err(source) => Pending::ready(Err(ReceiverError::Codec { block_id: Some(block_id), source })),
        }
    }

    /// Starts pushing the block; it is pushed once the result's
    /// [`Pending::wait`] returned `Ok`. The pusher starts the next queued
    /// blocks (a few) before it waits for this one, so serializing them
    /// overlaps with syncing this one. By default the block is pushed at once.
    fn start_push(&self, block_id: StreamBlockId, records: Vec<T>) -> Pending<()> {
        Pending::ready(self.on_push_block(block_id, records))
    }

    /// Starts pushing the block, as [`BlockGeneratorListener::start_push`]
    /// does, and gives its buffer back, emptied, when nothing keeps it: the
    /// generator fills it with a later block. By default it is not given back.
    fn start_push_reusing(&self, block_id: StreamBlockId, records: Vec<T>) -> (Pending<()>, Option<Vec<T>>) {
        (self.start_push(block_id, records), None)
    }

    /// Whether blocks are stored serialized: the generator then encodes
    /// records as they are added, so that their owned form is dropped at
    /// once, and pushes every block serialized
    /// ([`BlockGeneratorListener::start_push_serialized`]). By default
    /// blocks are pushed as records.
    fn stores_serialized(&self) -> bool {
        false
    }

    /// Told about a block that could not be pushed (its records are lost to
    /// this generator; [`BlockGenerator::flush`] reports it to the receiver).
    fn on_error(&self, error: ReceiverError);
}

/// Hands out block ids that stay unique across restarts of the process:
/// the clock's milliseconds times 1000, moved on by one when taken.
#[derive(Debug)]
pub(crate) struct BlockIdAllocator {
    stream_id: StreamId,
    last: AtomicU64,
}

impl BlockIdAllocator {
    pub(crate) fn new(stream_id: StreamId) -> Self {
        BlockIdAllocator { stream_id, last: AtomicU64::new(0) }
    }

    pub(crate) fn next(&self, now: Time) -> StreamBlockId {
        let floor = u64::try_from(now.as_millis()).unwrap_or(0).saturating_mul(1000);
        let previous = self.last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| Some(floor.max(last + 1)));
        let previous = previous.unwrap_or_else(|last| last);
        StreamBlockId::new(self.stream_id, floor.max(previous + 1))
    }
}

const ACTIVE: u8 = 0;
const STOPPED_ADDING: u8 = 1;
const STOPPED: u8 = 2;

/// Which blocks the pusher has handled: every block up to `durable` was
/// stored; a failure freezes `durable` until [`BlockGenerator::clear_failure`].
#[derive(Debug, Default)]
struct PushProgress {
    pushed: u64,
    durable: u64,
    failure: Option<String>,
}

/// Blocks the pusher starts before it waits for the oldest: enough to keep
/// the disk busy with one block's sync while the next ones are serialized
/// and appended.
pub(crate) const MAX_IN_FLIGHT: usize = 3;

/// Emptied block buffers kept to be filled again, at most: one being
/// filled while the last one is serialized is the steady state.
const SPARE_BUFFERS: usize = 2;

/// A block whose push was started and not yet waited for.
struct InFlight {
    seq: u64,
    block_id: StreamBlockId,
    pending: Pending<()>,
}

struct QueuedBlock<T> {
    seq: u64,
    block_id: StreamBlockId,
    block: CutBlock<T>,
}

/// A block as it was cut.
enum CutBlock<T> {
    Records(Vec<T>),
    /// Records added in place, serialized.
    Serialized(Vec<u8>),
}

/// The block being filled: records, or records added in place (encoded);
/// never both, so that the order of records is kept.
struct Buffer<T> {
    records: Vec<T>,
    /// Records added in place, one after the other in their layout.
    encoded: Vec<u8>,
    encoded_records: usize,
    /// Estimated serialized bytes of `records`.
    bytes: u64,
    /// Estimated serialized bytes of one record, from the last records
    /// sized (0 until some were): how many more fit under the byte cap.
    bytes_per_record: u64,
    /// Estimated memory of the block's records as records (0 for records
    /// added in place).
    memory: u64,
    /// Estimated memory of one record, from the last records sized: how
    /// many more fit under the memory cap.
    memory_per_record: u64,
}

/// Records a fill of unknown record size adds at most before they are
/// sized: a few, so that a source of huge records cannot overshoot the byte
/// cap by a whole slice.
const PROBE_RECORDS: usize = 16;

struct Shared<T> {
    stream_id: StreamId,
    config: BlockGeneratorSettings,
    clock: Arc<dyn Clock>,
    state: AtomicU8,
    /// Records stored as they are are encoded on the way in
    /// ([`BlockGeneratorListener::stores_serialized`]).
    encode_on_store: bool,
    buffer: Mutex<Buffer<T>>,
    /// Emptied buffers of pushed blocks, to fill again (their pages are
    /// already mapped: a new buffer of a fast source's block faults in
    /// tens of megabytes, every block).
    spare_buffers: Mutex<Vec<Vec<T>>>,
    /// Taken (and so closed) when the generator stops.
    queue: Mutex<Option<Sender<QueuedBlock<T>>>>,
    cut_seq: AtomicU64,
    progress: Mutex<PushProgress>,
    progress_changed: Condvar,
    ids: Arc<BlockIdAllocator>,
    rate: RateLimiter,
    /// Stops rate-limit waits of adders.
    adders_stop: StopSignal,
    /// Stops the timer.
    timer_stop: StopSignal,
}

/// Buffers records and cuts them into blocks; see the module documentation.
pub struct BlockGenerator<T> {
    shared: Arc<Shared<T>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<T> std::fmt::Debug for BlockGenerator<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockGenerator")
            .field("stream_id", &self.shared.stream_id)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<T: Record> BlockGenerator<T> {
    /// Starts a generator for `stream_id` that pushes to `listener`.
    pub fn start(
        stream_id: StreamId,
        config: BlockGeneratorSettings,
        clock: Arc<dyn Clock>,
        listener: Arc<dyn BlockGeneratorListener<T>>,
    ) -> Result<Self, ReceiverError> {
        Self::start_with_ids(stream_id, config, clock, listener, Arc::new(BlockIdAllocator::new(stream_id)))
    }

    pub(crate) fn start_with_ids(
        stream_id: StreamId,
        config: BlockGeneratorSettings,
        clock: Arc<dyn Clock>,
        listener: Arc<dyn BlockGeneratorListener<T>>,
        ids: Arc<BlockIdAllocator>,
    ) -> Result<Self, ReceiverError> {
        let (tx, rx) = crossbeam::channel::bounded(config.queue_capacity.max(1));
        let rate = RateLimiter::new(Arc::clone(&clock), config.max_rate);
        if config.initial_rate.is_some() {
            rate.update_limit(config.initial_rate);
        }
        let shared = Arc::new(Shared {
            stream_id,
            rate,
            config,
            clock,
            state: AtomicU8::new(ACTIVE),
            encode_on_store: listener.stores_serialized(),
            buffer: Mutex::new(Buffer {
                records: Vec::new(),
                encoded: Vec::new(),
                encoded_records: 0,
                bytes: 0,
                bytes_per_record: 0,
                memory: 0,
                memory_per_record: 0,
            }),
            spare_buffers: Mutex::new(Vec::new()),
            queue: Mutex::new(Some(tx)),
            cut_seq: AtomicU64::new(0),
            progress: Mutex::new(PushProgress::default()),
            progress_changed: Condvar::new(),
            ids,
            adders_stop: StopSignal::default(),
            timer_stop: StopSignal::default(),
        });
        let generator = BlockGenerator { shared: Arc::clone(&shared), threads: Mutex::new(Vec::new()) };
        let pusher_shared = Arc::clone(&shared);
        generator
            .spawn(format!("block-pusher-{stream_id}"), move || pusher_shared.push_loop(&rx, listener.as_ref()))?;
        // The first tick is fixed now, not when the thread first runs.
        let interval = shared.config.block_interval.max(Duration::from_millis(1));
        let first_tick = shared.clock.now().floor(interval) + interval;
        generator.spawn(format!("block-timer-{stream_id}"), move || shared.timer_loop(first_tick, interval))?;
        Ok(generator)
    }

    fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> Result<(), ReceiverError> {
        let handle = std::thread::Builder::new()
            .name(name.clone())
            .spawn(body)
            .map_err(|e| ReceiverError::Runtime { what: name, reason: e.to_string() })?;
        lock(&self.threads).push(handle);
        Ok(())
    }

    /// Adds one record to the current block, waiting for the rate limit.
    pub fn add_record(&self, record: T) -> Result<(), ReceiverError> {
        let memory = record_memory(&record);
        if self.shared.encode_on_store {
            return self.add_encoded(std::iter::once(record), 1, memory);
        }
        self.admit(1)?;
        let size = encoded_record_size(&record);
        let mut buffer = self.shared.lock_buffer();
        self.shared.cut_if_encoded(&mut buffer)?;
        buffer.bytes_per_record = size;
        buffer.memory_per_record = memory;
        self.shared.make_room(&mut buffer, 1)?;
        buffer.records.push(record);
        buffer.bytes += size;
        buffer.memory += memory;
        self.shared.cut_if_full(&mut buffer)
    }

    /// Adds a batch of records to the current block at once, waiting for the
    /// rate limit for all of them (the fast path: one lock per batch).
    ///
    /// Under a rate limit, a batch larger than 100 ms of the limit is added
    /// in slices of that size, so records flow at the limit rather
    /// than the whole batch waiting for its last permit: at a low limit that
    /// wait would be minutes, with empty batches meanwhile, from which
    /// backpressure could not learn to raise the limit again.
    pub fn add_records(&self, records: Vec<T>) -> Result<(), ReceiverError> {
        if self.shared.encode_on_store {
            let count = records.len();
            let memory = estimate_records_size(&records).div_ceil(count.max(1) as u64);
            return self.add_encoded(records.into_iter(), count, memory);
        }
        let slice = self.admission_slice();
        if records.len() <= slice {
            return self.add_batch(records);
        }
        let mut records = records.into_iter();
        loop {
            let chunk: Vec<T> = records.by_ref().take(slice).collect();
            if chunk.is_empty() {
                return Ok(());
            }
            self.add_batch(chunk)?;
        }
    }

    /// Adds `count` records that `fill` writes straight into the current
    /// block, waiting for the rate limit: a source that can produce records
    /// in place saves building a batch and copying it in.
    ///
    /// `fill(block, n)` must append exactly `n` records to `block`. It runs
    /// with the block locked (keep it short: the timer waits to cut), once
    /// per slice of at most 100 ms of the rate limit, as
    /// [`BlockGenerator::add_records`] admits a large batch, and of at most
    /// what still fits in the block under its caps; the slices add up to
    /// `count`.
    pub fn add_with(&self, count: usize, mut fill: impl FnMut(&mut Vec<T>, usize)) -> Result<(), ReceiverError> {
        if self.shared.encode_on_store {
            let mut scratch = Vec::new();
            return self.add_in_slices(count, Shared::cut_if_records, |buffer, n| {
                fill(&mut scratch, n);
                debug_assert_eq!(scratch.len(), n, "a fill must append exactly the records asked for");
                let memory = estimate_records_size(&scratch);
                let bytes = encode_into(buffer, scratch.drain(..))?;
                Ok(Added { bytes, memory })
            });
        }
        self.add_in_slices(
            count,
            |shared, buffer| shared.cut_if_encoded(buffer),
            |buffer, n| {
                let before = buffer.records.len();
                fill(&mut buffer.records, n);
                debug_assert_eq!(buffer.records.len() - before, n, "a fill must append exactly the records asked for");
                let added = &buffer.records[before..];
                Ok(Added { bytes: estimate_encoded_size(added), memory: estimate_records_size(added) })
            },
        )
    }

    /// Adds `count` records, each encoded into the block as it comes and
    /// then dropped, `memory` bytes each as records (for the memory cap).
    fn add_encoded(&self, records: impl Iterator<Item = T>, count: usize, memory: u64) -> Result<(), ReceiverError> {
        let mut records = records;
        self.add_in_slices(count, Shared::cut_if_records, |buffer, n| {
            let bytes = encode_into(buffer, records.by_ref().take(n))?;
            Ok(Added { bytes, memory: memory * n as u64 })
        })
    }

    /// Adds `count` records that `fill` writes in place, encoded, into the
    /// current block, waiting for the rate limit: a source that has its
    /// records as views (a `&str` of a `String` record, read off a socket)
    /// adds them without making a record, and the block is serialized as
    /// it fills, so cutting it has nothing left to encode.
    ///
    /// `fill(block, n)` must push exactly `n` records with
    /// [`BlockWriter::push`]; it runs as [`BlockGenerator::add_with`]'s
    /// `fill` does (block locked, in slices).
    pub fn add_in_place_with(
        &self,
        count: usize,
        mut fill: impl FnMut(&mut BlockWriter<'_, T>, usize),
    ) -> Result<(), ReceiverError>
    where
        T: InPlace,
    {
        self.add_in_slices(count, Shared::cut_if_records, |buffer, n| {
            let before = (buffer.encoded.len(), buffer.encoded_records);
            let Buffer { encoded, encoded_records, .. } = buffer;
            fill(&mut BlockWriter { encoded, records: encoded_records, record: PhantomData }, n);
            debug_assert_eq!(buffer.encoded_records - before.1, n, "a fill must push exactly the records asked for");
            // Read in place, not decoded: no memory as records to cap.
            Ok(Added { bytes: (buffer.encoded.len() - before.0) as u64, memory: 0 })
        })
    }

    /// Admits `count` records in slices of the rate limit and, with the
    /// block locked, has `fill(buffer, n)` add them, each time as many as
    /// fit in the current block, returning the bytes they take encoded and
    /// as records; `start` first cuts a block of the other form (records
    /// or encoded).
    fn add_in_slices(
        &self,
        count: usize,
        start: impl Fn(&Shared<T>, &mut Buffer<T>) -> Result<(), ReceiverError>,
        mut fill: impl FnMut(&mut Buffer<T>, usize) -> Result<Added, ReceiverError>,
    ) -> Result<(), ReceiverError> {
        let slice = self.admission_slice();
        let mut left = count;
        while left > 0 {
            let admitted = left.min(slice);
            self.admit(admitted as u64)?;
            let mut buffer = self.shared.lock_buffer();
            start(&self.shared, &mut buffer)?;
            let mut to_fill = admitted;
            while to_fill > 0 {
                let room = self.shared.make_room(&mut buffer, to_fill)?;
                let n = if buffer.bytes_per_record == 0 { room.min(PROBE_RECORDS) } else { room };
                let added = fill(&mut buffer, n)?;
                buffer.note_added(added, n);
                self.shared.cut_if_full(&mut buffer)?;
                to_fill -= n;
            }
            left -= admitted;
        }
        Ok(())
    }

    /// The most records admitted at once: 100 ms of the rate limit.
    fn admission_slice(&self) -> usize {
        self.shared.rate.limit().map_or(usize::MAX, |limit| usize::try_from(limit / 10).unwrap_or(1).max(1))
    }

    /// Adds `records` to the current block once the rate limit admits them
    /// all, cutting blocks on the way as the caps require.
    fn add_batch(&self, records: Vec<T>) -> Result<(), ReceiverError> {
        self.admit(records.len() as u64)?;
        let total = records.len();
        if total == 0 {
            return Ok(());
        }
        let per_record = estimate_encoded_size(&records).div_ceil(total.max(1) as u64);
        let memory = estimate_records_size(&records).div_ceil(total.max(1) as u64);
        let mut buffer = self.shared.lock_buffer();
        self.shared.cut_if_encoded(&mut buffer)?;
        buffer.bytes_per_record = per_record;
        buffer.memory_per_record = memory;
        let room = self.shared.make_room(&mut buffer, total)?;
        if room == total {
            // All of it fits: the fast path, which may take over the batch's buffer.
            if buffer.records.is_empty() && buffer.records.capacity() < total {
                buffer.records = records;
            } else {
                buffer.records.extend(records);
            }
            buffer.note_added(Added { bytes: per_record * total as u64, memory: memory * total as u64 }, total);
            return self.shared.cut_if_full(&mut buffer);
        }
        let mut records = records.into_iter();
        let mut left = total;
        while left > 0 {
            let n = self.shared.make_room(&mut buffer, left)?;
            buffer.records.extend(records.by_ref().take(n));
            buffer.note_added(Added { bytes: per_record * n as u64, memory: memory * n as u64 }, n);
            self.shared.cut_if_full(&mut buffer)?;
            left -= n;
        }
        Ok(())
    }

    /// Cuts the current buffer into a block now and waits until every block
    /// cut so far is pushed. Errors when one of them failed: a receiver that
    /// acknowledges its source after `flush` returns loses nothing.
    pub fn flush(&self) -> Result<(), ReceiverError> {
        let target = {
            let mut buffer = self.shared.lock_buffer();
            self.shared.cut(&mut buffer)?;
            self.shared.cut_seq.load(Ordering::Acquire)
        };
        self.shared.wait_pushed(target)
    }

    /// Forgets an earlier push failure, so that [`BlockGenerator::flush`]
    /// succeeds again (called when the receiver restarts).
    pub fn clear_failure(&self) {
        let mut progress = self.shared.lock_progress();
        progress.failure = None;
        progress.durable = progress.pushed;
    }

    /// Makes adders waiting for the rate limit give up (with
    /// [`ReceiverError::Stopped`]), ahead of a stop.
    pub fn interrupt_adders(&self) {
        self.shared.adders_stop.stop();
    }

    /// The rate limiter of records added; backpressure updates its limit.
    pub fn rate_limiter(&self) -> &RateLimiter {
        &self.shared.rate
    }

    /// Blocks pushed so far (stored or failed).
    pub fn blocks_pushed(&self) -> u64 {
        self.shared.lock_progress().pushed
    }

    /// Stops: refuses new records, cuts the last block, pushes every queued
    /// block and joins both threads.
    pub fn stop(&self) -> Result<(), ReceiverError> {
        if self.shared.state.swap(STOPPED_ADDING, Ordering::AcqRel) != ACTIVE {
            return self.join();
        }
        self.shared.adders_stop.stop();
        self.shared.timer_stop.stop();
        let joined = self.join();
        self.shared.state.store(STOPPED, Ordering::Release);
        debug!(stream = %self.shared.stream_id, "block generator stopped");
        joined
    }

    fn join(&self) -> Result<(), ReceiverError> {
        let threads = std::mem::take(&mut *lock(&self.threads));
        let mut result = Ok(());
        for thread in threads {
            let name = thread.thread().name().unwrap_or("block generator").to_string();
            if thread.join().is_err() {
                result = Err(ReceiverError::Runtime { what: name, reason: "thread panicked".into() });
            }
        }
        result
    }

    fn admit(&self, n: u64) -> Result<(), ReceiverError> {
        let stopped = || ReceiverError::Stopped { stream_id: self.shared.stream_id, what: "adding records" };
        if self.shared.state.load(Ordering::Acquire) != ACTIVE {
            return Err(stopped());
        }
        if let Some(until) = self.shared.rate.reserve(n)
            && !self.shared.adders_stop.wait_until(self.shared.rate.clock(), until)
        {
            return Err(stopped());
        }
        Ok(())
    }
}

impl<T> Drop for BlockGenerator<T> {
    fn drop(&mut self) {
        // Without an explicit stop, let the threads end on their own.
        self.shared.adders_stop.stop();
        self.shared.timer_stop.stop();
    }
}

/// Writes records in place into the block being filled
/// ([`BlockGenerator::add_in_place_with`]).
pub struct BlockWriter<'a, T> {
    encoded: &'a mut Vec<u8>,
    records: &'a mut usize,
    record: PhantomData<fn(T)>,
}

impl<T: InPlace> BlockWriter<'_, T> {
    /// Adds the record `view` is a view of.
    pub fn push(&mut self, view: &T::View) {
        T::write_view(view, self.encoded);
        *self.records += 1;
    }
}

impl<T> Buffer<T> {
    /// Records in the block so far.
    fn len(&self) -> usize {
        self.records.len() + self.encoded_records
    }

    /// Records that still fit under every cap, at the last sizes per record.
    fn room(&self, config: &BlockGeneratorSettings) -> usize {
        let by_records = config.block_records_cap().saturating_sub(self.len());
        let by_bytes = fitting(config.block_bytes_cap(), self.bytes, self.bytes_per_record);
        let by_memory = fitting(config.block_memory_cap(), self.memory, self.memory_per_record);
        by_records.min(by_bytes).min(by_memory)
    }

    /// Counts `n` records just added, of the sizes (estimated) `added` says.
    fn note_added(&mut self, added: Added, n: usize) {
        self.bytes = self.bytes.saturating_add(added.bytes);
        self.memory = self.memory.saturating_add(added.memory);
        if n > 0 {
            self.bytes_per_record = added.bytes.div_ceil(n as u64).max(1);
            self.memory_per_record = added.memory.div_ceil(n as u64);
        }
    }
}

/// The sizes of records just added to a block, estimated.
#[derive(Clone, Copy, Debug)]
struct Added {
    /// Encoded.
    bytes: u64,
    /// As records in memory (0 for records added in place).
    memory: u64,
}

/// How many more records of `per_record` bytes fit under `cap` with `used`
/// taken (any number when their size is not known yet).
fn fitting(cap: u64, used: u64, per_record: u64) -> usize {
    let left = cap.saturating_sub(used);
    match per_record {
        0 if left > 0 => usize::MAX,
        0 => 0,
        per_record => usize::try_from(left / per_record).unwrap_or(usize::MAX),
    }
}

/// The memory one record takes as a record: inline and on the heap.
fn record_memory<T: Record>(record: &T) -> u64 {
    std::mem::size_of::<T>() as u64 + record.heap_bytes()
}

/// Encodes `records` onto the end of the block's encoded records, dropping
/// each once encoded, and returns the bytes they took. A record that does
/// not encode is an error, and the block keeps only the records before it.
fn encode_into<T: Record>(buffer: &mut Buffer<T>, records: impl Iterator<Item = T>) -> Result<u64, ReceiverError> {
    let start = buffer.encoded.len();
    for record in records {
        let before = buffer.encoded.len();
        if let Err(source) = record.write_record(&mut buffer.encoded) {
            buffer.encoded.truncate(before);
            return Err(ReceiverError::Codec { block_id: None, source });
        }
        buffer.encoded_records += 1;
    }
    Ok((buffer.encoded.len() - start) as u64)
}

/// What the pusher does next while blocks are in flight.
enum NextStep<T> {
    /// Start this block.
    Block(QueuedBlock<T>),
    /// The oldest block in flight is done: finish it.
    OldestDone,
    /// Nothing is queued and the oldest block cannot tell when it is done:
    /// wait for it.
    FinishOldest,
    /// The queue is closed and drained.
    Closed,
}

/// The next block or the news that the oldest block in flight is done,
/// whichever comes first: a block that arrives while the oldest is still
/// being written is started at once, not after it.
fn next_or_oldest_done<T>(queue: &Receiver<QueuedBlock<T>>, oldest: &Pending<()>) -> NextStep<T> {
    let Some(done) = oldest.done_signal() else {
        return match queue.try_recv() {
            Ok(block) => NextStep::Block(block),
            Err(crossbeam::channel::TryRecvError::Empty) => NextStep::FinishOldest,
            Err(crossbeam::channel::TryRecvError::Disconnected) => NextStep::Closed,
        };
    };
    crossbeam::channel::select_biased! {
        recv(queue) -> block => block.map_or(NextStep::Closed, NextStep::Block),
        recv(done) -> _ => NextStep::OldestDone,
    }
}

impl<T: Record> Shared<T> {
    fn lock_buffer(&self) -> MutexGuard<'_, Buffer<T>> {
        lock(&self.buffer)
    }

    fn lock_progress(&self) -> MutexGuard<'_, PushProgress> {
        lock(&self.progress)
    }

    /// How many of `wanted` more records fit in the block under its caps
    /// (at least one), cutting the block first when not even one does.
    fn make_room(&self, buffer: &mut Buffer<T>, wanted: usize) -> Result<usize, ReceiverError> {
        let mut room = buffer.room(&self.config);
        if room == 0 {
            self.cut(buffer)?;
            room = buffer.room(&self.config).max(1);
        }
        Ok(room.min(wanted))
    }

    fn cut_if_full(&self, buffer: &mut Buffer<T>) -> Result<(), ReceiverError> {
        if buffer.room(&self.config) == 0 { self.cut(buffer) } else { Ok(()) }
    }

    /// Cuts the block when it holds records added in place, before records
    /// are added as they are (the block keeps one form).
    fn cut_if_encoded(&self, buffer: &mut Buffer<T>) -> Result<(), ReceiverError> {
        if buffer.encoded_records > 0 { self.cut(buffer) } else { Ok(()) }
    }

    /// Cuts a block of records before records are added encoded: a block
    /// holds one form or the other.
    fn cut_if_records(&self, buffer: &mut Buffer<T>) -> Result<(), ReceiverError> {
        if buffer.records.is_empty() { Ok(()) } else { self.cut(buffer) }
    }

    /// Moves the buffer into a block on the queue. Called with the buffer
    /// locked, so adders wait while the queue is full (backpressure).
    fn cut(&self, buffer: &mut Buffer<T>) -> Result<(), ReceiverError> {
        if buffer.len() == 0 {
            return Ok(());
        }
        let block_id = self.ids.next(self.clock.now());
        let block = if buffer.records.is_empty() {
            // Serialized here, a copy of bytes already encoded; the buffer
            // is kept for the next block.
            let count = std::mem::take(&mut buffer.encoded_records) as u64;
            let framed = frame_encoded_records(count, &buffer.encoded);
            buffer.encoded.clear();
            CutBlock::Serialized(framed.map_err(|source| ReceiverError::Codec { block_id: Some(block_id), source })?)
        } else {
            let next = self.next_buffer(&buffer.records);
            CutBlock::Records(std::mem::replace(&mut buffer.records, next))
        };
        buffer.bytes = 0;
        buffer.memory = 0;
        let seq = self.cut_seq.load(Ordering::Acquire) + 1;
        let queue = lock(&self.queue).clone();
        let sent = queue.map(|q| q.send(QueuedBlock { seq, block_id, block }));
        match sent {
            Some(Ok(())) => {
                self.cut_seq.store(seq, Ordering::Release);
                Ok(())
            }
            _ => Err(ReceiverError::Stopped { stream_id: self.stream_id, what: "cutting a block" }),
        }
    }

    /// An empty buffer for the block after `full`, with room for as many
    /// records as `full` had room for (a block cut early by the timer does
    /// not shrink the next one).
    fn next_buffer(&self, full: &Vec<T>) -> Vec<T> {
        let wanted = full.capacity().min(self.config.block_records_cap()).max(full.len());
        let spare = lock(&self.spare_buffers).pop();
        let mut next = spare.unwrap_or_default();
        next.reserve(wanted);
        next
    }

    /// Keeps an emptied buffer for a later block, if fewer than
    /// [`SPARE_BUFFERS`] are kept (a buffer given back with records in it
    /// is dropped).
    fn give_back(&self, buffer: Vec<T>) {
        let mut spares = lock(&self.spare_buffers);
        if spares.len() < SPARE_BUFFERS && buffer.is_empty() {
            spares.push(buffer);
        }
    }

    fn timer_loop(&self, first_tick: Time, interval: Duration) {
        let mut next = first_tick;
        while self.timer_stop.wait_until(self.clock.as_ref(), next) {
            if let Err(e) = self.cut(&mut self.lock_buffer()) {
                warn!(stream = %self.stream_id, error = %e, "could not cut a block");
            }
            next = next + interval;
        }
        // The last block: whatever was added before the stop.
        let mut buffer = self.lock_buffer();
        if let Err(e) = self.cut(&mut buffer) {
            warn!(stream = %self.stream_id, error = %e, records = buffer.records.len(), "last block was not queued");
        }
        // Closing the queue lets the pusher finish once it is drained.
        lock(&self.queue).take();
    }

    /// Pushes blocks in order, with up to [`MAX_IN_FLIGHT`] started and not
    /// yet finished: while the oldest one's WAL write and sync run, the next
    /// ones are serialized and handed to the WAL. Blocks finish (and are
    /// reported) in the order they were cut.
    fn push_loop(&self, queue: &Receiver<QueuedBlock<T>>, listener: &dyn BlockGeneratorListener<T>) {
        let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(MAX_IN_FLIGHT);
        loop {
            while in_flight.front().is_some_and(|oldest| oldest.pending.is_done() == Some(true)) {
                self.finish_push(in_flight.pop_front(), listener);
            }
            let next = if in_flight.len() >= MAX_IN_FLIGHT {
                self.finish_push(in_flight.pop_front(), listener);
                continue;
            } else if let Some(oldest) = in_flight.front() {
                match next_or_oldest_done(queue, &oldest.pending) {
                    NextStep::Block(block) => Some(block),
                    NextStep::OldestDone => continue,
                    NextStep::FinishOldest => {
                        self.finish_push(in_flight.pop_front(), listener);
                        continue;
                    }
                    NextStep::Closed => None,
                }
            } else {
                queue.recv().ok()
            };
            let Some(QueuedBlock { seq, block_id, block }) = next else {
                while let Some(block) = in_flight.pop_front() {
                    self.finish_push(Some(block), listener);
                }
                return;
            };
            let started = match block {
                CutBlock::Records(records) => {
                    let (started, spent) = listener.start_push_reusing(block_id, records);
                    if let Some(buffer) = spent {
                        self.give_back(buffer);
                    }
                    started
                }
                CutBlock::Serialized(bytes) => listener.start_push_serialized(block_id, bytes),
            };
            in_flight.push_back(InFlight { seq, block_id, pending: started });
        }
    }

    fn finish_push(&self, in_flight: Option<InFlight>, listener: &dyn BlockGeneratorListener<T>) {
        let Some(InFlight { seq, block_id, pending }) = in_flight else {
            return;
        };
        let result = pending.wait();
        let mut progress = self.lock_progress();
        progress.pushed = seq;
        match result {
            Ok(()) if progress.failure.is_none() => progress.durable = seq,
            Ok(()) => {}
            Err(e) => {
                progress.failure.get_or_insert_with(|| format!("block {block_id}: {e}"));
                drop(progress);
                listener.on_error(e);
            }
        }
        self.progress_changed.notify_all();
    }

    fn wait_pushed(&self, target: u64) -> Result<(), ReceiverError> {
        let mut progress = self.lock_progress();
        while progress.pushed < target {
            progress = self.progress_changed.wait(progress).unwrap_or_else(PoisonError::into_inner);
        }
        match &progress.failure {
            Some(reason) if progress.durable < target => {
                Err(ReceiverError::Receiver { receiver: format!("stream {}", self.stream_id), message: reason.clone() })
            }
            _ => Ok(()),
        }
    }
}
