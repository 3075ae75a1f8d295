//! Query 7, highest bid: the bids with the highest price in each tumbling
//! window of event time, from one windowed aggregate that keeps the top
//! price and the bids at it.

use serde::{Deserialize, Serialize};
use spate_core::Duration;
use spate_dstream::{DStream, EventWindows, Watermarks, WindowResult};

use super::{OUT_OF_ORDERNESS, event_time};
use crate::model::{Bid, Event};
use crate::text::SharedStr;

/// The length of q7's windows.
pub const Q7_WINDOW: Duration = Duration::from_secs(10);

/// A row of q7: a bid with the highest price of its window.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q7Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price, in cents: the highest of the window.
    pub price: i64,
    /// The bid's time, in milliseconds.
    pub date_time: i64,
    /// The bid's padding.
    pub extra: SharedStr,
}

impl From<Bid> for Q7Row {
    fn from(bid: Bid) -> Self {
        Q7Row { auction: bid.auction, bidder: bid.bidder, price: bid.price, date_time: bid.date_time, extra: bid.extra }
    }
}

/// What q7's window reads: a bid in its own window, or a bid made exactly
/// at a window's end, counted for the window it ends (the spec's `BETWEEN`
/// includes the end) only where its price equals that window's highest.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Input {
    bid: Bid,
    /// The copy of a bid at a window's end, for the window before.
    at_end: bool,
}

impl Input {
    /// Its time in the window it is counted for: a copy one millisecond
    /// before the bid, inside the window the bid ends.
    fn time(&self) -> i64 {
        if self.at_end { self.bid.date_time - 1 } else { self.bid.date_time }
    }
}

/// The highest price of a window so far, the bids at it, and the bids made
/// at the window's end at or above it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Highest {
    price: Option<i64>,
    bids: Vec<Q7Row>,
    at_end: Vec<Q7Row>,
}

impl Highest {
    fn of(input: Input) -> Self {
        let mut highest = Highest::default();
        highest.add(input);
        highest
    }

    fn add(&mut self, input: Input) {
        let price = input.bid.price;
        if input.at_end {
            if self.price.is_none_or(|p| price >= p) {
                self.at_end.push(Q7Row::from(input.bid));
            }
        } else if self.price.is_none_or(|p| price > p) {
            self.price = Some(price);
            self.bids = vec![Q7Row::from(input.bid)];
            self.at_end.retain(|b| b.price >= price);
        } else if self.price == Some(price) {
            self.bids.push(Q7Row::from(input.bid));
        }
    }

    fn merge(&mut self, other: &Highest) {
        match (self.price, other.price) {
            (Some(mine), Some(theirs)) if theirs == mine => self.bids.extend_from_slice(&other.bids),
            (_, Some(theirs)) if self.price.is_none_or(|mine| theirs > mine) => {
                self.price = Some(theirs);
                self.bids.clone_from(&other.bids);
            }
            _ => {}
        }
        self.at_end.extend_from_slice(&other.at_end);
        if let Some(price) = self.price {
            self.at_end.retain(|b| b.price >= price);
        }
    }

    /// The window's rows: its bids at the highest price, and the bids at its
    /// end at that price.
    fn rows(self) -> impl Iterator<Item = Q7Row> {
        let price = self.price;
        let at_end = self.at_end.into_iter().filter(move |b| Some(b.price) == price);
        self.bids.into_iter().chain(at_end)
    }
}

/// A bid, and its copy for the window it ends when it is made at a window's end.
fn inputs(bid: Bid) -> impl Iterator<Item = ((), Input)> {
    let ends_window = bid.date_time.rem_euclid(Q7_WINDOW.as_millis() as i64) == 0;
    let copy = ends_window.then(|| ((), Input { bid: bid.clone(), at_end: true }));
    std::iter::once(((), Input { bid, at_end: false })).chain(copy)
}

/// Query 7, highest bid: for each window of 10 s (event time, from the
/// epoch), every bid at the window's highest price made in it or exactly
/// at its end, once the watermark has passed the end.
///
/// The spec's SQL takes each tumbling window's `MAX(price)` and joins all
/// bids with it on the price and `B.dateTime BETWEEN window_end - 10 s AND
/// window_end`: inclusive at the end, so a bid made exactly at a window's
/// end at that window's highest price is listed for it too (as well as for
/// its own window, where it counts toward the maximum). Here one
/// `aggregate_by_event_time` over all bids (`q7-highest-bid`, a single key:
/// each input partition first folds its bids to the top ones per window)
/// keeps each window's highest price and the bids at it; a bid made at a
/// window's end also goes, as a copy stamped one millisecond earlier, to
/// the window it ends, where it is listed only if its price is that
/// window's highest. Since a bid at the end still counts, a window may
/// only be emitted when the watermark is past its end: the operator's
/// watermark lags one millisecond more than the queries'
/// ([`super::watermarks`]), which makes it emit each window in the batch whose (spec) watermark
/// passes the end by a millisecond.
pub fn q7(events: &DStream<Event>) -> DStream<Q7Row> {
    let end_inclusive = Watermarks::bounded_out_of_orderness(OUT_OF_ORDERNESS + Duration::from_millis(1));
    events
        .flat_map(|event: Event| event.into_bid().into_iter().flat_map(inputs))
        .aggregate_by_event_time(
            |input: &Input| event_time(input.time()),
            end_inclusive,
            EventWindows::tumbling(Q7_WINDOW),
            Highest::of,
            Highest::add,
            Highest::merge,
        )
        .name("q7-highest-bid")
        .results()
        .flat_map(|r: WindowResult<(), Highest>| r.value.rows())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{bid, run};

    const T0: i64 = 1_000_000;

    fn row(auction: i64, price: i64, date_time: i64) -> Q7Row {
        Q7Row { auction, bidder: 2000 + price, price, date_time, extra: format!("extra-{price}").into() }
    }

    #[test]
    fn each_window_lists_its_bids_at_the_highest_price_ties_included() {
        let rows = run(
            q7,
            vec![
                // The first window's top price three times, in both
                // partitions; a bid at its end at that price is listed for
                // it too, and is the next window's. The watermark reaches
                // T0 + 11 s less a millisecond.
                vec![
                    vec![bid(1, 5, T0 + 1000), bid(2, 9, T0 + 2000), bid(8, 9, T0 + 4000), bid(5, 3, T0 + 15_000)],
                    vec![bid(3, 9, T0 + 3000), bid(4, 9, T0 + 10_000), bid(7, 2, T0 + 15_000)],
                ],
                vec![vec![bid(6, 1, T0 + 40_000)], vec![bid(6, 1, T0 + 40_000)]],
            ],
        );
        let first = vec![row(2, 9, T0 + 2000), row(3, 9, T0 + 3000), row(4, 9, T0 + 10_000), row(8, 9, T0 + 4000)];
        assert_eq!(rows, vec![first, vec![row(4, 9, T0 + 10_000)]]);
    }
}

#[cfg(test)]
mod spec {
    use proptest::prelude::*;

    use super::*;
    use crate::queries::harness::{Arranged, bid, out_of_order, run};

    const T0: i64 = 1_000_000;

    /// A bid's time: often exactly at a window's bounds, where the spec's
    /// `BETWEEN` matters.
    fn time() -> impl Strategy<Value = i64> {
        prop_oneof![(0..6i64).prop_map(|k| T0 + k * 10_000), (0..60_000i64).prop_map(|t| T0 + t)]
    }

    fn arranged() -> impl Strategy<Value = Arranged> {
        // Few prices, so that ties and a bid at the end at the window's
        // highest price are common.
        (1..500i64, 1..6i64, time(), 0..3_000i64, 0..3usize, prop::bool::weighted(0.2))
            .prop_map(|(auction, price, t, delay, partition, cut)| (bid(auction, price, t), delay, partition, cut))
    }

    /// The spec's SQL over `bids`: `SELECT B.* FROM bid B JOIN (SELECT
    /// MAX(price) AS maxprice, window_end AS dateTime FROM TUMBLE(bid, 10 s)
    /// GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice WHERE
    /// B.dateTime BETWEEN B1.dateTime - 10 s AND B1.dateTime`.
    fn spec(bids: &[Bid]) -> Vec<Q7Row> {
        let mut highest: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
        for b in bids {
            let top = highest.entry(b.date_time - b.date_time.rem_euclid(10_000) + 10_000).or_insert(b.price);
            *top = (*top).max(b.price);
        }
        let mut rows: Vec<Q7Row> = highest
            .iter()
            .flat_map(|(end, max)| {
                bids.iter()
                    .filter(move |b| b.price == *max && (end - 10_000..=*end).contains(&b.date_time))
                    .map(|b| Q7Row::from(b.clone()))
            })
            .collect();
        rows.sort();
        rows
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random bids, out of order within the watermarks' bound, in random
        /// batches and partitions: q7 emits exactly the rows of the spec's
        /// SQL, each once.
        #[test]
        fn q7_emits_the_rows_of_the_spec_sql(events in prop::collection::vec(arranged(), 1..60)) {
            let bids: Vec<Bid> = events.iter().filter_map(|(e, ..)| e.as_bid().cloned()).collect();
            let rows = run(q7, out_of_order(events, bid(0, 0, T0 + 1_000_005)));
            let mut got: Vec<Q7Row> = rows.into_iter().flatten().collect();
            got.sort();
            prop_assert_eq!(got, spec(&bids));
        }
    }
}
