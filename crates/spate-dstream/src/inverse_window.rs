//! The incremental window with an inverse function (Spark's
//! `ReducedWindowedDStream`), kept compact and snapshot by what changed.
//!
//! Each slide adds the batches that entered with `reduce` and subtracts the
//! batches that left with `inverse`, so a slide costs the batches moved, not
//! the whole window. The window keeps, per partition:
//!
//! - its keys once, encoded, in a [`KeyTable`] that names each by a dense id;
//! - the window's value per key, in an array indexed by id;
//! - each retained batch, reduced by key, as an [`EncodedSlice`] of
//!   `(id, value)`: a few bytes an entry;
//! - how many retained slices name each id, so that a key that left the
//!   window's result and every slice gives its id back.
//!
//! Over `reduce_by_key`'s blocks combined on arrival, a block's keys are
//! looked up in the partitions' key tables on the thread that split the
//! block, while the batch interval is still open: the batch finds their
//! ids rather than looking a million keys up itself. The ids stay held (a
//! key with a held id is not freed) until the batch has kept its slice.
//!
//! A snapshot is either whole (keys, values and slices) or what changed
//! since the previous one: the keys and values of the ids touched since,
//! and the slices that entered since. Both are per partition, in ids; a
//! restore onto another partition count re-keys once the chain is read.

use std::collections::VecDeque;
use std::io::{Read, SeekFrom};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use spate_core::sync::lock;
use spate_core::{
    CoreError, Duration, FrameCodec, PayloadSink, PayloadStream, ReadSeek, SeekWrite, Time, write_varint,
};

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, partition_of};
use crate::keyed::{ByteString, EncodedKeys, EncodedSlice, KeyTable, OwnedByteString};
use crate::node::{Node, Slot, StatefulNode, StepCtx};
use crate::pair::{
    CombinedBlocks, KeyedCombine, MergeFn, ResolveAhead, ResolvedKeys, SplitBlock, combines_on_arrival,
    partition_records, take_combined,
};
use crate::spill::{SpillPlace, StateSpill};
use crate::top_n::{Greatest, Listed, take_greatest};
use crate::window_slices::RetainedSlices;

/// Version 1 kept `(key, value)` pairs; version 2 is the compact form.
const INVERSE_WINDOW_STATE_VERSION: u16 = 2;

fn codec() -> FrameCodec {
    FrameCodec::new(INVERSE_WINDOW_STATE_VERSION).with_max_payload(1 << 30).with_max_decoded(4 << 30)
}

/// A set of ids, one bit each.
#[derive(Default)]
struct IdSet {
    words: Vec<u64>,
}

impl IdSet {
    fn insert(&mut self, id: u32) {
        let (word, bit) = ((id / 64) as usize, id % 64);
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        if let Some(w) = self.words.get_mut(word) {
            *w |= 1 << bit;
        }
    }

    fn take(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for (index, word) in std::mem::take(&mut self.words).into_iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let bit = bits.trailing_zeros();
                out.push(index as u32 * 64 + bit);
                bits &= bits - 1;
            }
        }
        out
    }
}

/// The window's values and its retained slices, as pairs by key.
type ByKey<K, V> = (Vec<(K, V)>, Vec<Vec<(K, V)>>);

/// The window's partitions, and how many times they were replaced or
/// restored: ids looked up on arrival are good for one generation.
struct Parts<K, V> {
    list: Vec<Part<K, V>>,
    generation: u64,
}

/// Looks a block's keys up in the window's partitions as the block
/// arrives (see [`ResolveAhead`]). A block that arrives while a batch
/// runs waits for the batch's step to end: its own batch is later, and
/// the driver never waits for a block's arrival while it holds the
/// partitions.
struct LookUpAhead<K, V>(Arc<Mutex<Parts<K, V>>>);

impl<K: Key, V: Data> ResolveAhead for LookUpAhead<K, V> {
    fn resolve(&self, keys: &[&EncodedKeys]) -> Option<ResolvedKeys> {
        let mut parts = lock(&self.0);
        if parts.list.len() != keys.len() {
            return None;
        }
        let mut ids = Vec::with_capacity(keys.len());
        for (part, keys) in parts.list.iter_mut().zip(keys) {
            match part.hold_ahead(keys) {
                Ok(part_ids) => ids.push(part_ids),
                Err(_) => {
                    // The batch meets the error again looking the keys up.
                    parts.list.iter_mut().zip(&ids).for_each(|(part, ids)| part.let_go(ids));
                    return None;
                }
            }
        }
        Some(ResolvedKeys { generation: parts.generation, ids })
    }

    fn release(&self, resolved: ResolvedKeys) {
        let mut parts = lock(&self.0);
        if parts.generation == resolved.generation {
            parts.list.iter_mut().zip(&resolved.ids).for_each(|(part, ids)| part.let_go(ids));
        }
    }
}

/// One partition of the window.
struct Part<K, V> {
    keys: KeyTable<K>,
    /// The window's value by id; `None`: the key is not in the result.
    current: Vec<Option<V>>,
    /// How many retained slices name each id.
    refs: Vec<u32>,
    /// One slice per retained batch, oldest first; beyond the budget on disk.
    retained: RetainedSlices,
    /// Ids whose key changed (given or freed) since the last snapshot.
    keys_changed: IdSet,
    /// Ids whose value changed since the last snapshot.
    values_changed: IdSet,
    /// How many of the newest retained slices entered since the last snapshot.
    fresh: usize,
    /// True after a restore, until `refs` is recounted from the slices:
    /// counted once, before the partition is next used, rather than after
    /// the whole snapshot and again after each file of changes.
    uncounted: bool,
}

impl<K, V> Default for Part<K, V> {
    fn default() -> Self {
        Part {
            keys: KeyTable::default(),
            current: Vec::new(),
            refs: Vec::new(),
            retained: RetainedSlices::default(),
            keys_changed: IdSet::default(),
            values_changed: IdSet::default(),
            fresh: 0,
            uncounted: false,
        }
    }
}

impl<K: Key, V: Data> Part<K, V> {
    /// Makes room for the ids the key table has given.
    fn grow(&mut self) {
        let bound = self.keys.id_bound();
        if self.current.len() < bound {
            self.current.resize_with(bound, || None);
            self.refs.resize(bound, 0);
        }
    }

    /// Keeps one batch, reduced by key (each key once), as a slice.
    fn ingest(&mut self, batch: impl ExactSizeIterator<Item = (K, V)>) -> Result<(), CoreError> {
        self.count_if_restored()?;
        let changed = &mut self.keys_changed;
        let entries = self.keys.insert_entries(batch, |id| changed.insert(id))?;
        self.keep_slice(entries)
    }

    /// Keeps one batch as a slice from its blocks' entries and then `rest`,
    /// a key's values merged with `merge` in the order they come. A block
    /// whose keys were looked up on arrival comes with their ids, held
    /// until now.
    fn ingest_blocks(
        &mut self,
        blocks: Vec<BlockPart<V>>,
        rest: Vec<(K, V)>,
        merge: &MergeFn<V>,
    ) -> Result<(), CoreError> {
        self.count_if_restored()?;
        // Each block's keys as ids, and whether they are held.
        let mut by_block: Vec<(Vec<u32>, bool, Vec<V>)> = Vec::with_capacity(blocks.len());
        for (keys, ids, values) in blocks {
            if let Some(ids) = ids {
                by_block.push((ids, true, values));
                continue;
            }
            by_block.push((self.look_up(&keys)?, false, values));
        }
        let changed = &mut self.keys_changed;
        let rest = self.keys.insert_entries(rest, |id| changed.insert(id))?;
        let len = by_block.iter().map(|(ids, _, _)| ids.len()).sum::<usize>() + rest.len();
        let entries = by_block
            .iter_mut()
            .flat_map(|(ids, _, values)| ids.iter().copied().zip(std::mem::take(values)))
            .chain(rest);
        if dense_merge_pays::<V>(len, self.keys.id_bound()) {
            let by_id = merged_in_place(entries, self.keys.id_bound(), merge);
            self.keep_slice_by_id(&by_id)?;
        } else {
            self.keep_slice(merged_by_id(entries.collect(), merge))?;
        }
        // The slice names them now.
        for (ids, held, _) in &by_block {
            if *held {
                self.let_go(ids);
            }
        }
        Ok(())
    }

    /// The ids of `keys`, given to those new, each held (not freed) until
    /// [`Part::let_go`]: a block's keys looked up as it arrives.
    fn hold_ahead(&mut self, keys: &EncodedKeys) -> Result<Vec<u32>, CoreError> {
        self.count_if_restored()?;
        let ids = self.look_up(keys)?;
        self.grow();
        for id in &ids {
            if let Some(count) = self.refs.get_mut(*id as usize) {
                *count += 1;
            }
        }
        Ok(ids)
    }

    /// The ids of `keys`, given to those new.
    fn look_up(&mut self, keys: &EncodedKeys) -> Result<Vec<u32>, CoreError> {
        let mut ids = Vec::with_capacity(keys.len());
        let changed = &mut self.keys_changed;
        self.keys.insert_many_encoded(keys, &mut ids, |id| changed.insert(id))?;
        Ok(ids)
    }

    /// Ends the holds [`Part::hold_ahead`] took on `ids`.
    fn let_go(&mut self, ids: &[u32]) {
        for id in ids {
            if let Some(count) = self.refs.get_mut(*id as usize) {
                *count = count.saturating_sub(1);
            }
        }
    }

    /// Keeps the values of `by_id` (a value or none by id) as the newest
    /// retained slice.
    fn keep_slice_by_id(&mut self, by_id: &[Option<V>]) -> Result<(), CoreError> {
        self.grow();
        let mut len = 0;
        for (count, value) in self.refs.iter_mut().zip(by_id) {
            if value.is_some() {
                *count += 1;
                len += 1;
            }
        }
        let entries = by_id.iter().enumerate().filter_map(|(id, value)| Some((id as u32, value.as_ref()?)));
        self.retained.push_back(EncodedSlice::encode_in_order(entries, len)?);
        self.fresh += 1;
        self.spill_if_over()
    }

    /// Moves slices to disk while the partition takes more than its share
    /// of the state budget (when it has one); see
    /// [`RetainedSlices::spill_beyond`] for which.
    fn spill_if_over(&mut self) -> Result<(), CoreError> {
        let other = self.keys.memory_bytes()
            + self.current.capacity() * std::mem::size_of::<Option<V>>()
            + self.refs.capacity() * std::mem::size_of::<u32>();
        self.retained.spill_beyond(other)
    }

    /// Keeps `entries` (each id once) as the newest retained slice.
    fn keep_slice(&mut self, mut entries: Vec<(u32, V)>) -> Result<(), CoreError> {
        self.grow();
        for (id, _) in &entries {
            if let Some(count) = self.refs.get_mut(*id as usize) {
                *count += 1;
            }
        }
        self.retained.push_back(EncodedSlice::encode(&mut entries)?);
        self.fresh += 1;
        self.spill_if_over()
    }

    /// One slide: subtracts the slices that leave (those that had been
    /// added), adds those that entered, drops the keys `keep` refuses and
    /// the ids nothing names any more, and returns the window's result
    /// (nothing when the result is not `wanted`).
    fn slide<R, I, P>(
        &mut self,
        plan: SlidePlan,
        reduce: &R,
        inverse: &I,
        keep: Option<&P>,
        listing: Listing<'_, K, V>,
    ) -> Result<Vec<(K, V)>, CoreError>
    where
        R: Fn(&V, &V) -> V,
        I: Fn(&V, &V) -> V,
        P: Fn(&K, &V) -> bool,
    {
        self.count_if_restored()?;
        for index in 0..plan.leaving {
            let Some(old) = self.retained.pop_front()? else { break };
            let subtract = index < plan.leaving_added;
            let (current, refs, changed) = (&mut self.current, &mut self.refs, &mut self.values_changed);
            old.for_each(|id, value: V| {
                if let Some(count) = refs.get_mut(id as usize) {
                    *count = count.saturating_sub(1);
                }
                // A key filtered out earlier has nothing to subtract from (as in Spark).
                if subtract && let Some(Some(existing)) = current.get_mut(id as usize) {
                    *existing = inverse(existing, &value);
                    changed.insert(id);
                }
            })?;
        }
        self.fresh = self.fresh.min(self.retained.len());
        let (current, changed) = (&mut self.current, &mut self.values_changed);
        self.retained.for_each_from(plan.first_entering, |entering| {
            entering.for_each(|id, value: V| {
                if let Some(slot) = current.get_mut(id as usize) {
                    *slot = Some(match slot.take() {
                        Some(existing) => reduce(&existing, &value),
                        None => value,
                    });
                    changed.insert(id);
                }
            })
        })?;
        self.retained.all_entered();
        self.settle(keep, listing)
    }

    /// Applies `keep`, frees unused ids, and lists the window's result as
    /// `listing` asks: a key is decoded only to be listed or tested.
    fn settle<P: Fn(&K, &V) -> bool>(
        &mut self,
        keep: Option<&P>,
        listing: Listing<'_, K, V>,
    ) -> Result<Vec<(K, V)>, CoreError> {
        let mut out = listing.map(|greatest| Listed::new(greatest, self.keys.len()));
        for index in 0..self.current.len() {
            let id = index as u32;
            if !self.keys.contains(id) {
                continue;
            }
            if let Some(slot) = self.current.get_mut(index)
                && let Some(value) = slot
            {
                if out.is_none() && keep.is_none() {
                    continue;
                }
                let key = self.keys.key(id)?.ok_or_else(|| CoreError::Decode { reason: "a key vanished".into() })?;
                if keep.is_none_or(|keep| keep(&key, value)) {
                    if let Some(out) = &mut out {
                        out.push((key, value.clone()));
                    }
                    continue;
                }
                *slot = None;
                self.values_changed.insert(id);
            }
            if self.refs.get(index).is_some_and(|refs| *refs == 0) {
                self.keys.remove(id);
                self.keys_changed.insert(id);
            }
        }
        Ok(out.map_or_else(Vec::new, Listed::into_vec))
    }

    /// The window's value and slices by key (for a re-partitioning and for
    /// reading a version 1 snapshot).
    fn entries(&self) -> Result<ByKey<K, V>, CoreError> {
        let mut current = Vec::with_capacity(self.keys.len());
        for (id, value) in self.current.iter().enumerate() {
            if let Some(value) = value
                && let Some(key) = self.keys.key(id as u32)?
            {
                current.push((key, value.clone()));
            }
        }
        let mut retained = Vec::with_capacity(self.retained.len());
        self.retained.for_each_from(0, |slice| {
            let mut ids = Vec::with_capacity(slice.len());
            slice.for_each(|id, value: V| ids.push((id, value)))?;
            let mut entries = Vec::with_capacity(ids.len());
            for (id, value) in ids {
                if let Some(key) = self.keys.key(id)? {
                    entries.push((key, value));
                }
            }
            retained.push(entries);
            Ok(())
        })?;
        Ok((current, retained))
    }

    /// Recounts the slices naming each id when a restore left them
    /// uncounted.
    fn count_if_restored(&mut self) -> Result<(), CoreError> {
        if self.uncounted {
            self.recount()?;
            self.uncounted = false;
        }
        Ok(())
    }

    /// Recounts the slices naming each id.
    fn recount(&mut self) -> Result<(), CoreError> {
        self.grow();
        self.refs.iter_mut().for_each(|count| *count = 0);
        let refs = &mut self.refs;
        self.retained.for_each_from(0, |slice| {
            slice.for_each(|id, _: V| {
                if let Some(count) = refs.get_mut(id as usize) {
                    *count += 1;
                }
            })
        })
    }

    /// Writes the whole partition as [`Part::read_whole`] reads it, a record
    /// at a time (the slices on disk read back one by one), and forgets
    /// what changed.
    fn write_whole(&mut self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        self.keys_changed.take();
        self.values_changed.take();
        self.fresh = 0;
        write_varint(self.keys.len() as u64, out.buffer());
        for (id, key) in self.keys.iter_encoded() {
            write_record(&(id, ByteString(key)), out)?;
        }
        let len = self.current.iter().filter(|value| value.is_some()).count();
        let values = self.current.iter().enumerate().filter_map(|(id, value)| Some((id as u32, value.as_ref()?)));
        write_record(&EncodedSlice::encode_in_order(values, len)?, out)?;
        write_varint(self.retained.len() as u64, out.buffer());
        self.retained.for_each_from(0, |slice| write_record(slice, out))
    }

    /// Writes what changed since the last snapshot as [`Part::apply_from`]
    /// reads it, a record at a time (the slices on disk read back one by
    /// one), and forgets it: the keys of the ids changed, their values, the
    /// slices that entered.
    fn write_changes(&mut self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        let ids = self.keys_changed.take();
        let keys: Vec<(u32, Option<ByteString<'_>>)> =
            ids.into_iter().map(|id| (id, self.keys.encoded(id).map(ByteString))).collect();
        write_record(&keys, out)?;
        let mut values: Vec<(u32, Option<&V>)> = self
            .values_changed
            .take()
            .into_iter()
            .map(|id| (id, self.current.get(id as usize).and_then(Option::as_ref)))
            .collect();
        write_record(&EncodedSlice::encode(&mut values)?, out)?;
        let from = self.retained.len() - self.fresh.min(self.retained.len());
        self.fresh = 0;
        write_varint((self.retained.len() - from) as u64, out.buffer());
        self.retained.for_each_from(from, |slice| write_record(slice, out))
    }

    /// Reads one partition's whole state as [`Part::write_whole`] wrote it,
    /// its slices going to disk beyond `spill`'s budget as they are read;
    /// the window retains `slices`.
    fn read_whole<R: Read>(
        payload: &mut PayloadStream<R>,
        spill: Option<(&SpillPlace, u64)>,
        slices: usize,
    ) -> Result<Self, CoreError> {
        let mut part = Part::default();
        if let Some((place, budget)) = spill {
            part.retained.use_spill(place.clone(), budget);
        }
        let keys = payload.count()?;
        part.keys.reserve(keys);
        for _ in 0..keys {
            let (id, OwnedByteString(key)): (u32, OwnedByteString) = payload.record()?;
            part.keys.insert_at(id, &key)?;
        }
        part.keys.rebuild_free();
        part.grow();
        let current = &mut part.current;
        payload.record::<EncodedSlice>()?.for_each(|id, value: V| {
            if let Some(slot) = current.get_mut(id as usize) {
                *slot = Some(value);
            }
        })?;
        if payload.count()? != slices as u64 {
            return Err(CoreError::Decode { reason: "a partition's slices and the window's times differ".to_string() });
        }
        for _ in 0..slices {
            part.retained.push_back(payload.record()?);
            part.spill_if_over()?;
        }
        part.uncounted = true;
        Ok(part)
    }

    /// Applies one partition's changes, read from `payload` as
    /// [`Part::write_changes`] wrote them, each slice that entered kept (or
    /// moved to disk) as it is read; the window retains `slices` after.
    fn apply_from<R: Read>(&mut self, payload: &mut PayloadStream<R>, slices: usize) -> Result<(), CoreError> {
        let keys: Vec<(u32, Option<OwnedByteString>)> = payload.record()?;
        // Every changed id is emptied before any is filled: a key that moved
        // to another id is then never under two at once.
        for (id, _) in &keys {
            self.keys.remove(*id);
        }
        for (id, key) in keys {
            if let Some(OwnedByteString(key)) = key {
                self.keys.insert_at(id, &key)?;
            }
        }
        self.keys.rebuild_free();
        self.grow();
        let current = &mut self.current;
        payload.record::<EncodedSlice>()?.for_each(|id, value: Option<V>| {
            if let Some(slot) = current.get_mut(id as usize) {
                *slot = value;
            }
        })?;
        let entered = usize::try_from(payload.count()?).unwrap_or(usize::MAX);
        self.retained.keep_newest(slices.saturating_sub(entered))?;
        for _ in 0..entered {
            self.retained.push_back(payload.record()?);
            self.spill_if_over()?;
        }
        self.uncounted = true;
        Ok(())
    }
}

/// True when merging `entries` values in an array indexed by id (of
/// `id_bound` slots) costs no more memory than a few copies of the
/// entries: a batch that names a good share of the window's keys, where
/// the array spares sorting them.
fn dense_merge_pays<V>(entries: usize, id_bound: usize) -> bool {
    id_bound.saturating_mul(std::mem::size_of::<Option<V>>())
        <= entries.saturating_mul(4 * std::mem::size_of::<(u32, V)>())
}

/// [`merged_by_id`] into an array of `id_bound` slots indexed by id, read
/// in id order (ids come from the key table: all below `id_bound`).
fn merged_in_place<V>(entries: impl Iterator<Item = (u32, V)>, id_bound: usize, merge: &MergeFn<V>) -> Vec<Option<V>> {
    let mut by_id: Vec<Option<V>> = Vec::new();
    by_id.resize_with(id_bound, || None);
    for (id, value) in entries {
        let Some(slot) = by_id.get_mut(id as usize) else { continue };
        match slot {
            Some(combined) => merge(combined, value),
            None => *slot = Some(value),
        }
    }
    by_id
}

/// `entries` with each id once, its values merged in the order they come.
fn merged_by_id<V>(mut entries: Vec<(u32, V)>, merge: &MergeFn<V>) -> Vec<(u32, V)> {
    // Stable: an id's values stay in the order they came.
    entries.sort_by_key(|(id, _)| *id);
    let mut merged: Vec<(u32, V)> = Vec::with_capacity(entries.len());
    for (id, value) in entries {
        match merged.last_mut() {
            Some((last, combined)) if *last == id => merge(combined, value),
            _ => merged.push((id, value)),
        }
    }
    merged
}

/// Appends `value` in the state codec's encoding as one record of `out`.
fn write_record<T: Serialize + ?Sized>(value: &T, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
    bincode::serde::encode_into_std_write(value, out.buffer(), bincode::config::standard())
        .map_err(|e| CoreError::Encode { reason: format!("a window snapshot: {e}") })?;
    out.record_end()
}

/// The snapshot version 1 wrote: pairs by key, partitions merged.
#[derive(Deserialize)]
struct SnapshotV1<K, V> {
    window_end: Option<Time>,
    times: VecDeque<Time>,
    current: Vec<(K, V)>,
    retained: Vec<Vec<(K, V)>>,
}

/// What a slide lists of the window's result: `None`, nothing (only
/// stateful operators read it, in a batch recomputed for state); else
/// every key it keeps, or only the greatest (see [`Listed`]).
type Listing<'a, K, V> = Option<Option<&'a Greatest<(K, V)>>>;

/// What a slide does to each partition: how many retained batches leave
/// (and how many of those had been added), and from which batch on to add.
#[derive(Clone, Copy)]
struct SlidePlan {
    leaving: usize,
    leaving_added: usize,
    first_entering: usize,
}

/// A window's function of two values: its reduce or its inverse.
pub(crate) trait ValueFn<V>: Fn(&V, &V) -> V + Send + Sync + 'static {}
impl<V, F: Fn(&V, &V) -> V + Send + Sync + 'static> ValueFn<V> for F {}

/// Whether a key stays in the window's result.
pub(crate) trait KeepFn<K, V>: Fn(&K, &V) -> bool + Send + Sync + 'static {}
impl<K, V, F: Fn(&K, &V) -> bool + Send + Sync + 'static> KeepFn<K, V> for F {}

/// What a user asks of an inverse window.
pub(crate) struct InverseWindow<R, I, P> {
    pub(crate) reduce: R,
    pub(crate) inverse: I,
    /// Which keys stay in the window's result (`None`: every key).
    pub(crate) keep: Option<P>,
    pub(crate) length: Duration,
    pub(crate) slide: Duration,
    /// The input is reduced by key and partitioned as the window is (it is
    /// a by-key combine's result): its batches need no combining again.
    pub(crate) input_reduced: bool,
}

pub(crate) struct InverseWindowNode<K, V, R, I, P> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<(K, V)>>,
    reduce: Arc<R>,
    /// Each batch reduced by key, on arrival where it can be.
    combine: KeyedCombine<K, V, V>,
    inverse: I,
    keep: Option<P>,
    length: Duration,
    slide: Duration,
    /// The input is reduced by key and partitioned as the window is (it is
    /// a by-key combine's result): its batches need no combining again.
    input_reduced: bool,
    /// The blocks its input's aggregate combined on arrival, when it took
    /// them over: it merges them into its slices itself.
    blocks: Option<CombinedBlocks<K, V>>,
    /// The end of the window `current` holds, once one was produced.
    window_end: Option<Time>,
    /// The times of the retained batches, oldest first (same in every partition).
    times: VecDeque<Time>,
    /// Shared with the threads that look a block's keys up on arrival.
    parts: Arc<Mutex<Parts<K, V>>>,
    /// The ids changed: the next snapshot must be whole.
    needs_whole: bool,
    /// Where partitions' slices go beyond their share of the state budget.
    spill: Option<SpillPlace>,
    /// The records its only reader keeps of each result (a `top_n`).
    greatest: Option<Greatest<(K, V)>>,
}

impl<K, V, R, I, P> InverseWindowNode<K, V, R, I, P>
where
    K: Key,
    V: Data,
    R: ValueFn<V>,
    I: ValueFn<V>,
    P: KeepFn<K, V>,
{
    pub(crate) fn new(input: Arc<Slot<(K, V)>>, output: Arc<Slot<(K, V)>>, spec: InverseWindow<R, I, P>) -> Self {
        let InverseWindow { reduce, inverse, keep, length, slide, input_reduced } = spec;
        let reduce = Arc::new(reduce);
        InverseWindowNode {
            input_reduced,
            blocks: None,
            input,
            output,
            combine: KeyedCombine::reducing(Arc::clone(&reduce)),
            reduce,
            inverse,
            keep,
            length,
            slide,
            window_end: None,
            times: VecDeque::new(),
            parts: Arc::new(Mutex::new(Parts { list: Vec::new(), generation: 0 })),
            needs_whole: false,
            spill: None,
            greatest: None,
        }
    }

    fn ingest(&mut self, ctx: &StepCtx<'_>, batch: Batch<(K, V)>) -> Result<(), DStreamError> {
        self.fit(ctx)?;
        let reduced =
            self.input_reduced && !self.combine.combines_on_arrival() && batch.num_partitions() == ctx.partitions;
        let mut parts = lock(&self.parts);
        let results = if let Some(blocks) = &self.blocks {
            let merge = &*blocks.merge;
            let by_part = blocks_with_batch(ctx, blocks, batch, parts.generation)?;
            let work: Vec<_> = parts.list.iter_mut().zip(by_part).collect();
            ctx.par(work, |(part, (blocks, rest))| part.ingest_blocks(blocks, rest, merge))?
        } else if reduced {
            let work: Vec<_> = parts.list.iter_mut().zip(batch.into_partitions()).collect();
            ctx.par(work, |(part, entries)| part.ingest(entries.into_iter()))?
        } else {
            let maps = self.combine.partitioned(ctx, Some(batch))?;
            let work: Vec<_> = parts.list.iter_mut().zip(maps).collect();
            ctx.par(work, |(part, map)| part.ingest(map.into_iter()))?
        };
        for result in results {
            result.map_err(|e| ctx.state_error(&e))?;
        }
        self.times.push_back(ctx.time);
        Ok(())
    }

    /// Writes a whole snapshot's payload a record at a time
    /// ([`Part::write_whole`]). The next changes are relative to it.
    fn write_whole(&mut self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        self.write_parts(out, Part::write_whole)?;
        self.needs_whole = false;
        Ok(())
    }

    /// Writes a snapshot of what changed a record at a time
    /// ([`Part::write_changes`]), as [`StatefulNode::apply_changes_from`]
    /// reads it.
    fn write_changes(&mut self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        self.write_parts(out, Part::write_changes)
    }

    /// The window's times, then each partition as `write_part` writes it.
    fn write_parts(
        &self,
        out: &mut dyn PayloadSink,
        mut write_part: impl FnMut(&mut Part<K, V>, &mut dyn PayloadSink) -> Result<(), CoreError>,
    ) -> Result<(), CoreError> {
        write_record(&(self.window_end, &self.times), out)?;
        let mut parts = lock(&self.parts);
        write_varint(parts.list.len() as u64, out.buffer());
        parts.list.iter_mut().try_for_each(|part| write_part(part, out))
    }

    /// Restores a version 1 snapshot (pairs by key, partitions merged).
    fn restore_v1(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let old: SnapshotV1<K, V> = codec().decode(bytes)?.value;
        if old.retained.len() != old.times.len() {
            return Err(CoreError::Decode {
                reason: format!("{} retained batches for {} times", old.retained.len(), old.times.len()),
            });
        }
        self.window_end = old.window_end;
        self.times = old.times;
        self.install(old.current, old.retained, partitions)
    }

    fn plan_slide(&self, time: Time) -> SlidePlan {
        let cutoff = time - self.length;
        let added = |t: &Time| self.window_end.is_some_and(|end| *t <= end);
        let leaving = self.times.iter().take_while(|t| **t <= cutoff).count();
        let leaving_added = self.times.iter().take(leaving).filter(|t| added(t)).count();
        // Added batches are a prefix of the retained ones; those that stay
        // are skipped when adding the batches that entered.
        let already_added = self.times.iter().filter(|t| added(t)).count();
        SlidePlan { leaving, leaving_added, first_entering: already_added - leaving_added }
    }

    /// One slide; its result, unless nothing stateful reads it in a batch
    /// recomputed for state alone.
    fn slide_to(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Batch<(K, V)>>, DStreamError> {
        self.fit(ctx)?;
        let plan = self.plan_slide(ctx.time);
        let (reduce, inverse, keep, wanted) = (&*self.reduce, &self.inverse, self.keep.as_ref(), ctx.result_wanted);
        let listing = wanted.then_some(self.greatest.as_ref());
        let mut parts = lock(&self.parts);
        let work: Vec<&mut Part<K, V>> = parts.list.iter_mut().collect();
        let mut out = Vec::with_capacity(work.len());
        for result in ctx.par(work, |part| part.slide(plan, reduce, inverse, keep, listing))? {
            out.push(result.map_err(|e| ctx.state_error(&e))?);
        }
        self.times.drain(..plan.leaving.min(self.times.len()));
        self.window_end = Some(ctx.time);
        Ok(wanted.then(|| Batch::new(out)))
    }

    /// True before the first batch's data: no keys, no slices.
    fn is_empty(&self) -> bool {
        self.times.is_empty()
            && lock(&self.parts).list.iter().all(|part| part.keys.len() == 0 && part.retained.is_empty())
    }

    /// Puts `list` in place of the partitions: ids looked up on arrival
    /// before name nothing in it.
    fn replace_parts(&self, mut list: Vec<Part<K, V>>) -> Result<(), CoreError> {
        if let Some(place) = &self.spill {
            spill_parts(&mut list, place)?;
        }
        let mut parts = lock(&self.parts);
        parts.list = list;
        parts.generation += 1;
        Ok(())
    }

    /// Re-spreads the state when the partition count differs (before the
    /// first batch, or after a restore on a machine with another core count).
    fn fit(&mut self, ctx: &StepCtx<'_>) -> Result<(), DStreamError> {
        if lock(&self.parts).list.len() == ctx.partitions {
            return Ok(());
        }
        if self.is_empty() {
            // Nothing to re-key: changes may still follow the last snapshot.
            let parts = (0..ctx.partitions).map(|_| Part::default()).collect();
            return self.replace_parts(parts).map_err(|e| ctx.state_error(&e));
        }
        let mut current = Vec::new();
        let mut retained: Vec<Vec<(K, V)>> = (0..self.times.len()).map(|_| Vec::new()).collect();
        for part in &lock(&self.parts).list {
            let (values, slices) = part.entries().map_err(|e| ctx.state_error(&e))?;
            current.extend(values);
            for (slot, slice) in retained.iter_mut().zip(slices) {
                slot.extend(slice);
            }
        }
        self.install(current, retained, ctx.partitions).map_err(|e| ctx.state_error(&e))
    }

    /// Builds the partitions from pairs by key; the next snapshot is whole.
    fn install(
        &mut self,
        current: Vec<(K, V)>,
        retained: Vec<Vec<(K, V)>>,
        partitions: usize,
    ) -> Result<(), CoreError> {
        let spread = |entries: Vec<(K, V)>| {
            let mut split: Vec<KeyHashMap<K, V>> = (0..partitions).map(|_| crate::hash::map_with_capacity(0)).collect();
            for (key, value) in entries {
                if let Some(map) = split.get_mut(partition_of(&key, partitions)) {
                    map.insert(key, value);
                }
            }
            split
        };
        let mut parts: Vec<Part<K, V>> = (0..partitions).map(|_| Part::default()).collect();
        for slice in retained {
            for (part, map) in parts.iter_mut().zip(spread(slice)) {
                part.ingest(map.into_iter())?;
            }
        }
        for (part, map) in parts.iter_mut().zip(spread(current)) {
            for (key, value) in map {
                let id = part.keys.insert(&key)?;
                part.grow();
                if let Some(slot) = part.current.get_mut(id as usize) {
                    *slot = Some(value);
                }
            }
        }
        self.replace_parts(parts)?;
        self.needs_whole = true;
        Ok(())
    }
}

impl<K, V, R, I, P> Node for InverseWindowNode<K, V, R, I, P>
where
    K: Key,
    V: Data,
    R: ValueFn<V>,
    I: ValueFn<V>,
    P: KeepFn<K, V>,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if let Some(batch) = ctx.take_owned(&self.input)? {
            self.ingest(ctx, batch)?;
        }
        let result = if ctx.time.is_multiple_of(self.slide) { self.slide_to(ctx)? } else { None };
        self.output.put(ctx.time, result);
        Ok(None)
    }

    combines_on_arrival!();

    fn take_combined(&mut self, blocks: Box<dyn std::any::Any>) -> bool {
        if !self.input_reduced || self.combine.combines_on_arrival() {
            return false;
        }
        match blocks.downcast::<CombinedBlocks<K, V>>() {
            Ok(blocks) => {
                // Set once, when the graph is built.
                let _ = blocks.resolve_ahead.set(Arc::new(LookUpAhead(Arc::clone(&self.parts))));
                self.blocks = Some(*blocks);
                true
            }
            Err(_) => false,
        }
    }

    fn list_only_greatest(&mut self, greatest: Box<dyn std::any::Any>) {
        take_greatest(&mut self.greatest, greatest)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

/// Lets `parts` move their slices beyond their share of `place`'s budget
/// to disk, and moves those already past it.
fn spill_parts<K: Key, V: Data>(parts: &mut [Part<K, V>], place: &SpillPlace) -> Result<(), CoreError> {
    let budget = place.partition_budget(parts.len());
    parts.iter_mut().try_for_each(|part| {
        part.retained.use_spill(place.clone(), budget);
        part.spill_if_over()
    })
}

/// One partition's share of a block: its keys (encoded), their ids when
/// they were looked up on arrival, and its values.
type BlockPart<V> = (EncodedKeys, Option<Vec<u32>>, Vec<V>);

/// One partition's share of a batch whose blocks were handed over: the
/// blocks' parts, in delivery order, and the entries of the aggregate's
/// result for the rest of the records.
type PartOfBlocks<K, V> = (Vec<BlockPart<V>>, Vec<(K, V)>);

/// The batch's blocks, split by partition on arrival, then the aggregate's
/// result for the rest of its records (what the aggregate would have
/// merged, in its order), by partition.
/// Ids looked up in an earlier `generation` of the partitions are dropped:
/// the keys are looked up again.
fn blocks_with_batch<K: Key, V: Data>(
    ctx: &StepCtx<'_>,
    blocks: &CombinedBlocks<K, V>,
    batch: Batch<(K, V)>,
    generation: u64,
) -> Result<Vec<PartOfBlocks<K, V>>, DStreamError> {
    let mut by_part: Vec<PartOfBlocks<K, V>> = (0..ctx.partitions).map(|_| (Vec::new(), Vec::new())).collect();
    for block in take_combined::<SplitBlock<V>>(ctx, &blocks.delivered)? {
        let parts = block.parts.map_err(|e| ctx.state_error(&e))?;
        if parts.len() != ctx.partitions {
            let reason = format!("a block split for {} partitions, in a batch of {}", parts.len(), ctx.partitions);
            return Err(DStreamError::Internal { operator: ctx.operator.to_string(), reason });
        }
        let ids = block.resolved.filter(|r| r.generation == generation && r.ids.len() == parts.len());
        let mut ids =
            ids.map(|r| r.ids.into_iter().map(Some)).into_iter().flatten().chain(std::iter::repeat_with(|| None));
        for ((blocks, _), (keys, values)) in by_part.iter_mut().zip(parts) {
            blocks.push((keys, ids.next().flatten(), values));
        }
    }
    let rest = if batch.num_partitions() == ctx.partitions {
        batch.into_partitions()
    } else {
        partition_records(ctx, batch.into_partitions(), ctx.partitions)?
    };
    for ((_, entries), part) in by_part.iter_mut().zip(rest) {
        *entries = part;
    }
    Ok(by_part)
}

impl<K, V, R, I, P> StatefulNode for InverseWindowNode<K, V, R, I, P>
where
    K: Key,
    V: Data,
    R: ValueFn<V>,
    I: ValueFn<V>,
    P: KeepFn<K, V>,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let mut bytes = Vec::new();
        codec().encode_with(&mut bytes, |out| self.write_whole(out))?;
        Ok(bytes)
    }

    /// [`Self::snapshot`] streamed: slices on disk are read back one at a
    /// time rather than collected.
    fn snapshot_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        codec().encode_streamed(out, |chunks| self.write_whole(chunks))
    }

    fn snapshot_changes(&mut self) -> Option<Result<Vec<u8>, CoreError>> {
        if self.needs_whole {
            return None;
        }
        let mut bytes = Vec::new();
        Some(codec().encode_with(&mut bytes, |out| self.write_changes(out)).map(|()| bytes))
    }

    fn takes_changes(&self) -> bool {
        !self.needs_whole
    }

    /// [`Self::snapshot_changes`] streamed, as the whole snapshot is.
    fn snapshot_changes_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        codec().encode_streamed(out, |chunks| self.write_changes(chunks))
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        self.restore_from(&mut std::io::Cursor::new(bytes), partitions)
    }

    /// Reads the snapshot a record at a time, so slices beyond the budget
    /// go to disk as they are read rather than after the whole file.
    fn restore_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let start = reader.stream_position().map_err(|source| CoreError::Read { source })?;
        let mut payload = codec().open_streamed(&mut *reader)?;
        if payload.version() < INVERSE_WINDOW_STATE_VERSION {
            drop(payload);
            let mut bytes = Vec::new();
            reader.seek(SeekFrom::Start(start)).map_err(|source| CoreError::Read { source })?;
            reader.read_to_end(&mut bytes).map_err(|source| CoreError::Read { source })?;
            return self.restore_v1(&bytes, partitions);
        }
        let (window_end, times): (Option<Time>, VecDeque<Time>) = payload.record()?;
        let count = usize::try_from(payload.count()?).unwrap_or(usize::MAX);
        let spill = self.spill.as_ref().map(|place| (place, place.partition_budget(count)));
        let list = (0..count).map(|_| Part::read_whole(&mut payload, spill, times.len())).collect::<Result<_, _>>()?;
        payload.finish()?;
        self.replace_parts(list)?;
        self.window_end = window_end;
        self.times = times;
        self.needs_whole = false;
        Ok(())
    }

    fn apply_changes(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        self.apply_changes_from(&mut std::io::Cursor::new(bytes), partitions)
    }

    /// Reads the changes a record at a time, so the slices that entered go
    /// to disk as they are read rather than after the whole file.
    fn apply_changes_from(&mut self, reader: &mut dyn ReadSeek, _partitions: usize) -> Result<(), CoreError> {
        let mut payload = codec().open_streamed(reader)?;
        let (window_end, times): (Option<Time>, VecDeque<Time>) = payload.record()?;
        let count = usize::try_from(payload.count()?).unwrap_or(usize::MAX);
        if self.is_empty() {
            // The snapshot before was taken before the first batch.
            self.replace_parts((0..count).map(|_| Part::default()).collect())?;
        }
        let mut parts = lock(&self.parts);
        if count != parts.list.len() {
            let reason = format!("changes of {count} partitions after a snapshot of {}", parts.list.len());
            return Err(CoreError::Decode { reason });
        }
        // Counts are recounted from the slices: holds taken before are gone.
        parts.generation += 1;
        let slices = times.len();
        parts.list.iter_mut().try_for_each(|part| part.apply_from(&mut payload, slices))?;
        drop(parts);
        payload.finish()?;
        self.window_end = window_end;
        self.times = times;
        Ok(())
    }

    fn use_spill(&mut self, operator: &str, spill: &StateSpill) {
        let place = SpillPlace::new(operator, spill);
        let mut parts = lock(&self.parts);
        if let Err(e) = spill_parts(&mut parts.list, &place) {
            // Only a partition already past its budget could fail here; it
            // stays in memory and the next batch moves it.
            tracing::warn!(operator, error = %e, "window slices stay in memory for now");
        }
        drop(parts);
        self.spill = Some(place);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_in_place_keeps_the_order_values_came_in_as_sorting_does() {
        // A merge that is not commutative shows the order values met in.
        let merge: &MergeFn<String> = &|combined: &mut String, value: String| combined.push_str(&value);
        let entries: Vec<(u32, String)> =
            (0..500u32).map(|i| ((i * 7919) % 61, format!("{i},"))).chain([(99, "last".to_string())]).collect();
        let by_sorting = merged_by_id(entries.clone(), merge);
        let in_place = merged_in_place(entries.into_iter(), 100, merge);
        let listed: Vec<(u32, String)> =
            in_place.into_iter().enumerate().filter_map(|(id, value)| Some((id as u32, value?))).collect();
        assert_eq!(listed, by_sorting);
        assert_eq!(by_sorting.len(), 62);
        assert!(by_sorting.windows(2).all(|pair| pair[0].0 < pair[1].0));
    }

    #[test]
    fn the_array_is_used_only_where_the_batch_names_a_good_share_of_the_keys() {
        assert!(dense_merge_pays::<u64>(1_000_000, 1_000_000));
        assert!(dense_merge_pays::<u64>(100_000, 300_000));
        assert!(!dense_merge_pays::<u64>(1_000, 1_000_000));
        assert!(!dense_merge_pays::<u64>(0, 1));
    }
}
