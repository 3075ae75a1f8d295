//! The segment header: new segments start with a checked, versioned
//! header page; segments written before headers (records from offset 0)
//! still read; a header of a newer format, a damaged one, or one of
//! another epoch is refused naming the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::Epoch;
use spate_core::{Duration, Time};
use spate_wal::{FileWriteAheadLog, WalError, WalSettings, WriteAheadLog};

const HEADER_PAGE: usize = 4096;

fn options() -> WalSettings {
    WalSettings::default().with_rolling_interval(Duration::from_secs(1))
}

fn read_all(log: &FileWriteAheadLog) -> Result<Vec<Vec<u8>>, WalError> {
    log.read_all()?.collect()
}

/// The header fields a segment of `version` written at `epoch` starts with.
fn header_fields(version: u32, epoch: u64) -> Vec<u8> {
    let mut fields = b"SPATEWAL".to_vec();
    fields.extend_from_slice(&version.to_le_bytes());
    fields.extend_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&fields);
    fields.extend_from_slice(&crc.to_le_bytes());
    fields
}

/// A log with `log-0-1000` (records "a", "b") and the last segment
/// `log-1000-2000` (record "c"), closed.
fn two_segments(dir: &Path) {
    let log = FileWriteAheadLog::open(dir, options()).unwrap();
    log.write(b"a", Time::from_millis(0)).unwrap();
    log.write(b"b", Time::from_millis(10)).unwrap();
    log.write(b"c", Time::from_millis(1_000)).unwrap();
    log.close().unwrap();
}

/// Replaces the first bytes of the file at `path` with `bytes`.
fn overwrite_start(path: &Path, bytes: &[u8]) {
    let mut content = std::fs::read(path).unwrap();
    content[..bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, content).unwrap();
}

#[test]
fn new_segments_start_with_the_magic_version_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let options = options().with_fence(Arc::new(Epoch(3)));
    let log = FileWriteAheadLog::open(dir.path(), options.clone()).unwrap();
    let first = log.write(b"first", Time::from_millis(0)).unwrap();
    let second = log.write(b"second", Time::from_millis(0)).unwrap();
    assert_eq!(
        (first.segment.as_str(), first.offset),
        ("log-0-1000-e3", HEADER_PAGE as u64),
        "records follow the header"
    );
    assert_eq!(second.offset, HEADER_PAGE as u64 + u64::from(first.length));
    let bytes = std::fs::read(dir.path().join("log-0-1000-e3")).unwrap();
    assert_eq!(&bytes[..24], header_fields(1, 3).as_slice(), "magic, version 1, epoch 3, crc32c");
    assert!(bytes[24..HEADER_PAGE].iter().all(|&b| b == 0), "the rest of the header page is zero");
    assert_eq!(log.read(&first).unwrap(), b"first");
    assert_eq!(read_all(&log).unwrap(), vec![b"first".to_vec(), b"second".to_vec()]);
    log.close().unwrap();
    drop(log);
    // Reopened (the last segment scanned for a torn tail), nothing is cut.
    let log = FileWriteAheadLog::open(dir.path(), options).unwrap();
    assert_eq!(read_all(&log).unwrap(), vec![b"first".to_vec(), b"second".to_vec()]);
    assert_eq!(std::fs::metadata(dir.path().join("log-0-1000-e3")).unwrap().len(), bytes.len() as u64);
}

#[test]
fn a_segment_of_a_newer_format_is_refused_naming_the_file_and_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    two_segments(dir.path());
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let handle = log.write(b"d", Time::from_millis(1_000)).unwrap();
    log.close().unwrap();
    drop(log);
    let newer = header_fields(2, 0);
    overwrite_start(&dir.path().join("log-0-1000"), &newer);
    let check = |err: WalError, file: &str| {
        assert!(
            matches!(&err, WalError::NewerSegmentVersion { segment, found: 2, supported: 1 } if segment.ends_with(file)),
            "{err}"
        );
        let message = err.to_string();
        assert!(message.contains(file) && message.contains("version 2") && message.contains("version 1"), "{message}");
    };
    // Ordered reads of an earlier segment.
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    check(read_all(&log).unwrap_err(), "log-0-1000");
    drop(log);
    // Recovery scans the last segment; reads by handle check it too.
    overwrite_start(&dir.path().join("log-1000-2000"), &newer);
    check(FileWriteAheadLog::open(dir.path(), options()).err().unwrap(), "log-1000-2000");
    overwrite_start(&dir.path().join("log-1000-2000"), &header_fields(1, 0));
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    overwrite_start(&dir.path().join("log-1000-2000"), &newer);
    check(log.read(&handle).unwrap_err(), "log-1000-2000");
}

#[test]
fn a_damaged_header_or_one_of_another_epoch_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    two_segments(dir.path());
    let first = dir.path().join("log-0-1000");
    let mut damaged = header_fields(1, 0);
    damaged[13] ^= 0x01; // the epoch, after the checksum was computed
    overwrite_start(&first, &damaged);
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let err = read_all(&log).unwrap_err();
    assert!(matches!(&err, WalError::BadSegmentHeader { segment, .. } if *segment == first), "{err}");
    assert!(err.to_string().contains("log-0-1000") && err.to_string().contains("checksum"), "{err}");
    drop(log);
    // In salvage mode the records after a damaged header still read.
    let log = FileWriteAheadLog::open(dir.path(), options().with_salvage(true)).unwrap();
    assert_eq!(read_all(&log).unwrap(), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    drop(log);
    // An intact header whose epoch is not the one in the file name.
    overwrite_start(&first, &header_fields(1, 5));
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let err = read_all(&log).unwrap_err();
    assert!(matches!(&err, WalError::BadSegmentHeader { segment, .. } if *segment == first), "{err}");
    assert!(err.to_string().contains("epoch 5") && err.to_string().contains("epoch 0"), "{err}");
    drop(log);
    // Damage to the last segment's header is found when the log opens.
    let last = dir.path().join("log-1000-2000");
    overwrite_start(&last, &damaged);
    let err = FileWriteAheadLog::open(dir.path(), options()).err().unwrap();
    assert!(matches!(&err, WalError::BadSegmentHeader { segment, .. } if *segment == last), "{err}");
}

/// A record in the layout of every version: length, CRC32C of the
/// payload, CRC32C of those 8 bytes, payload.
fn legacy_frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_crc = crc32c::crc32c(&frame);
    frame.extend_from_slice(&header_crc.to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

#[test]
fn a_legacy_segment_without_a_header_still_reads_and_is_appended_to_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let first: Vec<u8> = [legacy_frame(b"one"), legacy_frame(b"two")].concat();
    std::fs::write(dir.path().join("log-0-1000"), &first).unwrap();
    // The last segment ends in a torn record, cut off on open.
    let last = dir.path().join("log-1000-2000");
    let kept = legacy_frame(b"three");
    std::fs::write(&last, [kept.clone(), legacy_frame(b"torn")[..10].to_vec()].concat()).unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    assert_eq!(std::fs::metadata(&last).unwrap().len(), kept.len() as u64, "the torn tail is cut");
    assert_eq!(read_all(&log).unwrap(), vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
    let handle = spate_core::WalRecordHandle { segment: "log-0-1000".into(), offset: 15, length: 15 };
    assert_eq!(log.read(&handle).unwrap(), b"two", "a legacy record by handle, at its offset from 0");
    // A write to the legacy segment (same name) goes after its records, with no header.
    let appended = log.write(b"four", Time::from_millis(1_000)).unwrap();
    assert_eq!((appended.segment.as_str(), appended.offset), ("log-1000-2000", kept.len() as u64));
    // A new segment gets a header.
    let new = log.write(b"five", Time::from_millis(2_000)).unwrap();
    assert_eq!(new.offset, HEADER_PAGE as u64);
    assert!(std::fs::read(dir.path().join("log-2000-3000")).unwrap().starts_with(b"SPATEWAL"));
    let all = read_all(&log).unwrap();
    assert_eq!(all, ["one", "two", "three", "four", "five"].map(|s| s.as_bytes().to_vec()));
    assert_eq!(log.read(&appended).unwrap(), b"four");
}

#[test]
fn a_segment_cut_inside_its_header_is_a_torn_tail_only_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    two_segments(dir.path());
    let last = dir.path().join("log-1000-2000");
    let bytes = std::fs::read(&last).unwrap();
    std::fs::write(&last, &bytes[..100]).unwrap();
    // The last segment: its creation was cut short; recovered, not an error.
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    assert_eq!(std::fs::metadata(&last).unwrap().len(), 0);
    assert_eq!(read_all(&log).unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
    let handle = log.write(b"again", Time::from_millis(1_000)).unwrap();
    assert_eq!(handle.offset, HEADER_PAGE as u64, "the header is written anew");
    assert_eq!(log.read(&handle).unwrap(), b"again");
    log.close().unwrap();
    drop(log);
    // An earlier segment cut inside its header is damage.
    let first = dir.path().join("log-0-1000");
    let bytes = std::fs::read(&first).unwrap();
    std::fs::write(&first, &bytes[..100]).unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options()).unwrap();
    let err = read_all(&log).unwrap_err();
    assert!(matches!(&err, WalError::Corrupt { segment, offset: 0, .. } if *segment == first), "{err}");
}

#[test]
fn with_direct_io_a_large_record_after_the_header_sits_page_aligned_as_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileWriteAheadLog::open(dir.path(), options().with_direct_io(true)).unwrap();
    for i in 0..3usize {
        let record: Vec<u8> = (0..(1 << 20) + i * 4099).map(|j| (j ^ i) as u8).collect();
        let in_page = record.as_ptr() as u64 % HEADER_PAGE as u64;
        let record = Arc::new(record);
        let handle = log.write_shared(Arc::clone(&record), Time::from_millis(0)).unwrap();
        assert!(handle.offset >= HEADER_PAGE as u64, "{handle}");
        // The payload follows the 12-byte record header at the same offset
        // within a page as in memory, so its whole pages go straight from
        // the caller's buffer.
        assert_eq!((handle.offset + 12) % HEADER_PAGE as u64, in_page, "{handle}");
        assert!(log.read(&handle).unwrap() == *record);
    }
    assert!(
        log.direct_io_bytes() >= 3 << 20,
        "only {} bytes were written with O_DIRECT in {}: its file system refuses direct I/O, so the direct-I/O \
         path was NOT tested; run the tests with TMPDIR on a file system that supports it (ext4, xfs)",
        log.direct_io_bytes(),
        dir.path().display()
    );
    let bytes = std::fs::read(dir.path().join("log-0-1000")).unwrap();
    assert_eq!(&bytes[..24], header_fields(1, 0).as_slice());
}
