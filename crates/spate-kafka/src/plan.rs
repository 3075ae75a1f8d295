//! The arithmetic of planning a batch of the direct Kafka stream: how the
//! batch's record limit is found (the configured cap, lowered by
//! backpressure and the runtime's limit), shared out among partitions by
//! lag within `max_rate_per_partition`, how the byte cap is shared out among
//! the ranges read, and how each partition's range is bounded. Pure
//! functions of offsets and caps: no broker, no clock.

use std::collections::BTreeMap;

use crate::error::{KafkaError, Result};
use crate::offsets::{OffsetRange, OffsetRanges, PartitionOffsets, TopicPartition};

/// The caps of a batch as they stood at the last plan.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Records of the whole batch.
    pub(crate) records: u64,
    /// Records of one partition (`max_rate_per_partition` × the interval).
    pub(crate) per_partition: Option<u64>,
    /// Bytes of the whole batch ([`crate::consumer::record_footprint`]).
    pub(crate) bytes: u64,
}

/// What was read ahead for a batch, as planning counts it: where each
/// partition stopped, the records each read and the bytes of all.
#[derive(Clone, Copy)]
pub(crate) struct AlreadyRead<'a> {
    pub(crate) next: &'a PartitionOffsets,
    pub(crate) records: &'a BTreeMap<TopicPartition, u64>,
    pub(crate) bytes: u64,
}

/// The rest of a batch to read after what was read ahead: each partition
/// from where the read-ahead stopped (`ahead_next`, or the batch's `start`)
/// to its latest offset, within what is left of the batch's caps after the
/// `ahead_records` and `ahead_bytes` read ahead.
pub(crate) fn plan_rest(
    partitions: &[TopicPartition],
    start: &PartitionOffsets,
    latest: &PartitionOffsets,
    limits: Limits,
    ahead: AlreadyRead<'_>,
) -> Result<OffsetRanges> {
    let rest_start: PartitionOffsets = partitions
        .iter()
        .map(|tp| (tp.clone(), ahead.next.get(tp).or_else(|| start.get(tp)).copied().unwrap_or(0)))
        .collect();
    let ahead_total: u64 = ahead.records.values().sum();
    // No bytes left: nothing more (a range always reads its first record).
    let records_left = if limits.bytes > ahead.bytes { limits.records.saturating_sub(ahead_total) } else { 0 };
    ranges_within(partitions, &rest_start, latest, records_left, limits.per_partition, ahead.records)
}

type Caps = BTreeMap<TopicPartition, i64>;

/// The range partition `tp` reads: from `from` to the `latest` offset, at
/// most `cap` records. Offsets come from the broker, the group or the
/// user's spec; one that no partition can have is an error naming it,
/// never an arithmetic overflow or a range the offset log could not hold.
fn plan_range(tp: &TopicPartition, from: i64, latest: i64, cap: Option<i64>) -> Result<OffsetRange> {
    let bad = |reason: String| KafkaError::BadRange { partition: tp.clone(), reason };
    if from < 0 {
        return Err(bad(format!("the batch would start at offset {from}")));
    }
    if latest < 0 {
        return Err(bad(format!("the broker reports latest offset {latest}")));
    }
    let latest = latest.max(from);
    let until = cap.map_or(latest, |cap| latest.min(from.saturating_add(cap.max(0))));
    Ok(OffsetRange::new(tp.topic.clone(), tp.partition, from, until))
}

/// The records the whole batch may read: the context's limit, lowered by
/// the stream's own backpressure when that is smaller; no limit without either.
pub(crate) fn batch_record_limit(backpressure: Option<u64>, context_limit: Option<u64>) -> u64 {
    min_of(backpressure, context_limit).unwrap_or(u64::MAX).max(1)
}

/// Shares `max_bytes` out among ranges in proportion to their record
/// counts; the shares sum to at most `max_bytes`.
pub(crate) fn byte_shares(counts: &[u64], max_bytes: u64) -> Vec<u64> {
    let total: u128 = counts.iter().map(|c| u128::from(*c)).sum();
    counts
        .iter()
        .map(|count| {
            let share = u128::from(max_bytes) * u128::from(*count) / total.max(1);
            u64::try_from(share).unwrap_or(max_bytes)
        })
        .collect()
}

fn min_of(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Spark's `maxMessagesPerPartition`: each partition gets at most
/// `per_partition` records, and the batch limit is shared out in proportion
/// to each partition's lag. Unlike Spark, which gives every lagging
/// partition at least one record, the shares never add up to more than the
/// limit: what proportion leaves over goes one record each to the
/// partitions with the largest remainders, so a limit smaller than the
/// number of lagging partitions moves those that lag most.
fn rate_caps(
    start: &PartitionOffsets,
    latest: &PartitionOffsets,
    per_partition: Option<u64>,
    batch_limit: Option<u64>,
) -> Caps {
    // Offsets from the broker and the position: differences and sums in
    // wider integers, so no lag overflows and shares stay exact.
    let lags: Vec<u64> = latest
        .iter()
        .map(|(tp, l)| {
            let from = start.get(tp).copied().unwrap_or(*l);
            u64::try_from(i128::from(*l) - i128::from(from)).unwrap_or(0)
        })
        .collect();
    let shares = batch_limit.map(|limit| lag_shares(limit, &lags));
    let mut caps = Caps::new();
    for (index, tp) in latest.keys().enumerate() {
        let share = shares.as_ref().and_then(|shares| shares.get(index).copied());
        if let Some(cap) = min_of(per_partition, share) {
            caps.insert(tp.clone(), i64::try_from(cap).unwrap_or(i64::MAX));
        }
    }
    caps
}

/// `limit` shared out in proportion to `lags` by largest remainder: the
/// shares add up to `limit` exactly when anything lags (ties go to the
/// earlier partition).
fn lag_shares(limit: u64, lags: &[u64]) -> Vec<u64> {
    let total: u128 = lags.iter().map(|&lag| u128::from(lag)).sum::<u128>().max(1);
    let exact = |lag: u64| u128::from(limit) * u128::from(lag);
    let mut shares: Vec<u64> = lags.iter().map(|&lag| u64::try_from(exact(lag) / total).unwrap_or(limit)).collect();
    let given: u128 = shares.iter().map(|&share| u128::from(share)).sum();
    let left = u128::from(limit).saturating_sub(given);
    let mut by_remainder: Vec<usize> = (0..lags.len()).filter(|&i| lags[i] > 0).collect();
    by_remainder.sort_by_key(|&i| std::cmp::Reverse(exact(lags[i]) % total));
    for &index in by_remainder.iter().take(usize::try_from(left).unwrap_or(usize::MAX)) {
        shares[index] += 1;
    }
    shares
}

/// One range for each of `partitions`, from its offset in `from` toward its
/// latest offset: within `records` for all of them, shared out by lag, and
/// within what `per_partition` leaves after the records each has `read`
/// already for the batch.
pub(crate) fn ranges_within(
    partitions: &[TopicPartition],
    from: &PartitionOffsets,
    latest: &PartitionOffsets,
    records: u64,
    per_partition: Option<u64>,
    read: &BTreeMap<TopicPartition, u64>,
) -> Result<OffsetRanges> {
    let shares = rate_caps(from, latest, None, Some(records));
    partitions
        .iter()
        .map(|tp| {
            let start = from.get(tp).copied().unwrap_or(0);
            let own_left = per_partition.map(|p| p.saturating_sub(read.get(tp).copied().unwrap_or(0)));
            let share = shares.get(tp).map(|c| u64::try_from(*c).unwrap_or(0));
            let cap = min_of(share, own_left).map(|c| i64::try_from(c).unwrap_or(i64::MAX));
            plan_range(tp, start, latest.get(tp).copied().unwrap_or(start), cap)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(values: &[(i32, i64)]) -> PartitionOffsets {
        values.iter().map(|(p, o)| (TopicPartition::new("t", *p), *o)).collect()
    }

    #[test]
    fn caps_share_the_batch_limit_by_lag_and_respect_the_partition_rate() {
        let start = offsets(&[(0, 0), (1, 100), (2, 50)]);
        let latest = offsets(&[(0, 300), (1, 200), (2, 50)]); // lags 300, 100, 0
        assert!(rate_caps(&start, &latest, None, None).is_empty());

        let caps = rate_caps(&start, &latest, None, Some(40));
        assert_eq!(caps, offsets(&[(0, 30), (1, 10), (2, 0)]));

        let caps = rate_caps(&start, &latest, Some(20), Some(40));
        assert_eq!(caps, offsets(&[(0, 20), (1, 10), (2, 0)]));

        let caps = rate_caps(&start, &latest, Some(500), None);
        assert_eq!(caps, offsets(&[(0, 500), (1, 500), (2, 500)]));

        // A tiny limit moves the partition that lags most, and no more
        // records than the limit.
        let caps = rate_caps(&start, &latest, None, Some(1));
        assert_eq!(caps, offsets(&[(0, 1), (1, 0), (2, 0)]));
        // Shares that do not divide evenly add up to the limit.
        let caps = rate_caps(&start, &latest, None, Some(7));
        assert_eq!(caps, offsets(&[(0, 5), (1, 2), (2, 0)]));
        let even = offsets(&[(0, 5), (1, 5)]);
        let caps = rate_caps(&offsets(&[(0, 0), (1, 0)]), &even, None, Some(1));
        assert_eq!(caps, offsets(&[(0, 1), (1, 0)]), "a tie goes to the earlier partition");
    }

    #[test]
    fn caps_do_not_overflow_on_offsets_near_the_limits() {
        // Lags near i64::MAX on three partitions sum past u64::MAX.
        let start = offsets(&[(0, 0), (1, 0), (2, 0), (3, i64::MAX)]);
        let latest = offsets(&[(0, i64::MAX), (1, i64::MAX), (2, i64::MAX), (3, 0)]);
        let caps = rate_caps(&start, &latest, None, Some(30));
        assert_eq!(caps.values().sum::<i64>(), 30, "{caps:?}");
        assert_eq!(caps[&TopicPartition::new("t", 3)], 0, "a partition ahead of the broker does not lag");
    }

    #[test]
    fn the_context_record_cap_applies_without_a_rate_and_yields_to_smaller_limits() {
        assert_eq!(batch_record_limit(None, Some(500_000)), 500_000);
        assert_eq!(batch_record_limit(Some(10), Some(500)), 10);
        assert_eq!(batch_record_limit(None, Some(20)), 20);
        assert_eq!(batch_record_limit(Some(900), None), 900);
        assert_eq!(batch_record_limit(None, None), u64::MAX);
        // The documents say a record counts about 100 bytes besides key and value.
        assert!((64..=128).contains(&crate::record_footprint(0, 0)), "{}", crate::record_footprint(0, 0));
        let start = offsets(&[(0, 0), (1, 0)]);
        let latest = offsets(&[(0, 10_000_000), (1, 30_000_000)]);
        let caps = rate_caps(&start, &latest, None, Some(batch_record_limit(None, Some(500_000))));
        assert_eq!(caps, offsets(&[(0, 125_000), (1, 375_000)]));
    }

    #[test]
    fn byte_shares_follow_the_planned_records_and_never_exceed_the_cap() {
        assert_eq!(byte_shares(&[], 100), Vec::<u64>::new());
        assert_eq!(byte_shares(&[1, 1], 100), [50, 50]);
        assert_eq!(byte_shares(&[300, 100], 1000), [750, 250]);
        assert_eq!(byte_shares(&[1, 1, 1], 100), [33, 33, 33]);
        let big = byte_shares(&[u64::MAX, u64::MAX, 1], u64::MAX);
        assert!(big.iter().fold(0u128, |t, s| t + u128::from(*s)) <= u128::from(u64::MAX), "{big:?}");
        assert_eq!(big[0], big[1]);
    }

    #[test]
    fn a_range_is_planned_within_its_cap_and_bad_offsets_are_errors_naming_the_partition() {
        let tp = TopicPartition::new("t", 4);
        assert_eq!(plan_range(&tp, 10, 100, None).unwrap(), OffsetRange::new("t", 4, 10, 100));
        assert_eq!(plan_range(&tp, 10, 100, Some(25)).unwrap(), OffsetRange::new("t", 4, 10, 35));
        assert_eq!(plan_range(&tp, 10, 5, Some(25)).unwrap(), OffsetRange::new("t", 4, 10, 10));
        // Near the top of the offsets, the cap does not wrap around.
        let top = plan_range(&tp, i64::MAX - 1, i64::MAX, Some(i64::MAX)).unwrap();
        assert_eq!((top.until, top.count()), (i64::MAX, 1));
        for (from, latest) in [(-5, 100), (0, -1001), (i64::MIN, i64::MAX)] {
            let err = plan_range(&tp, from, latest, Some(10)).unwrap_err();
            assert!(matches!(&err, KafkaError::BadRange { partition, .. } if *partition == tp), "{err}");
            assert!(err.to_string().contains("t/4"), "{err}");
        }
    }
}
