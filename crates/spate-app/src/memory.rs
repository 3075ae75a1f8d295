//! One memory budget a member: every task's Kafka batches draw on the
//! member's `max_memory_bytes` ([`MemberSettings::streaming`]) instead of
//! each task having a budget of its own.
//!
//! Each task reserves its batch's share of the budget before it plans the
//! batch, and the plan reads at most that many bytes; the share is given
//! back once the batch's transaction is written. The share is a quarter of
//! the budget divided among the tasks the member runs, so the batches in
//! flight, what each task reads ahead for its next batch (within the same
//! caps) and each task's Kafka client queue (a share of its own) fit the
//! budget together. When the member takes on more tasks, the shares
//! shrink; a task whose reservation does not fit waits for the others to
//! give theirs back rather than pass the budget.
//!
//! [`MemberSettings::streaming`]: crate::MemberSettings::streaming

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use spate_core::sync::lock;
use spate_core::{CoreError, MemoryBudget, Reservation, Time};

/// No batch is planned within fewer bytes than this: a record must fit.
const MIN_SHARE: u64 = 1 << 20;

/// The bytes the member's batches hold now, and its budget.
const MEMBER_MEMORY_USED: &str = "spate_member_memory_used_bytes";
const MEMBER_MEMORY_LIMIT: &str = "spate_member_memory_limit_bytes";
/// Reservations that waited for room.
const MEMBER_MEMORY_WAITS: &str = "spate_member_memory_waits_total";

/// The budget of a member and the tasks drawing on it.
#[derive(Debug)]
pub(crate) struct MemberMemory {
    budget: MemoryBudget,
    tasks: AtomicU64,
}

impl MemberMemory {
    /// A member's budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        metrics::gauge!(MEMBER_MEMORY_LIMIT).set(limit as f64);
        Arc::new(MemberMemory { budget: MemoryBudget::new(limit), tasks: AtomicU64::new(0) })
    }

    fn publish(&self) {
        metrics::gauge!(MEMBER_MEMORY_USED).set(self.used() as f64);
    }

    /// The bytes the member's Kafka batches hold now.
    pub(crate) fn used(&self) -> u64 {
        self.budget.used()
    }

    /// A task's share of a batch now, among the tasks that draw on the budget.
    fn batch_share(&self) -> u64 {
        let tasks = self.tasks.load(Ordering::Relaxed).max(1);
        (self.budget.limit() / 4 / tasks).max(MIN_SHARE).min(self.budget.limit())
    }

    /// What each task's Kafka client may queue of records fetched ahead:
    /// a sixty-fourth of the budget (librdkafka's default is 64 MiB a
    /// client, which a member of a dozen tasks would multiply).
    pub(crate) fn client_queue_bytes(&self) -> u64 {
        (self.budget.limit() / 64).max(MIN_SHARE)
    }

    /// A task starts drawing on the budget until the result is dropped.
    pub(crate) fn join(self: &Arc<Self>) -> TaskMemory {
        self.tasks.fetch_add(1, Ordering::Relaxed);
        TaskMemory { member: Arc::clone(self), held: Mutex::new(BTreeMap::new()) }
    }
}

/// One task's reservations, by batch time; given back when dropped.
#[derive(Debug)]
pub(crate) struct TaskMemory {
    member: Arc<MemberMemory>,
    held: Mutex<BTreeMap<Time, u64>>,
}

impl TaskMemory {
    /// Reserves the share of the batch at `time`, waiting while the
    /// budget is full, and returns it: the bytes the batch may read. A
    /// batch planned again at the same time gives back its first share.
    pub(crate) fn reserve_batch(&self, time: Time) -> Result<u64, CoreError> {
        self.release_batch(time);
        let share = self.member.batch_share();
        if self.member.budget.reserve(share)? == Reservation::Waited {
            metrics::counter!(MEMBER_MEMORY_WAITS).increment(1);
        }
        lock(&self.held).insert(time, share);
        self.member.publish();
        Ok(share)
    }

    /// Gives back the share of the batch at `time`, and of any batch
    /// before it that never got here (a failed batch is planned again).
    pub(crate) fn release_batch(&self, time: Time) {
        let mut held = lock(&self.held);
        let later = held.split_off(&Time::from_millis(time.as_millis().saturating_add(1)));
        let done = std::mem::replace(&mut *held, later);
        drop(held);
        self.member.budget.release(done.values().sum());
        self.member.publish();
    }
}

impl Drop for TaskMemory {
    fn drop(&mut self) {
        let held: u64 = lock(&self.held).values().sum();
        self.member.budget.release(held);
        self.member.tasks.fetch_sub(1, Ordering::Relaxed);
        self.member.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn shares_shrink_as_tasks_join_and_come_back_when_they_leave() {
        let member = MemberMemory::new(256 * MIB);
        let first = member.join();
        assert_eq!(first.reserve_batch(Time::from_millis(1_000)).unwrap(), 64 * MIB);
        let others: Vec<TaskMemory> = (0..7).map(|_| member.join()).collect();
        assert_eq!(others[0].reserve_batch(Time::from_millis(1_000)).unwrap(), 8 * MIB);
        assert_eq!(member.used(), 72 * MIB);
        first.release_batch(Time::from_millis(1_000));
        assert_eq!(member.used(), 8 * MIB);
        drop(others);
        assert_eq!(member.used(), 0, "a task that stops gives back what it held");
        assert_eq!(first.reserve_batch(Time::from_millis(2_000)).unwrap(), 64 * MIB);
    }

    #[test]
    fn a_batch_planned_again_or_left_behind_by_a_failure_is_given_back() {
        let member = MemberMemory::new(64 * MIB);
        let task = member.join();
        task.reserve_batch(Time::from_millis(1_000)).unwrap();
        task.reserve_batch(Time::from_millis(1_000)).unwrap();
        assert_eq!(member.used(), 16 * MIB, "planned again: one share");
        task.reserve_batch(Time::from_millis(2_000)).unwrap();
        task.release_batch(Time::from_millis(2_000));
        assert_eq!(member.used(), 0, "the batch at 1 s failed and is gone with the one after it");
    }

    #[test]
    fn a_task_waits_for_room_rather_than_pass_the_budget() {
        let member = MemberMemory::new(4 * MIB);
        // Five tasks: shares of the 1 MiB floor; four of them fill the budget.
        let mut tasks: Vec<TaskMemory> = (0..5).map(|_| member.join()).collect();
        let last = tasks.pop().unwrap();
        for task in &tasks {
            assert_eq!(task.reserve_batch(Time::from_millis(1_000)).unwrap(), MIB);
        }
        let waiter = std::thread::spawn(move || {
            let share = last.reserve_batch(Time::from_millis(1_000)).unwrap();
            (share, last)
        });
        // Only once a batch is given back does the fifth task's reservation fit.
        while member.budget.waiting() == 0 {
            std::thread::yield_now();
        }
        assert_eq!(member.used(), 4 * MIB);
        tasks[0].release_batch(Time::from_millis(1_000));
        let (share, _last) = waiter.join().unwrap();
        assert_eq!(share, MIB);
        assert_eq!(member.budget.waits(), 1);
        assert_eq!(member.used(), member.budget.limit());
    }
}
