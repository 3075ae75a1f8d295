//! Checkpoints in S3, against a real S3 server (SeaweedFS, started by
//! `cargo xtask test`): the logs, verdicts and repair behave as on a local
//! directory; the writer lock is a lease that a second writer is refused,
//! an expired one is taken over with a new epoch, a writer paused past
//! its lease can no longer write once the new holder has, and one whose
//! lease ran out while nobody took it (the store was away) renews it. A
//! streamed file larger than a part goes up in parts and reads back whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::s3;
use spate::core::{BatchId, Duration, ManualClock, Time};
use spate::logstore::{
    Checkpoint, CheckpointFileManager, CheckpointSettings, CommitMetadata, LeaseSettings, LockStatus, LogStoreError,
    ObjectStoreFileManager, OffsetSeq, SourceOffset, Verdict,
};

const START: i64 = 1_700_000_000_000;

fn lease() -> LeaseSettings {
    LeaseSettings {
        duration: Duration::from_millis(10_000),
        renew_every: Duration::from_millis(3_000),
        safety_margin: Duration::from_millis(2_000),
        renew_in_background: false,
    }
}

fn options(clock: &Arc<ManualClock>) -> CheckpointSettings {
    CheckpointSettings::new().with_clock(clock.clone()).with_object_store(s3::settings()).with_lease(lease())
}

fn offsets(n: u64) -> OffsetSeq {
    OffsetSeq {
        batch_timestamp: Time::from_millis(START + n as i64 * 1000),
        sources: vec![SourceOffset::new("events", Some(serde_json::json!({"events": {"0": n * 10}})))],
        ..OffsetSeq::default()
    }
}

fn open(location: &Path, clock: &Arc<ManualClock>) -> Checkpoint {
    Checkpoint::open_for_write(location, options(clock)).unwrap()
}

#[test]
fn logs_and_verdicts_on_s3_behave_as_on_a_local_directory() {
    let location = s3::fresh_location("verdicts");
    let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let checkpoint = open(&location, &clock);
    assert!(checkpoint.is_object_store());
    assert_eq!(checkpoint.verdict().unwrap(), Verdict::Fresh);
    assert!(checkpoint.offsets().add(BatchId(0), &offsets(0)).unwrap());
    assert!(!checkpoint.offsets().add(BatchId(0), &offsets(9)).unwrap(), "put-if-absent never overwrites");
    assert!(
        matches!(checkpoint.verdict().unwrap(), Verdict::Rerun { batch: BatchId(0), ref offsets, .. } if *offsets == self::offsets(0))
    );
    assert!(checkpoint.commit_batch(BatchId(0), &CommitMetadata::default()).unwrap());
    assert!(matches!(checkpoint.verdict().unwrap(), Verdict::Resume { next: BatchId(1), .. }));

    // Files of the runtime (graph, state) round-trip, and a replace keeps the newest.
    checkpoint.replace_file("graph", b"{\"g\":1}").unwrap();
    checkpoint.replace_file("graph", b"{\"g\":2}").unwrap();
    assert_eq!(checkpoint.read_file("graph").unwrap().unwrap(), b"{\"g\":2}");
    checkpoint.write_file("state/counts/0", b"snapshot").unwrap();
    let again = checkpoint.write_file("state/counts/0", b"other").unwrap_err();
    assert!(matches!(again, LogStoreError::AlreadyExists { .. }), "{again}");
    assert_eq!(checkpoint.list("state/counts").unwrap(), vec!["0".to_string()]);

    // The free function reaches the same store through the same settings.
    let verdict = Checkpoint::open_read_only(&location, options(&clock)).unwrap().verdict().unwrap();
    assert!(matches!(verdict, Verdict::Resume { next: BatchId(1), .. }));
    let entry = checkpoint.files().read(&location.join("offsets/0"), 1 << 20).unwrap().unwrap();
    let text = String::from_utf8(entry).unwrap();
    assert!(text.contains(&format!("\"writerEpoch\":{}", checkpoint.epoch().unwrap())), "{text}");
}

#[test]
fn a_second_writer_is_refused_naming_the_holder_and_a_released_lease_is_taken_at_once() {
    let location = s3::fresh_location("second-writer");
    let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let first = open(&location, &clock);
    assert_eq!(first.epoch(), Some(1));
    let err = Checkpoint::open_for_write(&location, options(&clock)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LogStoreError::Locked { holder: Some(ref h), .. } if h.epoch == 1), "{text}");
    assert!(text.contains(&format!("pid {}", std::process::id())) && text.contains("s3://"), "{text}");
    assert!(matches!(first.lock_status(), LockStatus::Held(Some(ref h)) if h.epoch == 1));

    drop(first); // a clean stop releases the lease
    let reader = Checkpoint::open_read_only(&location, options(&clock)).unwrap();
    assert!(matches!(reader.lock_status(), LockStatus::Free(Some(ref h)) if h.epoch == 1));
    let second = open(&location, &clock);
    assert_eq!(second.epoch(), Some(2));
}

#[test]
fn an_expired_lease_is_taken_over_and_the_paused_writer_cannot_write_after_the_new_one() {
    let location = s3::fresh_location("takeover");
    // The old writer's clock stands still: it was paused after its last fence check.
    let old_clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let old = open(&location, &old_clock);
    assert!(old.offsets().add(BatchId(0), &offsets(0)).unwrap());
    old.replace_file("graph", b"old").unwrap();

    let new_clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let refused = Checkpoint::open_for_write(&location, options(&new_clock)).unwrap_err();
    assert!(matches!(refused, LogStoreError::Locked { .. }), "{refused}");
    new_clock.advance(Duration::from_millis(10_001));
    let new = open(&location, &new_clock);
    assert_eq!(new.epoch(), Some(2));
    assert!(matches!(new.verdict().unwrap(), Verdict::Rerun { batch: BatchId(0), .. }));
    assert!(new.commit_batch(BatchId(0), &CommitMetadata::default()).unwrap());
    assert!(new.offsets().add(BatchId(1), &offsets(1)).unwrap());
    new.replace_file("graph", b"new").unwrap();

    // The old writer wakes believing its lease still runs: every write it
    // tries is refused, and says that a newer writer holds the checkpoint.
    let stale = |e: LogStoreError| assert!(matches!(e, LogStoreError::StaleEpoch { ours: 1, .. }), "{e}");
    stale(old.commits().add(BatchId(0), &CommitMetadata::default()).unwrap_err());
    stale(old.offsets().add(BatchId(1), &offsets(5)).unwrap_err());
    stale(old.replace_file("graph", b"old again").unwrap_err());
    stale(old.renew_lease().unwrap_err());
    stale(old.offsets().add(BatchId(2), &offsets(2)).unwrap_err());
    assert_eq!(new.read_file("graph").unwrap().unwrap(), b"new");
    assert_eq!(new.offsets().get(BatchId(1)).unwrap(), Some(offsets(1)));
    drop(old); // a lost lease is not released over the new holder's
    assert!(matches!(new.lock_status(), LockStatus::Held(Some(ref h)) if h.epoch == 2));
}

#[test]
fn a_writer_whose_lease_runs_out_stops_writing_before_anyone_can_take_over() {
    let location = s3::fresh_location("expiry");
    let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let writer = open(&location, &clock);
    clock.advance(Duration::from_millis(7_000));
    writer.renew_lease().unwrap(); // renewed: runs until START + 17 s
    clock.advance(Duration::from_millis(7_000));
    assert!(writer.offsets().add(BatchId(0), &offsets(0)).unwrap());
    // Within the safety margin of the expiry: no more writes.
    clock.advance(Duration::from_millis(1_500));
    let err = writer.offsets().add(BatchId(1), &offsets(1)).unwrap_err();
    assert!(
        matches!(err, LogStoreError::StaleEpoch { .. }) && err.to_string().contains("not renewed in time"),
        "{err}"
    );
}

#[test]
fn a_lease_that_ran_out_while_the_store_was_away_is_renewed_when_nobody_took_it() {
    let location = s3::fresh_location("outage");
    let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let writer = open(&location, &clock);
    assert!(writer.offsets().add(BatchId(0), &offsets(0)).unwrap());
    // The store did not answer past the lease's end: no renewal landed, and
    // meanwhile every write is refused.
    clock.advance(Duration::from_millis(25_000));
    let refused = writer.offsets().add(BatchId(1), &offsets(1)).unwrap_err();
    assert!(matches!(refused, LogStoreError::StaleEpoch { .. }), "{refused}");
    // Back, the lease object is still the one it wrote: it is ours again.
    writer.renew_lease().unwrap();
    assert!(writer.offsets().add(BatchId(1), &offsets(1)).unwrap());
    assert!(matches!(writer.lock_status(), LockStatus::Held(Some(ref h)) if h.epoch == 1));
}

#[test]
fn repair_on_s3_quarantines_by_copy_and_delete() {
    let location = s3::fresh_location("repair");
    let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let checkpoint = open(&location, &clock);
    assert!(checkpoint.offsets().add(BatchId(0), &offsets(0)).unwrap());
    assert!(checkpoint.commit_batch(BatchId(0), &CommitMetadata::default()).unwrap());
    // A damaged commit ahead of the offsets, as a crash of a foreign tool could leave.
    let stray = location.join("commits/3");
    checkpoint.files().create_atomic(&stray, b"v1\n{garbage", &|| Ok(())).unwrap();
    let Verdict::Inconsistent(inconsistency) = checkpoint.verdict().unwrap() else { panic!("expected inconsistent") };
    let message = inconsistency.to_string();
    assert!(message.contains("s3://") && message.contains("commits/3"), "{message}");
    let plan = checkpoint.repair_plan().unwrap().unwrap();
    checkpoint.apply_repair(&plan).unwrap();
    assert!(matches!(checkpoint.verdict().unwrap(), Verdict::Resume { next: BatchId(1), .. }));
    assert!(!checkpoint.files().exists(&stray).unwrap());
    let mut quarantined = checkpoint.files().list_files_recursive(&location.join("_quarantine")).unwrap();
    quarantined.sort();
    let names: Vec<_> =
        quarantined.iter().map(|(path, _)| path.iter().skip(1).collect::<std::path::PathBuf>()).collect();
    assert_eq!(names, [Path::new("REPAIR.txt"), Path::new("commits/3")], "{quarantined:?}");
    assert_eq!(quarantined[1].1, 11, "the moved object keeps its bytes");
}

#[test]
fn progress_style_appends_are_conditional_replaces() {
    let location = s3::fresh_location("append");
    let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
    let checkpoint = open(&location, &clock);
    let path = location.join("progress/progress-000000.jsonl");
    let files = checkpoint.files();
    assert_eq!(files.append(&path, b"{\"a\":1}\n", &|| Ok(())).unwrap(), 8);
    assert_eq!(files.append(&path, b"{\"a\":2}\n", &|| Ok(())).unwrap(), 16);
    assert_eq!(files.read(&path, 1024).unwrap().unwrap(), b"{\"a\":1}\n{\"a\":2}\n");
    let fenced = files.append(&path, b"{\"a\":3}\n", &|| checkpoint.renew_lease().and(Err(LogStoreError::Crashed)));
    assert!(fenced.is_err());
    assert_eq!(files.read(&path, 1024).unwrap().unwrap().len(), 16, "a failed fence writes nothing");
}

#[test]
fn a_streamed_file_larger_than_a_part_goes_up_in_parts_and_reads_back_whole() {
    use std::io::{Read, Seek, SeekFrom};
    let location = s3::fresh_location("parts");
    let files = ObjectStoreFileManager::connect(&location, &s3::settings()).unwrap().with_part_bytes(64 << 10);
    let path = location.join("state/op/3");
    let mut expected: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    // A header filled in last, as a state snapshot's frame is.
    let mut content = |out: &mut dyn spate::core::SeekWrite| {
        out.write_all(&[0; 4])?;
        out.write_all(&expected[4..])?;
        out.seek(SeekFrom::Start(0))?;
        out.write_all(b"HEAD")?;
        out.seek(SeekFrom::End(0)).map(drop)
    };
    assert_eq!(files.create_atomic_streamed(&path, &mut content, &|| Ok(())).unwrap(), 300_000);
    expected[..4].copy_from_slice(b"HEAD");

    let mut names = files.list(&location.join("state/op")).unwrap();
    names.sort();
    assert_eq!(names, ["3", "3.parts"]);
    let parts = files.list_files_recursive(&location.join("state/op/3.parts")).unwrap();
    assert_eq!(parts.len(), 5, "300,000 bytes in parts of 65,536: {parts:?}");
    assert!(files.read(&path, 1 << 20).unwrap().unwrap() == expected, "read whole");
    assert_eq!(files.read_prefix(&path, 4).unwrap().unwrap(), b"HEAD");
    let mut reader = files.open_read(&path, 1 << 20).unwrap().unwrap();
    let mut streamed = Vec::new();
    reader.read_to_end(&mut streamed).unwrap();
    assert!(streamed == expected, "read as a stream");
    let mut four = [0u8; 4];
    for at in [SeekFrom::Start(65_534), SeekFrom::Start(200_000), SeekFrom::End(-4)] {
        let position = reader.seek(at).unwrap() as usize;
        reader.read_exact(&mut four).unwrap();
        assert_eq!(four, expected[position..position + 4], "{at:?}");
    }

    // A part replaced since is a failed read, not other content.
    let (last, _) =
        parts.iter().max_by_key(|(name, _)| name.to_string_lossy().rsplit('-').next().map(str::to_string)).unwrap();
    files.replace_atomic(&location.join("state/op/3.parts").join(last), b"other", &|| Ok(())).unwrap();
    assert!(files.read(&path, 1 << 20).is_err(), "a changed part was read");

    assert!(files.delete_streamed(&path, &|| Ok(())).unwrap());
    assert_eq!(files.list_files_recursive(&location.join("state")).unwrap(), [], "the parts go with the file");
}
