//! The block manager: received blocks by id, in memory within a budget and
//! on a RocksDB disk store.
//!
//! The budget may be shared with the other inputs of the process (see
//! [`MemoryBudget`]): a memory-only block that does not fit waits until a
//! batch has read enough blocks out, which holds the receiver back at the
//! engine's pace (backpressure) instead of failing it or growing memory.
//!
//! It is the process-local part of Spark's `BlockManager` that receivers
//! use. The disk store is a spill area for this process only: it is wiped
//! when opened, because after a crash blocks come back from the receiver
//! write-ahead log, not from here. It may be bounded too (a spill budget,
//! shared like the memory one): when it is full, a block that would go to
//! disk waits for a batch to read blocks out, as a memory-only block waits
//! for memory, and the log says so once, rather than the disk filling up.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use spate_core::sync::lock;
use spate_core::{Clock, MemoryBudget, Reservation, StreamBlockId, StreamId, Time};
use tracing::{debug, warn};

use crate::block::BlockData;
use crate::codec::Record;
use crate::disk_store::DiskStore;
use crate::error::ReceiverError;
use crate::storage::StorageLevel;

/// Gauge of `/metrics`: blocks held in memory, per stream.
pub(crate) const BLOCKS_IN_MEMORY: &str = "spate_blocks_in_memory";
/// Gauge of `/metrics`: estimated bytes of the blocks held in memory, per stream.
pub(crate) const BLOCK_BYTES_IN_MEMORY: &str = "spate_block_bytes_in_memory";
/// Counter of `/metrics`: blocks that waited for room in the full spill
/// area, counted as the wait begins (so a receiver held back shows at once).
pub(crate) const SPILL_WAITS: &str = "spate_spill_waits_total";

/// Where a stored block is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLocation {
    /// The block is in memory.
    pub in_memory: bool,
    /// The block is in the disk store.
    pub on_disk: bool,
}

/// How a [`BlockManager`] is set up.
#[derive(Clone, Debug)]
pub struct BlockManagerSettings {
    /// Bytes of (estimated) block data kept in memory at most, when no
    /// shared budget is given.
    pub memory_budget_bytes: u64,
    /// A budget shared with other holders of records (the other inputs of
    /// the process); it takes the place of `memory_budget_bytes`.
    pub shared_budget: Option<Arc<MemoryBudget>>,
    /// The RocksDB directory of the disk store (new, empty, or made by an
    /// earlier block manager, which is wiped); without one, levels that
    /// need disk are refused.
    pub disk_dir: Option<PathBuf>,
    /// The bytes the disk store may hold, shared with the disk stores of
    /// the other inputs; `None`: as much as the disk takes. When it is
    /// full, a block that would spill waits for a batch to read blocks out
    /// (backpressure), saying so in the log, rather than fill the disk.
    pub spill_budget: Option<Arc<MemoryBudget>>,
}

impl BlockManagerSettings {
    /// Memory only, with `memory_budget_bytes`.
    pub fn in_memory(memory_budget_bytes: u64) -> Self {
        BlockManagerSettings { memory_budget_bytes, shared_budget: None, disk_dir: None, spill_budget: None }
    }

    /// Memory within `memory_budget_bytes` and a disk store in `disk_dir`.
    pub fn with_disk(memory_budget_bytes: u64, disk_dir: impl Into<PathBuf>) -> Self {
        BlockManagerSettings {
            memory_budget_bytes,
            shared_budget: None,
            disk_dir: Some(disk_dir.into()),
            spill_budget: None,
        }
    }

    /// Draws on `budget`, shared with other holders, instead of a budget of its own.
    pub fn with_shared_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.shared_budget = Some(budget);
        self
    }

    /// Keeps the disk store within `budget` (see [`BlockManagerSettings::spill_budget`]).
    pub fn with_spill_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.spill_budget = Some(budget);
        self
    }
}

struct Entry<T> {
    level: StorageLevel,
    stored_at: Time,
    memory: Option<(BlockData<T>, u64)>,
    on_disk: bool,
    /// Bytes the block takes in the disk store (0 when not there).
    disk_bytes: u64,
    lru_tick: u64,
}

struct Inner<T> {
    entries: HashMap<StreamBlockId, Entry<T>>,
    /// Memory-resident blocks by last use, oldest first.
    lru: BTreeMap<u64, StreamBlockId>,
    next_tick: u64,
    memory_used: u64,
    /// Of `memory_used`, the bytes of blocks that may spill to disk.
    spillable_used: u64,
    /// Blocks and bytes in memory per stream, for the gauges of `/metrics`.
    per_stream: BTreeMap<StreamId, (u64, u64)>,
}

/// Blocks by [`StreamBlockId`], at a [`StorageLevel`], within a memory budget.
///
/// When memory is short, memory-and-disk blocks spill to the disk store,
/// least recently used first; a memory-only block that does not fit waits
/// for room (see the module doc), and one larger than the whole budget is
/// refused with [`ReceiverError::MemoryBudgetExceeded`] (dropping it
/// silently would lose received data).
pub struct BlockManager<T> {
    inner: Mutex<Inner<T>>,
    disk: Option<DiskStore>,
    budget: Arc<MemoryBudget>,
    /// The bytes the disk store may hold; `None`: unbounded.
    spill: Option<Arc<MemoryBudget>>,
    /// Set while the spill area is full, so the log says so once, not per block.
    spill_full: AtomicBool,
    clock: Arc<dyn Clock>,
}

impl<T> std::fmt::Debug for BlockManager<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockManager")
            .field("budget", &self.budget.limit())
            .field("disk", &self.disk.as_ref().map(DiskStore::path))
            .finish_non_exhaustive()
    }
}

impl<T: Record> BlockManager<T> {
    /// Opens a block manager. The disk store's directory is created when
    /// missing; one an earlier block manager made is wiped, and a non-empty
    /// one it did not make is refused ([`ReceiverError::DiskDirNotOurs`]).
    pub fn open(config: BlockManagerSettings, clock: Arc<dyn Clock>) -> Result<Self, ReceiverError> {
        let disk = config.disk_dir.as_deref().map(DiskStore::open).transpose()?;
        let inner = Inner {
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            next_tick: 0,
            memory_used: 0,
            spillable_used: 0,
            per_stream: BTreeMap::new(),
        };
        let budget = config.shared_budget.unwrap_or_else(|| Arc::new(MemoryBudget::new(config.memory_budget_bytes)));
        let spill = config.spill_budget;
        Ok(BlockManager { inner: Mutex::new(inner), disk, budget, spill, spill_full: AtomicBool::new(false), clock })
    }

    /// Stores `data` as `block_id` at `level` and says where it went.
    pub fn put(
        &self,
        block_id: StreamBlockId,
        data: BlockData<T>,
        level: StorageLevel,
    ) -> Result<BlockLocation, ReceiverError> {
        let codec_err = |source| ReceiverError::Codec { block_id: Some(block_id), source };
        // Conversions happen before the lock is taken.
        let data = match (&data, level.deserialized()) {
            (BlockData::Bytes(_), true) => BlockData::Records(data.records().map_err(codec_err)?),
            (BlockData::Records(_), false) => BlockData::Bytes(data.bytes().map_err(codec_err)?),
            _ => data,
        };
        let size = data.estimated_size();
        if self.lock().entries.contains_key(&block_id) {
            return Err(ReceiverError::DuplicateBlock { block_id });
        }
        // Waiting for room happens outside the lock: the batch that reads
        // blocks out (and so makes room) needs it.
        let reserved = level.use_memory() && self.reserve(block_id, size, level)?;
        // So does waiting for room in the spill area, for a block going to disk.
        let to_disk = match (reserved, level.use_disk()) {
            (false, true) => {
                let bytes = data.bytes().map_err(codec_err)?;
                self.reserve_spill(block_id, bytes.len() as u64)?;
                Some(bytes)
            }
            _ => None,
        };
        let mut inner = self.lock();
        if inner.entries.contains_key(&block_id) {
            if reserved {
                self.budget.release(size);
            }
            if let Some(bytes) = &to_disk {
                self.release_spill(bytes.len() as u64);
            }
            return Err(ReceiverError::DuplicateBlock { block_id });
        }
        let mut entry =
            Entry { level, stored_at: self.clock.now(), memory: None, on_disk: false, disk_bytes: 0, lru_tick: 0 };
        if reserved {
            entry.lru_tick = inner.touch(block_id, None);
            inner.memory_used += size;
            if level.use_disk() {
                inner.spillable_used += size;
            }
            inner.count_memory(block_id.stream_id, size, true);
            entry.memory = Some((data, size));
        } else if let Some(bytes) = to_disk {
            let disk_bytes = bytes.len() as u64;
            if let Err(e) = self.disk_for(block_id, level).and_then(|d| d.put(block_id, &bytes)) {
                self.release_spill(disk_bytes);
                return Err(e);
            }
            entry.on_disk = true;
            entry.disk_bytes = disk_bytes;
        } else {
            return Err(self.over_budget(block_id, size, inner.memory_used));
        }
        let location = entry.location();
        inner.entries.insert(block_id, entry);
        Ok(location)
    }

    /// The block, from memory or from disk; `None` when it is not stored.
    pub fn get(&self, block_id: StreamBlockId) -> Result<Option<BlockData<T>>, ReceiverError> {
        let mut inner = self.lock();
        let Some(entry) = inner.entries.get(&block_id) else {
            return Ok(None);
        };
        if let Some((data, _)) = &entry.memory {
            let (data, previous) = (data.clone(), entry.lru_tick);
            let tick = inner.touch(block_id, Some(previous));
            if let Some(entry) = inner.entries.get_mut(&block_id) {
                entry.lru_tick = tick;
            }
            return Ok(Some(data));
        }
        let level = entry.level;
        let bytes = self.disk_for(block_id, level)?.get(block_id)?;
        Ok(bytes.map(|b| BlockData::Bytes(Arc::new(b))))
    }

    /// The block's records; `None` when it is not stored.
    pub fn get_records(&self, block_id: StreamBlockId) -> Result<Option<Arc<Vec<T>>>, ReceiverError> {
        let data = self.get(block_id)?;
        data.map(|d| d.records().map_err(|source| ReceiverError::Codec { block_id: Some(block_id), source }))
            .transpose()
    }

    /// Removes the block from memory and disk; false when it was not stored.
    pub fn remove(&self, block_id: StreamBlockId) -> Result<bool, ReceiverError> {
        let mut inner = self.lock();
        let Some(entry) = inner.entries.remove(&block_id) else {
            return Ok(false);
        };
        let freed = inner.forget_memory(block_id, &entry);
        drop(inner);
        self.budget.release(freed);
        if entry.on_disk {
            self.disk_for(block_id, entry.level)?.delete(block_id)?;
            self.release_spill(entry.disk_bytes);
        }
        Ok(true)
    }

    /// Removes every block stored before `threshold` and returns their ids.
    pub fn remove_older_than(&self, threshold: Time) -> Result<Vec<StreamBlockId>, ReceiverError> {
        let old: Vec<StreamBlockId> = {
            let inner = self.lock();
            inner.entries.iter().filter(|(_, e)| e.stored_at < threshold).map(|(id, _)| *id).collect()
        };
        for id in &old {
            self.remove(*id)?;
        }
        debug!(count = old.len(), threshold = %threshold, "removed old blocks");
        Ok(old)
    }

    /// Where the block is, if it is stored.
    pub fn location(&self, block_id: StreamBlockId) -> Option<BlockLocation> {
        self.lock().entries.get(&block_id).map(Entry::location)
    }

    /// Estimated bytes of block data in memory.
    pub fn memory_used(&self) -> u64 {
        self.lock().memory_used
    }

    /// The memory budget in bytes (the shared budget's, when it shares one).
    pub fn memory_budget(&self) -> u64 {
        self.budget.limit()
    }

    /// Number of stored blocks.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True when no block is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reserves `size` bytes of the budget for a block kept in memory:
    /// true once reserved; false when a block that may go to disk does not
    /// fit even after spilling. A memory-only block waits for room instead.
    fn reserve(&self, block_id: StreamBlockId, size: u64, level: StorageLevel) -> Result<bool, ReceiverError> {
        if self.budget.try_reserve(size) {
            return Ok(true);
        }
        if level.use_disk() {
            return self.spill_until_reserved(size);
        }
        match self.budget.reserve(size) {
            Ok(Reservation::Waited) => {
                debug!(block = %block_id, bytes = size, "block waited for room in the memory budget");
                Ok(true)
            }
            Ok(Reservation::Immediate) => Ok(true),
            Err(_) => Err(self.over_budget(block_id, size, self.memory_used())),
        }
    }

    /// Spills least recently used memory-and-disk blocks until `size` bytes
    /// can be reserved; false when none is left to spill, or the spill
    /// area has no room for the next.
    fn spill_until_reserved(&self, size: u64) -> Result<bool, ReceiverError> {
        if size > self.budget.limit() || self.disk.is_none() {
            return Ok(false);
        }
        let mut inner = self.lock();
        loop {
            if self.budget.try_reserve(size) {
                return Ok(true);
            }
            let victim =
                inner.lru.values().copied().find(|id| inner.entries.get(id).is_some_and(|e| e.level.use_disk()));
            let Some(victim) = victim else {
                return Ok(false);
            };
            if !self.spill(&mut inner, victim)? {
                return Ok(false);
            }
        }
    }

    /// Takes `bytes` of the spill area for a block going to disk: at once
    /// when they fit; otherwise the caller waits until a batch reads blocks
    /// out (backpressure), and the log says the spill area is full. A block
    /// that could never fit is refused.
    fn reserve_spill(&self, block_id: StreamBlockId, bytes: u64) -> Result<(), ReceiverError> {
        let Some(spill) = &self.spill else { return Ok(()) };
        if spill.try_reserve(bytes) {
            self.spill_full.store(false, Ordering::Relaxed);
            return Ok(());
        }
        let too_small = || ReceiverError::SpillAreaTooSmall { block_id, bytes, limit: spill.limit() };
        if bytes > spill.limit() {
            return Err(too_small());
        }
        if !self.spill_full.swap(true, Ordering::Relaxed) {
            warn!(
                stream = %block_id.stream_id,
                used = spill.used(),
                limit = spill.limit(),
                "the spill area is full: the receiver waits for a batch to read blocks out (backpressure); \
                 raise the spill limit (--max-spill) to let more blocks wait on disk"
            );
        }
        metrics::counter!(SPILL_WAITS).increment(1);
        spill.reserve(bytes).map(|_| ()).map_err(|_| too_small())
    }

    /// Gives `bytes` of the spill area back.
    fn release_spill(&self, bytes: u64) {
        if let Some(spill) = &self.spill {
            spill.release(bytes);
        }
    }

    fn over_budget(&self, block_id: StreamBlockId, needed: u64, used: u64) -> ReceiverError {
        ReceiverError::MemoryBudgetExceeded { block_id, needed, used, budget: self.budget.limit() }
    }

    /// Moves `block_id` from memory to the disk store; false (the block
    /// left in memory) when the spill area has no room for it.
    fn spill(&self, inner: &mut Inner<T>, block_id: StreamBlockId) -> Result<bool, ReceiverError> {
        let Some(entry) = inner.entries.get_mut(&block_id) else {
            return Ok(true);
        };
        let Some((data, size)) = entry.memory.take() else {
            return Ok(true);
        };
        let level = entry.level;
        let bytes = match data.bytes() {
            Ok(bytes) => bytes,
            Err(source) => {
                entry.memory = Some((data, size));
                return Err(ReceiverError::Codec { block_id: Some(block_id), source });
            }
        };
        let disk_bytes = bytes.len() as u64;
        if self.spill.as_ref().is_some_and(|spill| !spill.try_reserve(disk_bytes)) {
            entry.memory = Some((data, size));
            return Ok(false);
        }
        if let Err(e) = self.disk_for(block_id, level).and_then(|d| d.put(block_id, &bytes)) {
            // Keep the block in memory: it is still the only copy here.
            entry.memory = Some((data, size));
            self.release_spill(disk_bytes);
            return Err(e);
        }
        let tick = entry.lru_tick;
        entry.on_disk = true;
        entry.disk_bytes = disk_bytes;
        inner.lru.remove(&tick);
        inner.memory_used -= size;
        inner.spillable_used -= size;
        self.budget.release(size);
        inner.count_memory(block_id.stream_id, size, false);
        debug!(block = %block_id, bytes = size, "spilled block to disk");
        Ok(true)
    }

    fn disk_for(&self, block_id: StreamBlockId, level: StorageLevel) -> Result<&DiskStore, ReceiverError> {
        self.disk.as_ref().ok_or(ReceiverError::NoDiskStore { block_id, level: level.to_string() })
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // Every update of `Inner` completes before anything can panic.
        lock(&self.inner)
    }
}

impl<T> Drop for BlockManager<T> {
    fn drop(&mut self) {
        // A shared budget outlives this manager: what it held is free again.
        let inner = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.budget.release(inner.memory_used);
        if let Some(spill) = &self.spill {
            spill.release(inner.entries.values().map(|entry| entry.disk_bytes).sum());
        }
    }
}

impl<T> Entry<T> {
    fn location(&self) -> BlockLocation {
        BlockLocation { in_memory: self.memory.is_some(), on_disk: self.on_disk }
    }
}

impl<T> Inner<T> {
    /// Marks `block_id` as just used and returns its new tick.
    fn touch(&mut self, block_id: StreamBlockId, previous: Option<u64>) -> u64 {
        if let Some(previous) = previous {
            self.lru.remove(&previous);
        }
        let tick = self.next_tick;
        self.next_tick += 1;
        self.lru.insert(tick, block_id);
        tick
    }

    /// Forgets the memory `entry` held and returns its bytes (0 for a block on disk only).
    fn forget_memory(&mut self, block_id: StreamBlockId, entry: &Entry<T>) -> u64 {
        let Some((_, size)) = &entry.memory else { return 0 };
        self.lru.remove(&entry.lru_tick);
        self.memory_used -= size;
        if entry.level.use_disk() {
            self.spillable_used -= size;
        }
        self.count_memory(block_id.stream_id, *size, false);
        *size
    }

    /// A block of `size` bytes of `stream` came into memory (`added`) or
    /// left it; sets that stream's gauges.
    fn count_memory(&mut self, stream: StreamId, size: u64, added: bool) {
        let (blocks, bytes) = self.per_stream.entry(stream).or_default();
        if added {
            *blocks += 1;
            *bytes += size;
        } else {
            *blocks = blocks.saturating_sub(1);
            *bytes = bytes.saturating_sub(size);
        }
        let label = stream.0.to_string();
        metrics::gauge!(BLOCKS_IN_MEMORY, "stream" => label.clone()).set(*blocks as f64);
        metrics::gauge!(BLOCK_BYTES_IN_MEMORY, "stream" => label).set(*bytes as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::ManualClock;

    fn block(stream: u32, unique_id: u64) -> StreamBlockId {
        StreamBlockId { stream_id: StreamId(stream), unique_id }
    }

    #[test]
    fn the_per_stream_gauges_follow_blocks_in_and_out_of_memory() {
        let clock = ManualClock::new(Time::from_millis(0));
        let bm: BlockManager<String> =
            BlockManager::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock)).unwrap();
        let data = |n: usize| BlockData::Bytes(Arc::new(vec![0u8; n]));
        bm.put(block(0, 1), data(100), StorageLevel::MEMORY_ONLY_SER).unwrap();
        bm.put(block(0, 2), data(50), StorageLevel::MEMORY_ONLY_SER).unwrap();
        bm.put(block(1, 1), data(10), StorageLevel::MEMORY_ONLY_SER).unwrap();
        let counts = |bm: &BlockManager<String>| bm.lock().per_stream.clone();
        assert_eq!(counts(&bm), BTreeMap::from([(StreamId(0), (2, 150)), (StreamId(1), (1, 10))]));
        assert!(bm.remove(block(0, 1)).unwrap());
        assert!(!bm.remove(block(0, 1)).unwrap());
        assert_eq!(counts(&bm), BTreeMap::from([(StreamId(0), (1, 50)), (StreamId(1), (1, 10))]));
        bm.remove_older_than(Time::from_millis(1)).unwrap();
        assert_eq!(counts(&bm), BTreeMap::from([(StreamId(0), (0, 0)), (StreamId(1), (0, 0))]));
    }
}
