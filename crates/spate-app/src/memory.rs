//! One memory budget a member: the member's `max_memory_bytes`
//! ([`MemberSettings::streaming`]) covers the batches of all of its tasks,
//! instead of each task having a budget of its own.
//!
//! Three quarters of the budget are shared out among the member's tasks
//! for their batches; the last quarter is left for what their Kafka
//! clients fetch ahead (librdkafka's queues, left at their defaults:
//! capping them starved the counting tasks, which read tens of thousands
//! of small records a batch). The shares shrink as the member takes on
//! more tasks and grow as it gives some up.
//!
//! A task plans each batch within its share: it caps the batch's records
//! at its share divided by what one input record has cost it in memory,
//! which it learns from its last batch. What a record costs depends on the
//! stage: a split task holds each line and the words it
//! sends on (the stage's output, the records handed to the producer and the
//! producer's queue), so its cost grows with its fan-out; a counting task
//! holds little beyond its input. A task that has not run a batch yet plans
//! [`FIRST_BATCH_RECORDS`], so a member that starts on a backlog does not
//! swallow it whole before it knows what a record costs.
//!
//! The cost is an estimate from sizes the task sees (record counts and
//! encoded lengths), not a measure of the heap, which a library cannot
//! take without owning the process's allocator.
//!
//! [`MemberSettings::streaming`]: crate::MemberSettings::streaming

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::sync::lock;

/// Records the first batch of a task plans, before it knows their cost.
const FIRST_BATCH_RECORDS: u64 = 1_000;

/// No batch plans fewer records than this, however small its share: a
/// batch must make progress.
const MIN_BATCH_RECORDS: u64 = 100;

/// Memory an input record takes in a batch beyond its encoded bytes: the
/// record in the batch, its decoded form in the stage, their headers.
const INPUT_RECORD_COST: u64 = 384;

/// Memory an output record takes beyond its encoded bytes, in each of the
/// places it is held at once (the stage's output, the records handed to
/// the producer, the producer's queue).
const OUTPUT_RECORD_COST: u64 = 160;

/// The places an output record is held at once.
const OUTPUT_COPIES: u64 = 3;

/// The budget of a member and how many tasks draw on it.
#[derive(Debug)]
pub(crate) struct MemberMemory {
    limit: u64,
    tasks: AtomicU64,
}

impl MemberMemory {
    /// A member's budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(MemberMemory { limit, tasks: AtomicU64::new(0) })
    }

    /// A new task's claim on the budget, given back when it is dropped.
    pub(crate) fn join(self: &Arc<Self>) -> TaskMemory {
        self.tasks.fetch_add(1, Ordering::Relaxed);
        TaskMemory { member: Arc::clone(self), cost: Mutex::new(None) }
    }

    fn tasks(&self) -> u64 {
        self.tasks.load(Ordering::Relaxed).max(1)
    }

    /// A task's share of the budget for its batch now.
    fn batch_share(&self) -> u64 {
        self.limit / 4 * 3 / self.tasks()
    }
}

/// One task's claim on its member's budget.
#[derive(Debug)]
pub(crate) struct TaskMemory {
    member: Arc<MemberMemory>,
    /// Bytes one input record cost in the last batch that read any.
    cost: Mutex<Option<u64>>,
}

/// What a batch read and sent on, as a task counts it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchSize {
    /// Input records.
    pub(crate) input_records: u64,
    /// Output records.
    pub(crate) output_records: u64,
    /// Bytes of the output records, encoded.
    pub(crate) output_bytes: u64,
}

impl TaskMemory {
    /// The most records the task's next batch may read.
    pub(crate) fn batch_records(&self) -> u64 {
        match *lock(&self.cost) {
            None => FIRST_BATCH_RECORDS,
            Some(cost) => (self.member.batch_share() / cost.max(1)).max(MIN_BATCH_RECORDS),
        }
    }

    /// Learns what an input record costs from a batch that ran.
    pub(crate) fn observe(&self, batch: BatchSize) {
        if batch.input_records == 0 {
            return;
        }
        let output = batch.output_records.saturating_mul(OUTPUT_RECORD_COST).saturating_add(batch.output_bytes);
        let total = batch.input_records.saturating_mul(INPUT_RECORD_COST).saturating_add(output * OUTPUT_COPIES);
        *lock(&self.cost) = Some(total / batch.input_records);
    }
}

impl Drop for TaskMemory {
    fn drop(&mut self) {
        self.member.tasks.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(input_records: u64, output_records: u64, output_bytes: u64) -> BatchSize {
        BatchSize { input_records, output_records, output_bytes }
    }

    #[test]
    fn a_task_plans_a_small_first_batch_then_within_its_share() {
        let member = MemberMemory::new(256 << 20);
        let task = member.join();
        assert_eq!(task.batch_records(), FIRST_BATCH_RECORDS);
        // A split task: 8 words of 30 bytes a line.
        task.observe(sized(1_000, 8_000, 240_000));
        let cost = INPUT_RECORD_COST + 8 * (OUTPUT_RECORD_COST + 30) * OUTPUT_COPIES;
        assert_eq!(task.batch_records(), (192 << 20) / cost);
    }

    #[test]
    fn shares_shrink_as_the_member_takes_on_tasks_and_grow_as_it_gives_them_up() {
        let member = MemberMemory::new(256 << 20);
        let first = member.join();
        first.observe(sized(1_000, 0, 0));
        let alone = first.batch_records();
        let others: Vec<TaskMemory> = (0..3).map(|_| member.join()).collect();
        assert_eq!(first.batch_records(), alone / 4);
        drop(others);
        assert_eq!(first.batch_records(), alone);
    }

    #[test]
    fn a_fan_out_costs_more_than_a_count_and_no_batch_is_planned_empty() {
        let member = MemberMemory::new(256 << 20);
        let (split, count) = (member.join(), member.join());
        split.observe(sized(1_000, 8_000, 240_000));
        count.observe(sized(8_000, 10, 400));
        assert!(
            split.batch_records() * 8 < count.batch_records(),
            "{} {}",
            split.batch_records(),
            count.batch_records()
        );
        let tiny = MemberMemory::new(1 << 10);
        let task = tiny.join();
        task.observe(sized(10, 80, 2_400));
        assert_eq!(task.batch_records(), MIN_BATCH_RECORDS);
        task.observe(sized(0, 5, 100));
        assert_eq!(task.batch_records(), MIN_BATCH_RECORDS, "a batch that read nothing teaches nothing");
    }
}
