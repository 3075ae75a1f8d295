//! The file sink in a real S3 server (SeaweedFS: `cargo xtask test` starts
//! one; or `cargo xtask s3 start`, export what it prints, then `cargo test
//! -p spate-files --test s3`). Without a server the test fails, saying so.
//!
//! A sink opened on `s3://bucket/prefix` as a user opens it writes a batch
//! of objects under the hour partitions; a crash at each step of the next
//! batch, and the restart's re-run, leave every record in exactly one
//! object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Event, Steps, hidden_files, visible_records};
use spate_core::{BatchId, Time};
use spate_dstream::BatchInfo;
use spate_files::{BatchOutcome, CheckpointFileManager, FileSink, FileSinkSettings, STAGING_DIR};
use spate_logstore::{ObjectStoreSettings, file_manager_for};

/// 2026-12-05T18:00:00Z.
const HOUR_18: i64 = 1_796_493_600_000;

/// The server named by `SPATE_TEST_S3_ENDPOINT`, or a panic saying how to get one.
fn server() -> (ObjectStoreSettings, String) {
    let endpoint = std::env::var("SPATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SPATE_TEST_S3_ENDPOINT is not set: this test needs an S3 server. Run it with `cargo xtask test`, \
             or start one with `cargo xtask s3 start` and export what it prints"
        )
    });
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let settings = ObjectStoreSettings {
        endpoint: Some(endpoint),
        region: Some(var("AWS_REGION", "us-east-1")),
        access_key_id: Some(var("AWS_ACCESS_KEY_ID", "spate-test")),
        secret_access_key: Some(var("AWS_SECRET_ACCESS_KEY", "spate-test-secret")),
        allow_http: Some(true),
    };
    (settings, var("SPATE_TEST_S3_BUCKET", "spate-test"))
}

/// A location no other test (or earlier run) uses.
fn fresh_location(bucket: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    PathBuf::from(format!("s3://{bucket}/tests/files-{}-{n}-{nanos}", std::process::id()))
}

/// Batch `n`: 30 events over three hours.
fn batch(n: u64) -> (BatchInfo, Vec<Event>) {
    let events =
        (0..30).map(|i| Event { id: n * 1000 + i, at: HOUR_18 + (i as i64 % 3) * 3_600_000 + i as i64 }).collect();
    (BatchInfo { time: Time::from_millis(HOUR_18 + 10_800_000 + n as i64 * 1000), batch_id: BatchId(n) }, events)
}

fn event_time(e: &Event) -> Time {
    Time::from_millis(e.at)
}

#[test]
fn batches_in_s3_are_published_exactly_once_across_crashes_at_every_step() {
    let (settings, bucket) = server();
    let sink_settings = || FileSinkSettings::new().max_file_bytes(100).object_store(settings.clone());

    // As a user opens it: the location alone, the client from the settings.
    let location = fresh_location(&bucket);
    let sink = FileSink::open(&location, sink_settings(), event_time).unwrap();
    assert!(sink.is_object_store());
    let (info0, events0) = batch(0);
    let BatchOutcome::Published(manifest) = sink.write_batch(&events0, info0).unwrap() else { panic!() };
    assert!(manifest.files.len() >= 6, "{manifest:?}");
    assert!(manifest.files[0].path.starts_with("dt=2026-12-05/hour=18/part-1796504400000-0-"));
    let files = file_manager_for(&location, &settings).unwrap();
    assert_eq!(visible_records(files.as_ref(), &location), events0);
    let steps_of_a_batch = {
        let counting = Arc::new(Steps::new(Arc::clone(&files), usize::MAX));
        let (info1, events1) = batch(1);
        let counted = FileSink::with_file_manager(&location, sink_settings(), Arc::clone(&counting) as _, event_time);
        counted.unwrap().write_batch(&events1, info1).unwrap();
        counting.taken()
    };

    for at in 0..steps_of_a_batch {
        let location = fresh_location(&bucket);
        let files: Arc<dyn CheckpointFileManager> = file_manager_for(&location, &settings).unwrap();
        let crashing = Arc::new(Steps::new(Arc::clone(&files), at));
        let crashed = FileSink::with_file_manager(&location, sink_settings(), Arc::clone(&crashing) as _, event_time);
        assert!(crashed.unwrap().write_batch(&events0, info0).is_err(), "step {at}");
        assert!(crashing.crashed(), "step {at}");
        let restarted = FileSink::open(&location, sink_settings(), event_time).unwrap();
        restarted.write_batch(&events0, info0).unwrap();
        assert_eq!(visible_records(files.as_ref(), &location), events0, "step {at}");
        assert!(hidden_files(files.as_ref(), &location, STAGING_DIR).is_empty(), "step {at}");
        assert_eq!(restarted.published().unwrap().len(), 1, "step {at}");
    }
}
