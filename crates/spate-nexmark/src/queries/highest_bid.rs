//! Query 7, highest bid: the bids with the highest price in each tumbling
//! window of event time, from one windowed aggregate that keeps the top
//! price and the bids at it.

use serde::{Deserialize, Serialize};
use spate_core::Duration;
use spate_dstream::{DStream, EventWindows, WindowResult};

use super::{event_time, watermarks};
use crate::model::{Bid, Event};

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
    pub extra: String,
}

impl From<Bid> for Q7Row {
    fn from(bid: Bid) -> Self {
        Q7Row { auction: bid.auction, bidder: bid.bidder, price: bid.price, date_time: bid.date_time, extra: bid.extra }
    }
}

/// The highest price of a window so far and the bids at it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Highest {
    price: i64,
    bids: Vec<Q7Row>,
}

impl Highest {
    fn of(bid: Bid) -> Self {
        Highest { price: bid.price, bids: vec![Q7Row::from(bid)] }
    }

    fn add(&mut self, bid: Bid) {
        if bid.price > self.price {
            *self = Highest::of(bid);
        } else if bid.price == self.price {
            self.bids.push(Q7Row::from(bid));
        }
    }

    fn merge(&mut self, other: &Highest) {
        if other.price > self.price {
            *self = other.clone();
        } else if other.price == self.price {
            self.bids.extend_from_slice(&other.bids);
        }
    }
}

/// Query 7, highest bid: for each window of 10 s (event time, from the
/// epoch), every bid in it at the window's highest price, in the batch whose
/// watermark passes the window's end.
///
/// One `aggregate_by_event_time` over all bids (`q7-highest-bid`, a single
/// key: each input partition first folds its bids to the top ones per
/// window). The spec's SQL joins the bids with each window's maximum on
/// `B.dateTime BETWEEN window_end - 10 s AND window_end`, inclusive at the
/// end, so a bid made exactly at a window's end at that window's maximum
/// price would also be listed for it; here a bid belongs to its own window
/// only, `[start, end)`.
pub fn q7(events: &DStream<Event>) -> DStream<Q7Row> {
    events
        .flat_map(|event: Event| event.into_bid().map(|bid| ((), bid)))
        .aggregate_by_event_time(
            |bid: &Bid| event_time(bid.date_time),
            watermarks(),
            EventWindows::tumbling(Q7_WINDOW),
            Highest::of,
            Highest::add,
            Highest::merge,
        )
        .name("q7-highest-bid")
        .results()
        .flat_map(|r: WindowResult<(), Highest>| r.value.bids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{bid, run};

    const T0: i64 = 1_000_000;

    fn row(auction: i64, price: i64, date_time: i64) -> Q7Row {
        Q7Row { auction, bidder: 2000 + price, price, date_time, extra: format!("extra-{price}") }
    }

    #[test]
    fn each_window_lists_its_bids_at_the_highest_price_ties_included() {
        let rows = run(
            q7,
            vec![
                // The first window's top price three times, in both
                // partitions; a bid at its end is the next window's. The
                // watermark reaches T0 + 11 s.
                vec![
                    vec![bid(1, 5, T0 + 1000), bid(2, 9, T0 + 2000), bid(8, 9, T0 + 4000), bid(5, 3, T0 + 15_000)],
                    vec![bid(3, 9, T0 + 3000), bid(4, 9, T0 + 10_000), bid(7, 2, T0 + 15_000)],
                ],
                vec![vec![bid(6, 1, T0 + 40_000)], vec![bid(6, 1, T0 + 40_000)]],
            ],
        );
        let first = vec![row(2, 9, T0 + 2000), row(3, 9, T0 + 3000), row(8, 9, T0 + 4000)];
        assert_eq!(rows, vec![first, vec![row(4, 9, T0 + 10_000)]]);
    }
}
