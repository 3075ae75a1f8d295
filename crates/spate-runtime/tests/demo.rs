//! The demo pipeline end to end on a manual clock: generator receiver with
//! the write-ahead log, windowed word count, exactly-once output checked
//! against the generator's seed, across an immediate stop and a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_runtime::demo::{DemoSettings, TopWords, demo_settings, verify_output, word_count_context};
use spate_runtime::{BackpressureSettings, RuntimeError, StreamingContext, StreamingSettings};

const TOTAL: u64 = 20_000;
const SEED: u64 = 42;

fn settings(clock: &ManualClock) -> StreamingSettings {
    demo_settings()
        .with_clock(Arc::new(clock.clone()))
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() })
}

fn options(out: &Path, windows: &Arc<Mutex<Vec<TopWords>>>) -> DemoSettings {
    let windows = Arc::clone(windows);
    DemoSettings {
        total_records: Some(TOTAL),
        output_dir: Some(out.to_path_buf()),
        on_top_words: Some(Arc::new(move |top: &TopWords| windows.lock().unwrap().push(top.clone()))),
        ..DemoSettings::new(SEED)
    }
}

/// Advances batch by batch until the output holds `records` words (or gives up).
fn run_until(ctx: &StreamingContext, clock: &ManualClock, out: &Path, records: u64) -> u64 {
    let first = ctx.last_committed().map_or(0, |b| b.0 + 1);
    for next in first..first + 300 {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(next), StdDuration::from_secs(30)), "{:?}", ctx.failure());
        if verify_output(out, SEED).map(|c| c.records).unwrap_or(0) >= records {
            break;
        }
    }
    verify_output(out, SEED).unwrap().records
}

#[test]
fn demo_output_matches_the_seed_and_windows_report_top_words() {
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let windows = Arc::new(Mutex::new(Vec::new()));
    let mut ctx = word_count_context(Some(dir.path()), settings(&clock), &options(out.path(), &windows)).unwrap();
    ctx.start().unwrap();
    assert_eq!(run_until(&ctx, &clock, out.path(), TOTAL), TOTAL);
    ctx.stop_handle().stop_gracefully();
    let report = ctx.await_termination().unwrap();
    assert!(report.graceful);
    let windows = windows.lock().unwrap();
    assert!(!windows.is_empty());
    // Windows slide every 2 s: only even batch times report.
    assert!(windows.iter().all(|w| w.batch_time.as_millis() % 2000 == 0));
    let last = windows.last().unwrap();
    assert!(last.words.len() <= 10 && last.words.windows(2).all(|w| w[0].1 >= w[1].1));
    // Everything the window saw is within the whole input.
    assert!(last.words.iter().map(|(_, n)| n).sum::<u64>() <= TOTAL);
}

#[test]
fn immediate_stop_and_restart_lose_and_repeat_nothing() {
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let windows = Arc::new(Mutex::new(Vec::new()));
    // 4 000 words per second of the manual clock: the stop comes mid-stream.
    let options = DemoSettings { rate: Some(4000), ..options(out.path(), &windows) };
    let mut ctx = word_count_context(Some(dir.path()), settings(&clock), &options).unwrap();
    ctx.start().unwrap();
    let first = run_until(&ctx, &clock, out.path(), TOTAL / 4);
    ctx.stop_handle().stop_now();
    let _ = ctx.await_termination();

    let mut ctx = word_count_context(Some(dir.path()), settings(&clock), &options).unwrap();
    let report = ctx.recovery().unwrap().clone();
    assert!(report.last_committed.is_some(), "{report}");
    assert!(
        report.restored_operators.is_empty() || report.restored_operators.iter().any(|o| o.name == "window-counts")
    );
    ctx.start().unwrap();
    let total = run_until(&ctx, &clock, out.path(), TOTAL);
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
    assert!(first < TOTAL);
    assert_eq!(total, TOTAL);
}

#[test]
fn a_source_faster_than_the_memory_budget_is_held_back_and_loses_nothing() {
    const WORDS: u64 = 1_000_000;
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let windows = Arc::new(Mutex::new(Vec::new()));
    // The generator hands over every word at once, as fast as it can; its
    // blocks (about 8 bytes a word with the WAL on) need several times
    // the budget. Before there was a budget to wait on, the receiver failed
    // here on the block manager's limit.
    let options = DemoSettings { total_records: Some(WORDS), ..options(out.path(), &windows) };
    let mut settings = settings(&clock);
    settings.max_memory_bytes = 2 << 20;
    let mut ctx = word_count_context(Some(dir.path()), settings, &options).unwrap();
    ctx.start().unwrap();
    assert_eq!(run_until(&ctx, &clock, out.path(), WORDS), WORDS);
    ctx.stop_handle().stop_gracefully();
    assert!(ctx.await_termination().unwrap().graceful);
    assert_eq!(verify_output(out.path(), SEED).unwrap().records, WORDS);
}

/// The names of the WAL segments (`log-…`) in `dir`.
fn segments(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("log-"))
        .collect()
}

#[test]
fn both_write_ahead_logs_check_the_writer_fence_and_name_segments_with_its_epoch() {
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let windows = Arc::new(Mutex::new(Vec::new()));
    let mut ctx = word_count_context(Some(dir.path()), settings(&clock), &options(out.path(), &windows)).unwrap();
    let epoch = ctx.recovery().unwrap().writer_epoch;
    assert_ne!(epoch, 0);
    ctx.start().unwrap();
    run_until(&ctx, &clock, out.path(), TOTAL / 4);
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
    // The receiver's WAL and the tracker's event log were opened with this
    // writer's fence: each segment it wrote carries its epoch.
    for log in ["receivedData/0", "receivedBlockMetadata"] {
        let names = segments(&dir.path().join(log));
        assert!(!names.is_empty(), "{log}: no segments");
        let suffix = format!("-e{epoch}");
        assert!(names.iter().all(|n| n.ends_with(&suffix)), "{log}: {names:?} not all of epoch {epoch}");
    }
}

/// Sends the id of each batch once its progress was reported (files written).
struct Reported(crossbeam::channel::Sender<BatchId>);

impl spate_runtime::ProgressListener for Reported {
    fn on_batch_completed(&self, progress: &spate_runtime::BatchProgress) {
        let _ = self.0.send(progress.batch_id);
    }
}

#[test]
fn a_receiver_job_whose_checkpoint_is_taken_over_stops_with_its_own_error() {
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let windows = Arc::new(Mutex::new(Vec::new()));
    let mut ctx = word_count_context(Some(dir.path()), settings(&clock), &options(out.path(), &windows)).unwrap();
    let (tx, reported) = crossbeam::channel::unbounded();
    ctx.add_progress_listener(Arc::new(Reported(tx)));
    ctx.start().unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(reported.recv_timeout(StdDuration::from_secs(30)).unwrap(), BatchId(0));
    // Another writer takes the checkpoint over; the next batch's first
    // write is the tracker's allocation, through its fenced event log.
    std::fs::remove_file(dir.path().join("LOCK")).unwrap();
    let _other =
        spate_logstore::Checkpoint::open_for_write(dir.path(), spate_logstore::CheckpointSettings::new()).unwrap();
    clock.advance(Duration::from_secs(1));
    let err = ctx.await_termination().unwrap_err();
    assert!(matches!(&err, RuntimeError::TakenOver { dir: d, .. } if d == dir.path()), "{err:?}");
    assert!(!dir.path().join("offsets/1").exists(), "the stale writer logged no batch");
}

#[test]
fn a_wal_directory_holds_the_logs_and_belongs_to_one_checkpoint() {
    let (dir, other, wal, out) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let windows = Arc::new(Mutex::new(Vec::new()));
    let with_wal = || settings(&clock).with_wal_dir(wal.path());
    let mut ctx = word_count_context(Some(dir.path()), with_wal(), &options(out.path(), &windows)).unwrap();
    ctx.start().unwrap();
    run_until(&ctx, &clock, out.path(), TOTAL / 4);
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
    for log in ["receivedData/0", "receivedBlockMetadata"] {
        assert!(!segments(&wal.path().join(log)).is_empty(), "{log}: no segments in the WAL directory");
        assert!(!dir.path().join(log).exists(), "{log} is in the checkpoint directory");
    }
    // Another checkpoint may not replay these logs.
    let err = word_count_context(Some(other.path()), with_wal(), &options(out.path(), &windows)).err().unwrap();
    assert!(matches!(err, RuntimeError::InvalidSetting { ref setting, .. } if setting == "wal_dir"), "{err}");
    assert!(err.to_string().contains("another checkpoint"), "{err}");
}
