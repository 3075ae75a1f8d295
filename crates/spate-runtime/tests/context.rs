//! End-to-end tests of a StreamingContext on a manual clock: the order of
//! the offsets and commit logs around outputs, recovery, the writer lock,
//! upgrades and concurrent jobs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::{Numbers, range_of};
use serde_json::json;
use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::{BatchLimits, BoxError, InputSource};
use spate_logstore::{Checkpoint, CheckpointSettings, CommitMetadata, OffsetSeq, SourceOffset};
use spate_runtime::{
    BatchProgress, PipelineBuilder, ProgressListener, RuntimeError, StreamingContext, StreamingSettings,
};

const WAIT: StdDuration = StdDuration::from_secs(30);
const START: i64 = 1_000_000;

fn settings(clock: &ManualClock) -> StreamingSettings {
    StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()))
}

fn numbers_input(p: &mut PipelineBuilder, source: &Arc<Numbers>) -> spate_dstream::DStream<u64> {
    let resume = Arc::clone(source);
    p.replayable_input(
        "numbers",
        Arc::clone(source),
        Some(Box::new(move |offsets: &str| {
            *resume.position.lock().unwrap() = range_of(offsets).1;
            Ok(())
        })),
        None,
    )
}

/// One batch an output saw.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    batch: BatchId,
    time: Time,
    records: Vec<u64>,
}

type SeenLog = Arc<Mutex<Vec<Seen>>>;
type TotalsLog = Arc<Mutex<Vec<(BatchId, Vec<(u64, u64)>)>>>;

fn tick(clock: &ManualClock, ctx: &StreamingContext, batch: u64) {
    clock.advance(Duration::from_secs(1));
    assert!(ctx.await_committed(BatchId(batch), WAIT), "batch {batch} did not commit: {:?}", ctx.failure());
}

fn stop(ctx: StreamingContext) {
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
}

#[test]
fn offsets_are_durable_before_outputs_and_commits_only_after_all_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let source = Numbers::new(5);
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let checks = Arc::new(Mutex::new(0u32));
    let root = dir.path().to_path_buf();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        let numbers = numbers_input(p, &source);
        for output in ["first", "second"] {
            let (violations, checks, root) = (Arc::clone(&violations), Arc::clone(&checks), root.clone());
            numbers
                .foreach_batch(move |_, info| {
                    let n = info.batch_id.0;
                    if !root.join(format!("offsets/{n}")).exists() {
                        violations.lock().unwrap().push(format!("{output}: offsets/{n} missing"));
                    }
                    if root.join(format!("commits/{n}")).exists() {
                        violations.lock().unwrap().push(format!("{output}: commits/{n} already there"));
                    }
                    *checks.lock().unwrap() += 1;
                    Ok(())
                })
                .name(output);
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(ctx.recovery().unwrap().resumed_at, BatchId(0));
    ctx.start().unwrap();
    tick(&clock, &ctx, 0);
    tick(&clock, &ctx, 1);
    stop(ctx);
    assert_eq!(*checks.lock().unwrap(), 4);
    assert!(violations.lock().unwrap().is_empty(), "{:?}", violations.lock().unwrap());
    assert!(dir.path().join("commits/1").exists());
    let progress = std::fs::read_dir(dir.path().join("progress")).unwrap().count();
    assert!(progress >= 1);
}

fn collect_output(p: &mut PipelineBuilder, source: &Arc<Numbers>, seen: &SeenLog) {
    let seen = Arc::clone(seen);
    numbers_input(p, source)
        .foreach_batch(move |batch, info| {
            let mut records: Vec<u64> = batch.iter().copied().collect();
            records.sort_unstable();
            seen.lock().unwrap().push(Seen { batch: info.batch_id, time: info.time, records });
            Ok(())
        })
        .name("collect");
}

/// A context on `dir` whose one output collects what `source` gives each batch.
fn open_collecting(
    dir: &Path,
    clock: &ManualClock,
    source: &Arc<Numbers>,
    seen: &SeenLog,
) -> Result<StreamingContext, RuntimeError> {
    StreamingContext::get_or_create(dir, settings(clock), |p| {
        collect_output(p, source, seen);
        Ok(())
    })
}

/// Writes offsets (and commits) of batches by hand, as a crashed run left them.
fn write_logs(dir: &Path, batches: &[(u64, i64, u64, u64)], commits: &[u64]) {
    let checkpoint = Checkpoint::open_for_write(dir, CheckpointSettings::new()).unwrap();
    for &(batch, time, from, until) in batches {
        let offsets = OffsetSeq {
            batch_timestamp: Time::from_millis(time),
            sources: vec![SourceOffset::new("numbers", Some(json!({"from": from, "until": until})))],
            ..OffsetSeq::default()
        };
        assert!(checkpoint.offsets().add(BatchId(batch), &offsets).unwrap());
    }
    for &batch in commits {
        assert!(checkpoint.commits().add(BatchId(batch), &CommitMetadata::default()).unwrap());
    }
}

#[test]
fn logged_but_uncommitted_batch_is_rerun_with_exactly_its_offsets() {
    let dir = tempfile::tempdir().unwrap();
    // Batch 1 was planned as 5..9 (fewer than a batch: the log had only 9 then).
    write_logs(dir.path(), &[(0, START, 0, 5), (1, START + 1000, 5, 9)], &[0]);
    let clock = ManualClock::new(Time::from_millis(START + 1500));
    let source = Numbers::new(5);
    let seen = SeenLog::default();
    let mut ctx = open_collecting(dir.path(), &clock, &source, &seen).unwrap();
    let report = ctx.recovery().unwrap().clone();
    assert_eq!(report.rerun_batch, Some(BatchId(1)));
    assert_eq!(report.last_committed, Some(BatchId(0)));
    assert_eq!(report.resumed_at, BatchId(2));
    assert!(report.pending_batch_times.is_empty());
    ctx.start().unwrap();
    assert!(ctx.await_committed(BatchId(1), WAIT), "{:?}", ctx.failure());
    tick(&clock, &ctx, 2);
    stop(ctx);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            Seen { batch: BatchId(1), time: Time::from_millis(START + 1000), records: (5..9).collect() },
            Seen { batch: BatchId(2), time: Time::from_millis(START + 2000), records: (9..14).collect() },
        ]
    );
}

#[test]
fn every_batch_committed_resumes_at_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    write_logs(dir.path(), &[(0, START, 0, 5), (1, START + 1000, 5, 10), (2, START + 2000, 10, 15)], &[0, 1, 2]);
    let clock = ManualClock::new(Time::from_millis(START + 2000));
    let source = Numbers::new(5);
    let seen = SeenLog::default();
    let mut ctx = open_collecting(dir.path(), &clock, &source, &seen).unwrap();
    let report = ctx.recovery().unwrap().clone();
    assert_eq!((report.rerun_batch, report.resumed_at), (None, BatchId(3)));
    assert!(report.to_string().contains("at batch 3"), "{report}");
    ctx.start().unwrap();
    tick(&clock, &ctx, 3);
    stop(ctx);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![Seen { batch: BatchId(3), time: Time::from_millis(START + 3000), records: (15..20).collect() }]
    );
}

#[test]
fn batches_missed_while_down_run_before_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    write_logs(dir.path(), &[(0, START, 0, 5)], &[0]);
    let clock = ManualClock::new(Time::from_millis(START + 3500));
    let source = Numbers::new(5);
    let seen = SeenLog::default();
    let mut ctx = open_collecting(dir.path(), &clock, &source, &seen).unwrap();
    let pending = ctx.recovery().unwrap().pending_batch_times.clone();
    assert_eq!(
        pending,
        vec![Time::from_millis(START + 1000), Time::from_millis(START + 2000), Time::from_millis(START + 3000)]
    );
    ctx.start().unwrap();
    assert!(ctx.await_committed(BatchId(3), WAIT));
    tick(&clock, &ctx, 4);
    stop(ctx);
    let times: Vec<i64> = seen.lock().unwrap().iter().map(|s| s.time.as_millis() - START).collect();
    assert_eq!(times, vec![1000, 2000, 3000, 4000]);
}

#[test]
fn inconsistent_directory_is_refused_with_the_repair_command() {
    let dir = tempfile::tempdir().unwrap();
    // commits/1 without offsets/1: a commit ahead of the offsets.
    write_logs(dir.path(), &[(0, START, 0, 5)], &[0, 1]);
    let clock = ManualClock::new(Time::from_millis(START));
    let source = Numbers::new(5);
    let err = open_collecting(dir.path(), &clock, &source, &SeenLog::default()).unwrap_err();
    let text = err.to_string();
    let RuntimeError::Inconsistent(inconsistency) = err else { panic!("expected an inconsistency, got {err:?}") };
    assert!(inconsistency.files.iter().any(|f| f.ends_with("commits/1")), "{inconsistency:?}");
    assert_eq!(inconsistency.dir, dir.path());
    assert!(text.contains(&inconsistency.repair_command()) && text.contains("commits/1"), "{text}");
    // Nothing was changed.
    assert!(dir.path().join("commits/1").exists());
}

#[test]
fn second_context_on_the_same_directory_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let build = |p: &mut PipelineBuilder| -> Result<(), BoxError> {
        collect_output(p, &Numbers::new(1), &SeenLog::default());
        Ok(())
    };
    let first = StreamingContext::get_or_create(dir.path(), settings(&clock), build).unwrap();
    let err = StreamingContext::get_or_create(dir.path(), settings(&clock), build).unwrap_err();
    let text = err.to_string();
    let RuntimeError::Locked { holder: Some(holder), .. } = err else { panic!("expected the holder, got {err:?}") };
    assert_eq!(holder.pid, std::process::id());
    assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
    drop(first);
    assert!(StreamingContext::get_or_create(dir.path(), settings(&clock), build).is_ok());
}

#[test]
fn a_job_whose_checkpoint_is_taken_over_stops_with_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let build = |p: &mut PipelineBuilder| -> Result<(), BoxError> {
        collect_output(p, &Numbers::new(1), &SeenLog::default());
        Ok(())
    };
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), build).unwrap();
    ctx.start().unwrap();
    tick(&clock, &ctx, 0);
    // The lock is lost without the job noticing (removed by a careless
    // clean-up), and another writer takes the checkpoint.
    std::fs::remove_file(dir.path().join("LOCK")).unwrap();
    let _other = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
    clock.advance(Duration::from_secs(1));
    let err = ctx.await_termination().unwrap_err();
    assert!(matches!(&err, RuntimeError::TakenOver { dir: d, .. } if d == dir.path()), "{err:?}");
    assert!(err.to_string().contains("taken over by another writer"), "{err}");
    assert!(!dir.path().join("offsets/1").exists(), "the stale writer wrote nothing more");
}

/// Running totals per residue class, from named state.
fn totals_pipeline(p: &mut PipelineBuilder, source: &Arc<Numbers>, totals: &TotalsLog, extra_output: Option<SeenLog>) {
    let numbers = numbers_input(p, source);
    let sums = numbers
        .map(|n| (n % 3, n))
        .update_state_by_key(|values: Vec<u64>, old: Option<u64>| Some(old.unwrap_or(0) + values.iter().sum::<u64>()))
        .name("totals");
    let totals = Arc::clone(totals);
    sums.foreach_batch(move |batch, info| {
        let mut rows: Vec<(u64, u64)> = batch.iter().copied().collect();
        rows.sort_unstable();
        totals.lock().unwrap().push((info.batch_id, rows));
        Ok(())
    })
    .name("totals-out");
    if let Some(seen) = extra_output {
        collect_output_of(&numbers, seen);
    }
}

fn collect_output_of(numbers: &spate_dstream::DStream<u64>, seen: SeenLog) {
    numbers
        .foreach_batch(move |batch, info| {
            seen.lock().unwrap().push(Seen {
                batch: info.batch_id,
                time: info.time,
                records: batch.iter().copied().collect(),
            });
            Ok(())
        })
        .name("audit");
}

#[test]
fn upgraded_graph_with_an_added_output_resumes_named_state() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let totals = Arc::new(Mutex::new(Vec::new()));
    // Checkpoint state every other batch and stop at once (no snapshot of
    // the last batch), so the restart also rebuilds state by recomputing
    // the batch after the snapshot.
    let settings = || settings(&clock).with_checkpoint_interval(Duration::from_secs(2));
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(), |p| {
        totals_pipeline(p, &Numbers::new(4), &totals, None);
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    for batch in 0..3 {
        tick(&clock, &ctx, batch);
    }
    ctx.stop_handle().stop_now();
    ctx.await_termination().unwrap();

    let audit = SeenLog::default();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(), |p| {
        totals_pipeline(p, &Numbers::new(4), &totals, Some(Arc::clone(&audit)));
        Ok(())
    })
    .unwrap();
    let report = ctx.recovery().unwrap().clone();
    assert_eq!(report.restored_operators.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), vec!["totals"]);
    assert_eq!(report.replayed_for_state, [BatchId(2)]);
    assert_eq!(report.resumed_at, BatchId(3));
    ctx.start().unwrap();
    tick(&clock, &ctx, 3);
    stop(ctx);
    // Batches 0..4 read 0..16: the totals per residue class of all of them.
    let expected: Vec<(u64, u64)> = (0..3).map(|r| (r, (0..16).filter(|n| n % 3 == r).sum())).collect();
    let totals = totals.lock().unwrap();
    assert_eq!(totals.last().unwrap(), &(BatchId(3), expected));
    assert_eq!(
        audit.lock().unwrap().clone(),
        vec![Seen { batch: BatchId(3), time: Time::from_millis(START + 4000), records: (12..16).collect() }]
    );
}

#[derive(Default)]
struct CommitOrderListener {
    committed: Mutex<Vec<BatchId>>,
}

impl ProgressListener for CommitOrderListener {
    fn on_batch_completed(&self, progress: &BatchProgress) {
        self.committed.lock().unwrap().push(progress.batch_id);
    }
}

#[test]
fn concurrent_jobs_run_at_once_and_batches_commit_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let root: PathBuf = dir.path().to_path_buf();
    let (gate_tx, gate_rx) = crossbeam::channel::unbounded::<u64>();
    let early_commits = Arc::new(Mutex::new(Vec::<String>::new()));
    let settings = settings(&clock).with_concurrent_jobs(3);
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, |p| {
        let numbers = numbers_input(p, &Numbers::new(3));
        // "slow" finishes only after "fast" ran for the same batch: with a
        // single worker it would time out and fail the batch.
        numbers
            .foreach_batch(move |_, info| {
                let got = gate_rx.recv_timeout(StdDuration::from_secs(20)).map_err(|e| e.to_string())?;
                if got == info.batch_id.0 { Ok(()) } else { Err(format!("gate of batch {got}").into()) }
            })
            .name("slow");
        numbers.foreach_batch(move |_, info| Ok(gate_tx.send(info.batch_id.0)?)).name("fast");
        let (early, root) = (Arc::clone(&early_commits), root.clone());
        numbers
            .foreach_batch(move |_, info| {
                let n = info.batch_id.0;
                if let Some(prev) = n.checked_sub(1).filter(|p| !root.join(format!("commits/{p}")).exists()) {
                    early.lock().unwrap().push(format!("batch {n} ran before commits/{prev}"));
                }
                Ok(())
            })
            .name("check");
        Ok(())
    })
    .unwrap();
    let listener = Arc::new(CommitOrderListener::default());
    ctx.add_progress_listener(listener.clone());
    ctx.start().unwrap();
    // Several batch times at once: they queue and commit one after another.
    clock.advance(Duration::from_secs(4));
    assert!(ctx.await_committed(BatchId(3), WAIT), "{:?}", ctx.failure());
    stop(ctx);
    assert_eq!(*listener.committed.lock().unwrap(), vec![BatchId(0), BatchId(1), BatchId(2), BatchId(3)]);
    assert!(early_commits.lock().unwrap().is_empty(), "{:?}", early_commits.lock().unwrap());
}

#[test]
fn a_failed_output_leaves_the_batch_uncommitted_for_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        numbers_input(p, &Numbers::new(2))
            .foreach_batch(|_, info| if info.batch_id.0 == 1 { Err("sink down".into()) } else { Ok(()) })
            .name("flaky");
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    tick(&clock, &ctx, 0);
    clock.advance(Duration::from_secs(1));
    let err = ctx.await_termination().unwrap_err();
    assert!(err.to_string().contains("sink down") && err.to_string().contains("batch 1"), "{err}");
    assert!(dir.path().join("offsets/1").exists() && !dir.path().join("commits/1").exists());

    let seen = SeenLog::default();
    let ctx = open_collecting(dir.path(), &clock, &Numbers::new(2), &seen).unwrap();
    assert_eq!(ctx.recovery().unwrap().rerun_batch, Some(BatchId(1)));
}

#[test]
fn logs_and_state_past_retention_are_purged() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let totals = TotalsLog::default();
    // Every snapshot whole: the state kept is then the last one alone (a
    // chain of changes is kept back to its whole snapshot; see incremental.rs).
    let settings = settings(&clock)
        .with_retained_batches(2)
        .with_checkpoint_interval(Duration::from_secs(2))
        .with_full_snapshot_every(1);
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, |p| {
        totals_pipeline(p, &Numbers::new(2), &totals, None);
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    for batch in 0..6 {
        tick(&clock, &ctx, batch);
    }
    stop(ctx);
    let ids = |sub: &str| {
        let mut ids: Vec<u64> = std::fs::read_dir(dir.path().join(sub))
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().into_string().ok()?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids
    };
    // Snapshots after batches 1, 3 and 5 (even batch times); only the last is kept,
    // and the logs keep the last two batches (nothing after the snapshot is needed).
    assert_eq!(ids("state/totals"), vec![5]);
    assert_eq!(ids("offsets"), vec![4, 5]);
    assert_eq!(ids("commits"), vec![4, 5]);
}

/// A source of the integers that panics computing batch `panic_at`, once.
#[derive(Debug)]
struct Exploding {
    numbers: Arc<Numbers>,
    panic_at: BatchId,
    fired: std::sync::atomic::AtomicBool,
    seen_batches: Mutex<u64>,
}

impl InputSource<u64> for Exploding {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        self.numbers.plan(time, limits)
    }

    fn compute(&self, time: Time, planned: Option<&str>) -> Result<Vec<Vec<u64>>, BoxError> {
        let mut seen = self.seen_batches.lock().unwrap();
        let batch = BatchId(*seen);
        *seen += 1;
        drop(seen);
        if batch == self.panic_at && !self.fired.swap(true, std::sync::atomic::Ordering::AcqRel) {
            panic!("the source exploded computing batch {batch}");
        }
        self.numbers.compute(time, planned)
    }
}

#[test]
fn a_panicking_output_fails_the_job_and_its_batch_re_runs_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let source = Numbers::new(5);
    let seen = SeenLog::default();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        let seen = Arc::clone(&seen);
        numbers_input(p, &source)
            .foreach_batch(move |batch, info| {
                assert!(info.batch_id != BatchId(1), "the output exploded in batch 1");
                let mut records: Vec<u64> = batch.iter().copied().collect();
                records.sort_unstable();
                seen.lock().unwrap().push(Seen { batch: info.batch_id, time: info.time, records });
                Ok(())
            })
            .name("explodes");
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    tick(&clock, &ctx, 0);
    clock.advance(Duration::from_secs(1));
    let err = ctx.await_termination().unwrap_err();
    assert!(
        matches!(&err, RuntimeError::OutputFailed { batch: BatchId(1), output, reason }
            if output == "explodes" && reason.contains("the output exploded in batch 1")),
        "{err:?}"
    );
    assert!(dir.path().join("offsets/1").exists() && !dir.path().join("commits/1").exists());

    // The next start re-runs batch 1 with its logged offsets, and goes on.
    let mut ctx = open_collecting(dir.path(), &clock, &Numbers::new(5), &seen).unwrap();
    assert_eq!(ctx.recovery().unwrap().rerun_batch, Some(BatchId(1)));
    ctx.start().unwrap();
    assert!(ctx.await_committed(BatchId(1), WAIT), "{:?}", ctx.failure());
    tick(&clock, &ctx, 2);
    stop(ctx);
    let records: Vec<(u64, Vec<u64>)> = seen.lock().unwrap().iter().map(|s| (s.batch.0, s.records.clone())).collect();
    assert_eq!(records, vec![(0, (0..5).collect()), (1, (5..10).collect()), (2, (10..15).collect())]);
}

#[test]
fn a_panic_on_the_driver_ends_the_run_with_an_error_and_the_batch_re_runs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let exploding = Arc::new(Exploding {
        numbers: Numbers::new(5),
        panic_at: BatchId(1),
        fired: std::sync::atomic::AtomicBool::new(false),
        seen_batches: Mutex::new(0),
    });
    let seen = SeenLog::default();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        let seen = Arc::clone(&seen);
        p.input("numbers", Arc::clone(&exploding))
            .foreach_batch(move |batch, info| {
                let mut records: Vec<u64> = batch.iter().copied().collect();
                records.sort_unstable();
                seen.lock().unwrap().push(Seen { batch: info.batch_id, time: info.time, records });
                Ok(())
            })
            .name("collect");
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    tick(&clock, &ctx, 0);
    clock.advance(Duration::from_secs(1));
    // The driver ends and says why: nobody waits for a batch that never comes.
    assert!(!ctx.await_committed(BatchId(1), WAIT));
    let failure = ctx.failure().expect("the failure is reported while the context is still held");
    assert!(failure.contains("the source exploded computing batch 1"), "{failure}");
    let err = ctx.await_termination().unwrap_err();
    assert!(err.to_string().contains("the source exploded computing batch 1"), "{err:?}");
    assert!(dir.path().join("offsets/1").exists() && !dir.path().join("commits/1").exists());
    assert_eq!(read_lock_state(dir.path()), "free");

    let mut ctx = open_collecting(dir.path(), &clock, &Numbers::new(5), &seen).unwrap();
    assert_eq!(ctx.recovery().unwrap().rerun_batch, Some(BatchId(1)));
    ctx.start().unwrap();
    assert!(ctx.await_committed(BatchId(1), WAIT), "{:?}", ctx.failure());
    stop(ctx);
    let records: Vec<(u64, Vec<u64>)> = seen.lock().unwrap().iter().map(|s| (s.batch.0, s.records.clone())).collect();
    assert_eq!(records, vec![(0, (0..5).collect()), (1, (5..10).collect())]);
}

/// "free" when another writer can take the checkpoint's lock now, else "held".
fn read_lock_state(dir: &Path) -> &'static str {
    match Checkpoint::open_for_write(dir, CheckpointSettings::new()) {
        Ok(_) => "free",
        Err(_) => "held",
    }
}

#[test]
fn asking_twice_for_a_graceful_stop_is_still_graceful() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let source = Numbers::new(5);
    let (started_tx, started_rx) = crossbeam::channel::bounded::<BatchId>(1);
    let (gate_tx, gate_rx) = crossbeam::channel::bounded::<()>(1);
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        numbers_input(p, &source)
            .foreach_batch(move |_, info| {
                started_tx.send(info.batch_id)?;
                Ok(gate_rx.recv()?)
            })
            .name("gated");
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(started_rx.recv_timeout(WAIT).unwrap(), BatchId(0));
    // While batch 0 is in flight, a timer and a batch limit both ask for a
    // graceful stop; neither turns it into an immediate one.
    let handle = ctx.stop_handle();
    handle.stop_gracefully();
    handle.stop_gracefully();
    gate_tx.send(()).unwrap();
    let report = ctx.await_termination().unwrap();
    assert!(report.graceful, "{report:?}");
    assert_eq!(report.last_committed, Some(BatchId(0)));
    assert!(dir.path().join("commits/0").exists());
}

#[test]
fn a_graceful_stop_snapshots_the_state_of_its_last_batch_so_a_restart_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let totals = Arc::new(Mutex::new(Vec::new()));
    // Snapshots every 10 batches: none would fall on batch 2 by the interval.
    let settings = || settings(&clock).with_checkpoint_interval(Duration::from_secs(10));
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(), |p| {
        totals_pipeline(p, &Numbers::new(4), &totals, None);
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    for batch in 0..3 {
        tick(&clock, &ctx, batch);
    }
    stop(ctx);
    let ctx = StreamingContext::get_or_create(dir.path(), settings(), |p| {
        totals_pipeline(p, &Numbers::new(4), &totals, None);
        Ok(())
    })
    .unwrap();
    let report = ctx.recovery().unwrap().clone();
    let restored: Vec<(&str, BatchId)> =
        report.restored_operators.iter().map(|o| (o.name.as_str(), o.snapshot_batch)).collect();
    assert_eq!(restored, [("totals", BatchId(2))]);
    assert!(report.replayed_for_state.is_empty(), "replayed {:?}", report.replayed_for_state);
    assert_eq!(report.resumed_at, BatchId(3));
}

#[test]
fn a_state_snapshot_newer_than_the_last_commit_is_refused_then_repaired_and_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let totals = Arc::new(Mutex::new(Vec::new()));
    let build = |p: &mut spate_runtime::PipelineBuilder| {
        totals_pipeline(p, &Numbers::new(4), &totals, None);
        Ok(())
    };
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), build).unwrap();
    ctx.start().unwrap();
    for batch in 0..3 {
        tick(&clock, &ctx, batch);
    }
    // The graceful stop snapshots batch 2; then its commit goes missing.
    stop(ctx);
    let counted = totals.lock().unwrap().last().cloned().unwrap();
    assert_eq!(counted.0, BatchId(2));
    std::fs::remove_file(dir.path().join("commits/2")).unwrap();
    let err = StreamingContext::get_or_create(dir.path(), settings(&clock), build).err().unwrap();
    assert!(matches!(err, spate_runtime::RuntimeError::Inconsistent(_)), "{err}");
    assert!(err.to_string().contains("taken after batch 2, but the last commit is 1"), "{err}");

    // The repair takes the state back with the commit: batch 2 re-runs and is counted once.
    let writer = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
    let plan = writer.repair_plan().unwrap().unwrap();
    writer.apply_repair(&plan).unwrap();
    drop(writer);
    let first_run = totals.lock().unwrap().len();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), build).unwrap();
    assert_eq!(ctx.recovery().unwrap().rerun_batch, Some(BatchId(2)));
    ctx.start().unwrap();
    tick(&clock, &ctx, 2);
    stop(ctx);
    let rerun = totals.lock().unwrap()[first_run..].iter().find(|(batch, _)| *batch == BatchId(2)).cloned();
    assert_eq!(rerun, Some(counted), "batch 2's totals after the repair");
}
