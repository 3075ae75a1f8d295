//! Membership of a Kafka consumer group: which partitions this process owns.
//!
//! Several processes running one application join one consumer group; the
//! group protocol spreads the topics' partitions over them and moves them
//! when a member joins, leaves or dies. The membership consumer reads no
//! records (every partition it is given is paused at once): it only takes
//! part in the group, tells an [`AssignmentListener`] what it gained and
//! lost, and gives the group's metadata (member id and generation) for
//! transactional offset commits, so the broker refuses a commit from a
//! member the group has moved on from (KIP-447).
//!
//! The protocol is the classic one with cooperative-sticky assignment
//! (KIP-429: a rebalance moves only the partitions that change owner, and
//! the others keep running), or the broker-side protocol of KIP-848
//! (`group.protocol=consumer`), which librdkafka and Kafka 4 support.
//!
//! Callbacks run on the membership's own poll thread, one at a time: a
//! revocation returns only once the listener has let the partitions go,
//! which holds the rebalance (within `max.poll.interval.ms`) until they
//! have, so a new owner starts after the old one stopped.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::TopicPartitionList;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata, Rebalance};
use spate_core::sync::lock;
use tracing::{info, warn};

use crate::error::{KafkaError, Result, client};
use crate::offsets::TopicPartition;
use crate::retry::{BROKER_UNAVAILABLE, is_broker_unavailable};

/// Which group protocol a member speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol with cooperative-sticky assignment (KIP-429).
    CooperativeSticky,
    /// The broker-side protocol of KIP-848 (`group.protocol=consumer`).
    Consumer,
}

/// How a member takes part in its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSettings {
    /// Without a heartbeat for this long, the group drops the member and
    /// gives its partitions to others (classic protocol; with KIP-848 the
    /// broker's `group.consumer.session.timeout.ms` applies).
    pub session_timeout: Duration,
    /// How often the member sends a heartbeat (classic protocol).
    pub heartbeat_interval: Duration,
    /// The protocol.
    pub protocol: GroupProtocol,
    /// The member's `client.id`, which the broker shows in the group's
    /// member list (`None`: librdkafka's default).
    pub client_id: Option<String>,
}

impl Default for GroupSettings {
    /// Kafka's defaults: a 45 s session, a heartbeat every 3 s.
    fn default() -> Self {
        GroupSettings {
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(3),
            protocol: GroupProtocol::CooperativeSticky,
            client_id: None,
        }
    }
}

/// Told what the group gives and takes away. Both calls run on the
/// membership's poll thread, in the group's order.
pub trait AssignmentListener: Send + Sync {
    /// `partitions` are being taken away: return once they are let go.
    /// `lost` is true when the group dropped this member (its session ran
    /// out), so another member may own them already.
    fn on_revoked(&self, partitions: &[TopicPartition], lost: bool);

    /// `partitions` now belong to this member.
    fn on_assigned(&self, partitions: &[TopicPartition]);
}

/// The member's view of its assignment, shared with the poll thread.
struct MemberContext {
    listener: Arc<dyn AssignmentListener>,
    assigned: Mutex<BTreeSet<TopicPartition>>,
    /// How many times the group dropped this member (its partitions lost).
    dropped: AtomicU64,
    /// The group metadata of the member's last rebalance (during a
    /// graceful revocation, of the generation it runs in), `None` once the
    /// group dropped it. Kept here rather than read from the consumer when
    /// a transaction commits: librdkafka resets a dropped member's id and
    /// generation (to none) before the application hears of the loss, and
    /// offsets sent with no generation are not checked at all.
    metadata: Mutex<Option<Arc<ConsumerGroupMetadata>>>,
}

impl MemberContext {
    fn set_metadata(&self, metadata: Option<ConsumerGroupMetadata>) {
        *lock(&self.metadata) = metadata.map(Arc::new);
    }
}

impl ClientContext for MemberContext {}

fn partitions_of(list: &TopicPartitionList) -> Vec<TopicPartition> {
    list.elements().iter().map(|e| TopicPartition::new(e.topic(), e.partition())).collect()
}

impl ConsumerContext for MemberContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            let partitions = partitions_of(list);
            let lost = consumer.assignment_lost();
            if lost {
                // Before the listener runs: a transaction in flight must not
                // be tried again under the member's next identity.
                self.set_metadata(None);
                self.dropped.fetch_add(1, Ordering::AcqRel);
            } else if let Some(current) = consumer.group_metadata() {
                // A graceful revocation runs in the generation that takes
                // the partitions away (cooperative: the member rejoined
                // before giving them up, and still owns them until this
                // returns). The tasks' batches in flight commit in it; under
                // the generation before, the broker would refuse them.
                self.set_metadata(Some(current));
            }
            info!(partitions = ?partitions, lost, "partitions revoked");
            self.listener.on_revoked(&partitions, lost);
            let mut assigned = lock(&self.assigned);
            for tp in &partitions {
                assigned.remove(tp);
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !matches!(rebalance, Rebalance::Error(_)) {
            // The generation this rebalance gave the member.
            self.set_metadata(consumer.group_metadata());
        }
        match rebalance {
            Rebalance::Assign(list) => {
                // The membership reads nothing: the tasks read with consumers of their own.
                if let Err(e) = consumer.pause(list) {
                    warn!(error = %e, "could not pause the membership's partitions");
                }
                let partitions = partitions_of(list);
                info!(partitions = ?partitions, "partitions assigned");
                lock(&self.assigned).extend(partitions.iter().cloned());
                self.listener.on_assigned(&partitions);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => warn!(error = %e, "rebalance failed"),
        }
    }
}

/// One member of a consumer group (see the module docs). Leaving the group
/// ([`GroupMember::leave`]) revokes its partitions through the listener.
pub struct GroupMember {
    consumer: Arc<BaseConsumer<MemberContext>>,
    group_id: String,
    stop: Arc<AtomicBool>,
    poll: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for GroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupMember").field("group_id", &self.group_id).finish_non_exhaustive()
    }
}

impl GroupMember {
    /// Joins `group_id` on `brokers`, subscribed to `topics`; the listener
    /// hears of every assignment from now on.
    pub fn join(
        brokers: &str,
        group_id: &str,
        topics: &[String],
        settings: &GroupSettings,
        listener: Arc<dyn AssignmentListener>,
    ) -> Result<Self> {
        if topics.is_empty() {
            return Err(KafkaError::Config(format!("group {group_id}: a member needs at least one topic")));
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        if let Some(client_id) = &settings.client_id {
            config.set("client.id", client_id);
        }
        match settings.protocol {
            GroupProtocol::CooperativeSticky => {
                config
                    .set("partition.assignment.strategy", "cooperative-sticky")
                    .set("session.timeout.ms", settings.session_timeout.as_millis().to_string())
                    .set("heartbeat.interval.ms", settings.heartbeat_interval.as_millis().to_string());
            }
            GroupProtocol::Consumer => {
                config.set("group.protocol", "consumer");
            }
        }
        let context = MemberContext {
            listener,
            assigned: Mutex::new(BTreeSet::new()),
            dropped: AtomicU64::new(0),
            metadata: Mutex::new(None),
        };
        let consumer: BaseConsumer<MemberContext> = config
            .create_with_context(context)
            .map_err(client(format!("create the membership consumer of group {group_id}")))?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).map_err(client(format!("subscribe group {group_id} to {topics:?}")))?;
        let consumer = Arc::new(consumer);
        let stop = Arc::new(AtomicBool::new(false));
        let poll = spawn_poll(Arc::clone(&consumer), Arc::clone(&stop), group_id)?;
        info!(group_id, topics = ?topics, "joined the group");
        Ok(GroupMember { consumer, group_id: group_id.to_string(), stop, poll: Mutex::new(Some(poll)) })
    }

    /// The group's metadata (member id, generation) of the member's last
    /// rebalance, for `send_offsets_to_transaction`; while partitions are
    /// revoked gracefully, of the generation that revokes them, in which
    /// the member still owns them until the listener returns. `None`
    /// before the member joined and once the group dropped it.
    pub fn group_metadata(&self) -> Option<Arc<ConsumerGroupMetadata>> {
        lock(&self.consumer.context().metadata).clone()
    }

    /// The partitions this member owns now.
    pub fn assignment(&self) -> BTreeSet<TopicPartition> {
        lock(&self.consumer.context().assigned).clone()
    }

    /// How many times the group has dropped this member so far (its session
    /// ran out and its partitions were lost); it rejoins as a new member.
    pub fn times_dropped(&self) -> u64 {
        self.consumer.context().dropped.load(Ordering::Acquire)
    }

    /// The group's id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// Leaves the group: every partition is revoked through the listener
    /// (which lets them go), then the member closes. Leaving again does nothing.
    pub fn leave(&self) -> Result<()> {
        let Some(poll) = lock(&self.poll).take() else { return Ok(()) };
        self.stop.store(true, Ordering::Release);
        let result =
            poll.join().map_err(|_| KafkaError::Config(format!("group {}: the poll thread panicked", self.group_id)));
        info!(group_id = %self.group_id, "left the group");
        result
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        let _ = self.leave();
    }
}

/// Polls the membership consumer (heartbeats are librdkafka's, rebalance
/// callbacks run here) until `stop`, then closes it so the group revokes
/// its partitions through the listener.
fn spawn_poll(
    consumer: Arc<BaseConsumer<MemberContext>>,
    stop: Arc<AtomicBool>,
    group: &str,
) -> Result<JoinHandle<()>> {
    let name = format!("spate-group-{group}");
    std::thread::Builder::new()
        .name(name.chars().take(15).collect())
        .spawn(move || {
            let mut warned = None;
            while !stop.load(Ordering::Acquire) {
                poll_once(&consumer, &mut warned);
            }
            if let Err(e) = consumer.close_queue() {
                warn!(error = %e, "closing the membership consumer failed");
                return;
            }
            while !consumer.closed() {
                poll_once(&consumer, &mut warned);
            }
        })
        .map_err(|e| KafkaError::Config(format!("cannot start the poll thread of group {group}: {e}")))
}

/// How often the poll thread warns that the broker is away: librdkafka
/// reports it once per connection and request, thousands of times in an
/// outage of a few seconds.
const OUTAGE_WARNING_EVERY: Duration = Duration::from_secs(1);

/// Polls once; `warned` is when the last warning of an unreachable broker was given.
fn poll_once(consumer: &BaseConsumer<MemberContext>, warned: &mut Option<Instant>) {
    match consumer.poll(Duration::from_millis(100)) {
        // Every assigned partition is paused; a record fetched before the
        // pause took effect is not this consumer's to read.
        Some(Ok(_)) | None => {}
        Some(Err(e)) if is_broker_unavailable(&e) => {
            metrics::counter!(BROKER_UNAVAILABLE).increment(1);
            if warned.is_none_or(|at| at.elapsed() >= OUTAGE_WARNING_EVERY) {
                *warned = Some(Instant::now());
                warn!(error = %e, "the Kafka broker is unreachable or not ready (group membership)");
            }
        }
        Some(Err(e)) => warn!(error = %e, "membership poll"),
    }
}
