//! Segment files: their names (`log-<startMs>-<endMs>`, as in Spark, with
//! `-e<epoch>` after them when the writer is fenced) and the shared
//! description of a live segment.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use spate_core::Time;

/// The file name of the segment covering `[start, end)` written by a
/// writer of `epoch`: `log-<start>-<end>-e<epoch>`, or Spark's
/// `log-<start>-<end>` for epoch 0 (an unfenced writer, and every segment
/// written before segments carried an epoch).
pub(crate) fn segment_name(start: Time, end: Time, epoch: u64) -> String {
    if epoch == 0 {
        format!("log-{}-{}", start.as_millis(), end.as_millis())
    } else {
        format!("log-{}-{}-e{epoch}", start.as_millis(), end.as_millis())
    }
}

/// What a segment file name says: its time range and its writer's epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentId {
    pub(crate) start: Time,
    pub(crate) end: Time,
    pub(crate) epoch: u64,
}

/// The time range and epoch in a segment file name, or `None` for any
/// other file. Only the exact names [`segment_name`] produces are accepted.
pub(crate) fn parse_segment_name(name: &str) -> Option<SegmentId> {
    // No number contains an 'e', so a "-e" can only start the epoch.
    let (body, epoch) = match name.rsplit_once("-e") {
        Some((body, epoch)) => (body, epoch.parse::<u64>().ok()?),
        None => (name, 0),
    };
    let rest = body.strip_prefix("log-")?;
    // The start may be negative, so the separator is the first '-' after
    // the first character.
    let split = rest.get(1..)?.find('-')? + 1;
    let start: i64 = rest.get(..split)?.parse().ok()?;
    let end: i64 = rest.get(split + 1..)?.parse().ok()?;
    let (start, end) = (Time::from_millis(start), Time::from_millis(end));
    (segment_name(start, end, epoch) == name).then_some(SegmentId { start, end, epoch })
}

/// A live segment of the log, shared by the writer, readers and the cleaner.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) start: Time,
    pub(crate) end: Time,
    /// The epoch of the writer that created it (0: unfenced or legacy).
    pub(crate) epoch: u64,
    /// Bytes of acknowledged records: readers never read past this.
    readable_len: AtomicU64,
    /// Bytes covered by a finished `fdatasync` (or there at open).
    synced_len: AtomicU64,
    /// Set while the writer appends to this segment; the cleaner skips it.
    active: AtomicBool,
}

impl Segment {
    pub(crate) fn new(name: String, path: PathBuf, id: SegmentId, readable_len: u64) -> Self {
        Segment {
            name,
            path,
            start: id.start,
            end: id.end,
            epoch: id.epoch,
            readable_len: AtomicU64::new(readable_len),
            synced_len: AtomicU64::new(readable_len),
            active: AtomicBool::new(false),
        }
    }

    pub(crate) fn readable_len(&self) -> u64 {
        self.readable_len.load(Ordering::Acquire)
    }

    /// Records that recovery cut the file to `len` bytes.
    pub(crate) fn cut_to(&self, len: u64) {
        self.readable_len.store(len, Ordering::Release);
        self.synced_len.store(len, Ordering::Release);
    }

    /// Makes records up to `len` readable. Commits finish in order, but a
    /// roll may publish a segment's full length before an earlier commit
    /// into it finishes: the length never shrinks.
    pub(crate) fn extend_readable_len(&self, len: u64) {
        self.readable_len.fetch_max(len, Ordering::AcqRel);
    }

    pub(crate) fn synced_len(&self) -> u64 {
        self.synced_len.load(Ordering::Acquire)
    }

    /// Records that a finished sync covered the first `len` bytes.
    pub(crate) fn extend_synced_len(&self, len: u64) {
        self.synced_len.fetch_max(len, Ordering::AcqRel);
    }

    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    pub(crate) fn set_active(&self, active: bool) {
        self.active.store(active, Ordering::Release);
    }

    /// The order of segments in the log: by start time, then end, then
    /// epoch (an older writer's records of a time range come first), then name.
    pub(crate) fn sort_key(&self) -> (Time, Time, u64, &str) {
        (self.start, self.end, self.epoch, &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_including_negative_times_and_epochs() {
        for (start, end) in [(0, 60_000), (1_000, 61_000), (-5, 3), (-7_000, -1_000), (i64::MIN, i64::MAX)] {
            for epoch in [0, 1, 7, u64::MAX] {
                let id = SegmentId { start: Time::from_millis(start), end: Time::from_millis(end), epoch };
                assert_eq!(parse_segment_name(&segment_name(id.start, id.end, epoch)), Some(id));
            }
        }
        assert_eq!(segment_name(Time::from_millis(1), Time::from_millis(2), 0), "log-1-2", "legacy name");
        assert_eq!(segment_name(Time::from_millis(1), Time::from_millis(2), 3), "log-1-2-e3");
    }

    #[test]
    fn other_files_are_not_segments() {
        for name in [
            "log-",
            "log-1",
            "log-1-",
            "log-a-2",
            "log-01-2",
            "log-1-2.tmp",
            "xlog-1-2",
            "log-1-2-3",
            "",
            "log-1-2-e",
            "log-1-2-e0",
            "log-1-2-e01",
            "log-1-2-e-1",
            "log-1-2-e3-e4",
            "log-1-e3",
        ] {
            assert_eq!(parse_segment_name(name), None, "{name}");
        }
    }
}
