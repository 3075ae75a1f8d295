//! Per-key state across batches: `update_state_by_key` (Spark's
//! `StateDStream`) and `map_with_state` (Spark's `MapWithStateDStream`, with
//! an idle timeout per key).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, Duration, Time};

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, map_with_capacity, partition_of};
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx, state_codec};
use crate::pair::{combine_partitioned, partition_records};
use crate::stream::DStream;

/// Spreads entries over `partitions` maps by key.
fn spread<K: Key, S>(entries: Vec<(K, S)>, partitions: usize) -> Vec<KeyHashMap<K, S>> {
    let mut maps: Vec<KeyHashMap<K, S>> = (0..partitions).map(|_| map_with_capacity(0)).collect();
    for (key, value) in entries {
        if let Some(map) = maps.get_mut(partition_of(&key, partitions)) {
            map.insert(key, value);
        }
    }
    maps
}

fn respread<K: Key, S>(parts: &mut Vec<KeyHashMap<K, S>>, partitions: usize) {
    if parts.len() != partitions {
        let entries: Vec<(K, S)> = parts.drain(..).flatten().collect();
        *parts = spread(entries, partitions);
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

// ---------------------------------------------------------------------------
// update_state_by_key

struct UpdateStateNode<K, V, S, F> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<(K, S)>>,
    update: F,
    parts: Vec<KeyHashMap<K, S>>,
}

impl<K, V, S, F> Node for UpdateStateNode<K, V, S, F>
where
    K: Key,
    V: Data,
    S: Data,
    F: Fn(Vec<V>, Option<S>) -> Option<S> + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        respread(&mut self.parts, ctx.partitions);
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
        let update = &self.update;
        let work: Vec<_> = self.parts.iter_mut().zip(groups).collect();
        let out = ctx.par(work, |(part, mut groups)| {
            let old = std::mem::take(part);
            let mut next: KeyHashMap<K, S> = map_with_capacity(old.len() + groups.len());
            for (key, state) in old {
                let values = groups.remove(&key).unwrap_or_default();
                if let Some(state) = update(values, Some(state)) {
                    next.insert(key, state);
                }
            }
            for (key, values) in groups {
                if let Some(state) = update(values, None) {
                    next.insert(key, state);
                }
            }
            let snapshot: Vec<(K, S)> = next.iter().map(|(k, s)| (k.clone(), s.clone())).collect();
            *part = next;
            snapshot
        })?;
        self.output.put(ctx.time, Some(Batch::new(out)));
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<K, V, S, F> StatefulNode for UpdateStateNode<K, V, S, F>
where
    K: Key,
    V: Data,
    S: Data,
    F: Fn(Vec<V>, Option<S>) -> Option<S> + Send + Sync,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let entries: Vec<(&K, &S)> = self.parts.iter().flat_map(|p| p.iter()).collect();
        state_codec().encode(&entries)
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let entries: Vec<(K, S)> = state_codec().decode(bytes)?.value;
        self.parts = spread(entries, partitions);
        Ok(())
    }
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
    parts: Vec<KeyHashMap<K, Entry<S>>>,
    /// Keys removed since the last snapshot (a key removed and given state
    /// again is also in `parts`, marked changed).
    removed: Vec<K>,
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

impl<K, V, S, M, F> Node for MapWithStateNode<K, V, S, M, F>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    F: Fn(&K, Option<V>, &mut State<S>) -> M + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        respread(&mut self.parts, ctx.partitions);
        let Some(batch) = ctx.take_owned(&self.input)? else {
            self.output.put(ctx.time, None);
            self.snapshots.put(ctx.time, None);
            return Ok(None);
        };
        let records = partition_records(ctx, batch.into_partitions(), ctx.partitions)?;
        let (func, time) = (&self.func, ctx.time);
        let threshold = self.timeout.map(|timeout| time - timeout);
        let want_snapshots = self.snapshots.readers() > 0;
        let work: Vec<_> = self.parts.iter_mut().zip(records).collect();
        let out = ctx.par(work, |(part, records)| {
            let (mut mapped, mut removed) = (Vec::with_capacity(records.len()), Vec::new());
            for (key, value) in records {
                let old = part.remove(&key);
                let existed = old.is_some();
                let mut state = State::new(old.map(|entry| entry.state), false);
                mapped.push(func(&key, Some(value), &mut state));
                match state.value {
                    Some(value) => {
                        part.insert(key, Entry { state: value, last: time, changed: true });
                    }
                    None if existed => removed.push(key),
                    None => {}
                }
            }
            if let Some(threshold) = threshold {
                for (key, entry) in part.extract_if(|_, entry| entry.last < threshold) {
                    let mut state = State::new(Some(entry.state), true);
                    mapped.push(func(&key, None, &mut state));
                    removed.push(key);
                }
            }
            let snapshot: Vec<(K, S)> = if want_snapshots {
                part.iter().map(|(k, entry)| (k.clone(), entry.state.clone())).collect()
            } else {
                Vec::new()
            };
            (mapped, snapshot, removed)
        })?;
        let mut mapped = Vec::with_capacity(out.len());
        let mut snapshots = Vec::with_capacity(out.len());
        for (records, snapshot, removed) in out {
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

#[derive(Serialize)]
struct MapStateRef<'a, K, S> {
    entries: Vec<(&'a K, &'a S, Time)>,
}

#[derive(Deserialize)]
struct MapStateOwned<K, S> {
    entries: Vec<(K, S, Time)>,
}

/// What changed since the previous snapshot: the keys removed, then the
/// keys given state (a key removed and given state again is in both).
#[derive(Serialize)]
struct MapStateChangesRef<'a, K, S> {
    removed: &'a [K],
    changed: Vec<(&'a K, &'a S, Time)>,
}

#[derive(Deserialize)]
struct MapStateChangesOwned<K, S> {
    removed: Vec<K>,
    changed: Vec<(K, S, Time)>,
}

impl<K, V, S, M, F> MapWithStateNode<K, V, S, M, F> {
    /// Forgets what changed: the next changes are relative to now.
    fn mark_unchanged(&mut self) {
        self.removed.clear();
        for entry in self.parts.iter_mut().flat_map(|p| p.values_mut()) {
            entry.changed = false;
        }
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
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let entries = self.parts.iter().flat_map(|p| p.iter()).map(|(k, e)| (k, &e.state, e.last)).collect();
        let bytes = state_codec().encode(&MapStateRef { entries })?;
        self.mark_unchanged();
        Ok(bytes)
    }

    fn snapshot_changes(&mut self) -> Option<Result<Vec<u8>, CoreError>> {
        let changed =
            self.parts.iter().flat_map(|p| p.iter()).filter(|(_, e)| e.changed).map(|(k, e)| (k, &e.state, e.last));
        let bytes = state_codec().encode(&MapStateChangesRef { removed: &self.removed, changed: changed.collect() });
        if bytes.is_ok() {
            self.mark_unchanged();
        }
        Some(bytes)
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let owned: MapStateOwned<K, S> = state_codec().decode(bytes)?.value;
        let entries = owned.entries.into_iter().map(|(k, state, last)| (k, Entry { state, last, changed: false }));
        self.parts = spread(entries.collect(), partitions);
        self.removed.clear();
        Ok(())
    }

    fn apply_changes(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let changes: MapStateChangesOwned<K, S> = state_codec().decode(bytes)?.value;
        respread(&mut self.parts, partitions);
        for key in changes.removed {
            if let Some(part) = self.parts.get_mut(partition_of(&key, partitions)) {
                part.remove(&key);
            }
        }
        for (key, state, last) in changes.changed {
            if let Some(part) = self.parts.get_mut(partition_of(&key, partitions)) {
                part.insert(key, Entry { state, last, changed: false });
            }
        }
        Ok(())
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
        self.add_node(meta, |output| Box::new(UpdateStateNode { input, output, update, parts: Vec::new() }))
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
            })
        });
        MapWithStateStream { mapped, snapshots }
    }
}
