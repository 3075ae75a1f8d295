//! Incremental state checkpoints end to end, on a manual clock: a job whose
//! state is checkpointed as chains (a whole snapshot, then the changes
//! after it) and stopped, crashed between a snapshot's files and its
//! manifest, or restarted at any batch, gives exactly the outputs of a run
//! that was never interrupted, whatever `full_snapshot_every` is; and what a
//! purge leaves of each operator is one whole chain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::{Numbers, range_of};
use proptest::prelude::*;
use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::State;
use spate_logstore::{StateLink, split_state_file};
use spate_runtime::{
    BatchProgress, DEFAULT_FULL_SNAPSHOT_EVERY, PipelineBuilder, ProgressListener, RecoveryReport, StreamingContext,
    StreamingSettings,
};

const WAIT: StdDuration = StdDuration::from_secs(30);
const START: i64 = 1_000_000;
/// The operators whose state is checkpointed.
const STATEFUL: [&str; 3] = ["totals", "window", "sessions"];

/// One output row: a key, its value, and whether the key's state timed out.
type Row = (u64, u64, bool);

/// What each output wrote, by batch: the last time the batch ran wins (a
/// batch re-run after a crash must write what it wrote before).
type Outputs = Arc<Mutex<BTreeMap<(u64, &'static str), Vec<Row>>>>;

/// Running totals by key (`update_state_by_key`), sums over a 4 s window
/// sliding by 1 s (keyed windows) and sessions of keys that time out after
/// 2 s idle (`map_with_state`), each written by an output; all three
/// snapshot what changed.
fn pipeline(p: &mut PipelineBuilder, per_batch: u64, outputs: &Outputs) {
    let source = Numbers::new(per_batch);
    let resume = Arc::clone(&source);
    let numbers = p.replayable_input(
        "numbers",
        source,
        Some(Box::new(move |offsets: &str| {
            *resume.position.lock().unwrap() = range_of(offsets).1;
            Ok(())
        })),
        None,
    );
    let pairs = numbers.map(|n| (n % 7, n));
    let totals = pairs
        .update_state_by_key(|values: Vec<u64>, old: Option<u64>| Some(old.unwrap_or(0) + values.iter().sum::<u64>()))
        .name("totals");
    let window = pairs
        .reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(4), Duration::from_secs(1))
        .name("window");
    let sessions = numbers
        .map(|n| (n % 29, n))
        .map_with_state(
            |key: &u64, value: Option<u64>, state: &mut State<u64>| match value {
                Some(n) => {
                    let total = state.get().copied().unwrap_or(0) + n;
                    state.update(total);
                    (*key, total, false)
                }
                None => (*key, state.get().copied().unwrap_or(0), state.is_timing_out()),
            },
            Some(Duration::from_secs(2)),
        )
        .name("sessions")
        .mapped();
    let unflagged = |(key, value): (u64, u64)| (key, value, false);
    for (stream, name) in [(totals.map(unflagged), "totals"), (window.map(unflagged), "window"), (sessions, "sessions")]
    {
        let outputs = Arc::clone(outputs);
        stream
            .foreach_batch(move |batch, info| {
                let mut rows: Vec<Row> = batch.iter().copied().collect();
                rows.sort_unstable();
                outputs.lock().unwrap().insert((info.batch_id.0, name), rows);
                Ok(())
            })
            .name(&format!("{name}-out"));
    }
}

/// How a scenario checkpoints.
#[derive(Clone, Copy, Debug)]
struct Shape {
    per_batch: u64,
    full_snapshot_every: u64,
    /// Batches a checkpoint interval.
    checkpoint_every: u64,
    /// Where keyed state beyond a tiny memory budget goes, if it does.
    spill_to: Option<&'static Path>,
}

fn settings(clock: &ManualClock, shape: Shape) -> StreamingSettings {
    let settings = StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_checkpoint_interval(Duration::from_secs(shape.checkpoint_every))
        .with_full_snapshot_every(shape.full_snapshot_every);
    match &shape.spill_to {
        // A budget this small moves every keyed partition to disk at its first keys.
        Some(dir) => settings.with_max_memory_bytes(1024).with_spill_dir(dir),
        None => settings,
    }
}

/// Progress reports, as a listener hears them.
#[derive(Default)]
struct Heard(Mutex<Vec<BatchProgress>>, SpillWatch);

/// Whether keyed state was on disk, in a `spate-state-*` directory of
/// the spill directory, and window slices in a `spate-slices-*` one, as
/// each batch completed.
#[derive(Default)]
struct SpillWatch {
    dir: Option<&'static Path>,
    on_disk: Mutex<Vec<(bool, bool)>>,
}

impl ProgressListener for Heard {
    fn on_batch_completed(&self, progress: &BatchProgress) {
        self.0.lock().unwrap().push(progress.clone());
        if let Some(dir) = self.1.dir {
            let names: Vec<String> =
                std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            let one_of = |prefix: &str| names.iter().filter(|name| name.starts_with(prefix)).count() == 1;
            self.1.on_disk.lock().unwrap().push((one_of("spate-state-"), one_of("spate-slices-")));
        }
    }
}

/// One start of the job: runs until batch `until` committed, then stops
/// at once (what a kill after that batch leaves). Returns how it recovered.
fn run_until(
    dir: &Path,
    clock: &ManualClock,
    shape: Shape,
    until: u64,
    outputs: &Outputs,
    heard: &Arc<Heard>,
) -> RecoveryReport {
    let mut ctx = StreamingContext::get_or_create(dir, settings(clock, shape), |p| {
        pipeline(p, shape.per_batch, outputs);
        Ok(())
    })
    .unwrap();
    ctx.add_progress_listener(Arc::clone(heard) as Arc<dyn ProgressListener>);
    let report = ctx.recovery().unwrap().clone();
    ctx.start().unwrap();
    let mut next = report.resumed_at.0;
    // A batch re-run first commits without a tick.
    if let Some(rerun) = report.rerun_batch {
        assert!(ctx.await_committed(rerun, WAIT), "batch {rerun} did not commit: {:?}", ctx.failure());
    }
    while next <= until {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(next), WAIT), "batch {next} did not commit: {:?}", ctx.failure());
        next += 1;
    }
    ctx.stop_handle().stop_now();
    ctx.await_termination().unwrap();
    report
}

/// The outputs of batches 0..=last run without a stop.
fn uninterrupted(shape: Shape, last: u64) -> BTreeMap<(u64, &'static str), Vec<Row>> {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let outputs = Outputs::default();
    run_until(dir.path(), &clock, shape, last, &outputs, &Arc::default());
    let written = outputs.lock().unwrap().clone();
    assert_eq!(written.len() as u64, 3 * (last + 1), "every batch wrote every output");
    written
}

/// The batch the `graph` manifest names the state of.
fn named_state(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("graph")).unwrap();
    let body = bytes.splitn(2, |b| *b == b'\n').nth(1).unwrap();
    let graph: serde_json::Value = serde_json::from_slice(body).unwrap();
    graph["state_batch"].as_u64()
}

/// The batches of `operator`'s state files, ascending.
fn state_files(dir: &Path, operator: &str) -> Vec<u64> {
    let mut batches: Vec<u64> = std::fs::read_dir(dir.join("state").join(operator))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok()?.parse().ok())
        .collect();
    batches.sort_unstable();
    batches
}

fn link_of(dir: &Path, operator: &str, batch: u64) -> StateLink {
    let bytes = std::fs::read(dir.join(format!("state/{operator}/{batch}"))).unwrap();
    split_state_file(&bytes).unwrap().0
}

/// What is left of each operator's state is one chain: a whole snapshot,
/// then changes each on the file before, ending at the named snapshot.
fn assert_one_chain_each(dir: &Path) {
    let named = named_state(dir).expect("a snapshot is named");
    for operator in STATEFUL {
        let files = state_files(dir, operator);
        assert_eq!(files.last(), Some(&named), "{operator}: {files:?} ends at the named snapshot {named}");
        assert_eq!(link_of(dir, operator, files[0]), StateLink::Whole, "{operator}: {files:?} starts whole");
        for pair in files.windows(2) {
            let link = link_of(dir, operator, pair[1]);
            assert_eq!(link, StateLink::Changes { base: BatchId(pair[0]) }, "{operator}: {files:?}");
        }
    }
}

/// Copies every file under `from` into `to` where `to` has none of that name.
fn put_back(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from) else { return };
    std::fs::create_dir_all(to).unwrap();
    for entry in entries {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            put_back(&entry.path(), &target);
        } else if !target.exists() {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The checkpoint's `graph` and `state/` as they are now.
fn keep_copy(dir: &Path, copy: &Path) {
    std::fs::copy(dir.join("graph"), copy.join("graph")).unwrap();
    put_back(&dir.join("state"), &copy.join("state"));
}

/// Leaves the checkpoint as a crash between the state files of its last
/// snapshot and its manifest would have: `graph` names the snapshot it
/// named in `copy`, whose files (purged since) are back, and the newer
/// files stay, unnamed; of them, those of `lost` are gone too (the crash
/// came before they were written).
fn crash_before_manifest(dir: &Path, copy: &Path, lost: &[&str]) {
    let newest = named_state(dir).unwrap();
    std::fs::copy(copy.join("graph"), dir.join("graph")).unwrap();
    put_back(&copy.join("state"), &dir.join("state"));
    for operator in lost {
        std::fs::remove_file(dir.join(format!("state/{operator}/{newest}"))).unwrap();
    }
}

#[test]
fn a_restart_from_a_chain_gives_exactly_the_outputs_of_an_uninterrupted_run() {
    for full_snapshot_every in [1, 3, DEFAULT_FULL_SNAPSHOT_EVERY] {
        let shape = Shape { per_batch: 9, full_snapshot_every, checkpoint_every: 1, spill_to: None };
        let expected = uninterrupted(shape, 14);
        let timed_out = expected.iter().any(|((_, name), rows)| *name == "sessions" && rows.iter().any(|r| r.2));
        assert!(timed_out, "keys time out, so the sessions' changes remove state too");
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(START));
        let (outputs, heard) = (Outputs::default(), Arc::new(Heard::default()));
        let mut restored = Vec::new();
        for stop_after in [4, 9, 14] {
            let report = run_until(dir.path(), &clock, shape, stop_after, &outputs, &heard);
            restored.push(report.restored_operators);
            assert_one_chain_each(dir.path());
        }
        assert_eq!(*outputs.lock().unwrap(), expected, "full_snapshot_every {full_snapshot_every}");
        // Each restart restored every operator from the snapshot of the last batch before it.
        for (restart, batch) in restored.iter().skip(1).zip([4, 9]) {
            let changes: BTreeMap<&str, (BatchId, usize)> =
                restart.iter().map(|o| (o.name.as_str(), (o.snapshot_batch, o.changes_applied))).collect();
            // Each chain is a whole snapshot at the start's first batch and every
            // full_snapshot_every-th after it, then the changes up to the 5th.
            let chain = (4 % full_snapshot_every) as usize;
            let expected = BTreeMap::from([
                ("totals", (BatchId(batch), chain)),
                ("window", (BatchId(batch), chain)),
                ("sessions", (BatchId(batch), chain)),
            ]);
            assert_eq!(changes, expected, "full_snapshot_every {full_snapshot_every}");
        }
        let progress = heard.0.lock().unwrap();
        assert_eq!(progress.len(), 15);
        // Whole at the first checkpoint of each start (batches 0, 5, 10) and every
        // full_snapshot_every-th after it; the changes in between.
        for (batch, p) in progress.iter().enumerate() {
            let incremental = !(batch as u64 % 5).is_multiple_of(full_snapshot_every);
            assert!(p.state_checkpointed, "batch {batch}");
            assert_eq!(p.state_incremental, incremental, "batch {batch}, full_snapshot_every {full_snapshot_every}");
        }
        assert!(progress.iter().all(|p| p.state_bytes > 0));
    }
}

#[test]
fn a_crash_between_a_snapshots_files_and_its_manifest_restarts_from_the_snapshot_before() {
    for (full_snapshot_every, lost) in [(DEFAULT_FULL_SNAPSHOT_EVERY, &[][..]), (3, &["window"][..]), (1, &["totals"])]
    {
        let shape = Shape { per_batch: 5, full_snapshot_every, checkpoint_every: 1, spill_to: None };
        let expected = uninterrupted(shape, 11);
        let dir = tempfile::tempdir().unwrap();
        let copy = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(START));
        let (outputs, heard) = (Outputs::default(), Arc::new(Heard::default()));
        run_until(dir.path(), &clock, shape, 4, &outputs, &heard);
        keep_copy(dir.path(), copy.path());
        // Batch 5 commits and snapshots; the crash comes before `graph` names it.
        run_until(dir.path(), &clock, shape, 5, &outputs, &heard);
        crash_before_manifest(dir.path(), copy.path(), lost);
        let report = run_until(dir.path(), &clock, shape, 11, &outputs, &heard);
        assert!(report.restored_operators.iter().all(|o| o.snapshot_batch == BatchId(4)), "{report:?}");
        assert_eq!(report.replayed_for_state, [BatchId(5)], "batch 5 is replayed, not re-run: it committed");
        assert_eq!(*outputs.lock().unwrap(), expected, "full_snapshot_every {full_snapshot_every}, lost {lost:?}");
        assert_one_chain_each(dir.path());
    }
}

#[test]
fn a_chain_longer_than_the_checkpoint_interval_and_replays_after_it_recover_exactly() {
    // Snapshots every 2 batches, a whole one every 4th: restarts land between
    // snapshots, so each restore is followed by a replay of the batch after it.
    let shape = Shape { per_batch: 6, full_snapshot_every: 4, checkpoint_every: 2, spill_to: None };
    let expected = uninterrupted(shape, 20);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let (outputs, heard) = (Outputs::default(), Arc::new(Heard::default()));
    let mut replayed = Vec::new();
    for stop_after in [6, 12, 20] {
        let report = run_until(dir.path(), &clock, shape, stop_after, &outputs, &heard);
        replayed.extend(report.replayed_for_state);
    }
    assert_eq!(*outputs.lock().unwrap(), expected);
    // Batch times are odd multiples of a second at even batch ids: the
    // snapshots fall after odd batches, so 6 and 12 are replayed.
    assert_eq!(replayed, [BatchId(6), BatchId(12)]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Any checkpoint shape, any restart points, each a clean stop or a crash
    /// before the last snapshot's manifest: the outputs are exactly those
    /// of the uninterrupted run.
    #[test]
    fn restarts_anywhere_give_the_outputs_of_an_uninterrupted_run(
        per_batch in 1u64..12,
        full_snapshot_every in 1u64..5,
        checkpoint_every in 1u64..3,
        stops in proptest::collection::vec((1u64..9, any::<bool>()), 1..4),
    ) {
        let shape = Shape { per_batch, full_snapshot_every, checkpoint_every, spill_to: None };
        let last = stops.iter().map(|(gap, _)| gap).sum::<u64>() + 2;
        let expected = uninterrupted(shape, last);
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(START));
        let (outputs, heard) = (Outputs::default(), Arc::new(Heard::default()));
        let mut at = 0;
        for (gap, crash) in stops {
            let copy = tempfile::tempdir().unwrap();
            run_until(dir.path(), &clock, shape, at, &outputs, &heard);
            keep_copy(dir.path(), copy.path());
            at += gap;
            run_until(dir.path(), &clock, shape, at, &outputs, &heard);
            if crash && named_state(dir.path()) != named_state(copy.path()) {
                crash_before_manifest(dir.path(), copy.path(), &[]);
            }
            at += 1;
        }
        run_until(dir.path(), &clock, shape, last, &outputs, &heard);
        prop_assert_eq!(&*outputs.lock().unwrap(), &expected);
    }
}

#[test]
fn a_restart_whose_chain_lost_a_link_stops_naming_the_file_and_the_batch_that_needs_it() {
    let shape =
        Shape { per_batch: 4, full_snapshot_every: DEFAULT_FULL_SNAPSHOT_EVERY, checkpoint_every: 1, spill_to: None };
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    run_until(dir.path(), &clock, shape, 4, &Outputs::default(), &Arc::default());
    assert_eq!(state_files(dir.path(), "window"), [0, 1, 2, 3, 4], "a whole snapshot and four files of changes");
    std::fs::remove_file(dir.path().join("state/window/2")).unwrap();
    let Err(err) = StreamingContext::get_or_create(dir.path(), settings(&clock, shape), |p| {
        pipeline(p, shape.per_batch, &Outputs::default());
        Ok(())
    }) else {
        panic!("a chain without a link does not restore");
    };
    let text = err.to_string();
    assert!(
        text.contains("state/window/2 is missing") && text.contains("state/window/3 holds the changes since it"),
        "{text}"
    );
}

#[test]
fn keyed_state_and_window_slices_on_disk_restart_exactly_and_their_directories_go_with_the_context() {
    let plain = Shape { per_batch: 9, full_snapshot_every: 3, checkpoint_every: 1, spill_to: None };
    let expected = uninterrupted(plain, 14);
    let spill = tempfile::tempdir().unwrap();
    let spill_dir: &'static Path = Box::leak(spill.path().to_path_buf().into_boxed_path());
    let shape = Shape { spill_to: Some(spill_dir), ..plain };
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let outputs = Outputs::default();
    let heard = Arc::new(Heard(Mutex::default(), SpillWatch { dir: Some(spill_dir), on_disk: Mutex::default() }));
    for stop_after in [4, 9, 14] {
        run_until(dir.path(), &clock, shape, stop_after, &outputs, &heard);
        let left: Vec<_> = std::fs::read_dir(spill_dir).unwrap().collect();
        assert!(left.is_empty(), "the state's directory goes with the context: {left:?}");
    }
    assert_eq!(*outputs.lock().unwrap(), expected, "the same outputs with the state on disk");
    let on_disk = heard.1.on_disk.lock().unwrap();
    assert_eq!(on_disk.len(), 15);
    assert!(on_disk.iter().all(|(state, _)| *state), "the sessions' state was on disk after every batch: {on_disk:?}");
    assert!(
        on_disk.iter().all(|(_, slices)| *slices),
        "the window's slices were on disk after every batch: {on_disk:?}"
    );
}
