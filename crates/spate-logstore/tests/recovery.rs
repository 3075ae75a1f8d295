//! Recovery verdicts on real directories, repairs applied and inspected
//! again, and a Spark checkpoint read as it is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use spate_core::{BatchId, ManualClock, Time};
use spate_logstore::{
    Checkpoint, CheckpointSettings, CommitMetadata, InconsistencyKind, LogStoreError, OffsetSeq, QUARANTINE_DIR,
    REPAIR_NOTE, RecoveryPoint, SourceOffset, Verdict, changes_header, inspect,
};

fn options() -> CheckpointSettings {
    CheckpointSettings::new().with_clock(Arc::new(ManualClock::new(Time::from_millis(1_764_000_000_000))))
}

fn offsets(id: u64) -> OffsetSeq {
    OffsetSeq {
        batch_watermark: Time::from_millis(id as i64 * 100),
        batch_timestamp: Time::from_millis(1_700_000_000_000 + id as i64 * 1000),
        sources: vec![SourceOffset::new("kafka-in", Some(json!({"events": {"0": id * 10}})))],
        ..OffsetSeq::default()
    }
}

/// A checkpoint with offsets `o` and commits `c`, written through the API.
fn checkpoint(dir: &Path, o: &[u64], c: &[u64]) {
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    for id in o {
        assert!(ck.offsets().add(BatchId(*id), &offsets(*id)).unwrap());
    }
    for id in c {
        assert!(ck.commits().add(BatchId(*id), &CommitMetadata::new(Time::from_millis(*id as i64))).unwrap());
    }
}

fn names(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|p| p.display().to_string()).collect()
}

#[test]
fn consistent_verdicts() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[], &[]);
    assert_eq!(inspect(dir).unwrap(), Verdict::Fresh);

    checkpoint(dir, &[0, 1, 2], &[0, 1]);
    match inspect(dir).unwrap() {
        Verdict::Rerun { batch, offsets: logged, last_commit } => {
            assert_eq!(batch, BatchId(2));
            assert_eq!(logged, offsets(2), "re-run with exactly the logged offsets");
            assert_eq!(last_commit, Some(CommitMetadata::new(Time::from_millis(1))));
        }
        other => panic!("{other:?}"),
    }

    checkpoint(dir, &[], &[2]);
    match inspect(dir).unwrap() {
        Verdict::Resume { next, last_offsets, last_commit } => {
            assert_eq!(next, BatchId(3));
            assert_eq!(last_offsets, offsets(2));
            assert_eq!(last_commit, CommitMetadata::new(Time::from_millis(2)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inspect_of_a_missing_directory_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let err = inspect(&root.path().join("nope")).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

/// Inspects, checks the inconsistency, plans and applies the repair, and
/// inspects again. Returns the plan's recovery point.
fn repair(dir: &Path, expect_kind: fn(&InconsistencyKind) -> bool, involved: &[&str]) -> RecoveryPoint {
    let verdict = inspect(dir).unwrap();
    let Verdict::Inconsistent(inconsistency) = &verdict else { panic!("expected inconsistent, got {verdict:?}") };
    assert!(expect_kind(&inconsistency.kind), "{:?}", inconsistency.kind);
    assert_eq!(names(&inconsistency.files), involved);
    let message = verdict.to_string();
    assert!(message.contains(&format!("spate checkpoint repair {} --apply", dir.display())), "{message}");
    for file in involved {
        assert!(message.contains(file), "{message} should name {file}");
    }
    assert!(matches!(verdict.clone().into_consistent(), Err(LogStoreError::Inconsistent(_))));

    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().expect("a plan for an inconsistent directory");
    let before: Vec<(PathBuf, Vec<u8>)> =
        plan.actions.iter().map(|a| (a.to.clone(), fs::read(dir.join(&a.from)).unwrap())).collect();
    ck.apply_repair(&plan).unwrap();

    let after = ck.verdict().unwrap();
    assert_eq!(after.recovery_point(), Some(plan.after), "{after:?}");
    for (quarantined, bytes) in before {
        assert!(quarantined.starts_with(QUARANTINE_DIR));
        assert_eq!(fs::read(dir.join(&quarantined)).unwrap(), bytes, "moved intact to {}", quarantined.display());
    }
    let note = fs::read_to_string(dir.join(&plan.quarantine).join(REPAIR_NOTE)).unwrap();
    assert_eq!(note, plan.to_string());
    // Applying the same plan twice changes nothing more.
    assert!(matches!(ck.apply_repair(&plan), Err(LogStoreError::StalePlan { .. })));
    plan.after
}

#[test]
fn commit_ahead_is_refused_and_repaired() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1, 2, 3], &[0, 1, 2, 3]);
    fs::remove_file(dir.join("offsets/3")).unwrap();
    let message = inspect(dir).unwrap().to_string();
    assert!(message.contains("Concurrent update to the log"), "says why spate refuses: {message}");
    let after = repair(
        dir,
        |k| matches!(k, InconsistencyKind::CommitAhead { last_offsets: Some(BatchId(2)), last_commit: BatchId(3) }),
        &["offsets/3", "commits/3"],
    );
    assert_eq!(after, RecoveryPoint::Resume { next: BatchId(3) });
    assert!(dir.join("_quarantine/20251124T160000.000Z/commits/3").exists());
}

#[test]
fn gap_in_offsets_is_repaired() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1, 2, 3, 4], &[0, 1, 2, 3]);
    fs::remove_file(dir.join("offsets/2")).unwrap();
    let after = repair(
        dir,
        |k| matches!(k, InconsistencyKind::OffsetsGap { missing: BatchId(2), next_present: BatchId(3) }),
        &["offsets/2", "offsets/3", "offsets/4", "commits/2", "commits/3"],
    );
    assert_eq!(after, RecoveryPoint::Resume { next: BatchId(2) });
}

#[test]
fn gap_between_offsets_and_commits_is_repaired() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1, 2, 3], &[0]);
    let after = repair(
        dir,
        |k| matches!(k, InconsistencyKind::GapBetween { last_commit: Some(BatchId(0)), last_offsets: BatchId(3) }),
        &["offsets/1", "offsets/2", "offsets/3"],
    );
    assert_eq!(after, RecoveryPoint::Rerun { batch: BatchId(1) });
    assert!(matches!(inspect(dir).unwrap(), Verdict::Rerun { offsets: o, .. } if o == offsets(1)));
}

#[test]
fn gap_in_commits_is_repaired() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1, 2, 3], &[0, 1, 2, 3]);
    fs::remove_file(dir.join("commits/1")).unwrap();
    let after = repair(
        dir,
        |k| matches!(k, InconsistencyKind::CommitsGap { missing: BatchId(1), .. }),
        &["commits/1", "commits/2", "commits/3"],
    );
    assert_eq!(after, RecoveryPoint::Rerun { batch: BatchId(1) });
}

#[test]
fn unreadable_last_entry_is_repaired() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1, 2], &[0, 1, 2]);
    fs::write(dir.join("commits/2"), b"v1\n{\"nextBatchWat").unwrap();
    let after = repair(dir, |k| matches!(k, InconsistencyKind::Unreadable { .. }), &["commits/2"]);
    assert_eq!(after, RecoveryPoint::Rerun { batch: BatchId(2) });

    fs::write(dir.join("offsets/2"), b"v9\n{}").unwrap();
    let Verdict::Inconsistent(inconsistency) = inspect(dir).unwrap() else { panic!() };
    let message = inconsistency.to_string();
    assert!(message.contains("offsets/2") && message.contains("written by a newer spate"), "{message}");
}

#[test]
fn unreadable_metadata_is_reported() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0], &[0]);
    fs::write(dir.join("metadata"), b"\x00\x01garbage").unwrap();
    let after = repair(dir, |k| matches!(k, InconsistencyKind::Unreadable { .. }), &["metadata"]);
    assert_eq!(after, RecoveryPoint::Resume { next: BatchId(1) });
}

/// A checkpoint directory as Spark Structured Streaming 3.5 writes it,
/// written here by hand from Spark's format: `metadata` is bare JSON, the
/// offsets name no sources, `.crc` files lie beside the entries.
fn spark_checkpoint(dir: &Path) {
    let conf = r#"{"spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider","spark.sql.streaming.join.stateFormatVersion":"2","spark.sql.streaming.stateStore.compression.codec":"lz4","spark.sql.streaming.multipleWatermarkPolicy":"min","spark.sql.streaming.aggregation.stateFormatVersion":"2","spark.sql.shuffle.partitions":"200"}"#;
    fs::create_dir_all(dir.join("offsets")).unwrap();
    fs::create_dir_all(dir.join("commits")).unwrap();
    fs::create_dir_all(dir.join("sources/0")).unwrap();
    fs::write(dir.join("metadata"), r#"{"id":"5b0e4f7a-3c1d-4e2b-9f8a-6d5c4b3a2e1f"}"#).unwrap();
    for (id, kafka) in [(0, r#"{"topic":{"0":0,"1":0}}"#), (1, r#"{"topic":{"0":36,"1":12}}"#)] {
        let text = format!(
            "v1\n{{\"batchWatermarkMs\":0,\"batchTimestampMs\":{},\"conf\":{conf}}}\n{kafka}\n-",
            1_700_000_000_000u64 + id * 10_000
        );
        fs::write(dir.join(format!("offsets/{id}")), text).unwrap();
        fs::write(dir.join(format!("offsets/.{id}.crc")), b"crc\x00\x01").unwrap();
    }
    fs::write(dir.join("commits/0"), "v1\n{\"nextBatchWatermarkMs\":0}").unwrap();
}

#[test]
fn spark_offsets_are_read() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    spark_checkpoint(dir);
    let Verdict::Rerun { batch, offsets, last_commit } = inspect(dir).unwrap() else { panic!("expected a re-run") };
    assert_eq!(batch, BatchId(1));
    assert_eq!(last_commit, Some(CommitMetadata::default()));
    assert_eq!(offsets.batch_timestamp, Time::from_millis(1_700_000_010_000));
    assert_eq!(offsets.batch_watermark, Time::ZERO);
    assert_eq!(offsets.conf.get("spark.sql.shuffle.partitions").map(String::as_str), Some("200"));
    assert_eq!(offsets.conf.len(), 6);
    // Spark's lines are positional: the sources are named "0", "1".
    assert_eq!(offsets.sources.len(), 2);
    assert_eq!(offsets.offset_of("0"), Some(Some(&json!({"topic": {"0": 36, "1": 12}}))));
    assert_eq!(offsets.offset_of("1"), Some(None));

    let ck = Checkpoint::open_read_only(dir, options()).unwrap();
    assert_eq!(ck.metadata().map(|m| m.id.as_str()), Some("5b0e4f7a-3c1d-4e2b-9f8a-6d5c4b3a2e1f"));
    assert_eq!(ck.offsets().ids().unwrap(), vec![BatchId(0), BatchId(1)]);
}

#[test]
fn inspect_reads_only_the_newest_entries() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1, 2, 3], &[0, 1, 2]);
    // Damage every older entry: a verdict that read them would fail.
    for id in 0..3 {
        fs::write(dir.join(format!("offsets/{id}")), b"garbage").unwrap();
        fs::write(dir.join(format!("commits/{id}")), b"garbage").unwrap();
    }
    fs::write(dir.join("commits/2"), "v1\n{\"nextBatchWatermarkMs\":7}").unwrap();
    assert!(matches!(inspect(dir).unwrap(), Verdict::Rerun { batch: BatchId(3), .. }));
}

/// A runtime's graph manifest naming the snapshot of `batch` (20 ms batches).
fn graph(batch: u64) -> Vec<u8> {
    let time = offsets(batch).batch_timestamp.as_millis();
    serde_json::to_vec(
        &json!({"descriptor": {"batch_interval_ms": 20}, "state_batch": batch, "state_batch_time": time}),
    )
    .unwrap()
}

fn named_state(dir: &Path) -> (Option<u64>, Option<i64>) {
    let graph: serde_json::Value = serde_json::from_slice(
        &Checkpoint::open_read_only(dir, options()).unwrap().read_file("graph").unwrap().unwrap(),
    )
    .unwrap();
    (graph["state_batch"].as_u64(), graph["state_batch_time"].as_i64())
}

/// Offsets and commits 0..=last, snapshots of operators `a` and `b` at `snapshots`, `graph` naming the last of them.
fn with_state(dir: &Path, last: u64, snapshots: &[u64]) {
    let ids: Vec<u64> = (0..=last).collect();
    checkpoint(dir, &ids, &ids);
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    for batch in snapshots {
        ck.write_file(format!("state/a/{batch}"), b"a").unwrap();
        ck.write_file(format!("state/b/{batch}"), b"b").unwrap();
    }
    ck.replace_file("graph", &graph(*snapshots.last().unwrap())).unwrap();
}

#[test]
fn a_state_snapshot_after_the_last_commit_is_inconsistent_and_rolled_back_to_an_older_complete_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    with_state(dir, 6, &[2, 4, 6]);
    fs::remove_file(dir.join("state/b/4")).unwrap(); // not every operator: not a snapshot to restore
    assert!(matches!(inspect(dir).unwrap(), Verdict::Resume { next: BatchId(7), .. }));
    // The seed's scenario: offsets/6 gone after a graceful stop snapshotted batch 6.
    fs::remove_file(dir.join("offsets/6")).unwrap();
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    let moved: Vec<String> = plan.actions.iter().map(|a| a.from.display().to_string()).collect();
    assert_eq!(moved, ["commits/6", "state/a/6", "state/b/6"]);
    let state = plan.state.clone().unwrap();
    assert_eq!((state.from, state.to, state.replay), (BatchId(6), Some(BatchId(2)), Some((BatchId(3), BatchId(5)))));
    let text = plan.to_string();
    assert!(text.contains("it will name the state of batch 2") && text.contains("replaying batches 3 to 5"), "{text}");
    ck.apply_repair(&plan).unwrap();
    assert!(matches!(ck.verdict().unwrap(), Verdict::Resume { next: BatchId(6), .. }));
    assert_eq!(named_state(dir), (Some(2), Some(offsets(2).batch_timestamp.as_millis())));
    let kept = fs::read(dir.join(&plan.quarantine).join("graph")).unwrap();
    assert!(kept.ends_with(&graph(6)), "the original graph is kept in the quarantine");
    drop(ck);

    // Only the last commit lost, by hand: the logs are consistent, the state is not.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    with_state(dir, 9, &[8, 9]);
    fs::remove_file(dir.join("commits/9")).unwrap();
    let Verdict::Inconsistent(inconsistency) = inspect(dir).unwrap() else { panic!("a snapshot past the commits") };
    assert_eq!(
        inconsistency.kind,
        InconsistencyKind::StateAhead { state_batch: BatchId(9), last_commit: Some(BatchId(8)) }
    );
    assert_eq!(names(&inconsistency.files), ["graph", "state/a/9", "state/b/9"]);
    assert!(inconsistency.to_string().contains("count them twice"), "{inconsistency}");
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    assert_eq!(plan.state.as_ref().map(|s| (s.to, s.replay)), Some((Some(BatchId(8)), None)));
    ck.apply_repair(&plan).unwrap();
    assert!(matches!(ck.verdict().unwrap(), Verdict::Rerun { batch: BatchId(9), .. }));
    assert_eq!(named_state(dir).0, Some(8));
}

#[test]
fn without_an_older_snapshot_the_state_is_rebuilt_from_batch_0_or_the_plan_says_it_cannot_be() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    with_state(dir, 5, &[5]);
    fs::remove_file(dir.join("offsets/5")).unwrap();
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    let state = plan.state.clone().unwrap();
    assert_eq!((state.to, state.replay, state.unrecoverable), (None, Some((BatchId(0), BatchId(4))), None));
    ck.apply_repair(&plan).unwrap();
    assert_eq!(named_state(dir), (None, None));
    assert!(matches!(ck.verdict().unwrap(), Verdict::Resume { next: BatchId(5), .. }));
    drop(ck);

    // The offsets before the snapshot purged: nothing to rebuild it from, and the plan says so.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    with_state(dir, 5, &[5]);
    for id in 0..3 {
        fs::remove_file(dir.join(format!("offsets/{id}"))).unwrap();
        fs::remove_file(dir.join(format!("commits/{id}"))).unwrap();
    }
    fs::remove_file(dir.join("offsets/5")).unwrap();
    let plan = Checkpoint::open_read_only(dir, options()).unwrap().repair_plan().unwrap().unwrap();
    let text = plan.to_string();
    assert!(
        text.contains("cannot rebuild the operator state") && text.contains("before batch 3 were purged"),
        "{text}"
    );
}

/// A file of changes taken after the snapshot of `base`.
fn changes_file(base: u64) -> Vec<u8> {
    let mut file = changes_header(BatchId(base)).to_vec();
    file.extend_from_slice(b"SPTF changes");
    file
}

#[test]
fn a_repair_rolls_the_state_back_only_to_a_snapshot_whose_chain_of_changes_is_whole() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ids: Vec<u64> = (0..=8).collect();
    checkpoint(dir, &ids, &ids);
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    // `a` takes changes: whole at 2, changes at 4 (on 2), 6 (on 4) and 8 (on 6);
    // `b` snapshots whole every time.
    ck.write_file("state/a/2", b"SPTF whole").unwrap();
    for (batch, base) in [(4, 2), (6, 4), (8, 6)] {
        ck.write_file(format!("state/a/{batch}"), &changes_file(base)).unwrap();
    }
    for batch in [2, 4, 6, 8] {
        ck.write_file(format!("state/b/{batch}"), b"SPTF whole").unwrap();
    }
    ck.replace_file("graph", &graph(8)).unwrap();
    // Batch 4's link of `a` lost: the snapshots of 4 and 6 can no longer be restored.
    fs::remove_file(dir.join("state/a/4")).unwrap();
    fs::remove_file(dir.join("offsets/8")).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    let state = plan.state.clone().unwrap();
    assert_eq!((state.from, state.to, state.replay), (BatchId(8), Some(BatchId(2)), Some((BatchId(3), BatchId(7)))));
    ck.apply_repair(&plan).unwrap();
    assert_eq!(named_state(dir).0, Some(2));
    drop(ck);

    // With every link there, the newest older snapshot is the one named.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &ids, &ids);
    let ck = Checkpoint::open_for_write(dir, options()).unwrap();
    ck.write_file("state/a/2", b"SPTF whole").unwrap();
    for (batch, base) in [(4, 2), (6, 4), (8, 6)] {
        ck.write_file(format!("state/a/{batch}"), &changes_file(base)).unwrap();
    }
    ck.replace_file("graph", &graph(8)).unwrap();
    fs::remove_file(dir.join("offsets/8")).unwrap();
    let plan = ck.repair_plan().unwrap().unwrap();
    assert_eq!(plan.state.map(|s| (s.to, s.replay)), Some((Some(BatchId(6)), Some((BatchId(7), BatchId(7))))));
}

#[test]
fn state_files_deeper_than_operator_and_batch_are_not_spates_and_are_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    checkpoint(dir, &[0, 1], &[0, 1]);
    // A Spark checkpoint's state: state/<operator>/<partition>/<version>.delta.
    fs::create_dir_all(dir.join("state/0/7")).unwrap();
    fs::write(dir.join("state/0/7/2.delta"), b"spark").unwrap();
    assert!(matches!(inspect(dir).unwrap(), Verdict::Resume { next: BatchId(2), .. }));
}
