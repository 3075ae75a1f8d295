//! Queries 18 and 19: rankings of bids over the whole stream, as upsert
//! streams. q18 keeps each bidder's latest bid on each auction
//! ([`DStream::dedup_latest_by_key`]), q19 each auction's ten highest bids
//! ([`DStream::top_n_by_key`]). After each batch they emit the keys the
//! batch changed; a later row for a key replaces the earlier ones, as the
//! spec's `ROW_NUMBER()` queries update their results.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use spate_dstream::DStream;

use crate::model::{Bid, Event};
use crate::text::SharedStr;

/// A bid as a row of q18 and q19 (`SELECT auction, bidder, price, channel,
/// url, dateTime, extra`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BidRow {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price, in cents.
    pub price: i64,
    /// The channel.
    pub channel: SharedStr,
    /// The URL.
    pub url: SharedStr,
    /// The bid's time, in milliseconds.
    pub date_time: i64,
    /// The bid's padding.
    pub extra: SharedStr,
}

impl From<Bid> for BidRow {
    fn from(b: Bid) -> Self {
        BidRow {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            channel: b.channel,
            url: b.url,
            date_time: b.date_time,
            extra: b.extra,
        }
    }
}

/// Bids that are equal in what a query orders by are ordered by their
/// other columns, so that which one a query keeps never depends on the
/// order they came in (the spec leaves ties to chance).
fn tie_break(a: &BidRow, b: &BidRow) -> Ordering {
    (a.auction, a.bidder, a.price, a.date_time, &a.channel, &a.url, &a.extra).cmp(&(
        b.auction,
        b.bidder,
        b.price,
        b.date_time,
        &b.channel,
        &b.url,
        &b.extra,
    ))
}

/// q18's order: the later bid is the greater, ties broken by the other columns.
pub fn q18_later(a: &BidRow, b: &BidRow) -> Ordering {
    a.date_time.cmp(&b.date_time).then_with(|| tie_break(a, b))
}

/// Query 18, each bidder's last bid on each auction: `ROW_NUMBER() OVER
/// (PARTITION BY bidder, auction ORDER BY dateTime DESC) <= 1`. After each
/// batch, a row for every (bidder, auction) whose latest bid the batch
/// changed. The stateful operator is `q18-last-bid`.
pub fn q18(events: &DStream<Event>) -> DStream<BidRow> {
    events
        .flat_map(|event: Event| event.into_bid().map(|bid| ((bid.bidder, bid.auction), BidRow::from(bid))))
        .dedup_latest_by_key(q18_later)
        .name("q18-last-bid")
        .map(|(_key, row)| row)
}

/// How many bids q19 ranks per auction.
pub const Q19_TOP: usize = 10;

/// A row of q19: a bid and its rank among its auction's bids.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q19Row {
    /// The bid.
    pub bid: BidRow,
    /// Its rank, from 1 (the highest price) to 10.
    pub rank_number: u64,
}

/// q19's order: the higher price is the greater; on a tie the earlier bid,
/// then the other columns.
pub fn q19_higher(a: &BidRow, b: &BidRow) -> Ordering {
    a.price.cmp(&b.price).then_with(|| b.date_time.cmp(&a.date_time)).then_with(|| tie_break(a, b))
}

/// Query 19, the ten highest bids of each auction: `ROW_NUMBER() OVER
/// (PARTITION BY auction ORDER BY price DESC) <= 10`. After each batch, for
/// every auction whose ranking the batch changed, its whole ranking (a row
/// per rank, replacing the rows of that auction before). The stateful
/// operator is `q19-top-bids`.
pub fn q19(events: &DStream<Event>) -> DStream<Q19Row> {
    events
        .flat_map(|event: Event| event.into_bid().map(|bid| (bid.auction, BidRow::from(bid))))
        .top_n_by_key(Q19_TOP, q19_higher)
        .name("q19-top-bids")
        .flat_map(|(_auction, top): (i64, Vec<BidRow>)| {
            top.into_iter().zip(1..).map(|(bid, rank_number)| Q19Row { bid, rank_number })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{bid, run};

    #[test]
    fn q18_emits_a_bidders_bid_on_an_auction_when_a_later_one_comes() {
        // harness bids: bidder 2000 + price.
        let rows = run(
            q18,
            vec![
                vec![vec![bid(1, 5, 100), bid(2, 5, 50)], vec![bid(1, 5, 90)]],
                vec![vec![bid(1, 5, 80)], vec![bid(1, 5, 120), bid(1, 6, 10)]],
            ],
        );
        let row = |auction, price, date_time| BidRow::from(bid(auction, price, date_time).into_bid().unwrap());
        assert_eq!(rows, vec![vec![row(1, 5, 100), row(2, 5, 50)], vec![row(1, 5, 120), row(1, 6, 10)]]);
    }

    #[test]
    fn q19_ranks_the_highest_bids_of_each_auction_and_emits_changed_rankings() {
        let mut first: Vec<Event> = (1..=12).map(|p| bid(1, p, 1000 + p)).collect();
        first.push(bid(2, 7, 5));
        // 11 is below auction 1's tenth (12 to 3); a tie at 12, later, ranks after.
        let rows = run(q19, vec![vec![first], vec![vec![bid(1, 2, 9)]], vec![vec![bid(1, 12, 2000)]]]);
        let row = |price, date_time, rank| Q19Row {
            bid: BidRow::from(bid(1, price, date_time).into_bid().unwrap()),
            rank_number: rank,
        };
        assert_eq!(rows[0].len(), 11);
        assert!(rows[0].contains(&row(12, 1012, 1)) && rows[0].contains(&row(3, 1003, 10)));
        assert_eq!(rows[1], vec![]);
        assert_eq!(rows[2].len(), 10);
        assert!(rows[2].contains(&row(12, 1012, 1)) && rows[2].contains(&row(12, 2000, 2)));
        assert!(rows[2].contains(&row(4, 1004, 10)));
    }
}
