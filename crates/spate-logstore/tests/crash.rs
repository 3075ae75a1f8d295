//! Crash and failure injection at every step of the atomic write: after
//! each, reopening the log shows the old state or the new one, never a torn
//! file, and the log keeps working.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use spate_core::{BatchId, Time};
use spate_logstore::{
    Checkpoint, CheckpointOptions, FaultMode, FaultPoint, FaultyFileManager, LocalFileManager, OffsetLog, OffsetSeq,
    SourceOffset, Verdict,
};

fn entry(id: u64) -> OffsetSeq {
    OffsetSeq {
        batch_timestamp: Time::from_millis(1_700_000_000_000 + id as i64 * 1000),
        sources: vec![SourceOffset::new("events", Some(json!({"events": {"0": id * 10, "1": id}})))],
        ..OffsetSeq::default()
    }
}

/// Writes batches 0..3 with a healthy manager, then tries batch 3 with a fault.
fn run_with_fault(dir: &Path, point: FaultPoint, mode: FaultMode) -> (bool, spate_logstore::Result<bool>) {
    let healthy = OffsetLog::open(Arc::new(LocalFileManager), dir).unwrap();
    for id in 0..3 {
        assert!(healthy.add(BatchId(id), &entry(id)).unwrap());
    }
    let faulty = Arc::new(FaultyFileManager::new());
    let log = OffsetLog::open(faulty.clone(), dir).unwrap();
    faulty.arm(point, mode);
    let result = log.add(BatchId(3), &entry(3));
    (faulty.has_crashed(), result)
}

/// The state after "restarting": either old (0..3) or new (0..=3); every entry reads back intact.
fn assert_old_or_new(dir: &Path, point: FaultPoint, mode: FaultMode) -> bool {
    let log = OffsetLog::open(Arc::new(LocalFileManager), dir).unwrap();
    let ids = log.ids().unwrap();
    let new = match ids.len() {
        3 => false,
        4 => true,
        n => panic!("{point:?}/{mode:?}: {n} entries"),
    };
    for (id, value) in log.get_range(None, None).unwrap() {
        assert_eq!(value, entry(id.0), "{point:?}/{mode:?}: entry {id} torn");
    }
    assert_eq!(log.latest().unwrap().map(|(id, _)| id), Some(BatchId(if new { 3 } else { 2 })));
    new
}

#[test]
fn crash_at_every_step_leaves_old_or_new_state() {
    for point in FaultPoint::ALL {
        let dir = tempfile::tempdir().unwrap();
        let (crashed, result) = run_with_fault(dir.path(), point, FaultMode::Crash);
        assert!(crashed && result.is_err(), "{point:?}: the crash must stop the add");
        let new = assert_old_or_new(dir.path(), point, FaultMode::Crash);
        // Past the link the entry is whole and visible; before it, absent.
        let linked = matches!(point, FaultPoint::AfterRename | FaultPoint::DirFsync | FaultPoint::AfterDirFsync);
        assert_eq!(new, linked, "{point:?}");

        // Restart as the runtime does: the writer cleans temp files and carries on.
        let checkpoint_like = OffsetLog::open(Arc::new(LocalFileManager), dir.path()).unwrap();
        let cleaned = spate_logstore::CheckpointFileManager::clean_temp_files(&LocalFileManager, dir.path()).unwrap();
        let temp_expected =
            !matches!(point, FaultPoint::BeforeTempWrite | FaultPoint::DirFsync | FaultPoint::AfterDirFsync);
        assert_eq!(cleaned, usize::from(temp_expected), "{point:?}: temp files left");
        assert_eq!(checkpoint_like.add(BatchId(3), &entry(3)).unwrap(), !new, "{point:?}");
        assert_eq!(checkpoint_like.get(BatchId(3)).unwrap(), Some(entry(3)));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4, "{point:?}: only the four entries remain");
    }
}

#[test]
fn failure_at_every_step_is_reported_and_cleaned_up() {
    for point in FaultPoint::ALL {
        let dir = tempfile::tempdir().unwrap();
        let (crashed, result) = run_with_fault(dir.path(), point, FaultMode::Fail);
        assert!(!crashed);
        assert!(result.is_err(), "{point:?}: a failed step must surface as an error");
        let new = assert_old_or_new(dir.path(), point, FaultMode::Fail);
        // Nothing but entries is left behind by a failed write (the error path removes its temp file).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3 + usize::from(new), "{point:?}");
    }
}

#[test]
fn checkpoint_open_cleans_temp_files_left_by_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFileManager::new());
    {
        let ck = Checkpoint::open_for_write(dir.path(), CheckpointOptions::new().file_manager(faulty.clone())).unwrap();
        ck.offsets().add(BatchId(0), &entry(0)).unwrap();
        faulty.arm(FaultPoint::TempFsync, FaultMode::Crash);
        assert!(ck.offsets().add(BatchId(1), &entry(1)).is_err());
    }
    let temp_files = || {
        std::fs::read_dir(dir.path().join("offsets"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
            .count()
    };
    assert_eq!(temp_files(), 1);
    let ck = Checkpoint::open_for_write(dir.path(), CheckpointOptions::new()).unwrap();
    assert_eq!(temp_files(), 0);
    assert!(matches!(ck.verdict().unwrap(), Verdict::Rerun { batch: BatchId(0), .. }));
}
