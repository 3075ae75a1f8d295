//! Bids.

use super::auction::next_base0_auction_id;
use super::person::next_base0_person_id;
use super::{EventContext, HOT_CHANNELS, Tables, next_price};
use crate::model::Bid;
use crate::settings::{FIRST_AUCTION_ID, FIRST_PERSON_ID};
use crate::text::SharedStr;

/// Hot auctions are the first of each block of this many.
const HOT_AUCTION_RATIO: i64 = 100;
/// Hot bidders are the second person of each block of this many (so that
/// they are not the hot sellers).
const HOT_BIDDER_RATIO: i64 = 100;
/// One bid in this many comes from a channel that is not hot.
const HOT_CHANNELS_RATIO: i32 = 2;

/// The bid the event makes, in the spec's order of draws: auction,
/// bidder, price, channel, padding.
///
/// The spec's Flink code adds the first person id to the bidder twice
/// (nexmark/nexmark issue 30), which names people a thousand ids ahead of
/// any created; it is added once here, as the Beam original and the
/// code's own comments intend.
pub(crate) fn next_bid(cx: &mut EventContext<'_>, tables: &'static Tables) -> Bid {
    let config = cx.config;
    let hot_auctions = i32::try_from(config.hot_auction_ratio).unwrap_or(i32::MAX);
    let auction = if cx.rng.next_int(hot_auctions) > 0 {
        (config.last_base0_auction_id(cx.event_id) / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    } else {
        next_base0_auction_id(config, cx.event_id, &mut cx.rng)
    } + FIRST_AUCTION_ID;
    let hot_bidders = i32::try_from(config.hot_bidders_ratio).unwrap_or(i32::MAX);
    let bidder = if cx.rng.next_int(hot_bidders) > 0 {
        (config.last_base0_person_id(cx.event_id) / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    } else {
        next_base0_person_id(config, cx.event_id, &mut cx.rng)
    } + FIRST_PERSON_ID;
    let price = next_price(&mut cx.rng);
    // Channel and URL refer to the tables, which the process keeps.
    let (channel, url): (&'static str, &'static str) = if cx.rng.next_int(HOT_CHANNELS_RATIO) > 0 {
        let i = usize::try_from(cx.rng.next_int(HOT_CHANNELS.len() as i32)).unwrap_or(0);
        (HOT_CHANNELS[i % HOT_CHANNELS.len()], &tables.hot_urls[i % tables.hot_urls.len()])
    } else {
        let n = usize::try_from(cx.rng.next_int(tables.channels.len() as i32)).unwrap_or(0);
        tables.channels.get(n).map_or(("", ""), |(channel, url)| (channel, url))
    };
    let (channel, url) = (SharedStr::from_static(channel), SharedStr::from_static(url));
    let extra = cx.extra(8 + 8 + 8 + 8, config.avg_bid_byte_size);
    Bid { auction, bidder, price, channel, url, date_time: cx.timestamp, extra }
}
