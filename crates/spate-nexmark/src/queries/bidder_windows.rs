//! Queries 11 and 12: bids per bidder over windows, of event time (q11,
//! sessions) and of processing time (q12, tumbling).

use serde::{Deserialize, Serialize};
use spate_core::Duration;
use spate_dstream::{DStream, EventWindows, Window, WindowResult};

use super::{event_time, watermarks};
use crate::model::Event;

/// q11's session gap.
pub const Q11_GAP: Duration = Duration::from_secs(10);

/// A row of q11 and q12: a bidder's bids in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BidderCount {
    /// The bidder.
    pub bidder: i64,
    /// Their bids in the window (`bid_count`).
    pub bid_count: u64,
    /// The window's start, in milliseconds (`starttime`).
    pub start: i64,
    /// The window's end, in milliseconds (`endtime`).
    pub end: i64,
}

/// Query 11, user sessions: per bidder, the bids of each session (bids at
/// most 10 s apart), with the session's start (its first bid) and end (its
/// last bid plus 10 s), in the batch whose watermark passes that end.
///
/// The spec's `SESSION(dateTime, INTERVAL '10' SECOND)` is Flink's, whose
/// sessions merge when they touch: bids exactly 10 s apart are one
/// session. Session windows here merge when they overlap, so the operator
/// (`q11-user-sessions`) runs with a gap one millisecond longer and the end
/// is reported one millisecond earlier: the same sessions, each emitted
/// once no bid can still join it.
pub fn q11(events: &DStream<Event>) -> DStream<BidderCount> {
    let touching = Q11_GAP + Duration::from_millis(1);
    events
        .flat_map(|event: Event| event.as_bid().map(|bid| (bid.bidder, bid.date_time)))
        .aggregate_by_event_time(
            |date_time: &i64| event_time(*date_time),
            watermarks(),
            EventWindows::session(touching),
            |_bid| 1u64,
            |count: &mut u64, _bid| *count += 1,
            |count: &mut u64, other: &u64| *count += *other,
        )
        .name("q11-user-sessions")
        .results()
        .map(|r: WindowResult<i64, u64>| BidderCount {
            bidder: r.key,
            bid_count: r.value,
            start: r.window.start.as_millis(),
            end: r.window.end.as_millis() - 1,
        })
}

/// q12's window.
pub const Q12_WINDOW: Duration = Duration::from_secs(10);

/// Query 12, bids per bidder in processing-time windows: per bidder, the
/// bids of each tumbling 10 s window of processing time (`PROCTIME()`: the
/// time of the batch that reads a bid, from the runtime's clock), emitted
/// by the batch at the window's end. The operator is
/// `q12-processing-time-window`.
pub fn q12(events: &DStream<Event>) -> DStream<BidderCount> {
    events
        .flat_map(|event: Event| event.as_bid().map(|bid| (bid.bidder, 1u64)))
        .processing_time_window(Q12_WINDOW, |a, b| a + b)
        .name("q12-processing-time-window")
        .map(|(window, bidder, bid_count): (Window, i64, u64)| BidderCount {
            bidder,
            bid_count,
            start: window.start.as_millis(),
            end: window.end.as_millis(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{bid, run};

    #[test]
    fn q11_bids_exactly_the_gap_apart_share_a_session() {
        // harness bids: bidder 2000 + price; bidder 2001 throughout.
        let rows = run(
            q11,
            vec![
                vec![vec![bid(1, 1, 1000), bid(1, 1, 11_000), bid(1, 1, 21_001)]],
                // The watermark reaches 45 s: every session is closed.
                vec![vec![bid(9, 2, 49_000)]],
            ],
        );
        let row = |count, start, end| BidderCount { bidder: 2001, bid_count: count, start, end };
        assert_eq!(rows, vec![vec![], vec![row(1, 21_001, 31_001), row(2, 1000, 21_000)]]);
    }
}
