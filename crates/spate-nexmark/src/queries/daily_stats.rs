//! Queries 15, 16 and 17: bidding statistics per day (UTC), over the
//! whole stream, as upsert streams: each is an unwindowed `GROUP BY` on
//! `DATE_FORMAT(dateTime, 'yyyy-MM-dd')` (with the channel for q16, the
//! auction for q17), an [`DStream::aggregate_by_key`] that emits, after
//! each batch, the current row of every group the batch added bids to.
//! Distinct counts are exact ([`DistinctCount`]).

use serde::{Deserialize, Serialize};
use spate_dstream::functions::{UtcDate, UtcDateTime};
use spate_dstream::{DStream, DistinctCount};

use crate::model::{Bid, Event};
use crate::text::SharedStr;

/// The price ranks of the three filtered columns: rank 1 below 10,000
/// cents, rank 2 up to 1,000,000, rank 3 from there (`price < 10000`,
/// `price >= 10000 and price < 1000000`, `price >= 1000000`).
pub fn price_rank(price: i64) -> usize {
    match price {
        ..10_000 => 0,
        10_000..1_000_000 => 1,
        _ => 2,
    }
}

/// Counts of bids, bidders and auctions, in total and per price rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BidCounts {
    /// `count(*)`.
    pub total_bids: u64,
    /// `count(*)` per rank.
    pub rank_bids: [u64; 3],
    /// `count(distinct bidder)`.
    pub total_bidders: u64,
    /// `count(distinct bidder)` per rank.
    pub rank_bidders: [u64; 3],
    /// `count(distinct auction)`.
    pub total_auctions: u64,
    /// `count(distinct auction)` per rank.
    pub rank_auctions: [u64; 3],
}

/// What q15 and q16 keep per group: the distinct bidders and auctions, in
/// total and per rank, and the counts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct BidStats {
    counts: BidCounts,
    bidders: [DistinctCount<i64>; 4],
    auctions: [DistinctCount<i64>; 4],
}

impl BidStats {
    fn add(&mut self, bid: &Bid) {
        let rank = price_rank(bid.price);
        let c = &mut self.counts;
        c.total_bids += 1;
        c.rank_bids[rank] += 1;
        let (total, ranked) = (0, rank + 1);
        for (set, count) in [(total, &mut c.total_bidders), (ranked, &mut c.rank_bidders[rank])] {
            if self.bidders[set].insert(bid.bidder) {
                *count += 1;
            }
        }
        for (set, count) in [(total, &mut c.total_auctions), (ranked, &mut c.rank_auctions[rank])] {
            if self.auctions[set].insert(bid.auction) {
                *count += 1;
            }
        }
    }
}

/// The day of a time in milliseconds, in UTC.
fn day_of(date_time: i64) -> UtcDate {
    UtcDateTime::from_millis(date_time).date()
}

/// A row of q15.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q15Row {
    /// The day, `yyyy-MM-dd`.
    pub day: String,
    /// The day's counts so far.
    pub counts: BidCounts,
}

/// The bids as (key, bid) for an aggregate keyed by `key`.
fn bids_by<K: spate_dstream::Key>(
    events: &DStream<Event>,
    key: impl Fn(&Bid) -> K + Send + Sync + 'static,
) -> DStream<(K, Bid)> {
    events.flat_map(move |event: Event| event.into_bid().map(|bid| (key(&bid), bid)))
}

/// Query 15, bidding statistics per day: bids, distinct bidders and
/// distinct auctions, in total and per price rank. Operator `q15-daily-stats`.
pub fn q15(events: &DStream<Event>) -> DStream<Q15Row> {
    bids_by(events, |bid| day_of(bid.date_time))
        .aggregate_by_key(
            |_day, bid: Bid, stats: &mut Option<BidStats>| {
                stats.get_or_insert_with(BidStats::default).add(&bid);
                true
            },
            |day: &UtcDate, stats, out| out.push(Q15Row { day: day.to_string(), counts: stats.counts }),
        )
        .name("q15-daily-stats")
}

/// A row of q16.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q16Row {
    /// The channel.
    pub channel: SharedStr,
    /// The day, `yyyy-MM-dd`.
    pub day: String,
    /// The latest minute of the day with a bid, `HH:mm`
    /// (`max(DATE_FORMAT(dateTime, 'HH:mm'))`).
    pub minute: String,
    /// The counts so far.
    pub counts: BidCounts,
}

/// What q16 keeps per channel and day.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ChannelStats {
    stats: BidStats,
    /// The latest (hour, minute) seen.
    minute: (u32, u32),
}

/// Query 16, channel statistics per day: q15's statistics per channel and
/// day, with the latest minute of a bid. Operator `q16-channel-stats`.
pub fn q16(events: &DStream<Event>) -> DStream<Q16Row> {
    bids_by(events, |bid| (bid.channel.clone(), day_of(bid.date_time)))
        .aggregate_by_key(
            |_key, bid: Bid, kept: &mut Option<ChannelStats>| {
                let kept = kept.get_or_insert_with(ChannelStats::default);
                let time = UtcDateTime::from_millis(bid.date_time);
                kept.minute = kept.minute.max((time.hour, time.minute));
                kept.stats.add(&bid);
                true
            },
            |(channel, day): &(SharedStr, UtcDate), kept, out| {
                out.push(Q16Row {
                    channel: channel.clone(),
                    day: day.to_string(),
                    minute: format!("{:02}:{:02}", kept.minute.0, kept.minute.1),
                    counts: kept.stats.counts,
                })
            },
        )
        .name("q16-channel-stats")
}

/// A row of q17.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q17Row {
    /// The auction.
    pub auction: i64,
    /// The day, `yyyy-MM-dd`.
    pub day: String,
    /// `count(*)`.
    pub total_bids: u64,
    /// `count(*)` per price rank (see [`price_rank`]).
    pub rank_bids: [u64; 3],
    /// The lowest price.
    pub min_price: i64,
    /// The highest price.
    pub max_price: i64,
    /// The average price, rounded toward zero (`avg` of a `BIGINT`).
    pub avg_price: i64,
    /// The sum of the prices.
    pub sum_price: i64,
}

/// What q17 keeps per auction and day.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct AuctionStats {
    total_bids: u64,
    rank_bids: [u64; 3],
    min_price: i64,
    max_price: i64,
    sum_price: i64,
}

/// Query 17, auction statistics per day: per auction and day, the bids in
/// total and per price rank, and the lowest, highest, average and total
/// price. Operator `q17-auction-stats`.
pub fn q17(events: &DStream<Event>) -> DStream<Q17Row> {
    events
        .flat_map(|event: Event| event.into_bid().map(|bid| ((bid.auction, day_of(bid.date_time)), bid.price)))
        .aggregate_by_key(
            |_key, price: i64, kept: &mut Option<AuctionStats>| {
                let s = kept.get_or_insert(AuctionStats {
                    total_bids: 0,
                    rank_bids: [0; 3],
                    min_price: price,
                    max_price: price,
                    sum_price: 0,
                });
                s.total_bids += 1;
                s.rank_bids[price_rank(price)] += 1;
                s.min_price = s.min_price.min(price);
                s.max_price = s.max_price.max(price);
                s.sum_price = s.sum_price.saturating_add(price);
                true
            },
            |(auction, day): &(i64, UtcDate), s, out| {
                out.push(Q17Row {
                    auction: *auction,
                    day: day.to_string(),
                    total_bids: s.total_bids,
                    rank_bids: s.rank_bids,
                    min_price: s.min_price,
                    max_price: s.max_price,
                    avg_price: s.sum_price / s.total_bids.max(1) as i64,
                    sum_price: s.sum_price,
                })
            },
        )
        .name("q17-auction-stats")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{bid, run};

    #[test]
    fn q15_counts_bids_bidders_and_auctions_per_rank_and_emits_changed_days() {
        // harness bids: bidder 2000 + price. Day 0 and day 1 (86,400,000 ms).
        let rows = run(
            q15,
            vec![
                vec![vec![bid(1, 5, 10), bid(2, 5, 20), bid(1, 20_000, 30)], vec![bid(1, 5, 86_400_000)]],
                vec![vec![bid(3, 2_000_000, 40)]],
            ],
        );
        let first = BidCounts {
            total_bids: 3,
            rank_bids: [2, 1, 0],
            total_bidders: 2,
            rank_bidders: [1, 1, 0],
            total_auctions: 2,
            rank_auctions: [2, 1, 0],
        };
        let other_day = BidCounts {
            total_bids: 1,
            rank_bids: [1, 0, 0],
            total_bidders: 1,
            rank_bidders: [1, 0, 0],
            total_auctions: 1,
            rank_auctions: [1, 0, 0],
        };
        let later = BidCounts {
            total_bids: 4,
            rank_bids: [2, 1, 1],
            total_bidders: 3,
            rank_bidders: [1, 1, 1],
            total_auctions: 3,
            rank_auctions: [2, 1, 1],
        };
        let row = |day: &str, counts| Q15Row { day: day.into(), counts };
        assert_eq!(
            rows,
            vec![vec![row("1970-01-01", first), row("1970-01-02", other_day)], vec![row("1970-01-01", later)]]
        );
    }

    #[test]
    fn q17_keeps_price_statistics_per_auction_and_day() {
        let rows = run(q17, vec![vec![vec![bid(1, 7, 10), bid(1, 2, 20)], vec![bid(1, 20_000, 30)]]]);
        assert_eq!(
            rows,
            vec![vec![Q17Row {
                auction: 1,
                day: "1970-01-01".into(),
                total_bids: 3,
                rank_bids: [2, 1, 0],
                min_price: 2,
                max_price: 20_000,
                avg_price: 6669,
                sum_price: 20_009,
            }]]
        );
    }
}
