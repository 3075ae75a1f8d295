//! Recycled segment files: cleaned segments kept zeroed as spares, new
//! segments started in them, and recovery of a crash inside one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;
use std::path::Path;

use spate_core::{Duration, Time, WalRecordHandle};
use spate_wal::{FileWriteAheadLog, WalSettings, WriteAheadLog};

fn options(spares: usize) -> WalSettings {
    WalSettings::default().with_rolling_interval(Duration::from_secs(1)).with_recycled_segments(spares)
}

/// Writes records of 1000 bytes, `count` of them at time `at` (ms).
fn write_at(log: &FileWriteAheadLog, at: i64, count: usize) -> Vec<(Vec<u8>, WalRecordHandle)> {
    (0..count)
        .map(|i| {
            let record = vec![(at as usize / 1000 + i) as u8 | 1; 1000];
            let handle = log.write(&record, Time::from_millis(at)).unwrap();
            (record, handle)
        })
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

fn len_of(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Fails, saying what was not tested, unless `dir` holds the spare a clean
/// just made: a file system that cannot zero a file in place
/// (`FALLOC_FL_ZERO_RANGE`) deletes cleaned segments instead.
fn assert_recycled(dir: &Path) {
    assert!(
        dir.join("spare-0").exists(),
        "the file system of {} cannot zero a file in place (FALLOC_FL_ZERO_RANGE), so recycling was NOT \
         tested; run the tests with TMPDIR on a file system that supports it (ext4, xfs)",
        dir.display()
    );
}

/// A log with one cleaned segment (`log-0-1000`, 50 records) recycled as
/// `spare-0`, and the active `log-1000-2000`.
fn log_with_a_spare(dir: &Path, spares: usize) -> FileWriteAheadLog {
    let log = FileWriteAheadLog::open(dir, options(spares)).unwrap();
    write_at(&log, 0, 50);
    write_at(&log, 1_000, 1);
    let cleaned_len = len_of(&dir.join("log-0-1000"));
    log.clean(Time::from_millis(1_001), true).unwrap();
    assert!(!dir.join("log-0-1000").exists(), "the cleaned segment is gone under its name");
    assert_recycled(dir);
    let spare = std::fs::read(dir.join("spare-0")).unwrap();
    assert_eq!(spare.len() as u64, cleaned_len, "a spare keeps its length");
    assert!(spare.iter().all(|&b| b == 0), "a spare holds zeros, never old records");
    log
}

#[test]
fn a_cleaned_segment_is_kept_zeroed_and_the_next_segment_starts_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with_a_spare(dir.path(), 1);
    let spare_len = len_of(&dir.path().join("spare-0"));
    let written = write_at(&log, 2_000, 3);
    assert_eq!(files_in(dir.path()), vec!["log-1000-2000", "log-2000-3000"], "the spare became the new segment");
    let active = dir.path().join("log-2000-3000");
    assert_eq!(len_of(&active), spare_len, "written over, not extended");
    let start = std::fs::read(&active).unwrap();
    assert!(start.starts_with(b"SPATEWAL\x01\0\0\0"), "a recycled segment starts with the segment header");
    assert_eq!(written[0].1.offset, 4096, "records start after the header page");
    for (record, handle) in &written {
        assert_eq!(&log.read(handle).unwrap(), record);
    }
    let all: Vec<Vec<u8>> = log.read_all().unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), 4, "the zeros after the records are not read as records");
    // Sealed by a roll, the segment ends at its last record.
    write_at(&log, 3_000, 1);
    assert_eq!(len_of(&active), written.last().map(|(_, h)| h.offset + u64::from(h.length)).unwrap());
    log.close().unwrap();
}

#[test]
fn closing_cuts_the_zeros_of_a_recycled_segment_and_reopening_reads_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with_a_spare(dir.path(), 1);
    let written = write_at(&log, 2_000, 3);
    log.close().unwrap();
    let end = written.last().map(|(_, h)| h.offset + u64::from(h.length)).unwrap();
    assert_eq!(len_of(&dir.path().join("log-2000-3000")), end);
    let log = FileWriteAheadLog::open(dir.path(), options(1)).unwrap();
    for (record, handle) in &written {
        assert_eq!(&log.read(handle).unwrap(), record);
    }
}

#[test]
fn a_crash_in_a_recycled_segment_keeps_every_acknowledged_record_and_cuts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with_a_spare(dir.path(), 1);
    let written = write_at(&log, 2_000, 3);
    let active = dir.path().join("log-2000-3000");
    // The process dies: nothing is closed, the file still holds the spare's zeros.
    std::mem::forget(log);
    let end = written.last().map(|(_, h)| h.offset + u64::from(h.length)).unwrap();
    assert!(len_of(&active) > end);
    // Part of a record that was being written when it died.
    let file = std::fs::OpenOptions::new().write(true).open(&active).unwrap();
    file.write_all_at(&[0x5a; 700], end).unwrap();
    drop(file);

    let log = FileWriteAheadLog::open(dir.path(), options(1)).unwrap();
    assert_eq!(len_of(&active), end, "the torn record and the zeros after it are cut");
    for (record, handle) in &written {
        assert_eq!(&log.read(handle).unwrap(), record);
    }
    // A restart writing at a time seen before appends to that segment.
    let more = write_at(&log, 2_000, 2);
    assert_eq!(more[0].1.offset, end, "appends resume after the last good record");
    assert_eq!(log.read(&more[1].1).unwrap(), more[1].0);
}

#[test]
fn spares_beyond_the_limit_are_deleted_on_open_and_a_log_without_recycling_keeps_none() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with_a_spare(dir.path(), 2);
    write_at(&log, 2_000, 1); // in spare-0
    write_at(&log, 3_000, 1);
    log.clean(Time::from_millis(3_001), true).unwrap();
    log.close().unwrap();
    assert_eq!(files_in(dir.path()), vec!["log-3000-4000", "spare-1", "spare-2"]);
    // A spare left with old bytes (a crash between rename and zeroing) is zeroed on open.
    std::fs::write(dir.path().join("spare-2"), [0x77u8; 5000]).unwrap();
    drop(FileWriteAheadLog::open(dir.path(), options(1)).unwrap());
    let spares: Vec<String> = files_in(dir.path()).into_iter().filter(|n| n.starts_with("spare-")).collect();
    assert_eq!(spares.len(), 1);
    assert!(std::fs::read(dir.path().join(&spares[0])).unwrap().iter().all(|&b| b == 0));
    drop(FileWriteAheadLog::open(dir.path(), options(0)).unwrap());
    assert_eq!(files_in(dir.path()), vec!["log-3000-4000"]);
}

#[test]
fn without_recycling_cleaned_segments_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options(0)).unwrap();
    write_at(&log, 0, 5);
    write_at(&log, 1_000, 1);
    log.clean(Time::from_millis(1_001), true).unwrap();
    assert_eq!(files_in(dir.path()), vec!["log-1000-2000"]);
}

#[test]
fn large_direct_io_records_in_a_recycled_segment_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let options = options(1).with_direct_io(true);
    let log = FileWriteAheadLog::open(dir.path(), options.clone()).unwrap();
    let big = |seed: u8| (0..700_000u32).map(|i| (i % 251) as u8 ^ seed).collect::<Vec<u8>>();
    for seed in 0..4 {
        log.write(&big(seed), Time::from_millis(0)).unwrap();
    }
    log.write(b"next", Time::from_millis(1_000)).unwrap();
    log.clean(Time::from_millis(1_001), true).unwrap();
    assert_recycled(dir.path());
    let written: Vec<(Vec<u8>, WalRecordHandle)> =
        (10..13).map(|seed| (big(seed), log.write(&big(seed), Time::from_millis(2_000)).unwrap())).collect();
    assert!(
        log.direct_io_bytes() > 0,
        "no byte was written with O_DIRECT in {}: its file system refuses direct I/O, so the direct-I/O path \
         was NOT tested; run the tests with TMPDIR on a file system that supports it (ext4, xfs)",
        dir.path().display()
    );
    std::mem::forget(log);
    let log = FileWriteAheadLog::open(dir.path(), options).unwrap();
    for (record, handle) in &written {
        assert!(log.read(handle).unwrap() == *record, "record at {} differs", handle.offset);
    }
    let all: Vec<Vec<u8>> = log.read_all().unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), 4);
}
