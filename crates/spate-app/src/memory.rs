//! One memory budget a member: the member's `max_memory_bytes`
//! ([`MemberSettings::streaming`]) covers the batches of all of its tasks,
//! instead of each task having a budget of its own.
//!
//! Three quarters of the budget are shared out among the member's tasks
//! for their batches; the last quarter is for what their Kafka clients
//! fetch ahead. Each client's queue (librdkafka's read-ahead, 64 MiB a
//! client by default) is held to a [`READ_AHEAD_CLIENTS`]th of that
//! quarter ([`MemberMemory::read_ahead`]), and a client whose queue is full
//! fetches again after a few milliseconds rather than librdkafka's default
//! second, which would starve a counting task that reads tens of thousands
//! of small records a batch. The batch shares shrink as the member takes on
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

use std::collections::BTreeMap;
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

/// The clients the read-ahead quarter of a budget is split among: more
/// than a member with a few partitions runs, so a member with a task for
/// each of a dozen partitions stays within the quarter.
const READ_AHEAD_CLIENTS: u64 = 32;

/// The least a client may hold fetched ahead, however small the budget: a
/// queue smaller than a fetch would fetch a record at a time.
const MIN_READ_AHEAD_BYTES: u64 = 1 << 20;

/// What a record takes in a client's queue beyond its bytes (librdkafka's
/// message and queue entry), to bound the queue in records too: small
/// records (a word each) would otherwise fill the byte bound with
/// overhead several times their size.
const QUEUED_RECORD_COST: u64 = 256;

/// How long a client whose queue is full waits before it fetches again.
const READ_AHEAD_BACKOFF_MS: u64 = 10;

/// The librdkafka properties that bound a client's read-ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadAhead {
    /// `queued.max.messages.kbytes`.
    pub(crate) kbytes: u64,
    /// `queued.min.messages`.
    pub(crate) records: u64,
}

impl ReadAhead {
    /// As librdkafka properties.
    pub(crate) fn properties(&self) -> [(&'static str, String); 3] {
        [
            ("queued.max.messages.kbytes", self.kbytes.to_string()),
            ("queued.min.messages", self.records.to_string()),
            ("fetch.queue.backoff.ms", READ_AHEAD_BACKOFF_MS.to_string()),
        ]
    }
}

/// The budget of a member and what its tasks' last batches took of it.
#[derive(Debug)]
pub(crate) struct MemberMemory {
    limit: u64,
    next_task: AtomicU64,
    tasks: Mutex<BTreeMap<u64, Usage>>,
}

/// What a task's last batch took of the budget, as estimated.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    /// Bytes its last batch held.
    bytes: u64,
    /// Whether that batch read all its cap allowed (there may have been
    /// more to read): such a task may borrow what others leave unused.
    bound: bool,
}

impl MemberMemory {
    /// A member's budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(MemberMemory { limit, next_task: AtomicU64::new(0), tasks: Mutex::new(BTreeMap::new()) })
    }

    /// A new task's claim on the budget, given back when it is dropped.
    pub(crate) fn join(self: &Arc<Self>) -> TaskMemory {
        let id = self.next_task.fetch_add(1, Ordering::Relaxed);
        lock(&self.tasks).insert(id, Usage::default());
        TaskMemory { member: Arc::clone(self), id, cost: Mutex::new(None), cap: Mutex::new(u64::MAX) }
    }

    /// How much one Kafka client of the member may fetch ahead.
    pub(crate) fn read_ahead(&self) -> ReadAhead {
        let bytes = (self.limit / 4 / READ_AHEAD_CLIENTS).max(MIN_READ_AHEAD_BYTES);
        ReadAhead { kbytes: bytes / 1024, records: bytes / QUEUED_RECORD_COST }
    }

    /// Task `id`'s share of the budget for its batch now: an equal part of
    /// the batches' three quarters, and for a task its cap held back, an
    /// equal part of what the tasks that read less than their part left
    /// unused. So a member whose counting tasks need little lets its split
    /// tasks read more, and the estimates of all still add up to the
    /// three quarters.
    fn batch_share(&self, id: u64) -> u64 {
        let tasks = lock(&self.tasks);
        let count = u64::try_from(tasks.len()).unwrap_or(u64::MAX).max(1);
        let part = self.limit / 4 * 3 / count;
        if !tasks.get(&id).is_some_and(|usage| usage.bound) {
            return part;
        }
        let unused: u64 = tasks.values().filter(|u| !u.bound).map(|u| part.saturating_sub(u.bytes)).sum();
        let borrowers = u64::try_from(tasks.values().filter(|u| u.bound).count()).unwrap_or(1).max(1);
        part + unused / borrowers
    }

    fn record(&self, id: u64, usage: Usage) {
        if let Some(slot) = lock(&self.tasks).get_mut(&id) {
            *slot = usage;
        }
    }
}

/// One task's claim on its member's budget.
#[derive(Debug)]
pub(crate) struct TaskMemory {
    member: Arc<MemberMemory>,
    id: u64,
    /// Bytes one input record cost in the last batch that read any.
    cost: Mutex<Option<u64>>,
    /// The records the last planned batch was allowed (none planned yet:
    /// no cap).
    cap: Mutex<u64>,
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
        let cap = match *lock(&self.cost) {
            None => FIRST_BATCH_RECORDS,
            Some(cost) => (self.member.batch_share(self.id) / cost.max(1)).max(MIN_BATCH_RECORDS),
        };
        *lock(&self.cap) = cap;
        cap
    }

    /// Learns what an input record costs, and what the batch took of the
    /// budget, from a batch that ran.
    pub(crate) fn observe(&self, batch: BatchSize) {
        if batch.input_records == 0 {
            self.member.record(self.id, Usage::default());
            return;
        }
        let output = batch.output_records.saturating_mul(OUTPUT_RECORD_COST).saturating_add(batch.output_bytes);
        let total = batch.input_records.saturating_mul(INPUT_RECORD_COST).saturating_add(output * OUTPUT_COPIES);
        *lock(&self.cost) = Some(total / batch.input_records);
        let bound = batch.input_records >= *lock(&self.cap);
        self.member.record(self.id, Usage { bytes: total, bound });
    }
}

impl Drop for TaskMemory {
    fn drop(&mut self) {
        lock(&self.member.tasks).remove(&self.id);
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
    fn a_client_reads_ahead_a_share_of_the_last_quarter_and_never_less_than_a_fetch() {
        let member = MemberMemory::new(256 << 20);
        let read_ahead = member.read_ahead();
        assert_eq!(read_ahead, ReadAhead { kbytes: 2_048, records: 8_192 });
        assert!(read_ahead.kbytes * 1024 * READ_AHEAD_CLIENTS <= (256 << 20) / 4);
        assert_eq!(MemberMemory::new(1 << 20).read_ahead(), ReadAhead { kbytes: 1_024, records: 4_096 });
        let properties = read_ahead.properties();
        assert!(properties.contains(&("queued.max.messages.kbytes", "2048".to_string())));
        assert!(properties.contains(&("fetch.queue.backoff.ms", "10".to_string())));
    }

    #[test]
    fn shares_shrink_as_the_member_takes_on_tasks_and_grow_as_it_gives_them_up() {
        let member = MemberMemory::new(256 << 20);
        let first = member.join();
        // Less than its first cap: there was no more to read.
        first.observe(sized(500, 0, 0));
        let alone = first.batch_records();
        let others: Vec<TaskMemory> = (0..3).map(|_| member.join()).collect();
        assert_eq!(first.batch_records(), alone / 4);
        drop(others);
        assert_eq!(first.batch_records(), alone);
    }

    #[test]
    fn a_task_held_by_its_cap_borrows_what_the_others_leave_unused_and_the_total_stays_within_the_batches_part() {
        let member = MemberMemory::new(256 << 20);
        let batches = (256 << 20) / 4 * 3;
        let (split, count, idle) = (member.join(), member.join(), member.join());
        let part = batches / 3;
        for task in [&split, &count, &idle] {
            task.batch_records();
        }
        // The split task read its whole first cap; the count task a little;
        // the idle task nothing.
        split.observe(sized(FIRST_BATCH_RECORDS, 8_000, 240_000));
        count.observe(sized(500, 10, 400));
        idle.observe(sized(0, 0, 0));
        let split_cost = INPUT_RECORD_COST + 8 * (OUTPUT_RECORD_COST + 30) * OUTPUT_COPIES;
        let count_bytes = 500 * INPUT_RECORD_COST + (10 * OUTPUT_RECORD_COST + 400) * OUTPUT_COPIES;
        let borrowed = part + (part - count_bytes) + part;
        assert_eq!(split.batch_records(), borrowed / split_cost);
        assert!(split.batch_records() * split_cost + count_bytes <= batches, "the estimates add up within the part");
        // Tasks not held by their cap keep their own part only.
        assert_eq!(count.batch_records(), part / (count_bytes / 500));
        // Once the count task is held by its cap too, they share what is left.
        count.batch_records();
        count.observe(sized(count.batch_records(), 10, 400));
        assert_eq!(split.batch_records(), (part + part / 2) / split_cost, "the idle task's part is shared by the two");
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
