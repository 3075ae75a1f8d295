//! UTC timestamps for people (`2023-11-14T22:13:20.000Z`), without a date library.

use spate_core::Time;

/// `t` as an ISO 8601 UTC timestamp with milliseconds.
pub(crate) fn iso8601(t: Time) -> String {
    let ms = t.as_millis();
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// Year, month, day of the day `days` after 1970-01-01 (the proleptic
/// Gregorian calendar, by eras of 400 years).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(iso8601(Time::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(Time::from_millis(1_700_000_000_000)), "2023-11-14T22:13:20.000Z");
        assert_eq!(iso8601(Time::from_millis(951_782_400_123)), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso8601(Time::from_millis(-1)), "1969-12-31T23:59:59.999Z");
    }
}
