//! Aggregation per key without a window, as SQL's `GROUP BY` over an
//! unbounded table: [`DStream::aggregate_by_key`] keeps one state per key
//! for as long as the stream runs and, after each batch, emits rows for each
//! key whose state the batch changed. The result is an upsert stream: a
//! later row for a key replaces what was emitted for it before, and a key
//! the batch left alone emits nothing (unlike `update_state_by_key`, which
//! emits every key's state after every batch).
//!
//! The operators of the usual unwindowed queries are built on it, each in
//! its own module: the latest record per key (`dedup`), the top N per key
//! (`top_n`) and exact distinct counts (`distinct`).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use spate_core::{BatchId, Duration, Time};
//! use spate_dstream::{GraphBuilder, QueueSource};
//!
//! let builder = GraphBuilder::new(Duration::from_secs(1)).checkpointing(true);
//! let sales = Arc::new(QueueSource::<(String, u64)>::new());
//! // The running total of each shop, emitted when it moves.
//! let totals = builder
//!     .input("sales", Arc::clone(&sales))
//!     .aggregate_by_key(
//!         |_shop, amount, total: &mut Option<u64>| {
//!             *total = Some(total.unwrap_or(0) + amount);
//!             amount > 0
//!         },
//!         |shop, total, out| out.push((shop.clone(), *total)),
//!     )
//!     .name("totals");
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&seen);
//! totals.foreach_batch(move |batch, _info| {
//!     let mut rows: Vec<_> = batch.iter().cloned().collect();
//!     rows.sort();
//!     sink.lock().unwrap().push(rows);
//!     Ok(())
//! });
//! let mut graph = builder.build()?;
//! sales.push(vec![("a".into(), 5), ("b".into(), 1), ("a".into(), 2)]);
//! graph.run_batch(Time::from_millis(1000), BatchId(0))?;
//! sales.push(vec![("b".into(), 4), ("a".into(), 0)]);
//! graph.run_batch(Time::from_millis(2000), BatchId(1))?;
//! // A zero sale changes nothing: only b moves in the second batch.
//! let rows = seen.lock().unwrap().clone();
//! assert_eq!(rows, [vec![("a".to_string(), 7), ("b".to_string(), 1)], vec![("b".to_string(), 5)]]);
//! # Ok::<(), spate_dstream::DStreamError>(())
//! ```

use std::sync::Arc;

use spate_core::CoreError;

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, map_with_capacity, partition_of};
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx, state_codec};
use crate::pair::partition_records;
use crate::stream::DStream;

/// A key's state (`Some` whenever it is in the map: a key whose update
/// leaves `None` is removed), and whether the batch being processed changed
/// it (not checkpointed: it is false between batches).
struct Entry<S> {
    value: Option<S>,
    changed: bool,
}

struct UpsertNode<K, V, S, M, U, E> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<M>>,
    update: U,
    emit: E,
    parts: Vec<KeyHashMap<K, Entry<S>>>,
}

/// Spreads entries over `partitions` maps by key.
fn spread<K: Key, S>(entries: Vec<(K, S)>, partitions: usize) -> Vec<KeyHashMap<K, Entry<S>>> {
    let mut maps: Vec<KeyHashMap<K, Entry<S>>> = (0..partitions.max(1)).map(|_| map_with_capacity(0)).collect();
    let count = maps.len();
    for (key, value) in entries {
        if let Some(map) = maps.get_mut(partition_of(&key, count)) {
            map.insert(key, Entry { value: Some(value), changed: false });
        }
    }
    maps
}

impl<K, V, S, M, U, E> UpsertNode<K, V, S, M, U, E>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    U: Fn(&K, V, &mut Option<S>) -> bool + Send + Sync,
    E: Fn(&K, &mut S, &mut Vec<M>) + Send + Sync,
{
    /// Folds one work partition's records into its keys, in order, then
    /// emits the keys they changed.
    fn run_part(update: &U, emit: &E, part: &mut KeyHashMap<K, Entry<S>>, records: Vec<(K, V)>) -> Vec<M> {
        // The keys the batch changed, in the order they first changed.
        let mut changed_keys: Vec<K> = Vec::new();
        for (key, value) in records {
            if let Some(entry) = part.get_mut(&key) {
                let changed = update(&key, value, &mut entry.value);
                if entry.value.is_none() {
                    // Removed: if it was listed, it is not emitted.
                    part.remove(&key);
                } else if changed && !entry.changed {
                    entry.changed = true;
                    changed_keys.push(key);
                }
            } else {
                let mut state = None;
                let changed = update(&key, value, &mut state);
                if state.is_some() {
                    // A key removed and added again in the batch may be
                    // listed twice: its flag lets it emit once.
                    if changed {
                        changed_keys.push(key.clone());
                    }
                    part.insert(key, Entry { value: state, changed });
                }
            }
        }
        let mut out = Vec::with_capacity(changed_keys.len());
        for key in changed_keys {
            let Some(entry) = part.get_mut(&key).filter(|e| e.changed) else { continue };
            entry.changed = false;
            if let Some(value) = entry.value.as_mut() {
                emit(&key, value, &mut out);
            }
        }
        out
    }
}

impl<K, V, S, M, U, E> Node for UpsertNode<K, V, S, M, U, E>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    U: Fn(&K, V, &mut Option<S>) -> bool + Send + Sync,
    E: Fn(&K, &mut S, &mut Vec<M>) + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if self.parts.len() != ctx.partitions {
            let entries: Vec<(K, S)> =
                self.parts.drain(..).flatten().filter_map(|(k, e)| Some((k, e.value?))).collect();
            self.parts = spread(entries, ctx.partitions);
        }
        let Some(batch) = ctx.take_owned(&self.input)? else {
            self.output.put(ctx.time, None);
            return Ok(None);
        };
        let records = partition_records(ctx, batch.into_partitions(), ctx.partitions)?;
        let (update, emit) = (&self.update, &self.emit);
        let work: Vec<_> = self.parts.iter_mut().zip(records).collect();
        let out = ctx.par(work, |(part, records)| Self::run_part(update, emit, part, records))?;
        self.output.put(ctx.time, Some(Batch::new(out)));
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<K, V, S, M, U, E> StatefulNode for UpsertNode<K, V, S, M, U, E>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    U: Fn(&K, V, &mut Option<S>) -> bool + Send + Sync,
    E: Fn(&K, &mut S, &mut Vec<M>) + Send + Sync,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let entries: Vec<(&K, &S)> =
            self.parts.iter().flat_map(|p| p.iter()).filter_map(|(k, e)| Some((k, e.value.as_ref()?))).collect();
        state_codec().encode(&entries)
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let entries: Vec<(K, S)> = state_codec().decode(bytes)?.value;
        self.parts = spread(entries, partitions);
        Ok(())
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Keeps a state per key, without a window, and emits what changed
    /// after each batch (SQL's `GROUP BY` over an unbounded table, as an
    /// upsert stream).
    ///
    /// For every record, in the order the records came in within each key,
    /// `update(key, value, state)` folds the value into the key's state
    /// (`None` before its first record; leaving `None` removes the key) and
    /// returns whether it changed what the key would emit. After the batch,
    /// `emit(key, state, out)` pushes the rows of each key some record
    /// changed, once per batch whatever the number of its records (it may
    /// take what it emits out of the state: what the batch changed, kept by
    /// `update`); a key whose records changed nothing emits nothing. Keeps state for every
    /// key for ever: needs a checkpoint directory, and the stream's keys
    /// should be bounded (a day, a channel, an auction).
    pub fn aggregate_by_key<S, M, U, E>(&self, update: U, emit: E) -> DStream<M>
    where
        S: Data,
        M: Data,
        U: Fn(&K, V, &mut Option<S>) -> bool + Send + Sync + 'static,
        E: Fn(&K, &mut S, &mut Vec<M>) + Send + Sync + 'static,
    {
        self.upsert("aggregate_by_key", update, emit)
    }

    /// [`DStream::aggregate_by_key`] under another operator kind.
    pub(crate) fn upsert<S, M, U, E>(&self, kind: &'static str, update: U, emit: E) -> DStream<M>
    where
        S: Data,
        M: Data,
        U: Fn(&K, V, &mut Option<S>) -> bool + Send + Sync + 'static,
        E: Fn(&K, &mut S, &mut Vec<M>) + Send + Sync + 'static,
    {
        let input = self.reader();
        let mut meta = NodeMeta::new(kind, vec![self.id], self.slide);
        meta.state = Some(StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<S>(),
            needs_checkpoint: true,
        });
        self.add_node(meta, |output| Box::new(UpsertNode { input, output, update, emit, parts: Vec::new() }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use spate_core::{BatchId, Duration, Time};

    use crate::graph::GraphBuilder;
    use crate::source::QueueSource;
    use crate::{DStream, Data, RestorePolicy};

    /// Runs `op` over `batches` (each a list of partitions), twice: once
    /// straight through on one work partition, and once restoring a
    /// snapshot after each batch into a new graph with another number of
    /// work partitions (1 to 3); asserts both give the same rows and returns
    /// each batch's rows, sorted.
    pub(crate) fn run_both<V: Data, T: Data + Ord + std::fmt::Debug>(
        op: impl Fn(&DStream<V>) -> DStream<T>,
        batches: Vec<Vec<Vec<V>>>,
    ) -> Vec<Vec<T>> {
        let straight = run(&op, &batches, false);
        assert_eq!(run(&op, &batches, true), straight, "a restored graph emitted other rows");
        straight
    }

    fn run<V: Data, T: Data + Ord>(
        op: &impl Fn(&DStream<V>) -> DStream<T>,
        batches: &[Vec<Vec<V>>],
        restore_each: bool,
    ) -> Vec<Vec<T>> {
        let rows: Arc<Mutex<Vec<Vec<T>>>> = Arc::default();
        let build = |queue: &Arc<QueueSource<V>>, partitions: usize| {
            let builder = GraphBuilder::new(Duration::from_secs(1)).checkpointing(true).partitions(partitions);
            let sink = Arc::clone(&rows);
            op(&builder.input("in", Arc::clone(queue))).name("op").foreach_batch(move |batch, _| {
                let mut batch: Vec<T> = batch.iter().cloned().collect();
                batch.sort();
                sink.lock().unwrap().push(batch);
                Ok(())
            });
            builder.build().unwrap()
        };
        let mut queue = Arc::new(QueueSource::new());
        let mut graph = build(&queue, 1);
        for (n, parts) in batches.iter().enumerate() {
            let time = Time::from_millis(1000 * (n as i64 + 1));
            queue.push_partitions(parts.clone());
            graph.run_batch(time, BatchId(n as u64)).unwrap();
            if restore_each {
                let (descriptor, state) = (graph.descriptor(), graph.snapshot_state().unwrap());
                queue = Arc::new(QueueSource::new());
                graph = build(&queue, 3 - n % 3);
                graph.restore(&descriptor, state, &RestorePolicy::strict()).unwrap();
                graph.resume_after(time);
            }
        }
        drop(graph);
        rows.lock().unwrap().clone()
    }

    #[test]
    fn a_key_emits_once_per_batch_that_changed_it_and_removed_keys_start_again() {
        // Sums per key; a negative value removes the key, a zero changes nothing.
        let rows = run_both(
            |s: &DStream<(u8, i64)>| {
                s.aggregate_by_key(
                    |_k, v, sum: &mut Option<i64>| {
                        if v < 0 {
                            *sum = None;
                            return false;
                        }
                        *sum = Some(sum.unwrap_or(0) + v);
                        v != 0
                    },
                    |k, sum, out| out.push((*k, *sum)),
                )
            },
            vec![
                vec![vec![(1, 2), (2, 3)], vec![(1, 4), (3, 0)]],
                vec![vec![(1, 0), (2, -1)], vec![(3, 1)]],
                // 3 changes and goes in one batch: nothing; 4 comes, goes
                // and comes again: once.
                vec![vec![(2, 5), (1, 1), (3, 2), (4, 1)], vec![(3, -1), (4, -1), (4, 2)]],
            ],
        );
        assert_eq!(rows, vec![vec![(1, 6), (2, 3)], vec![(3, 1)], vec![(1, 7), (2, 5), (4, 2)]]);
    }
}
