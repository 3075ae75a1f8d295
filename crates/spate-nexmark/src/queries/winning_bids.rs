//! Queries 9 and 6: each auction's winning bid, and the average winning
//! price of each seller's last closed auctions.
//!
//! The winning bid of an auction is its highest bid made between its
//! opening and its expiry, both included (`B.dateTime BETWEEN A.dateTime
//! AND A.expires`); of equal prices, the earliest (q9's `ORDER BY B.price
//! DESC, B.dateTime ASC`), then the other columns, so that the choice never
//! depends on the order bids came in. It is final once the watermark
//! passes the expiry: one `process_by_event_time` keyed by auction id
//! (`q9-winning-bids`, `q6-winning-bids`) keeps each open auction's best
//! bid so far, with a timer one millisecond after `expires`, and emits the
//! auction and its winning bid when the timer fires; bids that come before
//! their auction wait for it until the watermark passes them (an auction
//! arriving after that opens later than they were made).

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use spate_core::{Duration, Time};
use spate_dstream::{DStream, Timed, TimedState};

use super::{event_time, watermarks};
use crate::model::{Auction, Bid, Event};
use crate::text::SharedStr;

/// What the winning-bid operator reads, keyed by auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Input {
    Auction(Box<Auction>),
    Bid(Box<Bid>),
}

impl Input {
    fn date_time(&self) -> i64 {
        match self {
            Input::Auction(a) => a.date_time,
            Input::Bid(b) => b.date_time,
        }
    }
}

/// What the operator keeps per auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Kept {
    /// Bids whose auction has not arrived.
    Waiting(Vec<Bid>),
    /// An open auction and its best bid in range so far.
    Open { auction: Box<Auction>, best: Option<Box<Bid>> },
}

/// The better of two bids on one auction is the greater: the higher price,
/// then the earlier time, then the other columns.
pub fn better_bid(a: &Bid, b: &Bid) -> Ordering {
    a.price
        .cmp(&b.price)
        .then_with(|| b.date_time.cmp(&a.date_time))
        .then_with(|| (a.bidder, &a.channel, &a.url, &a.extra).cmp(&(b.bidder, &b.channel, &b.url, &b.extra)))
}

fn input(event: Event) -> Option<(i64, Input)> {
    match event {
        Event::Auction(a) => Some((a.id, Input::Auction(Box::new(a)))),
        Event::Bid(b) => Some((b.auction, Input::Bid(Box::new(b)))),
        Event::Person(_) => None,
    }
}

/// When an auction expiring at `expires` closes: the first instant after
/// it, so that a bid at `expires` still counts.
fn closing_time(expires: i64) -> Time {
    event_time(expires) + Duration::from_millis(1)
}

fn in_range(auction: &Auction, bid: &Bid) -> bool {
    (auction.date_time..=auction.expires).contains(&bid.date_time)
}

/// Keeps `bid` as the best if it is in range and better.
fn offer(best: &mut Option<Box<Bid>>, auction: &Auction, bid: Bid) {
    if in_range(auction, &bid) && best.as_deref().is_none_or(|b| better_bid(&bid, b) == Ordering::Greater) {
        *best = Some(Box::new(bid));
    }
}

/// The process function: emits (auction, winning bid) when an auction
/// with a bid in range closes.
fn winning_bids(what: Timed<Input>, state: &mut TimedState<Kept>, out: &mut Vec<(Auction, Bid)>) {
    match what {
        Timed::Record { value: Input::Auction(auction), .. } => open(state, auction),
        Timed::Record { value: Input::Bid(bid), time } => match state.get_mut() {
            Some(Kept::Open { auction, best }) => offer(best, auction, *bid),
            Some(Kept::Waiting(bids)) => bids.push(*bid),
            None => {
                state.update(Kept::Waiting(vec![*bid]));
                // Wakes up to drop the bid once no auction can open before it.
                state.set_timer(time + Duration::from_millis(1));
            }
        },
        Timed::Timer { time } => on_timer(state, time, out),
    }
}

/// The auction arrives: the bids that waited for it count if in range.
fn open(state: &mut TimedState<Kept>, auction: Box<Auction>) {
    let waiting = match state.get_mut() {
        Some(Kept::Waiting(bids)) => std::mem::take(bids),
        // The same auction twice: the first one stands.
        Some(Kept::Open { .. }) => return,
        None => Vec::new(),
    };
    let mut best = None;
    for bid in waiting {
        offer(&mut best, &auction, bid);
    }
    let pending: Vec<Time> = state.timers().collect();
    for timer in pending {
        state.delete_timer(timer);
    }
    state.set_timer(closing_time(auction.expires));
    state.update(Kept::Open { auction, best });
}

/// A timer: an open auction closes; waiting bids the watermark passed go.
fn on_timer(state: &mut TimedState<Kept>, time: Time, out: &mut Vec<(Auction, Bid)>) {
    let watermark = state.watermark();
    match state.get_mut() {
        Some(Kept::Open { auction, best }) if time >= closing_time(auction.expires) => {
            if let Some(bid) = best.take() {
                out.push(((**auction).clone(), *bid));
            }
            state.remove();
        }
        Some(Kept::Waiting(bids)) => {
            bids.retain(|b| watermark.is_none_or(|w| event_time(b.date_time) >= w));
            match bids.iter().map(|b| b.date_time).min() {
                Some(earliest) => state.set_timer(event_time(earliest) + Duration::from_millis(1)),
                None => state.remove(),
            }
        }
        Some(Kept::Open { .. }) | None => {}
    }
}

/// Each auction and its winning bid, when the auction closes, from the
/// operator named `name`.
fn winners(events: &DStream<Event>, name: &str) -> DStream<(Auction, Bid)> {
    events
        .flat_map(input)
        .process_by_event_time(
            |input: &Input| event_time(input.date_time()),
            watermarks(),
            |_auction: &i64, what, state: &mut TimedState<Kept>, out: &mut Vec<(Auction, Bid)>| {
                winning_bids(what, state, out)
            },
        )
        .name(name)
        .output()
}

/// A row of q9: an auction's columns, then its winning bid's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q9Row {
    /// The auction's id.
    pub id: i64,
    /// The item's name.
    pub item_name: String,
    /// The item's description.
    pub description: String,
    /// The opening price.
    pub initial_bid: i64,
    /// The reserve price.
    pub reserve: i64,
    /// When the auction opened.
    pub date_time: i64,
    /// When it closed.
    pub expires: i64,
    /// The seller.
    pub seller: i64,
    /// The category.
    pub category: i64,
    /// The auction's padding.
    pub extra: SharedStr,
    /// The auction bid on (`B.auction`, the same as `id`).
    pub auction: i64,
    /// The winning bidder.
    pub bidder: i64,
    /// The winning price.
    pub price: i64,
    /// The winning bid's time (`bid_dateTime`).
    pub bid_date_time: i64,
    /// The winning bid's padding (`bid_extra`).
    pub bid_extra: SharedStr,
}

impl Q9Row {
    /// The row of an auction and its winning bid.
    pub fn new(a: Auction, b: Bid) -> Self {
        Q9Row {
            id: a.id,
            item_name: a.item_name,
            description: a.description,
            initial_bid: a.initial_bid,
            reserve: a.reserve,
            date_time: a.date_time,
            expires: a.expires,
            seller: a.seller,
            category: a.category,
            extra: a.extra,
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            bid_date_time: b.date_time,
            bid_extra: b.extra,
        }
    }
}

/// Query 9, winning bids: each auction with a bid between its opening and
/// expiry and its winning bid (`ROW_NUMBER() OVER (PARTITION BY A.id ORDER
/// BY B.price DESC, B.dateTime ASC) <= 1`), once, final, in the batch
/// whose watermark passes the expiry. (The spec's query updates an
/// auction's row with each better bid; the row emitted here is the one it
/// ends with.)
pub fn q9(events: &DStream<Event>) -> DStream<Q9Row> {
    winners(events, "q9-winning-bids").map(|(auction, bid)| Q9Row::new(auction, bid))
}

/// How many closed auctions of a seller a q6 row averages: its own and the
/// 10 before it (`ROWS BETWEEN 10 PRECEDING AND CURRENT ROW`).
pub const Q6_ROWS: usize = 11;

/// A row of q6: a closed auction of a seller, with the average of its
/// winning price and of the 10 of the seller's closed auctions before it in
/// the order of their winning bids' times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q6Row {
    /// The seller.
    pub seller: i64,
    /// The closed auction this row is for.
    pub auction: i64,
    /// The average winning price, in cents, of this auction and the
    /// seller's 10 before it (fewer when there are fewer), rounded down as
    /// `AVG` of a `BIGINT` is.
    pub avg_price: i64,
}

/// A closed auction in a seller's order: its winning bid's time, its id,
/// and its winning price.
type Closed = (i64, i64, i64);

/// What q6 keeps per seller: every closed auction in order, and the rows
/// the batch being processed may have changed, with their average before
/// it (`None`: a new row).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Seller {
    closed: Vec<Closed>,
    touched: Vec<(i64, i64, Option<i64>)>,
}

impl Seller {
    /// The average of the row at `index` (in range).
    fn average(&self, index: usize) -> i64 {
        let window = self.closed.get(index.saturating_sub(Q6_ROWS - 1)..=index).unwrap_or_default();
        let sum: i64 = window.iter().map(|(_, _, price)| price).sum();
        sum / (window.len().max(1) as i64)
    }

    /// Notes the row at `index` as touched with its current average, unless
    /// the batch touched it already.
    fn touch(&mut self, index: usize, new: bool) {
        let Some(&(time, auction, _)) = self.closed.get(index) else { return };
        if !self.touched.iter().any(|(_, a, _)| *a == auction) {
            let before = (!new).then(|| self.average(index));
            self.touched.push((time, auction, before));
        }
    }

    /// Inserts a closed auction in order: its row is new, and the rows of
    /// the 10 after it have another window.
    fn insert(&mut self, closed: Closed) {
        let at = self.closed.partition_point(|c| (c.0, c.1) < (closed.0, closed.1));
        let after = at..self.closed.len().min(at + Q6_ROWS - 1);
        for index in after {
            self.touch(index, false);
        }
        self.closed.insert(at, closed);
        self.touch(at, true);
    }

    /// The touched rows whose average changed, taking them out.
    fn changed_rows(&mut self, seller: i64, out: &mut Vec<Q6Row>) {
        for (time, auction, before) in std::mem::take(&mut self.touched) {
            let index = self.closed.partition_point(|c| (c.0, c.1) < (time, auction));
            let avg_price = self.average(index);
            if before != Some(avg_price) {
                out.push(Q6Row { seller, auction, avg_price });
            }
        }
    }
}

/// Query 6, average selling price by seller: `AVG(Q.price) OVER (PARTITION
/// BY Q.seller ORDER BY Q.dateTime ROWS BETWEEN 10 PRECEDING AND CURRENT
/// ROW)` over each auction's winning bid (`Q.dateTime` is the winning
/// bid's time), as an upsert stream keyed by seller and auction.
///
/// `q6-winning-bids` finds each auction's winning bid once it closed (as
/// q9); `q6-last-closed`, an `aggregate_by_key` keyed by seller, keeps the
/// seller's closed auctions in the order of their winning bids' times
/// (then ids) and, after each batch, emits the row of every auction that
/// closed in it and of every earlier-closed auction whose window it changed
/// (an auction that closes late with an early winning bid enters the
/// windows of up to 10 rows after it). The last row of each (seller,
/// auction) is the spec's. Keeps every closed auction of a seller for ever,
/// as the spec's `OVER` window over an unbounded table does.
pub fn q6(events: &DStream<Event>) -> DStream<Q6Row> {
    winners(events, "q6-winning-bids")
        .map(|(auction, bid)| (auction.seller, (bid.date_time, auction.id, bid.price)))
        .aggregate_by_key(
            |_seller, closed: Closed, kept: &mut Option<Seller>| {
                kept.get_or_insert_with(Seller::default).insert(closed);
                true
            },
            |seller: &i64, kept: &mut Seller, out: &mut Vec<Q6Row>| kept.changed_rows(*seller, out),
        )
        .name("q6-last-closed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{auction, bid, run};

    #[test]
    fn q9_picks_the_highest_then_earliest_bid_in_range_once_the_auction_closed() {
        let rows = run(
            q9,
            vec![
                // A bid before its auction arrives (at its expiry: counts),
                // one before it opened and one after it closed (do not).
                vec![vec![bid(1, 500, 2000), bid(1, 900, 999)], vec![auction(1, 7, 10, 1000, 2000), bid(1, 950, 2001)]],
                // Equal to the best, earlier: wins. Watermark 6001 - 4 s: closes.
                vec![vec![bid(1, 500, 1500), bid(9, 1, 6001)], vec![bid(9, 1, 6001)]],
            ],
        );
        let winners: Vec<Vec<(i64, i64, i64)>> =
            rows.iter().map(|b| b.iter().map(|r| (r.id, r.price, r.bid_date_time)).collect()).collect();
        assert_eq!(winners, vec![vec![], vec![(1, 500, 1500)]]);
    }

    #[test]
    fn q6_averages_each_closed_auction_with_the_ten_before_it_by_winning_bid_time() {
        // Seller 7's auctions 1 to 12, one bid each: price 100 * id at time
        // 1000 + id, so their order is their ids'.
        let auction_of = |id: i64, expires| auction(id, 7, 10, 1000, expires);
        let first: Vec<Event> = (1..=11).map(|id| auction_of(id, 2000)).collect();
        let bids: Vec<Event> = (1..=12).map(|id| bid(id, 100 * id, 1000 + id)).collect();
        let rows = run(
            q6,
            vec![
                vec![first, bids],
                // 1 to 11 close (the watermark reaches 3000).
                vec![vec![auction_of(12, 8000), bid(99, 1, 7000)], vec![bid(99, 1, 7000)]],
                // 12 closes, last in order: its window is 2 to 12.
                vec![vec![bid(99, 1, 13_000)], vec![bid(99, 1, 13_000)]],
            ],
        );
        let averages =
            |batch: usize| -> Vec<(i64, i64)> { rows[batch].iter().map(|r| (r.auction, r.avg_price)).collect() };
        assert_eq!(averages(0), vec![]);
        assert_eq!(averages(1).len(), 11);
        assert!(averages(1).contains(&(1, 100)) && averages(1).contains(&(2, 150)) && averages(1).contains(&(11, 600)));
        assert_eq!(averages(2), vec![(12, 700)]);
    }

    #[test]
    fn q6_revises_the_rows_whose_window_an_earlier_winning_bid_enters() {
        let mut seller = Seller::default();
        for (time, auction, price) in [(10, 1, 100), (30, 3, 300)] {
            seller.insert((time, auction, price));
        }
        let mut out = Vec::new();
        seller.changed_rows(7, &mut out);
        assert_eq!(out.len(), 2);
        // Auction 2 closes later with a bid between them: 3's average moves.
        seller.insert((20, 2, 500));
        out.clear();
        seller.changed_rows(7, &mut out);
        out.sort();
        let row = |auction, avg_price| Q6Row { seller: 7, auction, avg_price };
        assert_eq!(out, vec![row(2, 300), row(3, 300)]);
        // One more between 1 and 2 that leaves the averages of 2 (100, 300,
        // 500) and 3 (100, 300, 500, 300) as they were: its own row only.
        seller.insert((15, 4, 300));
        out.clear();
        seller.changed_rows(7, &mut out);
        out.sort();
        assert_eq!(out, vec![row(4, 200)]);
    }
}
