//! Offset ranges and their JSON: what a batch reads, what `offsets/N` holds,
//! and the starting-offsets spec (Spark's `{"topic":{"0":36,"1":-2}}`).
//!
//! A batch's ranges are logged as
//! `{"events":{"0":{"from":0,"until":36},"1":{"from":5,"until":9}}}`: both
//! ends, so a re-run after a crash reads exactly the same records without
//! needing the previous batch's entry. [`OffsetRanges::until_json`] gives the
//! ends alone in Spark's shape, for monitoring tools.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::error::{KafkaError, Result, clip};

/// In a starting-offsets spec: the earliest offset still on the broker.
pub const EARLIEST: i64 = -2;
/// In a starting-offsets spec: the latest offset (only records produced later).
pub const LATEST: i64 = -1;

/// A topic and one of its partitions.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl TopicPartition {
    /// `topic`/`partition`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition { topic: topic.into(), partition }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// An offset per partition (positions, committed offsets, a spec with
/// [`EARLIEST`]/[`LATEST`] markers).
pub type PartitionOffsets = BTreeMap<TopicPartition, i64>;

/// The records `[from, until)` of one partition: what one task reads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OffsetRange {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The first offset read.
    pub from: i64,
    /// One past the last offset read.
    pub until: i64,
}

impl OffsetRange {
    /// The range `[from, until)` of `topic`/`partition`.
    pub fn new(topic: impl Into<String>, partition: i32, from: i64, until: i64) -> Self {
        OffsetRange { topic: topic.into(), partition, from, until }
    }

    /// How many offsets the range covers.
    pub fn count(&self) -> u64 {
        u64::try_from(self.until - self.from).unwrap_or(0)
    }

    /// The partition the range belongs to.
    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition::new(self.topic.clone(), self.partition)
    }
}

impl fmt::Display for OffsetRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} [{}, {})", self.topic, self.partition, self.from, self.until)
    }
}

/// The ranges of one batch, one per partition, sorted by topic and partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffsetRanges {
    ranges: Vec<OffsetRange>,
}

impl OffsetRanges {
    /// Ranges from a list (sorted here; at most one range per partition is expected).
    pub fn new(mut ranges: Vec<OffsetRange>) -> Self {
        ranges.sort();
        OffsetRanges { ranges }
    }

    /// The ranges.
    pub fn ranges(&self) -> &[OffsetRange] {
        &self.ranges
    }

    /// How many records the batch covers.
    pub fn count(&self) -> u64 {
        self.ranges.iter().map(OffsetRange::count).sum()
    }

    /// True when no range covers any record.
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// The end of each range: where the stream is after this batch.
    pub fn until_offsets(&self) -> PartitionOffsets {
        self.ranges.iter().map(|r| (r.topic_partition(), r.until)).collect()
    }

    /// The start of each range.
    pub fn from_offsets(&self) -> PartitionOffsets {
        self.ranges.iter().map(|r| (r.topic_partition(), r.from)).collect()
    }

    /// The ranges as logged in `offsets/N`:
    /// `{"topic":{"0":{"from":0,"until":36}}}`.
    pub fn to_json(&self) -> String {
        let mut topics: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
        for r in &self.ranges {
            let mut range = Map::new();
            range.insert("from".into(), Value::from(r.from));
            range.insert("until".into(), Value::from(r.until));
            topics.entry(&r.topic).or_default().insert(r.partition.to_string(), Value::Object(range));
        }
        let object: Map<String, Value> = topics.into_iter().map(|(t, p)| (t.to_string(), Value::Object(p))).collect();
        Value::Object(object).to_string()
    }

    /// Reads what [`OffsetRanges::to_json`] wrote.
    pub fn from_json(json: &str) -> Result<OffsetRanges> {
        let bad = |reason: String| KafkaError::BadOffsets { reason, json: clip(json) };
        let mut ranges = Vec::new();
        for (topic, partition, value) in nested_entries(json)? {
            let end = |name: &str| {
                value
                    .get(name)
                    .and_then(Value::as_i64)
                    .ok_or_else(|| bad(format!("{topic}/{partition}: `{name}` is missing or not an integer")))
            };
            let (from, until) = (end("from")?, end("until")?);
            if from < 0 || until < from {
                return Err(bad(format!("{topic}/{partition}: range [{from}, {until}) is not valid")));
            }
            ranges.push(OffsetRange { topic, partition, from, until });
        }
        Ok(OffsetRanges::new(ranges))
    }

    /// The ranges as the entry of source `name` in an `offsets/N` file.
    pub fn to_source_offset(&self, name: &str) -> spate_logstore::SourceOffset {
        let value = serde_json::from_str(&self.to_json()).unwrap_or(Value::Null);
        spate_logstore::SourceOffset::new(name, Some(value))
    }

    /// The ranges source `name` logged in an `offsets/N` entry; `None` when
    /// the entry has no such source or it had no offsets.
    pub fn from_offset_seq(entry: &spate_logstore::OffsetSeq, name: &str) -> Result<Option<OffsetRanges>> {
        match entry.offset_of(name) {
            Some(Some(value)) => OffsetRanges::from_json(&value.to_string()).map(Some),
            _ => Ok(None),
        }
    }

    /// The ends in Spark's shape, `{"topic":{"0":36}}`, as a Spark Kafka
    /// source logs them (for monitoring tools and people).
    pub fn until_json(&self) -> String {
        partition_offsets_to_json(&self.until_offsets())
    }
}

impl FromIterator<OffsetRange> for OffsetRanges {
    fn from_iter<I: IntoIterator<Item = OffsetRange>>(iter: I) -> Self {
        OffsetRanges::new(iter.into_iter().collect())
    }
}

/// Offsets per partition as Spark's JSON: `{"topic":{"0":36,"1":-2}}`.
pub fn partition_offsets_to_json(offsets: &PartitionOffsets) -> String {
    let mut topics: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for (tp, offset) in offsets {
        topics.entry(&tp.topic).or_default().insert(tp.partition.to_string(), Value::from(*offset));
    }
    let object: Map<String, Value> = topics.into_iter().map(|(t, p)| (t.to_string(), Value::Object(p))).collect();
    Value::Object(object).to_string()
}

/// Reads Spark's per-partition offsets JSON, `{"topic":{"0":36,"1":-2}}`
/// (-2 = [`EARLIEST`], -1 = [`LATEST`]).
pub fn partition_offsets_from_json(json: &str) -> Result<PartitionOffsets> {
    let bad = |reason: String| KafkaError::BadOffsets { reason, json: clip(json) };
    let mut offsets = PartitionOffsets::new();
    for (topic, partition, value) in nested_entries(json)? {
        let offset = value.as_i64().ok_or_else(|| bad(format!("{topic}/{partition}: offset is not an integer")))?;
        if offset < EARLIEST {
            return Err(bad(format!("{topic}/{partition}: offset {offset} (use -2 for earliest, -1 for latest)")));
        }
        offsets.insert(TopicPartition { topic, partition }, offset);
    }
    Ok(offsets)
}

/// The `(topic, partition, value)` entries of `{"topic":{"<partition>": value}}`.
fn nested_entries(json: &str) -> Result<Vec<(String, i32, Value)>> {
    let bad = |reason: String| KafkaError::BadOffsets { reason, json: clip(json) };
    let value: Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let Value::Object(topics) = value else { return Err(bad("expected an object of topics".into())) };
    let mut entries = Vec::new();
    for (topic, partitions) in topics {
        let Value::Object(partitions) = partitions else {
            return Err(bad(format!("topic {topic}: expected an object of partitions")));
        };
        for (partition, value) in partitions {
            let number = partition
                .parse::<i32>()
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| bad(format!("topic {topic}: partition {partition:?} is not a number")))?;
            entries.push((topic.clone(), number, value));
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_through_json() {
        let ranges = OffsetRanges::new(vec![
            OffsetRange::new("b", 1, 5, 9),
            OffsetRange::new("a", 0, 0, 36),
            OffsetRange::new("b", 0, 7, 7),
        ]);
        let json = ranges.to_json();
        assert_eq!(
            json,
            r#"{"a":{"0":{"from":0,"until":36}},"b":{"0":{"from":7,"until":7},"1":{"from":5,"until":9}}}"#
        );
        assert_eq!(OffsetRanges::from_json(&json).unwrap(), ranges);
        assert_eq!(ranges.count(), 40);
        assert_eq!(ranges.until_json(), r#"{"a":{"0":36},"b":{"0":7,"1":9}}"#);
    }

    #[test]
    fn spark_spec_is_read_with_markers() {
        let offsets = partition_offsets_from_json(r#"{"topic":{"0":36,"1":-2},"other":{"3":-1}}"#).unwrap();
        assert_eq!(offsets[&TopicPartition::new("topic", 0)], 36);
        assert_eq!(offsets[&TopicPartition::new("topic", 1)], EARLIEST);
        assert_eq!(offsets[&TopicPartition::new("other", 3)], LATEST);
        assert_eq!(partition_offsets_from_json(&partition_offsets_to_json(&offsets)).unwrap(), offsets);
    }

    #[test]
    fn malformed_offsets_are_refused_with_reason() {
        for json in [
            "",
            "[1]",
            r#"{"t":3}"#,
            r#"{"t":{"x":3}}"#,
            r#"{"t":{"-1":3}}"#,
            r#"{"t":{"0":"3"}}"#,
            r#"{"t":{"0":-3}}"#,
        ] {
            let err = partition_offsets_from_json(json).unwrap_err();
            assert!(matches!(err, KafkaError::BadOffsets { .. }), "{json}: {err}");
        }
        for json in
            [r#"{"t":{"0":{"from":5}}}"#, r#"{"t":{"0":{"from":5,"until":4}}}"#, r#"{"t":{"0":{"from":-1,"until":4}}}"#]
        {
            assert!(OffsetRanges::from_json(json).is_err(), "{json}");
        }
    }
}
