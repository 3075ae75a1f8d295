//! The writer fence: a stale writer's appends are refused when its fence
//! knows, and never read back by a later writer when it does not; segment
//! and spare names carry the epoch; seals; permissions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use spate_core::{Duration, Time, WriterFence};
use spate_wal::{FileWriteAheadLog, WalError, WalSettings, WriteAheadLog};

/// A fence a test revokes by hand.
#[derive(Debug)]
struct TestFence {
    epoch: u64,
    revoked: AtomicBool,
}

impl TestFence {
    fn new(epoch: u64) -> Arc<TestFence> {
        Arc::new(TestFence { epoch, revoked: AtomicBool::new(false) })
    }

    fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
    }
}

impl WriterFence for TestFence {
    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn check(&self) -> Result<(), String> {
        if self.revoked.load(Ordering::SeqCst) {
            Err(format!("epoch {} lost the lock to a later writer", self.epoch))
        } else {
            Ok(())
        }
    }
}

fn options() -> WalSettings {
    WalSettings::default().with_rolling_interval(Duration::from_secs(1))
}

fn open(dir: &Path, epoch: u64) -> FileWriteAheadLog {
    FileWriteAheadLog::open(dir, options().with_fence(TestFence::new(epoch))).unwrap()
}

fn read_all(log: &FileWriteAheadLog) -> Vec<Vec<u8>> {
    log.read_all().unwrap().collect::<Result<_, _>>().unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

fn bytes_of(dir: &Path) -> u64 {
    files_in(dir).iter().filter(|n| n.starts_with("log-")).map(|n| std::fs::metadata(dir.join(n)).unwrap().len()).sum()
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_writer_whose_fence_fails_cannot_append_roll_or_clean_and_stays_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fence = TestFence::new(1);
    let log = FileWriteAheadLog::open(dir.path(), options().with_fence(fence.clone())).unwrap();
    assert_eq!(log.epoch(), 1);
    let kept = log.write(b"before", Time::from_millis(0)).unwrap();
    assert_eq!(kept.segment, "log-0-1000-e1", "the segment name carries the epoch");
    let bytes = bytes_of(dir.path());
    fence.revoke();
    for time in [0, 5_000] {
        let err = log.write(b"stale", Time::from_millis(time)).unwrap_err();
        assert!(
            matches!(&err, WalError::Fenced { epoch: 1, op: "append", reason, dir: d }
                if reason.contains("lost the lock") && d == dir.path()),
            "{err}"
        );
        assert!(err.to_string().contains(&dir.path().display().to_string()), "the error names the directory: {err}");
    }
    let err = log.clean(Time::from_millis(10_000), true).unwrap_err();
    assert!(matches!(err, WalError::Fenced { epoch: 1, .. }), "{err}");
    assert_eq!(bytes_of(dir.path()), bytes, "nothing was written or deleted");
    assert_eq!(files_in(dir.path()), vec!["log-0-1000-e1", "seal-e1"]);
    assert_eq!(log.read(&kept).unwrap(), b"before", "reads still work");
    assert_eq!(read_all(&log), vec![b"before".to_vec()]);
}

#[test]
fn a_refused_writer_stays_refused_even_if_its_fence_holds_again() {
    #[derive(Debug)]
    struct Flaky(AtomicBool);
    impl WriterFence for Flaky {
        fn epoch(&self) -> u64 {
            3
        }
        fn check(&self) -> Result<(), String> {
            if self.0.load(Ordering::SeqCst) { Err(String::from("lock file unreadable")) } else { Ok(()) }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let fence = Arc::new(Flaky(AtomicBool::new(false)));
    let log = FileWriteAheadLog::open(dir.path(), options().with_fence(fence.clone())).unwrap();
    fence.0.store(true, Ordering::SeqCst);
    assert!(matches!(log.write(b"x", Time::from_millis(0)), Err(WalError::Fenced { .. })));
    fence.0.store(false, Ordering::SeqCst);
    let err = log.write(b"y", Time::from_millis(0)).unwrap_err();
    assert!(matches!(&err, WalError::Fenced { reason, .. } if reason == "lock file unreadable"), "{err}");
    assert!(read_all(&log).is_empty());
}

#[test]
fn bytes_a_stale_writer_lands_after_a_takeover_are_never_read_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // The stale writer's fence cannot tell it lost the lock (a lock file on
    // a network file system): only the names and the seal protect the log.
    let stale = open(dir.path(), 1);
    let first = stale.write(b"first", Time::from_millis(0)).unwrap();
    stale.write(b"second", Time::from_millis(1_000)).unwrap();

    let new = open(dir.path(), 2);
    assert!(dir.path().join("seal-e2").exists(), "the new writer sealed before its first append");
    // The stale writer goes on: into its active segment, into a new segment,
    // and into a time range the new writer writes too.
    let late_same = stale.write(b"stale in its active segment", Time::from_millis(1_500)).unwrap();
    stale.write(b"stale in a new segment", Time::from_millis(2_000)).unwrap();
    let mine = new.write(b"third", Time::from_millis(2_000)).unwrap();
    assert_eq!(mine.segment, "log-2000-3000-e2", "never the stale writer's log-2000-3000-e1");
    stale.write(b"stale after the new writer wrote", Time::from_millis(2_500)).unwrap();

    let expected = vec![b"first".to_vec(), b"second".to_vec(), b"third".to_vec()];
    assert_eq!(read_all(&new), expected);
    // Reads by handle of older segments keep working.
    assert_eq!(new.read(&first).unwrap(), b"first");
    assert_eq!(new.read(&late_same).unwrap(), b"stale in its active segment");
    drop(stale);
    drop(new);

    // Reopened at the same epoch (its seal is read back) and at a later one
    // (which carries the sealed lengths over), nothing stale appears.
    assert_eq!(read_all(&open(dir.path(), 2)), expected);
    let later = open(dir.path(), 3);
    assert_eq!(read_all(&later), expected);
    assert!(!dir.path().join("seal-e2").exists(), "the seal of epoch 3 supersedes that of epoch 2");
    drop(later);
    assert_eq!(read_all(&open(dir.path(), 3)), expected);
}

#[test]
fn a_torn_tail_of_an_earlier_epoch_is_sealed_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let stale = open(dir.path(), 1);
    stale.write(b"whole", Time::from_millis(0)).unwrap();
    drop(stale);
    let segment = dir.path().join("log-0-1000-e1");
    let mut file = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
    std::io::Write::write_all(&mut file, &[0x21; 7]).unwrap();
    let len = std::fs::metadata(&segment).unwrap().len();

    let new = open(dir.path(), 2);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), len, "another epoch's segment is never truncated");
    assert_eq!(read_all(&new), vec![b"whole".to_vec()]);
    // A stale writer completing its record after the seal changes nothing.
    std::io::Write::write_all(&mut file, &[0x21; 100]).unwrap();
    assert_eq!(read_all(&new), vec![b"whole".to_vec()]);
}

#[test]
fn opening_below_the_directorys_epoch_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path(), 2).write(b"x", Time::from_millis(0)).unwrap();
    for epoch in [0, 1] {
        let err = FileWriteAheadLog::open(dir.path(), options().with_fence(TestFence::new(epoch))).unwrap_err();
        assert!(
            matches!(&err, WalError::NewerEpoch { found: 2, ours, file, .. } if *ours == epoch && file.ends_with("e2")),
            "{err}"
        );
    }
    let err = FileWriteAheadLog::open(dir.path(), options()).unwrap_err();
    assert!(matches!(err, WalError::NewerEpoch { ours: 0, .. }), "unfenced is epoch 0: {err}");
    // A seal alone is enough: a later writer opened, even if it wrote nothing.
    let sealed_only = tempfile::tempdir().unwrap();
    drop(open(sealed_only.path(), 5));
    let err = FileWriteAheadLog::open(sealed_only.path(), options().with_fence(TestFence::new(4))).unwrap_err();
    assert!(matches!(&err, WalError::NewerEpoch { file, found: 5, .. } if file == "seal-e5"), "{err}");
    // A fence that fails at open is refused too, before anything is written.
    let fence = TestFence::new(9);
    fence.revoke();
    let err = FileWriteAheadLog::open(dir.path(), options().with_fence(fence)).unwrap_err();
    assert!(matches!(err, WalError::Fenced { op: "open", epoch: 9, .. }), "{err}");
    assert!(!dir.path().join("seal-e9").exists());
}

#[test]
fn legacy_segment_names_are_read_and_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let handle = legacy.write(b"legacy 1", Time::from_millis(0)).unwrap();
    legacy.write(b"legacy 2", Time::from_millis(1_000)).unwrap();
    assert_eq!(legacy.segment_names(), vec!["log-0-1000", "log-1000-2000"], "unfenced: Spark's names");
    drop(legacy);
    assert_eq!(read_all(&FileWriteAheadLog::open(dir.path(), options()).unwrap()).len(), 2);

    let log = open(dir.path(), 1);
    log.write(b"fenced", Time::from_millis(1_000)).unwrap();
    assert_eq!(log.read(&handle).unwrap(), b"legacy 1");
    assert_eq!(read_all(&log), vec![b"legacy 1".to_vec(), b"legacy 2".to_vec(), b"fenced".to_vec()]);
    assert_eq!(files_in(dir.path()), vec!["log-0-1000", "log-1000-2000", "log-1000-2000-e1", "seal-e1"]);
    // Cleaning deletes old segments of every epoch whole.
    log.write(b"later", Time::from_millis(5_000)).unwrap();
    log.clean(Time::from_millis(3_000), true).unwrap();
    assert_eq!(files_in(dir.path()), vec!["log-5000-6000-e1", "seal-e1"]);
}

#[test]
fn spares_of_an_earlier_epoch_are_never_reused_and_its_segments_never_recycled() {
    let dir = tempfile::tempdir().unwrap();
    let with_spares = |epoch| {
        FileWriteAheadLog::open(dir.path(), options().with_recycled_segments(2).with_fence(TestFence::new(epoch)))
            .unwrap()
    };
    let stale = with_spares(1);
    stale.write(&[1; 4000], Time::from_millis(0)).unwrap();
    stale.write(&[2; 4000], Time::from_millis(1_000)).unwrap();
    stale.clean(Time::from_millis(1_001), true).unwrap();
    assert!(
        dir.path().join("spare-e1-0").exists(),
        "spare names carry the epoch (and this file system must zero files in place: {:?})",
        files_in(dir.path())
    );
    let new = with_spares(2);
    assert!(!dir.path().join("spare-e1-0").exists(), "the earlier epoch's spare is deleted, not adopted");
    new.write(b"new", Time::from_millis(2_000)).unwrap();
    new.write(b"newer", Time::from_millis(3_000)).unwrap();
    // The earlier epoch's segment is deleted; only the own one is recycled.
    new.clean(Time::from_millis(3_001), true).unwrap();
    assert_eq!(files_in(dir.path()), vec!["log-3000-4000-e2", "seal-e2", "spare-e2-0"]);
    drop(stale);
}

#[test]
fn the_directory_and_every_file_are_owner_only() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("receivedData").join("0");
    let log = FileWriteAheadLog::open(&dir, options().with_recycled_segments(1).with_fence(TestFence::new(1))).unwrap();
    log.write(b"a", Time::from_millis(0)).unwrap();
    log.write(b"b", Time::from_millis(1_000)).unwrap();
    log.clean(Time::from_millis(1_001), true).unwrap();
    drop(log);
    assert_eq!(mode_of(&dir), 0o700);
    assert_eq!(mode_of(&parent.path().join("receivedData")), 0o700, "created parents too");
    let names = files_in(&dir);
    assert!(names.contains(&String::from("seal-e1")) && names.iter().any(|n| n.starts_with("log-")), "{names:?}");
    for name in &names {
        assert_eq!(mode_of(&dir.join(name)), 0o600, "{name}");
    }
}

#[test]
fn an_existing_directory_with_wider_modes_is_tightened_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    log.write(b"a", Time::from_millis(0)).unwrap();
    drop(log);
    std::fs::write(dir.path().join("notes.txt"), b"not the log's").unwrap();
    for (name, mode) in [(".", 0o755), ("log-0-1000", 0o644), ("notes.txt", 0o644)] {
        std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    drop(FileWriteAheadLog::open(dir.path(), options()).unwrap());
    assert_eq!(mode_of(dir.path()), 0o700);
    assert_eq!(mode_of(&dir.path().join("log-0-1000")), 0o600);
    assert_eq!(mode_of(&dir.path().join("notes.txt")), 0o644, "files that are not the log's are left alone");
}

#[test]
fn a_damaged_seal_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), 1));
    open(dir.path(), 2).write(b"x", Time::from_millis(0)).unwrap();
    let seal = dir.path().join("seal-e2");
    let mut bytes = std::fs::read(&seal).unwrap();
    bytes[13] ^= 1;
    std::fs::write(&seal, bytes).unwrap();
    for epoch in [2, 3] {
        let err = FileWriteAheadLog::open(dir.path(), options().with_fence(TestFence::new(epoch))).unwrap_err();
        assert!(matches!(&err, WalError::BadSeal { path, .. } if *path == seal), "epoch {epoch}: {err}");
    }
}
