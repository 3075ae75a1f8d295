//! Auctions, and the choice of an auction for a bid.

use super::{EventContext, next_price};
use crate::model::Auction;
use crate::random::SplitMix;
use crate::settings::{FIRST_AUCTION_ID, FIRST_CATEGORY_ID, FIRST_PERSON_ID, GeneratorSettings};

/// Few categories, so that queries find matches on small inputs.
const NUM_CATEGORIES: i32 = 5;
/// Auctions not created yet that a bid may name.
pub(crate) const AUCTION_ID_LEAD: i64 = 10;
/// Hot sellers are the first person of each block of this many.
const HOT_SELLER_RATIO: i64 = 100;

/// The auction the event makes, in the spec's order of draws: seller,
/// category, opening price, length, name, description, reserve, padding.
pub(crate) fn next_auction(cx: &mut EventContext<'_>) -> Auction {
    let config = cx.config;
    let id = config.last_base0_auction_id(cx.event_id) + FIRST_AUCTION_ID;
    let hot_ratio = i32::try_from(config.hot_sellers_ratio).unwrap_or(i32::MAX);
    let seller = if cx.rng.next_int(hot_ratio) > 0 {
        // A hot seller: the first person of the last block of a hundred.
        (config.last_base0_person_id(cx.event_id) / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    } else {
        super::person::next_base0_person_id(config, cx.event_id, &mut cx.rng)
    } + FIRST_PERSON_ID;
    let category = FIRST_CATEGORY_ID + i64::from(cx.rng.next_int(NUM_CATEGORIES));
    let initial_bid = next_price(&mut cx.rng);
    let expires = cx.timestamp + next_auction_length_ms(cx);
    let item_name = cx.string(20);
    let description = cx.string(100);
    let reserve = initial_bid + next_price(&mut cx.rng);
    let size = 8 + item_name.len() + description.len() + 8 + 8 + 8 + 8 + 8;
    let extra = cx.extra(size, config.avg_auction_byte_size);
    Auction {
        id,
        item_name,
        description,
        initial_bid,
        reserve,
        date_time: cx.timestamp,
        expires,
        seller,
        category,
        extra,
    }
}

/// How long the auction runs: uniform in `1..=2h`, where `h` is the event
/// time it takes to create `num_in_flight_auctions` more auctions, so about
/// that many are open at any time.
fn next_auction_length_ms(cx: &mut EventContext<'_>) -> i64 {
    let config = cx.config;
    let number = config.adjusted_event_number(cx.position);
    let events_for_auctions =
        (i64::from(config.num_in_flight_auctions) * config.total_proportion()) / i64::from(config.auction_proportion);
    let future_auction = config.timestamp_for_event(number + events_for_auctions);
    let horizon = future_auction - cx.timestamp;
    1 + cx.rng.next_long((horizon * 2).max(1))
}

/// A random auction id (from 0) for a bid: one of the last
/// `num_in_flight_auctions` auctions, or of the next [`AUCTION_ID_LEAD`].
pub(crate) fn next_base0_auction_id(config: &GeneratorSettings, event_id: i64, rng: &mut SplitMix) -> i64 {
    let max = config.last_base0_auction_id(event_id);
    let min = (max - i64::from(config.num_in_flight_auctions)).max(0);
    min + rng.next_long(max - min + 1 + AUCTION_ID_LEAD)
}
