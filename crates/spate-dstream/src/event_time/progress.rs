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
//! - a writer whose input had nothing for it reports itself idle; it still
//!   holds the watermark at the event time it last reported (one that has
//!   reported none holds it entirely), as a partition that has delivered
//!   nothing does. Idleness in one batch says only that the writer's input
//!   was empty when it planned that batch: the writers of a stage plan
//!   their batches each on its own, so when a backlog lands, one writer may
//!   pick its share up a batch after the others, and none of its records
//!   may be made late by that;
//! - with an idle timeout ([`crate::Watermarks::with_idle_timeout`]), a
//!   writer idle for that long (of the reader's batch time) stops holding
//!   the watermark until it sends again, so an upstream task whose input
//!   stays empty lets the others' windows close; its records are then late
//!   if they come back behind the watermark, as Flink's idle inputs' are.
//!   When every writer has stopped holding, the watermark stays where it is.
//!
//! The clocks are operator state: checkpointed with the operator, restored
//! with it, so a task that moves resumes with the watermarks it had.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use spate_core::Time;

use std::sync::Arc;

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::event_time::Watermarks;
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
    /// The writer's input had nothing for it in the batch. It still holds
    /// the watermark at what it reported before, unless the reader's idle
    /// timeout runs out first (see the module docs).
    pub idle: bool,
}

/// One writer's clock as the reader keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct WriterClock {
    /// The largest event time the writer has reported.
    max_event_time: Option<Time>,
    /// Its last report said it was idle.
    idle: bool,
    /// The reader's batch time when the writer's current idleness began.
    /// Not checkpointed (the state's format stays as it was): after a
    /// restore, an idle writer's timeout starts again, which only holds
    /// the watermark longer.
    #[serde(skip)]
    idle_since: Option<Time>,
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
    /// Takes in the marks the reader read in its batch at `batch_time`, in
    /// the order they were read, and returns the watermark after them,
    /// given the one before (`current`).
    pub(crate) fn advance(
        &mut self,
        marks: &[ProgressMark],
        batch_time: Time,
        strategy: &Watermarks,
        current: Option<Time>,
    ) -> Option<Time> {
        for mark in marks {
            self.take(mark, batch_time);
        }
        match self.candidate(batch_time, strategy) {
            Some(candidate) => Some(current.map_or(candidate, |old| old.max(candidate))),
            None => current,
        }
    }

    fn take(&mut self, mark: &ProgressMark, batch_time: Time) {
        let writers = self.groups.entry(mark.group.clone()).or_insert(0);
        *writers = (*writers).max(mark.writers);
        let clock = self.writers.entry((mark.group.clone(), mark.writer)).or_insert(WriterClock {
            max_event_time: None,
            idle: mark.idle,
            idle_since: None,
        });
        clock.max_event_time = clock.max_event_time.max(mark.max_event_time);
        clock.idle = mark.idle;
        clock.idle_since = if mark.idle { clock.idle_since.or(Some(batch_time)) } else { None };
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
    fn candidate(&self, batch_time: Time, strategy: &Watermarks) -> Option<Time> {
        if !self.complete() {
            return None;
        }
        let bound = strategy.out_of_orderness();
        // `idle_since` is set only while the writer is idle.
        let timed_out = |clock: &WriterClock| match (clock.idle_since, strategy.idle_timeout()) {
            (Some(since), Some(timeout)) => batch_time.since(since) >= timeout,
            _ => false,
        };
        // A writer idle or not holds the watermark at what it reported; one
        // that has reported no event time yet holds it entirely.
        let mut holding = self.writers.values().filter(|clock| !timed_out(clock)).peekable();
        holding.peek()?;
        holding.map(|clock| clock.max_event_time.map(|max| max - bound)).min().flatten()
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
    use spate_core::Duration;

    fn t(ms: i64) -> Time {
        Time::from_millis(ms)
    }

    fn mark(writer: u32, max: Option<i64>, idle: bool) -> ProgressMark {
        ProgressMark { group: "split".into(), writer, writers: 3, max_event_time: max.map(t), idle }
    }

    /// Takes in `marks` in the reader's batch at `at` ms, without an idle timeout.
    fn advance(
        clocks: &mut WriterClocks,
        marks: &[ProgressMark],
        at: i64,
        bound: Duration,
        w: Option<Time>,
    ) -> Option<Time> {
        clocks.advance(marks, t(at), &Watermarks::bounded_out_of_orderness(bound), w)
    }

    #[test]
    fn the_watermark_waits_for_every_writer_then_follows_the_slowest() {
        let bound = Duration::from_millis(100);
        let mut clocks = WriterClocks::default();
        // Writer 2 has not reported: nothing moves, however far the others are.
        let w = advance(&mut clocks, &[mark(0, Some(90_000), false), mark(1, Some(5_000), false)], 0, bound, None);
        assert_eq!(w, None);
        let w = advance(&mut clocks, &[mark(2, Some(7_000), false)], 1_000, bound, w);
        assert_eq!(w, Some(t(4_900)));
        let w = advance(&mut clocks, &[mark(1, Some(8_000), false)], 2_000, bound, w);
        assert_eq!(w, Some(t(6_900)));
    }

    #[test]
    fn a_writer_that_picks_up_a_backlog_a_batch_late_has_none_of_its_records_made_late() {
        // Three writers idle since they started; a backlog lands, and
        // writers 0 and 1 plan their next batch after it did, writer 2
        // just before: its idle mark must not let the others' 120 s move
        // the watermark past the records it sends a batch later.
        let bound = Duration::from_millis(60_000);
        let mut clocks = WriterClocks::default();
        let idle = [mark(0, None, true), mark(1, None, true), mark(2, None, true)];
        let mut w = None;
        for at in [0, 1_000, 2_000] {
            w = advance(&mut clocks, &idle, at, bound, w);
            assert_eq!(w, None);
        }
        let w = advance(
            &mut clocks,
            &[mark(0, Some(120_000), false), mark(1, Some(119_000), false), mark(2, None, true)],
            3_000,
            bound,
            w,
        );
        assert_eq!(w, None, "writer 2 has reported no event time yet: it holds the watermark");
        let w = advance(
            &mut clocks,
            &[mark(0, None, true), mark(1, None, true), mark(2, Some(118_000), false)],
            4_000,
            bound,
            w,
        );
        assert_eq!(w, Some(t(58_000)), "the slowest writer decides");
        let w = advance(&mut clocks, &idle, 5_000, bound, w);
        assert_eq!(w, Some(t(58_000)), "idle writers hold at what they reported");
    }

    #[test]
    fn with_an_idle_timeout_a_writer_idle_that_long_stops_holding_until_it_sends_again() {
        let strategy =
            Watermarks::bounded_out_of_orderness(Duration::ZERO).with_idle_timeout(Duration::from_millis(2_000));
        let mut clocks = WriterClocks::default();
        let step =
            |clocks: &mut WriterClocks, marks: &[ProgressMark], at: i64, w| clocks.advance(marks, t(at), &strategy, w);
        let w = step(
            &mut clocks,
            &[mark(0, Some(1_000), false), mark(1, Some(2_000), false), mark(2, None, true)],
            0,
            None,
        );
        assert_eq!(w, None, "writer 2 has been idle for less than the timeout");
        let w = step(&mut clocks, &[mark(0, Some(3_000), false), mark(2, None, true)], 1_000, w);
        assert_eq!(w, None);
        let w = step(
            &mut clocks,
            &[mark(0, Some(4_000), false), mark(1, Some(5_000), false), mark(2, None, true)],
            2_000,
            w,
        );
        assert_eq!(w, Some(t(4_000)), "idle for the timeout: writer 2 holds nobody back");
        // Back from idleness behind the watermark: it does not pull it back,
        // and the others wait for it to catch up.
        let w = step(&mut clocks, &[mark(2, Some(500), false), mark(0, Some(9_500), false)], 3_000, w);
        assert_eq!(w, Some(t(4_000)));
        let w = step(&mut clocks, &[mark(2, Some(9_700), false), mark(1, Some(9_800), false)], 4_000, w);
        assert_eq!(w, Some(t(9_500)));
        // Every writer idle past the timeout: the watermark stays.
        let idle = [mark(0, None, true), mark(1, None, true), mark(2, None, true)];
        let w = step(&mut clocks, &idle, 5_000, w);
        let w = step(&mut clocks, &idle, 8_000, w);
        assert_eq!(w, Some(t(9_500)));
    }
}
