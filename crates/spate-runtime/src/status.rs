//! What the web page shows, as `/api/status` serves it: the last batches
//! (the committed ones from their progress records, and the one in flight),
//! the inputs with their rates (receivers by stream, replayable sources by
//! partition, with the Kafka consumer lag when spate-kafka recorded it), the
//! checkpoint's location, lock holder and epoch, and this start's recovery
//! report.
//!
//! The driver feeds a [`StatusBoard`]; it is a [`ProgressListener`] for the
//! committed batches and has hooks for what progress records do not carry
//! (a batch starting, each input's records).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use serde::Serialize;
use serde_json::Value;
use spate_core::sync::lock;
use spate_core::{BatchId, Time};
use spate_logstore::LockHolder;

use crate::progress::{BatchProgress, ProgressListener, ReceiverStatus};
use crate::recovery::RecoveryReport;

/// Batches `/api/status` lists at most.
pub(crate) const MAX_BATCHES: usize = 100;

/// One row of the batch table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct BatchRow {
    pub(crate) batch_id: u64,
    /// The batch time, ms since the epoch.
    pub(crate) batch_time_ms: i64,
    /// Records read (0 while in flight: counted when it commits).
    pub(crate) records: u64,
    /// Records per second of batch interval.
    pub(crate) input_rate: f64,
    pub(crate) scheduling_delay_ms: u64,
    /// `None` while in flight.
    pub(crate) processing_time_ms: Option<u64>,
    /// Scheduling delay plus processing time; `None` while in flight.
    pub(crate) total_delay_ms: Option<u64>,
    pub(crate) committed: bool,
    /// Re-run from the checkpoint after a restart.
    pub(crate) recovered: bool,
}

/// A receiver input and its last batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ReceiverRow {
    pub(crate) stream_id: u32,
    /// The input's name in the pipeline.
    pub(crate) input: String,
    /// The receiver's own name.
    pub(crate) receiver: String,
    pub(crate) active: bool,
    /// Records per second of batch interval, in the last batch.
    pub(crate) rate: f64,
    /// The records of the last batch.
    pub(crate) records: u64,
    /// The backpressure limit it runs under (`None`: unlimited).
    pub(crate) rate_limit: Option<f64>,
    pub(crate) last_error: Option<String>,
}

/// One partition of a replayable input (a Kafka topic partition) and its last batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct PartitionRow {
    /// The input's name in the pipeline.
    pub(crate) input: String,
    /// The topic (for offsets that are not Kafka's shape: the input's name).
    pub(crate) topic: String,
    pub(crate) partition: String,
    /// Records of the last batch.
    pub(crate) records: u64,
    /// Records per second of batch interval, in the last batch.
    pub(crate) rate: f64,
    /// Records not read yet, when the source records it (spate-kafka does).
    pub(crate) lag: Option<f64>,
}

/// The checkpoint this context writes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct CheckpointRow {
    pub(crate) location: String,
    pub(crate) lock_holder: Option<LockHolder>,
    pub(crate) epoch: Option<u64>,
}

/// The whole of `/api/status`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Status {
    pub(crate) batch_interval_ms: u64,
    /// Oldest first, at most [`MAX_BATCHES`].
    pub(crate) batches: Vec<BatchRow>,
    pub(crate) receivers: Vec<ReceiverRow>,
    pub(crate) partitions: Vec<PartitionRow>,
    /// The backpressure rate limit of the whole query, records per second.
    pub(crate) rate_limit: Option<f64>,
    pub(crate) checkpoint: Option<CheckpointRow>,
    pub(crate) recovery: Option<RecoveryReport>,
}

#[derive(Debug)]
struct Board {
    batch_interval_ms: u64,
    batches: VecDeque<BatchRow>,
    /// Receiver inputs by stream id: their name and last batch's records.
    receiver_records: BTreeMap<u32, (String, u64)>,
    receivers: Vec<ReceiverStatus>,
    partitions: Vec<PartitionRow>,
    rate_limit: Option<f64>,
    checkpoint: Option<CheckpointRow>,
    recovery: Option<RecoveryReport>,
}

/// The live status of one context, fed by its driver and read by `/api/status`.
#[derive(Debug)]
pub(crate) struct StatusBoard {
    board: Mutex<Board>,
}

impl StatusBoard {
    /// An empty board for batches of `batch_interval_ms`.
    pub(crate) fn new(batch_interval_ms: u64) -> Self {
        StatusBoard {
            board: Mutex::new(Board {
                batch_interval_ms,
                batches: VecDeque::new(),
                receiver_records: BTreeMap::new(),
                receivers: Vec::new(),
                partitions: Vec::new(),
                rate_limit: None,
                checkpoint: None,
                recovery: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        lock(&self.board)
    }

    /// The checkpoint the context holds.
    pub(crate) fn set_checkpoint(&self, checkpoint: CheckpointRow) {
        self.lock().checkpoint = Some(checkpoint);
    }

    /// Batch `batch` at `time` started, `scheduling_delay_ms` after its time.
    pub(crate) fn batch_started(&self, batch: BatchId, time: Time, scheduling_delay_ms: u64, recovered: bool) {
        let mut board = self.lock();
        board.batches.retain(|row| row.batch_id != batch.0);
        push_row(
            &mut board.batches,
            BatchRow {
                batch_id: batch.0,
                batch_time_ms: time.as_millis(),
                records: 0,
                input_rate: 0.0,
                scheduling_delay_ms,
                processing_time_ms: None,
                total_delay_ms: None,
                committed: false,
                recovered,
            },
        );
    }

    /// A batch fed `records` records of the receiver input `input` (stream `stream_id`).
    pub(crate) fn receiver_fed(&self, stream_id: u32, input: &str, records: u64) {
        self.lock().receiver_records.insert(stream_id, (input.to_string(), records));
    }

    /// A batch's replayable inputs and the offsets they read (the values of
    /// its `offsets/N` entry, by input name).
    pub(crate) fn replayable_read(&self, offsets: &[(String, &Value)]) {
        let mut board = self.lock();
        let seconds = board.batch_interval_ms as f64 / 1000.0;
        let mut rows = Vec::new();
        for (input, value) in offsets {
            let mut ranges = Vec::new();
            offset_ranges(value, &mut Vec::new(), &mut ranges);
            for (path, records) in ranges {
                let (topic, partition) = match path.as_slice() {
                    [topic, partition] => (topic.clone(), partition.clone()),
                    [] => (input.clone(), "-".to_string()),
                    _ => (input.clone(), path.join("/")),
                };
                let rate = if seconds > 0.0 { records as f64 / seconds } else { 0.0 };
                rows.push(PartitionRow { input: input.clone(), topic, partition, records, rate, lag: None });
            }
        }
        board.partitions = rows;
    }

    /// The status now; `lag` is the Kafka consumer lag by (topic, partition).
    pub(crate) fn snapshot(&self, lag: &BTreeMap<(String, String), f64>) -> Status {
        let board = self.lock();
        let seconds = board.batch_interval_ms as f64 / 1000.0;
        let receivers = board
            .receivers
            .iter()
            .map(|status| {
                let (input, records) = board.receiver_records.get(&status.stream_id).cloned().unwrap_or_default();
                ReceiverRow {
                    stream_id: status.stream_id,
                    input,
                    receiver: status.name.clone(),
                    active: status.active,
                    rate: if seconds > 0.0 { records as f64 / seconds } else { 0.0 },
                    records,
                    rate_limit: status.rate_limit,
                    last_error: status.last_error.clone(),
                }
            })
            .collect();
        let partitions = board
            .partitions
            .iter()
            .map(|row| PartitionRow {
                lag: lag.get(&(row.topic.clone(), row.partition.clone())).copied(),
                ..row.clone()
            })
            .collect();
        Status {
            batch_interval_ms: board.batch_interval_ms,
            batches: board.batches.iter().cloned().collect(),
            receivers,
            partitions,
            rate_limit: board.rate_limit,
            checkpoint: board.checkpoint.clone(),
            recovery: board.recovery.clone(),
        }
    }
}

impl ProgressListener for StatusBoard {
    fn on_batch_completed(&self, progress: &BatchProgress) {
        let mut board = self.lock();
        board.batches.retain(|row| row.batch_id != progress.batch_id.0);
        push_row(
            &mut board.batches,
            BatchRow {
                batch_id: progress.batch_id.0,
                batch_time_ms: progress.batch_time.as_millis(),
                records: progress.input_records,
                input_rate: progress.input_rate,
                scheduling_delay_ms: progress.scheduling_delay_ms,
                processing_time_ms: Some(progress.processing_time_ms),
                total_delay_ms: Some(progress.scheduling_delay_ms.saturating_add(progress.processing_time_ms)),
                committed: true,
                recovered: progress.recovered,
            },
        );
        board.receivers = progress.receivers.clone();
        board.rate_limit = progress.rate_limit;
    }

    fn on_recovery(&self, report: &RecoveryReport) {
        self.lock().recovery = Some(report.clone());
    }
}

/// Adds `row` in batch order, keeping the newest [`MAX_BATCHES`].
fn push_row(rows: &mut VecDeque<BatchRow>, row: BatchRow) {
    let at = rows.iter().position(|r| r.batch_id > row.batch_id).unwrap_or(rows.len());
    rows.insert(at, row);
    while rows.len() > MAX_BATCHES {
        rows.pop_front();
    }
}

/// The offset ranges (`{"from":…,"until":…}` objects) anywhere in `value`,
/// with the keys that lead to each and the records each covers.
fn offset_ranges(value: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, u64)>) {
    match value {
        Value::Object(map) => {
            if let (Some(from), Some(until)) =
                (map.get("from").and_then(Value::as_u64), map.get("until").and_then(Value::as_u64))
            {
                out.push((path.clone(), until.saturating_sub(from)));
                return;
            }
            for (key, inner) in map {
                path.push(key.clone());
                offset_ranges(inner, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (index, inner) in items.iter().enumerate() {
                path.push(index.to_string());
                offset_ranges(inner, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The Kafka consumer lag by (topic, partition), read from the text of
/// `/metrics` (its `spate_kafka_consumer_lag{…}` lines).
pub(crate) fn lag_from_metrics(text: &str) -> BTreeMap<(String, String), f64> {
    let prefix = format!("{}{{", crate::telemetry::KAFKA_CONSUMER_LAG);
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let labels = parse_labels(labels)?;
            let value = value.trim().parse().ok()?;
            Some(((labels.get("topic")?.clone(), labels.get("partition")?.clone()), value))
        })
        .collect()
}

/// `name="value",…` of the exposition format (values escape `\`, `"` and newlines).
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(name.trim_start_matches(',').to_string(), value);
        rest = &after[end + 1..];
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn progress(batch: u64, records: u64) -> BatchProgress {
        BatchProgress {
            late_records: 0,
            batch_id: BatchId(batch),
            batch_time: Time::from_millis(1000 * batch as i64),
            recovered: false,
            input_records: records,
            input_rate: records as f64,
            processing_rate: 0.0,
            scheduling_delay_ms: 3,
            processing_time_ms: 40,
            phases: Default::default(),
            state_bytes: 0,
            state_checkpointed: false,
            state_incremental: false,
            rate_limit: Some(500.0),
            receivers: vec![ReceiverStatus {
                stream_id: 0,
                name: "generator".into(),
                active: true,
                rate_limit: Some(500.0),
                last_error: None,
            }],
        }
    }

    #[test]
    fn a_batch_in_flight_is_replaced_by_its_committed_row_and_the_table_keeps_the_last_hundred() {
        let board = StatusBoard::new(1000);
        board.batch_started(BatchId(0), Time::from_millis(0), 7, false);
        let status = board.snapshot(&BTreeMap::new());
        assert_eq!(status.batches.len(), 1);
        assert!(!status.batches[0].committed && status.batches[0].processing_time_ms.is_none());
        board.on_batch_completed(&progress(0, 12));
        let row = &board.snapshot(&BTreeMap::new()).batches[0];
        assert_eq!((row.batch_id, row.records, row.committed), (0, 12, true));
        assert_eq!((row.processing_time_ms, row.total_delay_ms), (Some(40), Some(43)));
        for batch in 1..150 {
            board.batch_started(BatchId(batch), Time::from_millis(1000 * batch as i64), 0, false);
            board.on_batch_completed(&progress(batch, batch));
        }
        let ids: Vec<u64> = board.snapshot(&BTreeMap::new()).batches.iter().map(|r| r.batch_id).collect();
        assert_eq!(ids, (50..150).collect::<Vec<_>>());
    }

    #[test]
    fn the_status_json_has_receivers_partitions_with_lag_checkpoint_and_recovery() {
        let board = StatusBoard::new(2000);
        board.set_checkpoint(CheckpointRow { location: "/ck".into(), lock_holder: None, epoch: Some(3) });
        board.receiver_fed(0, "words", 1000);
        let kafka = json!({"events": {"0": {"from": 10, "until": 30}, "1": {"from": 5, "until": 5}}});
        board.replayable_read(&[("kafka".to_string(), &kafka)]);
        board.on_batch_completed(&progress(4, 1020));
        let report = RecoveryReport {
            checkpoint_dir: "/ck".into(),
            writer_epoch: 3,
            took_over_from: None,
            last_committed: Some(BatchId(2)),
            rerun_batch: Some(BatchId(3)),
            pending_batch_times: Vec::new(),
            resumed_at: BatchId(4),
            restored_operators: Vec::new(),
            new_operators: Vec::new(),
            dropped_operators: Vec::new(),
            replayed_for_state: Vec::new(),
            unrecoverable_blocks: vec!["input-0-17".into()],
            restore_ms: 0,
            replay_ms: 0,
        };
        board.on_recovery(&report);
        let lag = BTreeMap::from([(("events".to_string(), "0".to_string()), 42.0)]);
        let json = serde_json::to_value(board.snapshot(&lag)).unwrap();
        assert_eq!(json["batch_interval_ms"], 2000);
        assert_eq!(json["receivers"][0]["input"], "words");
        assert_eq!(json["receivers"][0]["receiver"], "generator");
        assert_eq!(json["receivers"][0]["rate"], 500.0);
        assert_eq!(json["partitions"][0]["topic"], "events");
        assert_eq!(json["partitions"][0]["partition"], "0");
        assert_eq!(json["partitions"][0]["rate"], 10.0);
        assert_eq!(json["partitions"][0]["lag"], 42.0);
        assert_eq!(json["partitions"][1]["lag"], Value::Null);
        assert_eq!(json["checkpoint"]["location"], "/ck");
        assert_eq!(json["checkpoint"]["epoch"], 3);
        assert_eq!(json["recovery"]["rerun_batch"], 3);
        assert_eq!(json["recovery"]["unrecoverable_blocks"][0], "input-0-17");
        assert_eq!(json["batches"][0]["batch_id"], 4);
        assert_eq!(json["rate_limit"], 500.0);
    }

    #[test]
    fn lag_is_read_from_the_metrics_text() {
        let text = "# TYPE spate_kafka_consumer_lag gauge\n\
                    spate_kafka_consumer_lag{topic=\"a\\\"b\",partition=\"3\"} 17\n\
                    spate_kafka_consumer_lag_other{topic=\"x\",partition=\"1\"} 5\n\
                    spate_input_records_total{source=\"a\",partition=\"3\"} 9\n";
        let lag = lag_from_metrics(text);
        assert_eq!(lag, BTreeMap::from([(("a\"b".to_string(), "3".to_string()), 17.0)]));
    }
}
