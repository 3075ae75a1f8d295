//! Watermarks of a stream that several upstream writers feed, aligned per
//! writer as Flink aligns them per input channel.
//!
//! When one partition of a stream interleaves what many writers sent (a
//! Kafka topic that every task of an upstream stage writes by key), the
//! largest event time seen in the partition says nothing about the writers
//! that are behind: one writer running ahead would make every other
//! writer's records late. So each writer reports its own progress with the
//! data, a [`ProgressMark`] after each of its batches, and the reading
//! operator keeps one clock per writer ([`WriterClocks`]):
//!
//! - the watermark is the smallest writer's largest event time, minus the
//!   bound on out-of-orderness, and never goes back;
//! - until every writer of a group has reported once, the watermark waits
//!   (a writer that has not started holds it back, as a partition that has
//!   delivered nothing does);
//! - a writer whose input had nothing for it reports itself idle and stops
//!   holding the watermark back until it reports progress again; a writer
//!   that comes back from idleness counts again at once, holding the
//!   watermark where it is until it catches up, so that none of its records
//!   is made late by the others running on (Flink leaves such a writer out
//!   until it catches up, which loses its records; spate prefers to wait);
//! - when every writer is idle, the watermark moves to the furthest one, so
//!   the windows of a finished backlog close.
//!
//! The clocks are operator state: checkpointed with the operator, restored
//! with it, so a task that moves resumes with the watermarks it had.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spate_core::{Duration, Time};

use std::sync::Arc;

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::node::{Node, NodeMeta, Slot, StepCtx};
use crate::stream::{DStream, ProgressFeed};

/// A writer's report of its progress in event time, sent with its data
/// after each of its batches.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProgressMark {
    /// The group of writers this one belongs to (an upstream stage).
    pub group: String,
    /// The writer, `0..writers`.
    pub writer: u32,
    /// How many writers the group has: the reader waits for all of them.
    pub writers: u32,
    /// The largest event time of what the writer sent in the batch, `None`
    /// when it sent nothing with an event time.
    pub max_event_time: Option<Time>,
    /// The writer's input had nothing for it in the batch: it holds nobody
    /// back until it reports progress again.
    pub idle: bool,
}

/// One writer's clock as the reader keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct WriterClock {
    /// The largest event time the writer has reported.
    max_event_time: Option<Time>,
    /// Its last report said it was idle.
    idle: bool,
}

/// The clocks of every writer that feeds an operator (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WriterClocks {
    /// The number of writers of each group, as they reported it.
    groups: BTreeMap<String, u32>,
    /// Each writer's clock, by group and writer.
    writers: BTreeMap<(String, u32), WriterClock>,
}

impl WriterClocks {
    /// Takes in a batch's marks, in the order they were read, and returns
    /// the watermark after them, given the one before (`current`).
    pub(crate) fn advance(&mut self, marks: &[ProgressMark], bound: Duration, current: Option<Time>) -> Option<Time> {
        for mark in marks {
            self.take(mark);
        }
        match self.candidate(bound) {
            Some(candidate) => Some(current.map_or(candidate, |old| old.max(candidate))),
            None => current,
        }
    }

    fn take(&mut self, mark: &ProgressMark) {
        let writers = self.groups.entry(mark.group.clone()).or_insert(0);
        *writers = (*writers).max(mark.writers);
        let clock = self
            .writers
            .entry((mark.group.clone(), mark.writer))
            .or_insert(WriterClock { max_event_time: None, idle: mark.idle });
        clock.max_event_time = clock.max_event_time.max(mark.max_event_time);
        clock.idle = mark.idle;
    }

    /// True when every writer of every group has reported at least once.
    fn complete(&self) -> bool {
        !self.groups.is_empty()
            && self
                .groups
                .iter()
                .all(|(group, count)| (0..*count).all(|writer| self.writers.contains_key(&(group.clone(), writer))))
    }

    /// The watermark the clocks allow, before "never goes back".
    fn candidate(&self, bound: Duration) -> Option<Time> {
        if !self.complete() {
            return None;
        }
        let watermark_of = |clock: &WriterClock| clock.max_event_time.map(|max| max - bound);
        let mut active = self.writers.values().filter(|clock| !clock.idle).peekable();
        if active.peek().is_none() {
            // Everyone is idle: nothing older is on its way.
            return self.writers.values().filter_map(watermark_of).max();
        }
        // A writer back from idleness behind the others holds the watermark
        // until it catches up, so none of its records is made late; one
        // that has sent nothing with a time yet holds it too.
        active.map(watermark_of).min().flatten()
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// The same records, with their event-time progress told by `marks`
    /// rather than by the records themselves: an event-time operator
    /// applied to the result keeps one clock per writer that `marks`
    /// names and takes the smallest (see [`ProgressMark`]). For a stream
    /// that interleaves several writers' output, such as a partition of a
    /// Kafka topic that every task of an upstream stage writes.
    pub fn with_progress(&self, marks: &DStream<ProgressMark>) -> DStream<(K, V)> {
        let mut aligned = self.clone();
        aligned.progress = Some(ProgressFeed::of(marks));
        aligned
    }

    /// The progress marks an event-time operator reading this stream
    /// aligns on, if any.
    pub fn progress(&self) -> Option<DStream<ProgressMark>> {
        self.progress.as_ref().map(ProgressFeed::marks)
    }
}

impl<T: Data> DStream<T> {
    /// Splits a stream whose records are data or progress marks (`split`
    /// says which: `Ok` a record, `Err` a mark) into the records, their
    /// progress told by the marks ([`DStream::with_progress`]). Each batch
    /// is split where it is, in one pass. The marks may go unread: a
    /// reader that is no event-time operator does not need them.
    pub fn split_progress<K, V, F>(&self, split: F) -> DStream<(K, V)>
    where
        K: Key,
        V: Data,
        F: Fn(T) -> Result<(K, V), ProgressMark> + Send + Sync + 'static,
    {
        let input = self.reader();
        let meta = NodeMeta::new("split_progress", vec![self.id], self.slide);
        let marks = Slot::new();
        let node_marks = Arc::clone(&marks);
        let records = self.add_node(meta, |output| Box::new(SplitProgress { input, output, marks: node_marks, split }));
        let mark_stream = records.side_output("progress_marks", &marks);
        mark_stream.may_go_unread();
        records.with_progress(&mark_stream)
    }
}

/// The node of [`DStream::split_progress`].
struct SplitProgress<T, K, V, F> {
    input: Arc<Slot<T>>,
    output: Arc<Slot<(K, V)>>,
    marks: Arc<Slot<ProgressMark>>,
    split: F,
}

impl<T, K, V, F> Node for SplitProgress<T, K, V, F>
where
    T: Data,
    K: Key,
    V: Data,
    F: Fn(T) -> Result<(K, V), ProgressMark> + Send + Sync,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let Some(batch) = ctx.take_owned(&self.input)? else {
            self.output.put(ctx.time, None);
            self.marks.put(ctx.time, None);
            return Ok(None);
        };
        let split = &self.split;
        let parts = ctx.par(batch.into_partitions(), |part| {
            let mut records = Vec::with_capacity(part.len());
            let mut marks = Vec::new();
            for item in part {
                match split(item) {
                    Ok(record) => records.push(record),
                    Err(mark) => marks.push(mark),
                }
            }
            (records, marks)
        })?;
        let (records, marks): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        self.output.put(ctx.time, Some(Batch::new(records)));
        self.marks.put(ctx.time, Some(Batch::from_vec(marks.into_iter().flatten().collect())));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Time {
        Time::from_millis(ms)
    }

    fn mark(writer: u32, max: Option<i64>, idle: bool) -> ProgressMark {
        ProgressMark { group: "split".into(), writer, writers: 3, max_event_time: max.map(t), idle }
    }

    #[test]
    fn the_watermark_waits_for_every_writer_then_follows_the_slowest() {
        let bound = Duration::from_millis(100);
        let mut clocks = WriterClocks::default();
        // Writer 2 has not reported: nothing moves, however far the others are.
        let w = clocks.advance(&[mark(0, Some(90_000), false), mark(1, Some(5_000), false)], bound, None);
        assert_eq!(w, None);
        let w = clocks.advance(&[mark(2, Some(7_000), false)], bound, w);
        assert_eq!(w, Some(t(4_900)));
        let w = clocks.advance(&[mark(1, Some(8_000), false)], bound, w);
        assert_eq!(w, Some(t(6_900)));
    }

    #[test]
    fn idle_writers_hold_nobody_back_and_all_idle_flushes_to_the_furthest() {
        let bound = Duration::ZERO;
        let mut clocks = WriterClocks::default();
        let w = clocks.advance(
            &[mark(0, Some(1_000), false), mark(1, Some(2_000), false), mark(2, None, true)],
            bound,
            None,
        );
        assert_eq!(w, Some(t(1_000)));
        let w = clocks.advance(&[mark(0, None, true)], bound, w);
        assert_eq!(w, Some(t(2_000)));
        let w = clocks.advance(&[mark(1, Some(9_000), false), mark(1, None, true)], bound, w);
        assert_eq!(w, Some(t(9_000)), "every writer idle: the furthest one decides");
        // Writer 2 comes back behind the watermark: it does not pull it back,
        // and the others wait for it to catch up.
        let w = clocks.advance(&[mark(2, Some(500), false), mark(0, Some(9_500), false)], bound, w);
        assert_eq!(w, Some(t(9_000)));
        let w = clocks.advance(&[mark(2, Some(9_700), false)], bound, w);
        assert_eq!(w, Some(t(9_500)));
    }
}
