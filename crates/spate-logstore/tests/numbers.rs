//! Numbers read from a checkpoint are never trusted: a batch id without a
//! successor, a name too large for a batch id or a lock epoch at the top of
//! its range is an inconsistency (or an error) naming the file, never a
//! panic or a wrap to batch 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;
use std::sync::Arc;

use spate_core::{BatchId, ManualClock, Time};
use spate_logstore::{
    Checkpoint, CheckpointSettings, CommitMetadata, InconsistencyKind, LOCK_FILE, LogStoreError, OffsetSeq,
    RecoveryPoint, Verdict, encode_entry, inspect,
};

const MAX_NAME: &str = "18446744073709551615";

fn options() -> CheckpointSettings {
    CheckpointSettings::new().with_clock(Arc::new(ManualClock::new(Time::from_millis(1_764_000_000_000))))
}

fn checkpoint(dir: &Path, o: &[u64], c: &[u64]) -> Checkpoint {
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    for id in o {
        assert!(ck.offsets().add(BatchId(*id), &OffsetSeq::default()).unwrap());
    }
    for id in c {
        assert!(ck.commits().add(BatchId(*id), &CommitMetadata::default()).unwrap());
    }
    ck
}

/// Puts a well-formed entry under a name the API would never write.
fn plant(dir: &Path, relative: &str) {
    let bytes = if relative.starts_with("offsets") {
        encode_entry(&OffsetSeq::default()).unwrap()
    } else {
        encode_entry(&CommitMetadata::default()).unwrap()
    };
    fs::write(dir.join(relative), bytes).unwrap();
}

/// A checkpoint keeping 2 batches, with batches 0 to 3 logged and committed.
fn four_committed_batches(dir: &Path) -> Checkpoint {
    let ck = Checkpoint::open_for_write(dir, options().with_retained_batches(2)).unwrap();
    for id in 0..4 {
        ck.offsets().add(BatchId(id), &OffsetSeq::default()).unwrap();
        ck.commits().add(BatchId(id), &CommitMetadata::default()).unwrap();
    }
    ck
}

fn out_of_range_file(verdict: &Verdict) -> String {
    let Verdict::Inconsistent(inconsistency) = verdict else { panic!("expected an inconsistency, got {verdict:?}") };
    let InconsistencyKind::IdOutOfRange { file } = &inconsistency.kind else {
        panic!("expected an id out of range, got {:?}", inconsistency.kind)
    };
    let message = verdict.to_string();
    assert!(message.contains(&file.display().to_string()) && message.contains("out of range"), "{message}");
    file.display().to_string()
}

#[test]
fn offsets_and_commit_at_u64_max_are_an_inconsistency_not_a_resume_at_batch_0() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    drop(checkpoint(dir, &[], &[]));
    plant(dir, &format!("offsets/{MAX_NAME}"));
    plant(dir, &format!("commits/{MAX_NAME}"));
    // O == C == u64::MAX used to resume at O + 1: a panic, or batch 0 in a release build.
    let verdict = inspect(dir).unwrap();
    assert_eq!(out_of_range_file(&verdict), format!("offsets/{MAX_NAME}"));

    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    let moved: Vec<String> = plan.actions.iter().map(|a| a.from.display().to_string()).collect();
    assert_eq!(moved, [format!("offsets/{MAX_NAME}"), format!("commits/{MAX_NAME}")]);
    assert_eq!(plan.after, RecoveryPoint::Fresh);
    ck.apply_repair(&plan).unwrap();
    assert_eq!(ck.verdict().unwrap(), Verdict::Fresh);
}

#[test]
fn an_offsets_entry_at_u64_max_after_real_batches_is_named() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    drop(checkpoint(dir, &[0, 1], &[0, 1]));
    plant(dir, &format!("offsets/{MAX_NAME}"));
    let verdict = inspect(dir).unwrap();
    assert_eq!(out_of_range_file(&verdict), format!("offsets/{MAX_NAME}"));
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    assert_eq!(plan.after, RecoveryPoint::Resume { next: BatchId(2) });
}

#[test]
fn a_name_too_large_for_a_batch_id_is_an_inconsistency_not_ignored() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    drop(checkpoint(dir, &[0], &[0]));
    plant(dir, "commits/99999999999999999999");
    let verdict = inspect(dir).unwrap();
    assert_eq!(out_of_range_file(&verdict), "commits/99999999999999999999");
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    ck.apply_repair(&plan).unwrap();
    assert!(matches!(ck.verdict().unwrap(), Verdict::Resume { next: BatchId(1), .. }));
}

#[test]
fn the_log_never_writes_an_id_without_a_successor() {
    let root = tempfile::tempdir().unwrap();
    let ck = checkpoint(root.path(), &[], &[]);
    let err = ck.offsets().add(BatchId(u64::MAX), &OffsetSeq::default()).unwrap_err();
    assert!(matches!(err, LogStoreError::OutOfRange { .. }), "{err:?}");
    assert!(err.to_string().contains(MAX_NAME), "{err}");
    assert!(!root.path().join("offsets").join(MAX_NAME).exists());
    assert!(ck.commits().add(BatchId(u64::MAX - 1), &CommitMetadata::default()).unwrap());
}

#[test]
fn purge_refuses_a_stray_commit_at_u64_max_and_deletes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ck = four_committed_batches(dir);
    plant(dir, &format!("commits/{MAX_NAME}"));
    ck.offsets().add(BatchId(4), &OffsetSeq::default()).unwrap();
    let err = ck.commit_batch(BatchId(4), &CommitMetadata::default()).unwrap_err();
    let LogStoreError::Inconsistent(inconsistency) = &err else { panic!("{err:?}") };
    assert!(matches!(inconsistency.kind, InconsistencyKind::IdOutOfRange { .. }), "{err}");
    assert!(err.to_string().contains(&format!("commits/{MAX_NAME}")), "{err}");
    assert_eq!(ck.offsets().ids().unwrap().len(), 5, "nothing purged");
    assert_eq!(ck.commits().ids().unwrap().len(), 6, "nothing purged");
}

#[test]
fn purge_refuses_a_stray_commit_ahead_of_the_offsets_and_deletes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ck = four_committed_batches(dir);
    // A commit far ahead would have purged every batch below 998.
    plant(dir, "commits/999");
    let err = ck.purge_old_batches().unwrap_err();
    assert!(matches!(err, LogStoreError::Inconsistent(_)), "{err:?}");
    assert!(err.to_string().contains("commits/999"), "{err}");
    assert_eq!(ck.offsets().ids().unwrap().len(), 4, "nothing purged");
}

#[test]
fn a_lock_epoch_at_u64_max_is_refused_not_reused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    drop(checkpoint(dir, &[0], &[]));
    let holder = format!(r#"{{"pid":1,"host":"h","sinceMs":0,"epoch":{}}}"#, u64::MAX);
    fs::write(dir.join(LOCK_FILE), holder).unwrap();
    // A saturating epoch would give the new writer the old writer's epoch, and the fence would not tell them apart.
    let err = Checkpoint::open_for_write(dir, options()).unwrap_err();
    assert!(matches!(err, LogStoreError::OutOfRange { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(LOCK_FILE) && message.contains(&u64::MAX.to_string()), "{message}");
}
