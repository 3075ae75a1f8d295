//! Query 10, log to file system: every bid with its event time's date and
//! minute, the partition columns of the spec's file table.
//!
//! The spec writes the rows through Flink's filesystem connector into
//! `dt=…/hm=…` directories. This crate has no file sink (it sits beside
//! `spate-files`, not above it), so [`q10`] is the row stream and the
//! caller attaches the sink, partitioned by minute on [`Q10Row::event_time`]:
//!
//! ```text
//! let sink = FileSink::open(dir, FileSinkSettings::new().partitioned_by(Partitioning::Minute), Q10Row::event_time)?;
//! queries::q10(&events).write_files(sink).name("q10");
//! ```

use serde::{Deserialize, Serialize};
use spate_core::Time;
use spate_dstream::DStream;
use spate_dstream::functions::UtcDateTime;

use crate::model::Event;
use crate::text::SharedStr;

/// A row of q10: a bid's columns and the partition columns `dt` and `hm`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q10Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price, in cents.
    pub price: i64,
    /// The bid's time, in milliseconds.
    pub date_time: i64,
    /// The bid's padding.
    pub extra: SharedStr,
    /// The bid's date in UTC, `DATE_FORMAT(dateTime, 'yyyy-MM-dd')`.
    pub dt: String,
    /// The bid's hour and minute in UTC, `DATE_FORMAT(dateTime, 'HH:mm')`.
    pub hm: String,
}

impl Q10Row {
    /// The row's event time, by which a file sink partitions it.
    pub fn event_time(&self) -> Time {
        Time::from_millis(self.date_time)
    }
}

/// q10's row for an event: `SELECT auction, bidder, price, dateTime, extra,
/// DATE_FORMAT(dateTime, 'yyyy-MM-dd'), DATE_FORMAT(dateTime, 'HH:mm') FROM
/// bid`, in UTC as the spec's `TIMESTAMP(3)` columns are.
pub fn q10_row(event: Event) -> Option<Q10Row> {
    let bid = event.into_bid()?;
    let civil = UtcDateTime::from_millis(bid.date_time);
    Some(Q10Row {
        auction: bid.auction,
        bidder: bid.bidder,
        price: bid.price,
        date_time: bid.date_time,
        extra: bid.extra,
        dt: civil.date().to_string(),
        hm: civil.hour_minute(),
    })
}

/// Query 10, log to file system: every bid with its date and minute, to be
/// written through a file sink partitioned by minute.
pub fn q10(events: &DStream<Event>) -> DStream<Q10Row> {
    events.flat_map(q10_row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Bid;

    fn bid(date_time: i64) -> Event {
        Event::Bid(Bid {
            auction: 1,
            bidder: 2,
            price: 3,
            channel: "apple".into(),
            url: "https://example.com".into(),
            date_time,
            extra: "pad".into(),
        })
    }

    #[test]
    fn q10_adds_the_utc_date_and_minute_of_each_bid() {
        // 2023-11-14T23:59:59.999Z and the millisecond after it.
        let before_midnight = 1_700_006_399_999;
        let row = q10_row(bid(before_midnight)).unwrap();
        assert_eq!((row.dt.as_str(), row.hm.as_str()), ("2023-11-14", "23:59"));
        assert_eq!((row.auction, row.bidder, row.price, row.extra.as_str()), (1, 2, 3, "pad"));
        assert_eq!(row.event_time(), Time::from_millis(before_midnight));
        let row = q10_row(bid(before_midnight + 1)).unwrap();
        assert_eq!((row.dt.as_str(), row.hm.as_str()), ("2023-11-15", "00:00"));
        // Before the epoch: the minute before it.
        let row = q10_row(bid(-1)).unwrap();
        assert_eq!((row.dt.as_str(), row.hm.as_str()), ("1969-12-31", "23:59"));
    }

    #[test]
    fn q10_skips_events_that_are_not_bids() {
        let person = Event::Person(crate::model::Person {
            id: 1000,
            name: "n".into(),
            email_address: "e".into(),
            credit_card: "c".into(),
            city: "c".into(),
            state: "OR".into(),
            date_time: 0,
            extra: SharedStr::default(),
        });
        assert_eq!(q10_row(person), None);
    }
}
