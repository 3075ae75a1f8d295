//! The memory of the generic receiver path: records stored as they are
//! leave the block generator encoded when blocks are stored serialized,
//! blocks are cut at a cap of their records' memory, and a receiver that
//! stores faster than batches read its blocks waits at the memory budget,
//! losing nothing. On a manual clock that never ticks: blocks are cut by
//! their caps and by `flush` only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use spate_core::{Duration, ManualClock, MemoryBudget, StreamBlockId, StreamId, Time};
use spate_receiver::{
    BlockGenerator, BlockGeneratorListener, BlockGeneratorSettings, BlockManager, BlockManagerBasedBlockHandler,
    BlockManagerSettings, Pending, Receiver, ReceiverContext, ReceiverError, ReceiverState, ReceiverSupervisor,
    StorageLevel, SupervisorSettings, decode_block,
};

const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// A block as the listener got it.
#[derive(Debug, PartialEq)]
enum Pushed {
    Records(Vec<String>),
    Serialized(Vec<String>),
}

/// Notes every block pushed; says it stores blocks serialized when asked to.
struct Noting {
    serialized: bool,
    blocks: Mutex<Vec<Pushed>>,
}

impl Noting {
    fn new(serialized: bool) -> Arc<Self> {
        Arc::new(Noting { serialized, blocks: Mutex::new(Vec::new()) })
    }

    fn records(&self) -> Vec<String> {
        let blocks = self.blocks.lock().unwrap();
        blocks
            .iter()
            .flat_map(|b| match b {
                Pushed::Records(r) | Pushed::Serialized(r) => r.clone(),
            })
            .collect()
    }
}

impl BlockGeneratorListener<String> for Noting {
    fn on_push_block(&self, _: StreamBlockId, records: Vec<String>) -> Result<(), ReceiverError> {
        self.blocks.lock().unwrap().push(Pushed::Records(records));
        Ok(())
    }

    fn start_push_serialized(&self, _: StreamBlockId, bytes: Vec<u8>) -> Pending<()> {
        self.blocks.lock().unwrap().push(Pushed::Serialized(decode_block(&bytes).unwrap()));
        Pending::ready(Ok(()))
    }

    fn stores_serialized(&self) -> bool {
        self.serialized
    }

    fn on_error(&self, _: ReceiverError) {}
}

fn generator(config: BlockGeneratorSettings, listener: Arc<Noting>) -> BlockGenerator<String> {
    let config = BlockGeneratorSettings { block_interval: Duration::from_secs(3600), ..config };
    BlockGenerator::start(StreamId(0), config, Arc::new(ManualClock::new(Time::from_millis(0))), listener).unwrap()
}

fn words(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("w{i}")).collect()
}

#[test]
fn records_stored_whole_leave_encoded_for_a_serialized_store_and_keep_their_order() {
    for serialized in [true, false] {
        let listener = Noting::new(serialized);
        let generator = generator(BlockGeneratorSettings::default().with_max_block_records(700), listener.clone());
        generator.add_records(words(0..1000)).unwrap();
        generator.add_record("one".to_string()).unwrap();
        let mut next = 0;
        generator
            .add_with(300, |block, n| {
                block.extend((next..next + n).map(|i| format!("v{i}")));
                next += n;
            })
            .unwrap();
        generator.flush().unwrap();
        generator.stop().unwrap();
        let mut expected = words(0..1000);
        expected.push("one".into());
        expected.extend((0..300).map(|i| format!("v{i}")));
        assert_eq!(listener.records(), expected, "serialized store: {serialized}");
        let blocks = listener.blocks.lock().unwrap();
        assert!(blocks.len() >= 2, "{} blocks", blocks.len());
        let encoded = blocks.iter().all(|b| matches!(b, Pushed::Serialized(_)));
        let whole = blocks.iter().all(|b| matches!(b, Pushed::Records(_)));
        assert!(if serialized { encoded } else { whole }, "serialized store {serialized}: {blocks:?}");
    }
}

#[test]
fn blocks_are_cut_at_the_memory_their_records_take_as_records() {
    // A short word is counted 24 + 32 bytes as a `String`: 100 fit in
    // 5,600 bytes, whatever their few encoded bytes.
    for serialized in [true, false] {
        let listener = Noting::new(serialized);
        let config = BlockGeneratorSettings::default().with_max_block_memory(5_600);
        let generator = generator(config, listener.clone());
        for start in (0..2_000).step_by(250) {
            generator.add_records(words(start..start + 250)).unwrap();
        }
        generator.flush().unwrap();
        generator.stop().unwrap();
        assert_eq!(listener.records(), words(0..2_000));
        let blocks = listener.blocks.lock().unwrap();
        let sizes: Vec<usize> = blocks
            .iter()
            .map(|b| match b {
                Pushed::Records(r) | Pushed::Serialized(r) => r.len(),
            })
            .collect();
        assert!(sizes.iter().all(|n| *n <= 100), "serialized store {serialized}: blocks of {sizes:?}");
        assert_eq!(sizes.len(), 20, "serialized store {serialized}: full blocks, {sizes:?}");
    }
}

/// Stores `total` words `store_many` at a time, then flushes.
struct Storing {
    total: usize,
}

#[async_trait]
impl Receiver<String> for Storing {
    fn name(&self) -> String {
        "storing".into()
    }

    async fn run(&mut self, ctx: ReceiverContext<String>) -> Result<(), ReceiverError> {
        for start in (0..self.total).step_by(500) {
            ctx.store_many(words(start..start + 500))?;
        }
        ctx.flush()
    }
}

/// Spins (yielding) until `cond` holds; panics after a long real-time wait.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        std::thread::yield_now();
    }
}

#[test]
fn a_receiver_storing_faster_than_batches_read_waits_at_the_budget_and_loses_nothing() {
    const TOTAL: usize = 20_000;
    let clock = Arc::new(ManualClock::new(Time::from_millis(1_000_000)));
    // A block is 1,000 words (about 5.9 KB encoded): two fit in the budget.
    let budget = Arc::new(MemoryBudget::new(16 << 10));
    let settings = BlockManagerSettings::in_memory(budget.limit()).with_shared_budget(Arc::clone(&budget));
    let blocks = Arc::new(BlockManager::open(settings, clock.clone()).unwrap());
    let handler = Arc::new(BlockManagerBasedBlockHandler::new(Arc::clone(&blocks), StorageLevel::MEMORY_ONLY_SER));
    let (sink, infos) = crossbeam::channel::unbounded();
    let mut config = SupervisorSettings::new(StreamId(0));
    config.block_generator = BlockGeneratorSettings {
        block_interval: Duration::from_secs(3600),
        queue_capacity: 2,
        ..BlockGeneratorSettings::default()
    }
    .with_max_block_records(1_000);
    let supervisor =
        ReceiverSupervisor::start(Storing { total: TOTAL }, config, handler, Arc::new(sink), clock).unwrap();

    // Nothing reads: the store waits for room, the queue fills, the receiver waits.
    eventually("a block waits for room in the budget", || budget.waiting() == 1);
    assert!(budget.used() <= budget.limit(), "{} bytes held of {}", budget.used(), budget.limit());
    assert_eq!(supervisor.state(), ReceiverState::Running, "the receiver is held back, not finished");
    let held_back = infos.len();
    assert!(held_back * 1_000 < TOTAL, "{held_back} blocks stored of {}", TOTAL / 1_000);

    // A batch reads blocks out as they come: every word arrives, in order.
    let mut received = Vec::new();
    while received.len() < TOTAL {
        let info: spate_core::ReceivedBlockInfo = infos.recv_timeout(PATIENCE).expect("the next block");
        let records = blocks.get_records(info.block_id()).unwrap().expect("a reported block is stored");
        received.extend(records.iter().cloned());
        blocks.remove(info.block_id()).unwrap();
        assert!(budget.used() <= budget.limit(), "{} bytes held of {}", budget.used(), budget.limit());
    }
    supervisor.wait_for_state(|s| s == ReceiverState::Finished, PATIENCE).unwrap();
    supervisor.stop().unwrap();
    assert_eq!(received, words(0..TOTAL));
    assert!(budget.waits() >= 1);
    assert_eq!(budget.used(), 0, "every block read out gave its room back");
}
