//! Group membership against the local broker: two members split a topic's
//! partitions with cooperative-sticky assignment, a member leaving hands
//! its partitions to the other after letting them go, and a member's
//! transactions commit its tasks' batches once, a fenced producer opened
//! again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{brokers, create_topic, produce, read_committed, unique, values};
use spate_core::BatchId;
use spate_kafka::{
    AssignmentListener, CommitOutcome, GroupMember, GroupSettings, MemberTransactions, OffsetRange, OffsetRanges,
    OutputRecord, TopicPartition,
};

/// Records what a member owns, and every event in order.
#[derive(Default)]
struct Owned {
    state: Mutex<(BTreeSet<TopicPartition>, Vec<String>)>,
    changed: Condvar,
}

impl AssignmentListener for Owned {
    fn on_revoked(&self, partitions: &[TopicPartition], lost: bool) {
        let mut state = self.state.lock().unwrap();
        for tp in partitions {
            state.0.remove(tp);
            state.1.push(format!("revoked {tp} lost={lost}"));
        }
        self.changed.notify_all();
    }

    fn on_assigned(&self, partitions: &[TopicPartition]) {
        let mut state = self.state.lock().unwrap();
        for tp in partitions {
            state.0.insert(tp.clone());
            state.1.push(format!("assigned {tp}"));
        }
        self.changed.notify_all();
    }
}

impl Owned {
    /// Waits (failing after a minute) until `done` holds of what is owned.
    fn wait(&self, what: &str, done: impl Fn(&BTreeSet<TopicPartition>) -> bool) -> BTreeSet<TopicPartition> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut state = self.state.lock().unwrap();
        while !done(&state.0) {
            let left = deadline.checked_duration_since(Instant::now()).unwrap_or_else(|| panic!("timed out: {what}"));
            state = self.changed.wait_timeout(state, left).unwrap().0;
        }
        state.0.clone()
    }
}

fn settings() -> GroupSettings {
    GroupSettings {
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_secs(1),
        ..GroupSettings::default()
    }
}

#[test]
fn two_members_split_the_partitions_and_one_leaving_hands_its_share_over() {
    let topic = unique("group");
    create_topic(&topic, 6);
    let group = unique("app");
    let (a, b) = (Arc::new(Owned::default()), Arc::new(Owned::default()));
    let topics = [topic.clone()];
    let member_a = GroupMember::join(&brokers(), &group, &topics, &settings(), a.clone()).unwrap();
    a.wait("a owns all six", |owned| owned.len() == 6);
    let member_b = GroupMember::join(&brokers(), &group, &topics, &settings(), b.clone()).unwrap();
    let owned_b = b.wait("b owns three", |owned| owned.len() == 3);
    let owned_a = a.wait("a keeps three", |owned| owned.len() == 3);
    assert!(owned_a.is_disjoint(&owned_b));
    // Cooperative: a gave up only what b got, and kept the rest running.
    let events_a = a.state.lock().unwrap().1.clone();
    let revoked: Vec<&String> = events_a.iter().filter(|e| e.starts_with("revoked")).collect();
    assert_eq!(revoked.len(), 3, "{events_a:?}");
    assert!(revoked.iter().all(|e| e.ends_with("lost=false")));
    assert_eq!(member_a.assignment(), owned_a);

    member_b.leave().unwrap();
    assert!(b.state.lock().unwrap().0.is_empty(), "leaving revoked b's partitions first");
    a.wait("a owns all six again", |owned| owned.len() == 6);
    drop(member_a);
}

#[test]
fn a_members_transaction_commits_a_tasks_batch_once() {
    let input = unique("member-in");
    let output = unique("member-out");
    create_topic(&input, 2);
    create_topic(&output, 1);
    produce(&input, 2, values(0..10));
    let group = unique("app");
    let owned = Arc::new(Owned::default());
    let member = Arc::new(
        GroupMember::join(&brokers(), &group, std::slice::from_ref(&input), &settings(), owned.clone()).unwrap(),
    );
    owned.wait("the member owns both", |o| o.len() == 2);
    let transactions =
        MemberTransactions::new(&brokers(), &unique("member-tx"), Arc::clone(&member), Duration::from_secs(10))
            .unwrap();
    let ranges = OffsetRanges::new(vec![OffsetRange::new(input.clone(), 0, 0, 5)]);
    let record = || (output.as_str(), OutputRecord::value("five"));
    let first = transactions.write_batch("task-0", BatchId(0), &ranges, [record()]).unwrap();
    assert_eq!(first, CommitOutcome::Committed);
    // A re-run of the batch, by this member or by the task's next owner.
    let again = transactions.write_batch("task-0", BatchId(0), &ranges, [record()]).unwrap();
    assert_eq!(again, CommitOutcome::AlreadyCommitted);
    assert_eq!(read_committed(&output, 1), ["five"]);
}

#[test]
fn a_members_fenced_producer_fails_its_batch_and_is_opened_again_for_the_next() {
    let input = unique("fenced-in");
    let output = unique("fenced-out");
    create_topic(&input, 1);
    create_topic(&output, 1);
    produce(&input, 1, values(0..10));
    let group = unique("app");
    let owned = Arc::new(Owned::default());
    let member = Arc::new(
        GroupMember::join(&brokers(), &group, std::slice::from_ref(&input), &settings(), owned.clone()).unwrap(),
    );
    owned.wait("the member owns the partition", |o| o.len() == 1);
    let transactional_id = unique("member-tx");
    let transactions =
        MemberTransactions::new(&brokers(), &transactional_id, Arc::clone(&member), Duration::from_secs(10)).unwrap();
    // The broker moves the producer's epoch on, as it does when a
    // transaction outlives its timeout while the process is paused.
    {
        use rdkafka::producer::{BaseProducer, Producer};
        let bump: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("transactional.id", &transactional_id)
            .create()
            .unwrap();
        bump.init_transactions(Duration::from_secs(30)).unwrap();
    }
    let ranges = OffsetRanges::new(vec![OffsetRange::new(input.clone(), 0, 0, 5)]);
    let record = || (output.as_str(), OutputRecord::value("five"));
    let fenced = transactions.write_batch("task-0", BatchId(0), &ranges, [record()]);
    assert!(fenced.is_err(), "a fenced producer commits nothing: {fenced:?}");
    let again = transactions.write_batch("task-0", BatchId(0), &ranges, [record()]).unwrap();
    assert_eq!(again, CommitOutcome::Committed, "the batch's re-run goes through the producer opened again");
    assert_eq!(read_committed(&output, 1), ["five"]);
}

#[test]
fn members_of_the_broker_side_protocol_split_the_partitions_too() {
    let topic = unique("group-848");
    create_topic(&topic, 4);
    let group = unique("app-848");
    let settings = GroupSettings { protocol: spate_kafka::GroupProtocol::Consumer, ..settings() };
    let (a, b) = (Arc::new(Owned::default()), Arc::new(Owned::default()));
    let topics = [topic.clone()];
    let member_a = GroupMember::join(&brokers(), &group, &topics, &settings, a.clone()).unwrap();
    a.wait("a owns all four", |owned| owned.len() == 4);
    assert!(member_a.group_metadata().is_some(), "a member has the group's metadata once assigned");
    let member_b = GroupMember::join(&brokers(), &group, &topics, &settings, b.clone()).unwrap();
    let owned_b = b.wait("b owns two", |owned| owned.len() == 2);
    let owned_a = a.wait("a keeps two", |owned| owned.len() == 2);
    assert!(owned_a.is_disjoint(&owned_b));
    member_b.leave().unwrap();
    a.wait("a owns all four again", |owned| owned.len() == 4);
    drop(member_a);
}

/// Commits a batch of each partition it gives up gracefully, as a task
/// stopped on revocation finishes its batch in flight, and keeps the outcome.
#[derive(Default)]
struct CommitsOnRevoke {
    transactions: Mutex<Option<Arc<MemberTransactions>>>,
    output: String,
    outcomes: Mutex<Vec<(TopicPartition, Result<CommitOutcome, String>)>>,
    owned: Owned,
}

impl AssignmentListener for CommitsOnRevoke {
    fn on_revoked(&self, partitions: &[TopicPartition], lost: bool) {
        let transactions = self.transactions.lock().unwrap().clone();
        if let Some(transactions) = transactions.filter(|_| !lost) {
            for tp in partitions {
                let ranges = OffsetRanges::new(vec![OffsetRange::new(tp.topic.clone(), tp.partition, 0, 5)]);
                let record = (self.output.as_str(), OutputRecord::value(format!("last of {tp}")));
                let outcome = transactions.write_batch(&tp.to_string(), BatchId(0), &ranges, [record]);
                self.outcomes.lock().unwrap().push((tp.clone(), outcome.map_err(|e| e.to_string())));
            }
        }
        self.owned.on_revoked(partitions, lost);
    }

    fn on_assigned(&self, partitions: &[TopicPartition]) {
        self.owned.on_assigned(partitions);
    }
}

/// A second member joins; the first commits the batch in flight of each
/// partition it hands over, inside the revocation.
fn a_batch_in_flight_commits_when_its_partition_is_handed_over(protocol: spate_kafka::GroupProtocol) {
    let input = unique("handover-in");
    let output = unique("handover-out");
    create_topic(&input, 2);
    create_topic(&output, 1);
    produce(&input, 2, values(0..20));
    let group = unique("app");
    let settings = GroupSettings { protocol, ..settings() };
    let a = Arc::new(CommitsOnRevoke { output: output.clone(), ..CommitsOnRevoke::default() });
    let topics = [input.clone()];
    let member_a = Arc::new(GroupMember::join(&brokers(), &group, &topics, &settings, a.clone()).unwrap());
    a.owned.wait("a owns both", |owned| owned.len() == 2);
    let transactions =
        MemberTransactions::new(&brokers(), &unique("handover-tx"), Arc::clone(&member_a), Duration::from_secs(10))
            .unwrap();
    *a.transactions.lock().unwrap() = Some(Arc::new(transactions));

    let b = Arc::new(Owned::default());
    let member_b = GroupMember::join(&brokers(), &group, &topics, &settings, b.clone()).unwrap();
    let handed_over = b.wait("b owns one", |owned| owned.len() == 1);
    a.transactions.lock().unwrap().take();
    let outcomes = a.outcomes.lock().unwrap().clone();
    let handed_over: Vec<TopicPartition> = handed_over.into_iter().collect();
    assert_eq!(outcomes.iter().map(|(tp, _)| tp.clone()).collect::<Vec<_>>(), handed_over, "{outcomes:?}");
    assert_eq!(outcomes[0].1, Ok(CommitOutcome::Committed), "the batch commits inside the revocation");
    assert_eq!(read_committed(&output, 1), [format!("last of {}", handed_over[0])]);
    member_b.leave().unwrap();
    member_a.leave().unwrap();
}

#[test]
fn a_batch_in_flight_commits_when_its_partition_is_handed_over_cooperatively() {
    a_batch_in_flight_commits_when_its_partition_is_handed_over(spate_kafka::GroupProtocol::CooperativeSticky);
}

#[test]
fn a_batch_in_flight_commits_when_its_partition_is_handed_over_by_the_broker_side_protocol() {
    a_batch_in_flight_commits_when_its_partition_is_handed_over(spate_kafka::GroupProtocol::Consumer);
}
