//! Hash-partitioned shuffles and the key-value transformations built on them.
//!
//! A shuffle combines each input partition locally first (one hash-map probe
//! per record, like Spark's map-side combine), then splits the combined
//! entries by key partition and merges them per output partition, both
//! phases partition-parallel. Per-record work is one hash and one probe; the
//! split costs one hash per distinct key, not per record.

use std::any::Any;
use std::hash::BuildHasher;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::arrival::{ArrivalStage, ArrivalStep, Delivered, JoinFn, KeyedMerge};
use crate::batch::{Batch, Data, Key};
use crate::combined::Combined;
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, KeyHashState, map_with_capacity, partition_of, split_by_key};
use crate::keyed::EncodedKeys;
use crate::node::{Node, NodeMeta, Slot, StepCtx};
use crate::stream::DStream;
use hashbrown::HashTable;
use spate_core::CoreError;

/// Moves every entry of `maps` (one per input partition) into the bucket of
/// its key's partition; returns the buckets grouped by output partition.
/// Entries bound for one output partition, one bucket per input partition.
type Buckets<K, C> = Vec<Vec<(K, C)>>;

fn split_by_partition<K: Key, C: Send>(
    ctx: &StepCtx<'_>,
    maps: Vec<Combined<K, C>>,
    partitions: usize,
) -> Result<Vec<Buckets<K, C>>, DStreamError> {
    let split = ctx.par(maps, |map| split_by_key(map, partitions, |(key, _)| key))?;
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
) -> Result<Vec<Combined<K, C>>, DStreamError>
where
    K: Key,
    V: Send,
    C: Send,
    CF: Fn(V) -> C + Sync,
    MV: Fn(&mut C, V) + Sync,
    MC: Fn(&mut C, C) + Sync,
{
    let local = ctx.par(parts, |part| combine_locally(part, 64, create, merge_value))?;
    merge_partitioned(ctx, local, partitions, merge_combiners)
}

/// One partition's values combined by key (the map-side combine).
fn combine_locally<K: Key, V, C>(
    part: Vec<(K, V)>,
    capacity: usize,
    create: &(impl Fn(V) -> C + ?Sized),
    merge_value: &impl Fn(&mut C, V),
) -> Combined<K, C> {
    let mut combined = Combined::with_capacity(capacity);
    combined.fold(part, create, merge_value);
    combined
}

/// The partitions' combined maps `local`, in partition order, merged by
/// key into `partitions` hash-partitioned maps.
fn merge_partitioned<K: Key, C: Send, M>(
    ctx: &StepCtx<'_>,
    local: Vec<Combined<K, C>>,
    partitions: usize,
    merge_combiners: &M,
) -> Result<Vec<Combined<K, C>>, DStreamError>
where
    M: Fn(&mut C, C) + Sync + ?Sized,
{
    let by_output = split_by_partition(ctx, local, partitions)?;
    ctx.par(by_output, |buckets| {
        // Room for the largest bucket's keys, which the merged map holds
        // at least, not for every bucket's: the blocks of a batch repeat
        // most of their keys (a million keys in blocks of a few hundred
        // thousand), and room for the sum held several times the map.
        let largest = buckets.iter().map(Vec::len).max().unwrap_or(0);
        let mut merged = Combined::with_capacity(largest);
        merged.fold(buckets.into_iter().flatten(), |combiner| combiner, merge_combiners);
        merged
    })
}

/// The [`Node`] methods of a per-key aggregate whose `combine` field (a
/// [`KeyedCombine`]) runs on arrival: they hand out its stage or step and
/// give it the delivered maps.
macro_rules! combines_on_arrival {
    () => {
        fn arrival_stage(
            &self,
            operator: &str,
        ) -> Option<(Box<dyn std::any::Any>, std::sync::Arc<crate::arrival::Delivered>)> {
            Some(self.combine.arrival_stage(operator))
        }

        fn arrival_step(&self, operator: &str) -> Option<crate::arrival::ArrivalStep> {
            Some(self.combine.arrival_step(operator))
        }

        fn take_delivered(&mut self, delivered: std::sync::Arc<crate::arrival::Delivered>) {
            self.combine.take_delivered(delivered);
        }
    };
}
pub(crate) use combines_on_arrival;

type LocalFn<K, V, C> = dyn Fn(Vec<(K, V)>) -> Combined<K, C> + Send + Sync;
type CreateFn<V, C> = dyn Fn(V) -> C + Send + Sync;
pub(crate) type MergeFn<C> = dyn Fn(&mut C, C) + Send + Sync;

/// The blocks of a per-key aggregate combined on arrival, handed over to
/// the only reader of its result (a window over `reduce_by_key`'s
/// result): the reader merges the blocks itself, into its own keyed
/// state, so the batch's keys are not merged into a table of their own
/// first and then looked up again (see `Node::take_combined`). Each block
/// comes as a [`SplitBlock`].
pub(crate) struct CombinedBlocks<K, C> {
    pub(crate) delivered: Arc<Delivered>,
    pub(crate) merge: Arc<MergeFn<C>>,
    /// Where the reader may set how a block's keys are looked up in its
    /// state as the block arrives.
    pub(crate) resolve_ahead: Arc<OnceLock<Arc<dyn ResolveAhead>>>,
    /// The blocks hold the keys of the aggregate's `K`, encoded.
    keys: PhantomData<fn() -> K>,
}

/// A handed-over reader's lookup of a block's keys in its own keyed
/// state, run on the thread that split the block, while the batch
/// interval is still open: the batch then finds its keys' ids instead of
/// looking a million keys up. The ids are held in the reader's state (a
/// key whose id is held is not freed) until the batch takes them or they
/// are released.
pub(crate) trait ResolveAhead: Send + Sync {
    /// The ids of `keys` (one list a partition), held; `None` when the
    /// state cannot take them yet (before its first batch) or a key
    /// failed: the batch looks the keys up itself then.
    fn resolve(&self, keys: &[&EncodedKeys]) -> Option<ResolvedKeys>;

    /// Lets go of ids no batch will take.
    fn release(&self, resolved: ResolvedKeys);
}

/// A block's keys as ids of its reader's state, one list a partition,
/// valid while the state's `generation` is the same.
#[derive(Debug)]
pub(crate) struct ResolvedKeys {
    pub(crate) generation: u64,
    pub(crate) ids: Vec<Vec<u32>>,
}

/// A block's combined values split by partition with their keys encoded,
/// as a handed-over aggregate delivers them (see [`CombinedBlocks`]). The
/// split runs on the thread that processed the block, right after its
/// values were combined: the keys' bytes are read while in cache, the keys
/// are freed by the thread that made them, and the reader looks the keys
/// up from one buffer a partition without reading the keys themselves,
/// there and then when it takes that ([`ResolveAhead`]), else in the batch.
pub(crate) struct SplitBlock<C> {
    /// Keys and values, one pair a partition; or why a key did not encode.
    pub(crate) parts: Result<Vec<(EncodedKeys, Vec<C>)>, CoreError>,
    /// The keys' ids in the reader's state, when it looked them up on arrival.
    pub(crate) resolved: Option<ResolvedKeys>,
}

impl<C> SplitBlock<C> {
    fn empty(partitions: usize) -> Self {
        let parts = Ok((0..partitions).map(|_| (EncodedKeys::default(), Vec::new())).collect());
        SplitBlock { parts, resolved: None }
    }

    /// Has the reader look the keys up, if it takes that.
    fn resolve(&mut self, reader: Option<&Arc<dyn ResolveAhead>>) {
        if let (Some(reader), Ok(parts)) = (reader, &self.parts) {
            let keys: Vec<&EncodedKeys> = parts.iter().map(|(keys, _)| keys).collect();
            self.resolved = reader.resolve(&keys);
        }
    }

    /// Each key's entry goes to its partition, `combiner` of its value
    /// (each key once for a combined table, as many times as it came for
    /// records split as they are).
    fn split<K: Key, V>(
        entries: impl IntoIterator<Item = (K, V)>,
        partitions: usize,
        combiner: impl Fn(V) -> C,
    ) -> Self {
        let mut block = SplitBlock::empty(partitions);
        if let Ok(parts) = &mut block.parts {
            for (key, value) in entries {
                let Some((keys, values)) = parts.get_mut(partition_of(&key, partitions)) else { continue };
                if let Err(e) = keys.push(&key) {
                    return SplitBlock { parts: Err(e), resolved: None };
                }
                values.push(combiner(value));
            }
        }
        block
    }

    /// This block's entries, then `next`'s; their ids too when `reader`
    /// gave both, else neither's (released).
    fn then(self, next: SplitBlock<C>, reader: Option<&Arc<dyn ResolveAhead>>) -> Self {
        let parts = self.parts.and_then(|mut parts| {
            for ((keys, values), (more_keys, more_values)) in parts.iter_mut().zip(next.parts?) {
                keys.append(&more_keys)?;
                values.extend(more_values);
            }
            Ok(parts)
        });
        let resolved = match (self.resolved, next.resolved) {
            (Some(mut first), Some(second)) if first.generation == second.generation && parts.is_ok() => {
                for (ids, more) in first.ids.iter_mut().zip(second.ids) {
                    ids.extend(more);
                }
                Some(first)
            }
            (first, second) => {
                release(first.into_iter().chain(second), reader);
                None
            }
        };
        SplitBlock { parts, resolved }
    }

    /// `next`, the block after this one, merged into it by key: a key of
    /// both keeps this block's place, its value this block's merged with
    /// `next`'s, so the reader's result is the one it makes of the two
    /// blocks, and the block holds each key once. Ids held for a key of
    /// both are let go once; when the two were not both looked up in one
    /// generation of the reader's state, neither keeps its ids (the batch
    /// looks the keys up).
    fn merged(self, next: SplitBlock<C>, merge: &MergeFn<C>, reader: Option<&Arc<dyn ResolveAhead>>) -> Self {
        let (mut parts, more) = match (self.parts, next.parts) {
            (Ok(parts), Ok(more)) if parts.len() == more.len() => (parts, more),
            // A key that did not encode, which the batch reports.
            (parts, more) => {
                let first = SplitBlock { parts, resolved: self.resolved };
                return first.then(SplitBlock { parts: more, resolved: next.resolved }, reader);
            }
        };
        let resolved = match (self.resolved, next.resolved) {
            (Some(first), Some(second)) if first.generation == second.generation => Some((first, second)),
            (first, second) => {
                release(first.into_iter().chain(second), reader);
                None
            }
        };
        let (mut ids, more_ids, generation) = match resolved {
            Some((first, second)) => (Some(first.ids), Some(second.ids), first.generation),
            None => (None, None, 0),
        };
        let mut let_go = Vec::with_capacity(parts.len());
        for (index, (part, (more_keys, more_values))) in parts.iter_mut().zip(more).enumerate() {
            let part_ids = ids.as_mut().and_then(|ids| ids.get_mut(index));
            let more_part_ids = more_ids.as_ref().and_then(|ids| ids.get(index)).map(Vec::as_slice);
            match merge_part(part, part_ids, (&more_keys, more_values, more_part_ids), merge) {
                Ok(duplicates) => let_go.push(duplicates),
                Err(e) => {
                    // This partition and the ones after are as they were.
                    let unmerged = more_ids.map(|ids| ids.into_iter().skip(index));
                    let more_held = unmerged.map(|rest| let_go.into_iter().chain(rest).collect());
                    release(ids.map(|ids| ResolvedKeys { generation, ids }), reader);
                    release(more_held.map(|ids| ResolvedKeys { generation, ids }), reader);
                    return SplitBlock { parts: Err(e), resolved: None };
                }
            }
        }
        release(more_ids.map(|_| ResolvedKeys { generation, ids: let_go }), reader);
        SplitBlock { parts: Ok(parts), resolved: ids.map(|ids| ResolvedKeys { generation, ids }) }
    }

    fn memory_bytes(&self) -> u64 {
        let parts = self.parts.as_ref().map_or(0, |parts| {
            parts.iter().map(|(keys, values)| keys.memory_bytes() + values.capacity() * std::mem::size_of::<C>()).sum()
        });
        let ids = self.resolved.as_ref().map_or(0, |r| r.ids.iter().map(|ids| ids.capacity() * 4).sum());
        (parts + ids) as u64
    }
}

/// Lets go of the ids of each of `resolved`.
fn release(resolved: impl IntoIterator<Item = ResolvedKeys>, reader: Option<&Arc<dyn ResolveAhead>>) {
    for resolved in resolved {
        if let Some(reader) = reader {
            reader.release(resolved);
        }
    }
}

/// One partition of the next block (keys, values and ids when looked up)
/// merged into `part` by key, as [`SplitBlock::merged`] does; returns the
/// ids of the next block's keys `part` already had, for letting go. An
/// error (more keys than a block can hold) leaves `part` as it was.
fn merge_part<C>(
    part: &mut (EncodedKeys, Vec<C>),
    mut ids: Option<&mut Vec<u32>>,
    (more_keys, more_values, more_ids): (&EncodedKeys, Vec<C>, Option<&[u32]>),
    merge: &MergeFn<C>,
) -> Result<Vec<u32>, CoreError> {
    let (keys, values) = part;
    keys.room_for(more_keys)?;
    let hasher = KeyHashState::default();
    let hash_at = |keys: &EncodedKeys, index: u32| hasher.hash_one(keys.get(index as usize).unwrap_or_default());
    let mut at: HashTable<u32> = HashTable::with_capacity(keys.len() + more_keys.len());
    for index in 0..keys.len() as u32 {
        at.insert_unique(hash_at(keys, index), index, |&known| hash_at(keys, known));
    }
    let mut duplicates = Vec::new();
    for (offset, (key, value)) in more_keys.iter().zip(more_values).enumerate() {
        let hash = hasher.hash_one(key);
        let id = more_ids.and_then(|ids| ids.get(offset)).copied();
        match at.find(hash, |&known| keys.get(known as usize) == Some(key)) {
            Some(&known) => {
                if let Some(value_before) = values.get_mut(known as usize) {
                    merge(value_before, value);
                }
                duplicates.extend(id);
            }
            None => {
                let index = u32::try_from(keys.len())
                    .map_err(|_| CoreError::Encode { reason: "more than 4 G keys in one block".into() })?;
                keys.push_encoded(key)?;
                values.push(value);
                if let (Some(ids), Some(id)) = (ids.as_deref_mut(), id) {
                    ids.push(id);
                }
                at.insert_unique(hash, index, |&known| hash_at(keys, known));
            }
        }
    }
    Ok(duplicates)
}

/// A block of records split by partition for a handed-over reader, combined
/// by key first when [`CombineAdvice`] says that pays.
fn split_block<K: Key, V, C>(
    records: Vec<(K, V)>,
    partitions: usize,
    local: &LocalFn<K, V, C>,
    create: &CreateFn<V, C>,
    advice: &CombineAdvice,
) -> SplitBlock<C> {
    if !advice.combine_next() {
        return SplitBlock::split(records, partitions, create);
    }
    let count = records.len();
    let map = local(records);
    advice.combined(count, map.len());
    SplitBlock::split(map, partitions, |combiner| combiner)
}

/// Whether to combine a block's records by key before splitting them for
/// a reader that merges by key itself. Combining a block whose keys are
/// nearly all distinct (a million keys, blocks of a hundred thousand
/// words) builds a table that shrinks nothing and costs its thread as much
/// as the split; the reader merges the same keys anyway. Blocks of such a
/// stream are split as they come, each value a combiner, and every
/// `PROBE_EVERY`-th block is combined again to see whether that still holds.
#[derive(Default)]
struct CombineAdvice {
    /// Blocks seen so far.
    blocks: AtomicUsize,
    /// Distinct keys per thousand records in the block combined last.
    distinct_permille: AtomicUsize,
}

impl CombineAdvice {
    /// Above this share of distinct keys (per thousand), a block is split
    /// without combining (the threshold adaptive partial aggregation uses
    /// elsewhere: Trino skips its partial aggregation above 80%).
    const SKIP_ABOVE_PERMILLE: usize = 800;
    const PROBE_EVERY: usize = 16;

    fn combine_next(&self) -> bool {
        let block = self.blocks.fetch_add(1, Ordering::Relaxed);
        block.is_multiple_of(Self::PROBE_EVERY) || self.pays()
    }

    /// Whether the last block combined shrank enough for combining (and
    /// merging blocks by key) to pay.
    fn pays(&self) -> bool {
        self.distinct_permille.load(Ordering::Relaxed) <= Self::SKIP_ABOVE_PERMILLE
    }

    fn combined(&self, records: usize, keys: usize) {
        let permille = keys.saturating_mul(1000).checked_div(records).unwrap_or(0);
        self.distinct_permille.store(permille, Ordering::Relaxed);
    }
}

/// The blocks' results delivered to `delivered` for the batch of `ctx`,
/// each a `T` (a [`Combined`] table, or a [`SplitBlock`] once handed over).
pub(crate) fn take_combined<T: 'static>(ctx: &StepCtx<'_>, delivered: &Delivered) -> Result<Vec<T>, DStreamError> {
    let mut blocks = Vec::new();
    for part in delivered.take(ctx.time) {
        let block = part.downcast::<T>().map_err(|_| DStreamError::Internal {
            operator: ctx.operator.to_string(),
            reason: "combined values of another type were delivered".into(),
        })?;
        blocks.push(*block);
    }
    Ok(blocks)
}

/// A combined table's estimated size: its entries' own size and a control
/// byte each (what a key points to, a string's bytes, is not counted).
fn combined_bytes<K, C>(map: &Combined<K, C>) -> u64 {
    (map.len() * (std::mem::size_of::<(K, C)>() + 1)) as u64
}

/// The per-key aggregation a keyed operator starts each batch with: every
/// partition's values combined by key, then merged by key into
/// hash-partitioned maps. Its first half can run on each block as it
/// arrives (see [`crate::arrival`]): the operator then takes the blocks'
/// combined maps in place of combining their records, and holds one entry
/// per key of a block rather than its records until the batch ends.
pub(crate) struct KeyedCombine<K, V, C> {
    local: Arc<LocalFn<K, V, C>>,
    create: Arc<CreateFn<V, C>>,
    /// Whether a block split for a handed-over reader is combined first.
    advice: Arc<CombineAdvice>,
    merge: Arc<MergeFn<C>>,
    delivered: Option<Arc<Delivered>>,
    /// Set to the graph's partition count once its blocks are handed over:
    /// each block's table is then split by partition, keys encoded, on the
    /// thread that processed the block (see [`SplitBlock`]).
    split_for: Arc<OnceLock<usize>>,
    /// Set by a handed-over reader that looks the keys up on arrival.
    resolve_ahead: Arc<OnceLock<Arc<dyn ResolveAhead>>>,
}

impl<K: Key, V: Data, C: Data> KeyedCombine<K, V, C> {
    /// `create` makes a combiner from a key's first value, `merge_value`
    /// adds a value, `merge_combiners` merges two combiners.
    pub(crate) fn new(
        create: impl Fn(V) -> C + Send + Sync + 'static,
        merge_value: impl Fn(&mut C, V) + Send + Sync + 'static,
        merge_combiners: impl Fn(&mut C, C) + Send + Sync + 'static,
    ) -> Self {
        // Blocks of one stream have about as many keys as the one before:
        // sized for those, a block's table is not grown a dozen times over.
        let keys_last_time = AtomicUsize::new(0);
        let create: Arc<CreateFn<V, C>> = Arc::new(create);
        let create_locally = Arc::clone(&create);
        let local = move |part: Vec<(K, V)>| {
            let capacity = keys_last_time.load(Ordering::Relaxed).min(part.len());
            let combined = combine_locally(part, capacity, &*create_locally, &merge_value);
            keys_last_time.store(combined.len(), Ordering::Relaxed);
            combined
        };
        KeyedCombine {
            local: Arc::new(local),
            create,
            advice: Arc::new(CombineAdvice::default()),
            merge: Arc::new(merge_combiners),
            delivered: None,
            split_for: Arc::new(OnceLock::new()),
            resolve_ahead: Arc::new(OnceLock::new()),
        }
    }

    /// The batch's values combined by key into `ctx.partitions`
    /// hash-partitioned maps: the combined maps delivered for blocks
    /// processed on arrival first, then the partitions of `batch`.
    pub(crate) fn partitioned(
        &self,
        ctx: &StepCtx<'_>,
        batch: Option<Batch<(K, V)>>,
    ) -> Result<Vec<Combined<K, C>>, DStreamError> {
        let mut local = match &self.delivered {
            Some(delivered) => take_combined(ctx, delivered)?,
            None => Vec::new(),
        };
        if let Some(batch) = batch {
            let combine = &*self.local;
            local.extend(ctx.par(batch.into_partitions(), combine)?);
        }
        merge_partitioned(ctx, local, ctx.partitions, &*self.merge)
    }

    /// The map-side combine as the last step of an arrival chain; chunks'
    /// maps join by merging in order.
    pub(crate) fn arrival_step(&self, operator: &str) -> ArrivalStep {
        let (local, split_for) = (Arc::clone(&self.local), Arc::clone(&self.split_for));
        let (create, advice) = (Arc::clone(&self.create), Arc::clone(&self.advice));
        let reader = Arc::clone(&self.resolve_ahead);
        let run = move |part: Box<dyn Any + Send>| match part.downcast::<Vec<(K, V)>>() {
            Ok(records) => {
                if let Some(&partitions) = split_for.get() {
                    let mut block = split_block(*records, partitions, &*local, &*create, &advice);
                    block.resolve(reader.get());
                    let bytes = block.memory_bytes();
                    return (Box::new(block) as Box<dyn Any + Send>, bytes);
                }
                let map = local(*records);
                let bytes = combined_bytes(&map);
                (Box::new(map) as Box<dyn Any + Send>, bytes)
            }
            // Not in a built graph; `partitioned` reports the mismatch.
            Err(other) => (other, 0),
        };
        let (merge, split_for) = (Arc::clone(&self.merge), Arc::clone(&self.split_for));
        let reader = Arc::clone(&self.resolve_ahead);
        let join = move |parts: Vec<Box<dyn Any + Send>>| {
            if let Some(&partitions) = split_for.get() {
                // The reader merges by key; chunks' blocks need only follow each other.
                let mut blocks = parts.into_iter().filter_map(|part| part.downcast::<SplitBlock<C>>().ok());
                let first = blocks.next().map_or_else(|| SplitBlock::empty(partitions), |first| *first);
                let all = blocks.fold(first, |all, block| all.then(*block, reader.get()));
                return Box::new(all) as Box<dyn Any + Send>;
            }
            let mut maps = parts.into_iter().filter_map(|part| part.downcast::<Combined<K, C>>().ok());
            let mut all = maps.next().map(|first| *first).unwrap_or_default();
            all.fold(maps.flat_map(|map| *map), |combiner| combiner, &*merge);
            Box::new(all) as Box<dyn Any + Send>
        };
        let join: Arc<JoinFn> = Arc::new(join);
        let (split_for, advice) = (Arc::clone(&self.split_for), Arc::clone(&self.advice));
        let (merge, reader) = (Arc::clone(&self.merge), Arc::clone(&self.resolve_ahead));
        let merge_join = Arc::clone(&join);
        let keyed_merge = KeyedMerge {
            // Split blocks whose keys are nearly all distinct are left
            // uncombined, and would shrink nothing merged.
            applies: Box::new(move || split_for.get().is_none() || advice.pays()),
            merge: Box::new(move |first, then| match (first.downcast::<SplitBlock<C>>(), then) {
                (Ok(first), then) => match then.downcast::<SplitBlock<C>>() {
                    Ok(then) => {
                        let block = first.merged(*then, &*merge, reader.get());
                        let bytes = block.memory_bytes();
                        (Box::new(block), bytes)
                    }
                    // Not in a built graph; the reader reports the mismatch.
                    Err(then) => (merge_join(vec![first, then]), 0),
                },
                (Err(first), then) => {
                    let all = merge_join(vec![first, then]);
                    let bytes = all.downcast_ref::<Combined<K, C>>().map_or(0, combined_bytes);
                    (all, bytes)
                }
            }),
        };
        let delivered = Arc::new(Delivered::default());
        ArrivalStep::from_parts(operator, Arc::new(run), join, true, delivered).with_keyed_merge(keyed_merge)
    }

    /// The map-side combine as the whole arrival stage, for an aggregate
    /// that reads a fed input directly.
    pub(crate) fn arrival_stage(&self, operator: &str) -> (Box<dyn Any>, Arc<Delivered>) {
        let step = self.arrival_step(operator);
        let delivered = Arc::clone(&step.delivered);
        (Box::new(ArrivalStage::<(K, V)>::from_step(&step)), delivered)
    }

    /// True when maps combined on arrival are delivered to it.
    pub(crate) fn combines_on_arrival(&self) -> bool {
        self.delivered.is_some()
    }

    /// Its blocks combined on arrival and how it merges them, for the
    /// only reader of its result to merge itself; `None` when no block is
    /// combined on arrival.
    pub(crate) fn hand_over(&self) -> Option<CombinedBlocks<K, C>> {
        let delivered = Arc::clone(self.delivered.as_ref()?);
        let resolve_ahead = Arc::clone(&self.resolve_ahead);
        Some(CombinedBlocks { delivered, merge: Arc::clone(&self.merge), resolve_ahead, keys: PhantomData })
    }

    /// Its blocks combined on arrival were handed over to a reader of a
    /// graph of `partitions` partitions: from now on each block's table is
    /// split for it on arrival, and it combines only the records of its
    /// input batches.
    pub(crate) fn handed_over(&mut self, partitions: usize) {
        self.delivered = None;
        // Set once, when the graph is built.
        let _ = self.split_for.set(partitions);
    }

    /// From now on, takes the combined maps delivered to `delivered`.
    pub(crate) fn take_delivered(&mut self, delivered: Arc<Delivered>) {
        self.delivered = Some(delivered);
    }
}

impl<K: Key, V: Data> KeyedCombine<K, V, V> {
    /// Each key's values reduced with `reduce`.
    pub(crate) fn reducing<R: Fn(&V, &V) -> V + Send + Sync + 'static>(reduce: Arc<R>) -> Self {
        let merge = move |acc: &mut V, value: V| *acc = reduce(acc, &value);
        let merge_value = merge.clone();
        KeyedCombine::new(|value| value, merge_value, merge)
    }
}

/// Moves each record to the partition of its key, keeping every record.
pub(crate) fn partition_records<K: Key, V: Data>(
    ctx: &StepCtx<'_>,
    parts: Vec<Vec<(K, V)>>,
    partitions: usize,
) -> Result<Vec<Vec<(K, V)>>, DStreamError> {
    let split = ctx.par(parts, |part| split_by_key(part, partitions, |(key, _)| key))?;
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
    maps: Vec<Combined<K, V>>,
) -> Result<Batch<(K, V)>, DStreamError> {
    Ok(Batch::new(ctx.par(maps, |map| map.into_iter().collect())?))
}

/// `reduce_by_key`, `combine_by_key`: the batch's values combined by key.
struct CombineNode<K, V, C> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<(K, C)>>,
    combine: KeyedCombine<K, V, C>,
}

impl<K: Key, V: Data, C: Data> Node for CombineNode<K, V, C> {
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let result = match ctx.take_owned(&self.input)? {
            Some(batch) => Some(maps_to_batch(ctx, self.combine.partitioned(ctx, Some(batch))?)?),
            None => None,
        };
        self.output.put(ctx.time, result);
        Ok(None)
    }

    combines_on_arrival!();

    fn combined_hand_over(&self) -> Option<Box<dyn Any>> {
        self.combine.hand_over().map(|blocks| Box::new(blocks) as Box<dyn Any>)
    }

    fn combined_handed_over(&mut self, partitions: usize) {
        self.combine.handed_over(partitions);
    }
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
    /// commutative `reduce`; the result is hash-partitioned by key. Right
    /// after a fed input (or a chain of partition-local operators from
    /// one), each block's values are reduced as the block arrives (see
    /// the `arrival` module).
    pub fn reduce_by_key<F>(&self, reduce: F) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        self.combining("reduce_by_key", KeyedCombine::reducing(Arc::new(reduce)))
    }

    /// Combines each key's values: `create` makes a combiner from the first
    /// value, `merge_value` adds a value, `merge_combiners` merges two
    /// combiners built in different partitions (or different blocks of
    /// one, when the values are combined as they arrive).
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
        self.combining("combine_by_key", KeyedCombine::new(create, merge_value, merge_combiners))
    }

    /// Adds a node whose result is the batch combined by key with `combine`.
    fn combining<C: Data>(&self, kind: &'static str, combine: KeyedCombine<K, V, C>) -> DStream<(K, C)> {
        let input = self.reader();
        let mut meta = NodeMeta::new(kind, vec![self.id], self.slide);
        meta.keys_partitioned = true;
        self.add_node(meta, |output| Box::new(CombineNode { input, output, combine }))
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
        let mut by_key: KeyHashMap<K, Vec<W>> = map_with_capacity(right.len());
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use spate_core::Time;

    use super::*;

    /// Each partition's keys with their values summed, whatever the split
    /// left repeated.
    fn summed(block: SplitBlock<u64>) -> Vec<BTreeMap<Vec<u8>, u64>> {
        let parts = block.parts.expect("the keys encode");
        parts
            .into_iter()
            .map(|(keys, values)| {
                let mut sums = BTreeMap::new();
                for (key, value) in keys.iter().zip(values) {
                    *sums.entry(key.to_vec()).or_insert(0) += value;
                }
                sums
            })
            .collect()
    }

    #[test]
    fn an_aggregate_merges_consecutive_blocks_by_key_in_order_split_or_not() {
        // Values kept in arrival order, so a merge out of order shows.
        let combine = KeyedCombine::<String, u64, Vec<u64>>::new(|v| vec![v], |c, v| c.push(v), |c, d| c.extend(d));
        let step = combine.arrival_step("collect");
        let stage = ArrivalStage::<(String, u64)>::from_step(&step);
        assert!(stage.merges_by_key());
        let pairs = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Vec<_>>();
        let first = stage.process(pairs(&[("a", 1), ("b", 2)]));
        let then = stage.process(pairs(&[("b", 3), ("c", 4), ("b", 5)]));
        let merged = stage.merge_by_key(first, then).expect("an aggregate's tables merge by key");
        assert_eq!(merged.records_in(), 5);
        assert_eq!(merged.estimated_bytes(), 3 * (std::mem::size_of::<(String, Vec<u64>)>() as u64 + 1), "b once");
        stage.deliver(Time::ZERO, vec![merged]);
        let mut parts = step.delivered.take(Time::ZERO);
        assert_eq!(parts.len(), 1);
        let map = parts.remove(0).downcast::<Combined<String, Vec<u64>>>().expect("one table of both blocks");
        let mut merged: Vec<(String, Vec<u64>)> = map.into_iter().collect();
        merged.sort();
        assert_eq!(merged, vec![("a".into(), vec![1]), ("b".into(), vec![2, 3, 5]), ("c".into(), vec![4])]);

        // Handed over: blocks split by partition, merged by key while their
        // keys repeat within a block.
        combine.split_for.set(2).unwrap();
        let one = stage.process(pairs(&[("a", 1), ("a", 2), ("b", 3), ("a", 4)]));
        assert!(stage.merges_by_key(), "split blocks whose keys repeat merge too");
        let two = stage.process(pairs(&[("b", 5), ("c", 6), ("b", 7), ("b", 8)]));
        let merged = stage.merge_by_key(one, two).expect("split blocks merge by key");
        assert_eq!(merged.records_in(), 8);
        stage.deliver(Time::ZERO, vec![merged]);
        let mut parts = step.delivered.take(Time::ZERO);
        assert_eq!(parts.len(), 1);
        let block = parts.remove(0).downcast::<SplitBlock<Vec<u64>>>().expect("one split block of both");
        let entries: Vec<(Vec<u8>, Vec<u64>)> = block
            .parts
            .expect("the keys encode")
            .into_iter()
            .flat_map(|(keys, values)| keys.iter().map(<[u8]>::to_vec).zip(values).collect::<Vec<_>>())
            .collect();
        let encoded = |word: &str| {
            let mut keys = EncodedKeys::default();
            keys.push(&word.to_string()).unwrap();
            keys.iter().next().unwrap().to_vec()
        };
        let expected = [("a", vec![1, 2, 4]), ("b", vec![3, 5, 7, 8]), ("c", vec![6])].map(|(w, v)| (encoded(w), v));
        assert_eq!(entries.len(), 3, "each key once: {entries:?}");
        assert_eq!(entries.into_iter().collect::<BTreeMap<_, _>>(), BTreeMap::from(expected));
        stage.process(pairs(&[("x", 1), ("y", 2), ("z", 3)]));
        assert!(!stage.merges_by_key(), "blocks of distinct keys are left apart");
        let (one, two) = (stage.process(pairs(&[("a", 1)])), stage.process(pairs(&[("a", 2)])));
        assert!(stage.merge_by_key(one, two).is_err());
        let map_stage = ArrivalStage::new("double", Arc::new(|v: Vec<u64>| v), None, true, Arc::default());
        assert!(!map_stage.merges_by_key(), "a record-wise stage's blocks are partitions of the batch");
        let (one, two) = (map_stage.process(vec![1]), map_stage.process(vec![2]));
        assert!(map_stage.merge_by_key(one, two).is_err());
    }

    /// A reader that gives each key an id the first time it sees it and
    /// counts the holds on each.
    #[derive(Default)]
    struct CountingReader {
        ids: std::sync::Mutex<BTreeMap<Vec<u8>, u32>>,
        holds: std::sync::Mutex<BTreeMap<u32, i64>>,
    }

    impl ResolveAhead for CountingReader {
        fn resolve(&self, keys: &[&EncodedKeys]) -> Option<ResolvedKeys> {
            let (mut ids, mut holds) = (self.ids.lock().unwrap(), self.holds.lock().unwrap());
            let mut resolved = Vec::new();
            for part in keys {
                let part_ids: Vec<u32> = part
                    .iter()
                    .map(|key| {
                        let next = ids.len() as u32;
                        *ids.entry(key.to_vec()).or_insert(next)
                    })
                    .collect();
                part_ids.iter().for_each(|id| *holds.entry(*id).or_insert(0) += 1);
                resolved.push(part_ids);
            }
            Some(ResolvedKeys { generation: 7, ids: resolved })
        }

        fn release(&self, resolved: ResolvedKeys) {
            let mut holds = self.holds.lock().unwrap();
            resolved.ids.iter().flatten().for_each(|id| *holds.entry(*id).or_insert(0) -= 1);
        }
    }

    #[test]
    fn merged_split_blocks_hold_each_key_once_and_let_go_of_the_rest() {
        let combine = KeyedCombine::<String, u64, u64>::new(|v| v, |c, v| *c += v, |c, d| *c += d);
        let reader = Arc::new(CountingReader::default());
        combine.split_for.set(2).unwrap();
        assert!(combine.resolve_ahead.set(Arc::clone(&reader) as Arc<dyn ResolveAhead>).is_ok());
        let step = combine.arrival_step("count");
        let stage = ArrivalStage::<(String, u64)>::from_step(&step);
        let pairs = |words: &[&str]| words.iter().map(|w| (w.to_string(), 1)).collect::<Vec<_>>();
        let one = stage.process(pairs(&["a", "b", "a", "a"]));
        let two = stage.process(pairs(&["b", "c", "b", "b"]));
        // The holds by word (ids come in the order the keys are met).
        let holds = || {
            let (ids, holds) = (reader.ids.lock().unwrap(), reader.holds.lock().unwrap());
            let word = |key: &[u8]| String::from_utf8_lossy(&key[1..]).into_owned();
            ids.iter().map(|(key, id)| (word(key), holds[id])).collect::<Vec<(String, i64)>>()
        };
        let expect = |counts: [i64; 3]| ["a", "b", "c"].map(String::from).into_iter().zip(counts).collect::<Vec<_>>();
        assert_eq!(holds(), expect([1, 2, 1]), "a once, b in both blocks, c once");
        let merged = stage.merge_by_key(one, two).expect("split blocks merge by key");
        assert_eq!(holds(), expect([1, 1, 1]), "b's second hold let go");
        stage.deliver(Time::ZERO, vec![merged]);
        let block = step.delivered.take(Time::ZERO).remove(0).downcast::<SplitBlock<u64>>().unwrap();
        let resolved = block.resolved.expect("the merged block keeps its ids");
        let parts = block.parts.expect("the keys encode");
        for ((keys, values), ids) in parts.iter().zip(&resolved.ids) {
            assert_eq!((keys.len(), values.len()), (ids.len(), ids.len()), "an id a key");
            for (key, id) in keys.iter().zip(ids) {
                assert_eq!(reader.ids.lock().unwrap()[key], *id, "each key with its own id");
            }
        }
        reader.release(resolved);
        assert_eq!(holds(), expect([0, 0, 0]), "the batch lets go of every hold");
    }

    #[test]
    fn a_block_split_without_combining_merges_to_what_a_combined_one_does() {
        let records: Vec<(String, u64)> = (0..5_000u64).map(|n| (format!("w{}", n * 7 % 4_000), n)).collect();
        let create = |value: u64| value;
        let local = |part: Vec<(String, u64)>| combine_locally(part, 0, &create, &|sum: &mut u64, v| *sum += v);
        let combined = SplitBlock::split(local(records.clone()), 4, |sum| sum);
        let as_they_come = SplitBlock::split(records, 4, create);
        assert_eq!(summed(combined), summed(as_they_come));
    }

    #[test]
    fn blocks_of_distinct_keys_are_split_as_they_come_and_probed_again() {
        let advice = CombineAdvice::default();
        assert!(advice.combine_next(), "the first block is combined");
        advice.combined(1_000, 900);
        let skipped = (1..CombineAdvice::PROBE_EVERY).filter(|_| !advice.combine_next()).count();
        assert_eq!(skipped, CombineAdvice::PROBE_EVERY - 1);
        assert!(advice.combine_next(), "every sixteenth block is combined to probe");
        advice.combined(1_000, 100);
        assert!(advice.combine_next(), "a block that shrinks when combined is combined");
        advice.combined(0, 0);
        assert!(advice.combine_next(), "an empty block says combining pays");
    }
}
