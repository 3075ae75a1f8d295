//! Crash and failure injection at every step of the atomic write: after
//! each, reopening the log shows the old state or the new one, never a torn
//! file, and the log keeps working. Each runs on a plain file system, with
//! short writes, and with a crash that loses everything not yet synced;
//! failures are injected errors and a full disk (ENOSPC).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use spate_core::{BatchId, FrameCodec, PayloadSink, SeekWrite, Time};
use spate_logstore::{
    Checkpoint, CheckpointSettings, FaultMode, FaultPoint, FaultyFileManager, LocalFileManager, LogStoreError,
    OffsetLog, OffsetSeq, SourceOffset, Verdict,
};

fn entry(id: u64) -> OffsetSeq {
    OffsetSeq {
        batch_timestamp: Time::from_millis(1_700_000_000_000 + id as i64 * 1000),
        sources: vec![SourceOffset::new("events", Some(json!({"events": {"0": id * 10, "1": id}})))],
        ..OffsetSeq::default()
    }
}

/// How the faulty manager behaves besides the armed fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setting {
    /// Like the local file system.
    Plain,
    /// Every write(2) takes three bytes.
    ShortWrites,
    /// A crash drops everything not yet synced.
    LosingUnsynced,
}

const SETTINGS: [Setting; 3] = [Setting::Plain, Setting::ShortWrites, Setting::LosingUnsynced];

fn manager(setting: Setting) -> Arc<FaultyFileManager> {
    let manager = match setting {
        Setting::LosingUnsynced => FaultyFileManager::new().losing_unsynced_data(),
        Setting::Plain | Setting::ShortWrites => FaultyFileManager::new(),
    };
    if setting == Setting::ShortWrites {
        manager.short_writes(3);
    }
    Arc::new(manager)
}

/// Writes batches 0..3 into a new directory, then tries batch 3 with a
/// fault, all through one faulty manager (so what it has not synced is known).
fn run_with_fault(
    dir: &Path,
    point: FaultPoint,
    mode: FaultMode,
    setting: Setting,
) -> (bool, spate_logstore::Result<bool>) {
    let faulty = manager(setting);
    let log = OffsetLog::open(faulty.clone(), dir).unwrap();
    for id in 0..3 {
        assert!(log.add(BatchId(id), &entry(id)).unwrap());
    }
    faulty.arm(point, mode);
    let result = log.add(BatchId(3), &entry(3));
    (faulty.has_crashed(), result)
}

/// The state after "restarting": either old (0..3) or new (0..=3); every entry reads back intact.
fn assert_old_or_new(dir: &Path, point: FaultPoint, mode: FaultMode, setting: Setting) -> bool {
    let log = OffsetLog::open(Arc::new(LocalFileManager), dir).unwrap();
    let ids = log.ids().unwrap();
    let new = match ids.len() {
        3 => false,
        4 => true,
        n => panic!("{setting:?} {point:?}/{mode:?}: {n} entries; a write that returned was lost"),
    };
    for (id, value) in log.get_range(None, None).unwrap() {
        assert_eq!(value, entry(id.0), "{setting:?} {point:?}/{mode:?}: entry {id} torn");
    }
    assert_eq!(log.latest().unwrap().map(|(id, _)| id), Some(BatchId(if new { 3 } else { 2 })));
    new
}

#[test]
fn crash_at_every_step_leaves_old_or_new_state() {
    for setting in SETTINGS {
        for point in FaultPoint::ALL {
            let root = tempfile::tempdir().unwrap();
            // A directory the manager creates, so its own name must be made durable too.
            let dir = root.path().join("ck/offsets");
            let (crashed, result) = run_with_fault(&dir, point, FaultMode::Crash, setting);
            assert!(crashed && result.is_err(), "{setting:?} {point:?}: the crash must stop the add");
            let new = assert_old_or_new(&dir, point, FaultMode::Crash, setting);
            // Past the link the entry is whole and visible; before it, absent. Losing
            // unsynced data, only a directory fsync makes the link stay.
            let linked = match setting {
                Setting::LosingUnsynced => point == FaultPoint::AfterDirFsync,
                Setting::Plain | Setting::ShortWrites => {
                    matches!(point, FaultPoint::AfterRename | FaultPoint::DirFsync | FaultPoint::AfterDirFsync)
                }
            };
            assert_eq!(new, linked, "{setting:?} {point:?}");

            // Restart as the runtime does: the writer cleans temp files and carries on.
            let checkpoint_like = OffsetLog::open(Arc::new(LocalFileManager), &dir).unwrap();
            let cleaned = spate_logstore::CheckpointFileManager::clean_temp_files(&LocalFileManager, &dir).unwrap();
            let no_temp = match setting {
                // An unsynced removal of the temp name is lost with the rest.
                Setting::LosingUnsynced => matches!(point, FaultPoint::BeforeTempWrite | FaultPoint::AfterDirFsync),
                Setting::Plain | Setting::ShortWrites => {
                    matches!(point, FaultPoint::BeforeTempWrite | FaultPoint::DirFsync | FaultPoint::AfterDirFsync)
                }
            };
            assert_eq!(cleaned, usize::from(!no_temp), "{setting:?} {point:?}: temp files left");
            assert_eq!(checkpoint_like.add(BatchId(3), &entry(3)).unwrap(), !new, "{setting:?} {point:?}");
            assert_eq!(checkpoint_like.get(BatchId(3)).unwrap(), Some(entry(3)));
            assert_eq!(
                std::fs::read_dir(&dir).unwrap().count(),
                4,
                "{setting:?} {point:?}: only the four entries remain"
            );
        }
    }
}

#[test]
fn failure_at_every_step_is_reported_and_cleaned_up() {
    for setting in SETTINGS {
        for mode in [FaultMode::Fail, FaultMode::NoSpace] {
            for point in FaultPoint::ALL {
                let dir = tempfile::tempdir().unwrap();
                let (crashed, result) = run_with_fault(dir.path(), point, mode, setting);
                assert!(!crashed);
                let err = result.expect_err("a failed step must surface as an error");
                if mode == FaultMode::NoSpace {
                    let full = matches!(&err, LogStoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull);
                    assert!(full, "{setting:?} {point:?}: {err:?}");
                }
                let new = assert_old_or_new(dir.path(), point, mode, setting);
                // Nothing but entries is left behind by a failed write (the error path removes its temp file).
                let count = std::fs::read_dir(dir.path()).unwrap().count();
                assert_eq!(count, 3 + usize::from(new), "{setting:?} {point:?}/{mode:?}");
            }
        }
    }
}

#[test]
fn short_writes_still_write_whole_entries() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = manager(Setting::ShortWrites);
    let ck = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new().with_file_manager(faulty)).unwrap();
    for id in 0..5 {
        ck.offsets().add(BatchId(id), &entry(id)).unwrap();
    }
    ck.replace_file("graph", b"a graph longer than three bytes").unwrap();
    let log = OffsetLog::open(Arc::new(LocalFileManager), dir.path().join("offsets")).unwrap();
    for (id, value) in log.get_range(None, None).unwrap() {
        assert_eq!(value, entry(id.0));
    }
    assert_eq!(ck.read_file("graph").unwrap(), Some(b"a graph longer than three bytes".to_vec()));
}

#[test]
fn a_checkpoint_losing_unsynced_data_keeps_every_write_that_returned() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("new/ck");
    let faulty = manager(Setting::LosingUnsynced);
    {
        let ck = Checkpoint::open_for_write(&dir, CheckpointSettings::new().with_file_manager(faulty.clone())).unwrap();
        ck.offsets().add(BatchId(0), &entry(0)).unwrap();
        ck.commits().add(BatchId(0), &spate_logstore::CommitMetadata::default()).unwrap();
        ck.write_file("state/op/0", b"state").unwrap();
        ck.offsets().add(BatchId(1), &entry(1)).unwrap();
        faulty.arm(FaultPoint::DirFsync, FaultMode::Crash);
        assert!(ck.commits().add(BatchId(1), &spate_logstore::CommitMetadata::default()).is_err());
    }
    let ck = Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap();
    assert!(matches!(ck.verdict().unwrap(), Verdict::Rerun { batch: BatchId(1), .. }), "{:?}", ck.verdict());
    assert_eq!(ck.read_file("state/op/0").unwrap(), Some(b"state".to_vec()));
}

#[test]
fn checkpoint_open_cleans_temp_files_left_by_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyFileManager::new());
    {
        let ck = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new().with_file_manager(faulty.clone()))
            .unwrap();
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
    let ck = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
    assert_eq!(temp_files(), 0);
    assert!(matches!(ck.verdict().unwrap(), Verdict::Rerun { batch: BatchId(0), .. }));
}

#[test]
fn a_replace_that_crashes_before_its_directory_fsync_leaves_the_old_file() {
    for point in [FaultPoint::AfterRename, FaultPoint::DirFsync, FaultPoint::AfterDirFsync] {
        let root = tempfile::tempdir().unwrap();
        let faulty = manager(Setting::LosingUnsynced);
        {
            let options = CheckpointSettings::new().with_file_manager(faulty.clone());
            let ck = Checkpoint::open_for_write(root.path(), options).unwrap();
            ck.replace_file("graph", b"one").unwrap();
            faulty.arm(point, FaultMode::Crash);
            assert!(ck.replace_file("graph", b"two").is_err());
        }
        let ck = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
        let expected: &[u8] = if point == FaultPoint::AfterDirFsync { b"two" } else { b"one" };
        assert_eq!(ck.read_file("graph").unwrap().as_deref(), Some(expected), "{point:?}");
    }
}

/// A frame of a few thousand records, streamed as a large operator state
/// is (its header written last, seeking back), and the same frame made in
/// memory.
fn streamed_frame() -> (impl FnMut(&mut dyn SeekWrite) -> std::io::Result<()>, Vec<u8>) {
    let codec = FrameCodec::new(1);
    let records: Vec<Vec<u8>> = (0..3000u32).map(|i| i.to_le_bytes().repeat(1 + i as usize % 50)).collect();
    let mut expected = Vec::new();
    codec
        .encode_with(&mut expected, |out| {
            records.iter().for_each(|r| out.extend_from_slice(r));
            Ok(())
        })
        .unwrap();
    let stream = move |out: &mut dyn SeekWrite| {
        let written = codec.encode_streamed(out, |chunks| {
            for record in &records {
                chunks.buffer().extend_from_slice(record);
                chunks.record_end()?;
            }
            Ok(())
        });
        written.map(drop).map_err(std::io::Error::other)
    };
    (stream, expected)
}

#[test]
fn a_streamed_file_is_absent_or_whole_after_a_crash_at_every_step() {
    let (mut stream, expected) = streamed_frame();
    for setting in SETTINGS {
        for point in FaultPoint::ALL {
            let root = tempfile::tempdir().unwrap();
            let faulty = manager(setting);
            {
                let options = CheckpointSettings::new().with_file_manager(faulty.clone());
                let ck = Checkpoint::open_for_write(root.path(), options).unwrap();
                faulty.arm(point, FaultMode::Crash);
                assert!(ck.write_file_streamed("state/op/4", &mut stream).is_err(), "{setting:?} {point:?}");
            }
            let ck = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
            match ck.read_file("state/op/4").unwrap() {
                Some(found) => assert!(found == expected, "{setting:?} {point:?}: a torn state file"),
                None => {
                    let written = ck.write_file_streamed("state/op/4", &mut stream).unwrap();
                    assert_eq!(written, expected.len() as u64, "{setting:?} {point:?}");
                    assert_eq!(ck.read_file("state/op/4").unwrap().as_ref(), Some(&expected));
                }
            }
        }
    }
}

#[test]
fn a_streamed_file_whose_content_fails_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new()).unwrap();
    let result = ck.write_file_streamed("state/op/4", &mut |out: &mut dyn SeekWrite| {
        out.write_all(b"half a state")?;
        Err(std::io::Error::other("the state did not encode"))
    });
    let failed =
        matches!(&result, Err(LogStoreError::Io { source, .. }) if source.to_string() == "the state did not encode");
    assert!(failed, "{result:?}");
    assert_eq!(std::fs::read_dir(dir.path().join("state/op")).unwrap().count(), 0, "no file, no temp file");
    assert_eq!(ck.read_file("state/op/4").unwrap(), None);
}
