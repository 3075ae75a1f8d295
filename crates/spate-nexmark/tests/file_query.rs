//! q10 (log to file system) run through a StreamingContext on a manual
//! clock, its rows written by `spate-files`' sink into minute partitions
//! (`dt=…/hm=…`) in a temporary directory, and the files checked against a
//! reference computed by brute force from the generator's events: every
//! bid once, with its date and minute worked out here by counting days,
//! in the directory of that date and minute.
//!
//! Once uninterrupted, and once with out-of-order events, the sink crashed
//! inside a batch's output, a restart, and a batch whose commit was lost
//! after its files were published run again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_files::{CheckpointFileManager, FileSink, FileSinkSettings, Partitioning, STAGING_DIR, WriteFiles};
use spate_logstore::{FaultMode, FaultPoint, FaultyFileManager, LocalFileManager};
use spate_nexmark::queries::{self, Q10Row};
use spate_nexmark::{GeneratorSettings, NexmarkGenerator, NexmarkSource};
use spate_runtime::{StreamingContext, StreamingSettings};

const WAIT: StdDuration = StdDuration::from_secs(120);
/// 2023-11-14T23:59:50Z: the 20 s of events cross minutes, an hour and a day.
const START: i64 = 1_700_006_390_000;
const EVENTS: u64 = 20_000;
/// 1,000 events a second: 20 batches of 1 s with events.
const RATE: f64 = 1_000.0;
/// The 20 batches with events and two after them.
const BATCHES: u64 = 22;

/// How the source of a run is set up.
#[derive(Clone, Copy)]
struct Setup {
    seed: u64,
    partitions: usize,
    /// Events are shuffled within groups of this many (1: in order).
    out_of_order_group: u32,
}

impl Setup {
    fn config(&self) -> GeneratorSettings {
        GeneratorSettings::new(self.seed, START)
            .with_rate(RATE)
            .with_max_events(EVENTS)
            .with_out_of_order_group_size(self.out_of_order_group)
    }

    fn source(&self) -> Arc<NexmarkSource> {
        Arc::new(NexmarkSource::new(NexmarkGenerator::new(self.config()).unwrap()).with_partitions(self.partitions))
    }
}

/// Runs `batches` in a new context on `checkpoint` whose q10 rows go to
/// `out` through `files`, one second of the clock each, then stops
/// gracefully (which may run one batch past the last awaited).
fn run(
    checkpoint: &Path,
    out: &Path,
    files: Arc<dyn CheckpointFileManager>,
    clock: &ManualClock,
    setup: Setup,
    batches: std::ops::Range<u64>,
) {
    let mut ctx = context(checkpoint, out, files, clock, setup);
    ctx.start().unwrap();
    for batch in batches {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", ctx.failure());
    }
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
}

fn context(
    checkpoint: &Path,
    out: &Path,
    files: Arc<dyn CheckpointFileManager>,
    clock: &ManualClock,
    setup: Setup,
) -> StreamingContext {
    let source = setup.source();
    let settings = StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()));
    // Small files, so that a batch's partition is cut into several.
    let sink_settings = FileSinkSettings::new().partitioned_by(Partitioning::Minute).max_file_bytes(32 << 10);
    let sink = FileSink::with_file_manager(out, sink_settings, files, Q10Row::event_time).unwrap();
    StreamingContext::get_or_create(checkpoint, settings, move |p| {
        let events = p.replayable_input("nexmark", Arc::clone(&source), Some(source.resume_hook()), None);
        queries::q10(&events).write_files(sink).name("q10");
        Ok(())
    })
    .unwrap()
}

/// The newest batch in `commits/`.
fn last_commit(checkpoint: &Path) -> u64 {
    let names = std::fs::read_dir(checkpoint.join("commits")).unwrap();
    names.filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok()).max().unwrap()
}

// ---------------------------------------------------------------------------
// The reference: plain Rust over the generator's events.

/// The UTC date of a time as `yyyy-MM-dd`, by counting days from the epoch.
fn date(ms: i64) -> String {
    let mut days = ms.div_euclid(86_400_000);
    let mut year = 1970;
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    while days >= if leap(year) { 366 } else { 365 } {
        days -= if leap(year) { 366 } else { 365 };
        year += 1;
    }
    let lengths = [31, if leap(year) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 0;
    while days >= lengths[month] {
        days -= lengths[month];
        month += 1;
    }
    format!("{year:04}-{:02}-{:02}", month + 1, days + 1)
}

/// The UTC hour and minute of a time as `HH:mm`.
fn hour_minute(ms: i64) -> String {
    let minutes = ms.rem_euclid(86_400_000) / 60_000;
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

/// q10's rows: every bid the generator makes, with its date and minute.
fn reference(setup: Setup) -> Vec<Q10Row> {
    let events = NexmarkGenerator::new(setup.config()).unwrap().events(0..EVENTS);
    let mut rows: Vec<Q10Row> = events
        .iter()
        .filter_map(|e| e.as_bid())
        .map(|b| Q10Row {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            date_time: b.date_time,
            extra: b.extra.clone(),
            dt: date(b.date_time),
            hm: hour_minute(b.date_time),
        })
        .collect();
    rows.sort();
    rows
}

// ---------------------------------------------------------------------------
// Reading the files as the sink's readers do.

/// Every data file under `root` (names not starting with `_` or `.`),
/// relative to it, with its rows.
fn data_files(root: &Path) -> Vec<(PathBuf, Vec<Q10Row>)> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in std::fs::read_dir(root.join(&relative)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if name.starts_with('_') || name.starts_with('.') {
                continue;
            }
            let path = relative.join(&name);
            if entry.file_type().unwrap().is_dir() {
                pending.push(path);
            } else {
                let text = std::fs::read_to_string(entry.path()).unwrap();
                let rows = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
                found.push((path, rows));
            }
        }
    }
    found
}

/// Asserts that the files under `out` hold exactly the reference's rows,
/// each in the directory of its date and minute, and nothing staged.
fn check(out: &Path, setup: Setup) {
    let expected = reference(setup);
    assert!(expected.len() > 10_000, "only {} bids", expected.len());
    let files = data_files(out);
    let mut written = Vec::new();
    let mut directories = BTreeSet::new();
    for (path, rows) in files {
        let directory = path.parent().unwrap().to_str().unwrap().to_string();
        assert!(path.extension().is_some_and(|e| e == "jsonl"), "{}", path.display());
        for row in &rows {
            let partition = format!("dt={}/hm={}", date(row.date_time), hour_minute(row.date_time).replace(':', "%3A"));
            assert_eq!(directory, partition, "{}: {row:?}", path.display());
        }
        directories.insert(directory);
        written.extend(rows);
    }
    // The run crosses midnight: two dates, and minutes on each.
    let dates: BTreeSet<&str> = directories.iter().filter_map(|d| d.split('/').next()).collect();
    assert_eq!(dates.len(), 2, "{directories:?}");
    assert!(directories.len() >= 2, "{directories:?}");
    written.sort();
    assert_eq!(written.len(), expected.len(), "rows written, rows of the reference");
    let missing: Vec<&Q10Row> = expected.iter().filter(|r| written.binary_search(r).is_err()).take(3).collect();
    assert!(written == expected, "the files do not hold each bid once; missing {missing:?}");
    let staging = out.join(STAGING_DIR);
    let staged = std::fs::read_dir(&staging).map(|d| d.count()).unwrap_or(0);
    assert_eq!(staged, 0, "{} still holds batches", staging.display());
}

const IN_ORDER: Setup = Setup { seed: 7, partitions: 3, out_of_order_group: 1 };

#[test]
fn q10_writes_every_bid_once_into_the_partition_of_its_minute() {
    let checkpoint = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    run(checkpoint.path(), out.path(), Arc::new(LocalFileManager), &clock, IN_ORDER, 0..BATCHES);
    check(out.path(), IN_ORDER);
}

#[test]
fn q10_writes_every_bid_once_across_a_sink_crash_a_restart_and_a_lost_commit() {
    // Events shuffled within groups of 3,000: up to 3 s out of order.
    let setup = Setup { seed: 11, partitions: 4, out_of_order_group: 3_000 };
    let checkpoint = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));

    // The sink's process dies halfway through writing a staged file of batch 6.
    let faulty = Arc::new(FaultyFileManager::new().losing_unsynced_data());
    let mut first = context(checkpoint.path(), out.path(), Arc::clone(&faulty) as _, &clock, setup);
    first.start().unwrap();
    for batch in 0..6 {
        clock.advance(Duration::from_secs(1));
        assert!(first.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", first.failure());
    }
    faulty.arm(FaultPoint::PartialTempWrite, FaultMode::Crash);
    clock.advance(Duration::from_secs(1));
    assert!(first.await_termination().is_err(), "the context went on after its sink crashed");
    assert!(faulty.has_crashed());
    assert!(!checkpoint.path().join("commits/6").exists());

    // Started again: batch 6 re-runs, then more; then the last batch's
    // commit is lost after its files were published, and it runs again.
    run(checkpoint.path(), out.path(), Arc::new(LocalFileManager), &clock, setup, 6..13);
    let last = last_commit(checkpoint.path());
    std::fs::remove_file(checkpoint.path().join(format!("commits/{last}"))).unwrap();
    run(checkpoint.path(), out.path(), Arc::new(LocalFileManager), &clock, setup, last..BATCHES);
    check(out.path(), setup);
}
