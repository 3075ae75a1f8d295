//! Hash-partitioned shuffles and the key-value transformations built on them.
//!
//! A shuffle combines each input partition locally first (one hash-map probe
//! per record, like Spark's map-side combine), then splits the combined
//! entries by key partition and merges them per output partition, both
//! phases partition-parallel. Per-record work is one hash and one probe; the
//! split costs one hash per distinct key, not per record.

use std::collections::hash_map::Entry;

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::hash::{FxHashMap, map_with_capacity, partition_of};
use crate::node::StepCtx;
use crate::stream::DStream;

/// Moves every entry of `maps` (one per input partition) into the bucket of
/// its key's partition; returns the buckets grouped by output partition.
/// Entries bound for one output partition, one bucket per input partition.
type Buckets<K, C> = Vec<Vec<(K, C)>>;

fn split_by_partition<K: Key, C: Send>(
    ctx: &StepCtx<'_>,
    maps: Vec<FxHashMap<K, C>>,
    partitions: usize,
) -> Result<Vec<Buckets<K, C>>, DStreamError> {
    let split = ctx.par(maps, |map| {
        let mut buckets: Vec<Vec<(K, C)>> =
            (0..partitions).map(|_| Vec::with_capacity(map.len() / partitions + 1)).collect();
        for (key, value) in map {
            let index = partition_of(&key, partitions);
            if let Some(bucket) = buckets.get_mut(index) {
                bucket.push((key, value));
            }
        }
        buckets
    })?;
    let mut by_output: Vec<Buckets<K, C>> = (0..partitions).map(|_| Vec::with_capacity(split.len())).collect();
    for buckets in split {
        for (index, bucket) in buckets.into_iter().enumerate() {
            if let Some(target) = by_output.get_mut(index) {
                target.push(bucket);
            }
        }
    }
    Ok(by_output)
}

/// Combines the values of each key into one combiner, hash-partitioned into
/// `partitions` maps (partition `i` holds exactly the keys with
/// `partition_of(key) == i`).
pub(crate) fn combine_partitioned<K, V, C, CF, MV, MC>(
    ctx: &StepCtx<'_>,
    parts: Vec<Vec<(K, V)>>,
    partitions: usize,
    create: &CF,
    merge_value: &MV,
    merge_combiners: &MC,
) -> Result<Vec<FxHashMap<K, C>>, DStreamError>
where
    K: Key,
    V: Send,
    C: Send,
    CF: Fn(V) -> C + Sync,
    MV: Fn(&mut C, V) + Sync,
    MC: Fn(&mut C, C) + Sync,
{
    let local = ctx.par(parts, |part| {
        let mut map: FxHashMap<K, C> = map_with_capacity(64);
        for (key, value) in part {
            match map.entry(key) {
                Entry::Occupied(mut slot) => merge_value(slot.get_mut(), value),
                Entry::Vacant(slot) => {
                    slot.insert(create(value));
                }
            }
        }
        map
    })?;
    let by_output = split_by_partition(ctx, local, partitions)?;
    ctx.par(by_output, |buckets| {
        let total: usize = buckets.iter().map(Vec::len).sum();
        let mut merged: FxHashMap<K, C> = map_with_capacity(total);
        for (key, combiner) in buckets.into_iter().flatten() {
            match merged.entry(key) {
                Entry::Occupied(mut slot) => merge_combiners(slot.get_mut(), combiner),
                Entry::Vacant(slot) => {
                    slot.insert(combiner);
                }
            }
        }
        merged
    })
}

/// Reduces the values of each key with `reduce`, hash-partitioned.
pub(crate) fn reduce_partitioned<K: Key, V: Data, F: Fn(&V, &V) -> V + Sync>(
    ctx: &StepCtx<'_>,
    parts: Vec<Vec<(K, V)>>,
    partitions: usize,
    reduce: &F,
) -> Result<Vec<FxHashMap<K, V>>, DStreamError> {
    let merge = |acc: &mut V, value: V| *acc = reduce(acc, &value);
    combine_partitioned(ctx, parts, partitions, &|value| value, &merge, &merge)
}

/// Moves each record to the partition of its key, keeping every record.
pub(crate) fn partition_records<K: Key, V: Data>(
    ctx: &StepCtx<'_>,
    parts: Vec<Vec<(K, V)>>,
    partitions: usize,
) -> Result<Vec<Vec<(K, V)>>, DStreamError> {
    let split = ctx.par(parts, |part| {
        let mut buckets: Vec<Vec<(K, V)>> =
            (0..partitions).map(|_| Vec::with_capacity(part.len() / partitions + 1)).collect();
        for (key, value) in part {
            if let Some(bucket) = buckets.get_mut(partition_of(&key, partitions)) {
                bucket.push((key, value));
            }
        }
        buckets
    })?;
    let mut out: Vec<Vec<(K, V)>> = (0..partitions).map(|_| Vec::new()).collect();
    for buckets in split {
        for (index, bucket) in buckets.into_iter().enumerate() {
            if let Some(target) = out.get_mut(index) {
                target.extend(bucket);
            }
        }
    }
    Ok(out)
}

/// Turns partitioned maps into a batch, one partition per map.
pub(crate) fn maps_to_batch<K: Key, V: Data>(
    ctx: &StepCtx<'_>,
    maps: Vec<FxHashMap<K, V>>,
) -> Result<Batch<(K, V)>, DStreamError> {
    Ok(Batch::new(ctx.par(maps, |map| map.into_iter().collect())?))
}

impl<T: Key> DStream<T> {
    /// How often each distinct record occurs in the batch.
    pub fn count_by_value(&self) -> DStream<(T, u64)> {
        self.map(|record| (record, 1u64)).reduce_by_key(|a, b| a + b)
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Applies `f` to every value, keeping the key.
    pub fn map_values<U: Data, F>(&self, f: F) -> DStream<(K, U)>
    where
        F: Fn(V) -> U + Send + Sync + 'static,
    {
        self.per_partition("map_values", move |part| part.into_iter().map(|(k, v)| (k, f(v))).collect())
    }

    /// Reduces each key's values in the batch with an associative and
    /// commutative `reduce`; the result is hash-partitioned by key.
    pub fn reduce_by_key<F>(&self, reduce: F) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        self.unary("reduce_by_key", move |batch, ctx| {
            let maps = reduce_partitioned(ctx, batch.into_partitions(), ctx.partitions, &reduce)?;
            maps_to_batch(ctx, maps)
        })
    }

    /// Combines each key's values: `create` makes a combiner from the first
    /// value, `merge_value` adds a value, `merge_combiners` merges two
    /// combiners built in different partitions.
    pub fn combine_by_key<C: Data, CF, MV, MC>(
        &self,
        create: CF,
        merge_value: MV,
        merge_combiners: MC,
    ) -> DStream<(K, C)>
    where
        CF: Fn(V) -> C + Send + Sync + 'static,
        MV: Fn(&mut C, V) + Send + Sync + 'static,
        MC: Fn(&mut C, C) + Send + Sync + 'static,
    {
        self.unary("combine_by_key", move |batch, ctx| {
            let parts = batch.into_partitions();
            let maps = combine_partitioned(ctx, parts, ctx.partitions, &create, &merge_value, &merge_combiners)?;
            maps_to_batch(ctx, maps)
        })
    }

    /// Gathers each key's values of the batch.
    ///
    /// Holds every value of the batch at once (one `Vec` a key), gathered
    /// at the batch boundary; prefer `reduce_by_key` or `combine_by_key`,
    /// which keep one combined value a key.
    pub fn group_by_key(&self) -> DStream<(K, Vec<V>)> {
        self.combine_by_key(|v| vec![v], |acc: &mut Vec<V>, v| acc.push(v), |acc: &mut Vec<V>, more| acc.extend(more))
            .rename_kind("group_by_key")
    }

    /// Pairs every value of a key in this batch with every value of the same
    /// key in `other`'s batch.
    ///
    /// Needs both whole batches: its inputs are gathered at the batch
    /// boundary and decoded then (not processed as blocks arrive). Until
    /// then a received input's blocks wait encoded and, beyond the memory
    /// budget (`--max-memory`), spill to a RocksDB store on disk; the
    /// decoded batches are in memory, so that grows with the batch's records. Put partition-local operators (`filter`,
    /// `map`, `flat_map`) before it to shrink what it gathers.
    pub fn join<W: Data>(&self, other: &DStream<(K, W)>) -> DStream<(K, (V, W))> {
        self.binary("join", other, |left, right, ctx| {
            join_batches(ctx, left, right, |key, value, matches, out| {
                for other_value in matches {
                    out.push((key.clone(), (value.clone(), other_value.clone())));
                }
            })
        })
    }

    /// Like [`DStream::join`], keeping values of this stream without a match (with `None`).
    pub fn left_outer_join<W: Data>(&self, other: &DStream<(K, W)>) -> DStream<(K, (V, Option<W>))> {
        self.binary("left_outer_join", other, |left, right, ctx| {
            join_batches(ctx, left, right, |key, value, matches, out| {
                if matches.is_empty() {
                    out.push((key.clone(), (value.clone(), None)));
                }
                for other_value in matches {
                    out.push((key.clone(), (value.clone(), Some(other_value.clone()))));
                }
            })
        })
    }
}

impl<T: Data> DStream<T> {
    /// Renames the kind recorded for this stream's operator (for composites
    /// whose last node should read as the whole operation).
    pub(crate) fn rename_kind(self, kind: &'static str) -> Self {
        if let Some(meta) = self.builder.borrow_mut().metas.get_mut(self.id) {
            meta.kind = kind;
        }
        self
    }
}

/// Partitions both sides by key, then in each partition probes a map of the
/// right side with every left record; `emit` writes the output records.
fn join_batches<K: Key, V: Data, W: Data, U: Data, E>(
    ctx: &StepCtx<'_>,
    left: Batch<(K, V)>,
    right: Batch<(K, W)>,
    emit: E,
) -> Result<Batch<U>, DStreamError>
where
    E: Fn(&K, &V, &[W], &mut Vec<U>) + Sync,
{
    let partitions = ctx.partitions;
    let left = partition_records(ctx, left.into_partitions(), partitions)?;
    let right = partition_records(ctx, right.into_partitions(), partitions)?;
    let pairs: Vec<_> = left.into_iter().zip(right).collect();
    let out = ctx.par(pairs, |(left, right)| {
        let mut by_key: FxHashMap<K, Vec<W>> = map_with_capacity(right.len());
        for (key, value) in right {
            by_key.entry(key).or_default().push(value);
        }
        let mut out = Vec::with_capacity(left.len());
        for (key, value) in &left {
            let matches = by_key.get(key).map_or(&[][..], Vec::as_slice);
            emit(key, value, matches, &mut out);
        }
        out
    })?;
    Ok(Batch::new(out))
}
