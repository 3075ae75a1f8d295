//! The Nexmark queries on spate's DStream API, as the spec's Flink SQL
//! (`nexmark-flink/src/main/resources/queries`) defines them. Each is a
//! function from the event stream to a stream of rows,
//! `qN(&DStream<Event>) -> DStream<QNRow>`.
//!
//! Per record, stateless, partition-parallel:
//!
//! - [`q0`], pass-through: every bid's auction, bidder, price, time and extra;
//! - [`q1`], currency conversion: the same with the price in euros,
//!   `0.908 * price` as an exact decimal of three places ([`EuroCents`]);
//! - [`q2`], selection: auction and price of the bids on every 123rd
//!   auction (`MOD(auction, 123) = 0`).
//!
//! - [`q13`], bounded side input join: every bid with the value of the
//!   row of a side table keyed by its auction modulo 10,000 (loaded once,
//!   before the stream starts: [`q13_side_input`]);
//! - [`q14`], a filter and a user function: bids of a price range in
//!   euros, with the part of the day (UTC) and the count of `c` in `extra`;
//! - [`q21`], channel ids: each bid's channel id, a named channel's number
//!   or its URL's `channel_id` parameter;
//! - [`q22`], URL directories: each bid with its URL's first three
//!   directories;
//! - [`q10`], log to file system: every bid with its date (`dt`) and
//!   minute (`hm`) in UTC, the partition columns of the spec's file table.
//!   The caller writes the rows through `spate-files`' sink partitioned by
//!   minute (this crate does not depend on it: both are layer 2).
//!
//! Each of these is a per-record function ([`q0_row`], [`q1_row`],
//! [`q2_row`], [`q14_row`], …) mapped over the stream.
//!
//! With keyed state:
//!
//! - [`q3`], local item suggestion: sellers in OR, ID or CA and their
//!   category-10 auctions, an incremental join of persons and auctions,
//!   each match once, in the batch that brings its second side;
//! - [`q4`], average price for a category: each auction's highest bid
//!   between its opening and expiry so far, averaged per category, as the
//!   spec's plan of two unwindowed aggregates computes it: after each
//!   batch, a row for each category whose average it changed;
//! - [`q6`], average selling price by seller: for each closed auction with
//!   a winning bid, the average winning price of it and the seller's 10
//!   closed auctions before it by winning bid time, an upsert stream keyed
//!   by seller and auction (an auction closing late with an early winning
//!   bid revises the rows after it);
//! - [`q9`], winning bids: each auction with its winning bid, once the
//!   watermark passes its expiry;
//! - [`q20`], bids joined with their category-10 auction, an incremental
//!   join as q3's.
//!
//! Over the whole stream, as upsert streams (after each batch, the current
//! row of every group the batch changed, replacing the group's earlier
//! rows, as the spec's unwindowed `GROUP BY` and `ROW_NUMBER()` queries
//! update their results):
//!
//! - [`q15`], [`q16`], [`q17`]: bidding statistics per day (UTC), per
//!   channel and day, per auction and day, with exact distinct counts;
//! - [`q18`], each bidder's last bid on each auction;
//! - [`q19`], the ten highest bids of each auction, ranked.
//!
//! Over event-time windows (from the epoch), each window's rows in the
//! batch whose watermark passes its end:
//!
//! - [`q5`], hot items: the auctions with the most bids in each window of
//!   10 s sliding by 2 s;
//! - [`q7`], highest bid: the bids at the highest price of each tumbling
//!   10 s window;
//! - [`q8`], monitor new users: the persons who registered and opened an
//!   auction in the same tumbling 10 s window;
//! - [`q11`], user sessions: each bidder's bids per session (bids at most
//!   10 s apart).
//!
//! Over processing time: [`q12`], each bidder's bids per tumbling 10 s
//! window of processing time (the time of the batch that reads them).
//!
//! Event time is each event's `date_time`. Watermarks allow
//! [`OUT_OF_ORDERNESS`] (4 s, the watermark of the spec's table
//! definitions) within each input partition; the stream's watermark is the
//! slowest partition's. The generator's events are in time order within a
//! [`NexmarkSource`](crate::NexmarkSource) partition, shuffled only within
//! its out-of-order groups, so nothing is late while a group spans less
//! than that. Every stateful operator has a stable name (`q4-winning-bids`,
//! `q5-bids-per-auction`, …), under which its state is checkpointed and
//! restored. Records behind the watermark (which these bounds do not let
//! happen with the generator's events) are left out of the windowed
//! queries and of q6 and q9, and the log says how many.

use std::fmt;

use serde::{Deserialize, Serialize};
use spate_core::{Duration, Time};
use spate_dstream::{DStream, Watermarks};

use crate::model::{Bid, Event};
use crate::text::SharedStr;

mod bid_functions;
mod bidder_windows;
mod category_average;
mod category_join;
mod daily_stats;
mod file_log;
#[cfg(test)]
mod harness;
mod highest_bid;
mod hot_items;
mod local_items;
mod new_users;
mod ranked_bids;
mod side_input;
mod winning_bids;

pub use bid_functions::{BidTimeType, Q14Row, Q21Row, Q22Row, channel_id, q14, q14_row, q21, q21_row, q22, q22_row};
pub use bidder_windows::{BidderCount, Q11_GAP, Q12_WINDOW, q11, q12};
pub use category_average::{Q4Row, q4};
pub use category_join::{Q20_CATEGORY, Q20Row, q20};
pub use daily_stats::{BidCounts, Q15Row, Q16Row, Q17Row, price_rank, q15, q16, q17};
pub use file_log::{Q10Row, q10, q10_row};
pub use highest_bid::{Q7_WINDOW, Q7Row, q7};
pub use hot_items::{Q5_SLIDE, Q5_WINDOW, Q5Row, q5};
pub use local_items::{Q3_CATEGORY, Q3_STATES, Q3Row, q3};
pub use new_users::{Q8_WINDOW, Q8Row, q8};
pub use ranked_bids::{BidRow, Q19_TOP, Q19Row, q18, q18_later, q19, q19_higher};
pub use side_input::{Q13_KEY_MODULUS, Q13Row, Q13SideInput, q13, q13_key, q13_side_input, q13_side_input_from_text};
pub use winning_bids::{Q6_ROWS, Q6Row, Q9Row, better_bid, q6, q9};

/// How far behind the latest event of its input partition an event may
/// come and still count: 4 s, as the spec's tables declare
/// (`WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND`).
pub const OUT_OF_ORDERNESS: Duration = Duration::from_secs(4);

/// The watermarks of the queries over event time: bounded by
/// [`OUT_OF_ORDERNESS`], without an idle timeout (every partition of the
/// Nexmark source has events while it runs).
pub fn watermarks() -> Watermarks {
    Watermarks::bounded_out_of_orderness(OUT_OF_ORDERNESS)
}

/// An event's `date_time` as an event time.
fn event_time(date_time_ms: i64) -> Time {
    Time::from_millis(date_time_ms)
}

/// The bids of an event stream (the spec's `bid` view).
pub fn bids(events: &DStream<Event>) -> DStream<Bid> {
    events.flat_map(Event::into_bid)
}

/// A row of q0 (and the shape of q1's rows).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q0Row {
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
}

/// q0's row for an event: `SELECT auction, bidder, price, dateTime, extra
/// FROM bid`.
pub fn q0_row(event: Event) -> Option<Q0Row> {
    let bid = event.into_bid()?;
    Some(Q0Row {
        auction: bid.auction,
        bidder: bid.bidder,
        price: bid.price,
        date_time: bid.date_time,
        extra: bid.extra,
    })
}

/// Query 0, pass-through: what the engine costs with no work per record.
pub fn q0(events: &DStream<Event>) -> DStream<Q0Row> {
    events.flat_map(q0_row)
}

/// A converted price as the spec's `DECIMAL(23, 3)`: euro-cents (the
/// spec's prices are in cents), kept exactly as thousandths. The product of
/// a whole number of cents and 0.908 has three decimal places, so nothing
/// is rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EuroCents {
    /// The value times 1000.
    pub thousandths: i64,
}

impl EuroCents {
    /// The exchange rate of the spec, in thousandths.
    pub const RATE_THOUSANDTHS: i64 = 908;

    /// `0.908 * price`, exactly.
    pub fn from_cents(price: i64) -> EuroCents {
        EuroCents { thousandths: price.saturating_mul(Self::RATE_THOUSANDTHS) }
    }
}

impl fmt::Display for EuroCents {
    /// As SQL prints a `DECIMAL(_, 3)`: `123.456`, `-0.908`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.thousandths < 0 { "-" } else { "" };
        let abs = self.thousandths.unsigned_abs();
        write!(f, "{sign}{}.{:03}", abs / 1000, abs % 1000)
    }
}

/// A row of q1.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q1Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price converted to euros, in euro-cents.
    pub price: EuroCents,
    /// The bid's time, in milliseconds.
    pub date_time: i64,
    /// The bid's padding.
    pub extra: SharedStr,
}

/// q1's row for an event: `SELECT auction, bidder, 0.908 * price AS price,
/// dateTime, extra FROM bid`.
pub fn q1_row(event: Event) -> Option<Q1Row> {
    let bid = event.into_bid()?;
    Some(Q1Row {
        auction: bid.auction,
        bidder: bid.bidder,
        price: EuroCents::from_cents(bid.price),
        date_time: bid.date_time,
        extra: bid.extra,
    })
}

/// Query 1, currency conversion: each bid's price from dollars to euros.
pub fn q1(events: &DStream<Event>) -> DStream<Q1Row> {
    events.flat_map(q1_row)
}

/// A row of q2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q2Row {
    /// The auction bid on, a multiple of 123.
    pub auction: i64,
    /// The price, in cents.
    pub price: i64,
}

/// The spec's q2 keeps the bids on auctions whose id is a multiple of this.
pub const Q2_AUCTION_MODULUS: i64 = 123;

/// q2's row for an event: `SELECT auction, price FROM bid WHERE
/// MOD(auction, 123) = 0`.
pub fn q2_row(event: &Event) -> Option<Q2Row> {
    let bid = event.as_bid()?;
    (bid.auction % Q2_AUCTION_MODULUS == 0).then_some(Q2Row { auction: bid.auction, price: bid.price })
}

/// Query 2, selection: the bids on every 123rd auction.
pub fn q2(events: &DStream<Event>) -> DStream<Q2Row> {
    events.flat_map(|event| q2_row(&event))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn euros_are_exact_to_three_places() {
        // 0.908 * 12345 cents = 11209.260
        assert_eq!(EuroCents::from_cents(12_345).to_string(), "11209.260");
        assert_eq!(EuroCents::from_cents(1).to_string(), "0.908");
        assert_eq!(EuroCents::from_cents(-1).to_string(), "-0.908");
        assert_eq!(EuroCents::from_cents(0).to_string(), "0.000");
    }

    #[test]
    fn q2_selects_multiples_of_123_only() {
        let bid = |auction| {
            Event::Bid(Bid {
                auction,
                bidder: 1001,
                price: 5,
                channel: SharedStr::default(),
                url: SharedStr::default(),
                date_time: 0,
                extra: SharedStr::default(),
            })
        };
        assert_eq!(q2_row(&bid(1107)), Some(Q2Row { auction: 1107, price: 5 }));
        assert_eq!(q2_row(&bid(1108)), None);
        assert_eq!(q2_row(&bid(1230)), Some(Q2Row { auction: 1230, price: 5 }));
    }
}
