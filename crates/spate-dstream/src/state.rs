//! Per-key state across batches: `update_state_by_key` (Spark's
//! `StateDStream`) and `map_with_state` (Spark's `MapWithStateDStream`, with
//! an idle timeout per key).

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use serde::Serialize;
use spate_core::{
    CoreError, Duration, PayloadReader, PayloadSink, PayloadStream, ReadSeek, SeekWrite, Time, write_varint,
};

use crate::batch::{Batch, Data, Key};
use crate::combined::Combined;
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::partition_of;
use crate::keyed::KeyTable;
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx, state_codec};
use crate::pair::{combine_partitioned, partition_records};
use crate::spill::{SpillPlace, StateSpill};
use crate::spilled::{self, Pending, SpilledStates};
use crate::stream::DStream;
use crate::top_n::{Greatest, Listed, take_greatest};

/// One partition's state by key: each key once, encoded in a
/// [`KeyTable`], and its state in an array by the key's id.
struct KeyedStates<K, S> {
    keys: KeyTable<K>,
    states: Vec<Option<S>>,
}

impl<K, S> Default for KeyedStates<K, S> {
    fn default() -> Self {
        KeyedStates { keys: KeyTable::default(), states: Vec::new() }
    }
}

impl<K: Key, S> KeyedStates<K, S> {
    /// The id of `key`, giving it one (with no state) if it has none.
    fn id(&mut self, key: &K) -> Result<u32, CoreError> {
        let id = self.keys.insert(key)?;
        if self.states.len() < self.keys.id_bound() {
            self.states.resize_with(self.keys.id_bound(), || None);
        }
        Ok(id)
    }

    /// `entries` with their keys' ids in place of the keys, giving each key
    /// without one an id (with no state).
    fn with_ids<X>(&mut self, entries: impl IntoIterator<Item = (K, X)>) -> Result<Vec<(u32, X)>, CoreError> {
        let entries = self.keys.insert_entries(entries, |_| {})?;
        if self.states.len() < self.keys.id_bound() {
            self.states.resize_with(self.keys.id_bound(), || None);
        }
        Ok(entries)
    }

    /// Takes the state of `id` out (the key keeps its id).
    fn take(&mut self, id: u32) -> Option<S> {
        self.states.get_mut(id as usize).and_then(Option::take)
    }

    fn put(&mut self, id: u32, state: S) {
        if let Some(slot) = self.states.get_mut(id as usize) {
            *slot = Some(state);
        }
    }

    /// Forgets the key of `id` and its state; the id is given again.
    fn remove(&mut self, id: u32) {
        self.take(id);
        self.keys.remove(id);
    }

    /// The ids that may have state, for a pass over all of them.
    fn ids(&self) -> std::ops::Range<u32> {
        0..u32::try_from(self.states.len()).unwrap_or(u32::MAX)
    }

    fn key(&self, id: u32) -> Result<K, CoreError> {
        self.keys.key(id)?.ok_or_else(|| CoreError::Decode { reason: format!("state of id {id} without a key") })
    }

    fn state(&self, id: u32) -> Option<&S> {
        self.states.get(id as usize).and_then(Option::as_ref)
    }

    fn states_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.states.iter_mut().flatten()
    }

    fn insert(&mut self, key: &K, state: S) -> Result<(), CoreError> {
        let id = self.id(key)?;
        self.put(id, state);
        Ok(())
    }

    /// The bytes the keys and states take in memory (what a state points
    /// to, a string's bytes, is not counted).
    fn memory_bytes(&self) -> usize {
        self.keys.memory_bytes() + self.states.capacity() * std::mem::size_of::<Option<S>>()
    }
}

fn state_meta<K, V, S>() -> StateMeta {
    StateMeta {
        key_type: Some(std::any::type_name::<K>()),
        value_type: std::any::type_name::<V>(),
        state_type: std::any::type_name::<S>(),
        needs_checkpoint: true,
    }
}

/// What a keyed operator that snapshots what changed writes, for the
/// snapshot functions `update_state_by_key` and `map_with_state` share.
trait KeyedSnapshot {
    /// Every key's entry, as a whole snapshot lists them.
    fn write_whole(&self, out: &mut dyn PayloadSink) -> Result<(), CoreError>;

    /// What changed since the last snapshot.
    fn write_changes(&self, out: &mut dyn PayloadSink) -> Result<(), CoreError>;

    /// Forgets what changed: the next changes are relative to now.
    fn mark_unchanged(&mut self);
}

/// Appends the keys removed since the last snapshot, as a `Vec<K>`: a
/// snapshot of changes starts with them.
fn write_removed<K: Serialize>(removed: &[K], out: &mut dyn PayloadSink) -> Result<(), CoreError> {
    bincode::serde::encode_into_std_write(removed, out.buffer(), bincode::config::standard())
        .map(drop)
        .map_err(|e| CoreError::Encode { reason: format!("removed keys: {e}") })
}

/// `value` encoded into `buffer` (cleared first), as a state is stored.
fn encode_into<'a, T: Serialize>(value: &T, buffer: &'a mut Vec<u8>) -> Result<&'a [u8], CoreError> {
    buffer.clear();
    bincode::serde::encode_into_std_write(value, &mut *buffer, bincode::config::standard())
        .map_err(|e| CoreError::Encode { reason: format!("a keyed state: {e}") })?;
    Ok(buffer)
}

/// Which snapshot to take.
#[derive(Clone, Copy)]
enum Snapshot {
    Whole,
    Changes,
}

fn write_snapshot<N: KeyedSnapshot>(node: &N, which: Snapshot, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
    match which {
        Snapshot::Whole => node.write_whole(out),
        Snapshot::Changes => node.write_changes(out),
    }
}

/// The snapshot as one frame; what changed is forgotten once it is written.
fn snapshot_frame<N: KeyedSnapshot>(node: &mut N, which: Snapshot) -> Result<Vec<u8>, CoreError> {
    let mut bytes = Vec::new();
    state_codec().encode_with(&mut bytes, |out| write_snapshot(node, which, out))?;
    node.mark_unchanged();
    Ok(bytes)
}

/// [`snapshot_frame`] streamed into `out`: a state on disk need not fit in
/// memory.
fn snapshot_streamed<N: KeyedSnapshot>(
    node: &mut N,
    which: Snapshot,
    out: &mut dyn SeekWrite,
) -> Result<u64, CoreError> {
    let written = state_codec().encode_streamed(out, |chunks| write_snapshot(node, which, chunks))?;
    node.mark_unchanged();
    Ok(written)
}

// ---------------------------------------------------------------------------
// update_state_by_key

struct UpdateStateNode<K, V, S, F> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<(K, S)>>,
    update: F,
    parts: Vec<UpdatePart<K, S>>,
    /// The records its only reader keeps of each result (a `top_n`).
    greatest: Option<Greatest<(K, S)>>,
    /// Where partitions go beyond their share of the state budget.
    spill: Option<SpillPlace>,
    /// Keys removed since the last snapshot (a key removed and given state
    /// again is also listed as changed).
    removed: Vec<K>,
    /// The time of the last batch stepped.
    stepped: Option<Time>,
    /// The time of the last batch before the last snapshot (`None` before
    /// the first snapshot since the state was made or restored).
    last_snapshot: Option<Time>,
}

/// The last time of a spilled entry restored rather than changed by a
/// batch: before every batch, so no snapshot of changes lists it.
const RESTORED: Time = Time::ZERO;

/// A partition of keyed state, `T` a key's state as kept in memory: in
/// memory, or in a spill table once it took more than its share of the
/// state budget (it stays there).
enum StatePart<K, T> {
    Memory(KeyedStates<K, T>),
    Spilled(SpilledStates),
}

/// One `update_state_by_key` partition.
type UpdatePart<K, S> = StatePart<K, S>;

/// One `map_with_state` partition: each state with its last time.
type MapPart<K, S> = StatePart<K, Entry<S>>;

impl<K, T> Default for StatePart<K, T> {
    fn default() -> Self {
        StatePart::Memory(KeyedStates::default())
    }
}

impl<K: Key, T> StatePart<K, T> {
    fn len(&self) -> u64 {
        match self {
            StatePart::Memory(states) => states.keys.len() as u64,
            StatePart::Spilled(spilled) => spilled.len(),
        }
    }

    /// Its spill table, once it moved there.
    fn spilled_mut(&mut self) -> Option<&mut SpilledStates> {
        match self {
            StatePart::Spilled(spilled) => Some(spilled),
            StatePart::Memory(_) => None,
        }
    }

    /// Forgets `key` and its state in a partition in memory.
    fn remove_in_memory(&mut self, key: &K) -> Result<(), CoreError> {
        if let StatePart::Memory(states) = self {
            let id = states.id(key)?;
            states.remove(id);
        }
        Ok(())
    }

    /// Moves the partition to a spill table when it takes more than its
    /// share of the budget, each key with the state and last time `entry`
    /// gives; `by_time`: its keys time out.
    fn spill_if_over<S: Serialize>(
        &mut self,
        spill: Option<&SpillPlace>,
        partitions: usize,
        by_time: bool,
        entry: impl Fn(&T) -> (&S, Time),
    ) -> Result<(), CoreError> {
        let Some(place) = spill else { return Ok(()) };
        let StatePart::Memory(states) = self else { return Ok(()) };
        if states.memory_bytes() as u64 <= place.partition_budget(partitions) {
            return Ok(());
        }
        let mut spilled = SpilledStates::new(place.open()?, place.open_blobs()?, by_time);
        let entries = states.keys.iter_encoded().filter_map(|(id, key)| {
            let (state, last) = entry(states.state(id)?);
            Some((key, state, last))
        });
        spilled.extend(entries)?;
        tracing::info!(operator = %place.operator(), keys = spilled.len(), "a keyed state partition moved its state to disk");
        *self = StatePart::Spilled(spilled);
        Ok(())
    }
}

impl<K: Key, S: Data> UpdatePart<K, S> {
    /// Moves the partition to a spill table when it takes more than its
    /// share of the budget; its keys count as changed at `time`.
    fn spill_states_if_over(
        &mut self,
        spill: Option<&SpillPlace>,
        partitions: usize,
        time: Time,
    ) -> Result<(), CoreError> {
        self.spill_if_over(spill, partitions, false, |state: &S| (state, time))
    }

    /// Calls `visit` with each key's encoding and its state's: every key,
    /// or with `changed_after` those that may have changed after that batch
    /// (every key of a partition in memory, which keeps no such record).
    fn for_each_state_encoded(
        &self,
        changed_after: Option<Time>,
        visit: &mut spilled::EntryVisitor<'_>,
    ) -> Result<(), CoreError> {
        match self {
            StatePart::Memory(states) => {
                let mut state = Vec::new();
                for (id, key) in states.keys.iter_encoded() {
                    let Some(value) = states.state(id) else { continue };
                    visit(key, encode_into(value, &mut state)?)?;
                }
                Ok(())
            }
            // An entry is the state, then its last time.
            StatePart::Spilled(spilled) => spilled.for_each_encoded::<S>(changed_after, &mut |key, entry| {
                let (_, used) = spilled::decode_prefix::<S>(entry)?;
                visit(key, entry.get(..used).unwrap_or_default())
            }),
        }
    }

    /// How many keys [`Self::for_each_state_encoded`] visits with
    /// `changed_after`, without encoding or decoding their states.
    fn changed_count(&self, changed_after: Option<Time>) -> Result<u64, CoreError> {
        match self {
            StatePart::Memory(_) => Ok(self.len()),
            StatePart::Spilled(spilled) => {
                let mut count = 0;
                spilled.for_each_encoded::<S>(changed_after, &mut |_, _| {
                    count += 1;
                    Ok(())
                })?;
                Ok(count)
            }
        }
    }

    /// Every key with its state, decoded.
    fn states_decoded(&self) -> Result<Vec<(K, S)>, CoreError> {
        let mut entries = Vec::with_capacity(usize::try_from(self.len()).unwrap_or(0));
        self.for_each_state_encoded(None, &mut |key, state| {
            entries.push((spilled::decode(key)?, spilled::decode(state)?));
            Ok(())
        })?;
        Ok(entries)
    }
}

impl<K, V, S, F> Node for UpdateStateNode<K, V, S, F>
where
    K: Key,
    V: Data,
    S: Data,
    F: Fn(Vec<V>, Option<S>) -> Option<S> + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        self.respread(ctx.partitions).map_err(|e| ctx.state_error(&e))?;
        self.stepped = Some(ctx.time);
        let Some(batch) = ctx.take_owned(&self.input)? else {
            self.output.put(ctx.time, None);
            return Ok(None);
        };
        let groups = combine_partitioned(
            ctx,
            batch.into_partitions(),
            ctx.partitions,
            &|v| vec![v],
            &|acc: &mut Vec<V>, v| acc.push(v),
            &|acc: &mut Vec<V>, more| acc.extend(more),
        )?;
        let (update, greatest) = (&self.update, self.greatest.as_ref());
        let (spill, partitions, time) = (self.spill.as_ref(), ctx.partitions, ctx.time);
        let work: Vec<_> = self.parts.iter_mut().zip(groups).collect();
        let mut out = Vec::with_capacity(work.len());
        let results = ctx.par(work, |(part, groups)| {
            let listed = match part {
                StatePart::Memory(states) => update_part(states, groups, update, greatest)?,
                StatePart::Spilled(spilled) => update_spilled(spilled, groups, update, greatest, time)?,
            };
            part.spill_states_if_over(spill, partitions, time)?;
            Ok::<_, CoreError>(listed)
        })?;
        for part in results {
            let (listed, removed) = part.map_err(|e| ctx.state_error(&e))?;
            out.push(listed);
            self.removed.extend(removed);
        }
        self.output.put(ctx.time, Some(Batch::new(out)));
        Ok(None)
    }

    fn list_only_greatest(&mut self, greatest: Box<dyn std::any::Any>) {
        take_greatest(&mut self.greatest, greatest)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<K: Key, V, S: Data, F> UpdateStateNode<K, V, S, F> {
    /// Re-spreads the partitions' state when the partition count changed.
    fn respread(&mut self, partitions: usize) -> Result<(), CoreError> {
        if self.parts.len() == partitions {
            return Ok(());
        }
        let mut entries = Vec::new();
        for part in &self.parts {
            entries.extend(part.states_decoded()?);
        }
        // Which keys changed since the last snapshot is not carried over:
        // the next changes list every key.
        self.last_snapshot = None;
        self.spread(entries.into_iter().map(Ok), partitions)
    }

    /// Replaces the partitions with `entries` (distinct keys) spread over
    /// `partitions`, each partition moving to a spill table as it outgrows
    /// its share.
    fn spread(
        &mut self,
        entries: impl Iterator<Item = Result<(K, S), CoreError>>,
        partitions: usize,
    ) -> Result<(), CoreError> {
        self.parts = (0..partitions).map(|_| StatePart::default()).collect();
        // A whole list's keys are distinct: new to their tables.
        let mut grouped = Grouped::new(partitions, true);
        for entry in entries {
            let (key, state) = entry?;
            self.restore_entry(key, state, partitions, &mut grouped)?;
        }
        grouped.flush(&mut self.parts)
    }

    /// Gives `key` the state `state` in its partition as state is restored;
    /// a spilled partition gets it through `grouped`, a group at a time.
    fn restore_entry(
        &mut self,
        key: K,
        state: S,
        partitions: usize,
        grouped: &mut Grouped<S>,
    ) -> Result<(), CoreError> {
        let index = partition_of(&key, partitions);
        let Some(part) = self.parts.get_mut(index) else { return Ok(()) };
        match part {
            StatePart::Spilled(spilled) => grouped.put(index, spilled, spilled::encode(&key)?, state, RESTORED),
            StatePart::Memory(states) => {
                states.insert(&key, state)?;
                part.spill_states_if_over(self.spill.as_ref(), partitions, RESTORED)
            }
        }
    }
}

impl<K: Key, V, S: Data, F> KeyedSnapshot for UpdateStateNode<K, V, S, F> {
    /// The list of every key's `(key, state)`, as bincode writes a `Vec` of
    /// them, from the partitions' encodings.
    fn write_whole(&self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        write_varint(self.parts.iter().map(StatePart::len).sum(), out.buffer());
        for part in &self.parts {
            part.for_each_state_encoded(None, &mut |key, state| {
                out.buffer().extend_from_slice(key);
                out.buffer().extend_from_slice(state);
                out.record_end()
            })?;
        }
        Ok(())
    }

    /// The keys removed since the last snapshot (a `Vec<K>`), then the list
    /// of the keys that may have changed, with their states: counted in a
    /// first pass and streamed in a second, so that millions of changes
    /// are not held in memory to be counted.
    fn write_changes(&self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        write_removed(&self.removed, out)?;
        let mut count = 0u64;
        for part in &self.parts {
            count += part.changed_count(self.last_snapshot)?;
        }
        write_varint(count, out.buffer());
        let mut written = 0u64;
        for part in &self.parts {
            part.for_each_state_encoded(self.last_snapshot, &mut |key, state| {
                out.buffer().extend_from_slice(key);
                out.buffer().extend_from_slice(state);
                written += 1;
                out.record_end()
            })?;
        }
        if written != count {
            return Err(CoreError::Encode { reason: format!("{count} changed keys counted, {written} written") });
        }
        Ok(())
    }

    fn mark_unchanged(&mut self) {
        self.removed.clear();
        if let Some(time) = self.stepped {
            for part in &mut self.parts {
                if let StatePart::Spilled(spilled) = part {
                    spilled.snapshot_taken(time);
                }
            }
        }
        self.last_snapshot = self.stepped;
    }
}

impl<K, V, S, F> StatefulNode for UpdateStateNode<K, V, S, F>
where
    K: Key,
    V: Data,
    S: Data,
    F: Fn(Vec<V>, Option<S>) -> Option<S> + Send + Sync,
{
    /// The layout of a `Vec<(K, S)>` of every key.
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        snapshot_frame(self, Snapshot::Whole)
    }

    /// [`Self::snapshot`]'s frame streamed: a state on disk need not fit in memory.
    fn snapshot_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        snapshot_streamed(self, Snapshot::Whole, out)
    }

    fn takes_changes(&self) -> bool {
        true
    }

    /// The keys removed (a `Vec<K>`), then the list of the keys that may
    /// have changed: those a spilled partition changed, and every key of a
    /// partition in memory (which is within its share of the budget).
    fn snapshot_changes(&mut self) -> Option<Result<Vec<u8>, CoreError>> {
        Some(snapshot_frame(self, Snapshot::Changes))
    }

    /// [`Self::snapshot_changes`] streamed into its file.
    fn snapshot_changes_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        snapshot_streamed(self, Snapshot::Changes, out)
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        self.restore_from(&mut std::io::Cursor::new(bytes), partitions)
    }

    /// Entry by entry as the file is read, so a state larger than memory
    /// goes to its spill tables without being held whole.
    fn restore_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let mut payload = state_codec().open_streamed(reader)?;
        let count = payload.count()?;
        let entries = (0..count).map(|_| {
            payload.record().map_err(|e| CoreError::Decode { reason: format!("an update_state_by_key entry: {e}") })
        });
        self.removed.clear();
        (self.stepped, self.last_snapshot) = (None, None);
        self.spread(entries, partitions)?;
        payload.finish()
    }

    fn apply_changes(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        self.apply_changes_from(&mut std::io::Cursor::new(bytes), partitions)
    }

    /// The removed keys (a `Vec<K>`), then the changed keys' list, each
    /// applied as it is read.
    fn apply_changes_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let mut payload = state_codec().open_streamed(reader)?;
        self.respread(partitions)?;
        let decode_error = |e: CoreError| CoreError::Decode { reason: format!("update_state_by_key changes: {e}") };
        // Keys the state may hold already: read a group at a time.
        let mut grouped = Grouped::new(partitions, false);
        apply_removals::<K, _, S, _>(&mut payload, &mut self.parts, &mut grouped, decode_error)?;
        for _ in 0..payload.count()? {
            let (key, state): (K, S) = payload.record().map_err(decode_error)?;
            self.restore_entry(key, state, partitions, &mut grouped)?;
        }
        grouped.flush(&mut self.parts)?;
        payload.finish()
    }

    fn use_spill(&mut self, operator: &str, spill: &StateSpill) {
        self.spill = Some(SpillPlace::new(operator, spill));
    }
}

/// One partition's `update_state_by_key` step: every key with state or
/// values gets `update`; returns the state of every key after it (only
/// the `greatest`, when its only reader keeps no others).
fn update_part<K, V, S, F>(
    part: &mut KeyedStates<K, S>,
    groups: Combined<K, Vec<V>>,
    update: &F,
    greatest: Option<&Greatest<(K, S)>>,
) -> Result<UpdateOut<K, S>, CoreError>
where
    K: Key,
    S: Clone,
    F: Fn(Vec<V>, Option<S>) -> Option<S>,
{
    let mut values: Vec<(u32, Vec<V>)> = part.with_ids(groups)?;
    values.sort_unstable_by_key(|(id, _)| *id);
    let mut values = values.into_iter().peekable();
    let (mut out, mut removed) = (Listed::new(greatest, part.keys.len()), Vec::new());
    for id in part.ids() {
        let group = values.next_if(|(next, _)| *next == id).map(|(_, group)| group);
        let old = part.take(id);
        let existed = old.is_some();
        if !existed && group.is_none() {
            continue;
        }
        match update(group.unwrap_or_default(), old) {
            Some(state) => {
                out.push((part.key(id)?, state.clone()));
                part.put(id, state);
            }
            None if existed => {
                removed.push(part.key(id)?);
                part.remove(id);
            }
            None => part.remove(id),
        }
    }
    Ok((out.into_vec(), removed))
}

/// A partition's result as listed, and the keys it removed.
type UpdateOut<K, S> = (Vec<(K, S)>, Vec<K>);

/// [`update_part`] on a partition in a spill table: one pass over its keys
/// in key order, the batch's values found by key; only the states whose
/// encoding changed are written, at the end.
fn update_spilled<K, V, S, F>(
    part: &mut SpilledStates,
    groups: Combined<K, Vec<V>>,
    update: &F,
    greatest: Option<&Greatest<(K, S)>>,
    time: Time,
) -> Result<UpdateOut<K, S>, CoreError>
where
    K: Key,
    S: Data,
    F: Fn(Vec<V>, Option<S>) -> Option<S>,
{
    let mut batch: HashMap<Vec<u8>, (K, Vec<V>)> = HashMap::with_capacity(groups.len());
    for (key, values) in groups {
        batch.insert(spilled::encode(&key)?, (key, values));
    }
    let mut out = Listed::new(greatest, usize::try_from(part.len()).unwrap_or(0) + batch.len());
    let (mut changed, mut removed): (HashMap<Vec<u8>, Pending<S>>, _) = (HashMap::new(), Vec::new());
    // A new state's encoding, to compare with the old one's: one buffer for
    // every key of the pass.
    let mut encoded_state = Vec::new();
    part.for_each_encoded::<S>(None, &mut |encoded, entry| {
        let (old, used) = spilled::decode_prefix::<S>(entry)?;
        let (key, values) = match batch.remove(encoded) {
            Some((key, values)) => (key, values),
            None => (spilled::decode(encoded)?, Vec::new()),
        };
        let now = match update(values, Some(old)) {
            Some(state) if entry.get(..used) == Some(encode_into(&state, &mut encoded_state)?) => {
                out.push((key, state));
                return Ok(());
            }
            Some(state) => {
                out.push((key, state.clone()));
                Some((state, time))
            }
            None => {
                removed.push(key);
                None
            }
        };
        // `before` is only told apart from `None`: the key had state.
        changed.insert(encoded.to_vec(), Pending { before: Some(RESTORED), now });
        Ok(())
    })?;
    for (encoded, (key, values)) in batch {
        if let Some(state) = update(values, None) {
            out.push((key, state.clone()));
            changed.insert(encoded, Pending { before: None, now: Some((state, time)) });
        }
    }
    part.write_pending(changed, Some(time))?;
    Ok((out.into_vec(), removed))
}

// ---------------------------------------------------------------------------
// map_with_state

/// The state of one key as a `map_with_state` function sees it.
#[derive(Debug)]
pub struct State<S> {
    value: Option<S>,
    updated: bool,
    removed: bool,
    timing_out: bool,
}

impl<S> State<S> {
    fn new(value: Option<S>, timing_out: bool) -> Self {
        State { value, updated: false, removed: false, timing_out }
    }

    /// True when the key has state.
    pub fn exists(&self) -> bool {
        self.value.is_some()
    }

    /// The key's state, if any.
    pub fn get(&self) -> Option<&S> {
        self.value.as_ref()
    }

    /// Sets the key's state. Has no effect when the state is timing out
    /// (it is removed after this call).
    pub fn update(&mut self, value: S) {
        if !self.timing_out {
            self.value = Some(value);
            self.updated = true;
            self.removed = false;
        }
    }

    /// Removes the key's state.
    pub fn remove(&mut self) {
        self.value = None;
        self.removed = true;
    }

    /// True when the function is called because the key was idle for the
    /// timeout (its value is then `None`).
    pub fn is_timing_out(&self) -> bool {
        self.timing_out
    }
}

struct MapWithStateNode<K, V, S, M, F> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<M>>,
    snapshots: Arc<Slot<(K, S)>>,
    func: F,
    timeout: Option<Duration>,
    /// Per partition: each key's state and the last batch time it had data.
    parts: Vec<MapPart<K, S>>,
    /// Keys removed since the last snapshot (a key removed and given state
    /// again is also in `parts`, marked changed).
    removed: Vec<K>,
    /// Where partitions go beyond their share of the state budget.
    spill: Option<SpillPlace>,
    /// The time of the last batch stepped.
    stepped: Option<Time>,
    /// The time of the last batch before the last snapshot (`None` before
    /// the first snapshot since the state was made or restored).
    last_snapshot: Option<Time>,
}

/// Which keys a snapshot of what changed lists.
#[derive(Clone, Copy)]
struct Changes {
    /// The batch time of the last snapshot: spilled partitions list the
    /// keys with data after it (every key when unknown).
    after: Option<Time>,
}

/// One key's state in [`MapWithStateNode`].
#[derive(Clone)]
struct Entry<S> {
    state: S,
    /// The last batch time the key had data.
    last: Time,
    /// Changed since the last snapshot.
    changed: bool,
}

impl<K: Key, S: Data> MapPart<K, S> {
    /// Moves the partition to a spill table when it takes more than its
    /// share of the budget; `by_time`: its keys time out.
    fn spill_entries_if_over(
        &mut self,
        spill: Option<&SpillPlace>,
        partitions: usize,
        by_time: bool,
    ) -> Result<(), CoreError> {
        self.spill_if_over(spill, partitions, by_time, |entry: &Entry<S>| (&entry.state, entry.last))
    }

    /// Appends each key's `(key, state, last)` encoding (only the changed
    /// keys' with `changes`) and returns how many.
    fn write_entries(&self, changes: Option<Changes>, out: &mut dyn PayloadSink) -> Result<u64, CoreError> {
        let only_changed = changes.is_some();
        let mut written = 0;
        match self {
            StatePart::Memory(states) => {
                for (id, key) in states.keys.iter_encoded() {
                    let Some(entry) = states.state(id).filter(|e| !only_changed || e.changed) else { continue };
                    out.buffer().extend_from_slice(key);
                    out.buffer().extend_from_slice(&spilled::encode(&(&entry.state, entry.last))?);
                    out.record_end()?;
                    written += 1;
                }
            }
            // A spilled partition's changed keys are those with data after the last snapshot.
            StatePart::Spilled(spilled) => {
                spilled.for_each_encoded::<S>(changes.and_then(|c| c.after), &mut |key, value| {
                    out.buffer().extend_from_slice(key);
                    out.buffer().extend_from_slice(value);
                    written += 1;
                    out.record_end()
                })?
            }
        }
        Ok(written)
    }

    /// Every key with its state and last time, decoded.
    fn decoded(&self) -> Result<Vec<(K, S, Time)>, CoreError> {
        let mut bytes = Vec::new();
        let count = self.write_entries(None, &mut bytes)?;
        let mut reader = PayloadReader::new(&bytes);
        (0..count).map(|_| next_entry(&mut reader)).collect()
    }

    /// Forgets what changed: the next changes are relative to now (a
    /// spilled partition's are relative to the node's last snapshot time,
    /// `stepped`: the last batch before it).
    fn mark_unchanged(&mut self, stepped: Option<Time>) {
        match self {
            StatePart::Memory(states) => states.states_mut().for_each(|entry| entry.changed = false),
            StatePart::Spilled(spilled) => {
                if let Some(time) = stepped {
                    spilled.snapshot_taken(time);
                }
            }
        }
    }
}

/// Reads the keys a snapshot of changes removed (a `Vec<K>`) and removes
/// each from its partition, those on disk through `grouped`; all of them
/// are written before it returns, so the changed states after land on what
/// is left.
fn apply_removals<K: Key, T, S: Data, R: Read>(
    payload: &mut PayloadStream<R>,
    parts: &mut [StatePart<K, T>],
    grouped: &mut Grouped<S>,
    decode_error: impl Fn(CoreError) -> CoreError,
) -> Result<(), CoreError> {
    let partitions = parts.len();
    for _ in 0..payload.count()? {
        let key: K = payload.record().map_err(&decode_error)?;
        let index = partition_of(&key, partitions);
        let Some(part) = parts.get_mut(index) else { continue };
        match part.spilled_mut() {
            Some(spilled) => grouped.remove(index, spilled, spilled::encode(&key)?)?,
            None => part.remove_in_memory(&key)?,
        }
    }
    grouped.flush(parts)
}

/// Restored entries and removals bound for spilled partitions, written a
/// group at a time: a batched read and one write a group, not a read and
/// a write a key (ten million keys restored one by one took minutes).
struct Grouped<S> {
    /// Per partition: encoded keys with their states and last times.
    states: Vec<Vec<(Vec<u8>, S, Time)>>,
    /// Per partition: encoded keys to remove.
    removals: Vec<Vec<Vec<u8>>>,
    /// The keys are new to their tables (a whole list): nothing to read.
    fresh: bool,
}

impl<S: Data> Grouped<S> {
    fn new(partitions: usize, fresh: bool) -> Self {
        Grouped {
            states: (0..partitions).map(|_| Vec::new()).collect(),
            removals: (0..partitions).map(|_| Vec::new()).collect(),
            fresh,
        }
    }

    /// Gives the key encoded as `key` its state in partition `index`.
    fn put(
        &mut self,
        index: usize,
        part: &mut SpilledStates,
        key: Vec<u8>,
        state: S,
        last: Time,
    ) -> Result<(), CoreError> {
        let Some(group) = self.states.get_mut(index) else { return Ok(()) };
        group.push((key, state, last));
        if group.len() < spilled::WRITE_GROUP {
            return Ok(());
        }
        write_states(part, std::mem::take(group), self.fresh)
    }

    /// Removes the key encoded as `key` from partition `index`.
    fn remove(&mut self, index: usize, part: &mut SpilledStates, key: Vec<u8>) -> Result<(), CoreError> {
        let Some(group) = self.removals.get_mut(index) else { return Ok(()) };
        group.push(key);
        if group.len() < spilled::WRITE_GROUP {
            return Ok(());
        }
        part.remove_many::<S>(std::mem::take(group))
    }

    /// Writes what waits, removals first.
    fn flush<K: Key, T>(&mut self, parts: &mut [StatePart<K, T>]) -> Result<(), CoreError> {
        for ((part, states), removals) in parts.iter_mut().zip(&mut self.states).zip(&mut self.removals) {
            let Some(spilled) = part.spilled_mut() else { continue };
            if !removals.is_empty() {
                spilled.remove_many::<S>(std::mem::take(removals))?;
            }
            if !states.is_empty() {
                write_states(spilled, std::mem::take(states), self.fresh)?;
            }
        }
        Ok(())
    }
}

/// Writes restored states to a spilled partition; `fresh`: its keys are
/// new to it.
fn write_states<S: Data>(
    part: &mut SpilledStates,
    states: Vec<(Vec<u8>, S, Time)>,
    fresh: bool,
) -> Result<(), CoreError> {
    if fresh {
        part.extend(states.iter().map(|(key, state, last)| (key.as_slice(), state, *last)))
    } else {
        part.upsert_many(states)
    }
}

/// The next `(key, state, last)` of a snapshot's list.
fn next_entry<T: serde::de::DeserializeOwned>(reader: &mut PayloadReader<'_>) -> Result<T, CoreError> {
    let (entry, used) = bincode::serde::decode_from_slice(reader.rest(), bincode::config::standard())
        .map_err(|e| CoreError::Decode { reason: format!("a map_with_state entry: {e}") })?;
    reader.take(used as u64)?;
    Ok(entry)
}

impl<K, V, S, M, F> Node for MapWithStateNode<K, V, S, M, F>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    F: Fn(&K, Option<V>, &mut State<S>) -> M + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        self.respread(ctx.partitions).map_err(|e| ctx.state_error(&e))?;
        self.stepped = Some(ctx.time);
        let Some(batch) = ctx.take_owned(&self.input)? else {
            self.output.put(ctx.time, None);
            self.snapshots.put(ctx.time, None);
            return Ok(None);
        };
        let records = partition_records(ctx, batch.into_partitions(), ctx.partitions)?;
        let step = MapStep {
            func: &self.func,
            time: ctx.time,
            threshold: self.timeout.map(|timeout| ctx.time - timeout),
            want_snapshots: self.snapshots.readers() > 0,
        };
        let (spill, partitions, by_time) = (self.spill.as_ref(), ctx.partitions, self.timeout.is_some());
        let work: Vec<_> = self.parts.iter_mut().zip(records).collect();
        let (mut mapped, mut snapshots) = (Vec::new(), Vec::new());
        let results = ctx.par(work, |(part, records)| {
            let out = step.run(part, records)?;
            part.spill_entries_if_over(spill, partitions, by_time)?;
            Ok::<_, CoreError>(out)
        })?;
        for part in results {
            let (records, snapshot, removed) = part.map_err(|e| ctx.state_error(&e))?;
            mapped.push(records);
            snapshots.push(snapshot);
            self.removed.extend(removed);
        }
        self.output.put(ctx.time, Some(Batch::new(mapped)));
        self.snapshots.put(ctx.time, Some(Batch::new(snapshots)));
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<K: Key, V, S: Data, M, F> MapWithStateNode<K, V, S, M, F> {
    /// Re-spreads the partitions' state when the partition count changed.
    fn respread(&mut self, partitions: usize) -> Result<(), CoreError> {
        if self.parts.len() == partitions {
            return Ok(());
        }
        let mut entries = Vec::new();
        for part in &self.parts {
            entries.extend(part.decoded()?);
        }
        // Which keys changed since the last snapshot is not carried over:
        // the next changes list every key.
        self.last_snapshot = None;
        self.spread(entries.into_iter().map(Ok), partitions, true)
    }

    /// Replaces the partitions with `entries` spread over `partitions`,
    /// each partition moving to a spill table as it outgrows its share.
    fn spread(
        &mut self,
        entries: impl Iterator<Item = Result<(K, S, Time), CoreError>>,
        partitions: usize,
        changed: bool,
    ) -> Result<(), CoreError> {
        self.parts = (0..partitions).map(|_| StatePart::default()).collect();
        // A whole list's keys are distinct: new to their tables.
        let mut grouped = Grouped::new(partitions, true);
        for entry in entries {
            let (key, state, last) = entry?;
            self.restore_entry(key, Entry { state, last, changed }, partitions, &mut grouped)?;
        }
        grouped.flush(&mut self.parts)
    }

    /// Gives `key` the state `entry` in its partition as state is restored;
    /// a spilled partition gets it through `grouped`, a group at a time.
    fn restore_entry(
        &mut self,
        key: K,
        entry: Entry<S>,
        partitions: usize,
        grouped: &mut Grouped<S>,
    ) -> Result<(), CoreError> {
        let index = partition_of(&key, partitions);
        let Some(part) = self.parts.get_mut(index) else { return Ok(()) };
        match part {
            StatePart::Spilled(spilled) => grouped.put(index, spilled, spilled::encode(&key)?, entry.state, entry.last),
            StatePart::Memory(states) => {
                states.insert(&key, entry)?;
                part.spill_entries_if_over(self.spill.as_ref(), partitions, self.timeout.is_some())
            }
        }
    }

    /// Appends the list of every key's `(key, state, last)` (only the
    /// changed ones with `changes`), as bincode writes a `Vec` of them.
    fn write_list(&self, changes: Option<Changes>, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        if changes.is_some() {
            let mut entries = Vec::new();
            let mut count = 0;
            for part in &self.parts {
                count += part.write_entries(changes, &mut entries)?;
            }
            write_varint(count, out.buffer());
            out.buffer().extend_from_slice(&entries);
        } else {
            write_varint(self.parts.iter().map(StatePart::len).sum(), out.buffer());
            for part in &self.parts {
                part.write_entries(None, out)?;
            }
        }
        Ok(())
    }
}

impl<K: Key, V, S: Data, M, F> KeyedSnapshot for MapWithStateNode<K, V, S, M, F> {
    /// The layout of a `Vec<(K, S, Time)>` of every key, written from each
    /// partition's encoded keys (in memory or spilled) without decoding.
    fn write_whole(&self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        self.write_list(None, out)
    }

    /// The keys removed (a `Vec<K>`), then the changed keys' list.
    fn write_changes(&self, out: &mut dyn PayloadSink) -> Result<(), CoreError> {
        write_removed(&self.removed, out)?;
        self.write_list(Some(Changes { after: self.last_snapshot }), out)
    }

    fn mark_unchanged(&mut self) {
        self.removed.clear();
        let stepped = self.stepped;
        self.parts.iter_mut().for_each(|part| part.mark_unchanged(stepped));
        self.last_snapshot = self.stepped;
    }
}

/// What one `map_with_state` step does in each partition.
struct MapStep<'a, F> {
    func: &'a F,
    time: Time,
    /// Keys whose last data is older time out.
    threshold: Option<Time>,
    want_snapshots: bool,
}

/// A partition's mapped records, its state after the step (when read) and
/// the keys it removed.
type MapStepOut<K, S, M> = (Vec<M>, Vec<(K, S)>, Vec<K>);

impl<F> MapStep<'_, F> {
    fn run<K: Key, V, S: Data, M>(
        &self,
        part: &mut MapPart<K, S>,
        records: Vec<(K, V)>,
    ) -> Result<MapStepOut<K, S, M>, CoreError>
    where
        F: Fn(&K, Option<V>, &mut State<S>) -> M,
    {
        let (mapped, removed) = match part {
            StatePart::Memory(states) => self.run_in_memory(states, records)?,
            StatePart::Spilled(spilled) => self.run_spilled(spilled, records)?,
        };
        let snapshot = if self.want_snapshots {
            part.decoded()?.into_iter().map(|(key, state, _)| (key, state)).collect()
        } else {
            Vec::new()
        };
        Ok((mapped, snapshot, removed))
    }

    fn run_in_memory<K: Key, V, S: Clone, M>(
        &self,
        part: &mut KeyedStates<K, Entry<S>>,
        records: Vec<(K, V)>,
    ) -> Result<(Vec<M>, Vec<K>), CoreError>
    where
        F: Fn(&K, Option<V>, &mut State<S>) -> M,
    {
        let (mut mapped, mut removed) = (Vec::with_capacity(records.len()), Vec::new());
        for (key, value) in records {
            let id = part.id(&key)?;
            let old = part.take(id);
            let existed = old.is_some();
            let mut state = State::new(old.map(|entry| entry.state), false);
            mapped.push((self.func)(&key, Some(value), &mut state));
            match state.value {
                Some(value) => part.put(id, Entry { state: value, last: self.time, changed: true }),
                None => {
                    part.remove(id);
                    if existed {
                        removed.push(key);
                    }
                }
            }
        }
        if let Some(threshold) = self.threshold {
            for id in part.ids() {
                if part.state(id).is_none_or(|entry| entry.last >= threshold) {
                    continue;
                }
                let (key, entry) = (part.key(id)?, part.take(id));
                let mut state = State::new(entry.map(|entry| entry.state), true);
                mapped.push((self.func)(&key, None, &mut state));
                part.remove(id);
                removed.push(key);
            }
        }
        Ok((mapped, removed))
    }

    /// The same step on a partition in a spill table: the keys the batch
    /// touches are read once, changed in memory, and written at the end.
    fn run_spilled<K: Key, V, S: Data, M>(
        &self,
        part: &mut SpilledStates,
        records: Vec<(K, V)>,
    ) -> Result<(Vec<M>, Vec<K>), CoreError>
    where
        F: Fn(&K, Option<V>, &mut State<S>) -> M,
    {
        let (mut mapped, mut removed) = (Vec::with_capacity(records.len()), Vec::new());
        let encoded: Vec<Vec<u8>> = records.iter().map(|(key, _)| spilled::encode(key)).collect::<Result<_, _>>()?;
        let mut touched: HashMap<Vec<u8>, Pending<S>> = part.pending_by_key(encoded.iter())?;
        for ((key, value), encoded) in records.into_iter().zip(&encoded) {
            let pending = touched
                .get_mut(encoded)
                .ok_or_else(|| CoreError::Decode { reason: "spilled state: a key of the batch was not read".into() })?;
            let old = pending.now.take();
            let existed = old.is_some();
            let mut state = State::new(old.map(|(state, _)| state), false);
            mapped.push((self.func)(&key, Some(value), &mut state));
            match state.value {
                Some(value) => pending.now = Some((value, self.time)),
                None if existed => removed.push(key),
                None => {}
            }
        }
        if let Some(threshold) = self.threshold {
            for (encoded, idle) in part.idle_before::<S>(threshold)? {
                // A key with data in this batch is not idle: it stays
                // indexed, at this batch, unless that data removed it.
                if let Some(now) = touched.get(&encoded) {
                    if now.now.is_some() {
                        part.index_at(&encoded, self.time);
                    }
                    continue;
                }
                let key: K = spilled::decode(&encoded)?;
                let mut state = State::new(idle.now.map(|(state, _)| state), true);
                mapped.push((self.func)(&key, None, &mut state));
                touched.insert(encoded, Pending { before: idle.before, now: None });
                removed.push(key);
            }
        }
        part.write_pending(touched, Some(self.time))?;
        Ok((mapped, removed))
    }
}

impl<K, V, S, M, F> StatefulNode for MapWithStateNode<K, V, S, M, F>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    F: Fn(&K, Option<V>, &mut State<S>) -> M + Send + Sync,
{
    /// The layout of a `Vec<(K, S, Time)>` of every key.
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        snapshot_frame(self, Snapshot::Whole)
    }

    /// [`Self::snapshot`]'s frame streamed: a state on disk need not fit in memory.
    fn snapshot_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        snapshot_streamed(self, Snapshot::Whole, out)
    }

    fn takes_changes(&self) -> bool {
        true
    }

    /// The keys removed (a `Vec<K>`), then the changed keys' list.
    fn snapshot_changes(&mut self) -> Option<Result<Vec<u8>, CoreError>> {
        Some(snapshot_frame(self, Snapshot::Changes))
    }

    /// [`Self::snapshot_changes`] streamed into its file.
    fn snapshot_changes_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        snapshot_streamed(self, Snapshot::Changes, out)
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        self.restore_from(&mut std::io::Cursor::new(bytes), partitions)
    }

    fn restore_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let mut payload = state_codec().open_streamed(reader)?;
        let count = payload.count()?;
        // Entry by entry as the file is read, so a state larger than memory
        // goes to its spill tables without being held whole, read or decoded.
        let entries = (0..count).map(|_| {
            payload.record().map_err(|e| CoreError::Decode { reason: format!("a map_with_state entry: {e}") })
        });
        self.removed.clear();
        (self.stepped, self.last_snapshot) = (None, None);
        self.spread(entries, partitions, false)?;
        payload.finish()
    }

    fn apply_changes(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        self.apply_changes_from(&mut std::io::Cursor::new(bytes), partitions)
    }

    /// The removed keys (a `Vec<K>`), then the changed keys' list, each
    /// applied as it is read.
    fn apply_changes_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let mut payload = state_codec().open_streamed(reader)?;
        self.respread(partitions)?;
        let decode_error = |e: CoreError| CoreError::Decode { reason: format!("map_with_state changes: {e}") };
        // Keys the state may hold already: read a group at a time.
        let mut grouped = Grouped::new(partitions, false);
        apply_removals::<K, _, S, _>(&mut payload, &mut self.parts, &mut grouped, decode_error)?;
        for _ in 0..payload.count()? {
            let (key, state, last): (K, S, Time) = payload.record().map_err(decode_error)?;
            self.restore_entry(key, Entry { state, last, changed: false }, partitions, &mut grouped)?;
        }
        grouped.flush(&mut self.parts)?;
        payload.finish()
    }

    fn use_spill(&mut self, operator: &str, spill: &StateSpill) {
        self.spill = Some(SpillPlace::new(operator, spill));
    }
}

/// The result of [`DStream::map_with_state`]: the mapped records and, on
/// request, the full state after each batch.
pub struct MapWithStateStream<K, S, M> {
    mapped: DStream<M>,
    snapshots: Arc<Slot<(K, S)>>,
}

impl<K, S, M> std::fmt::Debug for MapWithStateStream<K, S, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapWithStateStream").field("mapped", &self.mapped).finish_non_exhaustive()
    }
}

impl<K: Key, S: Data, M: Data> MapWithStateStream<K, S, M> {
    /// Names the stateful operator (its state is matched by this name on restore).
    pub fn name(mut self, name: &str) -> Self {
        self.mapped = self.mapped.name(name);
        self
    }

    /// What the function returned, one record per input record (and one per
    /// key timing out).
    pub fn mapped(&self) -> DStream<M> {
        self.mapped.clone()
    }

    /// Every key's state after each batch.
    pub fn state_snapshots(&self) -> DStream<(K, S)> {
        self.mapped.side_output("state_snapshots", &self.snapshots)
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Keeps a state per key: after each batch, every key with state or
    /// new values gets `update(new_values, old_state)`; `None` removes the
    /// key. The stream holds every key's state after each batch. Needs a
    /// checkpoint directory.
    pub fn update_state_by_key<S: Data, F>(&self, update: F) -> DStream<(K, S)>
    where
        F: Fn(Vec<V>, Option<S>) -> Option<S> + Send + Sync + 'static,
    {
        let input = self.reader();
        let mut meta = NodeMeta::new("update_state_by_key", vec![self.id], self.slide);
        meta.state = Some(state_meta::<K, V, S>());
        self.add_node(meta, |output| {
            Box::new(UpdateStateNode {
                input,
                output,
                update,
                parts: Vec::new(),
                greatest: None,
                spill: None,
                removed: Vec::new(),
                stepped: None,
                last_snapshot: None,
            })
        })
    }

    /// Calls `func(key, value, state)` for every record, in order within
    /// each key; the function reads and changes the key's state and returns
    /// a mapped record. With a `timeout`, a key without records for longer
    /// than the timeout gets one last call with no value and
    /// [`State::is_timing_out`], and its state is removed. Needs a
    /// checkpoint directory.
    pub fn map_with_state<S: Data, M: Data, F>(&self, func: F, timeout: Option<Duration>) -> MapWithStateStream<K, S, M>
    where
        F: Fn(&K, Option<V>, &mut State<S>) -> M + Send + Sync + 'static,
    {
        let input = self.reader();
        let mut meta = NodeMeta::new("map_with_state", vec![self.id], self.slide);
        meta.state = Some(state_meta::<K, V, S>());
        let snapshots = Slot::new();
        let node_snapshots = Arc::clone(&snapshots);
        let mapped = self.add_node(meta, |output| {
            Box::new(MapWithStateNode {
                input,
                output,
                snapshots: node_snapshots,
                func,
                timeout,
                parts: Vec::new(),
                removed: Vec::new(),
                spill: None,
                stepped: None,
                last_snapshot: None,
            })
        });
        MapWithStateStream { mapped, snapshots }
    }
}
