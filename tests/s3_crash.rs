//! A checkpoint in an object store, crashed at every write: each request of
//! a writer's life (lease, entries, state, graph, purge, release) fails in
//! turn, before the store applies it or after (the answer lost), and the
//! process "dies" there. A new writer then always finds a consistent
//! checkpoint: it takes the lease over, re-runs or resumes with exactly the
//! logged offsets, and never behind a commit the dead writer was told had
//! landed. In memory (object_store's `InMemory`, which has the
//! same conditional puts as S3), so it needs no server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::{Arc, Mutex};

use object_store::ObjectStore;
use object_store::memory::InMemory;
use spate::core::{BatchId, Duration, ManualClock, Time};
use spate::logstore::{
    Checkpoint, CheckpointFileManager, CheckpointSettings, CommitMetadata, FaultyObjectStore, LeaseSettings,
    LogStoreError, ObjectFault, ObjectStoreFileManager, OffsetSeq, SourceOffset, Verdict,
};

const LOCATION: &str = "s3://bucket/ck";
const BATCHES: u64 = 3;

fn offsets(n: u64) -> OffsetSeq {
    OffsetSeq {
        batch_timestamp: Time::from_millis(1_000 * n as i64),
        sources: vec![SourceOffset::new("events", Some(serde_json::json!({"events": {"0": n * 10}})))],
        ..OffsetSeq::default()
    }
}

fn options(files: Arc<dyn CheckpointFileManager>, clock: &Arc<ManualClock>) -> CheckpointSettings {
    let lease = LeaseSettings { renew_in_background: false, ..LeaseSettings::default() };
    CheckpointSettings::new()
        .with_clock(clock.clone())
        .with_file_manager(files)
        .with_lease(lease)
        .with_retained_batches(1)
}

fn files_on(store: Arc<dyn ObjectStore>) -> Arc<dyn CheckpointFileManager> {
    Arc::new(ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", store).unwrap())
}

/// A writer's life: the graph, three batches each with its state snapshot
/// after its commit, purges, a new graph. `acknowledged` is the last batch whose commit it was told landed.
fn writer_life(
    files: Arc<dyn CheckpointFileManager>,
    clock: &Arc<ManualClock>,
    acknowledged: &Mutex<Option<BatchId>>,
) -> Result<(), LogStoreError> {
    let checkpoint = Checkpoint::open_for_write(LOCATION, options(files, clock))?;
    checkpoint.replace_file("graph", b"g1")?;
    for n in 0..BATCHES {
        checkpoint.offsets().add(BatchId(n), &offsets(n))?;
        checkpoint.commit_batch(BatchId(n), &CommitMetadata::default())?;
        *acknowledged.lock().unwrap() = Some(BatchId(n));
        // As the runtime does: a batch's state is taken after its commit.
        checkpoint.write_file(format!("state/op/{n}"), b"state")?;
    }
    checkpoint.replace_file("graph", b"g2")
}

/// What a new writer must find after any crash, the dead writer's last
/// acknowledged commit being `acknowledged`.
fn check_recovers(memory: &Arc<InMemory>, clock: &Arc<ManualClock>, acknowledged: Option<BatchId>, what: &str) {
    // Past any lease the dead writer held.
    clock.advance(Duration::from_millis(60_000));
    let checkpoint = Checkpoint::open_for_write(LOCATION, options(files_on(memory.clone()), clock))
        .unwrap_or_else(|e| panic!("{what}: a new writer cannot open: {e}"));
    let verdict = checkpoint.verdict().unwrap();
    let first_to_run = match &verdict {
        Verdict::Fresh => BatchId(0),
        Verdict::Rerun { batch, .. } => *batch,
        Verdict::Resume { next, .. } => *next,
        other => panic!("{what}: inconsistent after the crash: {other:?}"),
    };
    // No acknowledged commit is lost: what runs next comes after all of them.
    if let Some(acknowledged) = acknowledged {
        assert!(
            first_to_run > acknowledged,
            "{what}: commit {acknowledged} was acknowledged, but the restart runs batch {first_to_run} ({verdict:?})"
        );
    }
    let next = match verdict {
        Verdict::Rerun { batch, offsets: logged, .. } => {
            assert_eq!(logged, offsets(batch.0), "{what}: batch {batch} re-runs with other offsets");
            assert!(checkpoint.commit_batch(batch, &CommitMetadata::default()).unwrap(), "{what}");
            batch.next().unwrap()
        }
        _ => first_to_run,
    };
    if let Some(graph) = checkpoint.read_file("graph").unwrap() {
        assert!(graph == b"g1" || graph == b"g2", "{what}: graph {graph:?}");
    }
    // And it carries on.
    assert!(checkpoint.offsets().add(next, &offsets(next.0)).unwrap(), "{what}");
    assert!(checkpoint.commit_batch(next, &CommitMetadata::default()).unwrap(), "{what}");
}

/// The writes of a whole life without faults; the last is the lease's release.
fn writes_without_faults() -> usize {
    let clock = Arc::new(ManualClock::new(Time::from_millis(1_700_000_000_000)));
    let counting = Arc::new(FaultyObjectStore::new(Arc::new(InMemory::new())));
    writer_life(files_on(counting.clone()), &clock, &Mutex::new(None)).unwrap();
    counting.writes()
}

fn crash_at_every_write(fault: ObjectFault, crash: bool) -> usize {
    let release = writes_without_faults() - 1;
    let mut n = 0;
    loop {
        let memory = Arc::new(InMemory::new());
        let clock = Arc::new(ManualClock::new(Time::from_millis(1_700_000_000_000)));
        let faulty = Arc::new(FaultyObjectStore::fail_write(memory.clone(), n, fault, crash));
        let acknowledged = Mutex::new(None);
        let result = writer_life(files_on(faulty.clone()), &clock, &acknowledged);
        if !faulty.fired() {
            result.unwrap();
            return n; // every write had its turn
        }
        let what = format!("{fault:?} at write {n} (crash: {crash})");
        // Only the release, after the writer's work, may fail quietly (it is
        // logged), and a write of the lease that landed: the writer reads the
        // lease back and finds it holds it.
        let lease_landed =
            fault != ObjectFault::BeforeApply && faulty.fired_on().is_some_and(|key| key.ends_with("/LOCK"));
        assert!(result.is_err() || n == release || lease_landed, "{what}: the failure went unseen");
        check_recovers(&memory, &clock, *acknowledged.lock().unwrap(), &what);
        n += 1;
    }
}

#[test]
fn a_checkpoint_crashed_before_any_write_lands_recovers() {
    let writes = crash_at_every_write(ObjectFault::BeforeApply, true);
    // Lease, graph, 3 x (offsets, state, commit), purges, graph, release.
    assert!(writes >= 12, "only {writes} writes: the scenario lost its steps");
}

#[test]
fn a_checkpoint_crashed_after_a_write_landed_unacknowledged_recovers() {
    assert!(crash_at_every_write(ObjectFault::AfterApply, true) >= 12);
}

#[test]
fn a_failed_write_that_landed_does_not_stop_the_next_writer() {
    assert!(crash_at_every_write(ObjectFault::AfterApply, false) >= 12);
}
