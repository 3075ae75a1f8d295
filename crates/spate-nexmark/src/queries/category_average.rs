//! Query 4, average price for a category: the average of the highest bid
//! of each auction of a category, as the spec's plan computes it, an upsert
//! stream of each category's average.

use serde::{Deserialize, Serialize};
use spate_dstream::{DStream, KeyHashMap};

use crate::model::Event;

/// A row of q4: the average highest bid of a category's auctions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q4Row {
    /// The category (the spec's `Q.category`).
    pub category: i64,
    /// The average of its auctions' highest bids, in cents, rounded down
    /// (the spec's `AVG(Q.final)`).
    pub average: i64,
    /// How many auctions (with a bid in range) the average is over.
    pub auctions: u64,
}

/// What the highest-bid operator reads, keyed by auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Input {
    /// The auction opens.
    Auction { category: i64, date_time: i64, expires: i64 },
    /// A bid on it.
    Bid { price: i64, date_time: i64 },
}

/// What the highest-bid operator keeps per auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Kept {
    /// Bids (time, price) whose auction has not arrived.
    Waiting(Vec<(i64, i64)>),
    /// An auction and its highest bid in range so far.
    Open { category: i64, date_time: i64, expires: i64, highest: Option<i64> },
}

fn input(event: Event) -> Option<(i64, Input)> {
    match event {
        Event::Auction(a) => {
            Some((a.id, Input::Auction { category: a.category, date_time: a.date_time, expires: a.expires }))
        }
        Event::Bid(b) => Some((b.auction, Input::Bid { price: b.price, date_time: b.date_time })),
        Event::Person(_) => None,
    }
}

/// Folds one record into an auction's state; true when its highest bid in
/// range changed (`B.dateTime BETWEEN A.dateTime AND A.expires`).
fn highest_bid(input: Input, kept: &mut Option<Kept>) -> bool {
    match (input, kept.as_mut()) {
        (Input::Auction { category, date_time, expires }, None | Some(Kept::Waiting(_))) => {
            let in_range = |t: i64| (date_time..=expires).contains(&t);
            let highest = match kept.take() {
                Some(Kept::Waiting(bids)) => bids.into_iter().filter(|(t, _)| in_range(*t)).map(|(_, p)| p).max(),
                _ => None,
            };
            *kept = Some(Kept::Open { category, date_time, expires, highest });
            highest.is_some()
        }
        // The same auction twice: the first one stands.
        (Input::Auction { .. }, Some(Kept::Open { .. })) => false,
        (Input::Bid { price, date_time }, Some(Kept::Open { date_time: opened, expires, highest, .. })) => {
            let higher = (*opened..=*expires).contains(&date_time) && highest.is_none_or(|h| price > h);
            if higher {
                *highest = Some(price);
            }
            higher
        }
        (Input::Bid { price, date_time }, Some(Kept::Waiting(bids))) => {
            bids.push((date_time, price));
            false
        }
        (Input::Bid { price, date_time }, None) => {
            *kept = Some(Kept::Waiting(vec![(date_time, price)]));
            false
        }
    }
}

/// A category's auctions' highest bids, their sum, and the row last emitted.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Category {
    highest: KeyHashMap<i64, i64>,
    sum: i64,
}

impl Category {
    fn row(&self, category: i64) -> Option<Q4Row> {
        let auctions = self.highest.len() as u64;
        let divisor = i64::try_from(auctions).ok().filter(|n| *n > 0)?;
        Some(Q4Row { category, average: self.sum / divisor, auctions })
    }

    /// Sets an auction's highest bid; true when the category's row changed.
    fn set(&mut self, category: i64, auction: i64, price: i64) -> bool {
        let before = self.row(category);
        let old = self.highest.insert(auction, price).unwrap_or(0);
        self.sum = self.sum.saturating_add(price).saturating_sub(old);
        self.row(category) != before
    }
}

/// Query 4, average price for a category: `SELECT category, AVG(final)
/// FROM (SELECT MAX(B.price) AS final, A.category FROM auction A, bid B
/// WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
/// GROUP BY A.id, A.category) GROUP BY category`.
///
/// The spec's plan, over the whole stream, in two unwindowed aggregates
/// (upsert streams):
///
/// 1. `q4-winning-bids`, keyed by auction id: each auction's highest bid
///    in range so far (the join and the inner `GROUP BY`; bids that come
///    before their auction wait for it), emitting an auction's category and
///    highest bid after each batch that raised it;
/// 2. `q4-average-by-category`, keyed by category: the highest bid of each
///    of its auctions, a raised one replacing the auction's earlier one (the
///    retraction of the spec's updating aggregate), and their sum.
///
/// After each batch, a [`Q4Row`] for every category whose average or
/// number of auctions the batch changed: the average (the spec's `AVG` of
/// a `BIGINT`: the sum divided by the count, rounded down) of the highest
/// bids of its auctions with a bid in range so far, open or closed. Both
/// keep an entry per auction for ever, as the spec's unwindowed join and
/// aggregates do.
pub fn q4(events: &DStream<Event>) -> DStream<Q4Row> {
    events
        .flat_map(input)
        .aggregate_by_key(
            |_auction, input: Input, kept: &mut Option<Kept>| highest_bid(input, kept),
            |auction: &i64, kept: &mut Kept, out: &mut Vec<(i64, (i64, i64))>| {
                if let Kept::Open { category, highest: Some(price), .. } = kept {
                    out.push((*category, (*auction, *price)));
                }
            },
        )
        .name("q4-winning-bids")
        .aggregate_by_key(
            |category: &i64, (auction, price): (i64, i64), kept: &mut Option<Category>| {
                kept.get_or_insert_with(Category::default).set(*category, auction, price)
            },
            |category: &i64, kept: &mut Category, out: &mut Vec<Q4Row>| out.extend(kept.row(*category)),
        )
        .name("q4-average-by-category")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{auction, bid, run};

    #[test]
    fn a_category_averages_its_auctions_highest_bids_in_range_as_they_rise() {
        let rows = run(
            q4,
            vec![
                vec![
                    // Bids before their auction arrives: at its expiry (counts)
                    // and just before it opened (does not).
                    vec![bid(1, 500, 2000), bid(1, 900, 999)],
                    vec![
                        auction(1, 7, 10, 1000, 2000),
                        bid(1, 300, 1500),
                        auction(2, 7, 10, 1000, 3000),
                        bid(2, 350, 2500),
                        // Category 11 without bids: nothing to average.
                        auction(3, 7, 11, 1000, 2000),
                    ],
                ],
                // After auction 1's expiry: does not count; below auction 2's highest.
                vec![vec![bid(1, 10_000, 2001), bid(2, 300, 2600)]],
                // Auction 2's highest rises at its expiry: (500 + 402) / 2.
                vec![vec![bid(2, 402, 3000)]],
                // It rises again, but (500 + 403) / 2 rounds down to the same.
                vec![vec![bid(2, 403, 2999)], vec![bid(3, 10, 1000)]],
                vec![vec![bid(2, 700, 2999)]],
            ],
        );
        let row = |category, average, auctions| Q4Row { category, average, auctions };
        assert_eq!(
            rows,
            vec![vec![row(10, 425, 2)], vec![], vec![row(10, 451, 2)], vec![row(11, 10, 1)], vec![row(10, 600, 2)]]
        );
    }
}
