//! Query 13, bounded side input join: every bid joined with the row of a
//! bounded table whose key is the bid's auction modulo 10,000.
//!
//! The spec reads the table from a file of `key,value` lines (written by
//! its `SideInputGenerator`: `i,i` for `i` in `0..n`) through a lookup join
//! `FOR SYSTEM_TIME AS OF` the bid's processing time. The file does not
//! change while the query runs, so here it is loaded once, before the
//! stream starts, into a [`SideInput`], and each bid is looked up in it.

use serde::{Deserialize, Serialize};
use spate_dstream::{DStream, SideInput};

use crate::error::NexmarkError;
use crate::model::{Bid, Event};

/// The modulus of q13's key: `mod(B.auction, 10000) = S.key`.
pub const Q13_KEY_MODULUS: i64 = 10_000;

/// q13's table: `key,value` rows.
pub type Q13SideInput = SideInput<i64, String>;

/// The table the spec's generator writes: `n` rows `i,i`.
pub fn q13_side_input(n: i64) -> Q13SideInput {
    SideInput::from_rows((0..n).map(|i| (i, i.to_string())))
}

/// The table of a side-input file's text: one `key,value` line a row (the
/// value is the rest of the line after the first comma); blank lines are
/// skipped. A line without a comma or whose key is not an integer is an
/// error naming the line.
pub fn q13_side_input_from_text(text: &str) -> Result<Q13SideInput, NexmarkError> {
    let mut rows = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: &str| NexmarkError::BadSideInput { line: index + 1, reason: reason.to_string() };
        let (key, value) = line.split_once(',').ok_or_else(|| bad("no comma between key and value"))?;
        let key: i64 = key.trim().parse().map_err(|_| bad("the key is not an integer"))?;
        rows.push((key, value.to_string()));
    }
    Ok(SideInput::from_rows(rows))
}

/// A row of q13.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q13Row {
    /// The auction bid on.
    pub auction: i64,
    /// The bidder.
    pub bidder: i64,
    /// The price, in cents.
    pub price: i64,
    /// The bid's time, in milliseconds.
    pub date_time: i64,
    /// The side input's value for the bid's key.
    pub value: String,
}

/// The key a bid looks up: `mod(auction, 10000)`, with the sign of the
/// auction as SQL's `MOD` has it.
pub fn q13_key(bid: &Bid) -> i64 {
    bid.auction % Q13_KEY_MODULUS
}

/// Query 13, bounded side input join: every bid whose key the table has,
/// with the table's value (bids whose key it lacks are dropped, as the
/// spec's inner join drops them).
pub fn q13(events: &DStream<Event>, side: &Q13SideInput) -> DStream<Q13Row> {
    events.flat_map(Event::into_bid).join_side_input(
        side,
        |bid: &Bid| Some(q13_key(bid)),
        |bid: Bid, value: &String| Q13Row {
            auction: bid.auction,
            bidder: bid.bidder,
            price: bid.price,
            date_time: bid.date_time,
            value: value.clone(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_input_file_reads_key_value_lines_and_names_a_bad_line() {
        let side = q13_side_input_from_text("0,zero\n\n7,seven,7\r\n").unwrap();
        assert_eq!((side.len(), side.get(&7).map(String::as_str)), (2, Some("seven,7")));
        let err = q13_side_input_from_text("1,a\nx,b\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(q13_side_input_from_text("1;a").is_err());
        assert_eq!(q13_side_input(3).get(&2).map(String::as_str), Some("2"));
    }
}
