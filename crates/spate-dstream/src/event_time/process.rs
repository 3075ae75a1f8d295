//! Keyed processing with state and event-time timers (what Flink calls a
//! keyed process function): for joins and aggregations that no window
//! shape fits, such as "the highest bid of each auction until it closes".
//!
//! A function is called for every record of a key, in the order the
//! records came in, with the key's state; it may set timers, and is called
//! again for each timer once the watermark reaches its time. Records
//! behind the watermark the batch started with go to the late output.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{CoreError, Time};

use super::{
    ProgressMark, TrackerV1, WatermarkTracker, Watermarks, WithLate, behind, decode_snapshot, event_time_codec,
    take_input,
};
use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::hash::{KeyHashMap, map_with_capacity, partition_of};
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx};
use crate::stream::DStream;

/// What a process function is called for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Timed<V> {
    /// A record of the key, with its event time.
    Record {
        /// The value.
        value: V,
        /// Its event time.
        time: Time,
    },
    /// A timer of the key the watermark has reached.
    Timer {
        /// The time the timer was set for.
        time: Time,
    },
}

/// One key's state and timers, as a process function sees them.
#[derive(Debug)]
pub struct TimedState<S> {
    value: Option<S>,
    timers: BTreeSet<Time>,
    watermark: Option<Time>,
}

impl<S> TimedState<S> {
    /// The key's state, if any.
    pub fn get(&self) -> Option<&S> {
        self.value.as_ref()
    }

    /// The key's state, mutably, if any.
    pub fn get_mut(&mut self) -> Option<&mut S> {
        self.value.as_mut()
    }

    /// Sets the key's state.
    pub fn update(&mut self, value: S) {
        self.value = Some(value);
    }

    /// Removes the key's state (its timers stay).
    pub fn remove(&mut self) {
        self.value = None;
    }

    /// Calls the function again for this key once the watermark reaches
    /// `time`. A timer set while timers fire fires in a later batch at the
    /// earliest. Setting one time twice sets one timer.
    pub fn set_timer(&mut self, time: Time) {
        self.timers.insert(time);
    }

    /// Cancels the timer at `time`, if set.
    pub fn delete_timer(&mut self, time: Time) {
        self.timers.remove(&time);
    }

    /// The key's pending timers, earliest first.
    pub fn timers(&self) -> impl Iterator<Item = Time> + '_ {
        self.timers.iter().copied()
    }

    /// The watermark: records are checked against the one the batch started
    /// with, timers fire with the one it ended with.
    pub fn watermark(&self) -> Option<Time> {
        self.watermark
    }
}

/// A key's state and timers, as kept.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct KeyState<S> {
    value: Option<S>,
    timers: BTreeSet<Time>,
}

/// The keys of one partition of the work.
struct PartState<K, S> {
    keys: KeyHashMap<K, KeyState<S>>,
    /// Timer time -> keys with a timer then (entries may be stale: a key's
    /// own set decides).
    due: BTreeMap<Time, Vec<K>>,
}

impl<K, S> Default for PartState<K, S> {
    fn default() -> Self {
        PartState { keys: map_with_capacity(0), due: BTreeMap::new() }
    }
}

impl<K: Key, S> PartState<K, S> {
    /// Runs `f` on `key`'s state and keeps what it leaves.
    fn with_key<R>(&mut self, key: &K, watermark: Option<Time>, f: impl FnOnce(&mut TimedState<S>) -> R) -> R {
        let kept = self.keys.remove(key).unwrap_or(KeyState { value: None, timers: BTreeSet::new() });
        let before = kept.timers.clone();
        let mut state = TimedState { value: kept.value, timers: kept.timers, watermark };
        let result = f(&mut state);
        for time in state.timers.difference(&before) {
            self.due.entry(*time).or_default().push(key.clone());
        }
        if state.value.is_some() || !state.timers.is_empty() {
            self.keys.insert(key.clone(), KeyState { value: state.value, timers: state.timers });
        }
        result
    }
}

struct ProcessNode<K, V, S, M, E, F> {
    input: Arc<Slot<(K, V)>>,
    /// The writers' progress, when they report it (see [`DStream::with_progress`]).
    marks: Option<Arc<Slot<ProgressMark>>>,
    output: Arc<Slot<M>>,
    late: Arc<Slot<(K, V)>>,
    event_time: E,
    func: F,
    watermarks: Watermarks,
    tracker: WatermarkTracker,
    parts: Vec<PartState<K, S>>,
}

/// One input partition's records with their times, and its late ones.
struct Stamped<K, V> {
    max: Option<Time>,
    /// Its records in time, one share a work partition (split where the
    /// input partitions are worked on in parallel).
    shares: Vec<Vec<(K, Time, V)>>,
    late: Vec<(K, V)>,
    /// How many of `late` are stamped too far ahead.
    future: usize,
}

impl<K, V, S, M, E, F> ProcessNode<K, V, S, M, E, F>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    E: Fn(&V) -> Time + Send + Sync,
    F: Fn(&K, Timed<V>, &mut TimedState<S>, &mut Vec<M>) + Send + Sync,
{
    fn stamp(
        event_time: &E,
        records: Vec<(K, V)>,
        watermark: Option<Time>,
        horizon: Time,
        partitions: usize,
    ) -> Stamped<K, V> {
        let share = records.len() / partitions.max(1) + 1;
        let shares = (0..partitions).map(|_| Vec::with_capacity(share)).collect();
        let mut out = Stamped { max: None, shares, late: Vec::new(), future: 0 };
        for (key, value) in records {
            let time = event_time(&value);
            if time > horizon {
                out.late.push((key, value));
                out.future += 1;
                continue;
            }
            out.max = Some(out.max.map_or(time, |max| max.max(time)));
            if behind(time, watermark) {
                out.late.push((key, value));
            } else if let Some(share) = out.shares.get_mut(partition_of(&key, partitions)) {
                share.push((key, time, value));
            }
        }
        out
    }

    /// Calls the function for a work partition's records (its share of
    /// each input partition, in their order), then for its due timers.
    fn run_part(
        func: &F,
        part: &mut PartState<K, S>,
        shares: Vec<Vec<(K, Time, V)>>,
        before: Option<Time>,
        after: Option<Time>,
    ) -> Vec<M> {
        let mut out = Vec::new();
        for (key, time, value) in shares.into_iter().flatten() {
            part.with_key(&key, before, |state| func(&key, Timed::Record { value, time }, state, &mut out));
        }
        let Some(watermark) = after else { return out };
        let later = part.due.split_off(&(watermark + spate_core::Duration::from_millis(1)));
        let due = std::mem::replace(&mut part.due, later);
        for (time, keys) in due {
            for key in keys {
                let set = part.keys.get_mut(&key).is_some_and(|kept| kept.timers.remove(&time));
                if set {
                    part.with_key(&key, after, |state| func(&key, Timed::Timer { time }, state, &mut out));
                }
            }
        }
        out
    }
}

impl<K, V, S, M, E, F> Node for ProcessNode<K, V, S, M, E, F>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    E: Fn(&V) -> Time + Send + Sync,
    F: Fn(&K, Timed<V>, &mut TimedState<S>, &mut Vec<M>) + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if self.parts.len() != ctx.partitions {
            self.parts = respread(std::mem::take(&mut self.parts), ctx.partitions);
        }
        let Some((batch, marks)) = take_input(ctx, &self.input, self.marks.as_ref())? else {
            self.output.put(ctx.time, None);
            self.late.put(ctx.time, None);
            return Ok(None);
        };
        let before = self.tracker.current();
        let event_time = &self.event_time;
        let horizon = self.watermarks.horizon(ctx.time);
        let partitions = ctx.partitions;
        let stamped =
            ctx.par(batch.into_partitions(), |records| Self::stamp(event_time, records, before, horizon, partitions))?;
        let maxes: Vec<Option<Time>> = stamped.iter().map(|s| s.max).collect();
        super::windows::report_future(ctx, stamped.iter().map(|s| s.future).sum(), &self.watermarks);
        let after = self.tracker.advance_batch(ctx.time, &maxes, marks.as_deref(), &self.watermarks);
        let mut by_part: Vec<Vec<Vec<(K, Time, V)>>> = (0..partitions).map(|_| Vec::new()).collect();
        let mut late = Vec::with_capacity(stamped.len());
        for part in stamped {
            for (target, share) in by_part.iter_mut().zip(part.shares) {
                target.push(share);
            }
            late.push(part.late);
        }
        let func = &self.func;
        let work: Vec<_> = self.parts.iter_mut().zip(by_part).collect();
        let out = ctx.par(work, |(part, records)| Self::run_part(func, part, records, before, after))?;
        super::windows::report_late(ctx, &late, self.late.readers());
        self.output.put(ctx.time, Some(Batch::new(out)));
        self.late.put(ctx.time, Some(Batch::new(late)));
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

/// Spreads every key over `partitions` work partitions, rebuilding the timer index.
fn respread<K: Key, S>(parts: Vec<PartState<K, S>>, partitions: usize) -> Vec<PartState<K, S>> {
    let mut out: Vec<PartState<K, S>> = (0..partitions.max(1)).map(|_| PartState::default()).collect();
    let count = out.len();
    for (key, kept) in parts.into_iter().flat_map(|p| p.keys) {
        if let Some(target) = out.get_mut(partition_of(&key, count)) {
            for time in &kept.timers {
                target.due.entry(*time).or_default().push(key.clone());
            }
            target.keys.insert(key, kept);
        }
    }
    out
}

#[derive(Serialize)]
struct SnapshotRef<'a, K, S> {
    tracker: &'a WatermarkTracker,
    keys: Vec<(&'a K, &'a KeyState<S>)>,
}

#[derive(Deserialize)]
struct SnapshotOwned<K, S> {
    tracker: WatermarkTracker,
    keys: Vec<(K, KeyState<S>)>,
}

/// The checkpointed form as version 1 wrote it.
#[derive(Deserialize)]
struct SnapshotV1<K, S> {
    tracker: TrackerV1,
    keys: Vec<(K, KeyState<S>)>,
}

impl<K, S> From<SnapshotV1<K, S>> for SnapshotOwned<K, S> {
    fn from(old: SnapshotV1<K, S>) -> Self {
        SnapshotOwned { tracker: old.tracker.into(), keys: old.keys }
    }
}

impl<K, V, S, M, E, F> StatefulNode for ProcessNode<K, V, S, M, E, F>
where
    K: Key,
    V: Data,
    S: Data,
    M: Data,
    E: Fn(&V) -> Time + Send + Sync,
    F: Fn(&K, Timed<V>, &mut TimedState<S>, &mut Vec<M>) + Send + Sync,
{
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        let keys = self.parts.iter().flat_map(|p| p.keys.iter()).collect();
        event_time_codec().encode(&SnapshotRef { tracker: &self.tracker, keys })
    }

    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let owned: SnapshotOwned<K, S> = decode_snapshot(bytes, |old: SnapshotV1<K, S>| old.into())?;
        let mut part = PartState::default();
        part.keys.extend(owned.keys);
        self.tracker = owned.tracker;
        self.parts = respread(vec![part], partitions);
        Ok(())
    }
}

/// The result of [`DStream::process_by_event_time`]: what the function
/// emitted ([`WithLate::output`]) and the records behind the watermark
/// ([`WithLate::late`]).
pub type EventTimeProcessed<K, V, M> = WithLate<K, V, M>;

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Calls `func(key, what, state, out)` for every record of a key, in the
    /// order the records came in ([`Timed::Record`]), and for every timer the
    /// key set once the watermark reaches it ([`Timed::Timer`]), after the
    /// batch's records; the function changes the key's state, sets timers
    /// and pushes what it emits to `out`. A record whose event time is
    /// behind the watermark goes to [`EventTimeProcessed::late`] instead.
    /// Keeps state: needs a checkpoint directory.
    pub fn process_by_event_time<S, M, E, F>(
        &self,
        event_time: E,
        watermarks: Watermarks,
        func: F,
    ) -> EventTimeProcessed<K, V, M>
    where
        S: Data,
        M: Data,
        E: Fn(&V) -> Time + Send + Sync + 'static,
        F: Fn(&K, Timed<V>, &mut TimedState<S>, &mut Vec<M>) + Send + Sync + 'static,
    {
        let input = self.reader();
        let mut meta = NodeMeta::new("process_by_event_time", vec![self.id], self.slide);
        meta.state = Some(StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<S>(),
            needs_checkpoint: true,
        });
        let marks = self.progress.as_ref().map(|feed| {
            meta.parents.push(feed.id());
            feed.reader()
        });
        let late = Slot::new();
        let node_late = Arc::clone(&late);
        let output = self.add_node(meta, |output| {
            Box::new(ProcessNode {
                input,
                marks,
                output,
                late: node_late,
                event_time,
                func,
                watermarks,
                tracker: WatermarkTracker::default(),
                parts: Vec::new(),
            })
        });
        WithLate::new(output, late)
    }
}
