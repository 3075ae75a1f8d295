//! The tracker over the real file write-ahead log: restart, torn tail,
//! cleaning across segments, a failing fdatasync.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spate_core::{
    BlockStoreResult, Duration, ManualClock, ReceivedBlockInfo, StreamBlockId, StreamId, Time, WalRecordHandle,
};
use spate_tracker::{ReceivedBlockTracker, RecoveryReport, TrackerState, event_log_dir};
use spate_wal::{FaultInjection, WalSettings};

fn block(stream: u32, id: u64) -> ReceivedBlockInfo {
    ReceivedBlockInfo {
        stream_id: StreamId(stream),
        num_records: Some(id),
        metadata: None,
        store_result: BlockStoreResult {
            block_id: StreamBlockId::new(StreamId(stream), id),
            num_records: Some(id),
            wal_handle: Some(WalRecordHandle { segment: "log-0-60000".into(), offset: id * 100, length: 100 }),
        },
    }
}

fn t(ms: i64) -> Time {
    Time::from_millis(ms)
}

fn open(checkpoint: &Path, clock: &ManualClock) -> (ReceivedBlockTracker, RecoveryReport) {
    ReceivedBlockTracker::open(Some(checkpoint), Arc::new(clock.clone())).unwrap()
}

fn unallocated_ids(tracker: &ReceivedBlockTracker, stream: u32) -> Vec<u64> {
    tracker.unallocated_blocks(StreamId(stream)).iter().map(|b| b.block_id().unique_id).collect()
}

fn batch_ids(tracker: &ReceivedBlockTracker, time: Time, stream: u32) -> Vec<u64> {
    tracker.get_blocks_of_batch_and_stream(time, StreamId(stream)).iter().map(|b| b.block_id().unique_id).collect()
}

/// The segment files of the event log, oldest first.
fn segments(checkpoint: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(i64, PathBuf)> = std::fs::read_dir(event_log_dir(checkpoint))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            let start = name.strip_prefix("log-")?.split('-').next()?.parse().ok()?;
            Some((start, path))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, path)| path).collect()
}

fn recovered(mut state: TrackerState) -> TrackerState {
    state.mark_recovered();
    state
}

#[test]
fn restart_rebuilds_the_state_from_the_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(t(1000));
    let (tracker, report) = open(dir.path(), &clock);
    assert_eq!(report.records, 0);
    assert!(tracker.add_blocks(&[block(0, 1), block(1, 2)]));
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    clock.advance(Duration::from_millis(500));
    assert!(tracker.add_block(block(0, 3)));
    let live = tracker.state();
    tracker.close().unwrap();
    drop(tracker);

    let (restarted, report) = open(dir.path(), &clock);
    assert_eq!((report.records, report.events), (3, 4));
    assert!(report.is_complete());
    assert_eq!(restarted.state(), recovered(live));
    assert_eq!(batch_ids(&restarted, t(1000), 0), vec![1]);
    assert_eq!(unallocated_ids(&restarted, 0), vec![3]);
}

#[test]
fn replay_stops_cleanly_before_a_torn_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(t(1000));
    let (tracker, _) = open(dir.path(), &clock);
    assert!(tracker.add_block(block(0, 1)));
    assert!(tracker.add_block(block(0, 2)));
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    assert!(tracker.add_block(block(0, 3)));
    assert!(tracker.add_block(block(0, 4)));
    tracker.close().unwrap();
    drop(tracker);

    // A crash in the middle of writing the last record.
    let last = segments(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    OpenOptions::new().write(true).open(&last).unwrap().set_len(len - 7).unwrap();

    let (restarted, report) = open(dir.path(), &clock);
    assert_eq!(report.records, 4);
    assert_eq!(batch_ids(&restarted, t(1000), 0), vec![1, 2]);
    assert_eq!(unallocated_ids(&restarted, 0), vec![3]);
    // The log goes on after the cut: a new record is read back after the next restart.
    assert!(restarted.add_block(block(0, 5)));
    restarted.close().unwrap();
    drop(restarted);
    let (again, report) = open(dir.path(), &clock);
    assert_eq!(report.records, 5);
    assert_eq!(unallocated_ids(&again, 0), vec![3, 5]);
}

#[test]
fn cleanup_deletes_old_segments_and_keeps_what_replay_needs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(t(0));
    let options = WalSettings::default().with_rolling_interval(Duration::from_millis(250));
    let (tracker, _) =
        ReceivedBlockTracker::open_with(Some(dir.path()), options.clone(), Arc::new(clock.clone())).unwrap();
    let mut id = 0;
    for batch in 1..=40 {
        for stream in 0..2 {
            id += 1;
            assert!(tracker.add_block(block(stream, id)));
        }
        clock.set(t(batch * 100));
        tracker.allocate_blocks_to_batch(t(batch * 100)).unwrap();
        if batch % 5 == 0 {
            tracker.cleanup_old_batches(t(batch * 100 - 300), true).unwrap();
        }
    }
    assert!(tracker.add_block(block(0, id + 1)));
    let segments_left = segments(dir.path()).len();
    assert!(segments_left < 16, "{segments_left} segments left of 16 written: nothing was cleaned");
    let live = tracker.state();
    assert_eq!(live.allocated_batches().count(), 4); // 3700..=4000
    tracker.close().unwrap();
    drop(tracker);

    let (restarted, _) = ReceivedBlockTracker::open_with(Some(dir.path()), options, Arc::new(clock.clone())).unwrap();
    assert_eq!(restarted.state(), recovered(live));
    // Re-running the last batch after the restart gives it the same blocks.
    restarted.allocate_blocks_to_batch(t(4000)).unwrap();
    assert_eq!(batch_ids(&restarted, t(4000), 0), vec![79]);
    assert_eq!(unallocated_ids(&restarted, 0), vec![81]);
}

#[test]
fn a_failed_fdatasync_queues_nothing_and_a_retry_after_restart_is_not_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(t(1000));
    let hook = FaultInjection::new();
    let options = WalSettings::default().with_fault_injection(hook.clone());
    let (tracker, _) = ReceivedBlockTracker::open_with(Some(dir.path()), options, Arc::new(clock.clone())).unwrap();
    assert!(tracker.add_block(block(0, 1)));
    hook.fail_sync_number(hook.sync_count() + 1);
    assert!(!tracker.add_block(block(0, 2)));
    assert_eq!(unallocated_ids(&tracker, 0), vec![1]);
    // The log is poisoned now: it refuses writes until it is reopened.
    assert!(!tracker.add_block(block(0, 3)));
    assert!(tracker.allocate_blocks_to_batch(t(1000)).is_err());
    assert_eq!(unallocated_ids(&tracker, 0), vec![1]);
    drop(tracker);

    // After the restart the receiver sends the unacknowledged blocks again.
    // The record of block 2 may have reached the disk despite the failed
    // sync; either way each block is queued once.
    let (restarted, _) = open(dir.path(), &clock);
    assert!(restarted.add_block(block(0, 2)));
    assert!(restarted.add_block(block(0, 3)));
    assert_eq!(unallocated_ids(&restarted, 0), vec![1, 2, 3]);
}

/// What one run of the crash workload had acknowledged when it stopped.
#[derive(Default)]
struct Acknowledged {
    blocks: Vec<u64>,
    /// Each acknowledged allocation: its time and the blocks it took.
    batches: Vec<(Time, Vec<u64>)>,
    finished: bool,
}

/// Adds 12 blocks and allocates a batch after every 4, stopping at the
/// first refusal (the simulated crash).
fn crash_workload(tracker: &ReceivedBlockTracker) -> Acknowledged {
    let mut acked = Acknowledged::default();
    for id in 0..12u64 {
        if !tracker.add_block(block(0, id)) {
            return acked;
        }
        acked.blocks.push(id);
        if id % 4 == 3 {
            let time = t(1000 * (1 + i64::try_from(id / 4).unwrap()));
            if tracker.allocate_blocks_to_batch(time).is_err() {
                return acked;
            }
            acked.batches.push((time, batch_ids(tracker, time, 0)));
        }
    }
    acked.finished = true;
    acked
}

#[test]
fn a_crash_at_any_step_losing_unsynced_data_keeps_every_acknowledged_event() {
    let clock = ManualClock::new(t(1000));
    let mut crash_points = 0;
    for n in 0.. {
        let dir = tempfile::tempdir().unwrap();
        let hook = FaultInjection::new();
        hook.lose_unsynced_data();
        hook.crash_after_operations(n);
        let options = WalSettings::default().with_fault_injection(hook.clone());
        let acked = match ReceivedBlockTracker::open_with(Some(dir.path()), options, Arc::new(clock.clone())) {
            Ok((tracker, _)) => {
                let acked = crash_workload(&tracker);
                // A dead process closes nothing.
                std::mem::forget(tracker);
                acked
            }
            Err(_) => Acknowledged::default(),
        };
        if acked.finished && !hook.crashed() {
            break;
        }
        crash_points += 1;
        hook.simulate_crash().unwrap();

        let (restarted, _) = open(dir.path(), &clock);
        let mut seen: Vec<u64> = unallocated_ids(&restarted, 0);
        for (time, blocks) in &acked.batches {
            assert_eq!(&batch_ids(&restarted, *time, 0), blocks, "crash after {n} operations: batch at {time}");
        }
        for k in 1..=3 {
            seen.extend(batch_ids(&restarted, t(1000 * k), 0));
        }
        let mut unique = seen.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), seen.len(), "crash after {n} operations: a block is queued twice: {seen:?}");
        for id in &acked.blocks {
            assert!(seen.contains(id), "crash after {n} operations: acknowledged block {id} is lost ({seen:?})");
        }
        assert!(seen.iter().all(|id| *id < 12), "crash after {n} operations: a block nobody added: {seen:?}");
    }
    assert!(crash_points > 10, "the workload crashed at only {crash_points} points");
}
