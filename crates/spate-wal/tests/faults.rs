//! Faults the file layer injects: a full device, short writes, failed
//! truncations and directory syncs, lost unsynced data, and a crash at
//! every operation of a workload.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::Epoch;
use spate_core::{Duration, Time};
use spate_wal::{AppendFault, FaultInjection, FileWriteAheadLog, SyncPolicy, WalError, WalSettings, WriteAheadLog};

fn options(hook: &FaultInjection) -> WalSettings {
    WalSettings::default().with_rolling_interval(Duration::from_secs(1)).with_fault_injection(hook.clone())
}

fn read_all(log: &FileWriteAheadLog) -> Vec<Vec<u8>> {
    log.read_all().unwrap().collect::<Result<_, _>>().unwrap()
}

fn reopened(dir: &Path) -> Vec<Vec<u8>> {
    read_all(&FileWriteAheadLog::open(dir, options(&FaultInjection::new())).unwrap())
}

#[test]
fn a_full_device_or_a_short_write_fails_the_write_poisons_the_log_and_leaves_no_half_record() {
    for fault in
        [AppendFault::NoSpace { written: 0 }, AppendFault::NoSpace { written: 7 }, AppendFault::Short { written: 20 }]
    {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        let log = FileWriteAheadLog::open(dir.path(), options(&hook)).unwrap();
        log.write(b"kept", Time::from_millis(0)).unwrap();
        hook.fault_append_number(hook.append_count() + 1, fault);
        let err = log.write(&[9; 64], Time::from_millis(0)).unwrap_err();
        match (&err, fault) {
            (WalError::Io { op: "append", source, .. }, AppendFault::NoSpace { .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::StorageFull, "{err}");
            }
            (WalError::Io { op: "append", .. }, AppendFault::Short { .. }) => {}
            _ => panic!("{fault:?}: {err}"),
        }
        assert!(matches!(log.write(b"later", Time::from_millis(0)), Err(WalError::Poisoned { .. })));
        assert_eq!(read_all(&log), vec![b"kept".to_vec()], "{fault:?}");
        drop(log);
        assert_eq!(reopened(dir.path()), vec![b"kept".to_vec()], "{fault:?}: the partial record is cut on open");
    }
}

#[test]
fn a_failed_truncation_fails_the_open_or_poisons_the_log() {
    // On open: a torn tail that cannot be cut is an error, not ignored.
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options(&FaultInjection::new())).unwrap();
    log.write(b"kept", Time::from_millis(0)).unwrap();
    drop(log);
    let segment = dir.path().join("log-0-1000");
    let mut file = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
    std::io::Write::write_all(&mut file, &[0x33; 5]).unwrap();
    let hook = FaultInjection::new();
    hook.fail_truncate_number(1);
    let err = FileWriteAheadLog::open(dir.path(), options(&hook)).unwrap_err();
    assert!(matches!(err, WalError::Io { op: "truncate", .. }), "{err}");
    assert_eq!(reopened(dir.path()), vec![b"kept".to_vec()]);

    // At a roll out of a recycled segment: the zeros after its records
    // would read as damage in the middle of the log, so the log is poisoned.
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options(&hook).with_recycled_segments(1)).unwrap();
    log.write(&[1; 3000], Time::from_millis(0)).unwrap();
    log.write(b"b", Time::from_millis(1_000)).unwrap();
    log.clean(Time::from_millis(1_001), true).unwrap();
    assert!(dir.path().join("spare-0").exists(), "this file system must zero files in place for this test");
    log.write(b"c", Time::from_millis(2_000)).unwrap(); // in the spare
    hook.fail_truncate_number(hook.truncate_count() + 1);
    let err = log.write(b"d", Time::from_millis(3_000)).unwrap_err();
    assert!(matches!(err, WalError::Io { op: "truncate", .. }), "{err}");
    assert!(matches!(log.write(b"e", Time::from_millis(3_000)), Err(WalError::Poisoned { .. })));
    drop(log);
    assert_eq!(reopened(dir.path()), vec![b"b".to_vec(), b"c".to_vec()]);
}

#[test]
fn a_failed_directory_sync_fails_the_first_write_of_a_new_segment_and_poisons_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options(&hook)).unwrap();
    log.write(b"a", Time::from_millis(0)).unwrap();
    hook.fail_dir_sync_number(hook.dir_sync_count() + 1);
    let err = log.write(b"b", Time::from_millis(1_000)).unwrap_err();
    assert!(matches!(err, WalError::Io { op: "fsync directory", .. }), "{err}");
    assert!(matches!(log.write(b"c", Time::from_millis(1_000)), Err(WalError::Poisoned { .. })));
}

#[test]
fn lost_unsynced_data_shows_a_missing_sync_and_keeps_synced_records() {
    // Never syncing: the crash loses acknowledged records (and the files
    // whose entries no directory sync covered).
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    hook.lose_unsynced_data();
    let log = FileWriteAheadLog::open(dir.path(), options(&hook).with_sync_policy(SyncPolicy::Never)).unwrap();
    log.write(b"acknowledged but never synced", Time::from_millis(0)).unwrap();
    std::mem::forget(log);
    hook.simulate_crash().unwrap();
    assert!(reopened(dir.path()).is_empty(), "the crash lost what was never synced");

    // Syncing every write: everything acknowledged survives.
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    hook.lose_unsynced_data();
    let log = FileWriteAheadLog::open(dir.path(), options(&hook)).unwrap();
    for (i, time) in [0, 500, 1_000, 2_500].into_iter().enumerate() {
        log.write(format!("r{i}").as_bytes(), Time::from_millis(time)).unwrap();
    }
    std::mem::forget(log);
    hook.simulate_crash().unwrap();
    assert_eq!(reopened(dir.path()).len(), 4);
}

/// What a workload wrote: the records it tried in order, how many were
/// acknowledged, and how many of the first it cleaned away.
#[derive(Default)]
struct Outcome {
    attempted: Vec<Vec<u8>>,
    acked: usize,
    cleaned: Option<usize>,
    clean_failed: bool,
}

const RECORDS: usize = 24;

/// Writes records over four segments of a recycling, fenced log, cleaning
/// the first segment midway; stops at the first failure.
fn workload(dir: &Path, hook: &FaultInjection) -> Outcome {
    let mut outcome = Outcome::default();
    let options = options(hook).with_recycled_segments(1).with_fence(Arc::new(Epoch(1)));
    let Ok(log) = FileWriteAheadLog::open(dir, options) else {
        return outcome;
    };
    for i in 0..RECORDS {
        if i == 14 {
            match log.clean(Time::from_millis(1_001), true) {
                Ok(()) => outcome.cleaned = Some(6),
                Err(_) => {
                    outcome.clean_failed = true;
                    break;
                }
            }
        }
        let record = format!("record {i} ").repeat(1 + i % 5).into_bytes();
        let time = Time::from_millis(i as i64 / 6 * 1_000);
        outcome.attempted.push(record.clone());
        match log.write(&record, time) {
            Ok(_) => outcome.acked += 1,
            Err(_) => break,
        }
    }
    std::mem::forget(log);
    outcome
}

#[test]
fn a_crash_at_any_operation_keeps_every_acknowledged_record_and_no_half_record() {
    let dry = tempfile::tempdir().unwrap();
    let counting = FaultInjection::new();
    let complete = workload(dry.path(), &counting);
    assert_eq!(complete.acked, RECORDS);
    let operations = counting.operation_count();
    assert!(operations > 2 * RECORDS as u64, "an append and a sync per record, and more: {operations}");

    for crash_at in 0..=operations {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        hook.lose_unsynced_data();
        hook.crash_after_operations(crash_at);
        let outcome = workload(dir.path(), &hook);
        hook.simulate_crash().unwrap();
        for epoch in [1, 2] {
            let log = FileWriteAheadLog::open(
                dir.path(),
                options(&FaultInjection::new()).with_recycled_segments(1).with_fence(Arc::new(Epoch(epoch))),
            )
            .unwrap_or_else(|e| panic!("crash after {crash_at} operations: reopening at epoch {epoch}: {e}"));
            let records = log
                .read_all()
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap_or_else(|e| panic!("crash after {crash_at} operations, epoch {epoch}: {e}"));
            check(&outcome, &records, &format!("crash after {crash_at} operations, reopened at epoch {epoch}"));
        }
    }
}

/// The records read back are the attempted ones in order, from the first
/// not cleaned, every acknowledged one included, nothing else.
fn check(outcome: &Outcome, records: &[Vec<u8>], context: &str) {
    let starts: Vec<usize> = match (outcome.cleaned, outcome.clean_failed) {
        (Some(cleaned), _) => vec![cleaned],
        // A cleaning that failed midway may have deleted the segment or not.
        (None, true) => vec![0, 6],
        (None, false) => vec![0],
    };
    let ok = starts.iter().any(|&start| {
        let end = start + records.len();
        end <= outcome.attempted.len() && end >= outcome.acked.max(start) && records == &outcome.attempted[start..end]
    });
    assert!(
        ok,
        "{context}: read {:?}, attempted {}, acknowledged {}, cleaned {:?}",
        records.iter().map(|r| String::from_utf8_lossy(&r[..r.len().min(10)]).into_owned()).collect::<Vec<_>>(),
        outcome.attempted.len(),
        outcome.acked,
        outcome.cleaned
    );
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn a_failed_rename_deletes_a_cleaned_segment_or_skips_a_spare_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options(&hook).with_recycled_segments(1)).unwrap();
    log.write(b"a", Time::from_millis(0)).unwrap();
    log.write(b"b", Time::from_millis(1_000)).unwrap();
    // Recycling the cleaned segment fails: it is deleted instead.
    hook.fail_rename_number(hook.rename_count() + 1);
    log.clean(Time::from_millis(1_001), true).unwrap();
    assert_eq!(files_in(dir.path()), vec!["log-1000-2000"]);

    log.write(b"c", Time::from_millis(2_000)).unwrap();
    log.clean(Time::from_millis(2_001), true).unwrap();
    let spare: Vec<String> = files_in(dir.path()).into_iter().filter(|n| n.starts_with("spare-")).collect();
    assert_eq!(spare.len(), 1, "this file system must zero files in place for this test");
    // Taking the spare for a new segment fails: the segment is a new file.
    hook.fail_rename_number(hook.rename_count() + 1);
    log.write(b"d", Time::from_millis(3_000)).unwrap();
    assert_eq!(files_in(dir.path()), vec!["log-2000-3000", "log-3000-4000"]);
    assert_eq!(read_all(&log), vec![b"c".to_vec(), b"d".to_vec()]);
    drop(log);
    assert_eq!(reopened(dir.path()), vec![b"c".to_vec(), b"d".to_vec()]);
}
