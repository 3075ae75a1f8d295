//! Reading planned offset ranges through the [`ConsumerPool`]: one task per
//! partition, each stopping before the record that would take it past its
//! share of the batch's byte cap, and the input counters of `/metrics`.

use crate::consumer::{ConsumerPool, KafkaRecord};
use crate::error::{KafkaError, Result};
use crate::offsets::{OffsetRange, OffsetRanges};
use crate::plan::byte_shares;
use crate::retry::retry_unavailable;

/// Reads `wanted`, each non-empty range in its own task, stopping each
/// before the record that would take it past its share of `max_bytes`.
/// Returns the ranges actually read (empty ones unchanged) and their
/// records, in the shape [`crate::DirectKafkaStream::read`] gives.
pub(crate) fn read_within(
    pool: &ConsumerPool,
    wanted: &OffsetRanges,
    max_bytes: u64,
) -> Result<(OffsetRanges, Vec<Vec<KafkaRecord>>)> {
    let work: Vec<&OffsetRange> = wanted.ranges().iter().filter(|r| r.count() > 0).collect();
    let shares = byte_shares(&work.iter().map(|r| r.count()).collect::<Vec<_>>(), max_bytes);
    let read: Vec<(OffsetRange, Vec<KafkaRecord>)> = std::thread::scope(|scope| {
        let tasks: Vec<_> = work
            .iter()
            .zip(&shares)
            .map(|(range, share)| (range, scope.spawn(|| read_range_within(pool, range, *share))))
            .collect();
        tasks.into_iter().map(|(range, task)| join(range, task)).collect::<Result<_>>()
    })?;
    // Counted here, on the planning thread, as a batch's input.
    for (range, records) in &read {
        record_input(range, records);
    }
    // One partition of the batch per planned range, in the plan's order,
    // empty ones included: event-time watermarks are kept per partition.
    let mut read = read.into_iter();
    let mut read_ranges = Vec::with_capacity(wanted.ranges().len());
    let mut records = Vec::with_capacity(wanted.ranges().len());
    for range in wanted.ranges() {
        let done = if range.count() > 0 { read.next() } else { None };
        match done {
            Some((done, partition)) => {
                read_ranges.push(done);
                records.push(partition);
            }
            None => {
                read_ranges.push(range.clone());
                records.push(Vec::new());
            }
        }
    }
    Ok((OffsetRanges::new(read_ranges), records))
}

/// Reads `range` from its start within `max_bytes`; returns the part read.
fn read_range_within(
    pool: &ConsumerPool,
    range: &OffsetRange,
    max_bytes: u64,
) -> Result<(OffsetRange, Vec<KafkaRecord>)> {
    let (records, stop) =
        retry_unavailable(|| pool.checkout(&range.topic_partition())?.read_range_within(range, max_bytes))?;
    Ok((OffsetRange::new(range.topic.clone(), range.partition, range.from, stop), records))
}

/// Counter of `/metrics`: records read from a partition.
const INPUT_RECORDS: &str = "spate_input_records_total";

/// Counter of `/metrics`: bytes (keys and values) read from a partition.
const INPUT_BYTES: &str = "spate_input_bytes_total";

/// Counts the records read for `range` and their keys' and values' bytes.
pub(crate) fn record_input(range: &OffsetRange, records: &[KafkaRecord]) {
    let bytes: usize =
        records.iter().map(|r| r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)).sum();
    let labels = [("source", range.topic.clone()), ("partition", range.partition.to_string())];
    metrics::counter!(INPUT_RECORDS, &labels).increment(records.len() as u64);
    metrics::counter!(INPUT_BYTES, &labels).increment(bytes as u64);
}

/// The result of a task reading `range`; a panic becomes an error naming it.
pub(crate) fn join<T>(range: &OffsetRange, task: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    task.join().map_err(|_| KafkaError::TaskPanicked { topic: range.topic.clone(), partition: range.partition })?
}
