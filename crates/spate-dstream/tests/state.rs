//! update_state_by_key and map_with_state against references.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{Collected, INTERVAL, collect, run, sorted_at, streamed_changes, streamed_whole, t};
use proptest::prelude::*;
use spate_core::{CoreError, Duration, ReadSeek};
use spate_dstream::{
    Graph, GraphBuilder, MemorySpillStore, QueueSource, RestorePolicy, State, StateFile, StateSnapshot, StateSpill,
};

fn batches() -> impl Strategy<Value = Vec<Vec<(u8, u32)>>> {
    prop::collection::vec(prop::collection::vec((0u8..10, 1u32..10), 0..15), 1..25)
}

/// A running total per key with `map_with_state`, idle keys timing out.
struct Sessions {
    graph: Graph,
    queue: Arc<QueueSource<(u8, u32)>>,
    mapped: Collected<(u8, u64, bool)>,
    snapshots: Collected<(u8, u64)>,
    /// The store partitions spill to, when given a budget.
    spill: Option<Arc<MemorySpillStore>>,
}

/// With `spill_budget`, the state beyond that many bytes moves to an
/// in-memory spill store (0: every partition with keys moves there).
fn sessions(timeout: u64, partitions: usize, spill_budget: Option<u64>) -> Sessions {
    let b = GraphBuilder::new(INTERVAL).partitions(partitions).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let with_state = b
        .input("in", Arc::clone(&queue))
        .map_with_state(
            |key: &u8, value: Option<u32>, state: &mut State<u64>| match value {
                Some(v) => {
                    let total = state.get().copied().unwrap_or(0) + u64::from(v);
                    state.update(total);
                    (*key, total, false)
                }
                None => (*key, state.get().copied().unwrap_or(0), state.is_timing_out()),
            },
            Some(Duration::from_secs(timeout)),
        )
        .name("sessions");
    let mapped = collect(&with_state.mapped());
    let snapshots = collect(&with_state.state_snapshots());
    let mut graph = b.build().unwrap();
    let spill = spill_to_memory(&mut graph, spill_budget);
    Sessions { graph, queue, mapped, snapshots, spill }
}

/// With `budget`, the graph's state beyond that many bytes moves to a new
/// in-memory spill store, which is returned.
fn spill_to_memory(graph: &mut Graph, budget: Option<u64>) -> Option<Arc<MemorySpillStore>> {
    budget.map(|budget| {
        let store = Arc::new(MemorySpillStore::new());
        graph.spill_state(&StateSpill::new(Arc::clone(&store) as _, budget));
        store
    })
}

/// Fails unless a job whose budget is 0 moved its state to the spill
/// store once it had keys: the spilled path was the one tested.
fn check_spilled(
    spill: Option<&Arc<MemorySpillStore>>,
    budget: Option<u64>,
    input: &[Vec<(u8, u32)>],
) -> Result<(), TestCaseError> {
    if let (Some(0), Some(store)) = (budget, spill)
        && input.iter().any(|batch| !batch.is_empty())
    {
        prop_assert!(store.tables_opened() > 0, "no partition moved to the spill store");
    }
    Ok(())
}

/// Running totals per key with `update_state_by_key`, a key whose total
/// passes 40 removed: read whole, and by a `top_n` of the two greatest.
struct Totals {
    graph: Graph,
    queue: Arc<QueueSource<(u8, u32)>>,
    seen: Collected<(u8, u64)>,
    top: Collected<(u8, u64)>,
    /// The store partitions spill to, when given a budget.
    spill: Option<Arc<MemorySpillStore>>,
}

/// Greater totals first, then lower keys.
fn by_total(a: &(u8, u64), b: &(u8, u64)) -> std::cmp::Ordering {
    a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))
}

/// [`Totals`], spilling as [`sessions`] does with `spill_budget`.
fn totals(partitions: usize, spill_budget: Option<u64>) -> Totals {
    let b = GraphBuilder::new(INTERVAL).partitions(partitions).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let update = |values: Vec<u32>, state: Option<u64>| {
        let total = state.unwrap_or(0) + values.iter().map(|v| u64::from(*v)).sum::<u64>();
        (total <= 40).then_some(total)
    };
    let records = b.input("in", Arc::clone(&queue));
    let seen = collect(&records.update_state_by_key(update).name("totals"));
    let top = collect(&records.update_state_by_key(update).name("top-totals").top_n(2, by_total));
    let mut graph = b.build().unwrap();
    let spill = spill_to_memory(&mut graph, spill_budget);
    Totals { graph, queue, seen, top, spill }
}

/// Every batch's totals and top two against a reference.
fn check_totals(s: &Totals, input: &[Vec<(u8, u32)>]) -> Result<(), TestCaseError> {
    let mut reference: BTreeMap<u8, u64> = BTreeMap::new();
    for (index, batch) in input.iter().enumerate() {
        let mut new: BTreeMap<u8, u64> = BTreeMap::new();
        for (k, v) in batch {
            *new.entry(*k).or_default() += u64::from(*v);
        }
        for (k, sum) in new {
            *reference.entry(k).or_default() += sum;
        }
        reference.retain(|_, total| *total <= 40);
        let mut expected: Vec<(u8, u64)> = reference.iter().map(|(k, v)| (*k, *v)).collect();
        let at = t(index as i64 + 1);
        prop_assert_eq!(sorted_at(&s.seen, at).unwrap(), expected.clone(), "totals at {}", at);
        expected.sort_by(|a, b| by_total(b, a));
        expected.truncate(2);
        prop_assert_eq!(s.top.lock().unwrap().get(&at).cloned(), Some(expected), "top two at {}", at);
    }
    Ok(())
}

fn spill_budgets() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), Just(Some(0)), (1u64..4096).prop_map(Some)]
}

/// Every batch's mapped records and state against a reference: per key
/// the running total and the last batch with data.
fn check_sessions(s: &Sessions, input: &[Vec<(u8, u32)>], timeout: u64) -> Result<(), TestCaseError> {
    let mut state: BTreeMap<u8, (u64, i64)> = BTreeMap::new();
    for (index, batch) in input.iter().enumerate() {
        let now = index as i64 + 1;
        let mut expected = Vec::new();
        for (k, v) in batch {
            let entry = state.entry(*k).or_insert((0, now));
            entry.0 += u64::from(*v);
            entry.1 = now;
            expected.push((*k, entry.0, false));
        }
        let threshold = now - timeout as i64;
        let timed_out: Vec<u8> = state.iter().filter(|(_, (_, last))| *last < threshold).map(|(k, _)| *k).collect();
        for k in timed_out {
            let (total, _) = state.remove(&k).unwrap();
            expected.push((k, total, true));
        }
        expected.sort();
        prop_assert_eq!(sorted_at(&s.mapped, t(now)).unwrap(), expected, "mapped at {}", now);
        let expected_state: Vec<(u8, u64)> = state.iter().map(|(k, (total, _))| (*k, *total)).collect();
        prop_assert_eq!(sorted_at(&s.snapshots, t(now)).unwrap(), expected_state, "state at {}", now);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn update_state_by_key_keeps_running_totals_and_removes_on_none(input in batches(), budget in spill_budgets()) {
        let mut s = totals(3, budget);
        for batch in &input {
            s.queue.push(batch.clone());
        }
        run(&mut s.graph, 1..=input.len() as i64);
        check_totals(&s, &input)?;
        check_spilled(s.spill.as_ref(), budget, &input)?;
    }

    #[test]
    fn update_state_by_key_restored_from_a_whole_snapshot_and_later_changes_continues_exactly(
        input in batches(), cuts in prop::collection::vec(0usize..25, 1..5), partitions in 1usize..5,
        budgets in (spill_budgets(), spill_budgets()),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
        cuts.sort_unstable();
        let mut first = totals(3, budgets.0);
        let descriptor = first.graph.descriptor();
        let mut chains: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
        let mut done = 0;
        for (index, cut) in cuts.iter().enumerate() {
            for batch in &input[done..*cut] {
                first.queue.push(batch.clone());
            }
            run(&mut first.graph, done as i64 + 1..=*cut as i64);
            done = *cut;
            // Whole first, then changes; every other one streamed, as a
            // checkpoint writes it to a file.
            let snapshots = match index {
                0 => streamed_whole(&mut first.graph).into_iter().map(|(op, bytes)| (op, StateSnapshot::Whole(bytes))).collect(),
                _ if index % 2 == 1 => streamed_changes(&mut first.graph),
                _ => first.graph.snapshot_state_changes().unwrap(),
            };
            for (operator, snapshot) in snapshots {
                match snapshot {
                    StateSnapshot::Whole(bytes) if index == 0 => chains.entry(operator).or_default().push(bytes),
                    StateSnapshot::Changes(bytes) if index > 0 => chains.entry(operator).or_default().push(bytes),
                    _ => prop_assert!(false, "update_state_by_key snapshots whole first and then what changed"),
                }
            }
        }
        let mut second = totals(partitions, budgets.1);
        second.graph.restore_chains(&descriptor, chains.into_iter().collect(), &RestorePolicy::strict()).unwrap();
        for batch in &input[done..] {
            second.queue.push(batch.clone());
        }
        run(&mut second.graph, done as i64 + 1..=input.len() as i64);
        second.seen.lock().unwrap().extend(first.seen.lock().unwrap().clone());
        second.top.lock().unwrap().extend(first.top.lock().unwrap().clone());
        check_totals(&second, &input)?;
        check_spilled(first.spill.as_ref(), budgets.0, &input[..done])?;
        check_spilled(second.spill.as_ref(), budgets.1, &input[done..])?;
    }

    #[test]
    fn map_with_state_maps_every_record_and_times_out_idle_keys(
        input in batches(), timeout in 1u64..5, budget in spill_budgets(),
    ) {
        let mut s = sessions(timeout, 3, budget);
        for batch in &input {
            s.queue.push(batch.clone());
        }
        run(&mut s.graph, 1..=input.len() as i64);
        check_sessions(&s, &input, timeout)?;
        check_spilled(s.spill.as_ref(), budget, &input)?;
    }

    #[test]
    fn map_with_state_restored_from_a_whole_snapshot_and_later_changes_continues_exactly(
        input in batches(), timeout in 1u64..5, cuts in prop::collection::vec(0usize..25, 1..5), partitions in 1usize..5,
        budgets in (spill_budgets(), spill_budgets()),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
        cuts.sort_unstable();
        let mut first = sessions(timeout, 3, budgets.0);
        let descriptor = first.graph.descriptor();
        let mut chain: Vec<Vec<u8>> = Vec::new();
        let mut done = 0;
        for cut in &cuts {
            for batch in &input[done..*cut] {
                first.queue.push(batch.clone());
            }
            run(&mut first.graph, done as i64 + 1..=*cut as i64);
            done = *cut;
            if chain.is_empty() {
                chain.push(streamed_whole(&mut first.graph).remove(0).1);
                continue;
            }
            // Every other one streamed, as a checkpoint writes it to a file.
            let mut snapshots =
                if chain.len() % 2 == 1 { streamed_changes(&mut first.graph) } else { first.graph.snapshot_state_changes().unwrap() };
            match snapshots.remove(0).1 {
                StateSnapshot::Changes(bytes) => chain.push(bytes),
                StateSnapshot::Whole(_) => prop_assert!(false, "map_with_state snapshots what changed"),
            }
        }
        let mut second = sessions(timeout, partitions, budgets.1);
        // The whole snapshot read as a stream from a file, as a restart reads it.
        let dir = tempfile::tempdir().unwrap();
        let whole_path = dir.path().join("whole");
        std::fs::write(&whole_path, chain.remove(0)).unwrap();
        let mut files = vec![StateFile::new(|| {
            let file = std::fs::File::open(&whole_path).map_err(|source| CoreError::Read { source })?;
            Ok(Box::new(file) as Box<dyn ReadSeek>)
        })];
        files.extend(chain.into_iter().map(StateFile::in_memory));
        second.graph.restore_chains_from(&descriptor, vec![("sessions".to_string(), files)], &RestorePolicy::strict()).unwrap();
        for batch in &input[done..] {
            second.queue.push(batch.clone());
        }
        run(&mut second.graph, done as i64 + 1..=input.len() as i64);
        second.mapped.lock().unwrap().extend(first.mapped.lock().unwrap().clone());
        second.snapshots.lock().unwrap().extend(first.snapshots.lock().unwrap().clone());
        check_sessions(&second, &input, timeout)?;
        check_spilled(first.spill.as_ref(), budgets.0, &input[..done])?;
    }
}

/// A job of each keyed operator (`map_with_state` sessions with a 10 s
/// timeout, `update_state_by_key` totals), with its queue and spill store,
/// for the checks that hold for both.
type Job = (&'static str, Graph, Arc<QueueSource<(u8, u32)>>, Option<Arc<MemorySpillStore>>);

fn both_operators(partitions: usize, spill_budget: Option<u64>) -> [Job; 2] {
    let (s, t) = (sessions(10, partitions, spill_budget), totals(partitions, spill_budget));
    [("map_with_state", s.graph, s.queue, s.spill), ("update_state_by_key", t.graph, t.queue, t.spill)]
}

#[test]
fn a_streamed_whole_snapshot_is_the_one_in_memory_whether_the_state_is_in_memory_or_spilled() {
    for budget in [None, Some(0)] {
        for (operator, mut graph, queue, spill) in both_operators(3, budget) {
            queue.push((0..10).map(|key| (key, u32::from(key) + 1)).collect());
            queue.push(vec![(3, 4), (7, 1)]);
            run(&mut graph, 1..=2);
            check_spilled(spill.as_ref(), budget, &[vec![(1, 1)]]).unwrap();
            let in_memory = graph.snapshot_state().unwrap();
            assert_eq!(streamed_whole(&mut graph), in_memory, "{operator}, {budget:?}");
        }
    }
}

#[test]
fn a_failing_spill_store_fails_the_batch_with_its_reason() {
    for (operator, mut graph, queue, spill) in both_operators(2, Some(0)) {
        queue.push(vec![(1, 1), (2, 2), (3, 3)]);
        queue.push(vec![(1, 1)]);
        run(&mut graph, 1..=1);
        let store = spill.as_ref().unwrap();
        assert!(store.tables_opened() > 0, "{operator}");
        store.fail_after(0);
        let error = graph.run_batch(t(2), spate_core::BatchId(2)).unwrap_err();
        assert!(error.to_string().contains("failpoint"), "{operator}: {error}");
    }
}

/// The operator's whole snapshot or changes, from a graph's list.
fn of_totals<T>(snapshots: Vec<(String, T)>) -> T {
    snapshots.into_iter().find(|(operator, _)| operator == "totals").expect("the totals operator's snapshot").1
}

#[test]
fn update_state_by_key_changes_list_the_keys_a_spilled_partition_changed_and_no_others() {
    let mut s = totals(2, Some(0));
    s.queue.push((0..50).map(|key| (key, 1)).collect());
    s.queue.push(vec![(1, 1)]);
    run(&mut s.graph, 1..=1);
    assert!(s.spill.as_ref().unwrap().tables_opened() > 0);
    let whole = of_totals(s.graph.snapshot_state().unwrap());
    run(&mut s.graph, 2..=2);
    let StateSnapshot::Changes(changes) = of_totals(s.graph.snapshot_state_changes().unwrap()) else {
        panic!("update_state_by_key snapshots what changed");
    };
    // One key of fifty changed.
    assert!(changes.len() * 5 < whole.len(), "changes of {} bytes against a whole of {}", changes.len(), whole.len());
}

#[test]
fn update_state_by_key_changes_after_a_partition_moved_to_its_table_hold_what_changed_since() {
    let mut first = totals(2, Some(0));
    let descriptor = first.graph.descriptor();
    // No key yet: the partitions are in memory at the whole snapshot.
    first.queue.push(vec![]);
    run(&mut first.graph, 1..=1);
    let wholes = streamed_whole(&mut first.graph);
    // Batch 2 moves the partitions to their tables; batch 3 changes a key.
    first.queue.push(vec![(1, 5), (2, 6), (3, 7)]);
    first.queue.push(vec![(1, 1)]);
    run(&mut first.graph, 2..=3);
    assert!(first.spill.as_ref().unwrap().tables_opened() > 0);
    let mut chains: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    for ((operator, whole), (_, changes)) in wholes.into_iter().zip(first.graph.snapshot_state_changes().unwrap()) {
        let StateSnapshot::Changes(changes) = changes else { panic!("update_state_by_key snapshots what changed") };
        chains.push((operator, vec![whole, changes]));
    }
    let mut second = totals(2, None);
    second.graph.restore_chains(&descriptor, chains, &RestorePolicy::strict()).unwrap();
    second.queue.push(vec![]);
    run(&mut second.graph, 4..=4);
    assert_eq!(sorted_at(&second.seen, t(4)).unwrap(), vec![(1, 6), (2, 6), (3, 7)]);
}

#[test]
fn map_with_state_sees_records_of_a_key_in_order() {
    let b = GraphBuilder::new(INTERVAL).partitions(2).workers(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let with_state = b.input("in", Arc::clone(&queue)).map_with_state(
        |_key: &u8, value: Option<u32>, state: &mut State<Vec<u32>>| {
            let mut seen = state.get().cloned().unwrap_or_default();
            seen.extend(value);
            state.update(seen.clone());
            seen
        },
        None,
    );
    let mapped = collect(&with_state.mapped());
    let mut graph = b.build().unwrap();
    queue.push(vec![(1, 10), (1, 11), (1, 12)]);
    queue.push(vec![(1, 13)]);
    run(&mut graph, 1..=2);
    assert_eq!(sorted_at(&mapped, t(1)).unwrap(), vec![vec![10], vec![10, 11], vec![10, 11, 12]]);
    assert_eq!(sorted_at(&mapped, t(2)).unwrap(), vec![vec![10, 11, 12, 13]]);
}

#[test]
fn removed_state_starts_over() {
    let b = GraphBuilder::new(INTERVAL).partitions(2).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let with_state = b.input("in", Arc::clone(&queue)).map_with_state(
        |_key: &u8, value: Option<u32>, state: &mut State<u32>| {
            let total = state.get().copied().unwrap_or(0) + value.unwrap_or(0);
            if total >= 5 {
                state.remove();
            } else {
                state.update(total);
            }
            total
        },
        None,
    );
    let mapped = collect(&with_state.mapped());
    let mut graph = b.build().unwrap();
    for _ in 0..4 {
        queue.push(vec![(7, 2)]);
    }
    run(&mut graph, 1..=4);
    let all: Vec<u32> = (1..=4).flat_map(|i| sorted_at(&mapped, t(i)).unwrap()).collect();
    assert_eq!(all, vec![2, 4, 6, 2]);
}

#[test]
fn a_partition_moving_to_its_spill_table_keeps_its_changes_for_the_next_incremental_snapshot() {
    let mut first = sessions(10, 2, Some(0));
    let descriptor = first.graph.descriptor();
    let whole = first.graph.snapshot_state().unwrap().remove(0).1;
    // The batch that gives the partitions their first keys also moves them to the store.
    first.queue.push(vec![(1, 5), (2, 6), (3, 7)]);
    run(&mut first.graph, 1..=1);
    assert!(first.spill.as_ref().unwrap().tables_opened() > 0);
    let StateSnapshot::Changes(changes) = first.graph.snapshot_state_changes().unwrap().remove(0).1 else {
        panic!("map_with_state snapshots what changed");
    };
    let mut second = sessions(10, 2, None);
    let chain = vec![("sessions".to_string(), vec![whole, changes])];
    second.graph.restore_chains(&descriptor, chain, &RestorePolicy::strict()).unwrap();
    second.queue.push(vec![]);
    run(&mut second.graph, 2..=2);
    assert_eq!(sorted_at(&second.snapshots, t(2)).unwrap(), vec![(1, 5), (2, 6), (3, 7)]);
}

/// A state file that cannot be opened fails the restore with what its
/// opener said, and the files after it are never opened.
#[test]
fn a_state_file_that_cannot_be_opened_fails_the_restore_and_nothing_after_it_is_opened() {
    let mut first = sessions(10, 2, None);
    let descriptor = first.graph.descriptor();
    let whole = first.graph.snapshot_state().unwrap().remove(0).1;
    first.queue.push(vec![(1, 5)]);
    run(&mut first.graph, 1..=1);
    let opened_after = std::cell::Cell::new(false);
    let files = vec![
        StateFile::in_memory(whole),
        StateFile::new(|| Err(CoreError::Read { source: std::io::Error::other("the disk went away") })),
        StateFile::new(|| {
            opened_after.set(true);
            Err(CoreError::Decode { reason: "not to be read".to_string() })
        }),
    ];
    let mut second = sessions(10, 2, None);
    let err = second
        .graph
        .restore_chains_from(&descriptor, vec![("sessions".to_string(), files)], &RestorePolicy::strict())
        .unwrap_err()
        .to_string();
    assert!(err.contains("sessions") && err.contains("the disk went away"), "{err}");
    assert!(!opened_after.get());
}
