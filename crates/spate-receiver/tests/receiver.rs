//! Receivers under a supervisor: records in equal records out under a rate
//! limit on a manual clock, restarts with backoff, clean stops, and the
//! socket receiver against real TCP peers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use crossbeam::channel::Receiver as Channel;
use spate_core::{Clock, Duration, ManualClock, ReceivedBlockInfo, StreamId, Time};
use spate_receiver::{
    BlockManager, BlockManagerBasedBlockHandler, BlockManagerSettings, GeneratorReceiver, GeneratorSettings,
    InvalidUtf8Policy, Receiver, ReceiverContext, ReceiverError, ReceiverState, ReceiverSupervisor, SocketSettings,
    SocketTextReceiver, StorageLevel, SupervisorSettings, WordGenerator,
};

const STREAM: StreamId = StreamId(1);
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

struct Harness {
    clock: ManualClock,
    blocks: Arc<BlockManager<String>>,
    infos: Channel<ReceivedBlockInfo>,
    supervisor: ReceiverSupervisor<String>,
}

impl Harness {
    fn start(receiver: impl Receiver<String>, tune: impl FnOnce(&mut SupervisorSettings)) -> Self {
        let clock = ManualClock::new(Time::from_millis(1_000_000));
        let blocks =
            Arc::new(BlockManager::open(BlockManagerSettings::in_memory(256 << 20), Arc::new(clock.clone())).unwrap());
        let handler = Arc::new(BlockManagerBasedBlockHandler::new(Arc::clone(&blocks), StorageLevel::MEMORY_ONLY));
        let (sink, infos) = crossbeam::channel::unbounded();
        let mut config = SupervisorSettings::new(STREAM);
        tune(&mut config);
        let supervisor =
            ReceiverSupervisor::start(receiver, config, handler, Arc::new(sink), Arc::new(clock.clone())).unwrap();
        Harness { clock, blocks, infos, supervisor }
    }

    /// Every record of every reported block, in report order.
    fn received(&self) -> (Vec<String>, Vec<ReceivedBlockInfo>) {
        let infos: Vec<ReceivedBlockInfo> = self.infos.try_iter().collect();
        let mut records = Vec::new();
        for info in &infos {
            let block = self.blocks.get_records(info.block_id()).unwrap().expect("reported block is stored");
            assert_eq!(info.num_records, Some(block.len() as u64));
            assert_eq!(info.stream_id, STREAM);
            records.extend(block.iter().cloned());
        }
        (records, infos)
    }

    fn wait_for(&self, pred: impl Fn(ReceiverState) -> bool) -> ReceiverState {
        self.supervisor.wait_for_state(pred, PATIENCE).expect("state reached")
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
fn records_in_equal_records_out_under_a_changing_rate_limit() {
    const TOTAL: u64 = 1000;
    const BATCH: u64 = 10;
    let mut config = GeneratorSettings::new(11);
    config.total_records = Some(TOTAL);
    config.batch_size = BATCH as usize;
    let receiver = GeneratorReceiver::new(config);
    let progress = receiver.progress();
    let h = Harness::start(receiver, |c| {
        c.block_generator.max_rate = Some(200);
        c.block_generator.initial_rate = Some(100);
    });
    assert_eq!(h.supervisor.rate_limit(), Some(100));
    let start = h.clock.now();
    // At 100 records/s a batch of 10 is admitted every 100 ms, the first at once:
    // by time t exactly (t / 100 + 1) batches are in, never one more.
    while progress.produced() < TOTAL / 2 {
        let elapsed = h.clock.now().since(start).as_millis();
        let allowed = ((elapsed / 100 + 1) * BATCH).min(TOTAL);
        eventually("the receiver uses its allowance", || progress.produced() >= allowed);
        // Every 200 ms block interval passed held records, so each was cut and stored.
        eventually(&format!("{} blocks cut by {elapsed} ms", elapsed / 200), || h.infos.len() as u64 >= elapsed / 200);
        assert_eq!(progress.produced(), allowed, "at {elapsed} ms");
        h.clock.advance(Duration::from_millis(50));
    }
    // Backpressure raises the limit while records flow; the maximum caps it.
    h.supervisor.set_rate_limit(Some(1_000_000));
    assert_eq!(h.supervisor.rate_limit(), Some(200));
    let (raised_at, produced_then) = (h.clock.now(), progress.produced());
    // The reservation made before the change still runs at the old rate.
    while progress.produced() < TOTAL {
        let elapsed = h.clock.now().since(raised_at).as_millis();
        let due = (produced_then + elapsed.saturating_sub(250) / 50 * BATCH).min(TOTAL);
        eventually("the receiver uses its raised allowance", || progress.produced() >= due);
        assert!(progress.produced() - produced_then <= elapsed * 200 / 1000 + 2 * BATCH, "at {elapsed} ms");
        h.clock.advance(Duration::from_millis(25));
    }
    let total_time = h.clock.now().since(start).as_millis();
    assert!(total_time < 9_000, "the raised limit took effect: {total_time} ms");
    h.wait_for(|s| s == ReceiverState::Finished);
    assert_eq!(progress.acknowledged(), TOTAL);
    h.supervisor.stop().unwrap();
    let (records, infos) = h.received();
    assert_eq!(records, WordGenerator::new(11).words(0, TOTAL as usize));
    assert!(infos.len() >= 24, "records crossed block boundaries: {} blocks", infos.len());
    assert!(infos.windows(2).all(|w| w[0].block_id() < w[1].block_id()));
    assert!(h.supervisor.errors().is_empty(), "{:?}", h.supervisor.errors());
}

/// Fails its first `fail_first` runs; later runs wait for the stop. Every run
/// stores one record and spawns a task that waits for the stop and one that never ends.
struct Flaky {
    fail_first: u64,
    runs: Arc<AtomicU64>,
    runs_ended: Arc<AtomicU64>,
    tasks_ended: Arc<AtomicU64>,
}

/// Counts when dropped: proves a future was dropped (cancelled or done).
struct DropCounter(Arc<AtomicU64>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Receiver<String> for Flaky {
    fn name(&self) -> String {
        "flaky".into()
    }

    async fn run(&mut self, ctx: ReceiverContext<String>) -> Result<(), ReceiverError> {
        let _ended = DropCounter(Arc::clone(&self.runs_ended));
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        ctx.store(format!("run-{run}"))?;
        let (waiter, guard) = (ctx.clone(), DropCounter(Arc::clone(&self.tasks_ended)));
        ctx.spawn(async move {
            waiter.stopped().await;
            drop(guard);
        });
        let guard = DropCounter(Arc::clone(&self.tasks_ended));
        ctx.spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        if run <= self.fail_first {
            return Err(ReceiverError::Receiver { receiver: "flaky".into(), message: format!("run {run} failed") });
        }
        ctx.flush()?;
        ctx.stopped().await;
        Ok(())
    }
}

fn flaky(fail_first: u64) -> (Flaky, Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (runs, runs_ended, tasks_ended) = (Arc::default(), Arc::default(), Arc::default());
    let receiver = Flaky {
        fail_first,
        runs: Arc::clone(&runs),
        runs_ended: Arc::clone(&runs_ended),
        tasks_ended: Arc::clone(&tasks_ended),
    };
    (receiver, runs, runs_ended, tasks_ended)
}

#[test]
fn failed_receiver_restarts_after_a_doubling_backoff_and_stops_cleanly() {
    let (receiver, runs, runs_ended, tasks_ended) = flaky(2);
    let h = Harness::start(receiver, |_| {});
    let t0 = h.clock.now();
    let first = h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    assert_eq!(first, ReceiverState::BackingOff { until: t0 + Duration::from_secs(2) });
    assert_eq!(h.supervisor.starts(), 1);
    // Both tasks of the failed run were joined before the backoff began.
    assert_eq!(tasks_ended.load(Ordering::SeqCst), 2);
    h.clock.advance(Duration::from_millis(1999));
    assert_eq!(h.supervisor.state(), first, "no restart before the backoff ends");
    h.clock.advance(Duration::from_millis(1));
    let second = h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }) && s != first);
    assert_eq!(second, ReceiverState::BackingOff { until: t0 + Duration::from_secs(2 + 4) });
    h.clock.advance(Duration::from_secs(4));
    eventually("third run", || runs.load(Ordering::SeqCst) == 3);
    assert_eq!(h.supervisor.state(), ReceiverState::Running);
    assert_eq!((runs.load(Ordering::SeqCst), h.supervisor.starts()), (3, 3));
    h.supervisor.stop().unwrap();
    assert_eq!(h.supervisor.state(), ReceiverState::Stopped);
    assert_eq!(runs_ended.load(Ordering::SeqCst), 3, "every run ended");
    assert_eq!(tasks_ended.load(Ordering::SeqCst), 6, "every task of every run was joined");
    let (records, _) = h.received();
    assert_eq!(records, vec!["run-1", "run-2", "run-3"], "nothing stored before a failure is lost");
    let errors = h.supervisor.errors();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("run 1 failed") && errors[1].contains("run 2 failed"), "{errors:?}");
}

#[test]
fn stop_during_backoff_does_not_wait_for_the_clock() {
    let (receiver, _, runs_ended, tasks_ended) = flaky(u64::MAX);
    let h = Harness::start(receiver, |c| c.restart_delay = Duration::from_secs(3600));
    h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    h.supervisor.stop().unwrap();
    assert_eq!(h.supervisor.state(), ReceiverState::Stopped);
    assert_eq!(h.supervisor.starts(), 1);
    assert_eq!((runs_ended.load(Ordering::SeqCst), tasks_ended.load(Ordering::SeqCst)), (1, 2));
    assert_eq!(h.received().0, vec!["run-1"]);
}

/// Asks for a restart once, then waits for the stop.
struct Restarting {
    runs: Arc<AtomicU64>,
}

#[async_trait]
impl Receiver<String> for Restarting {
    fn name(&self) -> String {
        "restarting".into()
    }

    async fn run(&mut self, ctx: ReceiverContext<String>) -> Result<(), ReceiverError> {
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            ctx.restart("source moved");
        }
        ctx.stopped().await;
        Ok(())
    }
}

#[test]
fn a_receiver_can_ask_to_be_restarted() {
    let runs = Arc::new(AtomicU64::new(0));
    let h = Harness::start(Restarting { runs: Arc::clone(&runs) }, |c| c.restart_delay = Duration::from_millis(100));
    h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    h.clock.advance(Duration::from_millis(100));
    eventually("second run", || runs.load(Ordering::SeqCst) == 2);
    h.supervisor.stop().unwrap();
    assert!(h.supervisor.errors()[0].contains("source moved"));
}

/// Runs a peer on 127.0.0.1 that sends `bytes` and closes; returns the address.
fn peer(bytes: &'static [u8]) -> (String, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let thread = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        socket.write_all(bytes).unwrap();
    });
    (address, thread)
}

fn socket_harness(config: SocketSettings) -> (Harness, Arc<spate_receiver::SocketStats>) {
    let receiver = SocketTextReceiver::new(config);
    let stats = receiver.stats();
    let h = Harness::start(receiver, |c| c.restart_delay = Duration::from_secs(3600));
    (h, stats)
}

#[test]
fn socket_lines_with_invalid_utf8_replaced_and_a_partial_last_line_dropped() {
    let (address, peer) = peer(b"alpha\nbeta\r\n\xff\xfegamma\n\ndelta\nparti");
    let (h, stats) = socket_harness(SocketSettings::new(address));
    h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    peer.join().unwrap();
    h.supervisor.stop().unwrap();
    let (records, _) = h.received();
    assert_eq!(records, vec!["alpha", "beta", "\u{fffd}\u{fffd}gamma", "", "delta"]);
    assert_eq!((stats.lines(), stats.replaced_lines(), stats.dropped_partial_lines()), (5, 1, 1));
    assert_eq!(stats.connections(), 1);
    let errors = h.supervisor.errors();
    assert!(errors.len() == 1 && errors[0].contains("closed the stream"), "{errors:?}");
}

#[test]
fn socket_invalid_utf8_fails_the_run_when_asked_naming_the_line() {
    let (address, peer) = peer(b"ok\nfine\n\xc3(\nafter\n");
    let mut config = SocketSettings::new(address);
    config.invalid_utf8 = InvalidUtf8Policy::Fail;
    let (h, stats) = socket_harness(config);
    h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    peer.join().unwrap();
    h.supervisor.stop().unwrap();
    assert_eq!(h.received().0, vec!["ok", "fine"]);
    assert_eq!(stats.lines(), 2);
    let errors = h.supervisor.errors();
    assert!(errors[0].contains("line 3") && errors[0].contains("byte 8") && errors[0].contains("UTF-8"), "{errors:?}");
}

#[test]
fn socket_line_longer_than_the_maximum_is_an_error_not_a_growing_buffer() {
    let (address, peer) = peer(b"short\nthis line is far too long\nnext\n");
    let mut config = SocketSettings::new(address);
    config.max_line_bytes = 8;
    let (h, _) = socket_harness(config);
    h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    peer.join().unwrap();
    h.supervisor.stop().unwrap();
    assert_eq!(h.received().0, vec!["short"]);
    assert!(h.supervisor.errors()[0].contains("maximum line length of 8"), "{:?}", h.supervisor.errors());
}

/// Stores blocks in a block manager and notes, for each, whether it came
/// as records made one by one or written in place (serialized).
struct FormNoting {
    inner: BlockManagerBasedBlockHandler<String>,
    serialized: Arc<std::sync::Mutex<Vec<bool>>>,
}

impl spate_receiver::ReceivedBlockHandler<String> for FormNoting {
    fn store_block(
        &self,
        block_id: spate_core::StreamBlockId,
        block: spate_receiver::ReceivedBlock<String>,
    ) -> Result<spate_core::BlockStoreResult, ReceiverError> {
        let serialized = matches!(block, spate_receiver::ReceivedBlock::Serialized(_));
        self.serialized.lock().unwrap().push(serialized);
        self.inner.store_block(block_id, block)
    }
    fn clean_old_blocks(&self, threshold: Time) -> Result<(), ReceiverError> {
        self.inner.clean_old_blocks(threshold)
    }
    fn storage_level(&self) -> StorageLevel {
        self.inner.storage_level()
    }
}

#[test]
fn socket_lines_are_written_into_blocks_in_place_not_made_into_strings() {
    // Lines split across reads (the peer writes in pieces) and lines many
    // to a read; a level that keeps records as they are, so a block of
    // lines made into `String`s would reach the handler as records.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let expected: Vec<String> = (0..5000).map(|i| format!("line {i} {}", "x".repeat(i % 50))).collect();
    let text: String = expected.iter().map(|line| format!("{line}\r\n")).collect();
    let peer = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        for piece in text.as_bytes().chunks(977) {
            socket.write_all(piece).unwrap();
        }
    });
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let blocks =
        Arc::new(BlockManager::open(BlockManagerSettings::in_memory(256 << 20), Arc::new(clock.clone())).unwrap());
    let serialized = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = Arc::new(FormNoting {
        inner: BlockManagerBasedBlockHandler::new(Arc::clone(&blocks), StorageLevel::MEMORY_ONLY),
        serialized: Arc::clone(&serialized),
    });
    let (sink, infos) = crossbeam::channel::unbounded();
    let mut config = SupervisorSettings::new(STREAM);
    config.restart_delay = Duration::from_secs(3600);
    let receiver = SocketTextReceiver::new(SocketSettings::new(address));
    let stats = receiver.stats();
    let supervisor =
        ReceiverSupervisor::start(receiver, config, handler, Arc::new(sink), Arc::new(clock.clone())).unwrap();
    supervisor.wait_for_state(|s| matches!(s, ReceiverState::BackingOff { .. }), PATIENCE).unwrap();
    peer.join().unwrap();
    supervisor.stop().unwrap();
    let mut received = Vec::new();
    for info in infos.try_iter() {
        received.extend(blocks.get_records(info.block_id()).unwrap().unwrap().iter().cloned());
    }
    assert_eq!(received, expected);
    assert_eq!((stats.lines(), stats.dropped_partial_lines()), (5000, 0));
    let forms = serialized.lock().unwrap();
    assert!(!forms.is_empty() && forms.iter().all(|s| *s), "every block written in place: {forms:?}");
}

#[test]
fn socket_receiver_reconnects_after_the_backoff() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let served = Arc::new(AtomicBool::new(false));
    let peer = {
        let served = Arc::clone(&served);
        std::thread::spawn(move || {
            for message in [&b"first\n"[..], b"second\n"] {
                let (mut socket, _) = listener.accept().unwrap();
                socket.write_all(message).unwrap();
            }
            served.store(true, Ordering::SeqCst);
        })
    };
    let receiver = SocketTextReceiver::new(SocketSettings::new(address));
    let stats = receiver.stats();
    let h = Harness::start(receiver, |c| c.restart_delay = Duration::from_secs(1));
    let first = h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }));
    h.clock.advance(Duration::from_secs(1));
    h.wait_for(|s| matches!(s, ReceiverState::BackingOff { .. }) && s != first);
    peer.join().unwrap();
    assert!(served.load(Ordering::SeqCst));
    h.supervisor.stop().unwrap();
    assert_eq!(h.received().0, vec!["first", "second"]);
    assert_eq!(stats.connections(), 2);
}

/// Fails the store of its `fail_at`-th block (from 1), storing the others.
struct FailingHandler {
    inner: BlockManagerBasedBlockHandler<String>,
    stores: AtomicU64,
    fail_at: u64,
}

impl spate_receiver::ReceivedBlockHandler<String> for FailingHandler {
    fn store_block(
        &self,
        block_id: spate_core::StreamBlockId,
        block: spate_receiver::ReceivedBlock<String>,
    ) -> Result<spate_core::BlockStoreResult, ReceiverError> {
        if self.stores.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
            return Err(ReceiverError::Receiver { receiver: "store".into(), message: "disk full".into() });
        }
        self.inner.store_block(block_id, block)
    }
    fn clean_old_blocks(&self, threshold: Time) -> Result<(), ReceiverError> {
        self.inner.clean_old_blocks(threshold)
    }
    fn storage_level(&self) -> StorageLevel {
        self.inner.storage_level()
    }
}

/// Stores three batches, flushing after each, and records what flush said.
struct Flushing {
    results: Arc<std::sync::Mutex<Vec<bool>>>,
}

#[async_trait]
impl Receiver<String> for Flushing {
    fn name(&self) -> String {
        "flushing".into()
    }

    async fn run(&mut self, ctx: ReceiverContext<String>) -> Result<(), ReceiverError> {
        for batch in 0..3 {
            ctx.store_many(vec![format!("batch-{batch}")])?;
            let flushed = ctx.flush();
            self.results.lock().unwrap().push(flushed.is_ok());
        }
        ctx.stopped().await;
        Ok(())
    }
}

#[test]
fn a_failed_block_fails_every_later_flush_so_nothing_is_acknowledged_wrongly() {
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let blocks =
        Arc::new(BlockManager::open(BlockManagerSettings::in_memory(1 << 20), Arc::new(clock.clone())).unwrap());
    let inner = BlockManagerBasedBlockHandler::new(Arc::clone(&blocks), StorageLevel::MEMORY_ONLY);
    let handler = Arc::new(FailingHandler { inner, stores: AtomicU64::new(0), fail_at: 2 });
    let (sink, infos) = crossbeam::channel::unbounded();
    let results = Arc::new(std::sync::Mutex::new(Vec::new()));
    let receiver = Flushing { results: Arc::clone(&results) };
    let supervisor = ReceiverSupervisor::start(
        receiver,
        SupervisorSettings::new(STREAM),
        handler,
        Arc::new(sink),
        Arc::new(clock.clone()),
    )
    .unwrap();
    eventually("three flushes", || results.lock().unwrap().len() == 3);
    supervisor.stop().unwrap();
    assert_eq!(*results.lock().unwrap(), vec![true, false, false]);
    let reported: Vec<u64> = infos.try_iter().map(|i| i.num_records.unwrap()).collect();
    assert_eq!(reported, vec![1, 1], "blocks 1 and 3 were stored and reported, block 2 was not");
    assert!(supervisor.errors().iter().any(|e| e.contains("disk full")), "{:?}", supervisor.errors());
}

/// A block generator (stream 0) that cuts a block every `records` records
/// (its timer, on a manual clock, never does).
fn generator_cutting_every(
    records: usize,
    listener: Arc<dyn spate_receiver::BlockGeneratorListener<String>>,
) -> spate_receiver::BlockGenerator<String> {
    let config = spate_receiver::BlockGeneratorSettings {
        block_interval: Duration::from_secs(3600),
        max_block_records: Some(records),
        ..Default::default()
    };
    let clock = Arc::new(ManualClock::new(Time::from_millis(0)));
    spate_receiver::BlockGenerator::start(StreamId(0), config, clock, listener).unwrap()
}

/// Starts blocks whose storing finishes only when the test opens their gate
/// (drops its sender), and notes every start, wait and finish, in the
/// pusher's order.
#[derive(Default)]
struct StepListener {
    events: Arc<std::sync::Mutex<Vec<String>>>,
    gates: std::sync::Mutex<std::collections::BTreeMap<u64, crossbeam::channel::Sender<()>>>,
}

impl spate_receiver::BlockGeneratorListener<String> for StepListener {
    fn on_push_block(&self, block_id: spate_core::StreamBlockId, records: Vec<String>) -> Result<(), ReceiverError> {
        self.start_push(block_id, records).wait()
    }

    fn start_push(&self, _: spate_core::StreamBlockId, records: Vec<String>) -> spate_receiver::Pending<()> {
        let index: u64 = records[0].parse().unwrap();
        let (gate, opened) = crossbeam::channel::bounded::<()>(0);
        self.gates.lock().unwrap().insert(index, gate);
        self.events.lock().unwrap().push(format!("start {index}"));
        let (done, events) = (opened.clone(), Arc::clone(&self.events));
        let finish = move || {
            events.lock().unwrap().push(format!("wait {index}"));
            let _ = opened.recv(); // until the gate is opened
            events.lock().unwrap().push(format!("finish {index}"));
            Ok(())
        };
        spate_receiver::Pending::with_done_signal(finish, done)
    }

    fn on_error(&self, _: ReceiverError) {}
}

#[test]
fn the_pusher_overlaps_a_few_blocks_and_finishes_them_in_order() {
    let listener = Arc::new(StepListener::default());
    let generator = generator_cutting_every(1, Arc::clone(&listener) as _);
    let events = || listener.events.lock().unwrap().clone();
    for i in 0..6 {
        generator.add_record(i.to_string()).unwrap();
    }
    // No block finishes until its gate opens: the pusher starts three, then
    // waits for the oldest, and cannot start a fourth meanwhile.
    eventually("three blocks started and the oldest waited for", || events().len() == 4);
    assert_eq!(events(), ["start 0", "start 1", "start 2", "wait 0"]);
    for i in 0..6u64 {
        eventually(&format!("block {i} started"), || listener.gates.lock().unwrap().contains_key(&i));
        listener.gates.lock().unwrap().remove(&i);
        eventually(&format!("block {i} finished"), || events().contains(&format!("finish {i}")));
    }
    generator.flush().unwrap();
    generator.stop().unwrap();
    let events = events();
    let finished: Vec<&str> = events.iter().filter_map(|e| e.strip_prefix("finish ")).collect();
    assert_eq!(finished, ["0", "1", "2", "3", "4", "5"], "{events:?}");
    let mut in_flight = 0i32;
    let mut most = 0;
    for event in &events {
        in_flight += i32::from(event.starts_with("start ")) - i32::from(event.starts_with("finish "));
        most = most.max(in_flight);
    }
    assert_eq!(most, 3, "{events:?}");
}

/// Starts blocks whose storing finishes only when the test drops their
/// gate, and which tell when they are done.
#[derive(Default)]
struct GatedListener {
    events: Arc<std::sync::Mutex<Vec<String>>>,
    gates: std::sync::Mutex<Vec<crossbeam::channel::Sender<()>>>,
}

impl spate_receiver::BlockGeneratorListener<String> for GatedListener {
    fn on_push_block(&self, block_id: spate_core::StreamBlockId, records: Vec<String>) -> Result<(), ReceiverError> {
        self.start_push(block_id, records).wait()
    }

    fn start_push(&self, _: spate_core::StreamBlockId, records: Vec<String>) -> spate_receiver::Pending<()> {
        let first = records[0].clone();
        let (gate, done) = crossbeam::channel::bounded::<()>(0);
        // The gate is in place before the start is noted: a test that sees
        // the start and drops the gates must drop this one too.
        self.gates.lock().unwrap().push(gate);
        self.events.lock().unwrap().push(format!("start {first}"));
        let (opened, events) = (done.clone(), Arc::clone(&self.events));
        let finish = move || {
            let _ = opened.recv(); // until the gate is dropped
            events.lock().unwrap().push(format!("finish {first}"));
            Ok(())
        };
        spate_receiver::Pending::with_done_signal(finish, done)
    }

    fn on_error(&self, _: ReceiverError) {}
}

#[test]
fn a_block_queued_while_the_oldest_is_being_stored_starts_at_once() {
    let listener = Arc::new(GatedListener::default());
    let generator = generator_cutting_every(1, Arc::clone(&listener) as _);
    let events = || listener.events.lock().unwrap().clone();
    generator.add_record("0".to_string()).unwrap();
    eventually("block 0 started", || events().len() == 1);
    // Block 0 is not done and nothing else is queued: the pusher must not
    // sit in block 0's wait when block 1 arrives.
    generator.add_record("1".to_string()).unwrap();
    eventually("block 1 started", || events().len() == 2);
    assert_eq!(events(), ["start 0", "start 1"]);
    listener.gates.lock().unwrap().clear();
    generator.flush().unwrap();
    generator.stop().unwrap();
    assert_eq!(events(), ["start 0", "start 1", "finish 0", "finish 1"]);
}

/// Notes where each block's records live and gives every buffer back.
#[derive(Default)]
struct ReusingListener {
    buffers: std::sync::Mutex<Vec<usize>>,
}

impl spate_receiver::BlockGeneratorListener<String> for ReusingListener {
    fn on_push_block(&self, _: spate_core::StreamBlockId, _: Vec<String>) -> Result<(), ReceiverError> {
        Ok(())
    }

    fn start_push_reusing(
        &self,
        _: spate_core::StreamBlockId,
        mut records: Vec<String>,
    ) -> (spate_receiver::Pending<()>, Option<Vec<String>>) {
        self.buffers.lock().unwrap().push(records.as_ptr() as usize);
        records.clear();
        (spate_receiver::Pending::ready(Ok(())), Some(records))
    }

    fn on_error(&self, _: ReceiverError) {}
}

#[test]
fn buffers_given_back_are_filled_again_by_later_blocks() {
    let listener = Arc::new(ReusingListener::default());
    let generator = generator_cutting_every(2, Arc::clone(&listener) as _);
    for block in 0..4 {
        generator.add_records(vec![format!("{block}a"), format!("{block}b")]).unwrap();
        generator.flush().unwrap();
    }
    generator.stop().unwrap();
    let buffers = listener.buffers.lock().unwrap().clone();
    assert_eq!(buffers.len(), 4, "{buffers:?}");
    // Block 1 was cut into a new buffer while block 0's was still out;
    // from then on the two alternate.
    assert_ne!(buffers[0], buffers[1]);
    assert_eq!(buffers[2], buffers[0], "{buffers:?}");
    assert_eq!(buffers[3], buffers[1], "{buffers:?}");
}

/// Counts the records of the blocks pushed to it.
#[derive(Default)]
struct CountingListener(AtomicU64);

impl spate_receiver::BlockGeneratorListener<String> for CountingListener {
    fn on_push_block(&self, _: spate_core::StreamBlockId, records: Vec<String>) -> Result<(), ReceiverError> {
        self.0.fetch_add(records.len() as u64, Ordering::SeqCst);
        Ok(())
    }

    fn on_error(&self, _: ReceiverError) {}
}

type Adder = fn(&spate_receiver::BlockGenerator<String>) -> Result<(), ReceiverError>;

#[test]
fn a_large_batch_under_a_low_limit_flows_in_slices_of_100_ms() {
    large_batch_flows_in_slices(|generator| generator.add_records((0..1000).map(|i| i.to_string()).collect()));
}

#[test]
fn records_filled_in_place_under_a_low_limit_flow_in_slices_of_100_ms() {
    large_batch_flows_in_slices(|generator| {
        let mut next = 0;
        generator.add_with(1000, |block, n| {
            block.extend((next..next + n).map(|i| i.to_string()));
            next += n;
        })
    });
}

fn large_batch_flows_in_slices(add: Adder) {
    let listener = Arc::new(CountingListener::default());
    let config = spate_receiver::BlockGeneratorSettings {
        block_interval: Duration::from_secs(3600),
        max_block_records: Some(1),
        initial_rate: Some(100),
        ..Default::default()
    };
    let clock = ManualClock::new(Time::from_millis(0));
    let generator = Arc::new(
        spate_receiver::BlockGenerator::start(StreamId(0), config, Arc::new(clock.clone()), Arc::clone(&listener) as _)
            .unwrap(),
    );
    let adder = {
        let generator = Arc::clone(&generator);
        std::thread::spawn(move || add(&generator))
    };
    // At 100 records/s, slices of 10 records: the first at once, then one
    // per 100 ms, rather than nothing until the whole batch's 10 s are up.
    let pushed = || listener.0.load(Ordering::SeqCst);
    eventually("the first slice", || pushed() >= 10);
    for step in 1..=3 {
        clock.advance(Duration::from_millis(100));
        eventually(&format!("slice {}", step + 1), || pushed() >= 10 * (step + 1));
    }
    // The adder has reserved the fifth slice (permits up to 495 ms) and
    // waits for 395 ms on the clock, which stays at 300 ms.
    let reserved = || generator.rate_limiter().reserved_until();
    eventually("the fifth slice reserved", || reserved() == Some(Time::from_millis(495)));
    assert_eq!(pushed(), 40, "no slice ahead of its time");
    generator.interrupt_adders();
    assert!(adder.join().unwrap().is_err(), "the interrupted adder reports it");
    generator.stop().unwrap();
}

/// Notes the records and serialized bytes of every block pushed to it.
#[derive(Default)]
struct SizingListener(std::sync::Mutex<Vec<(usize, usize)>>);

impl<T: spate_receiver::Record> spate_receiver::BlockGeneratorListener<T> for SizingListener {
    fn on_push_block(&self, _: spate_core::StreamBlockId, records: Vec<T>) -> Result<(), ReceiverError> {
        let bytes = spate_receiver::encode_block(&records).unwrap().len();
        self.0.lock().unwrap().push((records.len(), bytes));
        Ok(())
    }

    fn on_error(&self, _: ReceiverError) {}
}

/// Runs `add` on a generator of `config` that only its caps (and the end)
/// cut, and returns each block's records and bytes.
fn blocks_cut_by_caps<T: spate_receiver::Record>(
    config: spate_receiver::BlockGeneratorSettings,
    add: impl FnOnce(&spate_receiver::BlockGenerator<T>),
) -> Vec<(usize, usize)> {
    let listener = Arc::new(SizingListener::default());
    let config = spate_receiver::BlockGeneratorSettings { block_interval: Duration::from_secs(3600), ..config };
    let clock = Arc::new(ManualClock::new(Time::from_millis(0)));
    let generator =
        spate_receiver::BlockGenerator::start(StreamId(0), config, clock, Arc::clone(&listener) as _).unwrap();
    add(&generator);
    generator.flush().unwrap();
    generator.stop().unwrap();
    listener.0.lock().unwrap().clone()
}

/// 40 records of 512 KiB: 20 MiB, more than the default byte cap.
fn big_records() -> Vec<String> {
    (0..40).map(|i| char::from(b'a' + i as u8 % 26).to_string().repeat(512 << 10)).collect()
}

#[test]
fn blocks_are_cut_at_a_default_byte_cap_under_the_wal_record_limit() {
    let default = spate_receiver::BlockGeneratorSettings::default();
    assert!(default.block_bytes_cap() < u64::from(spate_wal::DEFAULT_MAX_RECORD_SIZE));
    let adders: [(&str, Adder); 4] = [
        ("add_records", |g| g.add_records(big_records())),
        ("add_record", |g| big_records().into_iter().try_for_each(|r| g.add_record(r))),
        ("add_with", |g| {
            let mut records = big_records().into_iter();
            g.add_with(40, |block, n| block.extend(records.by_ref().take(n)))
        }),
        ("add_in_place_with", |g| {
            let records = big_records();
            let mut next = records.iter();
            g.add_in_place_with(40, |block, n| next.by_ref().take(n).for_each(|r| block.push(r)))
        }),
    ];
    for (how, add) in adders {
        let blocks = blocks_cut_by_caps(spate_receiver::BlockGeneratorSettings::default(), |g| add(g).unwrap());
        assert_eq!(blocks.iter().map(|(n, _)| n).sum::<usize>(), 40, "{how}");
        assert!(blocks.len() >= 2, "{how}: {blocks:?}");
        for (records, bytes) in &blocks {
            assert!(
                *bytes as u64 <= spate_receiver::DEFAULT_MAX_BLOCK_BYTES + 64,
                "{how}: {records} records, {bytes} bytes"
            );
        }
    }
    // A user may raise the cap.
    let raised = spate_receiver::BlockGeneratorSettings::default().with_max_block_bytes(64 << 20);
    let blocks =
        blocks_cut_by_caps(raised, |g: &spate_receiver::BlockGenerator<String>| g.add_records(big_records()).unwrap());
    assert_eq!(blocks.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [40]);
}

#[test]
fn blocks_are_cut_at_a_default_record_cap() {
    let count = spate_receiver::DEFAULT_MAX_BLOCK_RECORDS + 10;
    let blocks = blocks_cut_by_caps(
        spate_receiver::BlockGeneratorSettings::default(),
        |g: &spate_receiver::BlockGenerator<u8>| g.add_records(vec![7u8; count]).unwrap(),
    );
    let sizes: Vec<usize> = blocks.iter().map(|(n, _)| *n).collect();
    assert_eq!(sizes, [spate_receiver::DEFAULT_MAX_BLOCK_RECORDS, 10]);
    let raised = spate_receiver::BlockGeneratorSettings::default().with_max_block_records(count);
    let blocks =
        blocks_cut_by_caps(raised, |g: &spate_receiver::BlockGenerator<u8>| g.add_records(vec![7u8; count]).unwrap());
    assert_eq!(blocks.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [count]);
}

/// Keeps every block pushed to it, as records, in the order pushed.
#[derive(Default)]
struct KeepingListener(std::sync::Mutex<Vec<Vec<String>>>);

impl spate_receiver::BlockGeneratorListener<String> for KeepingListener {
    fn on_push_block(&self, _: spate_core::StreamBlockId, records: Vec<String>) -> Result<(), ReceiverError> {
        self.0.lock().unwrap().push(records);
        Ok(())
    }

    fn on_error(&self, _: ReceiverError) {}
}

/// Keeps the bytes of every block the generator serialized itself.
#[derive(Default)]
struct SerializedListener(std::sync::Mutex<Vec<Vec<u8>>>);

impl spate_receiver::BlockGeneratorListener<String> for SerializedListener {
    fn on_push_block(&self, _: spate_core::StreamBlockId, _: Vec<String>) -> Result<(), ReceiverError> {
        panic!("records added in place arrive serialized")
    }

    fn start_push_serialized(&self, _: spate_core::StreamBlockId, bytes: Vec<u8>) -> spate_receiver::Pending<()> {
        self.0.lock().unwrap().push(bytes);
        spate_receiver::Pending::ready(Ok(()))
    }

    fn on_error(&self, _: ReceiverError) {}
}

fn generator_cut_by<L: spate_receiver::BlockGeneratorListener<String>>(
    listener: &Arc<L>,
    max_block_records: usize,
) -> spate_receiver::BlockGenerator<String> {
    let config = spate_receiver::BlockGeneratorSettings {
        block_interval: Duration::from_secs(3600),
        max_block_records: Some(max_block_records),
        ..Default::default()
    };
    let clock = Arc::new(ManualClock::new(Time::from_millis(0)));
    spate_receiver::BlockGenerator::start(StreamId(0), config, clock, Arc::clone(listener) as _).unwrap()
}

#[test]
fn records_added_in_place_are_blocks_in_the_wal_form_of_the_same_records() {
    let words: Vec<String> = (0..25).map(|i| format!("word-{i}-{}", "x".repeat(i % 7))).collect();
    let listener = Arc::new(SerializedListener::default());
    let generator = generator_cut_by(&listener, 10);
    let mut next = words.iter();
    generator.add_in_place_with(words.len(), |block, n| next.by_ref().take(n).for_each(|w| block.push(w))).unwrap();
    generator.flush().unwrap();
    generator.stop().unwrap();
    let blocks = listener.0.lock().unwrap().clone();
    let expected: Vec<Vec<u8>> = words.chunks(10).map(|c| spate_receiver::encode_block(c).unwrap()).collect();
    assert_eq!(blocks, expected);
}

#[test]
fn records_added_in_place_and_whole_keep_their_order() {
    let listener = Arc::new(KeepingListener::default());
    let generator = generator_cut_by(&listener, 4);
    let word = |i: usize| format!("w{i}");
    let mut expected = Vec::new();
    let mut i = 0;
    for round in 0..6 {
        // Alternate the ways of adding, with slices of different sizes, so
        // that each kind of add meets a block the other kind started.
        let n = 1 + round % 4;
        let batch: Vec<String> = (i..i + n).map(word).collect();
        match round % 3 {
            0 => generator.add_records(batch.clone()).unwrap(),
            1 => batch.iter().cloned().try_for_each(|w| generator.add_record(w)).unwrap(),
            _ => {
                let mut next = batch.iter();
                generator.add_in_place_with(n, |block, k| next.by_ref().take(k).for_each(|w| block.push(w))).unwrap()
            }
        }
        expected.extend(batch);
        i += n;
    }
    generator.flush().unwrap();
    generator.stop().unwrap();
    let blocks = listener.0.lock().unwrap().clone();
    assert!(blocks.iter().all(|b| !b.is_empty() && b.len() <= 4), "{blocks:?}");
    assert_eq!(blocks.concat(), expected);
}
