//! Scalar functions of SQL that stream queries use on strings and times,
//! as small helpers to call from `map`, `filter` or `flat_map`: they borrow
//! from their input and allocate only when they format.
//!
//! - [`split_index`]: Flink's `SPLIT_INDEX(text, separator, index)`;
//! - [`query_param`]: the value of a `name=value` parameter of a URL's
//!   query, what `REGEXP_EXTRACT(url, '(&|^)name=([^&]*)', 2)` extracts;
//! - [`count_char`]: how often a character occurs in a string;
//! - [`UtcDateTime`]: the calendar fields of a time in milliseconds since
//!   the epoch, in UTC, for `HOUR(t)` and `DATE_FORMAT(t, 'yyyy-MM-dd')`.
//!
//! ```
//! use spate_dstream::functions::{UtcDateTime, query_param, split_index};
//!
//! let url = "https://example.com/a/b/c/item.htm?query=1&channel_id=42";
//! assert_eq!(split_index(url, "/", 3), Some("a"));
//! assert_eq!(query_param(url, "channel_id"), Some("42"));
//! let t = UtcDateTime::from_millis(1_700_000_000_000);
//! assert_eq!((t.date().to_string(), t.hour), ("2023-11-14".to_string(), 22));
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

/// The `index`-th piece (from 0) of `text` cut at every `separator`, empty
/// pieces included; `None` when there are not that many pieces, or `text`
/// is empty (as Flink's `SPLIT_INDEX`, which returns NULL then).
pub fn split_index<'a>(text: &'a str, separator: &str, index: usize) -> Option<&'a str> {
    if text.is_empty() {
        return None;
    }
    if separator.is_empty() {
        return (index == 0).then_some(text);
    }
    text.split(separator).nth(index)
}

/// The value of the first `name=` that starts `text` or follows an `&`, up
/// to the next `&` (possibly empty); `None` when there is none. This is what
/// `REGEXP_EXTRACT(text, '(&|^)name=([^&]*)', 2)` extracts, for a `name`
/// without regular-expression characters.
pub fn query_param<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    if name.is_empty() {
        return None;
    }
    let mut from = 0;
    while let Some(found) = text.get(from..).and_then(|rest| rest.find(name)) {
        let at = from + found;
        let after = at + name.len();
        let starts_param = at == 0 || text.as_bytes().get(at - 1) == Some(&b'&');
        if starts_param && text.as_bytes().get(after) == Some(&b'=') {
            let value = text.get(after + 1..).unwrap_or_default();
            return Some(value.split('&').next().unwrap_or_default());
        }
        // `name` is not empty, so its first character moves us on.
        from = at + name.chars().next().map_or(1, char::len_utf8);
    }
    None
}

/// How many times `c` occurs in `text`.
pub fn count_char(text: &str, c: char) -> u64 {
    if c.is_ascii() {
        // A byte scan: an ASCII byte never occurs inside another character.
        let byte = c as u8;
        text.bytes().filter(|b| *b == byte).count() as u64
    } else {
        text.chars().filter(|x| *x == c).count() as u64
    }
}

/// A time's calendar fields in UTC (the proleptic Gregorian calendar), to
/// the minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UtcDateTime {
    /// The year.
    pub year: i64,
    /// The month, 1 to 12.
    pub month: u32,
    /// The day of the month, 1 to 31.
    pub day: u32,
    /// The hour, 0 to 23.
    pub hour: u32,
    /// The minute, 0 to 59.
    pub minute: u32,
}

/// Milliseconds in a day.
const DAY_MS: i64 = 86_400_000;

impl UtcDateTime {
    /// The fields of `millis` since the epoch (negative: before it).
    pub fn from_millis(millis: i64) -> Self {
        let days = millis.div_euclid(DAY_MS);
        let in_day = millis.rem_euclid(DAY_MS);
        let (year, month, day) = civil_from_days(days);
        let minutes = in_day / 60_000;
        UtcDateTime { year, month, day, hour: (minutes / 60) as u32, minute: (minutes % 60) as u32 }
    }

    /// The date, which prints as `yyyy-MM-dd`.
    pub fn date(&self) -> UtcDate {
        UtcDate { year: self.year, month: self.month, day: self.day }
    }

    /// The time of day as `HH:mm`.
    pub fn hour_minute(&self) -> String {
        format!("{:02}:{:02}", self.hour, self.minute)
    }
}

/// A date in UTC; prints as `yyyy-MM-dd` (`DATE_FORMAT(t, 'yyyy-MM-dd')`).
/// A small key for grouping by day: format it when emitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UtcDate {
    /// The year.
    pub year: i64,
    /// The month, 1 to 12.
    pub month: u32,
    /// The day of the month, 1 to 31.
    pub day: u32,
}

impl fmt::Display for UtcDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// The civil date of `days` since 1970-01-01 (the algorithm of Howard
/// Hinnant's `civil_from_days`: eras of 400 years, years from March so
/// that the leap day comes last).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_index_keeps_empty_pieces_and_is_none_past_the_end() {
        let url = "https://www.nexmark.com/x/y/z/item.htm?query=1";
        let pieces: Vec<_> = (0..8).map(|i| split_index(url, "/", i)).collect();
        assert_eq!(
            pieces,
            [
                Some("https:"),
                Some(""),
                Some("www.nexmark.com"),
                Some("x"),
                Some("y"),
                Some("z"),
                Some("item.htm?query=1"),
                None
            ]
        );
        assert_eq!(split_index("a--b", "--", 1), Some("b"));
        assert_eq!(split_index("", "/", 0), None);
    }

    #[test]
    fn query_param_matches_at_the_start_or_after_an_ampersand_only() {
        assert_eq!(query_param("a=1&channel_id=7&b=2", "channel_id"), Some("7"));
        assert_eq!(query_param("channel_id=&b=2", "channel_id"), Some(""));
        assert_eq!(query_param("channel_id=9", "channel_id"), Some("9"));
        // After `?` or inside another name: not a match.
        assert_eq!(query_param("x?channel_id=7", "channel_id"), None);
        assert_eq!(query_param("a=1&my_channel_id=7", "channel_id"), None);
        assert_eq!(query_param("a=1&channel_idx=7&channel_id=8", "channel_id"), Some("8"));
        assert_eq!(query_param("a=1&channel_id", "channel_id"), None);
    }

    #[test]
    fn count_char_counts_ascii_and_other_characters() {
        assert_eq!(count_char("cacbcc", 'c'), 4);
        assert_eq!(count_char("été", 'é'), 2);
        assert_eq!(count_char("", 'c'), 0);
    }

    #[test]
    fn calendar_fields_match_known_dates() {
        let t = UtcDateTime::from_millis(0);
        assert_eq!((t.date().to_string(), t.hour_minute()), ("1970-01-01".to_string(), "00:00".to_string()));
        // 2024-02-29T23:59:59.999Z, a leap day.
        let t = UtcDateTime::from_millis(1_709_251_199_999);
        assert_eq!((t.date().to_string(), t.hour_minute()), ("2024-02-29".to_string(), "23:59".to_string()));
        assert_eq!(UtcDateTime::from_millis(1_709_251_200_000).date().to_string(), "2024-03-01");
        // 1969-12-31T23:00Z.
        let t = UtcDateTime::from_millis(-3_600_000);
        assert_eq!((t.date().to_string(), t.hour), ("1969-12-31".to_string(), 23));
        // 2000-03-01 (after a leap day in a year divisible by 400).
        assert_eq!(UtcDateTime::from_millis(951_868_800_000).date().to_string(), "2000-03-01");
    }
}
