//! Query 4, average price for a category: the average winning bid of the
//! closed auctions of each category, from the winning bid of each auction
//! (keyed processing with a timer at its expiry) and a running sum and
//! count per category.

use serde::{Deserialize, Serialize};
use spate_core::{Duration, Time};
use spate_dstream::{DStream, Timed, TimedState};

use super::{event_time, watermarks};
use crate::model::Event;

/// A row of q4: the average winning price of a category's closed auctions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q4Row {
    /// The category (the spec's `Q.category`).
    pub category: i64,
    /// The average winning price, in cents, rounded down (the spec's `AVG(Q.final)`).
    pub average: i64,
    /// How many closed auctions the average is over.
    pub auctions: u64,
}

/// What the winning-bid operator reads, keyed by auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Input {
    /// The auction opens.
    Auction { category: i64, date_time: i64, expires: i64 },
    /// A bid on it.
    Bid { price: i64, date_time: i64 },
}

impl Input {
    fn date_time(&self) -> i64 {
        match self {
            Input::Auction { date_time, .. } | Input::Bid { date_time, .. } => *date_time,
        }
    }
}

/// What the winning-bid operator keeps per auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Kept {
    /// Bids (time, price) whose auction has not arrived.
    Waiting(Vec<(i64, i64)>),
    /// An open auction and its highest bid in range so far.
    Open { category: i64, date_time: i64, expires: i64, highest: Option<i64> },
}

/// A category's winning prices so far.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Average {
    sum: i64,
    count: u64,
    /// True when the batch just processed added to it.
    changed: bool,
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

/// When an auction expiring at `expires` closes: the first instant after
/// it, so that a bid at `expires` is still counted.
fn closing_time(expires: i64) -> Time {
    event_time(expires) + Duration::from_millis(1)
}

/// The process function of `q4-winning-bids`: emits (category, winning
/// price) when an auction closes.
fn winning_bids(what: Timed<Input>, state: &mut TimedState<Kept>, out: &mut Vec<(i64, i64)>) {
    match what {
        Timed::Record { value: Input::Auction { category, date_time, expires }, .. } => {
            open(state, category, date_time, expires);
        }
        Timed::Record { value: Input::Bid { price, date_time }, time } => bid(state, price, date_time, time),
        Timed::Timer { time } => on_timer(state, time, out),
    }
}

/// The auction arrives: the bids that waited for it count if in range.
fn open(state: &mut TimedState<Kept>, category: i64, date_time: i64, expires: i64) {
    let waiting = match state.get() {
        Some(Kept::Waiting(bids)) => bids.clone(),
        // The same auction twice: the first one stands.
        Some(Kept::Open { .. }) => return,
        None => Vec::new(),
    };
    let in_range = |t: i64| (date_time..=expires).contains(&t);
    let highest = waiting.iter().filter(|(t, _)| in_range(*t)).map(|(_, price)| *price).max();
    let pending: Vec<Time> = state.timers().collect();
    for timer in pending {
        state.delete_timer(timer);
    }
    state.update(Kept::Open { category, date_time, expires, highest });
    state.set_timer(closing_time(expires));
}

/// A bid: raises the open auction's highest bid, or waits for the auction.
fn bid(state: &mut TimedState<Kept>, price: i64, date_time: i64, time: Time) {
    match state.get_mut() {
        Some(Kept::Open { date_time: opened, expires, highest, .. }) => {
            if (*opened..=*expires).contains(&date_time) {
                *highest = Some(highest.map_or(price, |h| h.max(price)));
            }
        }
        Some(Kept::Waiting(bids)) => bids.push((date_time, price)),
        None => {
            state.update(Kept::Waiting(vec![(date_time, price)]));
            // Wakes up to drop the bid once no auction can open before it.
            state.set_timer(time + Duration::from_millis(1));
        }
    }
}

/// A timer: an open auction closes; waiting bids the watermark passed go.
fn on_timer(state: &mut TimedState<Kept>, time: Time, out: &mut Vec<(i64, i64)>) {
    let watermark = state.watermark();
    match state.get_mut() {
        Some(Kept::Open { category, expires, highest, .. }) if time >= closing_time(*expires) => {
            if let Some(price) = *highest {
                out.push((*category, price));
            }
            state.remove();
        }
        Some(Kept::Waiting(bids)) => {
            // An auction arriving from now on opens at or after the
            // watermark (anything earlier would be late), so a bid before it
            // is out of that auction's range.
            bids.retain(|(t, _)| watermark.is_none_or(|w| event_time(*t) >= w));
            match bids.iter().map(|(t, _)| *t).min() {
                Some(earliest) => state.set_timer(event_time(earliest) + Duration::from_millis(1)),
                None => state.remove(),
            }
        }
        // An open auction has no timer but its closing (it deleted the others).
        Some(Kept::Open { .. }) | None => {}
    }
}

/// The `update_state_by_key` function of `q4-average-by-category`.
fn average(prices: Vec<i64>, old: Option<Average>) -> Option<Average> {
    let mut average = old.unwrap_or(Average { sum: 0, count: 0, changed: false });
    average.changed = !prices.is_empty();
    for price in prices {
        average.sum = average.sum.saturating_add(price);
        average.count += 1;
    }
    Some(average)
}

fn row(category: i64, average: Average) -> Option<Q4Row> {
    let divisor = i64::try_from(average.count).ok().filter(|count| *count > 0)?;
    average.changed.then_some(Q4Row { category, average: average.sum / divisor, auctions: average.count })
}

/// Query 4, average price for a category.
///
/// The spec's SQL takes, per auction, `MAX(B.price)` over its bids with
/// `B.dateTime BETWEEN A.dateTime AND A.expires`, and averages these per
/// category. Here an auction's winning bid is final once the watermark
/// passes its expiry, and only then counted:
///
/// 1. `process_by_event_time` keyed by auction id (`q4-winning-bids`) keeps
///    each open auction's highest bid in range, with a timer one
///    millisecond after `expires` (a bid at `expires` itself still counts,
///    as `BETWEEN` is inclusive, so the auction closes only when no such
///    bid can come). When the timer fires the auction emits its category
///    and winning price, if it had a bid in range, and is forgotten. Bids
///    that arrive before their auction (from another partition, or on an
///    auction not opened yet) wait for it until the watermark passes them:
///    an auction arriving after that opens later than they were made.
/// 2. `update_state_by_key` keyed by category (`q4-average-by-category`)
///    adds the batch's winning prices to the category's sum and count.
///
/// So a batch emits one [`Q4Row`] for each category some of whose auctions
/// closed in it with a bid in range: the average winning price over every
/// auction of the category closed so far (the spec's `AVG` of a `BIGINT`,
/// an integer: the sum divided by the count, rounded down) and their
/// number. A category with no such closing in the batch emits nothing.
pub fn q4(events: &DStream<Event>) -> DStream<Q4Row> {
    events
        .flat_map(input)
        .process_by_event_time(
            |input: &Input| event_time(input.date_time()),
            watermarks(),
            |_auction: &i64, what, state: &mut TimedState<Kept>, out: &mut Vec<(i64, i64)>| {
                winning_bids(what, state, out)
            },
        )
        .name("q4-winning-bids")
        .output()
        .update_state_by_key(average)
        .name("q4-average-by-category")
        .flat_map(|(category, average)| row(category, average))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{auction, bid, run};

    #[test]
    fn an_auction_counts_its_highest_bid_from_opening_to_expiry_once_the_watermark_passes_it() {
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
                // The watermark reaches 2001 (6001 - 4 s): auctions 1 and 3
                // close; the bid after auction 1's expiry does not count.
                vec![vec![bid(1, 10_000, 2001), bid(9, 1, 6001)], vec![bid(9, 1, 6001)]],
                // 3000: auction 2 expires at 3000 but a bid then may still come.
                vec![vec![bid(9, 1, 7000)], vec![bid(9, 1, 7000)]],
                // It does; 3001: auction 2 closes; (500 + 401) / 2 rounds down.
                vec![vec![bid(2, 401, 3000), bid(9, 1, 7001)], vec![bid(9, 1, 7001)]],
                vec![vec![bid(9, 1, 7002)], vec![]],
            ],
        );
        let row = |average, auctions| Q4Row { category: 10, average, auctions };
        assert_eq!(rows, vec![vec![], vec![row(500, 1)], vec![], vec![row(450, 2)], vec![]]);
    }
}
