//! The block manager (memory budget, spill, refusal, cleanup) and both
//! block handlers, with the real file WAL and with test doubles.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use spate_core::{Clock, Duration, ManualClock, MemoryBudget, StreamBlockId, StreamId, Time, WalRecordHandle};
use spate_receiver::{
    BlockData, BlockManager, BlockManagerBasedBlockHandler, BlockManagerSettings, ReceivedBlock, ReceivedBlockHandler,
    ReceiverError, StorageLevel, WalHandlerSettings, WriteAheadLogBasedBlockHandler, encode_block, open_receiver_wal,
    read_block_from_wal, receiver_wal_dir,
};
use spate_wal::{FileWriteAheadLog, RecordIter, WalError, WalSettings, WriteAheadLog};

const STREAM: StreamId = StreamId(3);

fn id(n: u64) -> StreamBlockId {
    StreamBlockId::new(STREAM, n)
}

fn words(block: u64, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("b{block}-r{i}")).collect()
}

fn clock() -> ManualClock {
    ManualClock::new(Time::from_millis(1_000_000))
}

fn records(data: BlockData<String>) -> Vec<String> {
    data.records().unwrap().to_vec()
}

/// Serialized size of one block of `words(_, 100)`, to size budgets with.
fn block_bytes() -> u64 {
    encode_block(&words(0, 100)).unwrap().len() as u64
}

#[test]
fn memory_and_disk_blocks_spill_least_recently_used_first_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let budget = block_bytes() * 3 + block_bytes() / 2; // room for three blocks
    let config = BlockManagerSettings::with_disk(budget, dir.path().join("blocks"));
    let bm = BlockManager::<String>::open(config, Arc::new(clock())).unwrap();
    let level = StorageLevel::MEMORY_AND_DISK_SER;
    for b in 0..3 {
        let loc = bm.put(id(b), BlockData::Records(Arc::new(words(b, 100))), level).unwrap();
        assert!(loc.in_memory && !loc.on_disk);
    }
    // Block 0 is used, so block 1 is now the least recently used.
    assert_eq!(records(bm.get(id(0)).unwrap().unwrap()), words(0, 100));
    bm.put(id(3), BlockData::Records(Arc::new(words(3, 100))), level).unwrap();
    let spilled = bm.location(id(1)).unwrap();
    assert!(!spilled.in_memory && spilled.on_disk, "{spilled:?}");
    for b in [0, 2, 3] {
        assert!(bm.location(id(b)).unwrap().in_memory, "block {b}");
    }
    assert!(bm.memory_used() <= budget);
    // Every block reads back, the spilled one from RocksDB.
    for b in 0..4 {
        assert_eq!(bm.get_records(id(b)).unwrap().unwrap().as_slice(), words(b, 100).as_slice());
    }
    assert!(bm.remove(id(1)).unwrap());
    assert!(bm.get(id(1)).unwrap().is_none());
    assert!(!bm.remove(id(1)).unwrap());
}

#[test]
fn a_memory_only_block_larger_than_the_whole_budget_is_refused_clearly() {
    let budget = block_bytes() * 2;
    let bm = BlockManager::<String>::open(BlockManagerSettings::in_memory(budget), Arc::new(clock())).unwrap();
    bm.put(id(0), BlockData::Records(Arc::new(words(0, 100))), StorageLevel::MEMORY_ONLY_SER).unwrap();
    let err = bm.put(id(2), BlockData::Records(Arc::new(words(2, 300))), StorageLevel::MEMORY_ONLY_SER).unwrap_err();
    assert!(matches!(err, ReceiverError::MemoryBudgetExceeded { block_id, .. } if block_id == id(2)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("input-3-2") && message.contains("memory budget"), "{message}");
    // The block already there is untouched; the refused one is absent.
    assert_eq!(records(bm.get(id(0)).unwrap().unwrap()), words(0, 100));
    assert!(bm.get(id(2)).unwrap().is_none());
}

#[test]
fn memory_only_blocks_are_never_spilled_to_make_room_for_a_block_that_may_go_to_disk() {
    let budget = block_bytes() * 2;
    let dir = tempfile::tempdir().unwrap();
    let with_disk =
        BlockManager::<String>::open(BlockManagerSettings::with_disk(budget, dir.path()), Arc::new(clock())).unwrap();
    with_disk.put(id(0), BlockData::Records(Arc::new(words(0, 100))), StorageLevel::MEMORY_ONLY_SER).unwrap();
    with_disk.put(id(1), BlockData::Records(Arc::new(words(1, 100))), StorageLevel::MEMORY_ONLY_SER).unwrap();
    let loc = with_disk.put(id(2), BlockData::Records(Arc::new(words(2, 100))), StorageLevel::MEMORY_AND_DISK).unwrap();
    assert!(loc.on_disk && !loc.in_memory);
    assert!(with_disk.location(id(0)).unwrap().in_memory);
}

/// Spins (yielding) until `cond` holds: no sleep orders anything here.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        std::thread::yield_now();
    }
}

#[test]
fn a_memory_only_block_that_does_not_fit_waits_until_a_block_is_read_out() {
    let budget = Arc::new(MemoryBudget::new(block_bytes() * 2));
    let config = BlockManagerSettings::in_memory(0).with_shared_budget(Arc::clone(&budget));
    let bm = Arc::new(BlockManager::<String>::open(config, Arc::new(clock())).unwrap());
    for b in 0..2 {
        bm.put(id(b), BlockData::Records(Arc::new(words(b, 100))), StorageLevel::MEMORY_ONLY_SER).unwrap();
    }
    let third = {
        let bm = Arc::clone(&bm);
        std::thread::spawn(move || {
            bm.put(id(2), BlockData::Records(Arc::new(words(2, 100))), StorageLevel::MEMORY_ONLY_SER)
        })
    };
    eventually("the third block waits for room", || budget.waiting() == 1);
    assert!(bm.location(id(2)).is_none(), "a waiting block is not stored yet");
    // A batch reads block 0 out: its room goes to the waiting block.
    assert!(bm.remove(id(0)).unwrap());
    assert!(third.join().unwrap().unwrap().in_memory);
    assert_eq!(records(bm.get(id(2)).unwrap().unwrap()), words(2, 100));
    assert_eq!(budget.used(), bm.memory_used());
    assert_eq!(budget.waits(), 1);
}

#[test]
fn a_full_spill_area_holds_the_next_block_back_until_a_batch_reads_one_out() {
    let dir = tempfile::tempdir().unwrap();
    let spill = Arc::new(MemoryBudget::new(block_bytes() * 2));
    // Memory for one block, the spill area for two.
    let config = BlockManagerSettings::with_disk(block_bytes() + block_bytes() / 2, dir.path().join("blocks"))
        .with_spill_budget(Arc::clone(&spill));
    let bm = Arc::new(BlockManager::<String>::open(config, Arc::new(clock())).unwrap());
    let level = StorageLevel::MEMORY_AND_DISK_SER;
    for b in 0..3 {
        bm.put(id(b), BlockData::Records(Arc::new(words(b, 100))), level).unwrap();
    }
    assert_eq!(spill.used(), block_bytes() * 2, "blocks 0 and 1 spilled, counted against the spill area");
    let fourth = {
        let bm = Arc::clone(&bm);
        std::thread::spawn(move || bm.put(id(3), BlockData::Records(Arc::new(words(3, 100))), level))
    };
    eventually("the fourth block waits for room in the spill area", || spill.waiting() == 1);
    assert!(bm.location(id(3)).is_none(), "a waiting block is not stored yet");
    assert_eq!(spill.used(), block_bytes() * 2, "the spill area never passes its limit");
    // A batch reads the oldest block out of the spill area: the waiting block takes its room.
    assert!(bm.remove(id(0)).unwrap());
    let location = fourth.join().unwrap().unwrap();
    assert!(location.on_disk && !location.in_memory, "{location:?}");
    assert_eq!(records(bm.get(id(3)).unwrap().unwrap()), words(3, 100));
    assert_eq!((spill.used(), spill.waits()), (block_bytes() * 2, 1));
    drop(bm);
    assert_eq!(spill.used(), 0, "a dropped block manager gives its spill area back");
}

#[test]
fn a_block_larger_than_the_whole_spill_area_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let spill = Arc::new(MemoryBudget::new(block_bytes() / 2));
    let config = BlockManagerSettings::with_disk(block_bytes() / 2, dir.path()).with_spill_budget(Arc::clone(&spill));
    let bm = BlockManager::<String>::open(config, Arc::new(clock())).unwrap();
    let err =
        bm.put(id(0), BlockData::Records(Arc::new(words(0, 100))), StorageLevel::MEMORY_AND_DISK_SER).unwrap_err();
    assert!(matches!(err, ReceiverError::SpillAreaTooSmall { block_id, .. } if block_id == id(0)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&format!("spill limit of {} bytes", block_bytes() / 2)), "{message}");
    assert_eq!(spill.used(), 0);
}

#[test]
fn block_managers_sharing_a_budget_hold_each_other_back_and_give_it_back_when_dropped() {
    let budget = Arc::new(MemoryBudget::new(block_bytes() * 2));
    let open = || {
        let config = BlockManagerSettings::in_memory(0).with_shared_budget(Arc::clone(&budget));
        Arc::new(BlockManager::<String>::open(config, Arc::new(clock())).unwrap())
    };
    let (first, second) = (open(), open());
    for b in 0..2 {
        first.put(id(b), BlockData::Records(Arc::new(words(b, 100))), StorageLevel::MEMORY_ONLY_SER).unwrap();
    }
    let waiting = {
        let second = Arc::clone(&second);
        std::thread::spawn(move || {
            second.put(id(9), BlockData::Records(Arc::new(words(9, 100))), StorageLevel::MEMORY_ONLY_SER)
        })
    };
    eventually("the other manager's block waits", || budget.waiting() == 1);
    drop(first);
    assert!(waiting.join().unwrap().unwrap().in_memory);
    assert_eq!(budget.used(), second.memory_used());
}

#[test]
fn once_the_budget_stops_waiting_a_stopping_receivers_last_blocks_are_kept() {
    let budget = Arc::new(MemoryBudget::new(block_bytes()));
    let config = BlockManagerSettings::in_memory(0).with_shared_budget(Arc::clone(&budget));
    let bm = Arc::new(BlockManager::<String>::open(config, Arc::new(clock())).unwrap());
    bm.put(id(0), BlockData::Records(Arc::new(words(0, 100))), StorageLevel::MEMORY_ONLY_SER).unwrap();
    let last = {
        let bm = Arc::clone(&bm);
        std::thread::spawn(move || {
            bm.put(id(1), BlockData::Records(Arc::new(words(1, 100))), StorageLevel::MEMORY_ONLY_SER)
        })
    };
    eventually("the last block waits", || budget.waiting() == 1);
    budget.stop_waiting();
    assert!(last.join().unwrap().unwrap().in_memory);
    assert_eq!(records(bm.get(id(1)).unwrap().unwrap()), words(1, 100));
}

#[test]
fn disk_only_and_deserialized_levels_and_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let bm =
        BlockManager::<String>::open(BlockManagerSettings::with_disk(1 << 20, dir.path()), Arc::new(clock())).unwrap();
    let loc = bm.put(id(0), BlockData::Records(Arc::new(words(0, 10))), StorageLevel::DISK_ONLY).unwrap();
    assert!(loc.on_disk && !loc.in_memory);
    assert_eq!(bm.memory_used(), 0);
    assert_eq!(records(bm.get(id(0)).unwrap().unwrap()), words(0, 10));
    // A serialized block stored deserialized is decoded once, on put.
    let bytes = Arc::new(encode_block(&words(1, 10)).unwrap());
    bm.put(id(1), BlockData::Bytes(bytes), StorageLevel::MEMORY_ONLY).unwrap();
    assert!(matches!(bm.get(id(1)).unwrap().unwrap(), BlockData::Records(_)));
    let dup = bm.put(id(1), BlockData::Records(Arc::new(words(9, 1))), StorageLevel::MEMORY_ONLY).unwrap_err();
    assert!(matches!(dup, ReceiverError::DuplicateBlock { .. }));
    // Without a disk store, disk levels are refused by name.
    let no_disk = BlockManager::<String>::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock())).unwrap();
    let err = no_disk.put(id(0), BlockData::Records(Arc::new(words(0, 1))), StorageLevel::DISK_ONLY).unwrap_err();
    assert!(matches!(err, ReceiverError::NoDiskStore { .. }), "{err:?}");
}

#[test]
fn block_manager_handler_stores_and_cleans_old_blocks() {
    let clock = clock();
    let bm = Arc::new(
        BlockManager::<String>::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock.clone())).unwrap(),
    );
    let handler = BlockManagerBasedBlockHandler::new(Arc::clone(&bm), StorageLevel::MEMORY_ONLY);
    let first = handler.store_block(id(0), ReceivedBlock::Records(words(0, 5))).unwrap();
    assert_eq!((first.block_id, first.num_records, first.wal_handle), (id(0), Some(5), None));
    clock.advance(Duration::from_secs(10));
    let bytes = encode_block(&words(1, 7)).unwrap();
    let second = handler.store_block(id(1), ReceivedBlock::Serialized(bytes)).unwrap();
    assert_eq!(second.num_records, Some(7));
    handler.clean_old_blocks(Time::from_millis(1_005_000)).unwrap();
    assert!(bm.get(id(0)).unwrap().is_none());
    assert_eq!(records(bm.get(id(1)).unwrap().unwrap()), words(1, 7));
    // A serialized block that is not one is refused.
    let err = handler.store_block(id(2), ReceivedBlock::Serialized(b"not a block".to_vec())).unwrap_err();
    assert!(matches!(err, ReceiverError::Codec { .. }), "{err:?}");
}

fn wal_handler(
    checkpoint: &std::path::Path,
    clock: &ManualClock,
    level: StorageLevel,
) -> (Arc<BlockManager<String>>, Arc<FileWriteAheadLog>, WriteAheadLogBasedBlockHandler<String>) {
    let bm = Arc::new(BlockManager::open(BlockManagerSettings::in_memory(64 << 20), Arc::new(clock.clone())).unwrap());
    let wal =
        open_receiver_wal(checkpoint, STREAM, WalSettings::default().with_clock(Arc::new(clock.clone()))).unwrap();
    let config = WalHandlerSettings { wait_for_cleanup: true, ..WalHandlerSettings::default() };
    let handler = WriteAheadLogBasedBlockHandler::new(
        Arc::clone(&bm),
        wal.clone(),
        STREAM,
        level,
        config,
        Arc::new(clock.clone()),
    )
    .unwrap();
    (bm, wal, handler)
}

#[test]
fn handlers_give_back_the_buffer_of_a_block_they_keep_serialized_only() {
    let checkpoint = tempfile::tempdir().unwrap();
    let clock = clock();
    let (bm, wal, handler) = wal_handler(checkpoint.path(), &clock, StorageLevel::MEMORY_AND_DISK_SER_2);
    let (pending, spent) = handler.start_store_records(id(0), words(0, 40));
    let stored = pending.wait().unwrap();
    let spent = spent.expect("the WAL handler keeps bytes only");
    assert!(spent.is_empty() && spent.capacity() >= 40);
    let handle = stored.wal_handle.expect("a WAL handle");
    assert_eq!(read_block_from_wal::<String>(wal.as_ref(), STREAM, &handle).unwrap(), words(0, 40));
    assert_eq!(records(bm.get(id(0)).unwrap().unwrap()), words(0, 40));

    let bm = Arc::new(
        BlockManager::<String>::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock.clone())).unwrap(),
    );
    let serialized = BlockManagerBasedBlockHandler::new(Arc::clone(&bm), StorageLevel::MEMORY_AND_DISK_SER);
    let (pending, spent) = serialized.start_store_records(id(1), words(1, 8));
    assert_eq!(pending.wait().unwrap().num_records, Some(8));
    assert!(spent.is_some_and(|b| b.is_empty()));
    assert!(matches!(bm.get(id(1)).unwrap().unwrap(), BlockData::Bytes(_)));
    assert_eq!(records(bm.get(id(1)).unwrap().unwrap()), words(1, 8));
    // Records kept as they are: their buffer is the stored block.
    let deserialized = BlockManagerBasedBlockHandler::new(Arc::clone(&bm), StorageLevel::MEMORY_ONLY);
    let (pending, spent) = deserialized.start_store_records(id(2), words(2, 3));
    pending.wait().unwrap();
    assert!(spent.is_none());
    assert_eq!(records(bm.get(id(2)).unwrap().unwrap()), words(2, 3));
}

#[test]
fn wal_handler_blocks_survive_a_drop_without_close() {
    let checkpoint = tempfile::tempdir().unwrap();
    let clock = clock();
    let mut acknowledged: Vec<(WalRecordHandle, Vec<String>)> = Vec::new();
    {
        let (bm, _wal, handler) = wal_handler(checkpoint.path(), &clock, StorageLevel::MEMORY_AND_DISK_SER_2);
        assert_eq!(handler.storage_level(), StorageLevel::MEMORY_AND_DISK_SER);
        for b in 0..20 {
            let block = words(b, 50 + b as usize);
            let result = handler.store_block(id(b), ReceivedBlock::Records(block.clone())).unwrap();
            assert_eq!(result.num_records, Some(block.len() as u64));
            // Also in the block manager, serialized.
            assert!(matches!(bm.get(id(b)).unwrap().unwrap(), BlockData::Bytes(_)));
            acknowledged.push((result.wal_handle.expect("a WAL handle"), block));
            clock.advance(Duration::from_millis(200));
        }
        // Everything dropped here without `close`: as after a crash.
    }
    assert!(receiver_wal_dir(checkpoint.path(), STREAM).is_dir());
    let reopened = open_receiver_wal(checkpoint.path(), STREAM, WalSettings::default()).unwrap();
    for (handle, block) in &acknowledged {
        let back: Vec<String> = read_block_from_wal(reopened.as_ref(), STREAM, handle).unwrap();
        assert_eq!(&back, block, "{handle}");
    }
}

#[test]
fn wal_handler_cleans_blocks_and_segments_before_the_threshold() {
    let checkpoint = tempfile::tempdir().unwrap();
    let clock = clock();
    let (bm, wal, handler) = wal_handler(checkpoint.path(), &clock, StorageLevel::MEMORY_ONLY);
    let old = handler.store_block(id(0), ReceivedBlock::Records(words(0, 3))).unwrap();
    clock.advance(Duration::from_secs(120)); // past the 60 s rolling interval
    let new = handler.store_block(id(1), ReceivedBlock::Records(words(1, 3))).unwrap();
    assert_eq!(wal.segment_names().len(), 2);
    handler.clean_old_blocks(clock.now() - Duration::from_secs(1)).unwrap();
    assert_eq!(wal.segment_names().len(), 1);
    assert!(bm.get(id(0)).unwrap().is_none());
    assert!(handler.read_block(old.wal_handle.as_ref().unwrap()).is_err());
    assert_eq!(handler.read_block(new.wal_handle.as_ref().unwrap()).unwrap(), words(1, 3));
    handler.close().unwrap();
    let after_close = handler.store_block(id(2), ReceivedBlock::Records(words(2, 1)));
    assert!(after_close.is_err());
}

/// A WAL whose writes say they started, then wait until released, or
/// fail, as told.
struct StuckWal {
    release: Mutex<bool>,
    released: std::sync::Condvar,
    fail: bool,
    entered: crossbeam::channel::Sender<()>,
}

impl WriteAheadLog for StuckWal {
    fn write(&self, _record: &[u8], _time: Time) -> Result<WalRecordHandle, WalError> {
        let _ = self.entered.send(());
        if self.fail {
            return Err(WalError::Closed { dir: "stuck".into() });
        }
        let mut release = self.release.lock().unwrap();
        while !*release {
            release = self.released.wait(release).unwrap();
        }
        Ok(WalRecordHandle { segment: "log-0-1".into(), offset: 0, length: 1 })
    }
    fn read(&self, _handle: &WalRecordHandle) -> Result<Vec<u8>, WalError> {
        Err(WalError::Closed { dir: "stuck".into() })
    }
    fn read_all(&self) -> Result<RecordIter<'_>, WalError> {
        Ok(Box::new(std::iter::empty()))
    }
    fn clean(&self, _threshold: Time, _wait: bool) -> Result<(), WalError> {
        Ok(())
    }
    fn close(&self) -> Result<(), WalError> {
        Ok(())
    }
}

/// What a block stored on another thread answers.
type StoreAnswer = crossbeam::channel::Receiver<Result<spate_core::BlockStoreResult, ReceiverError>>;

/// A WAL handler over `bm` and `wal` with `config`, storing block 0 (three
/// words) on a thread of its own; the handler, and where the store answers.
fn store_in_background(
    bm: &Arc<BlockManager<String>>,
    wal: Arc<dyn WriteAheadLog>,
    config: WalHandlerSettings,
    clock: &ManualClock,
) -> (Arc<WriteAheadLogBasedBlockHandler<String>>, StoreAnswer) {
    let handler = Arc::new(
        WriteAheadLogBasedBlockHandler::<String>::new(
            Arc::clone(bm),
            wal,
            STREAM,
            StorageLevel::MEMORY_ONLY_SER,
            config,
            Arc::new(clock.clone()),
        )
        .unwrap(),
    );
    let (done_tx, done) = crossbeam::channel::bounded(1);
    let storing = Arc::clone(&handler);
    std::thread::spawn(move || done_tx.send(storing.store_block(id(0), ReceivedBlock::Records(words(0, 3)))));
    (handler, done)
}

/// Generous real time for a thread to answer: a hang fails the test.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

#[test]
fn wal_handler_times_out_on_its_clock_or_fails_and_keeps_nothing() {
    let clock = clock();
    // An hour: only the handler's (manual) clock can make it pass.
    let timeout = std::time::Duration::from_secs(3600);
    for fail in [false, true] {
        let bm =
            Arc::new(BlockManager::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock.clone())).unwrap());
        let (entered_tx, entered) = crossbeam::channel::unbounded();
        let wal = Arc::new(StuckWal {
            release: Mutex::new(false),
            released: std::sync::Condvar::new(),
            fail,
            entered: entered_tx,
        });
        let config =
            WalHandlerSettings { store_timeout: timeout, wait_for_cleanup: true, ..WalHandlerSettings::default() };
        let (handler, done) = store_in_background(&bm, wal.clone(), config, &clock);
        // The block is inside the WAL's write: its deadline is set.
        entered.recv_timeout(PATIENCE).expect("the WAL write started");
        if !fail {
            clock.advance(Duration::from_secs(3600));
        }
        let err = done.recv_timeout(PATIENCE).expect("the store returned").unwrap_err();
        if fail {
            assert!(matches!(err, ReceiverError::Wal { .. }), "{err:?}");
        } else {
            assert!(
                matches!(err, ReceiverError::WalTimeout { block_id, timeout_ms: 3_600_000 } if block_id == id(0)),
                "{err:?}"
            );
        }
        // Not acknowledged, so not kept in the block manager either.
        assert!(bm.get(id(0)).unwrap().is_none());
        *wal.release.lock().unwrap() = true;
        wal.released.notify_all();
        handler.close().unwrap();
    }
}

/// A fence whose writer is paused (waiting for its lease), telling the
/// test each time it is asked.
#[derive(Debug)]
struct PausedFence {
    asked: crossbeam::channel::Sender<()>,
}

impl spate_core::WriterFence for PausedFence {
    fn epoch(&self) -> u64 {
        1
    }
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    fn is_paused(&self) -> bool {
        let _ = self.asked.send(());
        true
    }
}

#[test]
fn a_block_waiting_for_the_lease_is_not_timed_out_and_is_stored_once_writes_go_on() {
    let clock = clock();
    let timeout = std::time::Duration::from_secs(30);
    let bm = Arc::new(BlockManager::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock.clone())).unwrap());
    let (entered_tx, entered) = crossbeam::channel::unbounded();
    let wal = Arc::new(StuckWal {
        release: Mutex::new(false),
        released: std::sync::Condvar::new(),
        fail: false,
        entered: entered_tx,
    });
    let (asked_tx, asked) = crossbeam::channel::unbounded();
    let fence = Arc::new(PausedFence { asked: asked_tx });
    let config = WalHandlerSettings { store_timeout: timeout, fence, ..WalHandlerSettings::default() };
    let (handler, done) = store_in_background(&bm, wal.clone(), config, &clock);
    entered.recv_timeout(PATIENCE).expect("the WAL write started");
    // The store is away far longer than the timeout while the lease waits.
    clock.advance(Duration::from_secs(3600));
    asked.recv_timeout(PATIENCE).expect("past its deadline, the store asks whether writes are paused");
    *wal.release.lock().unwrap() = true;
    wal.released.notify_all();
    let stored = done.recv_timeout(PATIENCE).expect("the store returned").unwrap();
    assert_eq!(stored.num_records, Some(3));
    assert!(bm.get(id(0)).unwrap().is_some());
    handler.close().unwrap();
}

#[test]
fn a_record_larger_than_the_wal_allows_is_refused_naming_the_limit() {
    let checkpoint = tempfile::tempdir().unwrap();
    let clock = clock();
    let bm = Arc::new(BlockManager::open(BlockManagerSettings::in_memory(64 << 20), Arc::new(clock.clone())).unwrap());
    let options = WalSettings::default().with_clock(Arc::new(clock.clone())).with_max_record_size(4096);
    let wal = open_receiver_wal(checkpoint.path(), STREAM, options).unwrap();
    let handler = WriteAheadLogBasedBlockHandler::new(
        Arc::clone(&bm),
        wal,
        STREAM,
        StorageLevel::MEMORY_AND_DISK_SER,
        WalHandlerSettings::default(),
        Arc::new(clock.clone()),
    )
    .unwrap();
    let err = handler.store_block(id(0), ReceivedBlock::Records(vec!["x".repeat(5000)])).unwrap_err();
    assert!(matches!(err, ReceiverError::RecordTooLargeForWal { max: 4096, .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("4096") && message.contains("max_record_size"), "{message}");
    let err = handler.store_block(id(1), ReceivedBlock::Records(vec!["y".repeat(1000); 5])).unwrap_err();
    assert!(matches!(err, ReceiverError::BlockTooLargeForWal { records: 5, max: 4096, .. }), "{err:?}");
    assert!(err.to_string().contains("max_block_bytes"), "{err}");
    assert!(bm.is_empty(), "refused blocks are not kept");
    // The log is not harmed: a block that fits goes on being stored.
    let stored = handler.store_block(id(2), ReceivedBlock::Records(words(2, 3))).unwrap();
    assert!(stored.wal_handle.is_some());
}

/// The permission bits of `path`.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_disk_store_refuses_a_directory_it_did_not_make_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("their-database");
    std::fs::create_dir(&theirs).unwrap();
    // Names RocksDB would delete when wiping a database, and a file of their own.
    std::fs::write(theirs.join("CURRENT"), b"MANIFEST-000001\n").unwrap();
    std::fs::write(theirs.join("000007.sst"), b"their data").unwrap();
    std::fs::write(theirs.join("notes.txt"), b"keep me").unwrap();
    let err =
        BlockManager::<String>::open(BlockManagerSettings::with_disk(1 << 20, &theirs), Arc::new(clock())).unwrap_err();
    assert!(matches!(err, ReceiverError::DiskDirNotOurs { entries: 3, .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("their-database") && message.contains("refusing to wipe"), "{message}");
    let mut left: Vec<String> =
        std::fs::read_dir(&theirs).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["000007.sst", "CURRENT", "notes.txt"]);
    assert_eq!(std::fs::read(theirs.join("000007.sst")).unwrap(), b"their data");
}

#[test]
fn the_disk_store_directory_is_owner_only_and_only_its_own_is_wiped_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill").join("blocks");
    let open = || BlockManager::<String>::open(BlockManagerSettings::with_disk(1 << 20, &spill), Arc::new(clock()));
    let bm = open().unwrap();
    assert_eq!(mode(&spill), 0o700, "a new spill directory is owner-only");
    bm.put(id(0), BlockData::Records(Arc::new(words(0, 10))), StorageLevel::DISK_ONLY).unwrap();
    drop(bm);
    // An earlier run's spill area is wiped and reused, and tightened if it was widened.
    std::fs::set_permissions(&spill, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bm = open().unwrap();
    assert!(bm.get(id(0)).unwrap().is_none(), "the earlier run's blocks are gone");
    assert_eq!(mode(&spill), 0o700);
    bm.put(id(1), BlockData::Records(Arc::new(words(1, 10))), StorageLevel::DISK_ONLY).unwrap();
    assert_eq!(records(bm.get(id(1)).unwrap().unwrap()), words(1, 10));
    drop(bm);
    // An existing empty directory is taken, and made owner-only.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    BlockManager::<String>::open(BlockManagerSettings::with_disk(1 << 20, &empty), Arc::new(clock())).unwrap();
    assert_eq!(mode(&empty), 0o700);
}
