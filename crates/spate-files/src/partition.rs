//! Where a record goes: the partition directory of its event time
//! (`dt=YYYY-MM-DD/hour=HH`, UTC) and the names of a batch's files.
//!
//! Names are a function of the batch alone (its time, its id, a part index
//! within the partition), never of the attempt, so every attempt of a batch
//! names the same files and a re-run cannot add a second copy under
//! another name.

use spate_core::{BatchId, Time};

/// How records are grouped into directories by their event time (UTC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Partitioning {
    /// `dt=YYYY-MM-DD/hour=HH`: one directory an hour (the default).
    #[default]
    Hour,
    /// `dt=YYYY-MM-DD/hm=HH%3Amm`: one directory a minute, the columns of
    /// Nexmark q10's Flink table (`PARTITIONED BY (dt, hm)` with `hm` as
    /// `HH:mm`), the colon escaped as Flink and Hive escape it in a path.
    Minute,
}

const HOUR_MS: i64 = 3_600_000;
const MINUTE_MS: i64 = 60_000;

impl Partitioning {
    /// The span of one partition in milliseconds.
    pub const fn span_ms(self) -> i64 {
        match self {
            Partitioning::Hour => HOUR_MS,
            Partitioning::Minute => MINUTE_MS,
        }
    }

    /// The partition (a relative directory, `/`-separated) of `event_time`.
    pub fn directory(self, event_time: Time) -> String {
        // `2026-12-05T18:07:09.120Z`: the date before the `T`, then `HH:mm`.
        // Split at the `T` rather than by position: a year past 9999 or
        // before 0 is longer than four characters.
        let iso = event_time.to_iso8601();
        let (date, clock) = iso.split_once('T').unwrap_or((iso.as_str(), "00:00"));
        let hour = clock.get(0..2).unwrap_or("00");
        let minute = clock.get(3..5).unwrap_or("00");
        match self {
            Partitioning::Hour => format!("dt={date}/hour={hour}"),
            Partitioning::Minute => format!("dt={date}/hm={hour}%3A{minute}"),
        }
    }

    /// The bucket of `event_time`: records of one bucket share a directory.
    pub(crate) fn bucket(self, event_time: Time) -> i64 {
        event_time.as_millis().div_euclid(self.span_ms())
    }
}

/// The id of one attempt-independent batch output: `<time ms>-<batch id>`,
/// the name of its manifest and staging directory. The time is in it so a
/// new job writing into the same root (its batch ids start at 0 again)
/// names nothing that an earlier job wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchKey {
    /// The batch time.
    pub time: Time,
    /// The batch id.
    pub batch_id: BatchId,
}

impl BatchKey {
    /// The key of batch `batch_id` at `time`.
    pub const fn new(time: Time, batch_id: BatchId) -> Self {
        BatchKey { time, batch_id }
    }

    /// `<time ms>-<batch id>`.
    pub fn name(self) -> String {
        format!("{}-{}", self.time.as_millis(), self.batch_id.0)
    }

    /// The key a [`BatchKey::name`] stands for; `None` for any other name.
    pub fn parse(name: &str) -> Option<BatchKey> {
        let (time, batch) = name.rsplit_once('-')?;
        let canonical = |s: &str| !s.is_empty() && (s == "0" || !s.trim_start_matches('-').starts_with('0'));
        if !canonical(time) || !canonical(batch) || !batch.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(BatchKey::new(Time::from_millis(time.parse().ok()?), BatchId(batch.parse().ok()?)))
    }

    /// The name of part `index` of this batch in one partition:
    /// `part-<time ms>-<batch id>-<index, 5 digits>.jsonl`.
    pub fn file_name(self, index: u32) -> String {
        format!("part-{}-{index:05}.jsonl", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-05T18:07:09.120Z.
    const AT: i64 = 1_796_494_029_120;

    #[test]
    fn directories_follow_the_utc_date_hour_and_minute() {
        assert_eq!(Time::from_millis(AT).to_iso8601(), "2026-12-05T18:07:09.120Z");
        assert_eq!(Partitioning::Hour.directory(Time::from_millis(AT)), "dt=2026-12-05/hour=18");
        assert_eq!(Partitioning::Minute.directory(Time::from_millis(AT)), "dt=2026-12-05/hm=18%3A07");
        // The last millisecond of a day and the first of the next.
        let midnight = 1_796_515_200_000;
        assert_eq!(Partitioning::Hour.directory(Time::from_millis(midnight - 1)), "dt=2026-12-05/hour=23");
        assert_eq!(Partitioning::Hour.directory(Time::from_millis(midnight)), "dt=2026-12-06/hour=00");
        assert_eq!(Partitioning::Hour.directory(Time::ZERO), "dt=1970-01-01/hour=00");
        // Before the epoch: the hour before it, not the epoch's.
        assert_eq!(Partitioning::Minute.directory(Time::from_millis(-1)), "dt=1969-12-31/hm=23%3A59");
        // A leap day.
        assert_eq!(Partitioning::Hour.directory(Time::from_millis(1_709_208_000_000)), "dt=2024-02-29/hour=12");
    }

    #[test]
    fn records_of_one_bucket_share_a_directory() {
        for partitioning in [Partitioning::Hour, Partitioning::Minute] {
            let span = partitioning.span_ms();
            for at in [AT, 0, -1, -span, span - 1, 1_709_208_000_000] {
                let start = at.div_euclid(span) * span;
                let bucket = partitioning.bucket(Time::from_millis(at));
                assert_eq!(bucket, partitioning.bucket(Time::from_millis(start)), "{at}");
                assert_ne!(bucket, partitioning.bucket(Time::from_millis(start - 1)), "{at}");
                assert_eq!(
                    partitioning.directory(Time::from_millis(at)),
                    partitioning.directory(Time::from_millis(start + span - 1)),
                    "{at}"
                );
            }
        }
    }

    #[test]
    fn batch_names_round_trip_and_other_names_are_not_batches() {
        let key = BatchKey::new(Time::from_millis(1_700_000_003_000), BatchId(42));
        assert_eq!(key.name(), "1700000003000-42");
        assert_eq!(key.file_name(7), "part-1700000003000-42-00007.jsonl");
        assert_eq!(BatchKey::parse(&key.name()), Some(key));
        let early = BatchKey::new(Time::from_millis(-5), BatchId(0));
        assert_eq!(BatchKey::parse(&early.name()), Some(early));
        for other in ["", "7", "-7", "1-", "a-1", "1-a", "01-1", "1-01", "1-+1", "1-18446744073709551616", ".tmp-1-1"] {
            assert_eq!(BatchKey::parse(other), None, "{other}");
        }
        // Names sort by time before batch for times of equal width, as real batch times are.
        let later = BatchKey::new(Time::from_millis(1_700_000_004_000), BatchId(1));
        assert!(key.name() < later.name() && key < later);
    }
}
