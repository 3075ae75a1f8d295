//! What travels on an application's internal topics: the records a stage
//! sends on by key, and the progress marks that let a reading task's
//! watermark follow every writer.
//!
//! A partition of an internal topic interleaves what every task of the
//! writing stage sent, each task running whole batches of its own input,
//! so the largest event time in the partition says nothing about the
//! writers that are behind. Every task that writes an internal topic
//! therefore ends each batch with a [`ProgressMark`] to every partition of
//! it, in the batch's transaction (an aborted batch publishes none): the
//! largest event time it sent in the batch, or that it sent nothing (idle).
//! A reading task keeps one clock per writer and takes the smallest (see
//! [`spate_dstream::event_time`]); [`crate::TaskBuilder::repartitioned`]
//! wires that up.
//!
//! A mark is a record of its own, told apart by its Kafka key: records sent
//! by key carry none.

use spate_core::{FrameCodec, Time};
use spate_dstream::{Data, Key, ProgressMark};
use spate_kafka::KafkaRecord;

use crate::error::AppError;
use crate::topology::{Emit, InternalTopic};

/// The frame version of records on internal topics.
const INTERNAL_FORMAT_VERSION: u16 = 1;

/// Records of internal topics are at most this large.
const MAX_INTERNAL_RECORD: u32 = 64 << 20;

/// The Kafka key of a progress mark.
const PROGRESS_KEY: &[u8] = b"spate.progress";

/// The counter of internal records that do not decode.
pub(crate) const BAD_INTERNAL_RECORDS: &str = "spate_bad_internal_records_total";

fn internal_codec() -> FrameCodec {
    FrameCodec::new(INTERNAL_FORMAT_VERSION)
        .with_max_payload(MAX_INTERNAL_RECORD)
        .with_max_decoded(MAX_INTERNAL_RECORD as usize)
}

/// A `(key, value)` as it goes on an internal topic.
pub(crate) fn encode_record<K: Key, V: Data>(key: &K, value: &V) -> Result<Vec<u8>, spate_core::CoreError> {
    internal_codec().encode(&(key, value))
}

/// What one record of an internal topic holds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Internal<K, V> {
    /// A record sent by key.
    Record(K, V),
    /// A writer's progress.
    Progress(ProgressMark),
}

fn bad(record: &KafkaRecord, reason: String) -> AppError {
    AppError::BadInternalRecord {
        topic: record.topic.to_string(),
        partition: record.partition,
        offset: record.offset,
        reason,
    }
}

/// Reads one record of an internal topic.
pub(crate) fn decode_internal<K: Key, V: Data>(record: &KafkaRecord) -> Result<Internal<K, V>, AppError> {
    let bytes = record.value.as_deref().ok_or_else(|| bad(record, "no value".to_string()))?;
    let codec = internal_codec();
    if record.key.as_deref() == Some(PROGRESS_KEY) {
        let mark = codec.decode(bytes).map_err(|e| bad(record, format!("a progress mark that does not read: {e}")))?;
        return Ok(Internal::Progress(mark.value));
    }
    let (key, value) = codec.decode(bytes).map_err(|e| bad(record, e.to_string()))?.value;
    Ok(Internal::Record(key, value))
}

/// Reads one record of an internal topic; one that does not decode is
/// counted (`spate_bad_internal_records_total`) and logged, then skipped.
pub(crate) fn decode_or_report<K: Key, V: Data>(record: &KafkaRecord) -> Option<Internal<K, V>> {
    match decode_internal(record) {
        Ok(internal) => Some(internal),
        Err(error) => {
            metrics::counter!(BAD_INTERNAL_RECORDS, "topic" => record.topic.to_string()).increment(1);
            tracing::error!(%error, "a record of an internal topic does not decode; it is skipped");
            None
        }
    }
}

/// The `(key, value)` a [`crate::TaskBuilder::repartition_by_key`] sent in
/// `record`. A progress mark is not a record: it is an error here, and
/// [`crate::TaskBuilder::repartitioned`] reads both.
pub fn decode_repartitioned<K: Key, V: Data>(record: &KafkaRecord) -> Result<(K, V), AppError> {
    match decode_internal(record)? {
        Internal::Record(key, value) => Ok((key, value)),
        Internal::Progress(_) => Err(bad(record, "a progress mark, not a record".to_string())),
    }
}

/// What a writer task tells the readers of one internal topic after a
/// batch at `batch_time` in which it sent `sent`: the marks to each of
/// the topic's partitions. Event times more than `max_future` ahead of the
/// batch time are not believed and move nothing.
pub(crate) fn progress_marks<'a>(
    topic: &InternalTopic,
    writer: (&str, u32, u32),
    sent: impl Iterator<Item = &'a Emit>,
    batch_time: Time,
    max_future: spate_core::Duration,
) -> Result<Vec<Emit>, AppError> {
    let (group, index, writers) = writer;
    let horizon = batch_time + max_future;
    let mut idle = true;
    let mut max_event_time = None;
    for emit in sent.filter(|e| e.topic() == topic.name) {
        idle = false;
        let time = emit.timestamp().map(Time::from_millis).filter(|t| *t <= horizon);
        max_event_time = max_event_time.max(time);
    }
    let mark = ProgressMark { group: group.to_string(), writer: index, writers, max_event_time, idle };
    let bytes = internal_codec().encode(&mark).map_err(|e| AppError::Invalid {
        app: String::new(),
        reason: format!("a progress mark for {} does not encode: {e}", topic.name),
    })?;
    Ok((0..topic.partitions)
        .map(|partition| Emit::progress(&topic.name, partition, PROGRESS_KEY, bytes.clone()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&[u8]>, value: Vec<u8>) -> KafkaRecord {
        KafkaRecord {
            topic: "app-words".into(),
            partition: 0,
            offset: 7,
            key: key.map(<[u8]>::to_vec),
            value: Some(value),
            timestamp: None,
        }
    }

    #[test]
    fn marks_go_to_every_partition_and_skip_what_is_too_far_ahead() {
        let topic = InternalTopic { name: "app-words".into(), partitions: 3 };
        let sent = [
            Emit::to_topic("app-words", None, vec![]).at(Time::from_millis(5_000)),
            Emit::to_topic("app-words", None, vec![]).at(Time::from_millis(4_102_444_800_000)),
            Emit::to_topic("out", None, vec![]).at(Time::from_millis(9_000)),
        ];
        let at = Time::from_millis(10_000);
        let marks =
            progress_marks(&topic, ("split", 1, 6), sent.iter(), at, spate_core::Duration::from_secs(3600)).unwrap();
        assert_eq!(marks.len(), 3);
        let (_, first) = marks[0].clone().into_output();
        let Internal::<String, u64>::Progress(mark) =
            decode_internal(&record(first.key.as_deref(), first.value)).unwrap()
        else {
            panic!("not a mark")
        };
        assert_eq!(mark.max_event_time, Some(Time::from_millis(5_000)));
        assert!(!mark.idle);
        assert_eq!((mark.writer, mark.writers), (1, 6));
        let idle = progress_marks(&topic, ("split", 1, 6), [].iter(), at, spate_core::Duration::from_secs(1)).unwrap();
        let (_, first) = idle[0].clone().into_output();
        let Internal::<String, u64>::Progress(mark) =
            decode_internal(&record(first.key.as_deref(), first.value)).unwrap()
        else {
            panic!("not a mark")
        };
        assert!(mark.idle && mark.max_event_time.is_none());
    }

    #[test]
    fn a_record_that_does_not_decode_is_an_error_naming_where_it_is() {
        let error = decode_internal::<String, u64>(&record(None, b"garbage".to_vec())).unwrap_err().to_string();
        assert!(error.contains("record 7 of internal topic app-words/0"), "{error}");
        let mark = decode_repartitioned::<String, u64>(&record(
            Some(PROGRESS_KEY),
            internal_codec()
                .encode(&ProgressMark { group: "g".into(), writer: 0, writers: 1, max_event_time: None, idle: true })
                .unwrap(),
        ));
        assert!(mark.unwrap_err().to_string().contains("a progress mark"));
    }
}
