//! Kafka sinks: an idempotent producer, and an exactly-once sink that
//! commits a batch's records and its consumed offsets in one Kafka transaction.
//!
//! The transactional sink uses one transactional id per application. Opening
//! it calls `init_transactions`, which fences any older instance with the
//! same id (a zombie from before a restart can no longer commit). Each batch
//! is one transaction: its records, then `send_offsets_to_transaction` with
//! the ends of the batch's ranges for the consumer group, then the commit.
//! The committed offsets carry a batch marker (`<transactional id>@<batch id>`)
//! as their metadata string, on every partition of the source, so the
//! transaction itself records which batch it was. A re-run of a batch at or
//! below the recorded one is not written again, even a batch that read
//! nothing (whose offsets cannot tell it apart from the next one). Read the
//! output with `isolation.level=read_committed`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use spate_core::BatchId;
use spate_core::sync::lock;
use tracing::{debug, info, warn};

use crate::error::{KafkaError, Result, client};
use crate::group::GroupMember;
use crate::offset_store::CommitOutcome;
use crate::offsets::OffsetRanges;
use crate::retry::retry_coordinator;

/// One record to write: an optional key, a value, an optional partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputRecord {
    /// The key (records with one key go to one partition).
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// The partition, when the writer picks it.
    pub partition: Option<i32>,
    /// The record's timestamp (ms since the epoch); `None`: the time it is sent.
    pub timestamp: Option<i64>,
}

impl OutputRecord {
    /// A record with `value` and no key.
    pub fn value(value: impl Into<Vec<u8>>) -> Self {
        OutputRecord { key: None, value: value.into(), partition: None, timestamp: None }
    }

    /// The same record, to `partition`.
    pub fn to_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The same record, stamped `timestamp` (ms since the epoch).
    pub fn at(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// A record with `key` and `value`.
    pub fn keyed(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        OutputRecord { key: Some(key.into()), value: value.into(), partition: None, timestamp: None }
    }
}

/// Remembers the first delivery failure of the transaction under way.
///
/// Each record is sent with the number of its transaction as its delivery
/// opaque, and a failure counts only for the transaction it was sent in:
/// an aborted transaction's records fail after the abort (purged from the
/// queue), and those reports may be served while the next transaction
/// runs. Charged to that one, they would fail a batch that committed, and
/// the batch would be aborted and run again for nothing.
#[derive(Default)]
struct DeliveryErrors {
    state: Mutex<Deliveries>,
}

#[derive(Default)]
struct Deliveries {
    /// The transaction records are sent in now (always 0 for a producer without transactions).
    transaction: usize,
    /// The first failure of a record of `transaction`.
    first: Option<RdKafkaError>,
}

impl ClientContext for DeliveryErrors {}

impl ProducerContext for DeliveryErrors {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, transaction: usize) {
        if let Err((error, _)) = result {
            let mut state = self.lock();
            if transaction == state.transaction {
                state.first.get_or_insert_with(|| error.clone());
            } else {
                debug!(transaction, error = %error, "a record of an earlier transaction failed; that transaction ended without it");
            }
        }
    }
}

impl DeliveryErrors {
    fn lock(&self) -> std::sync::MutexGuard<'_, Deliveries> {
        lock(&self.state)
    }

    /// Starts counting failures for a new transaction, whose number it returns.
    fn next_transaction(&self) -> usize {
        let mut state = self.lock();
        state.transaction = state.transaction.wrapping_add(1);
        state.first = None;
        state.transaction
    }

    /// The first failure of a record of `transaction`, when it is the one under way.
    fn take(&self, transaction: usize) -> Option<RdKafkaError> {
        let mut state = self.lock();
        if state.transaction == transaction { state.first.take() } else { None }
    }
}

/// How long [`await_deliveries`] lets a moment be.
const DELIVERY_CHECK: Duration = Duration::from_millis(1);

/// Waits until `in_flight` (a producer's records not yet reported) is 0,
/// or `timeout` passed, calling `a_moment` between looks: a sleep for a
/// threaded producer (its own thread serves the reports), a short poll for
/// one that serves them where it is called. Returns what is left of
/// `timeout`, for the flush or commit that follows, so that the two
/// together keep to it.
///
/// Called before a flush (a commit flushes first): the client's flush,
/// finding a record in flight, waits for an event of its own for up to
/// 100 ms however soon the report comes, so every batch took 100 ms more
/// than its round trips (some 10 ms on a local broker). Waiting here, the
/// flush finds nothing left.
fn await_deliveries(in_flight: impl Fn() -> i32, a_moment: impl Fn(), timeout: Duration) -> Duration {
    let deadline = Instant::now() + timeout;
    while in_flight() > 0 && Instant::now() < deadline {
        a_moment();
    }
    deadline.saturating_duration_since(Instant::now())
}

fn producer_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers).set("enable.idempotence", "true").set("acks", "all").set("linger.ms", "5");
    config
}

/// The librdkafka record of `record` for `topic`, sent in `transaction`.
fn base_record<'a>(
    topic: &'a str,
    record: &'a OutputRecord,
    transaction: usize,
) -> BaseRecord<'a, Vec<u8>, Vec<u8>, usize> {
    let mut base = BaseRecord::with_opaque_to(topic, transaction).payload(&record.value);
    if let Some(key) = &record.key {
        base = base.key(key);
    }
    if let Some(partition) = record.partition {
        base = base.partition(partition);
    }
    if let Some(timestamp) = record.timestamp {
        base = base.timestamp(timestamp);
    }
    base
}

/// Sends one record, waiting for queue room when librdkafka's queue is full.
fn send(producer: &BaseProducer<DeliveryErrors>, topic: &str, record: &OutputRecord) -> Result<()> {
    loop {
        match producer.send(base_record(topic, record, NO_TRANSACTION)) {
            Ok(()) => return Ok(()),
            Err((RdKafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(50));
            }
            Err((source, _)) => return Err(KafkaError::Delivery { topic: topic.to_string(), source }),
        }
    }
}

/// [`send`] in `transaction`, on a producer whose delivery reports a thread of its own serves.
fn send_threaded(
    producer: &ThreadedProducer<DeliveryErrors>,
    topic: &str,
    record: &OutputRecord,
    transaction: usize,
) -> Result<()> {
    loop {
        match producer.send(base_record(topic, record, transaction)) {
            Ok(()) => return Ok(()),
            Err((RdKafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err((source, _)) => return Err(KafkaError::Delivery { topic: topic.to_string(), source }),
        }
    }
}

/// An idempotent producer (`enable.idempotence`, `acks=all`): retries never
/// duplicate or reorder a record within a session. At-least-once across a
/// batch re-run; for exactly-once use [`TransactionalKafkaSink`].
pub struct KafkaSink {
    producer: BaseProducer<DeliveryErrors>,
    topic: String,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("topic", &self.topic).finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A sink writing to `topic` on `brokers`.
    pub fn new(brokers: &str, topic: impl Into<String>) -> Result<Self> {
        let producer = producer_config(brokers)
            .create_with_context(DeliveryErrors::default())
            .map_err(client("create the idempotent producer"))?;
        Ok(KafkaSink { producer, topic: topic.into(), timeout: Duration::from_secs(30) })
    }

    /// Sends `records` and waits until every one is acknowledged.
    pub fn write(&self, records: impl IntoIterator<Item = OutputRecord>) -> Result<u64> {
        let mut sent = 0;
        for record in records {
            send(&self.producer, &self.topic, &record)?;
            sent += 1;
        }
        let producer = &self.producer;
        let left = await_deliveries(|| producer.in_flight_count(), || producer.poll(DELIVERY_CHECK), self.timeout);
        self.producer.flush(left).map_err(client(format!("flush to {}", self.topic)))?;
        match self.producer.context().take(NO_TRANSACTION) {
            Some(source) => Err(KafkaError::Delivery { topic: self.topic.clone(), source }),
            None => Ok(sent),
        }
    }
}

/// Where a transaction's offsets commit: the group metadata to commit
/// them under, read again for each try, and whether a try refused for a
/// moved-on generation may be made again.
#[derive(Clone, Copy)]
struct Generation<'a> {
    metadata: &'a dyn Fn() -> Result<Arc<ConsumerGroupMetadata>>,
    may_retry: &'a dyn Fn() -> bool,
}

/// A transactional producer and what its transactions need: shared by the
/// exactly-once sink of one job and by a group member's tasks.
struct Transactions {
    /// The producer, taken for one transaction at a time. Threaded: an
    /// abort waits for the delivery reports of what was sent, which its own
    /// thread serves. Replaced when it reports a fatal error.
    producer: Mutex<ThreadedProducer<DeliveryErrors>>,
    /// Batches waiting for the next transaction (see [`Transactions::write_batch`]).
    queue: Mutex<Vec<Arc<QueuedBatch>>>,
    /// Reads the group's committed offsets; never reads records.
    group: BaseConsumer,
    brokers: String,
    transactional_id: String,
    transaction_timeout: Duration,
    timeout: Duration,
    /// Whether a producer with a fatal error is opened again (see [`Transactions::reopen_if_unusable`]).
    reopens: Reopen,
    /// The producer's last abort ran out of time and is still in progress
    /// in the client (see [`Transactions::abort`]). Changed with the
    /// producer's lock held.
    abort_unfinished: AtomicBool,
}

/// What a transactional producer with a fatal error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reopen {
    /// It stays failed: one job's producer, whose fence means a newer
    /// instance of the job, or a transaction that outlived its timeout; the
    /// job stops, and is started again with a new producer.
    Never,
    /// It is opened again: a group member's, which the group's generation
    /// (checked by the broker on each transaction's offsets, KIP-447)
    /// fences when the member is a zombie, not the transactional id.
    WhenFatal,
}

/// One batch waiting to be written in a transaction.
struct QueuedBatch {
    marker_id: String,
    batch: BatchId,
    ranges: OffsetRanges,
    records: Vec<(Arc<str>, OutputRecord)>,
    /// How the transaction that wrote it ended, set by its writer when
    /// that was another batch's.
    outcome: Mutex<Option<std::result::Result<(), Failure>>>,
}

impl QueuedBatch {
    fn new<S: AsRef<str>>(
        marker_id: &str,
        batch: BatchId,
        ranges: &OffsetRanges,
        records: impl IntoIterator<Item = (S, OutputRecord)>,
    ) -> Self {
        // A batch writes to a few topics: one name each, shared by its records.
        let mut names: Vec<Arc<str>> = Vec::new();
        let records = records
            .into_iter()
            .map(|(topic, record)| {
                let topic = topic.as_ref();
                let name = match names.iter().find(|n| &***n == topic) {
                    Some(name) => Arc::clone(name),
                    None => {
                        let name: Arc<str> = Arc::from(topic);
                        names.push(Arc::clone(&name));
                        name
                    }
                };
                (name, record)
            })
            .collect();
        QueuedBatch {
            marker_id: marker_id.to_string(),
            batch,
            ranges: ranges.clone(),
            records,
            outcome: Mutex::new(None),
        }
    }
}

/// Why a shared transaction failed, as each of its batches is told.
#[derive(Clone, Debug)]
struct Failure {
    /// The group's generation moved on (the batch may be tried again).
    rebalance: bool,
    reason: String,
}

impl Failure {
    fn of(error: &KafkaError) -> Self {
        Failure { rebalance: is_rebalance_error(error), reason: error.to_string() }
    }
}

impl Transactions {
    /// Opens the producer and fences any older instance with the same
    /// `transactional_id`, aborting its open transaction.
    fn open(
        brokers: &str,
        transactional_id: &str,
        group_id: &str,
        transaction_timeout: Duration,
        reopens: Reopen,
    ) -> Result<Self> {
        let timeout = Duration::from_secs(30);
        let producer = open_producer(brokers, transactional_id, transaction_timeout, timeout)?;
        let group: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(client(format!("create the group client of {group_id}")))?;
        info!(transactional_id, group_id, "transactional producer ready");
        Ok(Transactions {
            producer: Mutex::new(producer),
            queue: Mutex::new(Vec::new()),
            group,
            brokers: brokers.to_string(),
            transactional_id: transactional_id.to_string(),
            transaction_timeout,
            timeout,
            reopens,
            abort_unfinished: AtomicBool::new(false),
        })
    }

    /// Opens `producer` again, when it is one that reopens, if it reports
    /// a fatal error, which no later call clears, or its last abort ran
    /// out of time. The usual fatal one: the producer was fenced because
    /// its open transaction outlived the transaction timeout (the process
    /// was paused or starved) and the broker aborted it and moved the
    /// producer's epoch on. An abort left unfinished (the broker paused)
    /// would hold the producer, and every task's batch with it, for the
    /// sink's timeout at each try to finish it; a new producer's
    /// registration fences the old one and aborts its transaction at once.
    /// The batch of that transaction was not committed, and the checkpoint
    /// lease and the group's generation still decide who may commit it.
    fn reopen_if_unusable(&self, producer: &mut ThreadedProducer<DeliveryErrors>) -> Result<()> {
        if self.reopens == Reopen::Never {
            return Ok(());
        }
        let why = match producer.client().fatal_error() {
            Some((code, reason)) => format!("a fatal error ({code:?}: {reason})"),
            None if self.abort_unfinished.load(Ordering::SeqCst) => "an abort that ran out of time".to_string(),
            None => return Ok(()),
        };
        warn!(transactional_id = %self.transactional_id, why, "opening the transactional producer again");
        *producer = open_producer(&self.brokers, &self.transactional_id, self.transaction_timeout, self.timeout)?;
        self.abort_unfinished.store(false, Ordering::SeqCst);
        metrics::counter!(PRODUCERS_REOPENED).increment(1);
        Ok(())
    }

    /// Writes batch `batch` of the job or task `marker_id`: `records` (each
    /// to its topic) and the ends of its `ranges`, marked with the batch, in
    /// one transaction whose offsets commit with `metadata`; or nothing,
    /// when the group's offsets show the batch committed before. The
    /// transaction is counted for each topic written and each of `topics`.
    ///
    /// Batches written at once share a transaction (group commit): each
    /// batch joins the queue, then waits for the producer; whoever takes it
    /// with its batch still queued writes every queued batch in one
    /// transaction and tells each how it ended. A member's tasks so commit
    /// in a few transactions a round instead of one each, and a batch's
    /// records and offsets still commit together or not at all.
    fn write_batch<S: AsRef<str>>(
        &self,
        topics: &[&str],
        marker_id: &str,
        batch: BatchId,
        ranges: &OffsetRanges,
        records: impl IntoIterator<Item = (S, OutputRecord)>,
        group: Generation<'_>,
    ) -> Result<CommitOutcome> {
        if ranges.ranges().is_empty() {
            return Err(KafkaError::Config(format!(
                "batch {batch} has no offset range: the transaction would not record the batch"
            )));
        }
        let request = Arc::new(QueuedBatch::new(marker_id, batch, ranges, records));
        let mut topics: std::collections::BTreeSet<String> = topics.iter().map(|t| t.to_string()).collect();
        topics.extend(request.records.iter().map(|(topic, _)| topic.to_string()));
        let mut attempt = 1;
        loop {
            // Each try asks again: the task's next owner may have committed it meanwhile.
            // Asked before taking the producer: the answer waits while another
            // producer's transaction holds offsets of these partitions (a dead
            // member's, until the broker aborts it), and the other batches of
            // this producer need not wait with it.
            if self.already_committed(marker_id, batch, ranges)? {
                info!(batch = batch.0, marker_id, "batch already committed to Kafka; not written again");
                return Ok(CommitOutcome::AlreadyCommitted);
            }
            let failure = match self.commit_queued(&request, group) {
                Ok(()) => {
                    for topic in &topics {
                        metrics::counter!(TRANSACTIONS_COMMITTED, "topic" => topic.clone()).increment(1);
                    }
                    return Ok(CommitOutcome::Committed);
                }
                Err(failure) => failure,
            };
            for topic in &topics {
                metrics::counter!(TRANSACTIONS_ABORTED, "topic" => topic.clone()).increment(1);
            }
            if failure.rebalance && attempt < GENERATION_ATTEMPTS && (group.may_retry)() {
                // A rebalance moved the group on while the batch ran, and the
                // member still owns the batch's partitions: its next
                // generation may commit it.
                warn!(batch = batch.0, attempt, error = %failure.reason, "the group's generation changed; trying the transaction again");
                std::thread::sleep(GENERATION_PAUSE);
                attempt += 1;
                continue;
            }
            return Err(KafkaError::Transaction {
                batch,
                transactional_id: self.transactional_id.clone(),
                reason: failure.reason,
            });
        }
    }

    /// Queues `request` and waits for the producer: returns how the
    /// transaction that wrote it ended, whether another batch's writer ran
    /// it or it runs here with every batch queued now.
    fn commit_queued(&self, request: &Arc<QueuedBatch>, group: Generation<'_>) -> std::result::Result<(), Failure> {
        *lock(&request.outcome) = None;
        lock(&self.queue).push(Arc::clone(request));
        let mut producer = lock(&self.producer);
        // Set, under the producer, by the writer of an earlier transaction.
        if let Some(outcome) = lock(&request.outcome).take() {
            return outcome;
        }
        let queued = std::mem::take(&mut *lock(&self.queue));
        // A producer the last transaction left unusable, whose reopening
        // failed then (the broker still away), is opened again first.
        let result = self
            .reopen_if_unusable(&mut producer)
            .and_then(|()| (group.metadata)())
            .and_then(|metadata| self.attempt(&producer, &queued, &metadata));
        let outcome = result.as_ref().map(|_| ()).map_err(Failure::of);
        for other in queued.iter().filter(|q| !Arc::ptr_eq(q, request)) {
            *lock(&other.outcome) = Some(outcome.clone());
        }
        if result.is_err()
            && let Err(reopen) = self.reopen_if_unusable(&mut producer)
        {
            return Err(Failure::of(&reopen));
        }
        outcome
    }

    /// One transaction of the `queued` batches: begin, fill, commit;
    /// aborted when any step fails.
    fn attempt(
        &self,
        producer: &ThreadedProducer<DeliveryErrors>,
        queued: &[Arc<QueuedBatch>],
        metadata: &ConsumerGroupMetadata,
    ) -> Result<()> {
        if self.abort_unfinished.load(Ordering::SeqCst) {
            self.abort(producer)?;
        }
        producer.begin_transaction().map_err(client("begin the transaction"))?;
        let transaction = producer.context().next_transaction();
        let result = self.fill_and_commit(producer, transaction, queued, metadata);
        if let Err(e) = &result {
            let batches: Vec<String> = queued.iter().map(|q| batch_marker(&q.marker_id, q.batch)).collect();
            warn!(batches = %batches.join(", "), error = %e, "aborting the transaction");
            if let Err(abort) = self.abort(producer) {
                warn!(error = %abort, "abort failed");
            }
        }
        result
    }

    /// Aborts the open transaction. An abort that runs out of time (the
    /// broker away) goes on in the client, which refuses to begin another
    /// transaction ("conflicting abort_transaction API call is already in
    /// progress") until abort is called again and finishes; so such an
    /// abort is remembered, and the producer is opened again (one that
    /// reopens, see [`Transactions::reopen_if_unusable`]) or the abort
    /// finished before the next transaction begins, instead of every later
    /// batch failing on it.
    fn abort(&self, producer: &ThreadedProducer<DeliveryErrors>) -> Result<()> {
        let result = producer.abort_transaction(self.timeout);
        let unfinished = matches!(&result, Err(RdKafkaError::Transaction(e)) if e.is_retriable());
        self.abort_unfinished.store(unfinished, Ordering::SeqCst);
        result.map_err(client("abort the transaction"))
    }

    /// Sends the `queued` batches' records and the ends of their ranges
    /// (each marked with its batch) in `transaction`, then commits it.
    fn fill_and_commit(
        &self,
        producer: &ThreadedProducer<DeliveryErrors>,
        transaction: usize,
        queued: &[Arc<QueuedBatch>],
        metadata: &ConsumerGroupMetadata,
    ) -> Result<()> {
        let mut offsets = TopicPartitionList::new();
        for request in queued {
            for (topic, record) in &request.records {
                send_threaded(producer, topic, record, transaction)?;
            }
            let marker = batch_marker(&request.marker_id, request.batch);
            for (tp, until) in request.ranges.until_offsets() {
                offsets
                    .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(until))
                    .map_err(client(format!("offset list entry {tp}")))?;
                if let Some(mut element) = offsets.find_partition(&tp.topic, tp.partition) {
                    element.set_metadata(&marker);
                }
            }
        }
        retry_coordinator("send offsets to the transaction", self.timeout, |left| {
            producer.send_offsets_to_transaction(&offsets, metadata, left)
        })?;
        let a_moment = || std::thread::sleep(DELIVERY_CHECK);
        let left = await_deliveries(|| producer.in_flight_count(), a_moment, self.timeout);
        retry_coordinator("commit the transaction", left, |left| producer.commit_transaction(left))?;
        match producer.context().take(transaction) {
            Some(source) => {
                let topic =
                    queued.iter().find_map(|q| q.records.first()).map(|(t, _)| t.to_string()).unwrap_or_default();
                Err(KafkaError::Delivery { topic, source })
            }
            None => Ok(()),
        }
    }

    /// Whether the group's committed offsets say `batch` of `marker_id` committed before.
    fn already_committed(&self, marker_id: &str, batch: BatchId, ranges: &OffsetRanges) -> Result<bool> {
        let mut list = TopicPartitionList::new();
        for range in ranges.ranges() {
            list.add_partition(&range.topic, range.partition);
        }
        let committed = retry_coordinator("read the group's committed offsets", self.timeout, |left| {
            self.group.committed_offsets(list.clone(), left)
        })?;
        let recorded = committed.elements().iter().filter_map(|e| marked_batch(marker_id, e.metadata())).max();
        let non_empty: Vec<_> = ranges.ranges().iter().filter(|r| r.count() > 0).collect();
        let offsets_reached = non_empty.iter().all(|range| {
            committed
                .find_partition(&range.topic, range.partition)
                .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= range.until))
        });
        Ok(match recorded {
            // The offsets must agree too: a batch id reused after the checkpoint was replaced
            // (numbering restarted) but reading new records is not the recorded batch.
            Some(recorded) => batch <= recorded && offsets_reached,
            // No marker of ours (offsets committed by an older version): the offsets alone.
            None => !non_empty.is_empty() && offsets_reached,
        })
    }
}

/// The exactly-once Kafka sink: each batch's records and consumed offsets in
/// one transaction.
pub struct TransactionalKafkaSink {
    transactions: Transactions,
    topic: String,
}

impl std::fmt::Debug for TransactionalKafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalKafkaSink")
            .field("topic", &self.topic)
            .field("transactional_id", &self.transactions.transactional_id)
            .finish_non_exhaustive()
    }
}

impl TransactionalKafkaSink {
    /// Opens the sink writing to `topic`, committing offsets for `group_id`.
    /// Fences any older instance with the same `transactional_id` (one per
    /// application) and aborts its open transaction.
    pub fn new(brokers: &str, topic: impl Into<String>, transactional_id: &str, group_id: &str) -> Result<Self> {
        let transactions =
            Transactions::open(brokers, transactional_id, group_id, Duration::from_secs(60), Reopen::Never)?;
        Ok(TransactionalKafkaSink { transactions, topic: topic.into() })
    }

    /// Writes batch `batch`: its `records` and the ends of its `ranges` (the
    /// consumed offsets, each marked with `batch`) commit in one transaction,
    /// or neither does. When the group's committed offsets carry this sink's
    /// marker of `batch` or a later batch and reach the ends of its non-empty
    /// ranges, the batch was committed before (a re-run after a crash):
    /// nothing is written. Without this sink's marker
    /// (offsets committed by an older version) the offsets alone decide, and
    /// a batch that read nothing is written.
    pub fn write_batch(
        &self,
        batch: BatchId,
        ranges: &OffsetRanges,
        records: impl IntoIterator<Item = OutputRecord>,
    ) -> Result<CommitOutcome> {
        let t = &self.transactions;
        let metadata = || {
            t.group
                .group_metadata()
                .map(Arc::new)
                .ok_or_else(|| KafkaError::Config("the group client has no group metadata".into()))
        };
        let topic = self.topic.as_str();
        let records = records.into_iter().map(|r| (topic, r));
        // A job's sink is in no group generation: nothing to try again for.
        t.write_batch(
            &[topic],
            &t.transactional_id,
            batch,
            ranges,
            records,
            Generation { metadata: &metadata, may_retry: &|| false },
        )
    }
}

/// The transactional producer of one group member (KIP-447): every task the
/// member runs writes its batches through it, each batch's records in a
/// transaction with the task's consumed offsets committed under the
/// member's current group metadata. Batches of several tasks written at
/// once share the transaction (see [`MemberTransactions::write_batch`]).
/// A member the group has dropped (a zombie whose session ran out) has an
/// old generation, so the broker refuses its offsets and the transaction
/// aborts: it cannot commit anything. Batches are marked
/// per task, so a task's new owner recognises batches the old owner
/// committed.
pub struct MemberTransactions {
    transactions: Transactions,
    member: Arc<GroupMember>,
}

impl std::fmt::Debug for MemberTransactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberTransactions")
            .field("transactional_id", &self.transactions.transactional_id)
            .field("group", &self.member.group_id())
            .finish_non_exhaustive()
    }
}

impl MemberTransactions {
    /// The producer `transactional_id` of `member` (one per member; a
    /// member started again under the same id fences its earlier
    /// incarnation). An open transaction of a member that died is aborted
    /// by the broker after `transaction_timeout`; until then readers with
    /// `read_committed` wait at it, so keep it short. A transaction that
    /// outlives it (the process paused or starved) fences the producer;
    /// the batch fails and the producer is opened again for the next.
    pub fn new(
        brokers: &str,
        transactional_id: &str,
        member: Arc<GroupMember>,
        transaction_timeout: Duration,
    ) -> Result<Self> {
        let transactions =
            Transactions::open(brokers, transactional_id, member.group_id(), transaction_timeout, Reopen::WhenFatal)?;
        Ok(MemberTransactions { transactions, member })
    }

    /// Writes batch `batch` of `task`: `records` (each to its topic) and
    /// the ends of `ranges` in one transaction, or nothing when the group's
    /// offsets show that `task` committed the batch before (under any
    /// member). Refused when the member is not in the group. Other tasks'
    /// batches written at the same time go in the same transaction: it
    /// commits all of them or none, and a batch it could not commit is
    /// tried again (by each of its tasks) as when it ran alone.
    pub fn write_batch<S: AsRef<str>>(
        &self,
        task: &str,
        batch: BatchId,
        ranges: &OffsetRanges,
        records: impl IntoIterator<Item = (S, OutputRecord)>,
    ) -> Result<CommitOutcome> {
        let metadata = || {
            self.member.group_metadata().ok_or_else(|| {
                KafkaError::Config(format!(
                    "member of {} has no group metadata: not in the group",
                    self.member.group_id()
                ))
            })
        };
        // Tried again only as the same member (not dropped since) that still
        // owns every partition of the batch: never as a member the group
        // dropped and let back in, whose partitions may have moved on.
        let dropped = self.member.times_dropped();
        let owns = || {
            let owned = self.member.assignment();
            self.member.times_dropped() == dropped
                && ranges.ranges().iter().all(|r| owned.contains(&r.topic_partition()))
        };
        self.transactions.write_batch(
            &[],
            task,
            batch,
            ranges,
            records,
            Generation { metadata: &metadata, may_retry: &owns },
        )
    }
}

/// A transactional producer for `transactional_id`, its transactions
/// initialised: any older instance with the id is fenced and its open
/// transaction aborted.
fn open_producer(
    brokers: &str,
    transactional_id: &str,
    transaction_timeout: Duration,
    timeout: Duration,
) -> Result<ThreadedProducer<DeliveryErrors>> {
    let mut config = producer_config(brokers);
    config
        .set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", transaction_timeout.as_millis().to_string());
    let producer: ThreadedProducer<DeliveryErrors> = config
        .create_with_context(DeliveryErrors::default())
        .map_err(client(format!("create the transactional producer {transactional_id}")))?;
    producer
        .init_transactions(timeout)
        .map_err(client(format!("init transactions of {transactional_id} (fences older instances)")))?;
    Ok(producer)
}

/// The delivery opaque of the records of a producer without transactions.
const NO_TRANSACTION: usize = 0;

/// How often a transaction is tried when the group's generation moved on.
const GENERATION_ATTEMPTS: u32 = 8;
/// The pause between those tries (a rebalance takes a moment to settle).
const GENERATION_PAUSE: Duration = Duration::from_millis(500);

/// True when the broker refused the offsets because a rebalance is under
/// way or just moved the generation on. (A member the group dropped gets
/// `UNKNOWN_MEMBER_ID`: never tried again.)
fn is_rebalance_error(error: &KafkaError) -> bool {
    let KafkaError::Client { source, .. } = error else { return false };
    let code = match source {
        RdKafkaError::Transaction(e) => Some(e.code()),
        other => other.rdkafka_error_code(),
    };
    matches!(code, Some(RDKafkaErrorCode::IllegalGeneration | RDKafkaErrorCode::RebalanceInProgress))
}

/// Counter of `/metrics`: output transactions committed, per output topic.
pub(crate) const TRANSACTIONS_COMMITTED: &str = "spate_kafka_transactions_committed_total";
/// Counter of `/metrics`: output transactions aborted, per output topic.
pub(crate) const TRANSACTIONS_ABORTED: &str = "spate_kafka_transactions_aborted_total";
/// Counter of `/metrics`: transactional producers opened again after a fatal error.
pub(crate) const PRODUCERS_REOPENED: &str = "spate_kafka_transactional_producers_reopened_total";

/// The metadata string of the offsets batch `batch` commits: `<transactional id>@<batch id>`.
fn batch_marker(transactional_id: &str, batch: BatchId) -> String {
    format!("{transactional_id}@{}", batch.0)
}

/// The batch a committed offset's metadata records, when this sink wrote it.
fn marked_batch(transactional_id: &str, metadata: &str) -> Option<BatchId> {
    let (id, batch) = metadata.rsplit_once('@')?;
    (id == transactional_id).then(|| batch.parse().ok().map(BatchId)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_names_the_sink_and_the_batch() {
        let marker = batch_marker("spate-app@1", BatchId(42));
        assert_eq!(marker, "spate-app@1@42");
        assert_eq!(marked_batch("spate-app@1", &marker), Some(BatchId(42)));
        assert_eq!(marked_batch("spate-other", &marker), None, "another sink's batches are not ours");
        assert_eq!(marked_batch("spate-app@1", ""), None);
        assert_eq!(marked_batch("spate-app@1", "spate-app@1@x"), None);
    }

    /// The broker of the tests (`cargo xtask test` starts one).
    fn brokers() -> String {
        match std::env::var("SPATE_KAFKA_BROKERS") {
            Ok(b) if !b.trim().is_empty() => b,
            _ => panic!(
                "this test needs a Kafka broker: run through `cargo xtask test` or set SPATE_KAFKA_BROKERS \
                 (e.g. after `cargo xtask kafka start`)"
            ),
        }
    }

    #[test]
    fn batches_queued_while_the_producer_is_taken_commit_in_one_transaction_each_once() {
        let brokers = brokers();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let (input, output) = (format!("group-commit-in-{nanos}"), format!("group-commit-out-{nanos}"));
        crate::topics::ensure_topic(&brokers, &input, 3).unwrap();
        crate::topics::ensure_topic(&brokers, &output, 1).unwrap();
        let transactional_id = format!("group-commit-{nanos}");
        let group = format!("group-commit-app-{nanos}");
        let transactions = Arc::new(
            Transactions::open(&brokers, &transactional_id, &group, Duration::from_secs(10), Reopen::Never).unwrap(),
        );
        let ranges = |p: i32| OffsetRanges::new(vec![crate::offsets::OffsetRange::new(input.clone(), p, 0, 0)]);
        // Taken here, so that every writer queues its batch and waits.
        let held = lock(&transactions.producer);
        let writers: Vec<_> = (0..3)
            .map(|p| {
                let (t, ranges, output) = (Arc::clone(&transactions), ranges(p), output.clone());
                std::thread::spawn(move || {
                    let metadata = || {
                        t.group.group_metadata().map(Arc::new).ok_or_else(|| KafkaError::Config("no metadata".into()))
                    };
                    let record = (output.as_str(), OutputRecord::value(format!("from task {p}")));
                    let generation = Generation { metadata: &metadata, may_retry: &|| false };
                    t.write_batch(&[], &format!("task-{p}"), BatchId(0), &ranges, [record], generation)
                })
            })
            .collect();
        while lock(&transactions.queue).len() < 3 {
            std::thread::yield_now();
        }
        let before = held.context().lock().transaction;
        drop(held);
        for writer in writers {
            assert_eq!(writer.join().unwrap().unwrap(), CommitOutcome::Committed);
        }
        let after = lock(&transactions.producer).context().lock().transaction;
        assert_eq!(after - before, 1, "the three batches shared one transaction");
        for p in 0..3 {
            let committed = transactions.already_committed(&format!("task-{p}"), BatchId(0), &ranges(p)).unwrap();
            assert!(committed, "task {p}'s offsets carry its own batch marker");
        }
    }
}
