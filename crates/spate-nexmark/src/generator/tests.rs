//! The generator against the spec: proportions, ids, times, determinism,
//! value ranges and sizes, and values worked out by hand from the formulas.

use std::collections::HashMap;

use super::auction::AUCTION_ID_LEAD;
use super::person::PERSON_ID_LEAD;
use super::*;
use crate::model::{Auction, Bid, Person};

const BASE: i64 = 1_700_000_000_000;

fn generator(config: GeneratorSettings) -> NexmarkGenerator {
    NexmarkGenerator::new(config).unwrap()
}

fn default_generator(seed: u64) -> NexmarkGenerator {
    generator(GeneratorSettings::new(seed, BASE))
}

struct Split {
    persons: Vec<(u64, Person)>,
    auctions: Vec<(u64, Auction)>,
    bids: Vec<(u64, Bid)>,
}

fn split(g: &NexmarkGenerator, n: u64) -> Split {
    let mut s = Split { persons: Vec::new(), auctions: Vec::new(), bids: Vec::new() };
    for p in 0..n {
        match g.event(p) {
            Event::Person(x) => s.persons.push((p, x)),
            Event::Auction(x) => s.auctions.push((p, x)),
            Event::Bid(x) => s.bids.push((p, x)),
        }
    }
    s
}

#[test]
fn every_fifty_consecutive_events_are_one_person_three_auctions_and_46_bids() {
    // With the default first id (0) and with the Flink table source's (1,
    // numbers from 1): the kinds cycle on the id, so any 50 in a row match.
    for config in [GeneratorSettings::new(5, BASE), GeneratorSettings::new(5, BASE).with_first_event(1, 1)] {
        let g = generator(config);
        let kinds: Vec<EventKind> = (0..5_000).map(|p| g.event(p).kind()).collect();
        for (start, window) in kinds.windows(50).enumerate() {
            let count = |k| window.iter().filter(|&&w| w == k).count();
            assert_eq!(
                (count(EventKind::Person), count(EventKind::Auction), count(EventKind::Bid)),
                (1, 3, 46),
                "50 events from position {start}"
            );
        }
        assert!((0..5_000).all(|p| g.kind_at(p) == kinds[usize::try_from(p).unwrap()]));
    }
    // Event 0 is the person, 1-3 the auctions, 4-49 the bids.
    let g = default_generator(5);
    assert_eq!(g.event(0).kind(), EventKind::Person);
    assert!((1..4).all(|p| g.event(p).kind() == EventKind::Auction));
    assert!((4..50).all(|p| g.event(p).kind() == EventKind::Bid));
}

#[test]
fn persons_and_auctions_take_consecutive_ids_from_1000() {
    let s = split(&default_generator(1), 10_000);
    assert_eq!(s.persons.len(), 200);
    assert_eq!(s.auctions.len(), 600);
    assert!(s.persons.iter().enumerate().all(|(i, (_, p))| p.id == 1000 + i as i64));
    assert!(s.auctions.iter().enumerate().all(|(i, (_, a))| a.id == 1000 + i as i64));
}

#[test]
fn references_name_people_and_auctions_made_before_or_at_most_ten_ahead() {
    let g = default_generator(2);
    let n = 30_000;
    let s = split(&g, n);
    let person_at: HashMap<i64, u64> = s.persons.iter().map(|(p, x)| (x.id, *p)).collect();
    let auction_at: HashMap<i64, u64> = s.auctions.iter().map(|(p, x)| (x.id, *p)).collect();
    // The highest id made before position p.
    let last_before = |made: &[(u64, i64)], p: u64| {
        let before = made.partition_point(|(q, _)| *q < p);
        before.checked_sub(1).map_or(999, |i| made[i].1)
    };
    let persons: Vec<(u64, i64)> = s.persons.iter().map(|(p, x)| (*p, x.id)).collect();
    let auctions: Vec<(u64, i64)> = s.auctions.iter().map(|(p, x)| (*p, x.id)).collect();

    let (mut earlier, mut total) = (0usize, 0usize);
    let mut check_person = |id: i64, p: u64| {
        assert!(id >= 1000 && id <= last_before(&persons, p) + PERSON_ID_LEAD, "person {id} at position {p}");
        total += 1;
        if person_at.get(&id).is_some_and(|&q| q < p) {
            earlier += 1;
        }
        // Persons come every 50 events: ten ahead is made within 550.
        if p + 600 < n {
            assert!(person_at.get(&id).is_some_and(|&q| q <= p + 550), "person {id} at {p} never made");
        }
    };
    for (p, a) in &s.auctions {
        check_person(a.seller, *p);
    }
    for (p, b) in &s.bids {
        check_person(b.bidder, *p);
    }
    assert!(earlier as f64 > 0.95 * total as f64, "{earlier} of {total} persons existed");

    let mut earlier = 0usize;
    for (p, b) in &s.bids {
        assert!(b.auction >= 1000 && b.auction <= last_before(&auctions, *p) + AUCTION_ID_LEAD, "auction {b:?} at {p}");
        if auction_at.get(&b.auction).is_some_and(|q| q < p) {
            earlier += 1;
        }
        // Three auctions every 50 events: ten ahead is made within 200.
        if p + 250 < n {
            assert!(auction_at.get(&b.auction).is_some_and(|&q| q <= p + 200), "auction {} at {p}", b.auction);
        }
    }
    // Half the bids are for the hot auction; of the rest at most 10 in 111 name one ahead.
    assert!(earlier as f64 > 0.93 * s.bids.len() as f64, "{earlier} of {} auctions existed", s.bids.len());
}

#[test]
fn hot_auctions_sellers_and_bidders_have_the_spec_shares() {
    let g = default_generator(3);
    let config = g.config().clone();
    let s = split(&g, 50_000);
    let share = |hits: usize, of: usize| hits as f64 / of as f64;
    // A hot auction is the first of the last block of 100 auctions; P = 1 - 1/2.
    let hot_auctions = s
        .bids
        .iter()
        .filter(|(p, b)| b.auction == (config.last_base0_auction_id(config.event_id(*p)) / 100) * 100 + 1000)
        .count();
    let hot = share(hot_auctions, s.bids.len());
    assert!((0.48..0.56).contains(&hot), "hot auction share {hot}");
    // A hot bidder is the second person of the last block of 100; P = 1 - 1/4.
    let hot_bidders = s
        .bids
        .iter()
        .filter(|(p, b)| b.bidder == (config.last_base0_person_id(config.event_id(*p)) / 100) * 100 + 1001)
        .count();
    let hot = share(hot_bidders, s.bids.len());
    assert!((0.73..0.79).contains(&hot), "hot bidder share {hot}");
    // A hot seller is the first person of the last block of 100; P = 1 - 1/4.
    let hot_sellers = s
        .auctions
        .iter()
        .filter(|(p, a)| a.seller == (config.last_base0_person_id(config.event_id(*p)) / 100) * 100 + 1000)
        .count();
    let hot = share(hot_sellers, s.auctions.len());
    assert!((0.70..0.82).contains(&hot), "hot seller share {hot}");
    // Hot channels: half the bids, one URL each.
    let mut url_of: HashMap<&str, &str> = HashMap::new();
    for (_, b) in &s.bids {
        assert_eq!(*url_of.entry(&b.channel).or_insert(&b.url), b.url, "channel {} has two URLs", b.channel);
        assert!(b.url.starts_with("https://www.nexmark.com/") && b.url.contains("/item.htm?query=1"), "{}", b.url);
        assert!(HOT_CHANNELS.contains(&b.channel.as_str()) || b.channel.starts_with("channel-"), "{}", b.channel);
    }
    let hot_channel = s.bids.iter().filter(|(_, b)| HOT_CHANNELS.contains(&b.channel.as_str())).count();
    let hot = share(hot_channel, s.bids.len());
    assert!((0.47..0.53).contains(&hot), "hot channel share {hot}");
    // Nine in ten other channels carry a channel id in their URL.
    let others: Vec<&str> = url_of.iter().filter(|(c, _)| c.starts_with("channel-")).map(|(_, u)| *u).collect();
    let with_id = share(others.iter().filter(|u| u.contains("&channel_id=")).count(), others.len());
    assert!((0.85..0.95).contains(&with_id), "channel id share {with_id}");
}

#[test]
fn times_are_the_base_plus_the_event_number_times_the_delay_and_never_decrease() {
    // 10,000 events a second: 100 us apart, so number n is at BASE + n / 10 ms.
    let g = default_generator(4);
    let mut last = i64::MIN;
    for p in 0..5_000u64 {
        let t = g.event(p).timestamp_ms();
        assert_eq!(t, BASE + i64::try_from(p / 10).unwrap(), "position {p}");
        assert_eq!(t, g.emit_time_ms(p));
        assert_eq!(t, g.watermark_ms(p));
        assert!(t >= last);
        last = t;
    }
    // With the Flink table source's first number (1), position 0 is number 1.
    let g = generator(GeneratorSettings::new(4, BASE).with_first_event(1, 1).with_rate(1000.0));
    assert_eq!(g.event(0).timestamp_ms(), BASE + 1);
}

#[test]
fn out_of_order_groups_keep_times_above_the_watermark() {
    let g = generator(GeneratorSettings::new(6, BASE).with_rate(100.0).with_out_of_order_group_size(16));
    let mut watermark = i64::MIN;
    let mut out_of_order = 0;
    for p in 0..1_600u64 {
        let (t, w) = (g.event(p).timestamp_ms(), g.watermark_ms(p));
        assert!(w >= watermark, "watermark went back at {p}");
        assert!(t >= w, "position {p}: time {t} below the watermark {w}");
        // 100 events a second: 10 ms apart, so a group of 16 spans 150 ms.
        assert!(t <= w + 150, "position {p}: time {t} beyond its group");
        if p > 0 && t < g.event(p - 1).timestamp_ms() {
            out_of_order += 1;
        }
        watermark = w;
    }
    assert!(out_of_order > 100, "only {out_of_order} events out of order");
    // Within a group, the times are a shuffle of the in-order times.
    let mut times: Vec<i64> = (32..48).map(|p| g.event(p).timestamp_ms()).collect();
    times.sort_unstable();
    assert_eq!(times, (32..48).map(|n| BASE + n * 10).collect::<Vec<_>>());
}

#[test]
fn the_same_seed_gives_the_same_events_in_any_order_and_another_seed_others() {
    let a = default_generator(11);
    let b = default_generator(11);
    let forward: Vec<Event> = (0..2_000).map(|p| a.event(p)).collect();
    let backward: Vec<Event> = (0..2_000).rev().map(|p| b.event(p)).collect();
    assert!(forward.iter().eq(backward.iter().rev()));
    assert_eq!(a.events(500..700), forward[500..700].to_vec());
    let other = default_generator(12);
    let differ = (0..2_000).filter(|&p| other.event(p) != forward[usize::try_from(p).unwrap()]).count();
    assert!(differ > 1_900, "only {differ} of 2000 events differ with another seed");
    // The bound only cuts ranges; it never changes an event.
    let bounded = generator(GeneratorSettings::new(11, BASE).with_max_events(1_000));
    assert_eq!(bounded.events(900..2_000), forward[900..1_000].to_vec());
    assert_eq!(bounded.event(1_500), forward[1_500]);
}

#[test]
fn fields_stay_in_the_spec_ranges_and_lists() {
    let s = split(&default_generator(8), 20_000);
    for (_, p) in &s.persons {
        let (first, last) = p.name.split_once(' ').unwrap();
        assert!(super::person::FIRST_NAMES.contains(&first), "{}", p.name);
        assert!(super::person::LAST_NAMES.contains(&last), "{}", p.name);
        assert!(super::person::US_CITIES.contains(&p.city.as_str()), "{}", p.city);
        assert!(super::person::US_STATES.contains(&p.state.as_str()), "{}", p.state);
        let groups: Vec<&str> = p.credit_card.split(' ').collect();
        assert!(groups.len() == 4 && groups.iter().all(|g| g.len() == 4 && g.bytes().all(|b| b.is_ascii_digit())));
        let (user, domain) = p.email_address.split_once('@').unwrap();
        // Strings of 3 to 6 (or 4) characters, blanks trimmed.
        assert!(domain.ends_with(".com") && domain.len() <= 8 && user.len() <= 6, "{}", p.email_address);
    }
    for (p, a) in &s.auctions {
        assert!((10..=14).contains(&a.category));
        assert!((100..=100_000_000).contains(&a.initial_bid), "{}", a.initial_bid);
        assert!(a.reserve >= a.initial_bid + 100 && a.reserve <= a.initial_bid + 100_000_000);
        assert!(a.item_name.len() <= 19 && a.description.len() <= 99);
        // The auction lasts 1 ms to twice the time 1666 more events take
        // (100 in flight * 50 / 3), i.e. 166.6 ms at 10,000 a second.
        let number = i64::try_from(*p).unwrap();
        let horizon = (BASE + (number + 1666) / 10) - a.date_time;
        let length = a.expires - a.date_time;
        assert!(length >= 1 && length <= 2 * horizon, "auction at {p} lasts {length} ms, horizon {horizon}");
    }
    for (_, b) in &s.bids {
        assert!((100..=100_000_000).contains(&b.price), "{}", b.price);
    }
    // Prices are log-uniform: about a sixth of them in each decade.
    let cheap = s.bids.iter().filter(|(_, b)| b.price < 1_000).count() as f64 / s.bids.len() as f64;
    assert!((0.15..0.19).contains(&cheap), "share below $10: {cheap}");
    let categories: std::collections::BTreeSet<i64> = s.auctions.iter().map(|(_, a)| a.category).collect();
    assert_eq!(categories.len(), 5);
}

#[test]
fn padding_brings_events_to_the_spec_average_sizes() {
    let s = split(&default_generator(9), 50_000);
    let mean = |sizes: Vec<usize>| sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    let person = mean(
        s.persons
            .iter()
            .map(|(_, p)| {
                8 + p.name.len()
                    + p.email_address.len()
                    + p.credit_card.len()
                    + p.city.len()
                    + p.state.len()
                    + p.extra.len()
            })
            .collect(),
    );
    assert!((195.0..205.0).contains(&person), "person {person}");
    let auction =
        mean(s.auctions.iter().map(|(_, a)| 48 + a.item_name.len() + a.description.len() + a.extra.len()).collect());
    assert!((495.0..505.0).contains(&auction), "auction {auction}");
    // A bid's 32 bytes of numbers get 68 +- 14 bytes of padding.
    assert!(s.bids.iter().all(|(_, b)| (54..=81).contains(&b.extra.len())));
    let bid = mean(s.bids.iter().map(|(_, b)| 32 + b.extra.len()).collect());
    assert!((99.0..101.0).contains(&bid), "bid {bid}");
}

#[test]
fn values_worked_out_by_hand_from_the_formulas() {
    let g = default_generator(21);
    // Position 1050 has id 1050 = 21 * 50 + 0: the 22nd person, id 1021,
    // at BASE + 1050 * 100 us = BASE + 105 ms.
    let Event::Person(p) = g.event(1050) else { panic!("position 1050 is not a person") };
    assert_eq!((p.id, p.date_time), (1021, BASE + 105));
    // Position 1053 has offset 3 in cycle 21: the auction 21 * 3 + 2 =
    // 65, id 1065, at 105.3 ms, truncated to 105.
    let Event::Auction(a) = g.event(1053) else { panic!("position 1053 is not an auction") };
    assert_eq!((a.id, a.date_time), (1065, BASE + 105));
    // Its seller: hot is (21 / 100) * 100 = person 0 (id 1000); otherwise
    // one of the 22 people made plus 10 ahead: base0 0 to 31.
    assert!(a.seller == 1000 || (1000..=1031).contains(&a.seller), "seller {}", a.seller);
    // Position 1049 is the last bid of cycle 20: the last auction is
    // 20 * 3 + 2 = 62 and the last person 20. The hot auction is (62 /
    // 100) * 100 = 0 (id 1000), else one of auctions 0..=62 plus 10 ahead;
    // the hot bidder (20 / 100) * 100 + 1 = 1 (id 1001), else one of
    // persons 0..=20 plus 10 ahead.
    let Event::Bid(b) = g.event(1049) else { panic!("position 1049 is not a bid") };
    assert!((1000..=1072).contains(&b.auction), "auction {}", b.auction);
    assert!((1000..=1030).contains(&b.bidder), "bidder {}", b.bidder);
    assert_eq!(b.date_time, BASE + 104);
    // The Flink table source starts ids and numbers at 1: position 0 is id
    // 2, an auction, id 1000 + (2 - 1) = 1001, at BASE + 0.1 ms = BASE.
    let flink = generator(GeneratorSettings::new(21, BASE).with_first_event(1, 1));
    let Event::Auction(a) = flink.event(0) else { panic!("Flink's first event is not an auction") };
    assert_eq!((a.id, a.date_time), (1001, BASE));
    // Its position 48 is id 50, the second person (1001), number 49 at 4.9 ms.
    let Event::Person(p) = flink.event(48) else { panic!("Flink's position 48 is not a person") };
    assert_eq!((p.id, p.date_time), (1001, BASE + 4));
    // 3 events a second: number 7 is at 7 * 333333.33 us, truncated to
    // 2333333 us, then divided: 2333 ms.
    let slow = generator(GeneratorSettings::new(21, BASE).with_rate(3.0));
    assert_eq!(slow.event(7).timestamp_ms(), BASE + 2333);
}

#[test]
fn prices_follow_the_formula_for_a_known_draw() {
    // SplitMix64's first output for seed 0 is 0xe220a8397b1dcdaf; its top
    // 53 bits over 2^53 are u = 0.8833108082136426, and
    // round(10^(6u) * 100) = round(19946414.9386...) = 19946415 cents.
    assert_eq!(next_price(&mut SplitMix::new(0)), 19_946_415);
}

/// Java's `String.hashCode`, for checksums shared with the spec's code.
fn java_hash(s: &str) -> i64 {
    i64::from(s.encode_utf16().fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u))))
}

/// A checksum of every field of the first `n` events that does not depend
/// on the spec's unseeded tables (URL texts and padding texts: their
/// lengths are included), folded as `c * 31 + v` in wrapping 64-bit.
fn checksum(g: &NexmarkGenerator, n: u64) -> i64 {
    let mut c = 0i64;
    let mut add = |v: i64| c = c.wrapping_mul(31).wrapping_add(v);
    for p in 0..n {
        match g.event(p) {
            Event::Person(x) => {
                for v in [x.id, java_hash(&x.name), java_hash(&x.email_address), java_hash(&x.credit_card)] {
                    add(v);
                }
                for v in [java_hash(&x.city), java_hash(&x.state), x.date_time, x.extra.len() as i64] {
                    add(v);
                }
            }
            Event::Auction(x) => {
                for v in [x.id, java_hash(&x.item_name), java_hash(&x.description), x.initial_bid, x.reserve] {
                    add(v);
                }
                for v in [x.date_time, x.expires, x.seller, x.category, x.extra.len() as i64] {
                    add(v);
                }
            }
            Event::Bid(x) => {
                for v in [x.auction, x.bidder, x.price, java_hash(&x.channel), x.date_time, x.extra.len() as i64] {
                    add(v);
                }
            }
        }
    }
    c
}

/// The spec's own Java generator classes (`PersonGenerator`,
/// `AuctionGenerator`, `BidGenerator`, `GeneratorSettings` of nexmark/nexmark,
/// run on Java 17), each event given a `new SplittableRandom` seeded as
/// [`SplitMix::for_event`] seeds it, produced these checksums over 100,000
/// events (with one `FIRST_PERSON_ID` taken off its bidders, issue 30), and
/// these events. So every id, name, price, time, expiry, channel and
/// padding length here is the spec's.
#[test]
fn events_match_the_spec_code_driven_by_the_same_random_streams() {
    let g = generator(GeneratorSettings::new(7, 1_700_000_000_000));
    assert_eq!(checksum(&g, 100_000), -1_143_125_591_896_855_870);
    let ooo =
        generator(GeneratorSettings::new(3, 1_600_000_000_000).with_rate(1000.0).with_out_of_order_group_size(16));
    assert_eq!(checksum(&ooo, 100_000), 906_683_639_615_237_016);

    // 0 P 1000 John Walton|dmct@szh.com|0091 4736 7763 9919|San Francisco|CA|1700000000000|153
    let Event::Person(p) = g.event(0) else { panic!("not a person") };
    assert_eq!(
        (p.id, p.name.as_str(), p.email_address.as_str(), p.credit_card.as_str(), p.city.as_str(), p.state.as_str()),
        (1000, "John Walton", "dmct@szh.com", "0091 4736 7763 9919", "San Francisco", "CA")
    );
    assert_eq!((p.date_time, p.extra.len()), (1_700_000_000_000, 153));
    // 2 A 1001 vbllyh|43479567|43670126|1700000000000|1700000000290|1004|11|398
    let Event::Auction(a) = g.event(2) else { panic!("not an auction") };
    assert_eq!((a.id, a.item_name.as_str(), a.initial_bid, a.reserve), (1001, "vbllyh", 43_479_567, 43_670_126));
    assert_eq!(
        (a.date_time, a.expires, a.seller, a.category, a.extra.len()),
        (1_700_000_000_000, 1_700_000_000_290, 1004, 11, 398)
    );
    // 5 B 1000 1001|3660511|Apple|1700000000000|75
    let Event::Bid(b) = g.event(5) else { panic!("not a bid") };
    assert_eq!(
        (b.auction, b.bidder, b.price, b.channel.as_str(), b.date_time, b.extra.len()),
        (1000, 1001, 3_660_511, "Apple", 1_700_000_000_000, 75)
    );
    // 1053 A 1065 nph mragfhgoexyhgpu|2272|2420862|1700000000105|1700000000349|1003|13|358
    let Event::Auction(a) = g.event(1053) else { panic!("not an auction") };
    assert_eq!((a.id, a.item_name.as_str(), a.initial_bid, a.reserve), (1065, "nph mragfhgoexyhgpu", 2272, 2_420_862));
    assert_eq!((a.expires, a.seller, a.category, a.extra.len()), (1_700_000_000_349, 1003, 13, 358));
    // Out of order: position 1 is number 953 mod 16 = 9, a bid.
    // 1 B 1002 1001|7708734|Google|1600000000009|67
    let Event::Bid(b) = ooo.event(1) else { panic!("not a bid") };
    assert_eq!(
        (b.auction, b.bidder, b.price, b.channel.as_str(), b.date_time, b.extra.len()),
        (1002, 1001, 7_708_734, "Google", 1_600_000_000_009, 67)
    );
}
