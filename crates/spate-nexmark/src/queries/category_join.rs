//! Query 20, bids joined with their auction: every bid on a category-10
//! auction with the auction's columns, an incremental inner join of bids
//! and auctions on `B.auction = A.id` in keyed state (`map_with_state`
//! keyed by auction id), each match emitted once, in the batch that brings
//! its second side.

use serde::{Deserialize, Serialize};
use spate_dstream::{DStream, State};

use crate::model::{Auction, Bid, Event};
use crate::text::SharedStr;

/// The category q20 keeps.
pub const Q20_CATEGORY: i64 = 10;

/// A row of q20: the bid's columns, then the auction's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q20Row {
    /// The auction (the bid's `auction`, the auction's `id`).
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The bid's price, in cents.
    pub price: i64,
    /// The bid's channel.
    pub channel: SharedStr,
    /// The bid's URL.
    pub url: SharedStr,
    /// The bid's time (`B.dateTime`).
    pub bid_date_time: i64,
    /// The bid's padding (`B.extra`).
    pub bid_extra: SharedStr,
    /// The item's name.
    pub item_name: String,
    /// The item's description.
    pub description: String,
    /// The opening price.
    pub initial_bid: i64,
    /// The reserve price.
    pub reserve: i64,
    /// When the auction opened (`A.dateTime`).
    pub auction_date_time: i64,
    /// When it closes.
    pub expires: i64,
    /// The seller.
    pub seller: i64,
    /// The category (10).
    pub category: i64,
    /// The auction's padding (`A.extra`).
    pub auction_extra: SharedStr,
}

/// What the join reads, keyed by auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Side {
    /// The auction: `Some` when it is in category 10.
    Auction(Option<Box<Auction>>),
    /// A bid on it.
    Bid(Box<Bid>),
}

/// What the join keeps per auction id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Kept {
    /// A category-10 auction: bids arriving later match at once.
    Matching(Box<Auction>),
    /// An auction of another category: its bids never match.
    Elsewhere,
    /// The auction has not arrived: its bids so far.
    Waiting(Vec<Bid>),
}

fn side(event: Event) -> Option<(i64, Side)> {
    match event {
        Event::Auction(a) => Some((a.id, Side::Auction((a.category == Q20_CATEGORY).then(|| Box::new(a))))),
        Event::Bid(b) => Some((b.auction, Side::Bid(Box::new(b)))),
        Event::Person(_) => None,
    }
}

fn row(bid: Bid, a: &Auction) -> Q20Row {
    Q20Row {
        auction: bid.auction,
        bidder: bid.bidder,
        price: bid.price,
        channel: bid.channel,
        url: bid.url,
        bid_date_time: bid.date_time,
        bid_extra: bid.extra,
        item_name: a.item_name.clone(),
        description: a.description.clone(),
        initial_bid: a.initial_bid,
        reserve: a.reserve,
        auction_date_time: a.date_time,
        expires: a.expires,
        seller: a.seller,
        category: a.category,
        auction_extra: a.extra.clone(),
    }
}

/// The `map_with_state` function: one side of an auction id arrives.
fn join(side: Option<Side>, state: &mut State<Kept>) -> Vec<Q20Row> {
    match side {
        Some(Side::Auction(Some(auction))) => {
            let rows = match state.get() {
                Some(Kept::Waiting(bids)) => bids.iter().cloned().map(|b| row(b, &auction)).collect(),
                // The same auction twice: the first one stands.
                Some(Kept::Matching(_) | Kept::Elsewhere) => return Vec::new(),
                None => Vec::new(),
            };
            state.update(Kept::Matching(auction));
            rows
        }
        Some(Side::Auction(None)) => {
            if !matches!(state.get(), Some(Kept::Matching(_))) {
                state.update(Kept::Elsewhere);
            }
            Vec::new()
        }
        Some(Side::Bid(bid)) => match state.get() {
            Some(Kept::Matching(auction)) => vec![row(*bid, auction)],
            Some(Kept::Elsewhere) => Vec::new(),
            Some(Kept::Waiting(bids)) => {
                let mut bids = bids.clone();
                bids.push(*bid);
                state.update(Kept::Waiting(bids));
                Vec::new()
            }
            None => {
                state.update(Kept::Waiting(vec![*bid]));
                Vec::new()
            }
        },
        // No timeout is set, so the function is only called with a value.
        None => Vec::new(),
    }
}

/// Query 20, bids joined with their auction, category 10: each bid on a
/// category-10 auction with the auction's columns, as soon as both have
/// arrived. Keeps each category-10 auction and a marker for each other
/// auction for ever (as the spec's unwindowed join keeps its state), and
/// each bid until its auction arrives. The stateful operator is named
/// `q20-bids-auctions`.
pub fn q20(events: &DStream<Event>) -> DStream<Q20Row> {
    events
        .flat_map(side)
        .map_with_state(|_auction: &i64, side, state: &mut State<Kept>| join(side, state), None)
        .name("q20-bids-auctions")
        .mapped()
        .flat_map(|rows: Vec<Q20Row>| rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{auction, bid, run};

    #[test]
    fn each_bid_on_a_category_10_auction_comes_once_with_the_auction() {
        let rows = run(
            q20,
            vec![
                vec![vec![bid(1, 5, 10), bid(2, 6, 10)], vec![auction(3, 7, 10, 0, 99), bid(3, 7, 11)]],
                vec![vec![auction(1, 7, 10, 0, 99), auction(2, 7, 11, 0, 99)], vec![bid(2, 8, 12), bid(1, 9, 12)]],
            ],
        );
        let keys: Vec<Vec<(i64, i64)>> =
            rows.iter().map(|b| b.iter().map(|r| (r.auction, r.price)).collect()).collect();
        assert_eq!(keys, vec![vec![(3, 7)], vec![(1, 5), (1, 9)]]);
        assert!(rows.iter().flatten().all(|r| r.category == 10 && r.seller == 7));
    }
}
