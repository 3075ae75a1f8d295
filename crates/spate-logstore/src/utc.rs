//! UTC calendar formatting of a [`Time`], for messages a person reads and
//! for quarantine directory names that sort by time.

use spate_core::Time;

/// The UTC date and time of `t`: (year, month, day, hour, minute, second, millisecond).
fn civil(t: Time) -> (i64, u32, u32, u32, u32, u32, u32) {
    let ms = t.as_millis();
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    // Days to civil date (proleptic Gregorian), after Howard Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let secs = in_day / 1000;
    ((year), month, day, (secs / 3600) as u32, (secs / 60 % 60) as u32, (secs % 60) as u32, (in_day % 1000) as u32)
}

/// `2026-11-29T10:43:22.123Z`.
pub(crate) fn iso8601(t: Time) -> String {
    let (y, mo, d, h, mi, s, ms) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

/// `20261129T104322.123Z`: no colons, so it is a portable file name, and it sorts by time.
pub(crate) fn compact(t: Time) -> String {
    let (y, mo, d, h, mi, s, ms) = civil(t);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(iso8601(Time::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(Time::from_millis(1_700_000_000_123)), "2023-11-14T22:13:20.123Z");
        assert_eq!(compact(Time::from_millis(951_782_400_000)), "20000229T000000.000Z");
        assert_eq!(iso8601(Time::from_millis(-1)), "1969-12-31T23:59:59.999Z");
    }
}
