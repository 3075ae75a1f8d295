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
//! another. Combining two of them is a merge of sorted arrays. A slide
//! reads only three of them (the open pane, the back aggregate and the
//! oldest front aggregate); the others, read once, are kept encoded until
//! then, at about 2 bytes an entry for small counts. A key's id
//! is given back when the oldest pane leaves and no pane or aggregate
//! still holds it (every pane's keys are in the open pane, the back
//! aggregate or the oldest front aggregate, so those three are all a pop
//! needs to look at).
//!
//! A snapshot is whole: per partition, its keys with their ids and its
//! runs. A restore onto another partition count re-keys by value.

use std::borrow::Cow;
use std::sync::Arc;

use serde::ser::{Error as _, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};
use spate_core::{CoreError, Duration, FrameCodec, Time};

use crate::batch::{Batch, Data, Key};
use crate::combined::Combined;
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::partition_of;
use crate::keyed::{ByteString, EncodedSlice, KeyTable, OwnedByteString};
use crate::node::{Node, Slot, StatefulNode, StepCtx};
use crate::pair::{KeyedCombine, combines_on_arrival};
use crate::runs::{Cursor, Run, Side, walk};
use crate::top_n::{Greatest, Listed, take_greatest};

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

/// One partition's panes. The front stack holds suffix aggregates with the
/// oldest pane last: `front` all but the last, `front_last` the last
/// (which aggregates the whole front stack). `back` holds raw panes,
/// oldest first, and `back_agg` their aggregate.
///
/// A slide reads only the open pane, `front_last` and `back_agg`; the rest
/// is read once, when the front stack is rebuilt or a pane leaves. So the
/// rest is kept encoded ([`EncodedSlice`]: ids as varint gaps, values in
/// the state codec's encoding, about 2 bytes an entry for small counts)
/// and decoded when it is read.
struct PanePart<K, V> {
    keys: KeyTable<K>,
    open: Run<V>,
    front: Vec<EncodedSlice>,
    front_last: Option<Run<V>>,
    back: Vec<EncodedSlice>,
    back_agg: Run<V>,
}

impl<K, V> Default for PanePart<K, V> {
    fn default() -> Self {
        PanePart {
            keys: KeyTable::default(),
            open: Run::default(),
            front: Vec::new(),
            front_last: None,
            back: Vec::new(),
            back_agg: Run::default(),
        }
    }
}

/// A run, encoded.
fn pack<V: Data>(run: &Run<V>) -> Result<EncodedSlice, CoreError> {
    let mut entries: Vec<(u32, &V)> = run.entries().collect();
    EncodedSlice::encode(&mut entries)
}

/// An encoded run, decoded.
fn unpack<V: Data>(slice: &EncodedSlice) -> Result<Run<V>, CoreError> {
    let mut run = Run { ids: Vec::with_capacity(slice.len()), values: Vec::with_capacity(slice.len()) };
    slice.for_each(|id, value| {
        run.ids.push(id);
        run.values.push(value);
    })?;
    Ok(run)
}

impl<K: Key, V: Data> PanePart<K, V> {
    /// Folds one batch, reduced by key, into the open pane.
    fn absorb<R: Fn(&V, &V) -> V>(&mut self, batch: Combined<K, V>, reduce: &R) -> Result<(), CoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let entries = self.keys.insert_entries(batch, |_| {})?;
        let batch = Run::from_entries(entries).ok_or_else(|| decode_error("a key twice in a batch"))?;
        self.open = if self.open.is_empty() {
            batch
        } else {
            Run::merge_from(std::mem::take(&mut self.open), &batch, |a, b| *a = reduce(a, b))
        };
        Ok(())
    }

    fn close_pane<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) -> Result<(), CoreError> {
        let pane = std::mem::take(&mut self.open);
        self.back_agg = Run::merge_from(std::mem::take(&mut self.back_agg), &pane, |a, b| *a = reduce(a, b));
        self.back.push(pack(&pane)?);
        Ok(())
    }

    fn pop_oldest<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) -> Result<(), CoreError> {
        if self.front_last.is_none() {
            self.flip(reduce)?;
        }
        let next = self.front.pop().map(|slice| unpack(&slice)).transpose()?;
        if let Some(oldest) = std::mem::replace(&mut self.front_last, next) {
            self.free_unheld(&oldest);
        }
        Ok(())
    }

    /// Gives back the ids of `gone` that no pane or aggregate holds any more.
    fn free_unheld(&mut self, gone: &Run<V>) {
        let mut held =
            [Cursor::new(Some(&self.open)), Cursor::new(Some(&self.back_agg)), Cursor::new(self.front_last.as_ref())];
        let unheld: Vec<u32> = gone.ids.iter().copied().filter(|id| !held.iter_mut().any(|c| c.holds(*id))).collect();
        for id in unheld {
            self.keys.remove(id);
        }
    }

    /// Moves the back stack to the front, computing suffix aggregates
    /// newest to oldest (each pane is older than the aggregate it joins).
    fn flip<R: Fn(&V, &V) -> V>(&mut self, reduce: &R) -> Result<(), CoreError> {
        let panes = std::mem::take(&mut self.back);
        self.back_agg = Run::default();
        let mut front = Vec::with_capacity(panes.len());
        let mut newer: Option<Run<V>> = None;
        for pane in panes.iter().rev() {
            let pane = unpack(pane)?;
            newer = Some(match newer.take() {
                Some(newer) => {
                    let aggregate = Run::merge_from(pane, &newer, |a, b| *a = reduce(a, b));
                    front.push(pack(&newer)?);
                    aggregate
                }
                None => pane,
            });
        }
        (self.front, self.front_last) = (front, newer);
        Ok(())
    }

    /// The window's result: the front aggregate ⊕ the back aggregate;
    /// only its `greatest` records, when its only reader keeps no others.
    fn query<R: Fn(&V, &V) -> V>(
        &self,
        reduce: &R,
        greatest: Option<&Greatest<(K, V)>>,
    ) -> Result<Vec<(K, V)>, CoreError> {
        let empty = Run::default();
        let front = self.front_last.as_ref().unwrap_or(&empty);
        let mut out = Listed::new(greatest, front.len().max(self.back_agg.len()));
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
        failed.map_or_else(|| Ok(out.into_vec()), Err)
    }

    /// The run of `level`, decoded if it is kept encoded.
    fn run(&self, level: Level) -> Result<Option<Cow<'_, Run<V>>>, CoreError> {
        let packed = |slice: Option<&EncodedSlice>| slice.map(|s| unpack(s).map(Cow::Owned)).transpose();
        match level {
            Level::Open => Ok(Some(Cow::Borrowed(&self.open))),
            Level::BackAggregate => Ok(Some(Cow::Borrowed(&self.back_agg))),
            Level::Front(index) if index == self.front.len() => Ok(self.front_last.as_ref().map(Cow::Borrowed)),
            Level::Front(index) => packed(self.front.get(index)),
            Level::Back(index) => packed(self.back.get(index)),
        }
    }

    /// Fills `level` (levels come in the order [`levels`] lists them, and
    /// the front stack is filled oldest last).
    fn set_level(&mut self, level: Level, run: Run<V>) -> Result<(), CoreError> {
        match level {
            Level::Open => self.open = run,
            Level::BackAggregate => self.back_agg = run,
            Level::Front(_) => {
                if let Some(newer) = self.front_last.replace(run) {
                    self.front.push(pack(&newer)?);
                }
            }
            Level::Back(_) => self.back.push(pack(&run)?),
        }
        Ok(())
    }

    /// The entries of `level` by key.
    fn pairs(&self, level: Level) -> Result<Vec<(K, V)>, CoreError> {
        let Some(run) = self.run(level)? else { return Ok(Vec::new()) };
        let mut out = Vec::with_capacity(run.len());
        for (id, value) in run.entries() {
            if let Some(key) = self.keys.key(id)? {
                out.push((key, value.clone()));
            }
        }
        Ok(out)
    }

    /// Rebuilds a partition from a snapshot, checking that it holds together.
    fn install(owned: PartOwned<V>, front_len: usize, back_len: usize) -> Result<Self, CoreError> {
        let mut part = PanePart::default();
        for (id, OwnedByteString(key)) in owned.keys {
            part.keys.insert_at(id, &key)?;
        }
        part.keys.rebuild_free();
        if owned.front.len() != front_len || owned.back.len() != back_len {
            return Err(decode_error("a partition's pane stacks and the window's end times differ in length"));
        }
        let open = std::iter::once((Level::Open, owned.open)).chain([(Level::BackAggregate, owned.back_agg)]);
        let front = owned.front.into_iter().enumerate().map(|(index, run)| (Level::Front(index), run));
        let back = owned.back.into_iter().enumerate().map(|(index, run)| (Level::Back(index), run));
        for (level, run) in open.chain(front).chain(back) {
            if !run.is_well_formed(|id| part.keys.contains(id)) {
                return Err(decode_error("a pane whose ids are out of order, without a value or without a key"));
            }
            part.set_level(level, run)?;
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
        part.set_level(level, Run::from_entries(list).ok_or_else(|| decode_error("a key twice in a pane"))?)?;
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
        let mut pairs = Vec::new();
        for part in old {
            pairs.extend(part.pairs(level)?);
        }
        spread_level(&mut parts, level, pairs.into_iter().map(Ok))?;
    }
    Ok(parts)
}

fn decode_error(reason: &str) -> CoreError {
    CoreError::Decode { reason: format!("pane window state: {reason}") }
}

/// A partition as a snapshot writes it.
#[derive(Serialize)]
struct PartRef<'a, V: Data> {
    /// Each key's encoding with its id.
    keys: Vec<(u32, ByteString<'a>)>,
    open: &'a Run<V>,
    front: StackRef<'a, V>,
    back: StackRef<'a, V>,
    back_agg: &'a Run<V>,
}

/// A stack of runs, written as the runs themselves (as a `Vec<Run<V>>`),
/// each decoded only while it is written.
struct StackRef<'a, V> {
    packed: &'a [EncodedSlice],
    last: Option<&'a Run<V>>,
}

impl<V: Data> Serialize for StackRef<'_, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.packed.len() + usize::from(self.last.is_some())))?;
        for slice in self.packed {
            let run: Run<V> = unpack(slice).map_err(S::Error::custom)?;
            seq.serialize_element(&run)?;
        }
        if let Some(last) = self.last {
            seq.serialize_element(last)?;
        }
        seq.end()
    }
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
    /// The records its only reader keeps of each result (a `top_n`).
    greatest: Option<Greatest<(K, V)>>,
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
            greatest: None,
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
        self.fit(ctx.partitions).map_err(|e| ctx.state_error(&e))?;
        let batches: Vec<Combined<K, V>> = match ctx.take_owned(&self.input)? {
            Some(batch) => self.combine.partitioned(ctx, Some(batch))?,
            None => (0..ctx.partitions).map(|_| Combined::default()).collect(),
        };
        let close = ctx.time.is_multiple_of(self.pane);
        if close {
            self.back_ends.push(ctx.time);
        }
        let pops = self.pop_ends(ctx.time - self.length);
        let query = ctx.time.is_multiple_of(self.slide);
        let (reduce, greatest) = (&*self.reduce, self.greatest.as_ref());
        let work: Vec<_> = self.parts.iter_mut().zip(batches).collect();
        let out = ctx.par(work, |(part, batch)| {
            part.absorb(batch, reduce)?;
            if close {
                part.close_pane(reduce)?;
            }
            for _ in 0..pops {
                part.pop_oldest(reduce)?;
            }
            query.then(|| part.query(reduce, greatest)).transpose()
        })?;
        let mut results = Vec::new();
        for part in out {
            results.extend(part.map_err(|e| ctx.state_error(&e))?);
        }
        let result = query.then(|| Batch::new(results));
        self.output.put(ctx.time, result);
        Ok(None)
    }

    combines_on_arrival!();

    fn list_only_greatest(&mut self, greatest: Box<dyn std::any::Any>) {
        take_greatest(&mut self.greatest, greatest)
    }

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
                front: StackRef { packed: &part.front, last: part.front_last.as_ref() },
                back: StackRef { packed: &part.back, last: None },
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

    fn batch(keys: &[&str]) -> Combined<String, u64> {
        let mut batch = Combined::default();
        batch.fold(keys.iter().map(|k| (k.to_string(), 1)), |n| n, |a, n| *a += n);
        batch
    }

    /// A run of a snapshot by key, sorted.
    fn by_key(keys: &[(u32, OwnedByteString)], run: &Run<u64>) -> Vec<(String, u64)> {
        let key = |id: u32| {
            let (_, OwnedByteString(bytes)) = keys.iter().find(|(found, _)| *found == id).unwrap();
            bincode::serde::decode_from_slice::<String, _>(bytes, bincode::config::standard()).unwrap().0
        };
        let mut out: Vec<(String, u64)> = run.entries().map(|(id, value)| (key(id), *value)).collect();
        out.sort();
        out
    }

    #[test]
    fn a_snapshot_writes_the_encoded_panes_as_the_runs_they_hold() {
        let sum = |a: &u64, b: &u64| a + b;
        let mut part: PanePart<String, u64> = PanePart::default();
        for keys in [["a", "b"], ["b", "c"], ["c", "d"]] {
            part.absorb(batch(&keys), &sum).unwrap();
            part.close_pane(&sum).unwrap();
        }
        // The first pane leaves: the front stack is built, then its oldest goes.
        part.pop_oldest(&sum).unwrap();
        part.absorb(batch(&["e"]), &sum).unwrap();
        part.close_pane(&sum).unwrap();
        let written = PartRef {
            keys: part.keys.iter_encoded().map(|(id, key)| (id, ByteString(key))).collect(),
            open: &part.open,
            front: StackRef { packed: &part.front, last: part.front_last.as_ref() },
            back: StackRef { packed: &part.back, last: None },
            back_agg: &part.back_agg,
        };
        let bytes = bincode::serde::encode_to_vec(&written, bincode::config::standard()).unwrap();
        let (read, _): (PartOwned<u64>, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        let pairs = |run: &Run<u64>| by_key(&read.keys, run);
        let front: Vec<Vec<(String, u64)>> = read.front.iter().map(pairs).collect();
        let one = |k: &str, n: u64| (k.to_string(), n);
        assert_eq!(front, [vec![one("c", 1), one("d", 1)], vec![one("b", 1), one("c", 2), one("d", 1)]]);
        assert_eq!(read.back.iter().map(pairs).collect::<Vec<_>>(), [vec![one("e", 1)]]);
        let mut result = PanePart::<String, u64>::install(read, 2, 1).unwrap().query(&sum, None).unwrap();
        result.sort();
        assert_eq!(result, [one("b", 1), one("c", 2), one("d", 1), one("e", 1)]);
    }

    #[test]
    fn a_key_is_given_back_once_no_pane_holds_it() {
        let sum = |a: &u64, b: &u64| a + b;
        let mut part: PanePart<String, u64> = PanePart::default();
        let keys = |part: &PanePart<String, u64>| {
            let ids = part.keys.iter_encoded().map(|(id, _)| id);
            let mut keys: Vec<String> = ids.map(|id| part.keys.key(id).unwrap().unwrap()).collect();
            keys.sort();
            keys
        };
        part.absorb(batch(&["a", "b"]), &sum).unwrap();
        part.close_pane(&sum).unwrap();
        part.absorb(batch(&["b", "c"]), &sum).unwrap();
        part.close_pane(&sum).unwrap();
        assert_eq!(keys(&part), ["a", "b", "c"]);
        part.pop_oldest(&sum).unwrap();
        // "a" was only in the pane that left; "b" is still in the newer one.
        assert_eq!(keys(&part), ["b", "c"]);
        let mut result = part.query(&sum, None).unwrap();
        result.sort();
        assert_eq!(result, [("b".to_string(), 1), ("c".to_string(), 1)]);
        part.pop_oldest(&sum).unwrap();
        assert_eq!(part.keys.len(), 0, "every key left with the last pane");
        assert!(part.query(&sum, None).unwrap().is_empty());
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
