//! Event-time windows and timers: when a window is emitted, what late
//! records do, idle partitions, restore by name; and a property test that
//! what is emitted does not depend on how records fall into batches, nor
//! on crashes and restores, compared with a reference over the whole input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use common::{INTERVAL, t};
use proptest::prelude::*;
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{
    DStream, DStreamError, EventWindows, Graph, GraphBuilder, QueueSource, RestorePolicy, Timed, Watermarks,
    WindowResult,
};

/// A record: key, then (event time in ms, value).
type Rec = (u8, (i64, u64));
type Results = Arc<Mutex<BTreeMap<Time, Vec<WindowResult<u8, u64>>>>>;
type Late = Arc<Mutex<BTreeMap<Time, Vec<Rec>>>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn event_time(value: &(i64, u64)) -> Time {
    Time::from_millis(value.0)
}

/// Records every batch a stream emits, by batch time (a re-run replaces).
fn sink<T: spate_dstream::Data>(stream: &DStream<T>, into: &Arc<Mutex<BTreeMap<Time, Vec<T>>>>) {
    let into = Arc::clone(into);
    stream.foreach_batch(move |batch, info| {
        into.lock().unwrap().insert(info.time, batch.iter().cloned().collect());
        Ok(())
    });
}

/// A graph summing values per key over `windows`, with its outputs.
struct Summed {
    graph: Graph,
    queue: Arc<QueueSource<Rec>>,
}

fn summed(windows: EventWindows, watermarks: Watermarks, results: &Results, late: &Late) -> Summed {
    let builder = GraphBuilder::new(INTERVAL).partitions(2).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let windowed = builder
        .input("events", Arc::clone(&queue))
        .map_values(|v: (i64, u64)| v)
        .aggregate_by_event_time(
            event_time,
            watermarks,
            windows,
            |(_, v)| v,
            |acc: &mut u64, (_, v)| *acc += v,
            |acc: &mut u64, other: &u64| *acc += other,
        )
        .name("sums");
    sink(&windowed.results(), results);
    sink(&windowed.late(), late);
    Summed { graph: builder.build().unwrap(), queue }
}

fn all<T: Clone + Ord>(map: &Arc<Mutex<BTreeMap<Time, Vec<T>>>>) -> Vec<(Time, T)> {
    let mut out: Vec<(Time, T)> =
        map.lock().unwrap().iter().flat_map(|(time, rows)| rows.iter().map(|r| (*time, r.clone()))).collect();
    out.sort();
    out
}

fn result(key: u8, start: i64, end: i64, value: u64, revision: u32) -> WindowResult<u8, u64> {
    let window = spate_dstream::Window { start: Time::from_millis(start), end: Time::from_millis(end) };
    WindowResult { key, window, value, revision }
}

fn run_batches(s: &mut Summed, batches: &[Vec<Vec<Rec>>]) {
    for (index, partitions) in batches.iter().enumerate() {
        s.queue.push_partitions(partitions.clone());
        let batch = index as i64 + 1;
        s.graph.run_batch(t(batch), BatchId(batch as u64)).unwrap();
    }
}

#[test]
fn a_tumbling_window_is_emitted_once_when_the_watermark_passes_its_end_and_later_records_go_to_the_late_output() {
    let (results, late) = (Results::default(), Late::default());
    let mut s =
        summed(EventWindows::tumbling(ms(1000)), Watermarks::bounded_out_of_orderness(Duration::ZERO), &results, &late);
    run_batches(
        &mut s,
        &[
            vec![vec![(1, (100, 1)), (1, (900, 2)), (2, (950, 5))]],
            // The watermark reaches 1500: [0, 1000) is complete.
            vec![vec![(1, (1500, 4))]],
            // Behind the watermark, but its window [1000, 2000) is still open.
            vec![vec![(1, (1200, 8))]],
            // Its window [0, 1000) was emitted and is gone: late.
            vec![vec![(1, (500, 16))]],
            vec![vec![(2, (2000, 1))]],
        ],
    );
    assert_eq!(
        all(&results),
        vec![(t(2), result(1, 0, 1000, 3, 0)), (t(2), result(2, 0, 1000, 5, 0)), (t(5), result(1, 1000, 2000, 12, 0))]
    );
    assert_eq!(all(&late), vec![(t(4), (1, (500, 16)))]);
}

#[test]
fn within_the_allowed_lateness_a_late_record_updates_its_window_and_it_is_emitted_again() {
    let (results, late) = (Results::default(), Late::default());
    let windows = EventWindows::tumbling(ms(1000)).allowed_lateness(ms(1000));
    let mut s = summed(windows, Watermarks::bounded_out_of_orderness(Duration::ZERO), &results, &late);
    run_batches(
        &mut s,
        &[
            vec![vec![(1, (100, 1))]],
            vec![vec![(1, (1500, 2))]],
            // 1500 < 1000 + 1000: [0, 1000) is still kept.
            vec![vec![(1, (200, 4))]],
            vec![vec![(1, (300, 8))]],
            vec![vec![(1, (2000, 1))]],
            // At 2000, [0, 1000) is gone.
            vec![vec![(1, (400, 16))]],
        ],
    );
    assert_eq!(
        all(&results),
        vec![
            (t(2), result(1, 0, 1000, 1, 0)),
            (t(3), result(1, 0, 1000, 5, 1)),
            (t(4), result(1, 0, 1000, 13, 2)),
            (t(5), result(1, 1000, 2000, 2, 0)),
        ]
    );
    assert_eq!(all(&late), vec![(t(6), (1, (400, 16)))]);
}

#[test]
fn a_key_late_in_two_input_partitions_of_one_batch_updates_its_window_once() {
    let (results, late) = (Results::default(), Late::default());
    let windows = EventWindows::tumbling(ms(1000)).allowed_lateness(ms(1000));
    let mut s = summed(windows, Watermarks::bounded_out_of_orderness(Duration::ZERO), &results, &late);
    let keys = 1..=6u8;
    run_batches(
        &mut s,
        &[
            vec![keys.clone().map(|k| (k, (100, 1))).collect()],
            vec![vec![(1, (1500, 2))]],
            // Every key is late in both input partitions.
            vec![keys.clone().map(|k| (k, (200, 4))).collect(), keys.clone().map(|k| (k, (300, 8))).collect()],
            // Both partitions pass 2000 (the watermark is the slower one's).
            vec![vec![(1, (2000, 1))], vec![(2, (2000, 1))]],
        ],
    );
    let mut expected: Vec<(Time, WindowResult<u8, u64>)> =
        keys.clone().map(|k| (t(2), result(k, 0, 1000, 1, 0))).collect();
    expected.extend(keys.map(|k| (t(3), result(k, 0, 1000, 13, 1))));
    expected.push((t(4), result(1, 1000, 2000, 2, 0)));
    assert_eq!(all(&results), expected);
}

#[test]
fn a_late_record_updates_each_sliding_window_holding_it_from_that_windows_panes_alone() {
    let (results, late) = (Results::default(), Late::default());
    let windows = EventWindows::sliding(ms(2000), ms(1000)).allowed_lateness(ms(2000));
    let mut s = summed(windows, Watermarks::bounded_out_of_orderness(Duration::ZERO), &results, &late);
    run_batches(
        &mut s,
        &[
            // Key 1 in four panes in a row; the watermark reaches 13500.
            vec![vec![(1, (10_500, 1)), (1, (11_500, 2)), (2, (11_500, 32)), (1, (12_500, 4)), (1, (13_500, 8))]],
            // Each late record is in two windows; for key 2's at 10100,
            // [9000, 11000) is gone, [10000, 12000) is not.
            vec![vec![(1, (11_200, 16)), (2, (10_100, 64))]],
        ],
    );
    assert_eq!(
        all(&results),
        vec![
            (t(1), result(1, 9000, 11_000, 1, 0)),
            (t(1), result(1, 10_000, 12_000, 3, 0)),
            (t(1), result(1, 11_000, 13_000, 6, 0)),
            (t(1), result(2, 10_000, 12_000, 32, 0)),
            (t(1), result(2, 11_000, 13_000, 32, 0)),
            (t(2), result(1, 10_000, 12_000, 19, 1)),
            (t(2), result(1, 11_000, 13_000, 22, 1)),
            (t(2), result(2, 10_000, 12_000, 96, 1)),
        ]
    );
    assert_eq!(all(&late), vec![]);
}

#[test]
fn sliding_windows_hold_each_record_in_size_over_slide_windows() {
    let (results, late) = (Results::default(), Late::default());
    let windows = EventWindows::sliding(ms(3000), ms(1000));
    let mut s = summed(windows, Watermarks::bounded_out_of_orderness(Duration::ZERO), &results, &late);
    run_batches(&mut s, &[vec![vec![(1, (500, 1)), (1, (1500, 10))]], vec![vec![(1, (9000, 100))]]]);
    // [7000, 10000) and later windows of the record at 9000 are not complete.
    assert_eq!(
        all(&results),
        vec![
            (t(1), result(1, -2000, 1000, 1, 0)),
            (t(2), result(1, -1000, 2000, 11, 0)),
            (t(2), result(1, 0, 3000, 11, 0)),
            (t(2), result(1, 1000, 4000, 10, 0)),
        ]
    );
}

#[test]
fn a_record_between_two_sessions_merges_them() {
    let (results, late) = (Results::default(), Late::default());
    let windows = EventWindows::session(ms(1000));
    let mut s = summed(windows, Watermarks::bounded_out_of_orderness(ms(5000)), &results, &late);
    run_batches(
        &mut s,
        &[
            vec![vec![(1, (0, 1)), (1, (500, 2)), (1, (2000, 4)), (2, (100, 7))]],
            vec![vec![(1, (1200, 8))]],
            // The watermark reaches 4000: both keys' sessions are complete.
            vec![vec![(3, (9000, 1))]],
        ],
    );
    assert_eq!(all(&results), vec![(t(3), result(1, 0, 3000, 15, 0)), (t(3), result(2, 100, 1100, 7, 0))]);
    assert!(all(&late).is_empty());
}

#[test]
fn a_partition_that_delivers_nothing_holds_windows_back_until_the_idle_timeout() {
    for (idle, expected_batch) in [(None, None), (Some(ms(2000)), Some(3))] {
        let (results, late) = (Results::default(), Late::default());
        let mut watermarks = Watermarks::bounded_out_of_orderness(Duration::ZERO);
        if let Some(idle) = idle {
            watermarks = watermarks.with_idle_timeout(idle);
        }
        let mut s = summed(EventWindows::tumbling(ms(1000)), watermarks, &results, &late);
        run_batches(
            &mut s,
            &[
                vec![vec![(1, (100, 1))], vec![(2, (200, 2))]],
                vec![vec![(1, (1500, 4))], vec![]],
                vec![vec![(1, (2500, 8))], vec![]],
                vec![vec![(1, (3500, 16))], vec![]],
            ],
        );
        let first = all(&results).first().map(|(time, _)| time.as_millis() / 1000);
        assert_eq!(first, expected_batch, "idle timeout {idle:?}");
    }
}

#[test]
fn timers_fire_once_the_watermark_reaches_them_and_late_records_are_set_aside() {
    let builder = GraphBuilder::new(INTERVAL).partitions(2).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::<Rec>::new());
    // Per key, the sum of its values until the first record's time + 1000.
    let processed = builder.input("events", Arc::clone(&queue)).process_by_event_time(
        event_time,
        Watermarks::bounded_out_of_orderness(Duration::ZERO),
        |key: &u8, what: Timed<(i64, u64)>, state, out: &mut Vec<(u8, u64)>| match what {
            Timed::Record { value: (_, v), time } => {
                if state.get().is_none() {
                    state.set_timer(time + ms(1000));
                }
                state.update(state.get().copied().unwrap_or(0) + v);
            }
            Timed::Timer { .. } => {
                out.push((*key, state.get().copied().unwrap_or(0)));
                state.remove();
            }
        },
    );
    let processed = processed.name("sum-for-a-second");
    let (output, late) = (Arc::new(Mutex::new(BTreeMap::new())), Late::default());
    sink(&processed.output(), &output);
    sink(&processed.late(), &late);
    let mut graph = builder.build().unwrap();
    let batches: Vec<Vec<Rec>> = vec![
        vec![(1, (0, 1)), (2, (400, 10))],
        vec![(1, (900, 2)), (1, (999, 4))],
        vec![(1, (1000, 8))],
        vec![(1, (500, 16)), (2, (1400, 20))],
    ];
    for (index, records) in batches.into_iter().enumerate() {
        queue.push(records);
        graph.run_batch(t(index as i64 + 1), BatchId(index as u64 + 1)).unwrap();
    }
    let emitted: Vec<(Time, (u8, u64))> = all(&output);
    // Key 1's timer at 1000 fires in batch 3; key 2's at 1400 in batch 4.
    // Key 1's record at 1000 came before its timer fired: it is in the sum,
    // and opens nothing new (the state existed when it came).
    assert_eq!(emitted, vec![(t(3), (1, 15)), (t(4), (2, 30))]);
    assert_eq!(all(&late), vec![(t(4), (1, (500, 16)))]);
}

#[test]
fn a_changed_window_shape_cannot_reuse_the_state_and_the_error_says_so() {
    let (results, late) = (Results::default(), Late::default());
    let zero = Watermarks::bounded_out_of_orderness(Duration::ZERO);
    let mut s = summed(EventWindows::tumbling(ms(1000)), zero, &results, &late);
    run_batches(&mut s, &[vec![vec![(1, (100, 1))]]]);
    let (descriptor, state) = (s.graph.descriptor(), s.graph.snapshot_state().unwrap());
    // A longer allowed lateness keeps the same state.
    let lenient = EventWindows::tumbling(ms(1000)).allowed_lateness(ms(500));
    let mut same = summed(lenient, zero, &results, &late);
    assert_eq!(same.graph.restore(&descriptor, state.clone(), &RestorePolicy::strict()).unwrap().resumed, ["sums"]);
    let mut changed = summed(EventWindows::sliding(ms(2000), ms(1000)), zero, &results, &late);
    let err = changed.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap_err();
    assert!(matches!(err, DStreamError::IncompatibleState { .. }));
    assert!(
        err.to_string().contains("event-time windows changed from tumbling 1000 ms to sliding 2000 ms by 1000 ms"),
        "{err}"
    );
}

#[test]
fn a_window_longer_slide_than_size_is_refused_when_the_graph_is_built() {
    let builder = GraphBuilder::new(INTERVAL).checkpointing(true);
    let queue = Arc::new(QueueSource::<Rec>::new());
    let windowed = builder.input("events", queue).reduce_by_event_time(
        event_time,
        Watermarks::bounded_out_of_orderness(Duration::ZERO),
        EventWindows::sliding(ms(1000), ms(2000)),
        |a, b| (a.0.max(b.0), a.1 + b.1),
    );
    windowed.results().foreach_batch(|_, _| Ok(()));
    let err = builder.build().unwrap_err().to_string();
    assert!(err.contains("slide (2000 ms) is longer than the window (1000 ms)"), "{err}");
}

// ---------------------------------------------------------------------------
// The same events, batched at random, with crashes: the same windows.

const BOUND: i64 = 300;

/// Per partition, records whose times are at most BOUND behind any earlier
/// record of the partition.
fn partitions() -> impl Strategy<Value = Vec<Vec<Rec>>> {
    let record = (0u8..6, 0i64..400, 0i64..=BOUND, 1u64..10);
    prop::collection::vec(prop::collection::vec(record, 1..60), 1..4).prop_map(|parts| {
        parts
            .into_iter()
            .map(|records| {
                let mut clock = 0;
                records
                    .into_iter()
                    .map(|(key, step, behind, value)| {
                        clock += step;
                        (key, ((clock - behind).max(0), value))
                    })
                    .collect()
            })
            .collect()
    })
}

/// Cuts each partition's records into batches: batch `b` takes `cuts[b][p]`
/// more records of partition `p` (the last batch takes what is left).
fn batched(parts: &[Vec<Rec>], cuts: &[Vec<usize>]) -> Vec<Vec<Vec<Rec>>> {
    let mut next = vec![0usize; parts.len()];
    let mut batches = Vec::new();
    for cut in cuts.iter().map(Some).chain(std::iter::once(None)) {
        let batch: Vec<Vec<Rec>> = parts
            .iter()
            .enumerate()
            .map(|(p, records)| {
                let take = cut.map_or(records.len(), |c| c.get(p).copied().unwrap_or(0));
                let end = (next[p] + take).min(records.len());
                let slice = records[next[p]..end].to_vec();
                next[p] = end;
                slice
            })
            .collect();
        batches.push(batch);
    }
    batches
}

/// The windows complete at the end of the whole input, computed from it.
fn reference(parts: &[Vec<Rec>], windows: &Shape) -> BTreeSet<WindowResult<u8, u64>> {
    let watermark =
        parts.iter().map(|r| r.iter().map(|(_, (ts, _))| *ts).max().unwrap_or(0)).min().unwrap_or(0) - BOUND;
    let records: Vec<Rec> = parts.iter().flatten().copied().collect();
    let mut out = BTreeSet::new();
    match *windows {
        Shape::Sliding(size, slide) => {
            let mut sums: BTreeMap<(u8, i64), u64> = BTreeMap::new();
            for (key, (ts, value)) in &records {
                let mut start = ts.div_euclid(slide) * slide;
                while start + size > *ts {
                    *sums.entry((*key, start)).or_default() += value;
                    start -= slide;
                }
            }
            for ((key, start), value) in sums {
                if start + size <= watermark {
                    out.insert(result(key, start, start + size, value, 0));
                }
            }
        }
        Shape::Session(gap) => {
            let mut by_key: BTreeMap<u8, Vec<(i64, u64)>> = BTreeMap::new();
            for (key, value) in &records {
                by_key.entry(*key).or_default().push(*value);
            }
            for (key, mut values) in by_key {
                values.sort();
                let mut sessions: Vec<(i64, i64, u64)> = Vec::new();
                for (ts, value) in values {
                    match sessions.last_mut() {
                        Some(last) if ts < last.1 => {
                            last.1 = last.1.max(ts + gap);
                            last.2 += value;
                        }
                        _ => sessions.push((ts, ts + gap, value)),
                    }
                }
                for (start, end, value) in sessions.into_iter().filter(|s| s.1 <= watermark) {
                    out.insert(result(key, start, end, value, 0));
                }
            }
        }
    }
    out
}

#[derive(Clone, Debug)]
enum Shape {
    Sliding(i64, i64),
    Session(i64),
}

impl Shape {
    fn windows(&self) -> EventWindows {
        match *self {
            Shape::Sliding(size, slide) => EventWindows::sliding(ms(size as u64), ms(slide as u64)),
            Shape::Session(gap) => EventWindows::session(ms(gap as u64)),
        }
    }
}

fn shapes() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (1i64..6).prop_map(|n| Shape::Sliding(n * 200, n * 200)),
        (1i64..4, 1i64..4).prop_map(|(k, slide)| Shape::Sliding(slide * 100 * k, slide * 100)),
        (50i64..600).prop_map(Shape::Session),
    ]
}

/// The batch a checkpoint was taken after, the graph's descriptor and state.
type Checkpoint = (usize, spate_dstream::GraphDescriptor, Vec<(String, Vec<u8>)>);

/// Runs `batches`, checkpointing after the batches in `checkpoints` and
/// crashing after those in `crashes`: a crash rebuilds the graph from the
/// last checkpoint and runs the batches after it again.
fn run_with_crashes(
    shape: &Shape,
    batches: &[Vec<Vec<Rec>>],
    checkpoints: &BTreeSet<usize>,
    crashes: &BTreeSet<usize>,
) -> (Results, Late) {
    let (results, late) = (Results::default(), Late::default());
    let watermarks = Watermarks::bounded_out_of_orderness(ms(BOUND as u64));
    let mut s = summed(shape.windows(), watermarks, &results, &late);
    let mut checkpoint: Option<Checkpoint> = None;
    let mut crashed = BTreeSet::new();
    let mut index = 0;
    while index < batches.len() {
        s.queue.push_partitions(batches[index].clone());
        let batch = index as i64 + 1;
        s.graph.run_batch(t(batch), BatchId(batch as u64)).unwrap();
        if checkpoints.contains(&index) {
            checkpoint = Some((index, s.graph.descriptor(), s.graph.snapshot_state().unwrap()));
        }
        if crashes.contains(&index) && crashed.insert(index) {
            s = summed(shape.windows(), watermarks, &results, &late);
            index = match &checkpoint {
                Some((at, descriptor, state)) => {
                    s.graph.restore(descriptor, state.clone(), &RestorePolicy::strict()).unwrap();
                    s.graph.resume_after(t(*at as i64 + 1));
                    at + 1
                }
                None => 0,
            };
            continue;
        }
        index += 1;
    }
    (results, late)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn windows_do_not_depend_on_batching_or_crashes(
        parts in partitions(),
        shape in shapes(),
        cuts in prop::collection::vec(prop::collection::vec(0usize..8, 3), 0..20),
        checkpoints in prop::collection::btree_set(0usize..24, 0..6),
        crashes in prop::collection::btree_set(0usize..24, 0..4),
    ) {
        let batches = batched(&parts, &cuts);
        let (results, late) = run_with_crashes(&shape, &batches, &checkpoints, &crashes);
        let emitted: Vec<WindowResult<u8, u64>> = all(&results).into_iter().map(|(_, r)| r).collect();
        let unique: BTreeSet<WindowResult<u8, u64>> = emitted.iter().cloned().collect();
        prop_assert_eq!(unique.len(), emitted.len(), "a window was emitted twice");
        prop_assert_eq!(unique, reference(&parts, &shape));
        prop_assert!(all(&late).is_empty());
    }
}
