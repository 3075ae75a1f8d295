//! The file sink crashed at every step of writing a batch, on a local disk
//! (also inside each atomic write, losing what was not synced) and on an
//! object store (also with each write lost or repeated as a client retry
//! repeats it): what a reader sees is never a half file nor a duplicate,
//! and after the re-run of the batch it holds every record exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{CrashMode, Event, Steps, hidden_files, visible, visible_records};
use spate_core::{BatchId, Time};
use spate_dstream::BatchInfo;
use spate_files::{
    BatchOutcome, CheckpointFileManager, FileSink, FileSinkSettings, FilesError, MANIFESTS_DIR, Partitioning, Recovery,
    STAGING_DIR,
};
use spate_logstore::{FaultPoint, FaultyObjectStore, LocalFileManager, ObjectFault, ObjectStoreFileManager};

/// 2026-12-05T18:00:00Z.
const HOUR_18: i64 = 1_796_493_600_000;
const HOUR_MS: i64 = 3_600_000;

/// Batch `n`: 40 events over three hours, time `HOUR_18 + 3 h + n s`.
fn batch(n: u64) -> (BatchInfo, Vec<Event>) {
    let events =
        (0..40).map(|i| Event { id: n * 1000 + i, at: HOUR_18 + (i as i64 % 3) * HOUR_MS + i as i64 }).collect();
    (BatchInfo { time: Time::from_millis(HOUR_18 + 3 * HOUR_MS + n as i64 * 1000), batch_id: BatchId(n) }, events)
}

/// Small files, so a partition's records of a batch take several.
fn settings() -> FileSinkSettings {
    FileSinkSettings::new().max_file_bytes(120)
}

fn sink(root: &Path, files: Arc<dyn CheckpointFileManager>) -> FileSink<Event> {
    FileSink::with_file_manager(root, settings(), files, |e: &Event| Time::from_millis(e.at)).unwrap()
}

fn sorted(mut events: Vec<Event>) -> Vec<Event> {
    events.sort();
    events
}

/// How many changing steps batch 0 takes on a fresh root, and of which kinds.
fn steps_of_one_batch(root: &Path, inner: Arc<dyn CheckpointFileManager>) -> Vec<&'static str> {
    steps_of_batch(root, inner, 0)
}

/// How many changing steps batch `n` takes on a fresh root, and of which kinds.
fn steps_of_batch(root: &Path, inner: Arc<dyn CheckpointFileManager>, n: u64) -> Vec<&'static str> {
    let steps = Arc::new(Steps::new(inner, usize::MAX));
    let (info, events) = batch(n);
    let outcome = sink(root, Arc::clone(&steps) as Arc<dyn CheckpointFileManager>).write_batch(&events, info).unwrap();
    assert!(matches!(outcome, BatchOutcome::Published(ref m) if m.files.len() > 3), "{outcome:?}");
    steps.kinds.lock().unwrap().clone()
}

/// Crashes batch 0 at step `at` (`mode`), checks what a reader sees, then
/// restarts (a fresh sink over `fresh`) with the re-run of batch 0 and batch
/// 1, and checks that every record is there exactly once and nothing is
/// left staged. Returns whether the crash came after the batch's decision
/// (its re-run found it published).
fn crash_and_recover(
    root: &Path,
    crashing: Arc<Steps>,
    fresh: Arc<dyn CheckpointFileManager>,
    decision_step: usize,
    at: usize,
) -> bool {
    let (info0, events0) = batch(0);
    let crashed = sink(root, Arc::clone(&crashing) as Arc<dyn CheckpointFileManager>).write_batch(&events0, info0);
    let context = format!("crash at step {at} ({:?})", crashing.kinds.lock().unwrap().last());
    assert!(crashed.is_err(), "{context}: the batch went through");
    assert!(crashing.crashed(), "{context}: no crash: {crashed:?}");

    // Before any recovery: whole files, no record twice, only batch 0's.
    let seen = visible_records(fresh.as_ref(), root);
    let mut unique = seen.clone();
    unique.dedup();
    assert_eq!(seen, unique, "{context}: a record is visible twice");
    assert!(seen.iter().all(|e| events0.contains(e)), "{context}");

    // The restart re-runs batch 0 with the same records, then runs batch 1.
    let restarted = sink(root, Arc::clone(&fresh));
    let rerun = restarted.write_batch(&events0, info0).unwrap();
    let (info1, events1) = batch(1);
    assert!(matches!(restarted.write_batch(&events1, info1).unwrap(), BatchOutcome::Published(_)), "{context}");
    let expected = sorted(events0.iter().chain(&events1).cloned().collect());
    assert_eq!(visible_records(fresh.as_ref(), root), expected, "{context}");
    assert_eq!(hidden_files(fresh.as_ref(), root, STAGING_DIR), Vec::<PathBuf>::new(), "{context}");
    let published: Vec<u64> = restarted.published().unwrap().iter().map(|m| m.batch_id).collect();
    assert_eq!(published, [0, 1], "{context}");
    match rerun {
        BatchOutcome::AlreadyPublished(_) => {
            assert!(at >= decision_step, "{context}: decided before its manifest");
            true
        }
        BatchOutcome::Published(_) => {
            assert!(at <= decision_step, "{context}: written twice after its decision");
            false
        }
        BatchOutcome::Empty => panic!("{context}: empty"),
    }
}

#[test]
fn a_crash_before_any_step_of_a_batch_on_a_disk_leaves_no_half_file_and_the_rerun_completes_it() {
    let reference = tempfile::tempdir().unwrap();
    let kinds = steps_of_one_batch(reference.path(), Arc::new(LocalFileManager));
    // The decision is the create of the staged manifest: the last create before the first move.
    let first_move = kinds.iter().position(|k| *k == "move").unwrap();
    let decision = kinds[..first_move].iter().rposition(|k| *k == "create").unwrap();
    let mut after_decision = 0;
    for at in 0..kinds.len() {
        let dir = tempfile::tempdir().unwrap();
        let crashing = Arc::new(Steps::local(at, CrashMode::Before));
        if crash_and_recover(dir.path(), crashing, Arc::new(LocalFileManager), decision, at) {
            after_decision += 1;
        }
    }
    assert!(after_decision > 3, "the moves, the record and the clean are all after the decision");
}

#[test]
fn a_crash_inside_each_file_write_losing_what_was_not_synced_leaves_no_half_file() {
    let reference = tempfile::tempdir().unwrap();
    let kinds = steps_of_one_batch(reference.path(), Arc::new(LocalFileManager));
    let first_move = kinds.iter().position(|k| *k == "move").unwrap();
    let decision = kinds[..first_move].iter().rposition(|k| *k == "create").unwrap();
    let creates: Vec<usize> = (0..kinds.len()).filter(|i| kinds[*i] == "create").collect();
    for at in creates {
        for point in FaultPoint::ALL {
            let dir = tempfile::tempdir().unwrap();
            let crashing = Arc::new(Steps::local(at, CrashMode::Inside(point)));
            // A crash at the write's last point made it durable: that write is done.
            crash_and_recover(dir.path(), crashing, Arc::new(LocalFileManager), decision, at);
        }
    }
}

fn in_memory_store(location: &Path) -> Arc<dyn CheckpointFileManager> {
    let store = Arc::new(object_store::memory::InMemory::new());
    Arc::new(ObjectStoreFileManager::with_store(location, "out", store).unwrap())
}

#[test]
fn a_crash_before_any_step_in_an_object_store_leaves_no_half_object_and_the_rerun_completes_it() {
    let location = PathBuf::from("s3://bucket/out");
    let kinds = steps_of_one_batch(&location, in_memory_store(&location));
    let first_move = kinds.iter().position(|k| *k == "move").unwrap();
    let decision = kinds[..first_move].iter().rposition(|k| *k == "create").unwrap();
    for at in 0..kinds.len() {
        let store = Arc::new(object_store::memory::InMemory::new());
        let files: Arc<dyn CheckpointFileManager> =
            Arc::new(ObjectStoreFileManager::with_store(&location, "out", store).unwrap());
        let crashing = Arc::new(Steps::new(Arc::clone(&files), at));
        crash_and_recover(&location, crashing, files, decision, at);
    }
}

fn object_files(location: &Path, store: Arc<dyn object_store::ObjectStore>) -> Arc<dyn CheckpointFileManager> {
    Arc::new(ObjectStoreFileManager::with_store(location, "out", store).unwrap())
}

#[test]
fn a_lost_or_repeated_object_store_write_anywhere_never_leaves_a_duplicate_or_a_gap() {
    let location = PathBuf::from("s3://bucket/out");
    let (info0, events0) = batch(0);
    let (info1, events1) = batch(1);
    let counting = Arc::new(FaultyObjectStore::new(Arc::new(object_store::memory::InMemory::new())));
    sink(&location, object_files(&location, Arc::clone(&counting) as _)).write_batch(&events0, info0).unwrap();
    let writes = counting.writes();
    assert!(writes > 20, "{writes} writes");
    let faults = [ObjectFault::BeforeApply, ObjectFault::AfterApply, ObjectFault::AfterApplyRetried];
    for (n, fault, crash) in
        (0..writes).flat_map(|n| faults.into_iter().flat_map(move |f| [(n, f, false), (n, f, true)]))
    {
        let context = format!("write {n} failing {fault:?}, crash {crash}");
        let memory: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let faulty = Arc::new(FaultyObjectStore::fail_write(Arc::clone(&memory), n, fault, crash));
        let first_sink = sink(&location, object_files(&location, Arc::clone(&faulty) as _));
        let first = first_sink.write_batch(&events0, info0);
        assert!(faulty.fired(), "{context}");
        // The re-run: by the same sink when the process lived on, by a new one when it died.
        let rerun_sink = if crash { sink(&location, object_files(&location, Arc::clone(&memory))) } else { first_sink };
        if first.is_err() {
            rerun_sink.write_batch(&events0, info0).unwrap_or_else(|e| panic!("{context}: {e}"));
        }
        rerun_sink.write_batch(&events1, info1).unwrap_or_else(|e| panic!("{context}: {e}"));
        let clean = object_files(&location, memory);
        let expected = sorted(events0.iter().chain(&events1).cloned().collect());
        assert_eq!(visible_records(clean.as_ref(), &location), expected, "{context}");
        assert!(hidden_files(clean.as_ref(), &location, STAGING_DIR).is_empty(), "{context}");
    }
}

#[test]
fn recovery_reports_what_it_published_forward_and_what_it_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let kinds = steps_of_batch(tempfile::tempdir().unwrap().path(), Arc::new(LocalFileManager), 1);
    let first_move = kinds.iter().position(|k| *k == "move").unwrap();
    // Two sinks that settled the empty root, as two runs would have: batch 0
    // crashes in one while staging, batch 1 in the other while publishing.
    let (steps0, steps1) = (
        Arc::new(Steps::new(Arc::new(LocalFileManager), usize::MAX)),
        Arc::new(Steps::new(Arc::new(LocalFileManager), usize::MAX)),
    );
    let (sink0, sink1) = (sink(dir.path(), Arc::clone(&steps0) as _), sink(dir.path(), Arc::clone(&steps1) as _));
    assert_eq!(sink0.recover().unwrap(), Recovery::default());
    assert_eq!(sink1.recover().unwrap(), Recovery::default());
    let (info0, events0) = batch(0);
    steps0.crash_in(2);
    assert!(sink0.write_batch(&events0, info0).is_err());
    let (info1, events1) = batch(1);
    steps1.crash_in(first_move + 1);
    assert!(sink1.write_batch(&events1, info1).is_err());
    assert_eq!(steps1.kinds.lock().unwrap().iter().filter(|k| **k == "move").count(), 1, "one file published");

    let recovered = sink(dir.path(), Arc::new(LocalFileManager)).recover().unwrap();
    let key = |info: BatchInfo| spate_files::BatchKey::new(info.time, info.batch_id);
    assert_eq!(recovered, Recovery { published: vec![key(info1)], dropped: vec![key(info0)] });
    assert_eq!(visible_records(&LocalFileManager, dir.path()), sorted(events1));
    assert!(hidden_files(&LocalFileManager, dir.path(), STAGING_DIR).is_empty());
}

#[test]
fn a_batch_that_published_is_not_written_again_even_with_other_records() {
    let dir = tempfile::tempdir().unwrap();
    let files: Arc<dyn CheckpointFileManager> = Arc::new(LocalFileManager);
    let (info, events) = batch(0);
    let first = sink(dir.path(), Arc::clone(&files)).write_batch(&events, info).unwrap();
    let BatchOutcome::Published(manifest) = first else { panic!("{first:?}") };
    let before = visible::<Event>(files.as_ref(), dir.path());
    // A re-run whose records differ (a source that is not replayable) cannot add to a decided batch.
    let other = vec![Event { id: 999_999, at: HOUR_18 }];
    let again = sink(dir.path(), Arc::clone(&files)).write_batch(&other, info).unwrap();
    assert_eq!(again, BatchOutcome::AlreadyPublished(manifest.clone()));
    assert_eq!(visible(files.as_ref(), dir.path()), before);
    // The files are where the manifest says, named by batch, partitioned by hour.
    let paths: Vec<String> = before.keys().map(|p| p.to_str().unwrap().to_string()).collect();
    let mut listed: Vec<String> = manifest.files.iter().map(|f| f.path.clone()).collect();
    listed.sort();
    assert_eq!(paths, listed);
    let key = "1796504400000-0";
    for (hour, path) in [(18, &listed[0]), (20, listed.last().unwrap())] {
        assert!(path.starts_with(&format!("dt=2026-12-05/hour={hour}/part-{key}-")), "{path}");
    }
    assert!(listed.iter().any(|p| p.ends_with(&format!("part-{key}-00001.jsonl"))), "{listed:?}");
    assert_eq!(manifest.records(), 40);
    assert_eq!(hidden_files(files.as_ref(), dir.path(), MANIFESTS_DIR), [PathBuf::from(format!("{key}.json"))]);
}

#[test]
fn an_empty_batch_writes_nothing_and_minutes_partition_as_q10() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::open(dir.path(), FileSinkSettings::new().partitioned_by(Partitioning::Minute), |e: &Event| {
        Time::from_millis(e.at)
    })
    .unwrap();
    let (info, _) = batch(0);
    assert_eq!(sink.write_batch(&[], info).unwrap(), BatchOutcome::Empty);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "an empty batch left something");
    let events = [Event { id: 1, at: HOUR_18 + 7 * 60_000 + 9_120 }];
    let BatchOutcome::Published(manifest) = sink.write_batch(&events, info).unwrap() else { panic!() };
    assert_eq!(manifest.files[0].path, "dt=2026-12-05/hm=18%3A07/part-1796504400000-0-00000.jsonl");
    let line = std::fs::read_to_string(dir.path().join(&manifest.files[0].path)).unwrap();
    assert_eq!(line, "{\"id\":1,\"at\":1796494029120}\n");
}

#[test]
fn a_file_in_the_way_that_is_not_the_batchs_is_a_conflict_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (info, events) = batch(0);
    // Another job wrote a file under the name batch 0 of this one will take.
    let taken = dir.path().join("dt=2026-12-05/hour=18/part-1796504400000-0-00000.jsonl");
    std::fs::create_dir_all(taken.parent().unwrap()).unwrap();
    std::fs::write(&taken, b"{\"id\":7,\"at\":0}\n").unwrap();
    let error = sink(dir.path(), Arc::new(LocalFileManager)).write_batch(&events, info).unwrap_err();
    assert!(matches!(error, FilesError::Conflict { batch_id: BatchId(0), .. }), "{error}");
    assert!(error.to_string().contains("give each job a root of its own"), "{error}");
    assert_eq!(std::fs::read(&taken).unwrap(), b"{\"id\":7,\"at\":0}\n");
}

#[test]
fn a_new_job_on_the_same_root_writes_beside_the_old_one_and_old_manifests_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let files: Arc<dyn CheckpointFileManager> = Arc::new(LocalFileManager);
    let retained = |n| {
        FileSink::with_file_manager(dir.path(), settings().retained_manifests(n), Arc::clone(&files), |e: &Event| {
            Time::from_millis(e.at)
        })
        .unwrap()
    };
    let old = retained(2);
    let mut expected = Vec::new();
    for n in 0..3 {
        let (info, events) = batch(n);
        old.write_batch(&events, info).unwrap();
        expected.extend(events);
    }
    assert_eq!(old.published().unwrap().iter().map(|m| m.batch_id).collect::<Vec<_>>(), [1, 2]);
    // A new checkpoint: batch ids from 0 again, at later batch times.
    let new = retained(10);
    let (mut info, events) = batch(0);
    info.time = info.time + spate_core::Duration::from_secs(3600);
    assert!(matches!(new.write_batch(&events, info).unwrap(), BatchOutcome::Published(_)));
    expected.extend(events);
    assert_eq!(visible_records(files.as_ref(), dir.path()), sorted(expected));
}

#[test]
fn settings_that_cannot_work_are_refused_when_the_sink_opens() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [settings().max_file_bytes(0), settings().max_file_bytes(u64::MAX), settings().retained_manifests(0)] {
        let error = FileSink::open(dir.path(), bad, |e: &Event| Time::from_millis(e.at)).unwrap_err();
        assert!(matches!(error, FilesError::Settings { .. }), "{error}");
    }
}
