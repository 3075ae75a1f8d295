//! Watermarks aligned per upstream writer ([`DStream::with_progress`]): one
//! partition interleaves what several writers sent, each writer running its
//! own batches in its own order; whatever that order, with idle writers and
//! crashes and restores, every window equals the reference computed from
//! the whole input and nothing is late. Also: a record stamped far in the
//! future never moves the watermark.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use common::{INTERVAL, t};
use proptest::prelude::*;
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{
    DStream, EventWindows, Graph, GraphBuilder, ProgressMark, QueueSource, RestorePolicy, Watermarks, WindowResult,
};

/// A record: key, then (event time in ms, value).
type Rec = (u8, (i64, u64));
type Emitted = Arc<Mutex<BTreeMap<Time, Vec<WindowResult<u8, u64>>>>>;
type Late = Arc<Mutex<BTreeMap<Time, Vec<Rec>>>>;

const WINDOW_MS: i64 = 100;

/// Records every batch a stream emits, by batch time (a re-run replaces).
fn sink<T: spate_dstream::Data>(stream: &DStream<T>, into: &Arc<Mutex<BTreeMap<Time, Vec<T>>>>) {
    let into = Arc::clone(into);
    stream.foreach_batch(move |batch, info| {
        into.lock().unwrap().insert(info.time, batch.iter().cloned().collect());
        Ok(())
    });
}

/// A graph counting values per key in tumbling windows, its watermark
/// taken from the writers' marks.
struct Aligned {
    graph: Graph,
    records: Arc<QueueSource<Rec>>,
    marks: Arc<QueueSource<ProgressMark>>,
}

fn aligned(watermarks: Watermarks, emitted: &Emitted, late: &Late) -> Aligned {
    let builder = GraphBuilder::new(INTERVAL).partitions(2).workers(2).checkpointing(true);
    let (records, marks) = (Arc::new(QueueSource::new()), Arc::new(QueueSource::new()));
    let mark_stream = builder.input("marks", Arc::clone(&marks));
    let windowed = builder
        .input("records", Arc::clone(&records))
        .map_values(|v: (i64, u64)| v)
        .with_progress(&mark_stream)
        .aggregate_by_event_time(
            |v: &(i64, u64)| Time::from_millis(v.0),
            watermarks,
            EventWindows::tumbling(Duration::from_millis(WINDOW_MS as u64)),
            |(_, v)| v,
            |acc: &mut u64, (_, v)| *acc += v,
            |acc: &mut u64, other: &u64| *acc += other,
        )
        .name("sums");
    sink(&windowed.results(), emitted);
    sink(&windowed.late(), late);
    Aligned { graph: builder.build().unwrap(), records, marks }
}

/// One batch of one writer: its records and the mark that ends it.
#[derive(Clone, Debug)]
struct WriterBatch {
    records: Vec<Rec>,
    mark: ProgressMark,
}

fn mark(writer: u32, writers: u32, max: Option<i64>, idle: bool) -> ProgressMark {
    ProgressMark { group: "split".into(), writer, writers, max_event_time: max.map(Time::from_millis), idle }
}

/// Each writer's records in event-time order (its input is in order), after
/// `idle_first` idle marks (its input was empty until then), cut into its
/// batches, then one idle mark once its input is done.
fn writer_batches(writer: u32, writers: u32, idle_first: usize, records: &[Rec], cuts: &[usize]) -> Vec<WriterBatch> {
    let idle = || WriterBatch { records: Vec::new(), mark: mark(writer, writers, None, true) };
    let mut out: Vec<WriterBatch> = (0..idle_first).map(|_| idle()).collect();
    let mut rest = records;
    for cut in cuts.iter().copied().chain(std::iter::repeat(4)) {
        if rest.is_empty() {
            break;
        }
        let (batch, later) = rest.split_at(cut.clamp(1, rest.len()));
        let max = batch.iter().map(|(_, (ts, _))| *ts).max();
        out.push(WriterBatch { records: batch.to_vec(), mark: mark(writer, writers, max, false) });
        rest = later;
    }
    out.push(idle());
    out
}

/// Interleaves the writers' batches in the order `picks` draws writers,
/// each writer's batches staying in its own order.
fn interleave(mut per_writer: Vec<Vec<WriterBatch>>, picks: &[usize]) -> Vec<WriterBatch> {
    for batches in &mut per_writer {
        batches.reverse();
    }
    let mut out = Vec::new();
    for pick in picks {
        let count = per_writer.len();
        if let Some(next) = per_writer[pick % count].pop() {
            out.push(next);
        }
    }
    for mut batches in per_writer {
        while let Some(next) = batches.pop() {
            out.push(next);
        }
    }
    out
}

/// Cuts the interleaved writer batches into the reader's batches.
fn reader_batches(log: Vec<WriterBatch>, cuts: &[usize]) -> Vec<Vec<WriterBatch>> {
    let mut out = Vec::new();
    let mut rest = log.into_iter().peekable();
    for cut in cuts.iter().copied().chain(std::iter::repeat(3)) {
        if rest.peek().is_none() {
            break;
        }
        out.push(rest.by_ref().take(cut).collect());
    }
    out
}

/// The batch a checkpoint was taken after, the graph's descriptor and state.
type Checkpoint = (usize, spate_dstream::GraphDescriptor, Vec<(String, Vec<u8>)>);

/// Runs the reader's batches, checkpointing after `checkpoints` and
/// crashing after `crashes` (the graph rebuilt from the last checkpoint and
/// the batches after it run again).
fn run(
    batches: &[Vec<WriterBatch>],
    checkpoints: &BTreeSet<usize>,
    crashes: &BTreeSet<usize>,
    bound: Duration,
) -> (Emitted, Late) {
    let (emitted, late) = (Emitted::default(), Late::default());
    let watermarks = Watermarks::bounded_out_of_orderness(bound);
    let mut a = aligned(watermarks, &emitted, &late);
    let mut checkpoint: Option<Checkpoint> = None;
    let mut crashed = BTreeSet::new();
    let mut index = 0;
    while index < batches.len() {
        a.records.push(batches[index].iter().flat_map(|b| b.records.clone()).collect());
        a.marks.push(batches[index].iter().map(|b| b.mark.clone()).collect());
        let batch = index as i64 + 1;
        a.graph.run_batch(t(batch), BatchId(batch as u64)).unwrap();
        if checkpoints.contains(&index) {
            checkpoint = Some((index, a.graph.descriptor(), a.graph.snapshot_state().unwrap()));
        }
        if crashes.contains(&index) && crashed.insert(index) {
            a = aligned(watermarks, &emitted, &late);
            index = match &checkpoint {
                Some((at, descriptor, state)) => {
                    a.graph.restore(descriptor, state.clone(), &RestorePolicy::strict()).unwrap();
                    a.graph.resume_after(t(*at as i64 + 1));
                    at + 1
                }
                None => 0,
            };
            continue;
        }
        index += 1;
    }
    (emitted, late)
}

/// Every window the whole input fills that ends at or before `watermark`.
fn reference(records: &[Rec], watermark: i64) -> BTreeSet<WindowResult<u8, u64>> {
    let mut sums: BTreeMap<(u8, i64), u64> = BTreeMap::new();
    for (key, (ts, v)) in records {
        *sums.entry((*key, ts.div_euclid(WINDOW_MS) * WINDOW_MS)).or_default() += v;
    }
    sums.into_iter()
        .filter(|((_, start), _)| start + WINDOW_MS <= watermark)
        .map(|((key, start), value)| {
            let window =
                spate_dstream::Window { start: Time::from_millis(start), end: Time::from_millis(start + WINDOW_MS) };
            WindowResult { key, window, value, revision: 0 }
        })
        .collect()
}

fn everything(emitted: &Emitted) -> Vec<WindowResult<u8, u64>> {
    emitted.lock().unwrap().values().flatten().cloned().collect()
}

/// One writer's records: keys and steps of event time, in time order.
fn writer_records() -> impl Strategy<Value = Vec<Rec>> {
    prop::collection::vec((0u8..4, 0i64..60, 1u64..4), 0..24).prop_map(|steps| {
        let mut ts = 0;
        steps
            .into_iter()
            .map(|(key, step, v)| {
                ts += step;
                (key, (ts, v))
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn windows_are_exact_whatever_order_the_writers_progress_in(
        writers in prop::collection::vec((0usize..3, writer_records(), prop::collection::vec(1usize..6, 0..8)), 2..5),
        picks in prop::collection::vec(0usize..8, 0..40),
        reader_cuts in prop::collection::vec(0usize..5, 0..30),
        checkpoints in prop::collection::btree_set(0usize..30, 0..6),
        crashes in prop::collection::btree_set(0usize..30, 0..4),
    ) {
        let count = writers.len() as u32;
        let per_writer: Vec<Vec<WriterBatch>> = writers
            .iter()
            .enumerate()
            .map(|(w, (idle_first, records, cuts))| writer_batches(w as u32, count, *idle_first, records, cuts))
            .collect();
        let batches = reader_batches(interleave(per_writer, &picks), &reader_cuts);
        let (emitted, late) = run(&batches, &checkpoints, &crashes, Duration::ZERO);
        let all: Vec<Rec> = writers.iter().flat_map(|(_, records, _)| records.clone()).collect();
        // Every writer ends idle, holding the watermark at its last record:
        // it reaches the slowest writer's last record (a writer that sent
        // nothing holds it back entirely).
        let slowest = writers
            .iter()
            .map(|(_, records, _)| records.iter().map(|(_, (ts, _))| *ts).max().unwrap_or(i64::MIN))
            .min()
            .unwrap_or(i64::MIN);
        let emitted = everything(&emitted);
        let unique: BTreeSet<WindowResult<u8, u64>> = emitted.iter().cloned().collect();
        prop_assert_eq!(unique.len(), emitted.len(), "a window was emitted twice");
        prop_assert_eq!(unique, reference(&all, slowest));
        let late: Vec<Rec> = late.lock().unwrap().values().flatten().cloned().collect();
        prop_assert!(late.is_empty(), "late: {:?}", late);
    }
}

#[test]
fn a_writer_that_has_not_reported_holds_every_window_back() {
    let (emitted, late) = (Emitted::default(), Late::default());
    let mut a = aligned(Watermarks::bounded_out_of_orderness(Duration::ZERO), &emitted, &late);
    // Writer 0 runs far ahead; writer 1 has not reported yet.
    a.records.push(vec![(1, (5_000, 1))]);
    a.marks.push(vec![mark(0, 2, Some(5_000), false)]);
    a.graph.run_batch(t(1), BatchId(1)).unwrap();
    assert!(everything(&emitted).is_empty());
    // Writer 1's old records are on time, not late.
    a.records.push(vec![(1, (50, 1)), (1, (6_000, 1))]);
    a.marks.push(vec![mark(1, 2, Some(6_000), false), mark(1, 2, None, true)]);
    a.graph.run_batch(t(2), BatchId(2)).unwrap();
    assert!(late.lock().unwrap().values().all(Vec::is_empty));
    assert_eq!(
        everything(&emitted),
        reference(&[(1, (50, 1)), (1, (5_000, 1)), (1, (6_000, 1))], 5_000).into_iter().collect::<Vec<_>>()
    );
}

#[test]
fn a_record_stamped_far_in_the_future_goes_to_the_late_records_and_never_moves_the_watermark() {
    let (emitted, late) = (Emitted::default(), Late::default());
    let builder = GraphBuilder::new(INTERVAL).partitions(1).checkpointing(true);
    let records = Arc::new(QueueSource::<Rec>::new());
    let windowed = builder
        .input("records", Arc::clone(&records))
        .aggregate_by_event_time(
            |v: &(i64, u64)| Time::from_millis(v.0),
            Watermarks::bounded_out_of_orderness(Duration::ZERO).with_max_future(Duration::from_millis(60_000)),
            EventWindows::tumbling(Duration::from_millis(WINDOW_MS as u64)),
            |(_, v)| v,
            |acc: &mut u64, (_, v)| *acc += v,
            |acc: &mut u64, other: &u64| *acc += other,
        )
        .name("sums");
    sink(&windowed.results(), &emitted);
    sink(&windowed.late(), &late);
    let mut graph = builder.build().unwrap();
    // 2100-01-01: far past the batch time plus one minute.
    let year_2100 = 4_102_444_800_000;
    records.push(vec![(1, (10, 1)), (2, (year_2100, 1)), (1, (120, 1))]);
    graph.run_batch(t(1), BatchId(1)).unwrap();
    assert_eq!(graph.late_records(), 1);
    records.push(vec![(1, (150, 1)), (1, (250, 1))]);
    graph.run_batch(t(2), BatchId(2)).unwrap();
    assert_eq!(graph.late_records(), 0, "the records after it are on time");
    let late: Vec<Rec> = late.lock().unwrap().values().flatten().cloned().collect();
    assert_eq!(late, vec![(2, (year_2100, 1))]);
    let all = [(1, (10, 1)), (1, (120, 1)), (1, (150, 1)), (1, (250, 1))];
    assert_eq!(everything(&emitted).into_iter().collect::<BTreeSet<_>>(), reference(&all, 250));
}
