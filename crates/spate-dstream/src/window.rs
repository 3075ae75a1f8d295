//! Windowed operators.
//!
//! A window of length `L` sliding by `S` produces, at every time `t` that
//! is a multiple of `S`, the result over the batches with times in
//! `(t - L, t]`. Slide times are absolute multiples of `S`, so they do not
//! move when a graph restarts.
//!
//! Three strategies, each keeping exactly the data its future windows need
//! (and dropping the rest), and each checkpointed as data:
//!
//! - [`DStream::window`] keeps the batches themselves.
//! - With an inverse function (Spark's `ReducedWindowedDStream`), the window's
//!   per-key result is updated in place: each slide adds the batches that
//!   entered and subtracts (with the inverse) the batches that left, so a
//!   slide costs the batches moved, not the whole window. Its state is
//!   compact and snapshot by what changed (see [`crate::inverse_window`]).
//! - Without an inverse, for an associative function, batches are combined
//!   into panes of `gcd(L, S)`, and the panes of the window sit in a
//!   two-stack queue: the back stack keeps a running aggregate, the front
//!   stack keeps suffix aggregates, rebuilt from the back when it runs dry.
//!   A slide costs O(keys) amortized, whatever `L / S` is.
//!
//! The two by-key windows reduce each batch by key before it enters the
//! window; right after a fed input (or a chain of partition-local operators
//! from one), that reduction runs on each block as it arrives (see
//! [`crate::arrival`]).

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, Duration, Time};

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, map_with_capacity, partition_of};
use crate::inverse_window::{InverseWindow, InverseWindowNode};
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx, state_codec};
use crate::pair::{KeyedCombine, combines_on_arrival};
use crate::stream::DStream;

/// True when `time` is a slide time of a window sliding by `slide`.
fn is_slide_time(time: Time, slide: Duration) -> bool {
    time.is_multiple_of(slide)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Merges `value` into `map[key]` as `reduce(existing, value)` (existing first).
#[inline]
fn merge_ref<K: Key, V: Data, R: Fn(&V, &V) -> V>(map: &mut KeyHashMap<K, V>, key: &K, value: &V, reduce: &R) {
    if let Some(existing) = map.get_mut(key) {
        *existing = reduce(existing, value);
    } else {
        map.insert(key.clone(), value.clone());
    }
}

/// Spreads entries over `partitions` maps by key.
fn split_entries<K: Key, V>(entries: Vec<(K, V)>, partitions: usize) -> Vec<KeyHashMap<K, V>> {
    let mut maps: Vec<KeyHashMap<K, V>> = (0..partitions).map(|_| map_with_capacity(0)).collect();
    for (key, value) in entries {
        if let Some(map) = maps.get_mut(partition_of(&key, partitions)) {
            map.insert(key, value);
        }
    }
    maps
}

// ---------------------------------------------------------------------------
// window(length, slide)

struct WindowNode<T> {
    input: Arc<Slot<T>>,
    output: Arc<Slot<T>>,
    length: Duration,
    slide: Duration,
    retained: VecDeque<(Time, Vec<Vec<T>>)>,
}

impl<T: Data> Node for WindowNode<T> {
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if let Some(batch) = ctx.take_owned(&self.input)? {
            self.retained.push_back((ctx.time, batch.into_partitions()));
        }
        let cutoff = ctx.time - self.length;
        while self.retained.front().is_some_and(|(time, _)| *time <= cutoff) {
            self.retained.pop_front();
        }
        let result = is_slide_time(ctx.time, self.slide).then(|| {
            let mut partitions = Vec::new();
            for (_, parts) in &self.retained {
                partitions.extend(parts.iter().cloned());
            }
            Batch::new(partitions)
        });
        self.output.put(ctx.time, result);
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<T: Data> StatefulNode for WindowNode<T> {
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        state_codec().encode(&self.retained)
    }

    fn restore(&mut self, bytes: &[u8], _partitions: usize) -> Result<(), CoreError> {
        self.retained = state_codec().decode(bytes)?.value;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Sliding aggregation without an inverse: panes in a two-stack queue.

/// One partition's panes. `front` holds suffix aggregates with the oldest
/// pane last (`front.last()` aggregates the whole front stack); `back`
/// holds raw panes, oldest first, and `back_agg` their aggregate.
struct PanePart<K, V> {
    open: KeyHashMap<K, V>,
    front: Vec<KeyHashMap<K, V>>,
    back: Vec<KeyHashMap<K, V>>,
    back_agg: KeyHashMap<K, V>,
}

impl<K, V> Default for PanePart<K, V> {
    fn default() -> Self {
        PanePart { open: map_with_capacity(0), front: Vec::new(), back: Vec::new(), back_agg: map_with_capacity(0) }
    }
}

/// `older ⊕ newer`, consuming the newer map into a copy of the older one.
fn combine_into<K: Key, V: Data, R: Fn(&V, &V) -> V>(
    older: &KeyHashMap<K, V>,
    newer: &KeyHashMap<K, V>,
    reduce: &R,
) -> KeyHashMap<K, V> {
    let mut out = older.clone();
    for (key, value) in newer {
        merge_ref(&mut out, key, value, reduce);
    }
    out
}

impl<K: Key, V: Data> PanePart<K, V> {
    fn absorb<R: Fn(&V, &V) -> V>(&mut self, batch: KeyHashMap<K, V>, reduce: &R) {
        if self.open.is_empty() {
            self.open = batch;
        } else {
            for (key, value) in &batch {
                merge_ref(&mut self.open, key, value, reduce);
            }
        }
    }

    fn close_pane<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) {
        let pane = std::mem::replace(&mut self.open, map_with_capacity(0));
        for (key, value) in &pane {
            merge_ref(&mut self.back_agg, key, value, reduce);
        }
        self.back.push(pane);
    }

    fn pop_oldest<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) {
        if self.front.is_empty() {
            self.flip(reduce);
        }
        self.front.pop();
    }

    /// Moves the back stack to the front, computing suffix aggregates
    /// newest to oldest (each pane is older than the aggregate it joins).
    fn flip<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) {
        let panes = std::mem::take(&mut self.back);
        self.back_agg = map_with_capacity(0);
        let mut front: Vec<KeyHashMap<K, V>> = Vec::with_capacity(panes.len());
        for pane in panes.into_iter().rev() {
            let aggregate = match front.last() {
                Some(newer) => combine_into(&pane, newer, reduce),
                None => pane,
            };
            front.push(aggregate);
        }
        self.front = front;
    }

    fn query<R: Fn(&V, &V) -> V>(&self, reduce: &R) -> Vec<(K, V)> {
        let whole = match self.front.last() {
            Some(front) => combine_into(front, &self.back_agg, reduce),
            None => self.back_agg.clone(),
        };
        whole.into_iter().collect()
    }
}

struct PaneWindowNode<K, V, R> {
    input: Arc<Slot<(K, V)>>,
    output: Arc<Slot<(K, V)>>,
    reduce: Arc<R>,
    /// Each batch reduced by key, on arrival where it can be.
    combine: KeyedCombine<K, V, V>,
    length: Duration,
    slide: Duration,
    pane: Duration,
    /// End times of the panes in the front stack, oldest last.
    front_ends: Vec<Time>,
    /// End times of the panes in the back stack, oldest first.
    back_ends: Vec<Time>,
    parts: Vec<PanePart<K, V>>,
}

impl<K, V, R> PaneWindowNode<K, V, R>
where
    K: Key,
    V: Data,
    R: Fn(&V, &V) -> V + Send + Sync,
{
    /// How many of the oldest panes end at or before `cutoff`, and updates
    /// the end-time stacks as the partitions will.
    fn pop_ends(&mut self, cutoff: Time) -> usize {
        let mut pops = 0;
        loop {
            if self.front_ends.is_empty() {
                if self.back_ends.first().is_none_or(|end| *end > cutoff) {
                    break;
                }
                self.front_ends = self.back_ends.drain(..).rev().collect();
            }
            match self.front_ends.last() {
                Some(end) if *end <= cutoff => {
                    self.front_ends.pop();
                    pops += 1;
                }
                _ => break,
            }
        }
        pops
    }

    fn install(&mut self, snapshot: PaneSnapshot<K, V>, partitions: usize) {
        let split_all = |maps: Vec<Vec<(K, V)>>| -> Vec<Vec<KeyHashMap<K, V>>> {
            maps.into_iter().map(|entries| split_entries(entries, partitions)).collect()
        };
        let mut open = split_entries(snapshot.open, partitions).into_iter();
        let mut back_agg = split_entries(snapshot.back_agg, partitions).into_iter();
        let mut front = split_all(snapshot.front);
        let mut back = split_all(snapshot.back);
        let mut parts = Vec::with_capacity(partitions);
        for index in 0..partitions {
            let take_column = |stack: &mut Vec<Vec<KeyHashMap<K, V>>>| -> Vec<KeyHashMap<K, V>> {
                stack.iter_mut().map(|maps| maps.get_mut(index).map(std::mem::take).unwrap_or_default()).collect()
            };
            parts.push(PanePart {
                open: open.next().unwrap_or_default(),
                front: take_column(&mut front),
                back: take_column(&mut back),
                back_agg: back_agg.next().unwrap_or_default(),
            });
        }
        self.front_ends = snapshot.front_ends;
        self.back_ends = snapshot.back_ends;
        self.parts = parts;
    }

    fn to_snapshot(&self) -> PaneSnapshotRef<'_, K, V> {
        PaneSnapshotRef {
            front_ends: &self.front_ends,
            back_ends: &self.back_ends,
            open: self.parts.iter().flat_map(|p| p.open.iter()).collect(),
            front: stack_column(&self.parts, |p| &p.front, self.front_ends.len()),
            back: stack_column(&self.parts, |p| &p.back, self.back_ends.len()),
            back_agg: self.parts.iter().flat_map(|p| p.back_agg.iter()).collect(),
        }
    }
}

/// The `len` levels of one stack, each level merged over all partitions.
fn stack_column<K, V, F>(parts: &[PanePart<K, V>], pick: F, len: usize) -> Vec<Vec<(&K, &V)>>
where
    F: Fn(&PanePart<K, V>) -> &Vec<KeyHashMap<K, V>>,
{
    (0..len).map(|i| parts.iter().filter_map(|p| pick(p).get(i)).flat_map(|m| m.iter()).collect()).collect()
}

#[derive(Serialize)]
struct PaneSnapshotRef<'a, K, V> {
    front_ends: &'a Vec<Time>,
    back_ends: &'a Vec<Time>,
    open: Vec<(&'a K, &'a V)>,
    front: Vec<Vec<(&'a K, &'a V)>>,
    back: Vec<Vec<(&'a K, &'a V)>>,
    back_agg: Vec<(&'a K, &'a V)>,
}

#[derive(Deserialize)]
struct PaneSnapshot<K, V> {
    front_ends: Vec<Time>,
    back_ends: Vec<Time>,
    open: Vec<(K, V)>,
    front: Vec<Vec<(K, V)>>,
    back: Vec<Vec<(K, V)>>,
    back_agg: Vec<(K, V)>,
}

impl<K, V, R> Node for PaneWindowNode<K, V, R>
where
    K: Key,
    V: Data,
    R: Fn(&V, &V) -> V + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if self.parts.len() != ctx.partitions {
            let snapshot = self.to_snapshot();
            let bytes = state_codec().encode(&snapshot).map_err(|e| internal(ctx, &e))?;
            let owned: PaneSnapshot<K, V> = state_codec().decode(&bytes).map_err(|e| internal(ctx, &e))?.value;
            self.install(owned, ctx.partitions);
        }
        let batches: Vec<KeyHashMap<K, V>> = match ctx.take_owned(&self.input)? {
            Some(batch) => self.combine.partitioned(ctx, Some(batch))?,
            None => (0..ctx.partitions).map(|_| map_with_capacity(0)).collect(),
        };
        let close = ctx.time.is_multiple_of(self.pane);
        if close {
            self.back_ends.push(ctx.time);
        }
        let pops = self.pop_ends(ctx.time - self.length);
        let query = is_slide_time(ctx.time, self.slide);
        let reduce = &*self.reduce;
        let work: Vec<_> = self.parts.iter_mut().zip(batches).collect();
        let out = ctx.par(work, |(part, batch)| {
            part.absorb(batch, reduce);
            if close {
                part.close_pane(reduce);
            }
            for _ in 0..pops {
                part.pop_oldest(reduce);
            }
            query.then(|| part.query(reduce))
        })?;
        let result = query.then(|| Batch::new(out.into_iter().flatten().collect()));
        self.output.put(ctx.time, result);
        Ok(None)
    }

    combines_on_arrival!();

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

fn internal(ctx: &StepCtx<'_>, error: &CoreError) -> DStreamError {
    DStreamError::Internal { operator: ctx.operator.to_string(), reason: format!("re-partitioning state: {error}") }
}

impl<K, V, R> StatefulNode for PaneWindowNode<K, V, R>
where
    K: Key,
    V: Data,
    R: Fn(&V, &V) -> V + Send + Sync,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        state_codec().encode(&self.to_snapshot())
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let snapshot: PaneSnapshot<K, V> = state_codec().decode(bytes)?.value;
        if snapshot.front.len() != snapshot.front_ends.len() || snapshot.back.len() != snapshot.back_ends.len() {
            return Err(CoreError::Decode { reason: "pane stacks and their end times differ in length".to_string() });
        }
        self.install(snapshot, partitions);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The public operators.

fn window_meta(kind: &'static str, parent: usize, length: Duration, slide: Duration, state: StateMeta) -> NodeMeta {
    let mut meta = NodeMeta::new(kind, vec![parent], slide);
    meta.window = Some((length, slide));
    meta.state = Some(state);
    meta
}

impl<T: Data> DStream<T> {
    /// The records of the batches in `(t - length, t]`, at every multiple `t` of `slide`.
    pub fn window(&self, length: Duration, slide: Duration) -> DStream<T> {
        let input = self.reader();
        let state = StateMeta {
            key_type: None,
            value_type: std::any::type_name::<T>(),
            state_type: std::any::type_name::<T>(),
            needs_checkpoint: false,
        };
        let meta = window_meta("window", self.id, length, slide, state);
        self.add_node(meta, |output| Box::new(WindowNode { input, output, length, slide, retained: VecDeque::new() }))
    }

    /// Reduces all records of each window to one (no record for an empty
    /// window), with an associative and commutative `reduce`. Incremental:
    /// panes in a two-stack queue.
    pub fn reduce_by_window<F>(&self, reduce: F, length: Duration, slide: Duration) -> DStream<T>
    where
        F: Fn(&T, &T) -> T + Send + Sync + 'static,
    {
        let windowed = self.map(|record| ((), record)).reduce_by_key_and_window(reduce, length, slide);
        let target = windowed.name_target;
        let mut out = windowed.map(|(_, value)| value).rename_kind("reduce_by_window");
        out.name_target = target;
        out
    }

    /// Like [`DStream::reduce_by_window`], updating the window with
    /// `inverse` as batches leave (needs a checkpoint directory).
    pub fn reduce_by_window_inv<F, G>(&self, reduce: F, inverse: G, length: Duration, slide: Duration) -> DStream<T>
    where
        F: Fn(&T, &T) -> T + Send + Sync + 'static,
        G: Fn(&T, &T) -> T + Send + Sync + 'static,
    {
        let windowed = self.map(|record| ((), record)).reduce_by_key_and_window_inv(reduce, inverse, length, slide);
        let target = windowed.name_target;
        let mut out = windowed.map(|(_, value)| value).rename_kind("reduce_by_window_inv");
        out.name_target = target;
        out
    }

    /// The number of records in each window (one record, 0 for a window
    /// with no records).
    pub fn count_by_window(&self, length: Duration, slide: Duration) -> DStream<u64> {
        let windowed = self.count().map(|count| ((), count)).reduce_by_key_and_window(|a, b| a + b, length, slide);
        let target = windowed.name_target;
        let mut out = windowed.map(|(_, count)| count).rename_kind("count_by_window");
        out.name_target = target;
        out
    }
}

impl<T: Key> DStream<T> {
    /// How often each distinct record occurs in each window (panes, no
    /// checkpoint directory needed).
    pub fn count_by_value_and_window(&self, length: Duration, slide: Duration) -> DStream<(T, u64)> {
        let counts = self.count_by_value().reduce_by_key_and_window(|a, b| a + b, length, slide);
        counts.rename_kind("count_by_value_and_window")
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Gathers each key's values over each window.
    pub fn group_by_key_and_window(&self, length: Duration, slide: Duration) -> DStream<(K, Vec<V>)> {
        let windowed = self.window(length, slide);
        let target = windowed.name_target;
        let mut out = windowed.group_by_key();
        out.name_target = target;
        out
    }

    /// Reduces each key's values over each window with an associative and
    /// commutative `reduce`. Each slide costs O(keys) amortized, however
    /// long the window is relative to the slide.
    pub fn reduce_by_key_and_window<F>(&self, reduce: F, length: Duration, slide: Duration) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        let input = self.reader();
        let state = StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<V>(),
            needs_checkpoint: false,
        };
        let meta = window_meta("reduce_by_key_and_window", self.id, length, slide, state);
        let pane = Duration::from_millis(gcd(length.as_millis(), slide.as_millis()).max(1));
        let reduce = Arc::new(reduce);
        let combine = KeyedCombine::reducing(Arc::clone(&reduce));
        self.add_node(meta, |output| {
            Box::new(PaneWindowNode {
                input,
                output,
                reduce,
                combine,
                length,
                slide,
                pane,
                front_ends: Vec::new(),
                back_ends: Vec::new(),
                parts: Vec::new(),
            })
        })
    }

    /// Reduces each key's values over each window incrementally: each slide
    /// adds the batches that entered with `reduce` and removes those that
    /// left with `inverse` (`inverse(reduce(a, b), b) == a`). Keys stay
    /// with their "zero" value once their batches left; see
    /// [`DStream::reduce_by_key_and_window_inv_filtered`]. Needs a checkpoint directory.
    pub fn reduce_by_key_and_window_inv<F, G>(
        &self,
        reduce: F,
        inverse: G,
        length: Duration,
        slide: Duration,
    ) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
        G: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        self.reduce_by_key_and_window_inv_filtered(reduce, inverse, length, slide, |_: &K, _: &V| true)
    }

    /// Like [`DStream::reduce_by_key_and_window_inv`], keeping in the window
    /// only the keys for which `keep` is true (for example, dropping keys
    /// whose count returned to zero).
    pub fn reduce_by_key_and_window_inv_filtered<F, G, P>(
        &self,
        reduce: F,
        inverse: G,
        length: Duration,
        slide: Duration,
        keep: P,
    ) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
        G: Fn(&V, &V) -> V + Send + Sync + 'static,
        P: Fn(&K, &V) -> bool + Send + Sync + 'static,
    {
        let input = self.reader();
        let state = StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<V>(),
            needs_checkpoint: true,
        };
        let meta = window_meta("reduce_by_key_and_window_inv", self.id, length, slide, state);
        let spec = InverseWindow { reduce, inverse, keep, length, slide, input_reduced: self.keys_partitioned() };
        self.add_node(meta, |output| Box::new(InverseWindowNode::new(input, output, spec)))
    }
}
