//! Tracker benchmarks: replay of a warm event log, and `add_block` from four
//! concurrent receivers on the real disk with group commit.
//!
//! Prints one `BENCH` line per figure with the bound measured in the same
//! run (replay: the 1 M events/s target; add_block: the disk's raw
//! fdatasync rate). Without `--bench` (as under `cargo test --all-targets`)
//! the setups shrink so the run takes a moment.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spate_core::{
    BlockStoreResult, Duration, ManualClock, ReceivedBlockInfo, StreamBlockId, StreamId, Time, WalRecordHandle,
};
use spate_tracker::ReceivedBlockTracker;
use spate_wal::{FaultInjection, SyncPolicy, WalSettings};

/// A directory on the real disk (not tmpfs), so syncs reach the device.
const BENCH_DIR: &str = "/var/tmp";
const STREAMS: u32 = 4;
const BLOCKS_PER_STREAM_PER_BATCH: u64 = 5;
const REPLAY_TARGET: f64 = 1_000_000.0;

fn full_run() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

fn block(stream: u32, id: u64) -> ReceivedBlockInfo {
    ReceivedBlockInfo {
        stream_id: StreamId(stream),
        num_records: Some(1000),
        metadata: None,
        store_result: BlockStoreResult {
            block_id: StreamBlockId::new(StreamId(stream), id),
            num_records: Some(1000),
            wal_handle: Some(WalRecordHandle { segment: "log-1000-61000".into(), offset: id * 4096, length: 4096 }),
        },
    }
}

fn scratch_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(name).tempdir_in(BENCH_DIR).unwrap()
}

/// Writes a log of `batches` batches (4 streams × 5 blocks, then the
/// allocation; every 10th batch a cleanup of the batches older than 500 ms)
/// to `checkpoint`; additions one per record, or the 20 of a batch in one
/// record. Returns the number of events.
///
/// The log is one segment (a long rolling interval), so the cleanups do not
/// delete it: replay reads every event, and the state stays the size a
/// running job's is.
fn write_log(checkpoint: &Path, batches: i64, grouped: bool) -> u64 {
    let clock = ManualClock::new(Time::from_millis(0));
    // The bytes on disk do not depend on the sync policy; skipping syncs
    // only makes the setup fast.
    let options = log_options();
    let (tracker, _) = ReceivedBlockTracker::open_with(Some(checkpoint), options, Arc::new(clock.clone())).unwrap();
    let mut id = 0;
    for batch in 1..=batches {
        let blocks: Vec<_> = (0..STREAMS)
            .flat_map(|stream| (0..BLOCKS_PER_STREAM_PER_BATCH).map(move |n| (stream, n)))
            .map(|(stream, _)| {
                id += 1;
                block(stream, id)
            })
            .collect();
        if grouped {
            assert!(tracker.add_blocks(&blocks));
        } else {
            assert!(blocks.into_iter().all(|b| tracker.add_block(b)));
        }
        clock.set(Time::from_millis(batch * 100));
        tracker.allocate_blocks_to_batch(clock_now(&clock)).unwrap();
        if batch % 10 == 0 {
            tracker.cleanup_old_batches(clock_now(&clock) - Duration::from_millis(500), false).unwrap();
        }
    }
    tracker.close().unwrap();
    tracker.stats().events_logged
}

fn clock_now(clock: &ManualClock) -> Time {
    spate_core::Clock::now(clock)
}

fn log_options() -> WalSettings {
    WalSettings::default().with_sync_policy(SyncPolicy::Never).with_rolling_interval(Duration::from_secs(24 * 3600))
}

/// Opens the tracker on `checkpoint` (replaying its log) and returns the
/// number of events replayed, and the tracker (dropped by the caller,
/// outside the timing).
fn replay(checkpoint: &Path) -> (u64, ReceivedBlockTracker) {
    let clock = Arc::new(ManualClock::new(Time::from_millis(0)));
    let (tracker, report) = ReceivedBlockTracker::open_with(Some(checkpoint), log_options(), clock).unwrap();
    (report.events, tracker)
}

fn median_rate(runs: usize, mut run: impl FnMut() -> (u64, ReceivedBlockTracker)) -> f64 {
    let mut rates: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let (events, tracker) = run();
            let rate = events as f64 / start.elapsed().as_secs_f64();
            drop(tracker);
            rate
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn bench_replay(c: &mut Criterion) {
    let batches = if full_run() { 20_000 } else { 50 };
    for (name, grouped) in [("tracker_replay", false), ("tracker_replay_grouped", true)] {
        let dir = scratch_dir(name);
        let events = write_log(dir.path(), batches, grouped);
        assert_eq!(replay(dir.path()).0, events); // warms the page cache
        let rate = median_rate(5, || replay(dir.path()));
        let shape = if grouped { "20 additions per record" } else { "one addition per record" };
        println!("# {name}: {events} events, {shape}, cleanups every 10 batches, log read from the page cache");
        println!("BENCH {name} {rate:.0} events/s bound={REPLAY_TARGET:.0} ratio={:.2}", rate / REPLAY_TARGET);
        let mut group = c.benchmark_group("tracker");
        group.throughput(Throughput::Elements(events));
        group.bench_function(name, |b| b.iter(|| replay(dir.path())));
        group.finish();
    }
}

/// The disk's raw rate of small appends each followed by `fdatasync`.
fn raw_fdatasync_rate(dir: &Path, syncs: u32) -> f64 {
    let mut file = std::fs::File::create(dir.join("raw-fdatasync")).unwrap();
    let start = Instant::now();
    for _ in 0..syncs {
        file.write_all(&[7u8; 128]).unwrap();
        file.sync_data().unwrap();
    }
    f64::from(syncs) / start.elapsed().as_secs_f64()
}

/// Four receiver threads each add `per_thread` blocks to a tracker whose log
/// syncs every write. Returns (events, fdatasyncs, elapsed).
fn concurrent_adds(checkpoint: &Path, per_thread: u64) -> (u64, u64, StdDuration) {
    let hook = FaultInjection::new();
    let clock = Arc::new(ManualClock::new(Time::from_millis(1000)));
    let options =
        WalSettings::default().with_fault_injection(hook.clone()).with_rolling_interval(Duration::from_secs(60));
    let (tracker, _) = ReceivedBlockTracker::open_with(Some(checkpoint), options, clock).unwrap();
    let tracker = Arc::new(tracker);
    let base = tracker.stats().events_logged;
    let syncs_before = hook.sync_count();
    let start = Instant::now();
    let threads: Vec<_> = (0..STREAMS)
        .map(|stream| {
            let tracker = Arc::clone(&tracker);
            std::thread::spawn(move || (0..per_thread).all(|n| tracker.add_block(block(stream, base + n))))
        })
        .collect();
    for thread in threads {
        assert!(thread.join().unwrap());
    }
    let elapsed = start.elapsed();
    let events = tracker.stats().events_logged - base;
    (events, hook.sync_count() - syncs_before, elapsed)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn bench_add_block(c: &mut Criterion) {
    let full = full_run();
    let dir = scratch_dir("tracker_add_block");
    // The disk is shared with other work and its fdatasync latency swings
    // with it, so raw syncs and tracker runs alternate, and the medians are
    // compared.
    let (rounds, raw_syncs, per_thread) = if full { (7, 200, 300) } else { (1, 10, 20) };
    let (mut raw_rates, mut event_rates, mut sync_rates) = (Vec::new(), Vec::new(), Vec::new());
    let (mut events, mut syncs) = (0, 0);
    for _ in 0..rounds {
        raw_rates.push(raw_fdatasync_rate(dir.path(), raw_syncs));
        let (round_events, round_syncs, elapsed) = concurrent_adds(dir.path(), per_thread);
        event_rates.push(round_events as f64 / elapsed.as_secs_f64());
        sync_rates.push(round_syncs as f64 / elapsed.as_secs_f64());
        events += round_events;
        syncs += round_syncs;
    }
    let (raw, event_rate, sync_rate) = (median(raw_rates), median(event_rates), median(sync_rates));
    println!(
        "# tracker_add_block: {STREAMS} threads, {rounds} round(s), {events} events, {syncs} fdatasyncs (counted by \
         the WAL's FaultInjection hook); {:.2} events per sync; raw fdatasync {raw:.0}/s in {BENCH_DIR} (medians)",
        events as f64 / syncs.max(1) as f64
    );
    println!(
        "BENCH tracker_add_block_4_receivers {event_rate:.0} events/s bound={raw:.0} ratio={:.2}",
        event_rate / raw
    );
    println!(
        "BENCH tracker_add_block_fdatasyncs {sync_rate:.0} fdatasyncs/s bound={raw:.0} ratio={:.2}",
        sync_rate / raw
    );
    let mut group = c.benchmark_group("tracker");
    group.throughput(Throughput::Elements(u64::from(STREAMS) * 25));
    group.bench_function("add_block_4_receivers", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| concurrent_adds(dir.path(), 25).2).sum())
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(StdDuration::from_millis(500))
        .measurement_time(StdDuration::from_secs(3));
    targets = bench_replay, bench_add_block
}
criterion_main!(benches);
