//! A receiver pipeline (the demo's windowed word count with its WAL) on a
//! checkpoint in S3, against a real S3 server: the write-ahead logs stay in
//! a local WAL directory, which is required; an immediate stop and a
//! restart lose and repeat nothing; progress is read back from the store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use common::s3;
use spate::core::{BatchId, Duration, ManualClock, Time};
use spate::logstore::file_manager_for;
use spate::runtime::demo::{DemoSettings, demo_settings, verify_output, word_count_context};
use spate::runtime::{BackpressureSettings, RuntimeError, StreamingContext, StreamingSettings, read_progress};

const TOTAL: u64 = 20_000;
const SEED: u64 = 7;

fn settings(clock: &ManualClock) -> StreamingSettings {
    demo_settings()
        .with_clock(Arc::new(clock.clone()))
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() })
        .with_object_store(s3::settings())
}

fn options(out: &Path, rate: Option<u64>) -> DemoSettings {
    DemoSettings { total_records: Some(TOTAL), output_dir: Some(out.to_path_buf()), rate, ..DemoSettings::new(SEED) }
}

fn run_until(ctx: &StreamingContext, clock: &ManualClock, out: &Path, records: u64) -> u64 {
    let first = ctx.last_committed().map_or(0, |b| b.0 + 1);
    for next in first..first + 300 {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(next), StdDuration::from_secs(60)), "{:?}", ctx.failure());
        if verify_output(out, SEED).map(|c| c.records).unwrap_or(0) >= records {
            break;
        }
    }
    verify_output(out, SEED).unwrap().records
}

#[test]
fn a_receiver_pipeline_on_s3_needs_a_local_wal_directory() {
    let location = s3::fresh_location("no-wal-dir");
    let out = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let err = word_count_context(Some(&location), settings(&clock), &options(out.path(), None)).err().unwrap();
    assert!(matches!(err, RuntimeError::InvalidSetting { ref setting, .. } if setting == "wal_dir"), "{err}");
    assert!(err.to_string().contains("--wal-dir") && err.to_string().contains("s3://"), "{err}");
}

#[test]
fn an_immediate_stop_and_a_restart_on_s3_lose_and_repeat_nothing() {
    let location = s3::fresh_location("demo");
    let (wal, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let settings = || settings(&clock).with_wal_dir(wal.path());
    // 4 000 words per second of the manual clock: the stop comes mid-stream.
    let options = options(out.path(), Some(4000));
    let mut ctx = word_count_context(Some(&location), settings(), &options).unwrap();
    ctx.start().unwrap();
    let first = run_until(&ctx, &clock, out.path(), TOTAL / 4);
    ctx.stop_handle().stop_now();
    let _ = ctx.await_termination();

    let mut ctx = word_count_context(Some(&location), settings(), &options).unwrap();
    let report = ctx.recovery().unwrap().clone();
    assert!(report.last_committed.is_some(), "{report}");
    assert_eq!(report.writer_epoch, 2, "{report}");
    ctx.start().unwrap();
    let total = run_until(&ctx, &clock, out.path(), TOTAL);
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
    assert!(first < TOTAL);
    assert_eq!(total, TOTAL);

    // Progress lives in the store, with both writers' lines.
    let files = file_manager_for(&location, &s3::settings()).unwrap();
    let history = read_progress(files.as_ref(), &location).unwrap();
    let epochs: std::collections::BTreeSet<u64> = history.records.iter().map(|r| r.epoch).collect();
    assert_eq!(epochs.into_iter().collect::<Vec<_>>(), vec![1, 2], "{history:?}");
    assert_eq!(history.unreadable_lines, 0);
    assert!(files.list(&location).unwrap().iter().all(|name| name != "receivedData"), "the WAL is local");
}
