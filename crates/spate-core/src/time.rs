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
    fn arithmetic_saturates() {
        assert_eq!(Time::from_millis(5).since(Time::from_millis(9)), Duration::ZERO);
        assert_eq!(Time::from_millis(i64::MAX) + Duration::from_secs(1), Time::from_millis(i64::MAX));
        assert_eq!(Duration::from_secs(30).div_duration(Duration::from_secs(2)), 15);
        assert_eq!(Duration::from_secs(3).div_duration(Duration::ZERO), 0);
    }
}
