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
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
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

    /// How many offsets the range covers (0 for a reversed range; the
    /// fields are public, so any pair may be here, and none may panic).
    pub fn count(&self) -> u64 {
        u64::try_from(i128::from(self.until) - i128::from(self.from)).unwrap_or(0)
    }

    /// How many offsets the range covers, or why it is not a range a
    /// partition can have: `from` negative, or `until` before `from`.
    pub fn checked_count(&self) -> std::result::Result<u64, String> {
        if self.from < 0 {
            return Err(format!("{self}: `from` {} is negative", self.from));
        }
        if self.until < self.from {
            return Err(format!("{self}: `until` {} is before `from` {}", self.until, self.from));
        }
        Ok(self.count())
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

    /// How many records the batch covers (saturating: ranges read from JSON
    /// sum to at most `i64::MAX`, see [`OffsetRanges::from_json`]).
    pub fn count(&self) -> u64 {
        self.ranges.iter().fold(0u64, |total, r| total.saturating_add(r.count()))
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
        OffsetRanges::from_json_bytes(json.as_bytes())
    }

    /// [`OffsetRanges::from_json`] on raw bytes (a file, a fuzzer): at most
    /// [`MAX_OFFSETS_JSON_BYTES`], each partition once, each range
    /// `0 <= from <= until`, and all of them together at most `i64::MAX`
    /// records, so no sum over them can overflow.
    pub fn from_json_bytes(json: &[u8]) -> Result<OffsetRanges> {
        let bad = |reason: String| bad_offsets(json, reason);
        let mut ranges = Vec::new();
        let mut total: u64 = 0;
        for (tp, value) in nested_entries(json)? {
            let range = range_of(tp, &value).map_err(bad)?;
            total = total
                .checked_add(range.count())
                .filter(|t| i64::try_from(*t).is_ok())
                .ok_or_else(|| bad(format!("{range}: the ranges together cover more than i64::MAX records")))?;
            ranges.push(range);
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
            Some(Some(value)) => OffsetRanges::from_json(&value.to_string()).map(Some).map_err(|e| match e {
                KafkaError::BadOffsets { reason, json } => {
                    KafkaError::BadOffsets { reason: format!("source {name}: {reason}"), json }
                }
                other => other,
            }),
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
    partition_offsets_from_json_bytes(json.as_bytes())
}

/// [`partition_offsets_from_json`] on raw bytes (a file, the network, a fuzzer):
/// at most [`MAX_OFFSETS_JSON_BYTES`], UTF-8, every topic name legal, every
/// partition written once as a plain non-negative number, every offset an
/// integer of at least [`EARLIEST`].
pub fn partition_offsets_from_json_bytes(json: &[u8]) -> Result<PartitionOffsets> {
    let bad = |reason: String| bad_offsets(json, reason);
    let mut offsets = PartitionOffsets::new();
    for (tp, raw) in nested_entries(json)? {
        let offset = serde_json::from_str::<i64>(raw.get())
            .map_err(|_| bad(format!("{tp}: offset {} is not a 64-bit integer", raw.get())))?;
        if offset < EARLIEST {
            return Err(bad(format!("{tp}: offset {offset} (use -2 for earliest, -1 for latest)")));
        }
        offsets.insert(tp, offset);
    }
    Ok(offsets)
}

/// The most bytes an offsets JSON may have: about 90,000 partitions'
/// ranges, far more than a job reads, and little enough that a corrupt or
/// hostile file cannot make the decoder allocate much.
pub const MAX_OFFSETS_JSON_BYTES: usize = 4 << 20;

/// Kafka's limit on a topic name's length.
const MAX_TOPIC_NAME_LEN: usize = 249;

fn bad_offsets(json: &[u8], reason: String) -> KafkaError {
    let shown = &json[..json.len().min(1024)];
    KafkaError::BadOffsets { reason, json: clip(&String::from_utf8_lossy(shown)) }
}

/// The `(partition, value)` entries of `{"topic":{"<partition>": value}}`,
/// each partition once. Each level is parsed from its own text (a
/// [`RawValue`]), never through a `serde_json::Value` whose map would
/// already have dropped a duplicate key.
fn nested_entries(json: &[u8]) -> Result<Vec<(TopicPartition, Box<RawValue>)>> {
    let bad = |reason: String| bad_offsets(json, reason);
    if json.len() > MAX_OFFSETS_JSON_BYTES {
        return Err(bad(format!("{} bytes, more than the {MAX_OFFSETS_JSON_BYTES} allowed", json.len())));
    }
    let topics: Entries<Box<RawValue>> = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
    let mut seen = std::collections::BTreeSet::new();
    let mut topics_seen = std::collections::BTreeSet::new();
    let mut entries = Vec::new();
    for (topic, partitions) in topics.0 {
        check_topic_name(&topic).map_err(|reason| bad(format!("topic {topic:?}: {reason}")))?;
        if !topics_seen.insert(topic.clone()) {
            // Other readers keep one of the two objects; which one is not for us to guess.
            return Err(bad(format!("topic {topic} appears more than once")));
        }
        let partitions = serde_json::from_str::<Entries<Box<RawValue>>>(partitions.get())
            .map_err(|e| bad(format!("topic {topic}: expected an object of partitions ({e})")))?;
        for (partition, value) in partitions.0 {
            let number = parse_partition(&partition).ok_or_else(|| {
                bad(format!(
                    "topic {topic}: partition {partition:?} is not a partition number (0 to {}, plain decimal)",
                    i32::MAX
                ))
            })?;
            let tp = TopicPartition::new(topic.clone(), number);
            if !seen.insert(tp.clone()) {
                return Err(bad(format!("{tp} appears more than once")));
            }
            entries.push((tp, value));
        }
    }
    Ok(entries)
}

/// A partition key as Kafka tools write it: a non-negative `i32` in plain
/// decimal. `"00"` or `"+0"` would name partition 0 a second time.
fn parse_partition(key: &str) -> Option<i32> {
    let number = key.parse::<i32>().ok().filter(|p| *p >= 0)?;
    (number.to_string() == key).then_some(number)
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`.
fn check_topic_name(topic: &str) -> std::result::Result<(), String> {
    if topic.is_empty() || topic.len() > MAX_TOPIC_NAME_LEN {
        return Err(format!("a topic name has 1 to {MAX_TOPIC_NAME_LEN} characters"));
    }
    match topic.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        Some(c) => Err(format!("{c:?} is not allowed in a topic name")),
        None => Ok(()),
    }
}

/// A JSON object read as its entries in order. serde_json's own map keeps
/// only the last of duplicate keys, which would hide a partition written
/// twice; this keeps them all so the decoder can refuse them.
struct Entries<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct EntriesVisitor<V>(PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Entries<V>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, V>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }

        deserializer.deserialize_map(EntriesVisitor(PhantomData))
    }
}

/// Reads one logged range, `{"from":0,"until":36}`: exactly these two keys,
/// `0 <= from <= until`.
fn range_of(tp: TopicPartition, raw: &RawValue) -> std::result::Result<OffsetRange, String> {
    let fields = serde_json::from_str::<Entries<Box<RawValue>>>(raw.get())
        .map_err(|e| format!("{tp}: expected a range object ({e})"))?;
    let (mut from, mut until) = (None, None);
    for (key, value) in fields.0 {
        let slot = match key.as_str() {
            "from" => &mut from,
            "until" => &mut until,
            other => return Err(format!("{tp}: unexpected key {other:?} in a range")),
        };
        let number = serde_json::from_str::<i64>(value.get())
            .map_err(|_| format!("{tp}: `{key}` {} is not a 64-bit integer", value.get()))?;
        if slot.replace(number).is_some() {
            return Err(format!("{tp}: `{key}` appears more than once"));
        }
    }
    let (Some(from), Some(until)) = (from, until) else {
        return Err(format!("{tp}: a range needs both `from` and `until`"));
    };
    let range = OffsetRange::new(tp.topic, tp.partition, from, until);
    range.checked_count()?;
    Ok(range)
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

    fn refused(result: Result<impl fmt::Debug>, naming: &str) {
        match result {
            Err(KafkaError::BadOffsets { reason, .. }) => assert!(reason.contains(naming), "{reason} names {naming}"),
            other => panic!("expected BadOffsets naming {naming}, got {other:?}"),
        }
    }

    #[test]
    fn a_partition_written_twice_is_refused() {
        // serde_json keeps the last duplicate key; "00" and "+1" parse as numbers already given.
        refused(partition_offsets_from_json(r#"{"t":{"0":5,"0":7}}"#), "t/0 appears more than once");
        refused(partition_offsets_from_json(r#"{"t":{"0":5,"00":7}}"#), "\"00\"");
        refused(partition_offsets_from_json(r#"{"t":{"+1":5}}"#), "\"+1\"");
        refused(OffsetRanges::from_json(r#"{"t":{"3":{"from":0,"until":1},"3":{"from":0,"until":9}}}"#), "t/3");
        refused(OffsetRanges::from_json(r#"{"t":{"3":{"from":0,"from":2,"until":9}}}"#), "`from` appears more");
        refused(partition_offsets_from_json(r#"{"t":{"1":5},"t":{"2":7}}"#), "appears more than once");
    }

    #[test]
    fn ranges_whose_sum_overflows_are_refused_naming_the_partition() {
        let max = i64::MAX;
        let json = format!(
            r#"{{"t":{{"0":{{"from":0,"until":{max}}},"1":{{"from":0,"until":{max}}},"2":{{"from":0,"until":{max}}}}}}}"#
        );
        refused(OffsetRanges::from_json(&json), "t/1");
        // One range of i64::MAX records alone is representable.
        let one = OffsetRanges::from_json(&format!(r#"{{"t":{{"0":{{"from":0,"until":{max}}}}}}}"#)).unwrap();
        assert_eq!(one.count(), max as u64);
    }

    #[test]
    fn counting_ranges_never_overflows_whatever_their_fields() {
        assert_eq!(OffsetRange::new("t", 0, i64::MIN, i64::MAX).count(), u64::MAX);
        assert_eq!(OffsetRange::new("t", 0, i64::MAX, i64::MIN).count(), 0);
        assert!(OffsetRange::new("t", 0, i64::MIN, 4).checked_count().unwrap_err().contains("t/0"));
        assert!(OffsetRange::new("t", 2, 9, 4).checked_count().unwrap_err().contains("t/2"));
        let ranges = OffsetRanges::new(vec![
            OffsetRange::new("t", 0, i64::MIN, i64::MAX),
            OffsetRange::new("t", 1, i64::MIN, i64::MAX),
        ]);
        assert_eq!(ranges.count(), u64::MAX);
    }

    #[test]
    fn offsets_out_of_range_and_odd_values_are_refused() {
        refused(partition_offsets_from_json(r#"{"t":{"0":9223372036854775808}}"#), "t/0");
        refused(partition_offsets_from_json(r#"{"t":{"0":1.5}}"#), "t/0");
        refused(partition_offsets_from_json(r#"{"t":{"2147483648":1}}"#), "2147483648");
        refused(OffsetRanges::from_json(r#"{"t":{"0":{"from":0,"until":1,"to":2}}}"#), "\"to\"");
        refused(OffsetRanges::from_json(r#"{"t":{"0":[0,1]}}"#), "t/0");
        refused(OffsetRanges::from_json(r#"{"t":{"0":{"from":-9223372036854775808,"until":9}}}"#), "negative");
    }

    #[test]
    fn topic_names_follow_kafkas_rules() {
        refused(partition_offsets_from_json(r#"{"":{"0":1}}"#), "1 to 249");
        refused(partition_offsets_from_json(r#"{"a/b":{"0":1}}"#), "'/'");
        refused(partition_offsets_from_json(&format!(r#"{{"{}":{{"0":1}}}}"#, "x".repeat(250))), "1 to 249");
        let legal = partition_offsets_from_json(r#"{"Events_v2.a-b":{"0":1}}"#).unwrap();
        assert_eq!(legal.len(), 1);
    }

    #[test]
    fn the_decoder_is_bounded_and_takes_any_bytes() {
        let huge = format!(r#"{{"t":{{"0":{}}}}}"#, " ".repeat(MAX_OFFSETS_JSON_BYTES));
        refused(partition_offsets_from_json(&huge), "bytes, more than");
        let deep = format!(r#"{{"t":{{"0":{}1{}}}}}"#, "[".repeat(10_000), "]".repeat(10_000));
        assert!(OffsetRanges::from_json(&deep).is_err());
        for bytes in [&b"\xff\xfe"[..], b"{\"t\":{\"0\":\xff}}", b"{\"t\"", b"", b"null"] {
            assert!(partition_offsets_from_json_bytes(bytes).is_err());
            assert!(OffsetRanges::from_json_bytes(bytes).is_err());
        }
    }

    #[test]
    fn an_offset_log_entry_error_names_the_source() {
        let entry = spate_logstore::OffsetSeq {
            sources: vec![spate_logstore::SourceOffset::new(
                "kafka-in",
                Some(serde_json::json!({"t": {"0": {"from": 9, "until": 3}}})),
            )],
            ..spate_logstore::OffsetSeq::default()
        };
        refused(OffsetRanges::from_offset_seq(&entry, "kafka-in"), "source kafka-in: t/0");
    }
}
