//! Restarting from a checkpoint with new code: each change resumes or fails
//! exactly as described, and the checkpoint holds data only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{Collected, INTERVAL, collect, run, sorted_at, t};
use spate_core::{Duration, FrameCodec};
use spate_dstream::{DStreamError, Graph, GraphBuilder, GraphDescriptor, QueueSource, RestorePolicy};

/// The variations of the pipeline a new release might bring.
#[derive(Clone, Copy, Default)]
struct Variant {
    extra_output: bool,
    extra_stateful: bool,
    without_totals: bool,
    window_secs: u64,
    signed_totals: bool,
}

struct Pipeline {
    graph: Graph,
    queue: Arc<QueueSource<(String, u64)>>,
    windowed: Collected<(String, u64)>,
    totals: Option<Collected<(String, u64)>>,
}

fn pipeline(v: Variant) -> Pipeline {
    let b = GraphBuilder::new(INTERVAL).partitions(2).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let words = b.input("words", Arc::clone(&queue));
    let window = Duration::from_secs(if v.window_secs == 0 { 4 } else { v.window_secs });
    let windowed_stream =
        words.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, window, INTERVAL).name("windowed-counts");
    let windowed = collect(&windowed_stream);
    if v.extra_output {
        windowed_stream.print(3);
    }
    let totals = if v.without_totals {
        None
    } else if v.signed_totals {
        let signed = words.update_state_by_key(|vs: Vec<u64>, st: Option<i64>| Some(st.unwrap_or(0) + vs.len() as i64));
        collect(&signed.name("totals"));
        None
    } else {
        let totals =
            words.update_state_by_key(|vs: Vec<u64>, st: Option<u64>| Some(st.unwrap_or(0) + vs.iter().sum::<u64>()));
        Some(collect(&totals.name("totals")))
    };
    if v.extra_stateful {
        let firsts = words.map_with_state(
            |_w: &String, _v: Option<u64>, s: &mut spate_dstream::State<bool>| {
                let first = !s.exists();
                s.update(true);
                first
            },
            None,
        );
        collect(&firsts.name("first-seen").mapped());
    }
    Pipeline { graph: b.build().unwrap(), queue, windowed, totals }
}

fn feed(p: &Pipeline, batches: std::ops::RangeInclusive<i64>) {
    for i in batches {
        p.queue.push(vec![(format!("w{}", i % 3), 1), ("all".to_string(), i as u64)]);
    }
}

/// Runs batches 1..=5, then checkpoints: the descriptor goes through bytes,
/// as the runtime writes it to `<checkpoint>/graph`.
fn checkpoint_after_five() -> (GraphDescriptor, Vec<(String, Vec<u8>)>) {
    let mut old = pipeline(Variant::default());
    feed(&old, 1..=5);
    run(&mut old.graph, 1..=5);
    let codec = FrameCodec::new(1);
    let bytes = codec.encode(&old.graph.descriptor()).unwrap();
    let descriptor: GraphDescriptor = codec.decode(&bytes).unwrap().value;
    (descriptor, old.graph.snapshot_state().unwrap())
}

fn uninterrupted() -> Pipeline {
    let mut p = pipeline(Variant::default());
    feed(&p, 1..=8);
    run(&mut p.graph, 1..=8);
    p
}

#[test]
fn unchanged_graph_resumes_as_if_never_stopped() {
    let (descriptor, state) = checkpoint_after_five();
    let mut new = pipeline(Variant::default());
    let report = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
    assert_eq!(report.resumed, vec!["windowed-counts".to_string(), "totals".to_string()]);
    assert!(report.started_empty.is_empty() && report.dropped.is_empty());
    feed(&new, 6..=8);
    run(&mut new.graph, 6..=8);
    let reference = uninterrupted();
    for b in 6..=8 {
        assert_eq!(sorted_at(&new.windowed, t(b)), sorted_at(&reference.windowed, t(b)), "window at {b}");
        let (ours, theirs) = (new.totals.as_ref().unwrap(), reference.totals.as_ref().unwrap());
        assert_eq!(sorted_at(ours, t(b)), sorted_at(theirs, t(b)), "totals at {b}");
    }
    // The window still held batches 2..=5, so the first window after the restart is complete.
    assert_eq!(sorted_at(&new.windowed, t(6)).unwrap().iter().find(|(w, _)| w == "all").unwrap().1, 3 + 4 + 5 + 6);
}

#[test]
fn an_added_output_resumes() {
    let (descriptor, state) = checkpoint_after_five();
    let mut new = pipeline(Variant { extra_output: true, ..Variant::default() });
    let report = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
    assert_eq!(report.resumed.len(), 2);
    feed(&new, 6..=6);
    run(&mut new.graph, 6..=6);
    assert_eq!(sorted_at(&new.windowed, t(6)), sorted_at(&uninterrupted().windowed, t(6)));
}

#[test]
fn an_added_stateful_operator_starts_empty() {
    let (descriptor, state) = checkpoint_after_five();
    let mut new = pipeline(Variant { extra_stateful: true, ..Variant::default() });
    let report = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
    assert_eq!(report.started_empty, vec!["first-seen".to_string()]);
    assert_eq!(report.resumed, vec!["windowed-counts".to_string(), "totals".to_string()]);
}

#[test]
fn a_removed_stateful_operator_is_an_error_unless_dropping_is_allowed() {
    let (descriptor, state) = checkpoint_after_five();
    let mut new = pipeline(Variant { without_totals: true, ..Variant::default() });
    let err = new.graph.restore(&descriptor, state.clone(), &RestorePolicy::strict()).unwrap_err();
    assert!(matches!(&err, DStreamError::RemovedOperators { operators } if operators == &["totals"]), "{err}");
    assert!(err.to_string().contains("totals"));

    let report = new.graph.restore(&descriptor, state.clone(), &RestorePolicy::allow_dropping(["totals"])).unwrap();
    assert_eq!(report.dropped, vec!["totals".to_string()]);
    assert_eq!(report.resumed, vec!["windowed-counts".to_string()]);
    let mut other = pipeline(Variant { without_totals: true, ..Variant::default() });
    assert!(other.graph.restore(&descriptor, state, &RestorePolicy::allow_dropping_removed()).is_ok());
}

#[test]
fn a_changed_window_is_an_error_that_says_what_changed() {
    let (descriptor, state) = checkpoint_after_five();
    let mut new = pipeline(Variant { window_secs: 6, ..Variant::default() });
    let err = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap_err();
    match &err {
        DStreamError::IncompatibleState { differences } => {
            assert_eq!(
                differences,
                &["operator `windowed-counts`: window changed from 4000 ms to 6000 ms".to_string()]
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_changed_state_type_is_an_error_that_says_what_changed() {
    let (descriptor, state) = checkpoint_after_five();
    let mut new = pipeline(Variant { signed_totals: true, ..Variant::default() });
    let err = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap_err().to_string();
    assert!(err.contains("operator `totals`: state type changed from u64 to i64"), "{err}");
}

#[test]
fn damaged_state_is_an_error_naming_the_operator_and_restores_nothing_silently() {
    let (descriptor, mut state) = checkpoint_after_five();
    let totals = state.iter_mut().find(|(name, _)| name == "totals").unwrap();
    let last = totals.1.len() - 1;
    totals.1[last] ^= 0xff;
    let mut new = pipeline(Variant::default());
    let err = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap_err();
    assert!(matches!(&err, DStreamError::StateDecode { operator, .. } if operator == "totals"), "{err}");
}

#[test]
fn missing_state_for_a_described_operator_is_an_error() {
    let (descriptor, mut state) = checkpoint_after_five();
    state.retain(|(name, _)| name != "totals");
    let mut new = pipeline(Variant::default());
    let err = new.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap_err();
    assert!(matches!(&err, DStreamError::MissingState { operator } if operator == "totals"), "{err}");
}

#[test]
fn descriptor_records_names_kinds_types_and_windows() {
    let p = pipeline(Variant::default());
    let descriptor = p.graph.descriptor();
    assert_eq!(descriptor.batch_interval_ms, 1000);
    let window = descriptor.operators.iter().find(|op| op.name == "windowed-counts").unwrap();
    assert_eq!(window.kind, "reduce_by_key_and_window_inv");
    assert_eq!(window.key_type.as_deref(), Some(std::any::type_name::<String>()));
    assert_eq!(window.value_type.as_deref(), Some("u64"));
    assert_eq!((window.window_ms, window.slide_ms), (Some(4000), Some(1000)));
    assert_eq!(window.parents, vec!["words".to_string()]);
    let stateful: Vec<&str> = descriptor.operators.iter().filter(|op| op.stateful).map(|op| op.name.as_str()).collect();
    assert_eq!(stateful, vec!["windowed-counts", "totals"]);
}

#[test]
fn unnamed_stateful_operators_get_positional_names() {
    let b = GraphBuilder::new(INTERVAL).checkpointing(true);
    let s = b.input("in", Arc::new(QueueSource::<(u8, u8)>::new()));
    collect(&s.update_state_by_key(|v: Vec<u8>, st: Option<u8>| Some(st.unwrap_or(0).wrapping_add(v.len() as u8))));
    let mut graph = b.build().unwrap();
    assert_eq!(graph.snapshot_state().unwrap()[0].0, "update_state_by_key-1");
}

#[test]
fn an_inverse_window_snapshot_written_before_the_compact_layout_still_restores() {
    // Version 1 of the inverse window's state: pairs by key, partitions
    // merged (window end, retained times, the window's values, the slices).
    type PairsV1 = (Option<spate_core::Time>, Vec<spate_core::Time>, Vec<(String, u64)>, Vec<Vec<(String, u64)>>);
    let old: PairsV1 = (
        Some(t(2)),
        vec![t(1), t(2)],
        vec![("a".to_string(), 3), ("b".to_string(), 5)],
        vec![vec![("a".to_string(), 1), ("b".to_string(), 5)], vec![("a".to_string(), 2)]],
    );
    let bytes = FrameCodec::new(1).encode(&old).unwrap();
    let mut p = pipeline(Variant { without_totals: true, ..Variant::default() });
    let descriptor = p.graph.descriptor();
    p.graph.restore(&descriptor, vec![("windowed-counts".to_string(), bytes)], &RestorePolicy::strict()).unwrap();
    p.queue.push(vec![("a".to_string(), 4)]);
    run(&mut p.graph, 3..=6);
    let at = |batch| sorted_at(&p.windowed, t(batch)).unwrap();
    assert_eq!(at(3), [("a".to_string(), 7), ("b".to_string(), 5)]);
    assert_eq!(at(5), [("a".to_string(), 6), ("b".to_string(), 0)], "batch 1 left the 4 s window at 5");
    assert_eq!(at(6), [("a".to_string(), 4), ("b".to_string(), 0)], "batch 2 left at 6");
}

#[test]
fn a_pane_window_snapshot_written_before_the_compact_layout_still_restores() {
    // Version 1 of the pane window's state, as it stood after batch 3 of a
    // 4 s window sliding by 2 s (panes of 2 s): the panes' end times (front
    // stack, back stack), then pairs by key with partitions merged: the open
    // pane, the front stack's aggregates, the back stack's panes and their
    // aggregate.
    type Pairs = Vec<(String, u64)>;
    type PanesV1 = (Vec<spate_core::Time>, Vec<spate_core::Time>, Pairs, Vec<Pairs>, Vec<Pairs>, Pairs);
    let first_pane = vec![("a".to_string(), 1), ("b".to_string(), 5)];
    let old: PanesV1 = (vec![], vec![t(2)], vec![("a".to_string(), 2)], vec![], vec![first_pane.clone()], first_pane);
    let bytes = FrameCodec::new(1).encode(&old).unwrap();
    let b = GraphBuilder::new(INTERVAL).partitions(2).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let sums = b
        .input("words", Arc::clone(&queue))
        .reduce_by_key_and_window(|a: &u64, b: &u64| a + b, Duration::from_secs(4), Duration::from_secs(2))
        .name("pane-sums");
    let seen = collect(&sums);
    let mut graph = b.build().unwrap();
    let descriptor = graph.descriptor();
    graph.restore(&descriptor, vec![("pane-sums".to_string(), bytes)], &RestorePolicy::strict()).unwrap();
    queue.push(vec![("a".to_string(), 4)]);
    run(&mut graph, 4..=8);
    let at = |batch| sorted_at(&seen, t(batch)).unwrap();
    assert_eq!(at(4), [("a".to_string(), 7), ("b".to_string(), 5)]);
    assert_eq!(at(6), [("a".to_string(), 6)], "the pane of batches 1 and 2 left at 6");
    assert!(at(8).is_empty(), "the pane of batches 3 and 4 left at 8");
}

/// Event-time sums per key, records `(key, (event time in ms, value))`.
struct EventSums {
    graph: Graph,
    queue: Arc<QueueSource<(String, (i64, u64))>>,
    results: Collected<spate_dstream::WindowResult<String, u64>>,
}

fn event_sums(windows: spate_dstream::EventWindows, partitions: usize) -> EventSums {
    let b = GraphBuilder::new(INTERVAL).partitions(partitions).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let sums = b
        .input("events", Arc::clone(&queue))
        .aggregate_by_event_time(
            |v: &(i64, u64)| spate_core::Time::from_millis(v.0),
            spate_dstream::Watermarks::bounded_out_of_orderness(Duration::from_millis(1000)),
            windows,
            |(_, v)| v,
            |acc: &mut u64, (_, v)| *acc += v,
            |acc: &mut u64, other: &u64| *acc += other,
        )
        .name("event-sums");
    let results = collect(&sums.results());
    EventSums { graph: b.build().unwrap(), queue, results }
}

fn all_results(sums: &EventSums) -> Vec<(spate_core::Time, spate_dstream::WindowResult<String, u64>)> {
    let seen = sums.results.lock().unwrap();
    let mut out: Vec<_> = seen.iter().flat_map(|(time, rows)| rows.iter().map(|r| (*time, r.clone()))).collect();
    out.sort();
    out
}

#[test]
fn an_event_time_window_snapshot_written_before_the_compact_layout_still_restores() {
    // Version 1 of the event-time window state: the watermark tracker (one
    // partition's clock: its largest event time and last active batch; the
    // watermark), then pairs by key with partitions merged: panes (start,
    // key, aggregate), revisions (key, window start, revision), sessions.
    type Clock = (Option<spate_core::Time>, spate_core::Time);
    type Sessions = Vec<(String, Vec<()>)>;
    type StateV1 = (
        (Vec<Clock>, Option<spate_core::Time>),
        Vec<(spate_core::Time, String, u64)>,
        Vec<(String, spate_core::Time, u32)>,
        Sessions,
    );
    let ms = spate_core::Time::from_millis;
    let old: StateV1 = (
        (vec![(Some(ms(6_000)), t(1))], Some(ms(5_000))),
        vec![(ms(0), "a".to_string(), 3), (ms(0), "b".to_string(), 4)],
        vec![],
        vec![],
    );
    let bytes = FrameCodec::new(1).encode(&old).unwrap();
    let windows = spate_dstream::EventWindows::tumbling(Duration::from_secs(10));
    let mut sums = event_sums(windows, 2);
    let descriptor = sums.graph.descriptor();
    sums.graph.restore(&descriptor, vec![("event-sums".to_string(), bytes)], &RestorePolicy::strict()).unwrap();
    sums.queue.push(vec![("a".to_string(), (7_000, 1)), ("c".to_string(), (12_000, 2))]);
    sums.queue.push(vec![("c".to_string(), (22_000, 1))]);
    run(&mut sums.graph, 2..=3);
    let window = |start, end| spate_dstream::Window { start: ms(start), end: ms(end) };
    let result = |key: &str, start, value| spate_dstream::WindowResult {
        key: key.to_string(),
        window: window(start, start + 10_000),
        value,
        revision: 0,
    };
    assert_eq!(
        all_results(&sums),
        [(t(2), result("a", 0, 4)), (t(2), result("b", 0, 4)), (t(3), result("c", 10_000, 2))],
        "the watermark passed 10 s at batch 2 and 20 s at batch 3"
    );
}

#[test]
fn event_time_windows_restored_onto_another_partition_count_continue_exactly() {
    let windows = || {
        spate_dstream::EventWindows::sliding(Duration::from_secs(4), Duration::from_secs(2))
            .allowed_lateness(Duration::from_secs(3))
    };
    // Keys over several partitions; records late but within the lateness
    // (revisions), and records past it.
    let batch = |b: i64| -> Vec<(String, (i64, u64))> {
        (0..12i64)
            .map(|k| {
                let late = if (b + k) % 3 == 0 { 2_500 } else { 0 };
                (format!("k{}", k % 7), (b * 1_000 + k * 40 - late, (b * 10 + k) as u64))
            })
            .collect()
    };
    let mut whole = event_sums(windows(), 2);
    for b in 1..=12 {
        whole.queue.push(batch(b));
    }
    run(&mut whole.graph, 1..=12);
    for (before, after) in [(2, 3), (3, 1)] {
        let mut first = event_sums(windows(), before);
        for b in 1..=6 {
            first.queue.push(batch(b));
        }
        run(&mut first.graph, 1..=6);
        let (descriptor, state) = (first.graph.descriptor(), first.graph.snapshot_state().unwrap());
        let mut second = event_sums(windows(), after);
        second.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
        for b in 7..=12 {
            second.queue.push(batch(b));
        }
        run(&mut second.graph, 7..=12);
        let mut resumed = all_results(&first);
        resumed.extend(all_results(&second));
        resumed.sort();
        let revisions = resumed.iter().filter(|(_, r)| r.revision > 0).count();
        assert!(revisions > 0, "the records behind the watermark revised windows");
        assert_eq!(resumed, all_results(&whole), "{before} partitions, then {after}");
    }
}
