//! Wall-clock instants and spans in milliseconds.
//!
//! Batch times are multiples of the batch interval, so both types are plain
//! integer milliseconds: exact arithmetic, no floating point, stable encoding.

use std::fmt;
use std::ops::{Add, Sub};

use serde::{Deserialize, Serialize};

/// A span of time in milliseconds. Never negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Duration(u64);

impl Duration {
    /// The empty span.
    pub const ZERO: Duration = Duration(0);

    /// A span of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Duration(ms)
    }

    /// A span of `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        Duration(s.saturating_mul(1000))
    }

    /// The span in milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The span in (fractional) seconds, for rates.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// True when `self` is a whole, positive multiple of `unit`.
    pub const fn is_multiple_of(self, unit: Duration) -> bool {
        unit.0 != 0 && self.0 != 0 && self.0.is_multiple_of(unit.0)
    }

    /// How many whole `unit`s fit in `self` (0 when `unit` is zero).
    pub const fn div_duration(self, unit: Duration) -> u64 {
        match self.0.checked_div(unit.0) {
            Some(n) => n,
            None => 0,
        }
    }

    /// `self * n`, saturating.
    pub const fn times(self, n: u64) -> Duration {
        Duration(self.0.saturating_mul(n))
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        std::time::Duration::from_millis(d.0)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0)
    }
}

/// An instant in milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Time(i64);

impl Time {
    /// The epoch itself.
    pub const ZERO: Time = Time(0);

    /// The instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Time(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// True when this instant is a whole multiple of `interval` (a batch time).
    pub fn is_multiple_of(self, interval: Duration) -> bool {
        interval.0 != 0 && self.0.rem_euclid(interval.0 as i64) == 0
    }

    /// The largest multiple of `interval` at or before this instant.
    pub fn floor(self, interval: Duration) -> Time {
        if interval.0 == 0 {
            return self;
        }
        let step = interval.0 as i64;
        Time(self.0 - self.0.rem_euclid(step))
    }

    /// The span from `earlier` to `self`, or zero when `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        Duration(self.0.saturating_sub(earlier.0).max(0) as u64)
    }

    /// The instant in ISO 8601 UTC with milliseconds, `2026-11-29T10:43:22.123Z`,
    /// for messages a person reads.
    pub fn to_iso8601(self) -> String {
        let c = CivilTime::of(self);
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            c.year, c.month, c.day, c.hour, c.minute, c.second, c.milli
        )
    }

    /// The instant as `20261129T104322.123Z`: no colons, so it is a portable
    /// file name, and names sort by time.
    pub fn to_compact_utc(self) -> String {
        let c = CivilTime::of(self);
        format!("{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z", c.year, c.month, c.day, c.hour, c.minute, c.second, c.milli)
    }
}

/// A UTC calendar date and time (proleptic Gregorian), computed without a
/// date library by Howard Hinnant's days-to-civil algorithm (eras of 400 years).
struct CivilTime {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    milli: i64,
}

impl CivilTime {
    fn of(t: Time) -> CivilTime {
        const DAY_MS: i64 = 86_400_000;
        let (days, ms) = (t.0.div_euclid(DAY_MS), t.0.rem_euclid(DAY_MS));
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let day_of_era = z.rem_euclid(146_097);
        let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let mp = (5 * day_of_year + 2) / 153;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        CivilTime {
            year: year_of_era + era * 400 + i64::from(month <= 2),
            month,
            day: day_of_year - (153 * mp + 2) / 5 + 1,
            hour: ms / 3_600_000,
            minute: ms / 60_000 % 60,
            second: ms / 1000 % 60,
            milli: ms % 1000,
        }
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.0.min(i64::MAX as u64) as i64))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(d.0.min(i64::MAX as u64) as i64))
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, other: Duration) -> Duration {
        Duration(self.0.saturating_add(other.0))
    }
}

impl Sub for Duration {
    type Output = Duration;
    fn sub(self, other: Duration) -> Duration {
        Duration(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_and_multiples() {
        let interval = Duration::from_millis(1000);
        assert_eq!(Time::from_millis(2500).floor(interval), Time::from_millis(2000));
        assert_eq!(Time::from_millis(-1).floor(interval), Time::from_millis(-1000));
        assert!(Time::from_millis(3000).is_multiple_of(interval));
        assert!(!Time::from_millis(3001).is_multiple_of(interval));
        assert!(Duration::from_secs(30).is_multiple_of(Duration::from_secs(2)));
        assert!(!Duration::from_millis(2500).is_multiple_of(Duration::from_secs(1)));
        assert!(!Duration::ZERO.is_multiple_of(interval));
        assert!(!interval.is_multiple_of(Duration::ZERO));
    }

    #[test]
    fn utc_formats_of_known_instants() {
        assert_eq!(Time::ZERO.to_iso8601(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Time::from_millis(1_700_000_000_123).to_iso8601(), "2023-11-14T22:13:20.123Z");
        assert_eq!(Time::from_millis(951_782_400_000).to_iso8601(), "2000-02-29T00:00:00.000Z");
        assert_eq!(Time::from_millis(-1).to_iso8601(), "1969-12-31T23:59:59.999Z");
        assert_eq!(Time::from_millis(951_782_400_000).to_compact_utc(), "20000229T000000.000Z");
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Time::from_millis(5).since(Time::from_millis(9)), Duration::ZERO);
        assert_eq!(Time::from_millis(i64::MAX) + Duration::from_secs(1), Time::from_millis(i64::MAX));
        assert_eq!(Duration::from_secs(30).div_duration(Duration::from_secs(2)), 15);
        assert_eq!(Duration::from_secs(3).div_duration(Duration::ZERO), 0);
    }
}
