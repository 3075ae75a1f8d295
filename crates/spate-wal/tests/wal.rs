//! Behaviour of `FileWriteAheadLog` through its public API: round trips,
//! torn tails, corruption, group commit, poisoning, sync policies, cleaning.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use spate_core::{Duration, ManualClock, Time, WalRecordHandle};
use spate_wal::{FaultInjection, FileWriteAheadLog, SyncPolicy, WalError, WalSettings, WriteAheadLog};

fn record(i: usize) -> Vec<u8> {
    // Varied lengths, including empty records, with content that identifies the record.
    let len = (i * 37) % 300;
    let mut bytes = format!("record-{i}:").into_bytes();
    bytes.extend((0..len).map(|j| (i + j) as u8));
    if i % 50 == 7 {
        bytes.clear();
    }
    bytes
}

/// Bytes of the header page at the start of every new segment.
const HEADER_PAGE: u64 = 4096;

fn options() -> WalSettings {
    WalSettings::default().with_rolling_interval(Duration::from_secs(1))
}

fn read_all(log: &FileWriteAheadLog) -> Vec<Vec<u8>> {
    log.read_all().unwrap().collect::<Result<_, _>>().unwrap()
}

/// Writes `count` records at 50 ms steps starting at `t0`; returns records and handles.
fn write_records(log: &FileWriteAheadLog, range: std::ops::Range<usize>, t0: i64) -> Vec<(Vec<u8>, WalRecordHandle)> {
    range
        .map(|i| {
            let rec = record(i);
            let handle = log.write(&rec, Time::from_millis(t0 + 50 * i as i64)).unwrap();
            (rec, handle)
        })
        .collect()
}

/// Runs `writers` threads that each call `write(writer, i)` for `i` in
/// `0..per_writer`; returns every record written with its handle.
fn write_concurrently(
    writers: usize,
    per_writer: usize,
    write: impl Fn(usize, usize) -> (Vec<u8>, WalRecordHandle) + Sync,
) -> Vec<(Vec<u8>, WalRecordHandle)> {
    std::thread::scope(|s| {
        let write = &write;
        let threads: Vec<_> =
            (0..writers).map(|w| s.spawn(move || (0..per_writer).map(|i| write(w, i)).collect::<Vec<_>>())).collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn shared_records_are_written_like_lent_ones_from_concurrent_writers() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = Arc::new(FileWriteAheadLog::open(dir.path(), options().with_fault_injection(hook.clone())).unwrap());
    let written = write_concurrently(4, 50, |w, i| {
        let rec = record(w * 50 + i);
        let time = Time::from_millis(20 * i as i64);
        let handle = match i % 3 {
            0 => log.write_shared(Arc::new(rec.clone()), time).unwrap(),
            1 => {
                let crc = crc32c::crc32c(&rec);
                log.write_shared_with_crc32c(Arc::new(rec.clone()), crc, time).unwrap()
            }
            _ => log.write(&rec, time).unwrap(),
        };
        (rec, handle)
    });
    for (rec, handle) in &written {
        assert_eq!(&log.read(handle).unwrap(), rec, "{handle}");
    }
    let mut expected: Vec<Vec<u8>> = written.iter().map(|(r, _)| r.clone()).collect();
    let mut all = read_all(&log);
    expected.sort();
    all.sort();
    assert_eq!(all, expected, "every record once");
    assert!(hook.sync_count() <= 200);
    assert!(matches!(
        FileWriteAheadLog::open(dir.path().join("small"), options().with_max_record_size(1024))
            .unwrap()
            .write_shared(Arc::new(vec![0; 1025]), Time::from_millis(0)),
        Err(WalError::RecordTooLarge { len: 1025, max: 1024 })
    ));
}

/// A large record (received-block sized, at an odd length) that identifies itself.
fn large_record(i: usize) -> Vec<u8> {
    let len = (1 << 20) + i * 4099;
    (0..len).map(|j| (j.wrapping_mul(31) ^ i) as u8).collect()
}

#[test]
fn direct_io_appends_read_back_from_concurrent_writers_and_after_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || options().with_rolling_interval(Duration::from_secs(3600)).with_direct_io(true);
    let log = Arc::new(FileWriteAheadLog::open(dir.path(), opts()).unwrap());
    // Large shared records and small lent ones, interleaved by three writers,
    // so commits start at unaligned offsets and mix both kinds.
    let written = write_concurrently(3, 8, |w, i| {
        let n = w * 8 + i;
        let rec = if i % 2 == 0 { large_record(n) } else { record(n) };
        let crc = crc32c::crc32c(&rec);
        // One time for all: the segment is named after the first record
        // committed, whichever writer that is, and the append after the
        // reopen below must go to that same segment.
        (rec.clone(), log.write_shared_with_crc32c(Arc::new(rec), crc, Time::from_millis(0)).unwrap())
    });
    for (rec, handle) in &written {
        assert!(log.read(handle).unwrap() == *rec, "{handle}");
    }
    let mut expected: Vec<Vec<u8>> = written.iter().map(|(r, _)| r.clone()).collect();
    expected.sort();
    let sorted = |mut records: Vec<Vec<u8>>| {
        records.sort();
        records
    };
    assert!(sorted(read_all(&log)) == expected, "every record once");
    assert_direct_io_used(&log);

    // Dropped without a close, with a torn half record at the end: the
    // reopened log keeps every acknowledged record and appends after them.
    drop(log);
    let segment = dir.path().join(&written[0].1.segment);
    let len = std::fs::metadata(&segment).unwrap().len();
    // Large records were padded to be written from the writers' buffers.
    let frames: u64 = written.iter().map(|(_, handle)| u64::from(handle.length)).sum();
    assert!(len > frames, "{len} bytes hold {frames} bytes of records and some padding");
    let mut file = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
    std::io::Write::write_all(&mut file, &spate_wal_frame_prefix(&large_record(99))).unwrap();
    let log = FileWriteAheadLog::open(dir.path(), opts()).unwrap();
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), len, "the torn record is cut off");
    let after = large_record(100);
    let handle = log.write(&after, Time::from_millis(0)).unwrap();
    assert!((len..len + 8192).contains(&handle.offset), "after the kept records (and padding): {handle}");
    assert!(log.read(&handle).unwrap() == after);
    assert_direct_io_used(&log);
    expected.push(after);
    assert!(sorted(read_all(&log)) == sorted(expected), "every record once, and the new one");
}

/// Fails unless `log` wrote with `O_DIRECT`: a file system without direct
/// I/O gets buffered appends, which would leave the direct path untested.
fn assert_direct_io_used(log: &FileWriteAheadLog) {
    assert!(
        log.direct_io_bytes() > 0,
        "no byte was written with O_DIRECT in {}: its file system refuses direct I/O, so the direct-I/O path \
         was NOT tested; run the tests with TMPDIR on a file system that supports it (ext4, xfs)",
        log.dir().display()
    );
}

/// The first half of what a log would append for `payload`: its header
/// (length, payload CRC, header CRC) and half the payload.
fn spate_wal_frame_prefix(payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    frame.extend_from_slice(&crc32c::crc32c(&frame).to_le_bytes());
    frame.extend_from_slice(&payload[..payload.len() / 2]);
    frame
}

#[test]
fn round_trip_across_segments_by_handle_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let written = write_records(&log, 0..200, 0);
    // 200 records over 10 s of record time with 1 s segments.
    assert_eq!(log.segment_names().len(), 10);
    assert_eq!(log.segment_names()[0], "log-0-1000");
    for (rec, handle) in &written {
        assert_eq!(&log.read(handle).unwrap(), rec, "{handle}");
    }
    let expected: Vec<Vec<u8>> = written.iter().map(|(r, _)| r.clone()).collect();
    assert_eq!(read_all(&log), expected);
    log.close().unwrap();

    // A reopened log reads the same, and keeps appending after it.
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    assert_eq!(read_all(&log), expected);
    let more = write_records(&log, 200..210, 0);
    for (rec, handle) in written.iter().chain(&more) {
        assert_eq!(&log.read(handle).unwrap(), rec);
    }
    assert_eq!(read_all(&log).len(), 210);
}

#[test]
fn rolling_follows_record_time_like_spark() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    log.write(b"a", Time::from_millis(500)).unwrap();
    log.write(b"b", Time::from_millis(1_499)).unwrap(); // still before 500 + 1000
    log.write(b"c", Time::from_millis(100)).unwrap(); // earlier times stay in the active segment
    log.write(b"d", Time::from_millis(1_500)).unwrap(); // reaches the end: a new segment
    assert_eq!(log.segment_names(), vec!["log-500-1500", "log-1500-2500"]);
    assert_eq!(read_all(&log), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
}

/// The segments of a closed log: all but the last, and the last, as bytes.
fn build_log_with_two_segments(dir: &Path) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<u64>) {
    let log = FileWriteAheadLog::open(dir, options()).unwrap();
    let first: Vec<Vec<u8>> = (0..5).map(record).collect();
    for rec in &first {
        log.write(rec, Time::from_millis(0)).unwrap();
    }
    let last: Vec<Vec<u8>> = (5..14).map(record).collect();
    let mut ends = Vec::new();
    for rec in &last {
        let handle = log.write(rec, Time::from_millis(1_000)).unwrap();
        ends.push(handle.offset + u64::from(handle.length));
    }
    log.close().unwrap();
    (first, last, ends)
}

#[test]
fn truncation_at_every_offset_of_the_last_segment_keeps_exactly_the_whole_records() {
    let source = tempfile::tempdir().unwrap();
    let (first, last, ends) = build_log_with_two_segments(source.path());
    let first_bytes = std::fs::read(source.path().join("log-0-1000")).unwrap();
    let last_bytes = std::fs::read(source.path().join("log-1000-2000")).unwrap();
    assert_eq!(*ends.last().unwrap(), last_bytes.len() as u64);

    for cut in 0..=last_bytes.len() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("log-0-1000"), &first_bytes).unwrap();
        std::fs::write(dir.path().join("log-1000-2000"), &last_bytes[..cut]).unwrap();
        // No fdatasync needed for what this checks; it keeps 300 opens fast.
        let log = FileWriteAheadLog::open(dir.path(), options().with_sync_policy(SyncPolicy::Never)).unwrap();
        let whole = ends.iter().filter(|&&end| end <= cut as u64).count();
        // A segment cut inside its header page holds nothing; one cut
        // before its first whole record keeps just the header.
        let kept_len = match whole {
            0 if (cut as u64) < HEADER_PAGE => 0,
            0 => HEADER_PAGE,
            _ => ends[whole - 1],
        };
        let expected: Vec<Vec<u8>> = first.iter().chain(&last[..whole]).cloned().collect();
        assert_eq!(read_all(&log), expected, "cut at {cut}");
        assert_eq!(std::fs::metadata(dir.path().join("log-1000-2000")).unwrap().len(), kept_len, "cut at {cut}");
        // New records go after the kept ones and read back.
        let handle = log.write(b"after recovery", Time::from_millis(1_000)).unwrap();
        assert_eq!(handle.offset, kept_len.max(HEADER_PAGE), "cut at {cut}");
        assert_eq!(log.read(&handle).unwrap(), b"after recovery");
    }
}

#[test]
fn garbage_after_the_last_record_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let (first, last, ends) = build_log_with_two_segments(dir.path());
    let path = dir.path().join("log-1000-2000");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0u8; 100]); // e.g. a file extended by a crash but never written
    std::fs::write(&path, &bytes).unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    assert_eq!(read_all(&log).len(), first.len() + last.len());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), *ends.last().unwrap());
}

fn flip_byte(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn corrupt_middle_record_is_an_error_naming_segment_and_offset_and_salvage_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let written = write_records(&log, 0..60, 0); // three segments
    log.close().unwrap();
    let victim = &written[5].1; // in the first segment
    assert_eq!(victim.segment, "log-0-1000");
    flip_byte(&dir.path().join(&victim.segment), victim.offset + 14);

    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let results: Vec<_> = log.read_all().unwrap().collect();
    assert_eq!(results.len(), 6, "five good records, then the error, then nothing");
    let Some(Err(WalError::Corrupt { segment, offset, .. })) = results.last() else {
        panic!("expected a corrupt-record error, got {:?}", results.last());
    };
    assert_eq!(segment, &dir.path().join("log-0-1000"));
    assert_eq!(*offset, victim.offset);
    let message = results.last().unwrap().as_ref().unwrap_err().to_string();
    assert!(message.contains("log-0-1000") && message.contains(&format!("byte {}", victim.offset)), "{message}");

    // Reading that record by handle reports the same place; its neighbours are fine.
    let by_handle = log.read(victim).unwrap_err();
    assert!(matches!(&by_handle, WalError::Corrupt { offset, .. } if *offset == victim.offset), "{by_handle}");
    assert_eq!(log.read(&written[6].1).unwrap(), written[6].0);
    log.close().unwrap();

    let log = FileWriteAheadLog::open(dir.path(), options().with_salvage(true)).unwrap();
    let expected: Vec<Vec<u8>> =
        written.iter().enumerate().filter(|(i, _)| *i != 5).map(|(_, (r, _))| r.clone()).collect();
    assert_eq!(read_all(&log), expected);
}

#[test]
fn corrupt_length_in_the_last_segment_fails_open_unless_salvaging() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let written = write_records(&log, 0..10, 0); // one segment
    log.close().unwrap();
    let victim = &written[3].1;
    flip_byte(&dir.path().join(&victim.segment), victim.offset + 1); // its length field

    let err = FileWriteAheadLog::open(dir.path(), options()).unwrap_err();
    assert!(matches!(&err, WalError::Corrupt { offset, .. } if *offset == victim.offset), "{err}");
    assert!(err.to_string().contains("log-0-1000"), "{err}");

    let log = FileWriteAheadLog::open(dir.path(), options().with_salvage(true)).unwrap();
    let expected: Vec<Vec<u8>> =
        written.iter().enumerate().filter(|(i, _)| *i != 3).map(|(_, (r, _))| r.clone()).collect();
    assert_eq!(read_all(&log), expected);
}

#[test]
fn damaged_last_record_of_the_last_segment_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let written = write_records(&log, 0..10, 0);
    log.close().unwrap();
    let victim = &written[9].1;
    flip_byte(&dir.path().join(&victim.segment), victim.offset + u64::from(victim.length) - 1);
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    assert_eq!(read_all(&log).len(), 9);
    assert_eq!(std::fs::metadata(dir.path().join(&victim.segment)).unwrap().len(), victim.offset);
}

#[test]
fn a_torn_end_of_an_earlier_segment_is_damage_not_a_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _, _) = build_log_with_two_segments(dir.path());
    let path = dir.path().join("log-0-1000");
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 3).unwrap();
    drop(file);
    // Only the last segment can hold an unacknowledged tail: open leaves
    // this one alone, and reading it reports where its last record starts.
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len - 3);
    let results: Vec<_> = log.read_all().unwrap().collect();
    assert_eq!(results.len(), first.len());
    let last_start = len - (12 + first.last().unwrap().len() as u64);
    let err = results.last().unwrap().as_ref().unwrap_err();
    assert!(matches!(err, WalError::Corrupt { offset, .. } if *offset == last_start), "{err}");
    assert!(err.to_string().contains("log-0-1000"), "{err}");
}

#[test]
fn a_declared_length_above_the_maximum_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let big = vec![7u8; 5_000];
    let first = log.write(&big, Time::from_millis(0)).unwrap();
    log.write(b"x", Time::from_millis(2_000)).unwrap();
    log.close().unwrap();
    // Reopened with a smaller maximum, the old record is over the bound: a
    // clear error, not a 5 kB (or, for a corrupt length, 4 GB) allocation.
    let log = FileWriteAheadLog::open(dir.path(), options().with_max_record_size(1_000)).unwrap();
    let err = log.read_all().unwrap().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("exceeds the maximum record size 1000"), "{err}");
    assert!(matches!(log.read(&first), Err(WalError::BadHandle { .. })));
    assert!(matches!(
        log.write(&big, Time::from_millis(2_000)),
        Err(WalError::RecordTooLarge { len: 5_000, max: 1_000 })
    ));
}

#[test]
fn concurrent_writers_share_syncs_and_every_handle_reads_its_own_record() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = Arc::new(
        FileWriteAheadLog::open(dir.path(), WalSettings::default().with_fault_injection(hook.clone())).unwrap(),
    );
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                (0..PER_THREAD)
                    .map(|i| {
                        let rec = format!("thread {t} record {i}").into_bytes();
                        let handle = log.write(&rec, Time::from_millis(1_000)).unwrap();
                        (rec, handle)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let written: Vec<(Vec<u8>, WalRecordHandle)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let total = THREADS * PER_THREAD;

    for (rec, handle) in &written {
        assert_eq!(&log.read(handle).unwrap(), rec);
    }
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
    for rec in read_all(&log) {
        *counts.entry(rec).or_default() += 1;
    }
    assert_eq!(counts.len(), total, "no record lost");
    assert!(counts.values().all(|&n| n == 1), "no record duplicated");
    // One append and one fdatasync per commit (how many records a commit
    // carries depends on scheduling; `writes_queued_during_an_append_share_the_next_append_and_sync`
    // pins the batching down).
    let syncs = hook.sync_count();
    assert_eq!(syncs, hook.append_count());
    assert!(syncs <= total as u64, "{syncs} syncs for {total} writes");
}

#[test]
fn a_batch_is_one_append_and_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options().with_fault_injection(hook.clone())).unwrap();
    let records: Vec<Vec<u8>> = (0..100).map(record).collect();
    let batch: Vec<(&[u8], Time)> = records.iter().map(|r| (r.as_slice(), Time::from_millis(10))).collect();
    let handles = log.write_batch(&batch).unwrap();
    assert_eq!((hook.append_count(), hook.sync_count()), (1, 1));
    for (rec, handle) in records.iter().zip(&handles) {
        assert_eq!(&log.read(handle).unwrap(), rec);
    }
    // A batch that spans two segments syncs each of them once.
    let spanning = [(b"a".as_slice(), Time::from_millis(10)), (b"b".as_slice(), Time::from_millis(5_000))];
    log.write_batch(&spanning).unwrap();
    assert_eq!(hook.sync_count(), 3);
}

#[test]
fn a_failed_sync_poisons_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options().with_fault_injection(hook.clone())).unwrap();
    let kept = log.write(b"durable", Time::from_millis(0)).unwrap();
    hook.fail_sync_number(hook.sync_count() + 1);
    let err = log.write(b"unknown", Time::from_millis(0)).unwrap_err();
    assert!(matches!(&err, WalError::Io { op: "fdatasync", .. }), "{err}");
    let syncs_after_failure = hook.sync_count();
    for time in [0, 5_000] {
        // Later writes fail without touching the file, even in a new segment.
        let err = log.write(b"later", Time::from_millis(time)).unwrap_err();
        assert!(matches!(&err, WalError::Poisoned { cause, .. } if cause.contains("fdatasync")), "{err}");
    }
    assert!(matches!(log.sync(), Err(WalError::Poisoned { .. })));
    assert_eq!(hook.sync_count(), syncs_after_failure, "the log never retries a sync");
    assert_eq!(log.read(&kept).unwrap(), b"durable");
    log.close().unwrap();

    // Reopening starts afresh.
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let handle = log.write(b"again", Time::from_millis(0)).unwrap();
    assert_eq!(log.read(&handle).unwrap(), b"again");
}

#[test]
fn a_commit_that_synced_while_an_earlier_sync_failed_fails_too() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options().with_fault_injection(hook.clone())).unwrap();
    // The first commit's sync is held and then fails; the second commit
    // appends and syncs (successfully) meanwhile, but must not be
    // acknowledged: the failed sync may have lost pages that hold its bytes too.
    let first_sync = hook.hold_sync_number(1);
    let second_sync = hook.hold_sync_number(2);
    hook.fail_sync_number(1);
    let (first, second) = std::thread::scope(|s| {
        let first = s.spawn(|| log.write(b"first", Time::from_millis(0)));
        first_sync.wait_until_reached();
        let second = s.spawn(|| log.write(b"second", Time::from_millis(0)));
        // Both syncs are in progress at once.
        second_sync.wait_until_reached();
        second_sync.release();
        first_sync.release();
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(matches!(&first, Err(WalError::Io { op: "fdatasync", .. })), "{first:?}");
    assert!(matches!(&second, Err(WalError::Poisoned { cause, .. }) if cause.contains("fdatasync")), "{second:?}");
    assert_eq!(hook.sync_count(), 2, "the second commit synced while the first one's sync ran");
    assert!(read_all(&log).is_empty(), "no failed commit became readable");
}

#[test]
fn writes_queued_during_an_append_share_the_next_append_and_sync() {
    const WRITERS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options().with_fault_injection(hook.clone())).unwrap();
    let first_append = hook.hold_append_number(1);
    let handles = std::thread::scope(|s| {
        let first = s.spawn(|| log.write(b"first", Time::from_millis(0)).unwrap());
        first_append.wait_until_reached();
        // The first commit's leader is held inside its append: every later
        // writer queues behind it.
        let later: Vec<_> = (0..WRITERS)
            .map(|i| {
                let log = &log;
                s.spawn(move || log.write(format!("later {i}").as_bytes(), Time::from_millis(0)).unwrap())
            })
            .collect();
        while log.queued_writes() < WRITERS {
            std::thread::yield_now();
        }
        first_append.release();
        let mut handles = vec![first.join().unwrap()];
        handles.extend(later.into_iter().map(|t| t.join().unwrap()));
        handles
    });
    assert_eq!(read_all(&log).len(), WRITERS + 1);
    for handle in &handles {
        log.read(handle).unwrap();
    }
    assert_eq!(hook.append_count(), 2, "{} writes in two appends", WRITERS + 1);
    assert_eq!(hook.sync_count(), 2, "and two syncs");
}

#[test]
fn a_failed_append_poisons_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let log = FileWriteAheadLog::open(dir.path(), options().with_fault_injection(hook.clone())).unwrap();
    hook.fail_append_number(1);
    assert!(matches!(log.write(b"x", Time::from_millis(0)), Err(WalError::Io { op: "append", .. })));
    assert!(matches!(log.write(b"y", Time::from_millis(0)), Err(WalError::Poisoned { .. })));
    assert_eq!(hook.sync_count(), 0);
}

#[test]
fn interval_policy_syncs_by_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let hook = FaultInjection::new();
    let clock = ManualClock::new(Time::from_millis(10_000));
    let opts = options()
        .with_sync_policy(SyncPolicy::Interval(Duration::from_millis(100)))
        .with_clock(Arc::new(clock.clone()))
        .with_fault_injection(hook.clone());
    let log = FileWriteAheadLog::open(dir.path(), opts).unwrap();
    for _ in 0..5 {
        log.write(b"r", Time::from_millis(0)).unwrap();
    }
    assert_eq!(hook.sync_count(), 0);
    clock.advance(Duration::from_millis(99));
    log.write(b"r", Time::from_millis(0)).unwrap();
    assert_eq!(hook.sync_count(), 0);
    clock.advance(Duration::from_millis(1));
    log.write(b"r", Time::from_millis(0)).unwrap();
    assert_eq!(hook.sync_count(), 1);
    log.write(b"r", Time::from_millis(0)).unwrap();
    assert_eq!(hook.sync_count(), 1);
    assert_eq!(read_all(&log).len(), 8, "acknowledged records are readable before they are synced");
    log.close().unwrap();
    assert_eq!(hook.sync_count(), 2, "close syncs what is left");
}

#[test]
fn never_policy_never_syncs_and_every_write_syncs_each_time() {
    for (policy, expected_syncs) in [(SyncPolicy::Never, 0), (SyncPolicy::EveryWrite, 10)] {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        let opts = options().with_sync_policy(policy).with_fault_injection(hook.clone());
        let log = FileWriteAheadLog::open(dir.path(), opts).unwrap();
        for _ in 0..10 {
            log.write(b"r", Time::from_millis(0)).unwrap();
        }
        log.close().unwrap();
        assert_eq!(hook.sync_count(), expected_syncs, "{policy:?}");
    }
}

#[test]
fn close_file_after_write_opens_once_per_batch() {
    for (close_after, expected_opens) in [(true, 10), (false, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        let opts = options().with_close_file_after_write(close_after).with_fault_injection(hook.clone());
        let log = FileWriteAheadLog::open(dir.path(), opts).unwrap();
        let written = write_records(&log, 0..10, 0); // 10 writes in one segment
        assert_eq!(hook.open_count(), expected_opens, "close_file_after_write = {close_after}");
        for (rec, handle) in &written {
            assert_eq!(&log.read(handle).unwrap(), rec);
        }
    }
}

#[test]
fn clean_deletes_whole_old_segments_but_never_the_active_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let written = write_records(&log, 0..100, 0); // segments log-0-1000 … log-4000-5000 (active)
    assert_eq!(log.segment_names().len(), 5);
    // End times below 3000: log-0-1000 and log-1000-2000 (log-2000-3000 ends at 3000, not below).
    log.clean(Time::from_millis(3_000), true).unwrap();
    assert_eq!(log.segment_names(), vec!["log-2000-3000", "log-3000-4000", "log-4000-5000"]);
    assert!(!dir.path().join("log-0-1000").exists());
    assert!(matches!(log.read(&written[0].1), Err(WalError::BadHandle { .. })));
    assert_eq!(read_all(&log).len(), 60);

    // In the background; close waits for the cleaner. The active segment stays.
    log.clean(Time::from_millis(1_000_000), false).unwrap();
    assert_eq!(log.segment_names(), vec!["log-4000-5000"]);
    log.close().unwrap();
    let mut files: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, vec!["log-4000-5000"]);
}

#[test]
fn a_reader_survives_cleaning_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let written = write_records(&log, 0..100, 0);
    let mut reader = log.read_all().unwrap();
    let first = reader.next().unwrap().unwrap(); // log-0-1000 is now open
    log.clean(Time::from_millis(4_001), true).unwrap(); // deletes the four old segments
    let rest: Vec<Vec<u8>> = reader.collect::<Result<_, _>>().unwrap();
    // The open segment is read to its end; the deleted ones are skipped whole; the live one is read.
    let expected: Vec<Vec<u8>> = written[1..20].iter().chain(&written[80..]).map(|(r, _)| r.clone()).collect();
    assert_eq!(first, written[0].0);
    assert_eq!(rest, expected);
}

#[test]
fn writes_after_close_fail_and_reads_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let handle = log.write(b"kept", Time::from_millis(0)).unwrap();
    log.close().unwrap();
    assert!(matches!(log.write(b"late", Time::from_millis(0)), Err(WalError::Closed { .. })));
    assert_eq!(log.read(&handle).unwrap(), b"kept");
    log.close().unwrap();
}

#[test]
fn handles_that_point_nowhere_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let handle = log.write(b"record", Time::from_millis(0)).unwrap();
    let bad = |segment: &str, offset: u64, length: u32| WalRecordHandle { segment: segment.into(), offset, length };
    for h in [
        bad("../../etc/passwd", 0, 20),
        bad("log-5-6", 0, 18),
        bad(&handle.segment, 1_000, handle.length),
        bad(&handle.segment, 0, 3),
        bad(&handle.segment, 0, handle.length), // inside the segment header
    ] {
        assert!(matches!(log.read(&h), Err(WalError::BadHandle { .. })), "{h}");
    }
    // A handle whose length disagrees with the record is damage at that offset.
    let err = log.read(&bad(&handle.segment, handle.offset, handle.length + 1)).unwrap_err();
    assert!(matches!(err, WalError::Corrupt { offset, .. } if offset == handle.offset), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arbitrary bytes as segment files: opening and reading never panic,
    /// and never produce a record above the configured maximum.
    #[test]
    fn arbitrary_segment_files_never_panic(
        middle in proptest::collection::vec(any::<u8>(), 0..600),
        last in proptest::collection::vec(any::<u8>(), 0..600),
        salvage in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("log-0-1000"), &middle).unwrap();
        std::fs::write(dir.path().join("log-1000-2000"), &last).unwrap();
        let opts = options().with_salvage(salvage).with_max_record_size(256);
        if let Ok(log) = FileWriteAheadLog::open(dir.path(), opts) {
            for item in log.read_all().unwrap() {
                match item {
                    Ok(rec) => prop_assert!(rec.len() <= 256),
                    Err(e) => prop_assert!(matches!(e, WalError::Corrupt { .. }), "{}", e),
                }
            }
            prop_assert!(std::fs::metadata(dir.path().join("log-1000-2000")).unwrap().len() <= last.len() as u64);
        }
    }
}
