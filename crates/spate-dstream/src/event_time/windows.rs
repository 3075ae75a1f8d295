//! Keyed aggregation over event-time windows: tumbling and sliding windows
//! kept as panes, session windows kept per key, both with allowed lateness
//! and a late output.
//!
//! Sliding windows of size `L` every `S` are computed from panes of
//! `gcd(L, S)`: a record is folded into one pane of its key (first in the
//! partition that read it, so a batch ships one partial aggregate per key
//! and pane, not its records), and a window is the merge of its panes when
//! it is emitted. Sessions keep, per key, the open sessions sorted by
//! start; a record merges every session it overlaps into one.
//!
//! A key is in every pane it has records in (some 15 of a window of 30 s
//! sliding by 2 s), so each work partition keeps the keys of its panes
//! once, in a [`KeyTable`], and each pane as aggregates against their
//! ids, encoded (a [`Pane`]); a key's id is given back once no pane and no
//! revision names it. A snapshot writes each partition's keys with their
//! ids; a restore onto another partition count re-keys by value.

use std::collections::BTreeMap;
use std::collections::hash_map::Entry;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, Duration, FrameCodec, Time};

use super::{
    EventWindows, ProgressMark, Shape, TrackerV1, WatermarkTracker, Watermarks, Window, WithLate, decode_snapshot,
    take_input,
};
use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, map_with_capacity, partition_of, split_by_key};
use crate::keyed::{ByteString, EncodedSlice, KeyTable, OwnedByteString};
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx};
use crate::runs::Run;
use crate::stream::DStream;

/// One emitted result of an event-time window.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WindowResult<K, A> {
    /// The key.
    pub key: K,
    /// The window.
    pub window: Window,
    /// The aggregate of the key's records in the window.
    pub value: A,
    /// 0 when the watermark passed the window's end; 1, 2, … for each
    /// update by late records within the allowed lateness.
    pub revision: u32,
}

/// A session of one key: `[start, end)`, `end` being its last record's time
/// plus the gap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Session<A> {
    start: Time,
    end: Time,
    value: A,
    /// The last revision emitted, `None` before the first.
    emitted: Option<u32>,
    /// Changed since it was last emitted.
    changed: bool,
}

/// The windows of the keys of one partition of the work.
struct PartState<K, A> {
    /// The keys of the sliding windows, each once.
    keys: KeyTable<K>,
    /// How many panes and revisions name each id.
    refs: Vec<u32>,
    /// Sliding windows: pane start -> each key's aggregate in the pane, by id.
    panes: BTreeMap<Time, Pane<A>>,
    /// Sliding windows emitted again after late records: the last revision
    /// by key id and window start.
    revisions: KeyHashMap<(u32, Time), u32>,
    /// Session windows by key, sorted by start, never overlapping.
    sessions: KeyHashMap<K, Vec<Session<A>>>,
}

impl<K, A> Default for PartState<K, A> {
    fn default() -> Self {
        PartState {
            keys: KeyTable::default(),
            refs: Vec::new(),
            panes: BTreeMap::new(),
            revisions: map_with_capacity(0),
            sessions: map_with_capacity(0),
        }
    }
}

impl<K: Key, A: Data> PartState<K, A> {
    /// One more pane or revision names `id`.
    fn hold(&mut self, id: u32) {
        let index = id as usize;
        if self.refs.len() <= index {
            self.refs.resize(index + 1, 0);
        }
        if let Some(count) = self.refs.get_mut(index) {
            *count += 1;
        }
    }

    /// One pane or revision fewer names `id`; the last gives the id back.
    fn release(&mut self, id: u32) {
        if let Some(count) = self.refs.get_mut(id as usize) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.keys.remove(id);
            }
        }
    }

    /// Merges `entries` (each id once) into the pane at `start`, `merge`
    /// adding each to what the pane held.
    fn merge_into_pane(
        &mut self,
        start: Time,
        entries: Vec<(u32, A)>,
        merge: impl Fn(&mut A, &A),
    ) -> Result<(), CoreError> {
        let incoming = Run::from_entries(entries).ok_or_else(|| state_error("a key twice in a pane"))?;
        let existing = match self.panes.get(&start) {
            Some(pane) => pane.decode()?,
            None => Run::default(),
        };
        let mut fresh = Vec::new();
        let merged = Run::merge_owned(existing, incoming, |acc, value| merge(acc, &value), |id| fresh.push(id));
        let pane = Pane::encode(&merged)?;
        fresh.into_iter().for_each(|id| self.hold(id));
        self.panes.insert(start, pane);
        Ok(())
    }

    /// The key of `id`, which a pane or revision names.
    fn key(&self, id: u32) -> Result<K, CoreError> {
        self.keys.key(id)?.ok_or_else(|| state_error(&format!("no key for id {id}")))
    }
}

fn state_error(reason: &str) -> CoreError {
    CoreError::Decode { reason: format!("event-time window state: {reason}") }
}

/// One pane's aggregates by key id, encoded (see [`EncodedSlice`]): a
/// million-key window of 30 s sliding by 2 s keeps some 13 million of
/// them over its 15 panes, 12 bytes each as arrays of `u64` counts, about
/// 2 encoded. A pane is decoded into a [`Run`] for the moment it is merged
/// into or read, one pane at a time.
struct Pane<A> {
    encoded: EncodedSlice,
    _values: PhantomData<fn() -> A>,
}

impl<A: Data> Pane<A> {
    fn encode(run: &Run<A>) -> Result<Self, CoreError> {
        Ok(Pane { encoded: EncodedSlice::encode_in_order(run.entries(), run.len())?, _values: PhantomData })
    }

    fn decode(&self) -> Result<Run<A>, CoreError> {
        let len = self.encoded.len();
        let mut run = Run { ids: Vec::with_capacity(len), values: Vec::with_capacity(len) };
        self.encoded.for_each(|id, value| {
            run.ids.push(id);
            run.values.push(value);
        })?;
        Ok(run)
    }

    /// The ids the pane names, ascending.
    fn ids(&self) -> Result<Vec<u32>, CoreError> {
        let mut ids = Vec::with_capacity(self.encoded.len());
        self.encoded.for_each(|id, _: A| ids.push(id))?;
        Ok(ids)
    }
}

/// Written as the [`Run`] it encodes: the form snapshots have always had.
impl<A: Data> Serialize for Pane<A> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.decode().map_err(serde::ser::Error::custom)?.serialize(serializer)
    }
}

/// What one input partition of a batch contributes.
struct Assigned<K, V, A> {
    /// The largest event time among its records.
    max: Option<Time>,
    /// Its windowed records, one share a work partition (split where the
    /// input partitions are worked on in parallel, so that the shuffle
    /// only moves the shares).
    shares: Vec<Shuffled<K, V, A>>,
    /// Records whose every window is gone, or stamped too far ahead.
    late: Vec<(K, V)>,
    /// How many of `late` are stamped too far ahead.
    future: usize,
}

/// One input partition's contribution, moved to the work partition of
/// its keys: each key and pane once, as a list (it is only read through).
struct Shuffled<K, V, A> {
    panes: Vec<((K, Time), A)>,
    records: Vec<(K, Time, V)>,
}

/// The functions and settings of one aggregation.
struct Aggregation<K, V, A, E, C, F, M> {
    _types: PhantomData<fn(K, V) -> A>,
    event_time: E,
    create: C,
    add: F,
    merge: M,
    windows: EventWindows,
    /// Keys and panes an input partition had the last time: a batch's
    /// partition has about as many as the one before, so its table is
    /// sized for them rather than grown a dozen times over.
    entries_last_time: AtomicUsize,
}

/// What one work partition emits in a batch: results and late records.
type Emitted<K, V, A> = (Vec<WindowResult<K, A>>, Vec<(K, V)>);

/// The watermark before and after the batch being processed.
#[derive(Clone, Copy)]
struct Progress {
    before: Option<Time>,
    after: Option<Time>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl<K, V, A, E, C, F, M> Aggregation<K, V, A, E, C, F, M> {
    fn lateness(&self) -> Duration {
        self.windows.allowed_lateness
    }

    /// `(size, slide, pane)` of sliding windows.
    fn sliding(&self) -> Option<(Duration, Duration, Duration)> {
        match self.windows.shape {
            Shape::Sliding { size, slide } => {
                Some((size, slide, Duration::from_millis(gcd(size.as_millis(), slide.as_millis()))))
            }
            Shape::Session { .. } => None,
        }
    }

    /// The end of the last window holding `time` (sliding windows).
    fn last_end(time: Time, size: Duration, slide: Duration) -> Time {
        time.floor(slide) + size
    }

    /// Starts of the windows holding instant `time`, latest first.
    fn starts_holding(time: Time, size: Duration, slide: Duration) -> impl Iterator<Item = Time> {
        let last = time.floor(slide);
        let count = size.as_millis().div_ceil(slide.as_millis().max(1));
        (0..count).map(move |i| last - slide.times(i)).filter(move |start| *start + size > time)
    }

    /// True when a window ending at `end` is gone at `watermark`.
    fn purged(&self, end: Time, watermark: Option<Time>) -> bool {
        watermark.is_some_and(|w| end + self.lateness() <= w)
    }
}

impl<K, V, A, E, C, F, M> Aggregation<K, V, A, E, C, F, M>
where
    K: Key,
    V: Data,
    A: Data,
    E: Fn(&V) -> Time + Send + Sync,
    C: Fn(V) -> A + Send + Sync,
    F: Fn(&mut A, V) + Send + Sync,
    M: Fn(&mut A, &A) + Send + Sync,
{
    /// Assigns one input partition's records to windows (map side); a
    /// record stamped after `horizon` is not believed and goes to the late
    /// records without moving the partition's clock.
    fn assign(
        &self,
        records: Vec<(K, V)>,
        watermark: Option<Time>,
        horizon: Time,
        partitions: usize,
    ) -> Assigned<K, V, A> {
        let capacity = self.entries_last_time.load(Ordering::Relaxed).min(records.len());
        let mut panes: KeyHashMap<(K, Time), A> = map_with_capacity(capacity);
        let mut timed = Vec::new();
        let mut out = Assigned { max: None, shares: Vec::new(), late: Vec::new(), future: 0 };
        let sliding = self.sliding();
        for (key, value) in records {
            let time = (self.event_time)(&value);
            if time > horizon {
                out.late.push((key, value));
                out.future += 1;
                continue;
            }
            out.max = Some(out.max.map_or(time, |max| max.max(time)));
            let Some((size, slide, pane)) = sliding else {
                timed.push((key, time, value));
                continue;
            };
            if self.purged(Self::last_end(time, size, slide), watermark) {
                out.late.push((key, value));
                continue;
            }
            match panes.entry((key, time.floor(pane))) {
                Entry::Occupied(mut slot) => (self.add)(slot.get_mut(), value),
                Entry::Vacant(slot) => {
                    slot.insert((self.create)(value));
                }
            }
        }
        self.entries_last_time.store(panes.len(), Ordering::Relaxed);
        out.shares = split_by_partition(panes, timed, partitions);
        out
    }

    /// Folds one work partition's share of the batch into its windows and
    /// returns what is emitted and the records found late.
    fn fold_and_emit(
        &self,
        state: &mut PartState<K, A>,
        incoming: Vec<Shuffled<K, V, A>>,
        progress: Progress,
    ) -> Result<Emitted<K, V, A>, CoreError> {
        match self.sliding() {
            Some((size, slide, _)) => {
                let dirty = self.fold_panes(state, incoming, progress.before, size, slide)?;
                let mut out = self.emit_updates(state, dirty, size)?;
                self.emit_panes(state, progress, size, slide, &mut out)?;
                self.purge_panes(state, progress.after, size, slide)?;
                Ok((out, Vec::new()))
            }
            None => {
                let late = self.fold_sessions(state, incoming, progress.before);
                Ok((self.emit_sessions(state, progress.after), late))
            }
        }
    }

    /// Merges partial pane aggregates, one input partition after another
    /// (so each key's aggregates are merged in the order they always
    /// were); returns the emitted windows they change (key id and window
    /// start).
    fn fold_panes(
        &self,
        state: &mut PartState<K, A>,
        incoming: Vec<Shuffled<K, V, A>>,
        before: Option<Time>,
        size: Duration,
        slide: Duration,
    ) -> Result<Vec<(u32, Time)>, CoreError> {
        let mut dirty = Vec::new();
        for assigned in incoming {
            let mut by_pane: BTreeMap<Time, Vec<(u32, A)>> = BTreeMap::new();
            // Looked up in groups: at a million keys, a lookup a key is
            // a chain of cache misses (see `KeyTable::insert_many`).
            let entries = assigned.panes.into_iter().map(|((key, pane), value)| (key, (pane, value)));
            for (id, (pane, value)) in state.keys.insert_entries(entries, |_| {})? {
                for start in Self::starts_holding(pane, size, slide) {
                    let end = start + size;
                    let emitted = before.is_some_and(|w| end <= w);
                    if emitted && !self.purged(end, before) {
                        dirty.push((id, start));
                    }
                }
                by_pane.entry(pane).or_default().push((id, value));
            }
            for (pane, entries) in by_pane {
                state.merge_into_pane(pane, entries, &self.merge)?;
            }
        }
        // A key late in several input partitions is dirty once a window:
        // sorted by window and key, so that every copy is adjacent.
        dirty.sort_unstable_by_key(|(id, start)| (*start, *id));
        dirty.dedup();
        Ok(dirty)
    }

    /// Each dirty window's aggregate over its panes (`None`: no pane holds
    /// the key), merged pane by pane in time order; each pane is decoded
    /// once, however many of the windows hold it.
    fn window_values(
        state: &PartState<K, A>,
        merge: &M,
        dirty: &[(u32, Time)],
        size: Duration,
    ) -> Result<Vec<Option<A>>, CoreError> {
        let mut values: Vec<Option<A>> = vec![None; dirty.len()];
        let starts = dirty.iter().map(|(_, start)| *start);
        let (Some(first), Some(last)) = (starts.clone().min(), starts.max()) else { return Ok(values) };
        for (pane_start, pane) in state.panes.range(first..last + size) {
            let run = pane.decode()?;
            let holding = dirty
                .iter()
                .zip(&mut values)
                .filter(|((_, start), _)| *start <= *pane_start && *pane_start < *start + size);
            for ((id, _), acc) in holding {
                if let Some(value) = run.get(*id) {
                    match acc.as_mut() {
                        Some(acc) => merge(acc, value),
                        None => *acc = Some(value.clone()),
                    }
                }
            }
        }
        Ok(values)
    }

    /// Emits again the windows late records changed.
    fn emit_updates(
        &self,
        state: &mut PartState<K, A>,
        dirty: Vec<(u32, Time)>,
        size: Duration,
    ) -> Result<Vec<WindowResult<K, A>>, CoreError> {
        let values = Self::window_values(state, &self.merge, &dirty, size)?;
        let mut out = Vec::with_capacity(dirty.len());
        for ((id, start), value) in dirty.into_iter().zip(values) {
            let Some(value) = value else { continue };
            let revision = match state.revisions.entry((id, start)) {
                Entry::Occupied(mut slot) => {
                    *slot.get_mut() += 1;
                    *slot.get()
                }
                Entry::Vacant(slot) => {
                    slot.insert(1);
                    state.hold(id);
                    1
                }
            };
            let window = Window { start, end: start + size };
            out.push(WindowResult { key: state.key(id)?, window, value, revision });
        }
        Ok(out)
    }

    /// Emits every window whose end the watermark passed in this batch.
    fn emit_panes(
        &self,
        state: &PartState<K, A>,
        progress: Progress,
        size: Duration,
        slide: Duration,
        out: &mut Vec<WindowResult<K, A>>,
    ) -> Result<(), CoreError> {
        let Some(after) = progress.after else { return Ok(()) };
        let newly_due = |end: Time| end <= after && progress.before.is_none_or(|b| end > b);
        let mut starts: Vec<Time> = state
            .panes
            .keys()
            .flat_map(|pane| Self::starts_holding(*pane, size, slide))
            .filter(|start| newly_due(*start + size))
            .collect();
        starts.sort_unstable();
        starts.dedup();
        for start in starts {
            let mut window: Run<A> = Run::default();
            for (_, pane) in state.panes.range(start..start + size) {
                window = Run::merge_from(window, &pane.decode()?, &self.merge);
            }
            let bounds = Window { start, end: start + size };
            out.reserve(window.len());
            for (id, value) in window.ids.into_iter().zip(window.values) {
                out.push(WindowResult { key: state.key(id)?, window: bounds, value, revision: 0 });
            }
        }
        Ok(())
    }

    /// Drops the panes and revisions of windows past their lateness.
    fn purge_panes(
        &self,
        state: &mut PartState<K, A>,
        after: Option<Time>,
        size: Duration,
        slide: Duration,
    ) -> Result<(), CoreError> {
        let gone: Vec<Time> =
            state.panes.keys().copied().filter(|pane| self.purged(Self::last_end(*pane, size, slide), after)).collect();
        let mut released = Vec::new();
        for start in gone {
            if let Some(pane) = state.panes.remove(&start) {
                released.extend(pane.ids()?);
            }
        }
        state.revisions.retain(|(id, start), _| {
            let keep = !self.purged(*start + size, after);
            if !keep {
                released.push(*id);
            }
            keep
        });
        released.into_iter().for_each(|id| state.release(id));
        Ok(())
    }

    /// Adds records to their keys' sessions, merging the sessions each one
    /// bridges; returns the records whose session would already be gone.
    fn fold_sessions(
        &self,
        state: &mut PartState<K, A>,
        incoming: Vec<Shuffled<K, V, A>>,
        before: Option<Time>,
    ) -> Vec<(K, V)> {
        let Shape::Session { gap } = self.windows.shape else { return Vec::new() };
        let mut late = Vec::new();
        for (key, time, value) in incoming.into_iter().flat_map(|a| a.records) {
            let (start, end) = (time, time + gap);
            let sessions = state.sessions.entry(key.clone()).or_default();
            let overlapping: Vec<usize> =
                (0..sessions.len()).filter(|&i| sessions[i].start < end && start < sessions[i].end).collect();
            if overlapping.is_empty() && self.purged(end, before) {
                late.push((key, value));
                continue;
            }
            let mut merged = Session { start, end, value: (self.create)(value), emitted: None, changed: true };
            for index in overlapping.into_iter().rev() {
                let old = sessions.remove(index);
                merged.start = merged.start.min(old.start);
                merged.end = merged.end.max(old.end);
                merged.emitted = merged.emitted.max(old.emitted);
                (self.merge)(&mut merged.value, &old.value);
            }
            let at = sessions.partition_point(|s| s.start < merged.start);
            sessions.insert(at, merged);
        }
        state.sessions.retain(|_, sessions| !sessions.is_empty());
        late
    }

    /// Emits the sessions the watermark has passed (again when changed),
    /// then drops those past their lateness.
    fn emit_sessions(&self, state: &mut PartState<K, A>, after: Option<Time>) -> Vec<WindowResult<K, A>> {
        let mut out = Vec::new();
        let Some(watermark) = after else { return out };
        for (key, sessions) in state.sessions.iter_mut() {
            for session in sessions.iter_mut().filter(|s| s.end <= watermark && s.changed) {
                let revision = session.emitted.map_or(0, |r| r + 1);
                session.emitted = Some(revision);
                session.changed = false;
                let window = Window { start: session.start, end: session.end };
                out.push(WindowResult { key: key.clone(), window, value: session.value.clone(), revision });
            }
            sessions.retain(|s| !self.purged(s.end, after));
        }
        state.sessions.retain(|_, sessions| !sessions.is_empty());
        out
    }
}

/// One input partition's windowed records split by the work partition of
/// their keys, in the order they come (a map's order, then the records').
fn split_by_partition<K: Key, V, A>(
    panes: KeyHashMap<(K, Time), A>,
    records: Vec<(K, Time, V)>,
    partitions: usize,
) -> Vec<Shuffled<K, V, A>> {
    let panes = split_by_key(panes, partitions, |((key, _), _)| key);
    let records = split_by_key(records, partitions, |(key, _, _)| key);
    panes.into_iter().zip(records).map(|(panes, records)| Shuffled { panes, records }).collect()
}

/// Moves each input partition's shares to their work partitions.
fn shuffle<K, V, A>(assigned: Vec<Assigned<K, V, A>>, partitions: usize) -> Vec<Vec<Shuffled<K, V, A>>> {
    let mut out: Vec<Vec<Shuffled<K, V, A>>> = (0..partitions).map(|_| Vec::new()).collect();
    for part in assigned {
        for (target, share) in out.iter_mut().zip(part.shares) {
            target.push(share);
        }
    }
    out
}

struct EventWindowNode<K, V, A, E, C, F, M> {
    input: Arc<Slot<(K, V)>>,
    /// The writers' progress, when they report it (see [`DStream::with_progress`]).
    marks: Option<Arc<Slot<ProgressMark>>>,
    output: Arc<Slot<WindowResult<K, A>>>,
    late: Arc<Slot<(K, V)>>,
    aggregation: Aggregation<K, V, A, E, C, F, M>,
    watermarks: Watermarks,
    tracker: WatermarkTracker,
    parts: Vec<PartState<K, A>>,
}

impl<K, V, A, E, C, F, M> Node for EventWindowNode<K, V, A, E, C, F, M>
where
    K: Key,
    V: Data,
    A: Data,
    E: Fn(&V) -> Time + Send + Sync,
    C: Fn(V) -> A + Send + Sync,
    F: Fn(&mut A, V) + Send + Sync,
    M: Fn(&mut A, &A) + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if self.parts.len() != ctx.partitions {
            self.parts = respread(std::mem::take(&mut self.parts), ctx.partitions).map_err(|e| ctx.state_error(&e))?;
        }
        let Some((batch, marks)) = take_input(ctx, &self.input, self.marks.as_ref())? else {
            self.output.put(ctx.time, None);
            self.late.put(ctx.time, None);
            return Ok(None);
        };
        let before = self.tracker.current();
        let aggregation = &self.aggregation;
        let horizon = self.watermarks.horizon(ctx.time);
        let partitions = ctx.partitions;
        let mut assigned =
            ctx.par(batch.into_partitions(), |records| aggregation.assign(records, before, horizon, partitions))?;
        let maxes: Vec<Option<Time>> = assigned.iter().map(|a| a.max).collect();
        report_future(ctx, assigned.iter().map(|a| a.future).sum(), &self.watermarks);
        let after = self.tracker.advance_batch(ctx.time, &maxes, marks.as_deref(), &self.watermarks);
        let mut late: Vec<Vec<(K, V)>> = assigned.iter_mut().map(|a| std::mem::take(&mut a.late)).collect();
        let progress = Progress { before, after };
        let work: Vec<_> = self.parts.iter_mut().zip(shuffle(assigned, ctx.partitions)).collect();
        let out = ctx.par(work, |(state, incoming)| aggregation.fold_and_emit(state, incoming, progress))?;
        let out = out.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| ctx.state_error(&e))?;
        let (results, session_late): (Vec<_>, Vec<_>) = out.into_iter().unzip();
        late.extend(session_late);
        report_late(ctx, &late, self.late.readers());
        self.output.put(ctx.time, Some(Batch::new(results)));
        self.late.put(ctx.time, Some(Batch::new(late)));
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

/// Counts the records set aside as late (the graph reports the count with
/// the batch) and says so; loudly when nothing reads them.
pub(super) fn report_late<T>(ctx: &StepCtx<'_>, late: &[Vec<T>], readers: usize) {
    let count: usize = late.iter().map(Vec::len).sum();
    if count == 0 {
        return;
    }
    ctx.count_late(count);
    if readers == 0 {
        tracing::warn!(
            operator = ctx.operator,
            time = %ctx.time,
            late = count,
            "records behind the watermark whose windows were gone were discarded: read them with .late()"
        );
    } else {
        tracing::debug!(operator = ctx.operator, time = %ctx.time, late = count, "records behind the watermark");
    }
}

/// Says how many records were stamped too far ahead of the batch time to
/// be believed (they are among the late records).
pub(super) fn report_future(ctx: &StepCtx<'_>, count: usize, watermarks: &Watermarks) {
    if count > 0 {
        tracing::warn!(
            operator = ctx.operator,
            time = %ctx.time,
            records = count,
            max_future_ms = watermarks.max_future().as_millis(),
            "records stamped further ahead of the batch time than the watermarks allow went to the late records"
        );
    }
}

/// Builds work partitions from windows given by key.
struct Spreader<K, A> {
    parts: Vec<PartState<K, A>>,
    /// Per partition: pane start -> its entries so far.
    panes: Vec<BTreeMap<Time, Vec<(u32, A)>>>,
}

impl<K: Key, A: Data> Spreader<K, A> {
    fn new(partitions: usize) -> Self {
        let count = partitions.max(1);
        Spreader {
            parts: (0..count).map(|_| PartState::default()).collect(),
            panes: (0..count).map(|_| BTreeMap::new()).collect(),
        }
    }

    /// The partition of `key`, and its id there.
    fn place(&mut self, key: &K) -> Result<(usize, u32), CoreError> {
        let target = partition_of(key, self.parts.len());
        let part = self.parts.get_mut(target).ok_or_else(|| state_error("no partition"))?;
        Ok((target, part.keys.insert(key)?))
    }

    fn pane(&mut self, pane: Time, key: &K, value: A) -> Result<(), CoreError> {
        let (target, id) = self.place(key)?;
        if let Some(panes) = self.panes.get_mut(target) {
            panes.entry(pane).or_default().push((id, value));
        }
        Ok(())
    }

    fn revision(&mut self, key: &K, start: Time, revision: u32) -> Result<(), CoreError> {
        let (target, id) = self.place(key)?;
        if let Some(part) = self.parts.get_mut(target)
            && part.revisions.insert((id, start), revision).is_none()
        {
            part.hold(id);
        }
        Ok(())
    }

    fn sessions(&mut self, key: K, sessions: Vec<Session<A>>) {
        let count = self.parts.len();
        if let Some(part) = self.parts.get_mut(partition_of(&key, count)) {
            part.sessions.insert(key, sessions);
        }
    }

    fn finish(mut self) -> Result<Vec<PartState<K, A>>, CoreError> {
        for (part, panes) in self.parts.iter_mut().zip(self.panes) {
            for (pane, entries) in panes {
                let run = Run::from_entries(entries).ok_or_else(|| state_error("a key twice in a pane"))?;
                run.ids.iter().for_each(|id| part.hold(*id));
                part.panes.insert(pane, Pane::encode(&run)?);
            }
        }
        Ok(self.parts)
    }
}

/// Spreads every key's windows over `partitions` work partitions.
fn respread<K: Key, A: Data>(
    parts: Vec<PartState<K, A>>,
    partitions: usize,
) -> Result<Vec<PartState<K, A>>, CoreError> {
    let mut out = Spreader::new(partitions);
    for part in parts {
        for (start, pane) in &part.panes {
            let run = pane.decode()?;
            for (id, value) in run.ids.into_iter().zip(run.values) {
                out.pane(*start, &part.key(id)?, value)?;
            }
        }
        for ((id, start), revision) in &part.revisions {
            out.revision(&part.key(*id)?, *start, *revision)?;
        }
        for (key, sessions) in part.sessions {
            out.sessions(key, sessions);
        }
    }
    out.finish()
}

/// Version 1 kept the writers' clocks out of the tracker, version 2 kept
/// the windows by key with partitions merged; version 3 keeps each work
/// partition's keys once, with its panes against their ids.
const WINDOWS_STATE_VERSION: u16 = 3;

fn windows_codec() -> FrameCodec {
    FrameCodec::new(WINDOWS_STATE_VERSION).with_max_payload(1 << 30).with_max_decoded(4 << 30)
}

/// One work partition as a snapshot writes it.
#[derive(Serialize)]
#[serde(bound(serialize = "K: Serialize, A: Data"))]
struct PartRef<'a, K, A> {
    /// Each key of the panes and revisions: its id and its encoding.
    keys: Vec<(u32, ByteString<'a>)>,
    panes: Vec<(Time, &'a Pane<A>)>,
    revisions: Vec<(u32, Time, u32)>,
    sessions: Vec<(&'a K, &'a [Session<A>])>,
}

/// One work partition as a snapshot is read back.
#[derive(Deserialize)]
struct PartOwned<K, A> {
    keys: Vec<(u32, OwnedByteString)>,
    panes: Vec<(Time, Run<A>)>,
    revisions: Vec<(u32, Time, u32)>,
    sessions: Vec<(K, Vec<Session<A>>)>,
}

impl<K: Key, A: Data> PartState<K, A> {
    fn to_snapshot(&self) -> PartRef<'_, K, A> {
        PartRef {
            keys: self.keys.iter_encoded().map(|(id, key)| (id, ByteString(key))).collect(),
            panes: self.panes.iter().map(|(pane, run)| (*pane, run)).collect(),
            revisions: self.revisions.iter().map(|((id, start), revision)| (*id, *start, *revision)).collect(),
            sessions: self.sessions.iter().map(|(key, sessions)| (key, sessions.as_slice())).collect(),
        }
    }

    /// Rebuilds a partition from a snapshot, checking that its ids name keys.
    fn install(owned: PartOwned<K, A>) -> Result<Self, CoreError> {
        let mut part = PartState::default();
        for (id, OwnedByteString(key)) in owned.keys {
            part.keys.insert_at(id, &key)?;
        }
        part.keys.rebuild_free();
        for (pane, run) in owned.panes {
            if !run.is_well_formed(|id| part.keys.contains(id)) {
                return Err(state_error("a pane whose ids are out of order, without a value or without a key"));
            }
            run.ids.iter().for_each(|id| part.hold(*id));
            part.panes.insert(pane, Pane::encode(&run)?);
        }
        for (id, start, revision) in owned.revisions {
            if !part.keys.contains(id) {
                return Err(state_error("a revision without a key"));
            }
            if part.revisions.insert((id, start), revision).is_none() {
                part.hold(id);
            }
        }
        part.sessions.extend(owned.sessions);
        Ok(part)
    }
}

/// The checkpointed form: the watermarks and each work partition.
#[derive(Serialize, Deserialize)]
struct Snapshot<T, P> {
    tracker: T,
    parts: Vec<P>,
}

/// The checkpointed form of versions 2 (and 1, through [`SnapshotV1`]):
/// the windows by key, partitions merged.
#[derive(Deserialize)]
struct SnapshotOwned<K, A> {
    tracker: WatermarkTracker,
    panes: Vec<(Time, K, A)>,
    revisions: Vec<(K, Time, u32)>,
    sessions: Vec<(K, Vec<Session<A>>)>,
}

/// The checkpointed form as version 1 wrote it.
#[derive(Deserialize)]
struct SnapshotV1<K, A> {
    tracker: TrackerV1,
    panes: Vec<(Time, K, A)>,
    revisions: Vec<(K, Time, u32)>,
    sessions: Vec<(K, Vec<Session<A>>)>,
}

impl<K, A> From<SnapshotV1<K, A>> for SnapshotOwned<K, A> {
    fn from(old: SnapshotV1<K, A>) -> Self {
        let SnapshotV1 { tracker, panes, revisions, sessions } = old;
        SnapshotOwned { tracker: tracker.into(), panes, revisions, sessions }
    }
}

impl<K: Key, A: Data> SnapshotOwned<K, A> {
    /// The windows spread over `partitions` work partitions.
    fn into_parts(self, partitions: usize) -> Result<(WatermarkTracker, Vec<PartState<K, A>>), CoreError> {
        let mut out = Spreader::new(partitions);
        for (pane, key, value) in self.panes {
            out.pane(pane, &key, value)?;
        }
        for (key, start, revision) in self.revisions {
            out.revision(&key, start, revision)?;
        }
        for (key, sessions) in self.sessions {
            out.sessions(key, sessions);
        }
        Ok((self.tracker, out.finish()?))
    }
}

impl<K, V, A, E, C, F, M> StatefulNode for EventWindowNode<K, V, A, E, C, F, M>
where
    K: Key,
    V: Data,
    A: Data,
    E: Fn(&V) -> Time + Send + Sync,
    C: Fn(V) -> A + Send + Sync,
    F: Fn(&mut A, V) + Send + Sync,
    M: Fn(&mut A, &A) + Send + Sync,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let parts: Vec<PartRef<'_, K, A>> = self.parts.iter().map(PartState::to_snapshot).collect();
        windows_codec().encode(&Snapshot { tracker: &self.tracker, parts })
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let codec = windows_codec();
        let frame = codec.open(bytes)?;
        if frame.version < WINDOWS_STATE_VERSION {
            let owned: SnapshotOwned<K, A> = decode_snapshot(bytes, |old: SnapshotV1<K, A>| old.into())?;
            (self.tracker, self.parts) = owned.into_parts(partitions)?;
            return Ok(());
        }
        let snapshot: Snapshot<WatermarkTracker, PartOwned<K, A>> = codec.decode_payload(frame.payload)?;
        let parts = snapshot.parts.into_iter().map(PartState::install).collect::<Result<Vec<_>, _>>()?;
        self.parts = if parts.len() == partitions { parts } else { respread(parts, partitions)? };
        self.tracker = snapshot.tracker;
        Ok(())
    }
}

/// The result of [`DStream::aggregate_by_event_time`]: the emitted windows
/// ([`WithLate::results`]) and the records that came too late for any
/// window ([`WithLate::late`]).
pub type EventTimeWindowed<K, V, A> = WithLate<K, V, WindowResult<K, A>>;

impl<K: Key, V: Data, A: Data> EventTimeWindowed<K, V, A> {
    /// Each window's result, once the watermark passed its end, and again
    /// (with a higher revision) for each update within the allowed lateness.
    pub fn results(&self) -> DStream<WindowResult<K, A>> {
        self.output()
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Aggregates each key's values over event-time `windows`: `event_time`
    /// gives a value's time, `watermarks` how far behind the latest a
    /// partition's records may arrive; `create` makes an aggregate of a
    /// first value, `add` adds a value, `merge` adds another aggregate of
    /// the same key and window. Results must not depend on the order values
    /// come in (the functions commutative and associative), as with any
    /// parallel aggregation. See the [module](crate::event_time) for when
    /// windows are emitted. Keeps state: needs a checkpoint directory.
    pub fn aggregate_by_event_time<A, E, C, F, M>(
        &self,
        event_time: E,
        watermarks: Watermarks,
        windows: EventWindows,
        create: C,
        add: F,
        merge: M,
    ) -> EventTimeWindowed<K, V, A>
    where
        A: Data,
        E: Fn(&V) -> Time + Send + Sync + 'static,
        C: Fn(V) -> A + Send + Sync + 'static,
        F: Fn(&mut A, V) + Send + Sync + 'static,
        M: Fn(&mut A, &A) + Send + Sync + 'static,
    {
        let input = self.reader();
        let mut meta = NodeMeta::new("aggregate_by_event_time", vec![self.id], self.slide);
        meta.state = Some(StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<A>(),
            needs_checkpoint: true,
        });
        meta.event_time = Some(windows.describe_shape());
        meta.event_time_problem = windows.problem();
        let marks = self.progress.as_ref().map(|feed| {
            meta.parents.push(feed.id());
            feed.reader()
        });
        let late = Slot::new();
        let node_late = Arc::clone(&late);
        let aggregation = Aggregation {
            _types: PhantomData,
            event_time,
            create,
            add,
            merge,
            windows,
            entries_last_time: AtomicUsize::new(0),
        };
        let output = self.add_node(meta, |output| {
            Box::new(EventWindowNode {
                input,
                marks,
                output,
                late: node_late,
                aggregation,
                watermarks,
                tracker: WatermarkTracker::default(),
                parts: Vec::new(),
            })
        });
        WithLate::new(output, late)
    }

    /// [`DStream::aggregate_by_event_time`] with the values of each key and
    /// window reduced by an associative, commutative `reduce`.
    pub fn reduce_by_event_time<E, R>(
        &self,
        event_time: E,
        watermarks: Watermarks,
        windows: EventWindows,
        reduce: R,
    ) -> EventTimeWindowed<K, V, V>
    where
        E: Fn(&V) -> Time + Send + Sync + 'static,
        R: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        let reduce = Arc::new(reduce);
        let (add, merge) = (Arc::clone(&reduce), reduce);
        self.aggregate_by_event_time(
            event_time,
            watermarks,
            windows,
            |value| value,
            move |acc: &mut V, value: V| *acc = add(acc, &value),
            move |acc: &mut V, other: &V| *acc = merge(acc, other),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pane_reads_back_its_run_and_is_written_as_the_run() {
        let run = Run::from_entries(vec![(900_000, u64::MAX), (3, 1), (70, 0)]).unwrap();
        let pane = Pane::encode(&run).unwrap();
        assert_eq!(pane.decode().unwrap(), run);
        assert_eq!(pane.ids().unwrap(), [3, 70, 900_000]);
        // Snapshots written before panes were encoded hold the run itself.
        let config = bincode::config::standard();
        let written = bincode::serde::encode_to_vec(&pane, config).unwrap();
        assert_eq!(written, bincode::serde::encode_to_vec(&run, config).unwrap());
        let empty = Pane::<u64>::encode(&Run::default()).unwrap();
        assert_eq!(empty.decode().unwrap(), Run::default());
    }
}
