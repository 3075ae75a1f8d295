//! The tracker's pure core: a deterministic state machine over
//! [`TrackerEvent`]s, free of I/O.
//!
//! The live tracker and recovery both change the state only through
//! [`TrackerState::apply`], so the state rebuilt from the log is, by
//! construction, the state the live tracker had after its last durable event.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use spate_core::{ReceivedBlockInfo, StreamBlockId, StreamId, Time, WalRecordHandle};
use tracing::warn;

use crate::event::{StreamBlocks, TrackerEvent};

/// The room a new unallocated queue starts with (blocks per stream per batch
/// are usually a handful: block interval over batch interval).
const QUEUE_START: usize = 16;

/// A block the tracker knows, with whether it was recovered from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackedBlock {
    info: ReceivedBlockInfo,
    recovered: bool,
}

/// Where a block's data can be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockLocation<'a> {
    /// In this process's block manager (the block was received since the
    /// tracker started). When the block also has a receiver WAL handle
    /// ([`TrackedBlock::info`]), that copy is the fallback.
    BlockManager(StreamBlockId),
    /// Only in the receiver write-ahead log: the block was recovered after a
    /// restart, and its in-memory copy died with the previous process.
    ReceiverWal(&'a WalRecordHandle),
    /// Nowhere: the block was recovered after a restart and was never written
    /// to the receiver write-ahead log. Its records are lost; treating it as
    /// empty would make every result that includes it wrong.
    Lost,
}

impl TrackedBlock {
    /// A block received by this process.
    pub fn live(info: ReceivedBlockInfo) -> Self {
        TrackedBlock { info, recovered: false }
    }

    /// What the receiver reported about the block.
    pub fn info(&self) -> &ReceivedBlockInfo {
        &self.info
    }

    /// The id of the block.
    pub fn block_id(&self) -> StreamBlockId {
        self.info.block_id()
    }

    /// True when the block was rebuilt from the event log after a restart.
    pub fn is_recovered(&self) -> bool {
        self.recovered
    }

    /// Where the block's data is to be read from.
    pub fn location(&self) -> BlockLocation<'_> {
        match (self.recovered, self.info.wal_handle()) {
            (false, _) => BlockLocation::BlockManager(self.info.block_id()),
            (true, Some(handle)) => BlockLocation::ReceiverWal(handle),
            (true, None) => BlockLocation::Lost,
        }
    }
}

/// The blocks of every stream allocated to one batch.
pub type AllocatedBlocks = BTreeMap<StreamId, Vec<TrackedBlock>>;

/// The tracker's state: the unallocated blocks of each stream, in arrival
/// order, and the blocks allocated to each live batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrackerState {
    /// Unallocated blocks by stream; a stream without blocks has no entry,
    /// so equal histories give equal maps.
    unallocated: BTreeMap<StreamId, VecDeque<TrackedBlock>>,
    allocated: BTreeMap<Time, AllocatedBlocks>,
    last_allocated: Option<Time>,
    /// The ids of every block queued or allocated to a live batch: an
    /// addition of a block already known is ignored. A receiver that retries
    /// after a failed (but, as it turned out, durable) write then cannot get
    /// its block into two batches.
    known_blocks: HashSet<StreamBlockId, BuildHasherDefault<BlockIdHasher>>,
}

impl TrackerState {
    /// The empty state of a tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one event. Deterministic: the same events in the same order
    /// give the same state.
    pub fn apply(&mut self, event: TrackerEvent) {
        match event {
            TrackerEvent::BlockAddition(info) => {
                if !self.known_blocks.insert(info.block_id()) {
                    warn!(block = %info.block_id(), "block added twice; the second addition is ignored");
                    return;
                }
                // Each allocation empties a stream's queue and the next addition
                // starts a new one: room for a few blocks saves the regrowth
                // that would otherwise come once per stream per batch.
                let queue =
                    self.unallocated.entry(info.stream_id).or_insert_with(|| VecDeque::with_capacity(QUEUE_START));
                queue.push_back(TrackedBlock::live(info));
            }
            TrackerEvent::BatchAllocation { time, blocks } => self.apply_allocation(time, blocks),
            TrackerEvent::BatchCleanup { times, last_allocated } => {
                for time in &times {
                    let cleaned = self.allocated.remove(time).unwrap_or_default();
                    for block in cleaned.values().flatten() {
                        self.known_blocks.remove(&block.block_id());
                    }
                }
                self.last_allocated = self.last_allocated.max(last_allocated);
            }
        }
    }

    fn apply_allocation(&mut self, time: Time, blocks: StreamBlocks) {
        let mut allocation = AllocatedBlocks::new();
        for (stream, infos) in blocks {
            self.known_blocks.extend(infos.iter().map(ReceivedBlockInfo::block_id));
            let queued = self.unallocated.remove(&stream).unwrap_or_default();
            let allocated = take_allocated(queued, infos, stream, &mut self.unallocated);
            allocation.insert(stream, allocated);
        }
        self.allocated.insert(time, allocation);
        self.last_allocated = self.last_allocated.max(Some(time));
    }

    /// The event that allocates every unallocated block to the batch at
    /// `time`, or `None` when `time` is at or before the last allocated batch
    /// (a batch re-run after recovery keeps the blocks it had).
    pub fn allocation_event(&self, time: Time) -> Option<TrackerEvent> {
        if self.last_allocated.is_some_and(|last| time <= last) {
            return None;
        }
        let blocks = self
            .unallocated
            .iter()
            .map(|(stream, queue)| (*stream, queue.iter().map(|b| b.info.clone()).collect()))
            .collect();
        Some(TrackerEvent::BatchAllocation { time, blocks })
    }

    /// The event that forgets every allocation older than `threshold`.
    pub fn cleanup_event(&self, threshold: Time) -> TrackerEvent {
        let times = self.allocated.range(..threshold).map(|(time, _)| *time).collect();
        TrackerEvent::BatchCleanup { times, last_allocated: self.last_allocated }
    }

    /// The blocks allocated to the batch at `time`, if it is allocated and
    /// not cleaned up.
    pub fn blocks_of_batch(&self, time: Time) -> Option<&AllocatedBlocks> {
        self.allocated.get(&time)
    }

    /// The live allocations, oldest first.
    pub fn allocated_batches(&self) -> impl Iterator<Item = (Time, &AllocatedBlocks)> {
        self.allocated.iter().map(|(time, blocks)| (*time, blocks))
    }

    /// The unallocated blocks of `stream`, in arrival order.
    pub fn unallocated_blocks(&self, stream: StreamId) -> impl Iterator<Item = &TrackedBlock> {
        self.unallocated.get(&stream).into_iter().flatten()
    }

    /// The blocks either side of `block` among the unallocated blocks of
    /// `stream` (before it, after it); `None` when `block` is not waiting
    /// for a batch. The next allocation takes every unallocated block in
    /// order, so two neighbours found here go to the same batch, one right
    /// after the other, whatever happens after the call.
    pub fn unallocated_neighbours(
        &self,
        stream: StreamId,
        block: StreamBlockId,
    ) -> Option<(Option<StreamBlockId>, Option<StreamBlockId>)> {
        let queue = self.unallocated.get(&stream)?;
        // A block asked about has usually just arrived: look from the back.
        let at = queue.iter().rposition(|queued| queued.block_id() == block)?;
        let before = at.checked_sub(1).map(|before| queue[before].block_id());
        Some((before, queue.get(at + 1).map(TrackedBlock::block_id)))
    }

    /// Every unallocated block, by stream then arrival order.
    pub fn all_unallocated_blocks(&self) -> impl Iterator<Item = &TrackedBlock> {
        self.unallocated.values().flatten()
    }

    /// True when some stream has blocks waiting for a batch.
    pub fn has_unallocated_blocks(&self) -> bool {
        self.unallocated.values().any(|queue| !queue.is_empty())
    }

    /// The time of the last batch blocks were allocated to.
    pub fn last_allocated_batch_time(&self) -> Option<Time> {
        self.last_allocated
    }

    /// Marks every block as recovered: after a restart their in-memory
    /// copies are gone, so their data must come from the receiver WAL.
    pub fn mark_recovered(&mut self) {
        let queued = self.unallocated.values_mut().flat_map(|queue| queue.iter_mut());
        let allocated = self.allocated.values_mut().flat_map(|streams| streams.values_mut().flatten());
        for block in queued.chain(allocated) {
            block.recovered = true;
        }
    }
}

/// A fast hash for block ids (two integers), which replay inserts once per
/// event. Block ids come from this engine's receivers, not from outside, so
/// a keyed hash buys nothing here.
#[derive(Default)]
pub(crate) struct BlockIdHasher(u64);

impl Hasher for BlockIdHasher {
    fn finish(&self) -> u64 {
        // Spread the high bits down: hashbrown picks buckets from the low ones.
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// Moves the blocks named by an allocation event out of a stream's queue,
/// keeping each block's recovered mark. Live, the event was built from the
/// queue, so both hold the same blocks; blocks the queue lacks (their
/// additions were in cleaned log segments) come from the event, and queued
/// blocks the event lacks stay unallocated.
fn take_allocated(
    queued: VecDeque<TrackedBlock>,
    infos: Vec<ReceivedBlockInfo>,
    stream: StreamId,
    unallocated: &mut BTreeMap<StreamId, VecDeque<TrackedBlock>>,
) -> Vec<TrackedBlock> {
    let same_blocks =
        queued.len() == infos.len() && queued.iter().zip(&infos).all(|(q, i)| q.block_id() == i.block_id());
    if same_blocks {
        return queued.into();
    }
    let mut recovered_marks: BTreeMap<StreamBlockId, bool> = BTreeMap::new();
    let mut left = VecDeque::new();
    let allocated_ids: std::collections::BTreeSet<StreamBlockId> = infos.iter().map(|i| i.block_id()).collect();
    for block in queued {
        if allocated_ids.contains(&block.block_id()) {
            recovered_marks.insert(block.block_id(), block.recovered);
        } else {
            left.push_back(block);
        }
    }
    if !left.is_empty() {
        warn!(%stream, blocks = left.len(), "allocation event leaves queued blocks of the stream unallocated");
        unallocated.insert(stream, left);
    }
    infos
        .into_iter()
        .map(|info| {
            let recovered = recovered_marks.get(&info.block_id()).copied().unwrap_or(false);
            TrackedBlock { info, recovered }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::BlockStoreResult;

    pub(crate) fn info(stream: u32, id: u64, with_handle: bool) -> ReceivedBlockInfo {
        let handle = with_handle.then(|| WalRecordHandle { segment: "log-0-1".into(), offset: id, length: 32 });
        ReceivedBlockInfo {
            stream_id: StreamId(stream),
            num_records: Some(id),
            metadata: None,
            store_result: BlockStoreResult {
                block_id: StreamBlockId::new(StreamId(stream), id),
                num_records: Some(id),
                wal_handle: handle,
            },
        }
    }

    fn t(ms: i64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn allocation_drains_every_stream_and_is_idempotent() {
        let mut state = TrackerState::new();
        state.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        state.apply(TrackerEvent::BlockAddition(info(1, 2, true)));
        state.apply(TrackerEvent::BlockAddition(info(0, 3, true)));
        let event = state.allocation_event(t(1000)).unwrap();
        state.apply(event);
        assert!(!state.has_unallocated_blocks());
        let batch = state.blocks_of_batch(t(1000)).unwrap();
        let ids: Vec<u64> = batch[&StreamId(0)].iter().map(|b| b.block_id().unique_id).collect();
        assert_eq!(ids, vec![1, 3]);
        assert_eq!(batch[&StreamId(1)].len(), 1);
        state.apply(TrackerEvent::BlockAddition(info(0, 4, true)));
        assert_eq!(state.allocation_event(t(1000)), None);
        assert_eq!(state.allocation_event(t(500)), None);
        assert!(state.allocation_event(t(2000)).is_some());
    }

    #[test]
    fn cleanup_forgets_old_batches_but_remembers_the_last_allocation() {
        let mut state = TrackerState::new();
        for time in [1000, 2000, 3000] {
            state.apply(TrackerEvent::BlockAddition(info(0, time as u64, false)));
            let event = state.allocation_event(t(time)).unwrap();
            state.apply(event);
        }
        let cleanup = state.cleanup_event(t(3000));
        assert_eq!(
            cleanup,
            TrackerEvent::BatchCleanup { times: vec![t(1000), t(2000)], last_allocated: Some(t(3000)) }
        );
        state.apply(cleanup.clone());
        assert!(state.blocks_of_batch(t(2000)).is_none());
        assert!(state.blocks_of_batch(t(3000)).is_some());
        // Replaying only the cleanup (older records deleted) still knows batch 3000 was allocated.
        let mut replayed = TrackerState::new();
        replayed.apply(cleanup);
        assert_eq!(replayed.last_allocated_batch_time(), Some(t(3000)));
    }

    #[test]
    fn a_block_added_twice_is_queued_once_until_its_batch_is_cleaned() {
        let mut state = TrackerState::new();
        state.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        state.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        assert_eq!(state.unallocated_blocks(StreamId(0)).count(), 1);
        let event = state.allocation_event(t(1000)).unwrap();
        state.apply(event);
        state.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        assert!(!state.has_unallocated_blocks(), "an allocated block came back");
        state.apply(state.cleanup_event(t(2000)));
        state.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        assert_eq!(state.unallocated_blocks(StreamId(0)).count(), 1);
    }

    #[test]
    fn allocation_without_its_additions_takes_blocks_from_the_event() {
        let mut live = TrackerState::new();
        live.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        let event = live.allocation_event(t(1000)).unwrap();
        let mut replayed = TrackerState::new();
        replayed.apply(event.clone());
        live.apply(event);
        assert_eq!(replayed, live);
    }

    #[test]
    fn recovered_blocks_are_read_from_the_wal_or_reported_lost() {
        let mut state = TrackerState::new();
        state.apply(TrackerEvent::BlockAddition(info(0, 1, true)));
        state.apply(TrackerEvent::BlockAddition(info(0, 2, false)));
        let block_locations = |s: &TrackerState| {
            s.unallocated_blocks(StreamId(0)).map(|b| format!("{:?}", b.location())).collect::<Vec<_>>()
        };
        assert!(block_locations(&state).iter().all(|l| l.starts_with("BlockManager")));
        state.mark_recovered();
        let locations = block_locations(&state);
        assert!(locations[0].starts_with("ReceiverWal"), "{locations:?}");
        assert_eq!(locations[1], "Lost");
        // The recovered mark survives allocation.
        let event = state.allocation_event(t(1000)).unwrap();
        state.apply(event);
        let batch = state.blocks_of_batch(t(1000)).unwrap();
        assert!(batch[&StreamId(0)].iter().all(TrackedBlock::is_recovered));
    }
}
