//! The sliding window without an inverse function
//! ([`DStream::reduce_by_key_and_window`](crate::DStream::reduce_by_key_and_window)),
//! its panes kept compact.
//!
//! Batches are combined into panes of `gcd(length, slide)`, and the panes
//! of the window sit in a two-stack queue: the back stack keeps the raw
//! panes and their running aggregate, the front stack keeps suffix
//! aggregates, rebuilt from the back when it runs dry. A slide costs
//! O(keys) amortized, whatever `length / slide` is.
//!
//! A window of 30 s sliding by 2 s holds some 30 panes and aggregates, and
//! a busy key is in nearly all of them. So each partition keeps its keys
//! once, in a [`KeyTable`] that names each by a dense id, and every pane
//! and aggregate is a [`Run`]: ids ascending in one array, their values in
//! another. Combining two of them is a merge of sorted arrays. A key's id
//! is given back when the oldest pane leaves and no pane or aggregate
//! still holds it (every pane's keys are in the open pane, the back
//! aggregate or the oldest front aggregate, so those three are all a pop
//! needs to look at).
//!
//! A snapshot is whole: per partition, its keys with their ids and its
//! runs. A restore onto another partition count re-keys by value.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, Duration, FrameCodec, Time};

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, map_with_capacity, partition_of};
use crate::keyed::{ByteString, KeyTable, OwnedByteString};
use crate::node::{Node, Slot, StatefulNode, StepCtx};
use crate::pair::{KeyedCombine, combines_on_arrival};
use crate::runs::{Cursor, Run, Side, walk};

/// Version 1 kept pairs by key, partitions merged; version 2 is the
/// compact form.
const PANE_WINDOW_STATE_VERSION: u16 = 2;

fn codec() -> FrameCodec {
    FrameCodec::new(PANE_WINDOW_STATE_VERSION).with_max_payload(1 << 30).with_max_decoded(4 << 30)
}

/// A place in one partition's queue, for copying it level by level.
#[derive(Clone, Copy)]
enum Level {
    Open,
    BackAggregate,
    Front(usize),
    Back(usize),
}

/// Every level of a queue with `front` and `back` panes, in the order
/// [`PanePart::set_level`] fills them.
fn levels(front: usize, back: usize) -> impl Iterator<Item = Level> {
    [Level::Open, Level::BackAggregate]
        .into_iter()
        .chain((0..front).map(Level::Front))
        .chain((0..back).map(Level::Back))
}

/// One partition's panes. `front` holds suffix aggregates with the oldest
/// pane last (`front.last()` aggregates the whole front stack); `back`
/// holds raw panes, oldest first, and `back_agg` their aggregate.
struct PanePart<K, V> {
    keys: KeyTable<K>,
    open: Run<V>,
    front: Vec<Run<V>>,
    back: Vec<Run<V>>,
    back_agg: Run<V>,
}

impl<K, V> Default for PanePart<K, V> {
    fn default() -> Self {
        PanePart {
            keys: KeyTable::default(),
            open: Run::default(),
            front: Vec::new(),
            back: Vec::new(),
            back_agg: Run::default(),
        }
    }
}

impl<K: Key, V: Data> PanePart<K, V> {
    /// Folds one batch, reduced by key, into the open pane.
    fn absorb<R: Fn(&V, &V) -> V>(&mut self, batch: KeyHashMap<K, V>, reduce: &R) -> Result<(), CoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(batch.len());
        for (key, value) in batch {
            entries.push((self.keys.insert(&key)?, value));
        }
        let batch = Run::from_entries(entries).ok_or_else(|| decode_error("a key twice in a batch"))?;
        self.open = if self.open.is_empty() {
            batch
        } else {
            Run::merge_from(std::mem::take(&mut self.open), &batch, |a, b| *a = reduce(a, b))
        };
        Ok(())
    }

    fn close_pane<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) {
        let pane = std::mem::take(&mut self.open);
        self.back_agg = Run::merge_from(std::mem::take(&mut self.back_agg), &pane, |a, b| *a = reduce(a, b));
        self.back.push(pane);
    }

    fn pop_oldest<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) {
        if self.front.is_empty() {
            self.flip(reduce);
        }
        if let Some(oldest) = self.front.pop() {
            self.free_unheld(&oldest);
        }
    }

    /// Gives back the ids of `gone` that no pane or aggregate holds any more.
    fn free_unheld(&mut self, gone: &Run<V>) {
        let mut held =
            [Cursor::new(Some(&self.open)), Cursor::new(Some(&self.back_agg)), Cursor::new(self.front.last())];
        let unheld: Vec<u32> = gone.ids.iter().copied().filter(|id| !held.iter_mut().any(|c| c.holds(*id))).collect();
        for id in unheld {
            self.keys.remove(id);
        }
    }

    /// Moves the back stack to the front, computing suffix aggregates
    /// newest to oldest (each pane is older than the aggregate it joins).
    fn flip<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) {
        let panes = std::mem::take(&mut self.back);
        self.back_agg = Run::default();
        let mut front: Vec<Run<V>> = Vec::with_capacity(panes.len());
        for pane in panes.into_iter().rev() {
            let aggregate = match front.last() {
                Some(newer) => Run::merge_from(pane, newer, |a, b| *a = reduce(a, b)),
                None => pane,
            };
            front.push(aggregate);
        }
        self.front = front;
    }

    /// The window's result: the front aggregate ⊕ the back aggregate.
    fn query<R: Fn(&V, &V) -> V>(&self, reduce: &R) -> Result<Vec<(K, V)>, CoreError> {
        let empty = Run::default();
        let front = self.front.last().unwrap_or(&empty);
        let mut out = Vec::with_capacity(front.len().max(self.back_agg.len()));
        let mut failed = None;
        walk(front.entries(), self.back_agg.entries(), |id, side| {
            let key = match self.keys.key(id) {
                Ok(Some(key)) => key,
                Ok(None) => return,
                Err(e) => return failed = failed.take().or(Some(e)),
            };
            let value = match side {
                Side::Older(value) | Side::Newer(value) => value.clone(),
                Side::Both(front, back) => reduce(front, back),
            };
            out.push((key, value));
        });
        failed.map_or(Ok(out), Err)
    }

    fn run(&self, level: Level) -> Option<&Run<V>> {
        match level {
            Level::Open => Some(&self.open),
            Level::BackAggregate => Some(&self.back_agg),
            Level::Front(index) => self.front.get(index),
            Level::Back(index) => self.back.get(index),
        }
    }

    /// Fills `level` (levels come in the order [`levels`] lists them).
    fn set_level(&mut self, level: Level, run: Run<V>) {
        match level {
            Level::Open => self.open = run,
            Level::BackAggregate => self.back_agg = run,
            Level::Front(_) => self.front.push(run),
            Level::Back(_) => self.back.push(run),
        }
    }

    /// The entries of `level` by key.
    fn pairs(&self, level: Level) -> impl Iterator<Item = Result<(K, V), CoreError>> + '_ {
        let entries = self.run(level).into_iter().flat_map(Run::entries);
        entries.filter_map(|(id, value)| self.keys.key(id).map(|key| Some((key?, value.clone()))).transpose())
    }

    /// Rebuilds a partition from a snapshot, checking that it holds together.
    fn install(owned: PartOwned<V>, front_len: usize, back_len: usize) -> Result<Self, CoreError> {
        let mut part = PanePart::default();
        for (id, OwnedByteString(key)) in owned.keys {
            part.keys.insert_at(id, &key)?;
        }
        part.keys.rebuild_free();
        (part.open, part.front, part.back, part.back_agg) = (owned.open, owned.front, owned.back, owned.back_agg);
        if part.front.len() != front_len || part.back.len() != back_len {
            return Err(decode_error("a partition's pane stacks and the window's end times differ in length"));
        }
        let mut runs = levels(front_len, back_len).filter_map(|level| part.run(level));
        if !runs.all(|run| run.is_well_formed(|id| part.keys.contains(id))) {
            return Err(decode_error("a pane whose ids are out of order, without a value or without a key"));
        }
        Ok(part)
    }
}

/// Spreads pairs by key over `parts`, as one level of each.
fn spread_level<K: Key, V: Data>(
    parts: &mut [PanePart<K, V>],
    level: Level,
    pairs: impl Iterator<Item = Result<(K, V), CoreError>>,
) -> Result<(), CoreError> {
    let count = parts.len();
    let mut entries: Vec<Vec<(u32, V)>> = (0..count).map(|_| Vec::new()).collect();
    for pair in pairs {
        let (key, value) = pair?;
        let target = partition_of(&key, count);
        if let (Some(part), Some(list)) = (parts.get_mut(target), entries.get_mut(target)) {
            list.push((part.keys.insert(&key)?, value));
        }
    }
    for (part, list) in parts.iter_mut().zip(entries) {
        part.set_level(level, Run::from_entries(list).ok_or_else(|| decode_error("a key twice in a pane"))?);
    }
    Ok(())
}

/// Copies the queues of `old` onto `partitions` partitions, by key, one
/// level at a time (so no more than one level is copied at once).
fn respread<K: Key, V: Data>(
    old: &[PanePart<K, V>],
    front_len: usize,
    back_len: usize,
    partitions: usize,
) -> Result<Vec<PanePart<K, V>>, CoreError> {
    let mut parts: Vec<PanePart<K, V>> = (0..partitions.max(1)).map(|_| PanePart::default()).collect();
    for level in levels(front_len, back_len) {
        spread_level(&mut parts, level, old.iter().flat_map(|part| part.pairs(level)))?;
    }
    Ok(parts)
}

fn decode_error(reason: &str) -> CoreError {
    CoreError::Decode { reason: format!("pane window state: {reason}") }
}

/// A partition as a snapshot writes it.
#[derive(Serialize)]
struct PartRef<'a, V> {
    /// Each key's encoding with its id.
    keys: Vec<(u32, ByteString<'a>)>,
    open: &'a Run<V>,
    front: &'a [Run<V>],
    back: &'a [Run<V>],
    back_agg: &'a Run<V>,
}

/// A partition as a snapshot is read back.
#[derive(Deserialize)]
struct PartOwned<V> {
    keys: Vec<(u32, OwnedByteString)>,
    open: Run<V>,
    front: Vec<Run<V>>,
    back: Vec<Run<V>>,
    back_agg: Run<V>,
}

/// A snapshot's frame: the panes' end times and each partition's queue.
#[derive(Serialize, Deserialize)]
struct Snapshot<P> {
    front_ends: Vec<Time>,
    back_ends: Vec<Time>,
    parts: Vec<P>,
}

/// The snapshot version 1 wrote: each level's pairs by key, partitions merged.
#[derive(Deserialize)]
struct SnapshotV1<K, V> {
    front_ends: Vec<Time>,
    back_ends: Vec<Time>,
    open: Vec<(K, V)>,
    front: Vec<Vec<(K, V)>>,
    back: Vec<Vec<(K, V)>>,
    back_agg: Vec<(K, V)>,
}

impl<K: Key, V: Data> SnapshotV1<K, V> {
    fn into_parts(self, partitions: usize) -> Result<Vec<PanePart<K, V>>, CoreError> {
        if self.front.len() != self.front_ends.len() || self.back.len() != self.back_ends.len() {
            return Err(decode_error("pane stacks and their end times differ in length"));
        }
        let mut parts: Vec<PanePart<K, V>> = (0..partitions.max(1)).map(|_| PanePart::default()).collect();
        spread_level(&mut parts, Level::Open, self.open.into_iter().map(Ok))?;
        spread_level(&mut parts, Level::BackAggregate, self.back_agg.into_iter().map(Ok))?;
        for (index, pane) in self.front.into_iter().enumerate() {
            spread_level(&mut parts, Level::Front(index), pane.into_iter().map(Ok))?;
        }
        for (index, pane) in self.back.into_iter().enumerate() {
            spread_level(&mut parts, Level::Back(index), pane.into_iter().map(Ok))?;
        }
        Ok(parts)
    }
}

pub(crate) struct PaneWindowNode<K, V, R> {
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
    pub(crate) fn new(
        input: Arc<Slot<(K, V)>>,
        output: Arc<Slot<(K, V)>>,
        reduce: Arc<R>,
        combine: KeyedCombine<K, V, V>,
        length: Duration,
        slide: Duration,
    ) -> Self {
        let pane = Duration::from_millis(gcd(length.as_millis(), slide.as_millis()).max(1));
        PaneWindowNode {
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
        }
    }

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

    /// Re-spreads the panes when the partition count differs (before the
    /// first batch, or after a restore on a machine with another core count).
    fn fit(&mut self, partitions: usize) -> Result<(), CoreError> {
        if self.parts.len() != partitions {
            self.parts = respread(&self.parts, self.front_ends.len(), self.back_ends.len(), partitions)?;
        }
        Ok(())
    }
}

fn internal(ctx: &StepCtx<'_>, error: &CoreError) -> DStreamError {
    DStreamError::Internal { operator: ctx.operator.to_string(), reason: format!("pane window state: {error}") }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl<K, V, R> Node for PaneWindowNode<K, V, R>
where
    K: Key,
    V: Data,
    R: Fn(&V, &V) -> V + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        self.fit(ctx.partitions).map_err(|e| internal(ctx, &e))?;
        let batches: Vec<KeyHashMap<K, V>> = match ctx.take_owned(&self.input)? {
            Some(batch) => self.combine.partitioned(ctx, Some(batch))?,
            None => (0..ctx.partitions).map(|_| map_with_capacity(0)).collect(),
        };
        let close = ctx.time.is_multiple_of(self.pane);
        if close {
            self.back_ends.push(ctx.time);
        }
        let pops = self.pop_ends(ctx.time - self.length);
        let query = ctx.time.is_multiple_of(self.slide);
        let reduce = &*self.reduce;
        let work: Vec<_> = self.parts.iter_mut().zip(batches).collect();
        let out = ctx.par(work, |(part, batch)| {
            part.absorb(batch, reduce)?;
            if close {
                part.close_pane(reduce);
            }
            for _ in 0..pops {
                part.pop_oldest(reduce);
            }
            query.then(|| part.query(reduce)).transpose()
        })?;
        let mut results = Vec::new();
        for part in out {
            results.extend(part.map_err(|e| internal(ctx, &e))?);
        }
        let result = query.then(|| Batch::new(results));
        self.output.put(ctx.time, result);
        Ok(None)
    }

    combines_on_arrival!();

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<K, V, R> StatefulNode for PaneWindowNode<K, V, R>
where
    K: Key,
    V: Data,
    R: Fn(&V, &V) -> V + Send + Sync,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let parts: Vec<PartRef<'_, V>> = self
            .parts
            .iter()
            .map(|part| PartRef {
                keys: part.keys.iter_encoded().map(|(id, key)| (id, ByteString(key))).collect(),
                open: &part.open,
                front: &part.front,
                back: &part.back,
                back_agg: &part.back_agg,
            })
            .collect();
        codec().encode(&Snapshot { front_ends: self.front_ends.clone(), back_ends: self.back_ends.clone(), parts })
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let codec = codec();
        let frame = codec.open(bytes)?;
        if frame.version < PANE_WINDOW_STATE_VERSION {
            let old: SnapshotV1<K, V> = codec.decode_payload(frame.payload)?;
            (self.front_ends, self.back_ends) = (old.front_ends.clone(), old.back_ends.clone());
            self.parts = old.into_parts(partitions)?;
            return Ok(());
        }
        let snapshot: Snapshot<PartOwned<V>> = codec.decode_payload(frame.payload)?;
        let (front_len, back_len) = (snapshot.front_ends.len(), snapshot.back_ends.len());
        self.parts = snapshot
            .parts
            .into_iter()
            .map(|part| PanePart::install(part, front_len, back_len))
            .collect::<Result<_, _>>()?;
        (self.front_ends, self.back_ends) = (snapshot.front_ends, snapshot.back_ends);
        self.fit(partitions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_given_back_once_no_pane_holds_it() {
        let sum = |a: &u64, b: &u64| a + b;
        let mut part: PanePart<String, u64> = PanePart::default();
        let batch = |keys: &[&str]| keys.iter().map(|k| (k.to_string(), 1)).collect::<KeyHashMap<String, u64>>();
        let keys = |part: &PanePart<String, u64>| {
            let ids = part.keys.iter_encoded().map(|(id, _)| id);
            let mut keys: Vec<String> = ids.map(|id| part.keys.key(id).unwrap().unwrap()).collect();
            keys.sort();
            keys
        };
        part.absorb(batch(&["a", "b"]), &sum).unwrap();
        part.close_pane(&sum);
        part.absorb(batch(&["b", "c"]), &sum).unwrap();
        part.close_pane(&sum);
        assert_eq!(keys(&part), ["a", "b", "c"]);
        part.pop_oldest(&sum);
        // "a" was only in the pane that left; "b" is still in the newer one.
        assert_eq!(keys(&part), ["b", "c"]);
        let mut result = part.query(&sum).unwrap();
        result.sort();
        assert_eq!(result, [("b".to_string(), 1), ("c".to_string(), 1)]);
        part.pop_oldest(&sum);
        assert_eq!(part.keys.len(), 0, "every key left with the last pane");
        assert!(part.query(&sum).unwrap().is_empty());
    }

    #[test]
    fn a_snapshot_with_a_pane_out_of_order_or_without_a_key_is_refused() {
        let encode =
            |key: &str| OwnedByteString(bincode::serde::encode_to_vec(key, bincode::config::standard()).unwrap());
        let install = PanePart::<String, u64>::install;
        let part = |open: Run<u64>| PartOwned {
            keys: vec![(0, encode("a")), (1, encode("b"))],
            open,
            front: vec![],
            back: vec![],
            back_agg: Run::default(),
        };
        assert!(install(part(Run { ids: vec![0, 1], values: vec![1, 2] }), 0, 0).is_ok());
        assert!(install(part(Run { ids: vec![1, 0], values: vec![1, 2] }), 0, 0).is_err());
        assert!(install(part(Run { ids: vec![0, 2], values: vec![1, 2] }), 0, 0).is_err());
        assert!(install(part(Run { ids: vec![0, 1], values: vec![1] }), 0, 0).is_err());
        assert!(install(part(Run::default()), 1, 0).is_err(), "a stack of the wrong depth");
    }
}
