//! Queries 14, 21 and 22: per-record functions of a bid, stateless and
//! partition-parallel, on the string and time helpers of
//! [`spate_dstream::functions`].

use std::fmt;

use serde::{Deserialize, Serialize};
use spate_dstream::DStream;
use spate_dstream::functions::{UtcDateTime, count_char, query_param, split_index};

use super::EuroCents;
use crate::model::{Bid, Event};
use crate::text::SharedStr;

/// The part of the day a bid was made in, by its hour in UTC (q14's
/// `bidTimeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BidTimeType {
    /// 8:00 to 18:59.
    DayTime,
    /// 20:00 to 6:59.
    NightTime,
    /// 7:00 to 7:59 and 19:00 to 19:59.
    OtherTime,
}

impl BidTimeType {
    /// The type of a bid made at `date_time` (ms since the epoch): `CASE
    /// WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime' WHEN
    /// HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime' ELSE
    /// 'otherTime' END`, the hour in UTC as the spec's `TIMESTAMP(3)`
    /// columns are.
    pub fn of(date_time: i64) -> Self {
        match UtcDateTime::from_millis(date_time).hour {
            8..=18 => BidTimeType::DayTime,
            0..=6 | 20.. => BidTimeType::NightTime,
            _ => BidTimeType::OtherTime,
        }
    }
}

impl fmt::Display for BidTimeType {
    /// As the spec's query spells it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BidTimeType::DayTime => "dayTime",
            BidTimeType::NightTime => "nightTime",
            BidTimeType::OtherTime => "otherTime",
        })
    }
}

/// A row of q14.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q14Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price in euros (`0.908 * price`).
    pub price: EuroCents,
    /// When in the day the bid was made.
    pub bid_time_type: BidTimeType,
    /// The bid's time, in milliseconds.
    pub date_time: i64,
    /// The bid's padding.
    pub extra: SharedStr,
    /// How many `c` characters `extra` has (the spec's user function
    /// `count_char(extra, 'c')`).
    pub c_counts: u64,
}

/// The bounds of q14's filter, `0.908 * price > 1000000 AND 0.908 * price <
/// 50000000`, in thousandths of a euro-cent.
const Q14_RANGE_THOUSANDTHS: (i64, i64) = (1_000_000_000, 50_000_000_000);

/// q14's row for an event: the bids whose converted price is strictly
/// between 1,000,000 and 50,000,000, with the part of the day and the count
/// of `c` in `extra`.
pub fn q14_row(event: Event) -> Option<Q14Row> {
    let bid = event.into_bid()?;
    let price = EuroCents::from_cents(bid.price);
    let (low, high) = Q14_RANGE_THOUSANDTHS;
    if price.thousandths <= low || price.thousandths >= high {
        return None;
    }
    Some(Q14Row {
        auction: bid.auction,
        bidder: bid.bidder,
        price,
        bid_time_type: BidTimeType::of(bid.date_time),
        date_time: bid.date_time,
        c_counts: count_char(&bid.extra, 'c'),
        extra: bid.extra,
    })
}

/// Query 14, a filter and a user function: the bids of a price range
/// converted to euros, with the part of the day and `count_char(extra, 'c')`.
pub fn q14(events: &DStream<Event>) -> DStream<Q14Row> {
    events.flat_map(q14_row)
}

/// A row of q21.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q21Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price, in cents.
    pub price: i64,
    /// The channel.
    pub channel: SharedStr,
    /// The channel's id: 0 to 3 for the four named channels, else the
    /// URL's `channel_id` parameter.
    pub channel_id: String,
}

/// The channels q21 names, with their ids, compared without case (`lower(channel) = 'apple'`, …).
const Q21_NAMED_CHANNELS: [(&str, &str); 4] = [("apple", "0"), ("google", "1"), ("facebook", "2"), ("baidu", "3")];

/// The channel id of a bid, as q21's `CASE` defines it: a named channel's
/// number, else `REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)`; `None`
/// when neither gives one, which q21's `WHERE` drops. Channels compare by
/// their lower case (`lower(channel) = 'apple'`), without an allocation for
/// an ASCII channel.
pub fn channel_id(bid: &Bid) -> Option<&str> {
    let named = if bid.channel.is_ascii() {
        Q21_NAMED_CHANNELS.iter().find(|(name, _)| bid.channel.eq_ignore_ascii_case(name))
    } else {
        // Other characters may lower to ASCII ones (the Kelvin sign to `k`).
        let lower = bid.channel.to_lowercase();
        Q21_NAMED_CHANNELS.iter().find(|(name, _)| lower == *name)
    };
    named.map(|(_, id)| *id).or_else(|| query_param(&bid.url, "channel_id"))
}

/// q21's row for an event.
pub fn q21_row(event: Event) -> Option<Q21Row> {
    let bid = event.into_bid()?;
    let channel_id = channel_id(&bid)?.to_string();
    Some(Q21Row { auction: bid.auction, bidder: bid.bidder, price: bid.price, channel: bid.channel, channel_id })
}

/// Query 21, channel ids: each bid from a named channel or with a
/// `channel_id` in its URL, with that id.
pub fn q21(events: &DStream<Event>) -> DStream<Q21Row> {
    events.flat_map(q21_row)
}

/// A row of q22.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q22Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price, in cents.
    pub price: i64,
    /// The channel.
    pub channel: SharedStr,
    /// `SPLIT_INDEX(url, '/', 3)`: the URL's first directory.
    pub dir1: Option<String>,
    /// `SPLIT_INDEX(url, '/', 4)`.
    pub dir2: Option<String>,
    /// `SPLIT_INDEX(url, '/', 5)`.
    pub dir3: Option<String>,
}

/// q22's row for an event: every bid, with the URL's pieces 3 to 5 cut at
/// `/` (`None` past the end, the SQL's NULL).
pub fn q22_row(event: Event) -> Option<Q22Row> {
    let bid = event.into_bid()?;
    let dir = |index| split_index(&bid.url, "/", index).map(str::to_string);
    let (dir1, dir2, dir3) = (dir(3), dir(4), dir(5));
    Some(Q22Row { auction: bid.auction, bidder: bid.bidder, price: bid.price, channel: bid.channel, dir1, dir2, dir3 })
}

/// Query 22, URL directories: every bid with the first three directories
/// of its URL as columns.
pub fn q22(events: &DStream<Event>) -> DStream<Q22Row> {
    events.flat_map(q22_row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bid(price: i64, date_time: i64, channel: &str, url: &str, extra: &str) -> Event {
        Event::Bid(Bid {
            auction: 1,
            bidder: 2,
            price,
            channel: channel.into(),
            url: url.into(),
            date_time,
            extra: extra.into(),
        })
    }

    #[test]
    fn q14_keeps_the_open_price_range_and_types_the_hour_in_utc() {
        // 0.908 * 1101322 = 1000000.376: in; 0.908 * 1101321 = 999999.468: out.
        let day = 1_700_000_000_000 - 22 * 3_600_000 + 8 * 3_600_000; // 08:13 UTC
        let row = q14_row(bid(1_101_322, day, "", "", "cacc")).unwrap();
        assert_eq!((row.bid_time_type, row.c_counts, row.price.thousandths), (BidTimeType::DayTime, 3, 1_000_000_376));
        assert_eq!(q14_row(bid(1_101_321, day, "", "", "")), None);
        // 50000000 / 0.908 = 55066079.29...: 55066079 in, 55066080 out.
        assert!(q14_row(bid(55_066_079, day, "", "", "")).is_some());
        assert_eq!(q14_row(bid(55_066_080, day, "", "", "")), None);
        let hour = |h: i64| BidTimeType::of(1_699_920_000_000 + h * 3_600_000); // 2023-11-14T00:00Z + h
        let types: Vec<String> = [0, 6, 7, 8, 18, 19, 20, 23].into_iter().map(|h| hour(h).to_string()).collect();
        assert_eq!(
            types,
            ["nightTime", "nightTime", "otherTime", "dayTime", "dayTime", "otherTime", "nightTime", "nightTime"]
        );
    }

    #[test]
    fn q21_numbers_named_channels_and_reads_the_id_from_the_url_otherwise() {
        let id = |channel: &str, url: &str| q21_row(bid(1, 0, channel, url, "")).map(|r| r.channel_id);
        assert_eq!(id("Apple", "https://x/item.htm?query=1&channel_id=5"), Some("0".into()));
        assert_eq!(id("BAIDU", "https://x/item.htm?query=1"), Some("3".into()));
        assert_eq!(id("channel-7", "https://x/item.htm?query=1&channel_id=1879048192"), Some("1879048192".into()));
        assert_eq!(id("channel-8", "https://x/item.htm?query=1"), None);
        // The Kelvin sign lowers to `k`, as SQL's lower() has it.
        assert_eq!(id("FACEBOO\u{212A}", "https://x/item.htm?query=1"), Some("2".into()));
    }

    #[test]
    fn q22_splits_the_url_at_slashes() {
        let row = q22_row(bid(1, 0, "c", "https://www.nexmark.com/ab/cd/ef/item.htm?query=1", "")).unwrap();
        assert_eq!((row.dir1, row.dir2, row.dir3), (Some("ab".into()), Some("cd".into()), Some("ef".into())));
        let row = q22_row(bid(1, 0, "c", "a/b/c/d", "")).unwrap();
        assert_eq!((row.dir1, row.dir2, row.dir3), (Some("d".into()), None, None));
    }
}
