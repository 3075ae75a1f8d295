//! Tests of the tracker with its log: crash and replay at every point,
//! failing writes, re-runs after recovery, lost blocks, group commit.

use std::sync::Arc;

use proptest::prelude::*;
use spate_core::{
    BlockStoreResult, Clock, Duration, FrameCodec, ManualClock, ReceivedBlockInfo, StreamBlockId, StreamId, Time,
    WalRecordHandle,
};

use crate::event::{EVENT_FORMAT_VERSION, TrackerEvent};
use crate::memory_wal::MemoryWal;
use crate::state::{BlockLocation, TrackerState};
use crate::{ReceivedBlockTracker, RecoveryReport, TrackerError};

const INTERVAL: Duration = Duration::from_millis(100);

fn block(stream: u32, id: u64, records: Option<u64>, with_handle: bool) -> ReceivedBlockInfo {
    let wal_handle = with_handle.then(|| WalRecordHandle { segment: format!("log-{stream}"), offset: id, length: 48 });
    ReceivedBlockInfo {
        stream_id: StreamId(stream),
        num_records: records,
        metadata: Some(id.to_le_bytes().to_vec()),
        store_result: BlockStoreResult {
            block_id: StreamBlockId::new(StreamId(stream), id),
            num_records: records,
            wal_handle,
        },
    }
}

fn t(ms: i64) -> Time {
    Time::from_millis(ms)
}

fn logged_tracker(clock: &ManualClock) -> (Arc<MemoryWal>, ReceivedBlockTracker) {
    let wal = Arc::new(MemoryWal::default());
    let (tracker, report) = ReceivedBlockTracker::recover(wal.clone(), "memory", Arc::new(clock.clone())).unwrap();
    assert_eq!(report.events, 0);
    (wal, tracker)
}

/// A restart: a new tracker over what the log held at the crash.
fn restart(records: Vec<(Time, Vec<u8>)>, clock: &ManualClock) -> (ReceivedBlockTracker, RecoveryReport) {
    let wal = Arc::new(MemoryWal::with_records(records));
    ReceivedBlockTracker::recover(wal, "memory", Arc::new(clock.clone())).unwrap()
}

fn recovered(mut state: TrackerState) -> TrackerState {
    state.mark_recovered();
    state
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        stream: u32,
        records: Option<u64>,
        with_handle: bool,
    },
    AddMany {
        stream: u32,
        count: usize,
    },
    /// Allocate the batch `back` intervals before the current one (0 = current;
    /// negative: a batch time ahead of the clock).
    Allocate {
        back: i64,
    },
    /// Clean up batches older than `back` intervals before now.
    Cleanup {
        back: u64,
    },
    Advance {
        ms: u64,
    },
    FailNextWrite,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, proptest::option::of(0u64..1000), any::<bool>())
            .prop_map(|(stream, records, with_handle)| Op::Add { stream, records, with_handle }),
        1 => (0u32..3, 1usize..5).prop_map(|(stream, count)| Op::AddMany { stream, count }),
        3 => (-2i64..3).prop_map(|back| Op::Allocate { back }),
        1 => (0u64..6).prop_map(|back| Op::Cleanup { back }),
        3 => (1u64..250).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::FailNextWrite),
    ]
}

/// Runs `op`; returns false when it failed (a failed log write).
fn run(op: &Op, tracker: &ReceivedBlockTracker, wal: &MemoryWal, clock: &ManualClock, next_id: &mut u64) -> bool {
    let mut fresh = |stream: u32, records, with_handle| {
        *next_id += 1;
        block(stream, *next_id, records, with_handle)
    };
    match op {
        Op::Add { stream, records, with_handle } => tracker.add_block(fresh(*stream, *records, *with_handle)),
        Op::AddMany { stream, count } => {
            let blocks: Vec<_> = (0..*count).map(|i| fresh(*stream, Some(i as u64), i % 2 == 0)).collect();
            tracker.add_blocks(&blocks)
        }
        Op::Allocate { back } => {
            let current = clock.now().floor(INTERVAL);
            let time = if *back >= 0 {
                current - INTERVAL.times(back.unsigned_abs())
            } else {
                current + INTERVAL.times(back.unsigned_abs())
            };
            tracker.allocate_blocks_to_batch(time).is_ok()
        }
        Op::Cleanup { back } => tracker.cleanup_old_batches(clock.now() - INTERVAL.times(*back), true).is_ok(),
        Op::Advance { ms } => {
            clock.advance(Duration::from_millis(*ms));
            true
        }
        Op::FailNextWrite => {
            wal.fail_next_writes(1);
            true
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A crash after any operation: the state replayed from what the log
    /// held then equals the live state after the last durable event (with
    /// every block marked recovered), even though cleanups deleted records.
    #[test]
    fn replay_after_a_crash_anywhere_rebuilds_the_durable_state(ops in proptest::collection::vec(op(), 1..60)) {
        let clock = ManualClock::new(t(10_000));
        let (wal, tracker) = logged_tracker(&clock);
        let mut next_id = 0;
        let mut crash_points = Vec::new();
        for op in &ops {
            let before = tracker.state();
            let ok = run(op, &tracker, &wal, &clock, &mut next_id);
            if !ok {
                prop_assert_eq!(&tracker.state(), &before, "a failed {:?} changed the state", op);
            }
            crash_points.push((wal.records(), tracker.state()));
        }
        for (i, (records, live)) in crash_points.into_iter().enumerate() {
            let (restarted, report) = restart(records, &clock);
            prop_assert_eq!(restarted.state(), recovered(live), "replay after op {} ({:?})", i, &ops[i]);
            prop_assert_eq!(report.unallocated_blocks, restarted.state().all_unallocated_blocks().count() as u64);
        }
    }
}

#[test]
fn failed_log_write_queues_nothing() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    wal.fail_next_writes(1);
    assert!(!tracker.add_block(block(0, 1, Some(5), true)));
    assert!(!tracker.has_unallocated_blocks());
    assert!(wal.records().is_empty());
    wal.fail_next_writes(1);
    assert!(!tracker.add_blocks(&[block(0, 2, Some(5), true), block(1, 3, Some(5), true)]));
    assert!(!tracker.has_unallocated_blocks());
    assert!(tracker.add_block(block(0, 4, Some(5), true)));
    assert_eq!(tracker.unallocated_blocks(StreamId(0)).len(), 1);
    assert_eq!(tracker.stats().events_logged, 1);
}

#[test]
fn failed_allocation_leaves_blocks_unallocated() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    assert!(tracker.add_block(block(0, 1, Some(5), true)));
    wal.fail_next_writes(1);
    let err = tracker.allocate_blocks_to_batch(t(1000)).unwrap_err();
    assert!(matches!(err, TrackerError::LogWrite { .. }), "{err}");
    assert!(err.to_string().contains("allocation of batch 1000 ms"), "{err}");
    assert!(tracker.has_unallocated_blocks());
    assert_eq!(tracker.last_allocated_batch_time(), None);
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    assert_eq!(tracker.get_blocks_of_batch_and_stream(t(1000), StreamId(0)).len(), 1);
}

#[test]
fn rerun_of_an_allocated_batch_after_recovery_gets_the_same_blocks() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    tracker.add_blocks(&[block(0, 1, Some(10), true), block(1, 2, Some(20), true)]);
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    let before: Vec<_> = tracker.get_blocks_of_batch(t(1000)).values().flatten().map(|b| b.block_id()).collect();
    clock.advance(INTERVAL);
    assert!(tracker.add_block(block(0, 3, Some(30), true)));
    // Crash; the restarted runtime re-runs batch 1000 before anything else.
    let (restarted, _) = restart(wal.records(), &clock);
    restarted.allocate_blocks_to_batch(t(1000)).unwrap();
    let after: Vec<_> = restarted.get_blocks_of_batch(t(1000)).values().flatten().map(|b| b.block_id()).collect();
    assert_eq!(after, before);
    // A batch older than the last allocated one gets nothing either.
    restarted.allocate_blocks_to_batch(t(900)).unwrap();
    assert!(restarted.get_blocks_of_batch(t(900)).is_empty());
    // The block received after batch 1000 waits for the next batch.
    let waiting: Vec<_> = restarted.unallocated_blocks(StreamId(0)).iter().map(|b| b.block_id().unique_id).collect();
    assert_eq!(waiting, vec![3]);
    restarted.allocate_blocks_to_batch(t(1100)).unwrap();
    assert_eq!(restarted.get_blocks_of_batch_and_stream(t(1100), StreamId(0))[0].block_id().unique_id, 3);
}

#[test]
fn recovered_blocks_without_wal_handles_are_reported_lost_with_counts() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    tracker.add_blocks(&[block(0, 1, Some(10), false), block(0, 2, Some(20), true), block(1, 3, None, false)]);
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    assert!(tracker.add_block(block(0, 4, Some(7), false)));
    let (restarted, report) = restart(wal.records(), &clock);
    let by_stream = report.unrecoverable_by_stream();
    assert_eq!(by_stream[&StreamId(0)].blocks, 2);
    assert_eq!(by_stream[&StreamId(0)].records, 17);
    assert_eq!(by_stream[&StreamId(1)].blocks, 1);
    assert_eq!(by_stream[&StreamId(1)].blocks_without_count, 1);
    let lost_batches: Vec<_> = report.unrecoverable.iter().map(|b| (b.block_id.unique_id, b.batch)).collect();
    assert_eq!(lost_batches, vec![(4, None), (1, Some(t(1000))), (3, Some(t(1000)))]);
    let message = report.ensure_recoverable().unwrap_err().to_string();
    assert!(message.contains("stream 0: 2 block(s), 17 record(s)"), "{message}");
    assert!(message.contains("stream 1: 1 block(s), 0 record(s) plus 1 block(s) of unknown size"), "{message}");
    // The blocks themselves say so: lost, not empty; the one with a handle is read from the WAL.
    let locations: Vec<_> = restarted.get_blocks_of_batch_and_stream(t(1000), StreamId(0)).into_iter().collect();
    assert_eq!(locations[0].location(), BlockLocation::Lost);
    assert!(matches!(locations[1].location(), BlockLocation::ReceiverWal(h) if h.offset == 2));
    // Blocks received by the restarted process come from its block manager.
    assert!(restarted.add_block(block(0, 5, Some(1), false)));
    let fresh = restarted.unallocated_blocks(StreamId(0));
    assert!(matches!(fresh[1].location(), BlockLocation::BlockManager(_)));
}

#[test]
fn complete_recovery_passes_the_check() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    tracker.add_blocks(&[block(0, 1, Some(10), true)]);
    let (_, report) = restart(wal.records(), &clock);
    assert!(report.ensure_recoverable().is_ok());
    assert_eq!((report.records, report.events, report.unallocated_blocks), (1, 1, 1));
}

#[test]
fn cleanup_forgets_old_batches_and_refuses_a_future_threshold() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    for time in [1000, 1100, 1200] {
        clock.set(t(time));
        assert!(tracker.add_block(block(0, time as u64, Some(1), true)));
        tracker.allocate_blocks_to_batch(t(time)).unwrap();
    }
    let err = tracker.cleanup_old_batches(t(5000), true).unwrap_err();
    assert!(matches!(err, TrackerError::CleanupThresholdInFuture { .. }), "{err}");
    tracker.cleanup_old_batches(t(1200), true).unwrap();
    assert!(tracker.get_blocks_of_batch(t(1100)).is_empty());
    assert_eq!(tracker.get_blocks_of_batch_and_stream(t(1200), StreamId(0)).len(), 1);
    // Records of batches 1000 and 1100 went; batch 1200's allocation stayed.
    assert!(wal.records().iter().all(|(time, _)| *time >= t(1200)));
    let (restarted, _) = restart(wal.records(), &clock);
    assert_eq!(restarted.state(), recovered(tracker.state()));
}

#[test]
fn a_record_from_a_newer_format_is_refused_by_name() {
    let clock = ManualClock::new(t(1000));
    let newer = FrameCodec::new(EVENT_FORMAT_VERSION + 1)
        .encode(&vec![TrackerEvent::BlockAddition(block(0, 1, None, true))])
        .unwrap();
    let wal = Arc::new(MemoryWal::with_records(vec![(t(1000), newer)]));
    let err = ReceivedBlockTracker::recover(wal, "ckpt/receivedBlockMetadata", Arc::new(clock)).unwrap_err();
    assert!(
        matches!(&err, TrackerError::BadRecord { record: 0, source, .. }
            if matches!(**source, TrackerError::NewerFormat { found: 2, supported: 1 })),
        "{err}"
    );
    assert!(err.to_string().contains("newer spate"), "{err}");
    assert!(err.to_string().contains("ckpt/receivedBlockMetadata"), "{err}");
}

#[test]
fn concurrent_additions_are_all_queued_once_in_order() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    let tracker = Arc::new(tracker);
    let threads: Vec<_> = (0..4u32)
        .map(|stream| {
            let tracker = tracker.clone();
            std::thread::spawn(move || (0..200u64).all(|id| tracker.add_block(block(stream, id, Some(1), true))))
        })
        .collect();
    for thread in threads {
        assert!(thread.join().unwrap());
    }
    let stats = tracker.stats();
    assert_eq!(stats.events_logged, 800);
    assert!(stats.log_writes <= 800);
    for stream in 0..4 {
        let ids: Vec<_> = tracker.unallocated_blocks(StreamId(stream)).iter().map(|b| b.block_id().unique_id).collect();
        assert_eq!(ids, (0..200).collect::<Vec<_>>());
    }
    let (restarted, report) = restart(wal.records(), &clock);
    assert_eq!(report.events, 800);
    assert_eq!(restarted.state(), recovered(tracker.state()));
}

#[test]
fn in_memory_tracker_allocates_and_cleans_without_a_log() {
    let clock = ManualClock::new(t(2000));
    let tracker = ReceivedBlockTracker::in_memory(Arc::new(clock));
    assert!(tracker.add_block(block(0, 1, Some(1), false)));
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    tracker.cleanup_old_batches(t(2000), false).unwrap();
    assert!(tracker.get_blocks_of_batch(t(1000)).is_empty());
    assert_eq!(tracker.stats().log_writes, 0);
    assert_eq!(tracker.last_allocated_batch_time(), Some(t(1000)));
}

#[test]
fn unallocated_neighbours_are_the_blocks_next_to_one_in_its_next_batch() {
    let clock = ManualClock::new(t(2000));
    let tracker = ReceivedBlockTracker::in_memory(Arc::new(clock));
    let id = |stream, id| StreamBlockId::new(StreamId(stream), id);
    for (stream, n) in [(0, 1), (0, 2), (1, 7), (0, 3)] {
        assert!(tracker.add_block(block(stream, n, Some(1), false)));
    }
    assert_eq!(tracker.unallocated_neighbours(StreamId(0), id(0, 1)), Some((None, Some(id(0, 2)))));
    assert_eq!(tracker.unallocated_neighbours(StreamId(0), id(0, 2)), Some((Some(id(0, 1)), Some(id(0, 3)))));
    assert_eq!(tracker.unallocated_neighbours(StreamId(0), id(0, 3)), Some((Some(id(0, 2)), None)));
    assert_eq!(tracker.unallocated_neighbours(StreamId(1), id(1, 7)), Some((None, None)), "streams apart");
    assert_eq!(tracker.unallocated_neighbours(StreamId(1), id(0, 2)), None, "not of that stream");
    tracker.allocate_blocks_to_batch(t(1000)).unwrap();
    assert!(tracker.add_block(block(0, 4, Some(1), false)));
    assert_eq!(tracker.unallocated_neighbours(StreamId(0), id(0, 3)), None, "allocated");
    assert_eq!(tracker.unallocated_neighbours(StreamId(0), id(0, 4)), Some((None, None)), "the batch before is apart");
}

/// Runs `f` on a thread and returns its result, failing the test when it
/// does not return within a generous bound (a hang shows as a failure).
fn returns<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(result) => result,
        Err(_) => panic!("{what} never returned"),
    }
}

#[test]
fn a_panic_in_the_group_commit_leader_fails_its_waiters_and_later_additions() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    let tracker = Arc::new(tracker);
    assert!(tracker.add_block(block(0, 1, Some(1), true)));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    wal.panic_in_next_write(entered_tx, release_rx);
    let leader = {
        let tracker = tracker.clone();
        std::thread::spawn(move || tracker.try_add_block(block(0, 2, Some(1), true)))
    };
    entered.recv().unwrap();
    // A second caller queues while the leader is inside the write.
    let (waiter_tx, waiter) = std::sync::mpsc::channel();
    {
        let tracker = tracker.clone();
        std::thread::spawn(move || waiter_tx.send(tracker.try_add_block(block(0, 3, Some(1), true))));
    }
    while tracker.queued_additions() == 0 {
        std::thread::yield_now();
    }
    release.send(()).unwrap();
    assert!(leader.join().is_err(), "the leader's panic reaches its caller");

    let waited = waiter.recv_timeout(std::time::Duration::from_secs(60)).expect("the waiting caller never returned");
    let err = waited.unwrap_err();
    assert!(matches!(&err, TrackerError::AdditionNotLogged { blocks: 1, .. }), "{err}");
    assert!(err.to_string().contains("a panic interrupted logging block additions"), "{err}");
    let later = {
        let tracker = tracker.clone();
        returns("an addition after the panic", move || tracker.try_add_block(block(0, 4, Some(1), true)))
    };
    let err = later.unwrap_err();
    assert!(err.to_string().contains("restart to rebuild its state from the event log"), "{err}");
    let tracker_for_allocation = tracker.clone();
    let allocated =
        returns("an allocation after the panic", move || tracker_for_allocation.allocate_blocks_to_batch(t(1000)));
    assert!(matches!(allocated, Err(TrackerError::Poisoned { during: "logging block additions" })), "{allocated:?}");
    let ids: Vec<_> = tracker.unallocated_blocks(StreamId(0)).iter().map(|b| b.block_id().unique_id).collect();
    assert_eq!(ids, vec![1], "nothing after the panic was queued");
    assert_eq!(wal.records().len(), 1);
}

#[test]
fn a_panic_while_logging_an_allocation_makes_the_tracker_refuse_changes() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    assert!(tracker.add_block(block(0, 1, Some(1), true)));
    let (entered_tx, _entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    drop(release);
    wal.panic_in_next_write(entered_tx, release_rx);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tracker.allocate_blocks_to_batch(t(1000))));
    assert!(panicked.is_err());
    let err = tracker.try_add_block(block(0, 2, Some(1), true)).unwrap_err();
    assert!(err.to_string().contains("a panic interrupted logging a batch allocation"), "{err}");
    assert!(tracker.cleanup_old_batches(t(1000), true).is_err());
    // Restarting rebuilds the tracker from what the log holds.
    let (restarted, _) = restart(wal.records(), &clock);
    assert!(restarted.add_block(block(0, 2, Some(1), true)));
}

#[test]
fn a_panic_in_the_group_commit_leader_fails_the_callers_of_its_group() {
    let clock = ManualClock::new(t(1000));
    let (wal, tracker) = logged_tracker(&clock);
    let tracker = Arc::new(tracker);
    assert!(tracker.add_block(block(0, 1, Some(1), true)));
    // An allocation holds the log while two additions queue behind it: the
    // first to come leads their group, the other waits for it.
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    wal.hold_next_write(entered_tx, release_rx);
    let allocation = {
        let tracker = tracker.clone();
        std::thread::spawn(move || tracker.allocate_blocks_to_batch(t(1000)))
    };
    entered.recv().unwrap();
    let (results_tx, results) = std::sync::mpsc::channel();
    let adders: Vec<_> = [2u64, 3]
        .into_iter()
        .map(|id| {
            let (tracker, results_tx) = (tracker.clone(), results_tx.clone());
            std::thread::spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tracker.try_add_block(block(0, id, Some(1), true))
                }));
                let _ = results_tx.send(outcome.map_err(|_| "panicked"));
            })
        })
        .collect();
    while tracker.queued_additions() < 2 {
        std::thread::yield_now();
    }
    // The group's write panics at once.
    let (panic_entered, _panic_entered) = std::sync::mpsc::channel();
    let (panic_release, panic_release_rx) = std::sync::mpsc::channel();
    drop(panic_release);
    wal.panic_in_next_write(panic_entered, panic_release_rx);
    release.send(()).unwrap();
    allocation.join().unwrap().unwrap();
    let mut outcomes: Vec<String> = (0..2)
        .map(|_| {
            let outcome = results.recv_timeout(std::time::Duration::from_secs(60)).expect("a caller never returned");
            match outcome {
                Ok(Ok(())) => "queued".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(panicked) => panicked.to_string(),
            }
        })
        .collect();
    outcomes.sort();
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes[0].contains("not queued: the tracker takes no more changes"), "{outcomes:?}");
    assert_eq!(outcomes[1], "panicked", "the leader's own panic reaches it");
    for adder in adders {
        adder.join().unwrap();
    }
    assert!(!tracker.has_unallocated_blocks());
}
