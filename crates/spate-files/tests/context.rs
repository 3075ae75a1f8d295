//! Nexmark's bids written through a real StreamingContext on a manual
//! clock, into minute partitions as q10 writes them, with the job's sink
//! crashed inside a batch, the context started again on its checkpoint,
//! and the last batch re-run after its commit is lost: the files hold every
//! bid exactly once, each in the partition of its event time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use common::{Steps, hidden_files, visible};
use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_files::{CheckpointFileManager, FileSink, FileSinkSettings, Partitioning, STAGING_DIR, WriteFiles};
use spate_logstore::LocalFileManager;
use spate_nexmark::{Bid, GeneratorSettings, NexmarkGenerator, NexmarkSource, queries};
use spate_runtime::{StreamingContext, StreamingSettings};

const WAIT: StdDuration = StdDuration::from_secs(60);
/// 2023-11-14T23:59:55Z: the ten seconds of events cross a minute, an hour and a day.
const START: i64 = 1_700_006_395_000;
const EVENTS: u64 = 10_000;

fn generator() -> NexmarkGenerator {
    NexmarkGenerator::new(GeneratorSettings::new(5, START).with_rate(1_000.0).with_max_events(EVENTS)).unwrap()
}

/// A context on `checkpoint` whose one output writes the bids under `out` through `files`.
fn context(
    checkpoint: &Path,
    out: &Path,
    clock: &ManualClock,
    files: Arc<dyn CheckpointFileManager>,
) -> StreamingContext {
    let source = Arc::new(NexmarkSource::new(generator()).with_partitions(3));
    let settings = StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()));
    let sink_settings = FileSinkSettings::new().partitioned_by(Partitioning::Minute).max_file_bytes(16 << 10);
    let sink =
        FileSink::with_file_manager(out, sink_settings, files, |bid: &Bid| Time::from_millis(bid.date_time)).unwrap();
    StreamingContext::get_or_create(checkpoint, settings, move |p| {
        let events = p.replayable_input("nexmark", Arc::clone(&source), Some(source.resume_hook()), None);
        queries::bids(&events).write_files(sink).name("bids-to-files");
        Ok(())
    })
    .unwrap()
}

/// Runs `batches`, each one second later on the clock, then stops.
fn run(mut ctx: StreamingContext, clock: &ManualClock, batches: std::ops::Range<u64>) {
    ctx.start().unwrap();
    for batch in batches {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", ctx.failure());
    }
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
}

/// The newest batch in `commits/` (a graceful stop may run one batch past the last awaited).
fn last_commit(checkpoint: &Path) -> u64 {
    let names = std::fs::read_dir(checkpoint.join("commits")).unwrap();
    names.filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok()).max().unwrap()
}

fn key(bid: &Bid) -> (i64, i64, i64, i64, String) {
    (bid.date_time, bid.auction, bid.bidder, bid.price, bid.extra.to_string())
}

#[test]
fn bids_survive_a_sink_crash_a_restart_and_a_lost_commit_exactly_once() {
    let mut expected: Vec<Bid> = generator().events(0..EVENTS).iter().filter_map(|e| e.as_bid().cloned()).collect();
    expected.sort_by_key(key);
    // The crash lands at each of the first steps of batch 4's output: staging, deciding, publishing.
    for crash_in in [0, 2, 4, 6, 8] {
        let checkpoint = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(START));
        let steps = Arc::new(Steps::new(Arc::new(LocalFileManager), usize::MAX));

        let mut first = context(checkpoint.path(), out.path(), &clock, Arc::clone(&steps) as _);
        first.start().unwrap();
        for batch in 0..4 {
            clock.advance(Duration::from_secs(1));
            assert!(first.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", first.failure());
        }
        steps.crash_in(crash_in);
        clock.advance(Duration::from_secs(1));
        let failed = first.await_termination();
        assert!(failed.is_err(), "crash in {crash_in}: the context went on: {failed:?}");
        assert!(steps.crashed(), "crash in {crash_in}");
        assert!(!checkpoint.path().join("commits/4").exists(), "crash in {crash_in}");

        // Started again: batch 4 re-runs, then the rest; then the last batch's commit is lost and it re-runs.
        run(context(checkpoint.path(), out.path(), &clock, Arc::new(LocalFileManager)), &clock, 4..13);
        let last = last_commit(checkpoint.path());
        std::fs::remove_file(checkpoint.path().join(format!("commits/{last}"))).unwrap();
        run(context(checkpoint.path(), out.path(), &clock, Arc::new(LocalFileManager)), &clock, last..last + 2);

        let files = visible::<Bid>(&LocalFileManager, out.path());
        for (path, bids) in &files {
            let directory = path.parent().unwrap().to_str().unwrap();
            for bid in bids {
                let partition = Partitioning::Minute.directory(Time::from_millis(bid.date_time));
                assert_eq!(directory, partition, "crash in {crash_in}: {}", path.display());
            }
        }
        let directories: std::collections::BTreeSet<_> = files.keys().map(|p| p.parent().unwrap()).collect();
        assert!(directories.len() >= 2, "crash in {crash_in}: {directories:?}");
        let mut written: Vec<Bid> = files.into_values().flatten().collect();
        written.sort_by_key(key);
        assert_eq!(written.len(), expected.len(), "crash in {crash_in}");
        assert!(written == expected, "crash in {crash_in}: the files do not hold each bid once");
        assert!(hidden_files(&LocalFileManager, out.path(), STAGING_DIR).is_empty(), "crash in {crash_in}");
    }
}
