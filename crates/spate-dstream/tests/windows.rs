//! Windowed results equal a naive recomputation, for random streams, window
//! and slide combinations, and both incremental strategies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{Collected, INTERVAL, collect, run, sorted_at, streamed_changes, streamed_whole, t};
use proptest::prelude::*;
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{Graph, GraphBuilder, MemorySpillStore, QueueSource, RestorePolicy, StateSnapshot, StateSpill};

type Input = Vec<Vec<Vec<(u8, i64)>>>;

/// The plain window's checkpointed state: retained batches by time.
type Retained = std::collections::VecDeque<(Time, Vec<Vec<(u8, i64)>>)>;

/// Random batches of (key, positive value) records in a few partitions.
fn stream() -> impl Strategy<Value = Input> {
    prop::collection::vec(prop::collection::vec(prop::collection::vec((0u8..12, 1i64..20), 0..12), 1..3), 1..40)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The records of batches with times in `(time - length, time]`.
fn in_window(input: &Input, time: i64, length: i64) -> Vec<(u8, i64)> {
    (1..=input.len() as i64)
        .filter(|b| *b > time - length && *b <= time)
        .flat_map(|b| input[(b - 1) as usize].iter().flatten().copied())
        .collect()
}

fn naive_by_key(records: &[(u8, i64)], f: impl Fn(i64, i64) -> i64) -> Vec<(u8, i64)> {
    let mut map: BTreeMap<u8, i64> = BTreeMap::new();
    for (k, v) in records {
        let merged = map.get(k).map_or(*v, |old| f(*old, *v));
        map.insert(*k, merged);
    }
    map.into_iter().collect()
}

struct Windows {
    graph: Graph,
    queue: Arc<QueueSource<(u8, i64)>>,
    plain: Collected<(u8, i64)>,
    pane_sum: Collected<(u8, i64)>,
    pane_max: Collected<(u8, i64)>,
    inv_sum: Collected<(u8, i64)>,
    inv_filtered: Collected<(u8, i64)>,
    /// The inverse window after a `reduce_by_key`, whose batches it takes as they are.
    inv_reduced: Collected<(u8, i64)>,
    /// An inverse window whose filter drops keys while slices still name
    /// them, so what it drops changes its later counts (as in Spark).
    inv_dropping: Collected<(u8, i64)>,
    /// The three greatest sums of an inverse window and of a pane window
    /// that `top_n` alone reads, so that each window lists only each
    /// partition's greatest.
    inv_top: Collected<(u8, i64)>,
    pane_top: Collected<(u8, i64)>,
    total: Collected<i64>,
    counted: Collected<u64>,
    /// The store the inverse windows' slices go to beyond their budget, and the budget.
    spill: Option<(Arc<MemorySpillStore>, u64)>,
}

fn build(length: u64, slide: u64, partitions: usize) -> Windows {
    build_spilling(length, slide, partitions, None)
}

/// Budgets for the slices of the inverse windows: none, 0 (every slice to
/// disk) or a few slices' worth.
fn spill_budgets() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), Just(Some(0)), (1u64..2048).prop_map(Some)]
}

/// [`build`] whose state beyond `spill_budget` bytes moves to an
/// in-memory spill store.
fn build_spilling(length: u64, slide: u64, partitions: usize, spill_budget: Option<u64>) -> Windows {
    let b = GraphBuilder::new(INTERVAL).partitions(partitions).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::<(u8, i64)>::new());
    let s = b.input("records", Arc::clone(&queue));
    let (l, sl) = (secs(length), secs(slide));
    let plain = collect(&s.window(l, sl).name("plain"));
    let pane_sum = collect(&s.reduce_by_key_and_window(|a, b| a + b, l, sl).name("pane-sum"));
    let pane_max = collect(&s.reduce_by_key_and_window(|a, b| *a.max(b), l, sl).name("pane-max"));
    let inv_sum = collect(&s.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, l, sl).name("inv-sum"));
    let inv_filtered = collect(
        &s.reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a - b, l, sl, |_, v| *v != 0)
            .name("inv-filtered"),
    );
    let inv_reduced = collect(
        &s.reduce_by_key(|a, b| a + b)
            .reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a - b, l, sl, |_, v| *v != 0)
            .name("inv-reduced"),
    );
    let inv_dropping = collect(
        &s.reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a - b, l, sl, |_, v| *v % 2 == 0)
            .name("inv-dropping"),
    );
    let inv_top = collect(
        &s.reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a - b, l, sl, |_, v| *v != 0)
            .name("inv-top")
            .top_n(3, by_sum),
    );
    let pane_top = collect(&s.reduce_by_key_and_window(|a, b| a + b, l, sl).name("pane-top").top_n(3, by_sum));
    let total = collect(&s.map(|(_, v)| v).reduce_by_window(|a, b| a + b, l, sl).name("total"));
    let counted = collect(&s.count_by_window(l, sl).name("counted"));
    let mut graph = b.build().unwrap();
    let spill = spill_budget.map(|budget| {
        let store = Arc::new(MemorySpillStore::new());
        graph.spill_state(&StateSpill::new(Arc::clone(&store) as _, budget));
        (store, budget)
    });
    Windows {
        graph,
        spill,
        queue,
        plain,
        pane_sum,
        pane_max,
        inv_sum,
        inv_filtered,
        inv_reduced,
        inv_dropping,
        inv_top,
        pane_top,
        total,
        counted,
    }
}

/// Greater sums first, then lower keys: a total order.
fn by_sum(a: &(u8, i64), b: &(u8, i64)) -> std::cmp::Ordering {
    a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))
}

fn check(w: &Windows, input: &Input, length: i64, slide: i64) -> Result<(), TestCaseError> {
    let slide_times: Vec<Time> = (1..=input.len() as i64).filter(|b| b % slide == 0).map(t).collect();
    prop_assert_eq!(w.pane_sum.lock().unwrap().keys().copied().collect::<Vec<_>>(), slide_times.clone());
    prop_assert_eq!(w.inv_sum.lock().unwrap().keys().copied().collect::<Vec<_>>(), slide_times.clone());
    for time in slide_times {
        let b = time.as_millis() / 1000;
        let records = in_window(input, b, length);
        let mut plain = records.clone();
        plain.sort();
        prop_assert_eq!(sorted_at(&w.plain, time).unwrap(), plain, "window at {}", b);
        let sums = naive_by_key(&records, |a, b| a + b);
        prop_assert_eq!(sorted_at(&w.pane_sum, time).unwrap(), sums.clone(), "pane sum at {}", b);
        prop_assert_eq!(sorted_at(&w.pane_max, time).unwrap(), naive_by_key(&records, i64::max), "pane max at {}", b);
        prop_assert_eq!(sorted_at(&w.inv_filtered, time).unwrap(), sums.clone(), "inverse filtered at {}", b);
        prop_assert_eq!(sorted_at(&w.inv_reduced, time).unwrap(), sums.clone(), "inverse after reduce at {}", b);
        let mut top = sums.clone();
        top.sort_by(|a, b| by_sum(b, a));
        top.truncate(3);
        let ranked = |seen: &Collected<(u8, i64)>| seen.lock().unwrap().get(&time).cloned();
        prop_assert_eq!(ranked(&w.inv_top), Some(top.clone()), "top 3 of the inverse at {}", b);
        prop_assert_eq!(ranked(&w.pane_top), Some(top), "top 3 of the panes at {}", b);
        let inv: Vec<(u8, i64)> = sorted_at(&w.inv_sum, time).unwrap();
        let nonzero: Vec<(u8, i64)> = inv.iter().copied().filter(|(_, v)| *v != 0).collect();
        prop_assert_eq!(nonzero, sums, "inverse at {}", b);
        let total: i64 = records.iter().map(|(_, v)| v).sum();
        let expected_total = if records.is_empty() { vec![] } else { vec![total] };
        prop_assert_eq!(sorted_at(&w.total, time).unwrap(), expected_total, "reduce_by_window at {}", b);
        prop_assert_eq!(sorted_at(&w.counted, time).unwrap(), vec![records.len() as u64], "count_by_window at {}", b);
    }
    // With no budget at all, a window that kept any slice kept it on disk.
    if let Some((store, 0)) = &w.spill
        && input.iter().flatten().any(|part| !part.is_empty())
    {
        prop_assert!(store.tables_opened() > 0, "no window slice went to the spill store");
    }
    Ok(())
}

/// Adds what `first` emitted before the restart to what `second` emitted after it.
fn add_outputs_before_the_restart(first: &Windows, second: &Windows) {
    for (from, to) in [
        (&first.plain, &second.plain),
        (&first.pane_sum, &second.pane_sum),
        (&first.pane_max, &second.pane_max),
        (&first.inv_sum, &second.inv_sum),
        (&first.inv_filtered, &second.inv_filtered),
        (&first.inv_reduced, &second.inv_reduced),
        (&first.inv_dropping, &second.inv_dropping),
        (&first.inv_top, &second.inv_top),
        (&first.pane_top, &second.pane_top),
    ] {
        to.lock().unwrap().extend(from.lock().unwrap().clone());
    }
    second.total.lock().unwrap().extend(first.total.lock().unwrap().clone());
    second.counted.lock().unwrap().extend(first.counted.lock().unwrap().clone());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn windows_equal_naive_recomputation(
        input in stream(), length in 1u64..9, slide in 1u64..5, spill in spill_budgets(),
    ) {
        let mut w = build_spilling(length, slide, 3, spill);
        for batch in &input {
            w.queue.push_partitions(batch.clone());
        }
        run(&mut w.graph, 1..=input.len() as i64);
        check(&w, &input, length as i64, slide as i64)?;
    }

    #[test]
    fn windows_recomputed_for_state_continue_exactly(
        input in stream(), length in 1u64..9, slide in 1u64..5, cut in 0usize..40, spill in spill_budgets(),
    ) {
        // As a restart recomputes the batches after its snapshot: the
        // first `cut` batches for state alone, then on as usual.
        let cut = cut.min(input.len());
        let mut w = build_spilling(length, slide, 3, spill);
        for batch in &input {
            w.queue.push_partitions(batch.clone());
        }
        for batch in 1..=cut as i64 {
            let planned = w.graph.plan(t(batch), &BTreeMap::new()).unwrap();
            w.graph.recompute_for_state(t(batch), BatchId(batch as u64), &planned).unwrap();
        }
        prop_assert!(w.inv_sum.lock().unwrap().is_empty() && w.plain.lock().unwrap().is_empty(), "an output ran");
        run(&mut w.graph, cut as i64 + 1..=input.len() as i64);
        // The same batches all run as usual: what the outputs wrote up to
        // the cut, and what the dropping window writes after it.
        let mut whole = build_spilling(length, slide, 3, None);
        for batch in &input {
            whole.queue.push_partitions(batch.clone());
        }
        run(&mut whole.graph, 1..=input.len() as i64);
        let after_cut = |seen: &Collected<(u8, i64)>| {
            let mut seen = seen.lock().unwrap().clone();
            seen.retain(|time, _| *time > t(cut as i64));
            seen.values_mut().for_each(|records| records.sort_unstable());
            seen
        };
        prop_assert_eq!(after_cut(&w.inv_dropping), after_cut(&whole.inv_dropping));
        for seen in [&whole.plain, &whole.pane_sum, &whole.pane_max, &whole.inv_sum, &whole.inv_filtered, &whole.inv_reduced] {
            seen.lock().unwrap().retain(|time, _| *time <= t(cut as i64));
        }
        whole.total.lock().unwrap().retain(|time, _| *time <= t(cut as i64));
        whole.counted.lock().unwrap().retain(|time, _| *time <= t(cut as i64));
        add_outputs_before_the_restart(&whole, &w);
        check(&w, &input, length as i64, slide as i64)?;
    }

    #[test]
    fn windows_restored_mid_stream_continue_exactly(
        input in stream(), length in 1u64..9, slide in 1u64..5, cut in 0usize..40, partitions in 1usize..5,
        spill in spill_budgets(), spill_after in spill_budgets(),
    ) {
        let cut = cut.min(input.len());
        let mut first = build_spilling(length, slide, 3, spill);
        for batch in &input[..cut] {
            first.queue.push_partitions(batch.clone());
        }
        run(&mut first.graph, 1..=cut as i64);
        let descriptor = first.graph.descriptor();
        let state = first.graph.snapshot_state().unwrap();

        // A new process (possibly with another core count) restores and goes on.
        let mut second = build_spilling(length, slide, partitions, spill_after);
        second.graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
        for batch in &input[cut..] {
            second.queue.push_partitions(batch.clone());
        }
        run(&mut second.graph, cut as i64 + 1..=input.len() as i64);
        add_outputs_before_the_restart(&first, &second);
        check(&second, &input, length as i64, slide as i64)?;
    }

    #[test]
    fn windows_restored_from_a_whole_snapshot_and_later_changes_continue_exactly(
        input in stream(), length in 1u64..9, slide in 1u64..5, cuts in prop::collection::vec(0usize..40, 1..5),
        partitions in 1usize..5, spill in spill_budgets(), spill_after in spill_budgets(),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
        cuts.sort_unstable();
        let mut first = build_spilling(length, slide, 3, spill);
        let descriptor = first.graph.descriptor();
        let mut chains: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
        let mut done = 0;
        for (index, cut) in cuts.iter().enumerate() {
            for batch in &input[done..*cut] {
                first.queue.push_partitions(batch.clone());
            }
            run(&mut first.graph, done as i64 + 1..=*cut as i64);
            done = *cut;
            if index == 0 {
                // Streamed, as a checkpoint writes it to a file.
                for (name, bytes) in streamed_whole(&mut first.graph) {
                    chains.insert(name, vec![bytes]);
                }
                continue;
            }
            // Every other one streamed, as a checkpoint writes it to a file.
            let snapshots =
                if index % 2 == 1 { streamed_changes(&mut first.graph) } else { first.graph.snapshot_state_changes().unwrap() };
            for (name, snapshot) in snapshots {
                let chain = chains.get_mut(&name).unwrap();
                match snapshot {
                    StateSnapshot::Changes(bytes) => chain.push(bytes),
                    StateSnapshot::Whole(bytes) => *chain = vec![bytes],
                }
            }
        }
        // Only the inverse windows take changes; the others are whole each time.
        prop_assert!(chains.iter().all(|(name, chain)| name.starts_with("inv") || chain.len() == 1));
        prop_assert!(chains.iter().all(|(name, chain)| !name.starts_with("inv") || chain.len() == cuts.len()));

        // A new process (possibly with another core count) restores the chains and goes on.
        let mut second = build_spilling(length, slide, partitions, spill_after);
        second.graph.restore_chains(&descriptor, chains.into_iter().collect(), &RestorePolicy::strict()).unwrap();
        for batch in &input[done..] {
            second.queue.push_partitions(batch.clone());
        }
        run(&mut second.graph, done as i64 + 1..=input.len() as i64);
        add_outputs_before_the_restart(&first, &second);
        check(&second, &input, length as i64, slide as i64)?;
    }
}

#[test]
fn window_drops_batches_no_window_needs_any_more() {
    // With a 3 s window, a 2 s slide and one record per batch, the window's
    // checkpointed state holds at most the 3 newest batches.
    let mut w = build(3, 2, 2);
    for i in 0..20 {
        w.queue.push(vec![(0, i)]);
        run(&mut w.graph, i + 1..=i + 1);
        let state = w.graph.snapshot_state().unwrap();
        let (_, plain) = state.iter().find(|(name, _)| name == "plain").unwrap();
        let retained: Retained = spate_core::FrameCodec::new(1).decode(plain).unwrap().value;
        assert!(retained.len() <= 3, "batch {i}: {} batches retained", retained.len());
        assert!(retained.iter().all(|(time, _)| time.as_millis() > (i + 1 - 3) * 1000));
    }
}

#[test]
fn count_by_value_and_group_by_key_over_windows() {
    let b = GraphBuilder::new(INTERVAL).partitions(2);
    let queue = Arc::new(QueueSource::<(u8, i64)>::new());
    let s = b.input("records", Arc::clone(&queue));
    let counts = collect(&s.map(|(k, _)| k).count_by_value_and_window(secs(2), secs(1)).name("counts"));
    let groups = collect(&s.group_by_key_and_window(secs(2), secs(2)).map(|(k, mut vs)| {
        vs.sort();
        (k, vs)
    }));
    let mut graph = b.build().unwrap();
    queue.push(vec![(1, 10), (2, 20), (1, 11)]);
    queue.push(vec![(1, 12)]);
    queue.push(vec![(2, 21)]);
    run(&mut graph, 1..=3);
    assert_eq!(sorted_at(&counts, t(1)).unwrap(), vec![(1, 2), (2, 1)]);
    assert_eq!(sorted_at(&counts, t(2)).unwrap(), vec![(1, 3), (2, 1)]);
    assert_eq!(sorted_at(&counts, t(3)).unwrap(), vec![(1, 1), (2, 1)]);
    assert_eq!(sorted_at(&groups, t(2)).unwrap(), vec![(1, vec![10, 11, 12]), (2, vec![20])]);
    assert_eq!(sorted_at(&groups, t(1)), None);
    assert_eq!(
        graph.snapshot_state().unwrap().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        vec!["counts", "window-6"]
    );
}

/// The graph, its input and what its window emitted.
type Churning = (Graph, Arc<QueueSource<(String, u64)>>, Collected<(String, u64)>);

/// A window over keys that come and go: each batch brings 20 keys, 5 of
/// them new, and the filtered window drops a key once its batches left,
/// so ids are freed and given to other keys.
fn churning(partitions: usize) -> Churning {
    let b = GraphBuilder::new(INTERVAL).partitions(partitions).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::<(String, u64)>::new());
    let counts = b
        .input("words", Arc::clone(&queue))
        .reduce_by_key(|a, b| a + b)
        .reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a - b, secs(3), secs(1), |_, n| *n > 0)
        .name("counts");
    let seen = collect(&counts);
    (b.build().unwrap(), queue, seen)
}

fn churning_batch(batch: u64) -> Vec<(String, u64)> {
    (batch * 5..batch * 5 + 20).map(|k| (format!("key-{k}"), k % 3 + 1)).collect()
}

#[test]
fn a_window_whose_keys_come_and_go_restores_from_a_chain_onto_other_partitions_exactly() {
    let (mut whole_run, queue, expected) = churning(3);
    for batch in 1..=20 {
        queue.push(churning_batch(batch));
    }
    run(&mut whole_run, 1..=20);

    let (mut first, queue, before) = churning(3);
    let descriptor = first.descriptor();
    let mut chain = Vec::new();
    for batch in 1..=12 {
        queue.push(churning_batch(batch));
        run(&mut first, batch as i64..=batch as i64);
        match batch {
            4 => chain.push(first.snapshot_state().unwrap().remove(0).1),
            8 | 12 => match first.snapshot_state_changes().unwrap().remove(0).1 {
                StateSnapshot::Changes(bytes) => chain.push(bytes),
                StateSnapshot::Whole(_) => panic!("the window snapshots its changes"),
            },
            _ => {}
        }
    }
    let (mut second, queue, after) = churning(1);
    second.restore_chains(&descriptor, vec![("counts".to_string(), chain)], &RestorePolicy::strict()).unwrap();
    for batch in 13..=20 {
        queue.push(churning_batch(batch));
    }
    run(&mut second, 13..=20);
    for batch in 1..=20 {
        let seen = if batch <= 12 { &before } else { &after };
        assert_eq!(sorted_at(seen, t(batch)), sorted_at(&expected, t(batch)), "batch {batch}");
    }
    // Keys of early batches left the window for good.
    assert!(sorted_at(&after, t(20)).unwrap().iter().all(|(key, _)| key != "key-5"));
}

/// A filtered window over one partition: counts of 3 s sliding by 1 s,
/// keeping the keys counted more than once.
fn filtered_counts() -> Churning {
    let b = GraphBuilder::new(INTERVAL).partitions(1).checkpointing(true);
    let queue = Arc::new(QueueSource::<(String, u64)>::new());
    let counts = b
        .input("words", Arc::clone(&queue))
        .reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a - b, secs(3), secs(1), |_, n| *n > 1)
        .name("counts");
    let seen = collect(&counts);
    (b.build().unwrap(), queue, seen)
}

#[test]
fn a_restored_window_keeps_a_filtered_key_while_a_slice_names_it() {
    // Batch 1's key is filtered out (counted once) but its slice stays in
    // the window until batch 4: the restored window must know the slice
    // names it, or it frees the key's id, gives it to the key of batch 3,
    // and subtracts batch 1's count from that key when the slice leaves.
    let batches: [Vec<(String, u64)>; 4] =
        [vec![("a".into(), 1)], vec![("b".into(), 5)], vec![("c".into(), 5)], vec![("d".into(), 5)]];
    let (mut first, queue, _) = filtered_counts();
    let descriptor = first.descriptor();
    queue.push(batches[0].clone());
    run(&mut first, 1..=1);
    let state = first.snapshot_state().unwrap();
    let (mut second, queue, after) = filtered_counts();
    second.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
    for batch in &batches[1..] {
        queue.push(batch.clone());
    }
    run(&mut second, 2..=4);
    let expected: Vec<(String, u64)> = vec![("b".into(), 5), ("c".into(), 5), ("d".into(), 5)];
    assert_eq!(sorted_at(&after, t(4)).unwrap(), expected);
}
