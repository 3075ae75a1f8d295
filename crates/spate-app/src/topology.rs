//! What an application runs: stages, each a pipeline run once per
//! partition of its input topic (a task), and what a task writes.
//!
//! The first stage reads a topic of the user's. A stage that needs the
//! records of one key together (an aggregation by key across partitions)
//! sends them on with [`TaskBuilder::repartition_by_key`]: to an internal
//! topic named after the application and the operator, created with the
//! partition count of the application's input (as Kafka Streams does),
//! each key always to the same partition; a later stage reads that topic,
//! so every record of a key reaches the one task that owns its partition.
//! A stage over everything at once (a top-k over all keys) reads an
//! internal topic of one partition: one task, on one member.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::Time;
use spate_dstream::{DStream, Data, Key, ProgressMark, partition_of};
use spate_kafka::{KafkaRecord, OutputRecord};

use crate::error::AppError;
use crate::internal::{Internal, decode_or_report, encode_record};

/// One task: a stage on one partition of its input topic.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// The stage.
    pub stage: String,
    /// The input topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl fmt::Display for TaskId {
    /// `<topic>-<partition>`, also the name of its checkpoint under `tasks/`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// One record a task writes in its batch's transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Emit {
    /// Shared by the records of a topic: an internal topic's records
    /// (a word each, say) do not each carry a copy of its name.
    #[serde(with = "spate_core::shared_str")]
    topic: Arc<str>,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    partition: Option<i32>,
    timestamp: Option<i64>,
}

impl Emit {
    /// Its key's and value's bytes.
    pub(crate) fn encoded_len(&self) -> u64 {
        (self.key.as_ref().map_or(0, Vec::len) + self.value.len()) as u64
    }

    /// A record for a topic of the user's.
    pub fn to_topic(topic: &str, key: Option<Vec<u8>>, value: Vec<u8>) -> Self {
        Emit { topic: Arc::from(topic), key, value, partition: None, timestamp: None }
    }

    /// The same record stamped with `time` (its event time downstream).
    pub fn at(mut self, time: Time) -> Self {
        self.timestamp = Some(time.as_millis());
        self
    }

    /// The topic it goes to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Its timestamp (event time downstream), ms since the epoch.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// The record as it may go to Kafka at a batch whose event times are
    /// believed up to `horizon`: a record for one of the internal topics
    /// `writes` stamped later than that goes without its timestamp. The
    /// broker refuses a timestamp too far in the future
    /// (`log.message.timestamp.after.max.ms`, one hour by default), and
    /// the refusal would fail the batch and every re-run of it: one record
    /// stamped in year 2100 would stop its partition for good. The record's
    /// value still holds its event time for the reader, whose watermarks
    /// set it aside as late.
    pub(crate) fn within_horizon(mut self, horizon: Time, writes: &[InternalTopic]) -> Self {
        let beyond = self.timestamp.is_some_and(|ts| ts > horizon.as_millis());
        if beyond && writes.iter().any(|w| w.name == *self.topic) {
            tracing::warn!(
                topic = %self.topic,
                timestamp = self.timestamp,
                "a record stamped further ahead than --max-future-ms goes on without its timestamp"
            );
            self.timestamp = None;
        }
        self
    }

    /// A progress mark to one partition of an internal topic.
    pub(crate) fn progress(topic: &str, partition: i32, key: &[u8], value: Vec<u8>) -> Self {
        Emit { topic: Arc::from(topic), key: Some(key.to_vec()), value, partition: Some(partition), timestamp: None }
    }

    pub(crate) fn into_output(self) -> (Arc<str>, OutputRecord) {
        let record =
            OutputRecord { key: self.key, value: self.value, partition: self.partition, timestamp: self.timestamp };
        (self.topic, record)
    }
}

/// What a task of a stage is declared with: the task's records, and the
/// internal topics it may write to.
pub struct TaskBuilder<'a> {
    pub(crate) task: &'a TaskId,
    pub(crate) records: DStream<KafkaRecord>,
    pub(crate) internal: &'a BTreeMap<String, InternalTopic>,
    pub(crate) app: &'a str,
    /// The internal topics the task writes: each batch ends with a
    /// progress mark to every partition of each.
    pub(crate) writes: RefCell<BTreeMap<String, InternalTopic>>,
}

impl fmt::Debug for TaskBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskBuilder").field("task", &self.task).finish_non_exhaustive()
    }
}

/// An internal topic as the application created it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InternalTopic {
    /// Its name: `<application>-<operator>`.
    pub name: String,
    /// Its partitions.
    pub partitions: i32,
}

impl TaskBuilder<'_> {
    /// The task.
    pub fn task(&self) -> &TaskId {
        self.task
    }

    /// The records of the task's partition.
    pub fn records(&self) -> DStream<KafkaRecord> {
        self.records.clone()
    }

    /// Sends each `(key, value)` to the internal topic of `operator`, to the
    /// partition of its key, stamped with `timestamp(&value)` (so event
    /// time survives the hop; a time more than the member's `max_future`
    /// ahead of the batch goes unstamped, as the broker would refuse it, so
    /// keep the event time in the value too). The stage reading that topic
    /// gets every record of a key in one task; read them with
    /// [`TaskBuilder::repartitioned`].
    pub fn repartition_by_key<K, V, F>(
        &self,
        operator: &str,
        stream: &DStream<(K, V)>,
        timestamp: F,
    ) -> Result<DStream<Emit>, AppError>
    where
        K: Key,
        V: Data,
        F: Fn(&V) -> Option<Time> + Send + Sync + 'static,
    {
        let internal = self.internal.get(operator).ok_or_else(|| AppError::Invalid {
            app: self.app.to_string(),
            reason: format!("no stage reads the repartition of `{operator}`"),
        })?;
        self.writes.borrow_mut().insert(operator.to_string(), internal.clone());
        let (topic, partitions) = (Arc::<str>::from(internal.name.as_str()), internal.partitions);
        let count = usize::try_from(partitions).unwrap_or(1).max(1);
        Ok(stream.flat_map(move |(key, value)| {
            let partition = i32::try_from(partition_of(&key, count)).unwrap_or(0);
            let time = timestamp(&value);
            let bytes = match encode_record(&key, &value) {
                Ok(bytes) => bytes,
                Err(error) => {
                    // Data that serde cannot encode is a bug of its type, not
                    // input: say so rather than lose the record quietly.
                    tracing::error!(%error, topic = %topic, "a record cannot be encoded for the internal topic");
                    return None;
                }
            };
            let emit = Emit {
                topic: Arc::clone(&topic),
                key: None,
                value: bytes,
                partition: Some(partition),
                timestamp: None,
            };
            Some(match time {
                Some(time) => emit.at(time),
                None => emit,
            })
        }))
    }
}

impl TaskBuilder<'_> {
    /// What an earlier stage sent to this stage's internal topic with
    /// [`TaskBuilder::repartition_by_key`], decoded, with the writers'
    /// progress: an event-time operator applied to
    /// [`Repartitioned::records`] keeps one watermark per writer task and
    /// takes the smallest, so a writer running ahead makes nobody late.
    /// A record that does not decode is counted
    /// (`spate_bad_internal_records_total`) and logged, never dropped
    /// silently.
    pub fn repartitioned<K: Key, V: Data>(&self) -> Repartitioned<K, V> {
        let records =
            self.records.flat_map(|r: KafkaRecord| decode_or_report::<K, V>(&r)).split_progress(|i| match i {
                Internal::Record(key, value) => Ok((key, value)),
                Internal::Progress(mark) => Err(mark),
            });
        Repartitioned { records }
    }
}

/// The records of an internal topic and the progress of the tasks that
/// wrote them (see [`TaskBuilder::repartitioned`]).
pub struct Repartitioned<K, V> {
    records: DStream<(K, V)>,
}

impl<K, V> fmt::Debug for Repartitioned<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Repartitioned").field("records", &self.records).finish_non_exhaustive()
    }
}

impl<K: Key, V: Data> Repartitioned<K, V> {
    /// The records, their event-time progress told by their writers: apply
    /// the event-time operator to this stream directly (an operator in
    /// between drops the writers' progress; give it back with
    /// [`DStream::with_progress`] and [`Repartitioned::marks`]).
    pub fn records(&self) -> DStream<(K, V)> {
        self.records.clone()
    }

    /// The writers' progress marks.
    pub fn marks(&self) -> Option<DStream<ProgressMark>> {
        self.records.progress()
    }
}

/// Declares a task of a stage: returns the records it writes in each batch.
pub type DeclareTask = Arc<dyn Fn(&mut TaskBuilder<'_>) -> Result<DStream<Emit>, AppError> + Send + Sync>;

/// Where a stage reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StageInput {
    /// A topic of the user's.
    Topic(String),
    /// The internal topic of an operator, with as many partitions as the
    /// application's input.
    Repartition(String),
    /// The internal topic of an operator, with one partition.
    Single(String),
}

/// One stage of a topology.
#[derive(Clone)]
pub(crate) struct Stage {
    pub(crate) name: String,
    pub(crate) input: StageInput,
    pub(crate) declare: DeclareTask,
}

/// The stages of an application (see the module docs).
#[derive(Clone)]
pub struct Topology {
    pub(crate) app: String,
    pub(crate) stages: Vec<Stage>,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stages: Vec<(&str, &StageInput)> = self.stages.iter().map(|s| (s.name.as_str(), &s.input)).collect();
        f.debug_struct("Topology").field("app", &self.app).field("stages", &stages).finish()
    }
}

impl Topology {
    /// An application named `app` (its consumer group, the prefix of its
    /// internal topics), with no stage yet.
    pub fn new(app: &str) -> Self {
        Topology { app: app.to_string(), stages: Vec::new() }
    }

    /// The application's name.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// A stage reading the user's `topic`, a task per partition.
    pub fn stage_from_topic<F>(self, stage: &str, topic: &str, declare: F) -> Self
    where
        F: Fn(&mut TaskBuilder<'_>) -> Result<DStream<Emit>, AppError> + Send + Sync + 'static,
    {
        self.with_stage(stage, StageInput::Topic(topic.to_string()), declare)
    }

    /// A stage reading what an earlier stage sent with
    /// [`TaskBuilder::repartition_by_key`] under `operator`, a task per
    /// partition: each task gets every record of its keys.
    pub fn stage_from_repartition<F>(self, stage: &str, operator: &str, declare: F) -> Self
    where
        F: Fn(&mut TaskBuilder<'_>) -> Result<DStream<Emit>, AppError> + Send + Sync + 'static,
    {
        self.with_stage(stage, StageInput::Repartition(operator.to_string()), declare)
    }

    /// A stage with one task, reading the one-partition internal topic of
    /// `operator`: for what needs every key at once. It runs on one member
    /// at a time, and everything sent to it goes through that member.
    pub fn single_stage<F>(self, stage: &str, operator: &str, declare: F) -> Self
    where
        F: Fn(&mut TaskBuilder<'_>) -> Result<DStream<Emit>, AppError> + Send + Sync + 'static,
    {
        self.with_stage(stage, StageInput::Single(operator.to_string()), declare)
    }

    fn with_stage<F>(mut self, stage: &str, input: StageInput, declare: F) -> Self
    where
        F: Fn(&mut TaskBuilder<'_>) -> Result<DStream<Emit>, AppError> + Send + Sync + 'static,
    {
        self.stages.push(Stage { name: stage.to_string(), input, declare: Arc::new(declare) });
        self
    }

    /// The internal topic of `operator`: `<application>-<operator>`.
    pub fn internal_topic(&self, operator: &str) -> String {
        format!("{}-{operator}", self.app)
    }

    /// The topic a stage reads.
    pub(crate) fn input_topic(&self, stage: &Stage) -> String {
        match &stage.input {
            StageInput::Topic(topic) => topic.clone(),
            StageInput::Repartition(operator) | StageInput::Single(operator) => self.internal_topic(operator),
        }
    }

    /// Every problem with the topology, none when it can run.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let valid = |name: &str| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        };
        if !valid(&self.app) {
            problems.push(format!("the name `{}` may hold only letters, digits, `-`, `_` and `.`", self.app));
        }
        if !matches!(self.stages.first().map(|s| &s.input), Some(StageInput::Topic(_))) {
            problems.push("the first stage must read a topic".to_string());
        }
        let mut topics = std::collections::BTreeSet::new();
        for stage in &self.stages {
            if !valid(&stage.name) {
                problems.push(format!("stage name `{}` may hold only letters, digits, `-`, `_` and `.`", stage.name));
            }
            if !topics.insert(self.input_topic(stage)) {
                problems.push(format!("two stages read {}", self.input_topic(stage)));
            }
            if let StageInput::Repartition(op) | StageInput::Single(op) = &stage.input
                && !valid(op)
            {
                problems.push(format!("operator name `{op}` may hold only letters, digits, `-`, `_` and `.`"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing(b: &mut TaskBuilder<'_>) -> Result<DStream<Emit>, AppError> {
        Ok(b.records().map(|r| Emit::to_topic("out", None, r.value.unwrap_or_default())))
    }

    #[test]
    fn a_topology_must_start_at_a_topic_and_name_things_plainly() {
        let ok = Topology::new("words")
            .stage_from_topic("split", "lines", nothing)
            .stage_from_repartition("count", "by-word", nothing);
        assert!(ok.problems().is_empty(), "{:?}", ok.problems());
        assert_eq!(ok.internal_topic("by-word"), "words-by-word");
        let bad = Topology::new("a/b").stage_from_repartition("count", "x", nothing).single_stage("top", "x", nothing);
        let problems = bad.problems().join("; ");
        assert!(problems.contains("`a/b`"), "{problems}");
        assert!(problems.contains("the first stage must read a topic"), "{problems}");
        assert!(problems.contains("two stages read a/b-x"), "{problems}");
    }
}
