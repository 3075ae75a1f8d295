//! Query 5, hot items: the auctions with the most bids in each sliding
//! window of event time, from a windowed count per auction and a per-batch
//! maximum per window.

use serde::{Deserialize, Serialize};
use spate_core::Duration;
use spate_dstream::{DStream, EventWindows, Window, WindowResult};

use super::{event_time, watermarks};
use crate::model::Event;

/// The length of q5's windows.
pub const Q5_WINDOW: Duration = Duration::from_secs(10);

/// How often a q5 window starts.
pub const Q5_SLIDE: Duration = Duration::from_secs(2);

/// A row of q5: an auction with the most bids in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q5Row {
    /// The window's first instant, in milliseconds (the spec's `starttime`).
    pub window_start: i64,
    /// The first instant after the window, in milliseconds (`endtime`).
    pub window_end: i64,
    /// The auction (`AuctionBids.auction`).
    pub auction: i64,
    /// Its bids in the window, the most of any auction there (`num`).
    pub num: u64,
}

/// The auctions with the most bids in a window, and how many.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Hottest {
    num: u64,
    auctions: Vec<i64>,
}

/// The hotter of two, or both together on a tie.
fn hotter(a: &Hottest, b: &Hottest) -> Hottest {
    match a.num.cmp(&b.num) {
        std::cmp::Ordering::Greater => a.clone(),
        std::cmp::Ordering::Less => b.clone(),
        std::cmp::Ordering::Equal => {
            let mut auctions = a.auctions.clone();
            auctions.extend_from_slice(&b.auctions);
            Hottest { num: a.num, auctions }
        }
    }
}

fn rows(window: Window, hottest: Hottest) -> impl Iterator<Item = Q5Row> {
    let (window_start, window_end) = (window.start.as_millis(), window.end.as_millis());
    hottest.auctions.into_iter().map(move |auction| Q5Row { window_start, window_end, auction, num: hottest.num })
}

/// Query 5, hot items: for each window of 10 s starting every 2 s (event
/// time, from the epoch), every auction with the most bids in it (all of
/// them on a tie, as the spec's `num >= maxn`).
///
/// `aggregate_by_event_time` (`q5-bids-per-auction`) counts each auction's
/// bids per window; a window's counts all come out in the batch whose
/// watermark passes its end (no allowed lateness, so never again), so a
/// per-batch `reduce_by_key` on the window picks its hottest auctions. A
/// window's rows come out in that one batch.
pub fn q5(events: &DStream<Event>) -> DStream<Q5Row> {
    events
        .flat_map(|event: Event| event.as_bid().map(|bid| (bid.auction, bid.date_time)))
        .aggregate_by_event_time(
            |date_time: &i64| event_time(*date_time),
            watermarks(),
            EventWindows::sliding(Q5_WINDOW, Q5_SLIDE),
            |_bid| 1u64,
            |count: &mut u64, _bid| *count += 1,
            |count: &mut u64, other: &u64| *count += *other,
        )
        .name("q5-bids-per-auction")
        .results()
        .map(|r: WindowResult<i64, u64>| (r.window, Hottest { num: r.value, auctions: vec![r.key] }))
        .reduce_by_key(hotter)
        .flat_map(|(window, hottest)| rows(window, hottest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{bid, run};

    const T0: i64 = 1_000_000;

    #[test]
    fn each_window_lists_its_auctions_with_the_most_bids_ties_included() {
        let early = [(1, 1000), (1, 1500), (2, 1200), (3, 5000), (2, 9999)];
        let rows = run(
            q5,
            vec![
                // The watermark reaches T0 + 5999: the windows ending at T0 + 2 s and + 4 s.
                vec![early.iter().map(|(a, t)| bid(*a, 7, T0 + t)).collect()],
                // T0 + 26 s: every window holding the early bids.
                vec![vec![bid(4, 7, T0 + 30_000)]],
            ],
        );
        let row = |start: i64, auction, num| Q5Row {
            window_start: T0 + start,
            window_end: T0 + start + 10_000,
            auction,
            num,
        };
        let mut second = vec![
            row(-4000, 1, 2),
            row(-2000, 1, 2),
            row(0, 1, 2),
            row(0, 2, 2),
            row(2000, 2, 1),
            row(2000, 3, 1),
            row(4000, 2, 1),
            row(4000, 3, 1),
            row(6000, 2, 1),
            row(8000, 2, 1),
        ];
        second.sort();
        assert_eq!(rows, vec![vec![row(-8000, 1, 2), row(-6000, 1, 2)], second]);
    }
}
