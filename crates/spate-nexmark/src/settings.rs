//! What the generator makes: proportions, rate, sizes, skew, and the
//! arithmetic that maps an event's position to its number, id and time.
//!
//! The defaults are the Nexmark benchmark's (`NexmarkConfiguration` of the
//! `nexmark/nexmark` project): per 50 events 1 person, 3 auctions and 46
//! bids; 10,000 events per second; persons of about 200 bytes, auctions of
//! 500 and bids of 100; hot auctions, sellers and bidders at ratios 2, 4 and
//! 4; 100 auctions in flight; 1,000 active people; no out-of-order groups.

use serde::{Deserialize, Serialize};

use crate::error::NexmarkError;

/// The first auction id (the spec starts ids here so that queries find
/// matches even on small inputs).
pub const FIRST_AUCTION_ID: i64 = 1000;
/// The first person id.
pub const FIRST_PERSON_ID: i64 = 1000;
/// The first category id.
pub const FIRST_CATEGORY_ID: i64 = 10;

/// The parameters of a [`NexmarkGenerator`](crate::NexmarkGenerator).
///
/// Everything generated is a function of this and an event's position, so
/// the same config always yields the same events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GeneratorSettings {
    /// Seeds every random choice.
    pub seed: u64,
    /// Event time of event number 0, in milliseconds since the epoch.
    pub base_time_ms: i64,
    /// Added to an event's number to give its id (the id decides the kind
    /// and seeds the event's random choices). The spec's Flink table source
    /// uses 1; 0 (the default) makes event 0 a person.
    pub first_event_id: i64,
    /// The number of the event at position 0. The number decides the
    /// event's time. The spec's Flink table source uses 1.
    pub first_event_number: i64,
    /// Events per second of event time (the spec's `firstEventRate`).
    pub events_per_second: f64,
    /// Generators sharing the rate (the spec's `numEventGenerators`): each
    /// event's delay is multiplied by this.
    pub num_event_generators: u32,
    /// Persons per `total_proportion` events.
    pub person_proportion: u32,
    /// Auctions per `total_proportion` events.
    pub auction_proportion: u32,
    /// Bids per `total_proportion` events.
    pub bid_proportion: u32,
    /// Average size a person aims at, in the spec's idealised bytes; the
    /// `extra` field pads to it.
    pub avg_person_byte_size: u32,
    /// Average size an auction aims at.
    pub avg_auction_byte_size: u32,
    /// Average size a bid aims at.
    pub avg_bid_byte_size: u32,
    /// A bid is for a hot auction with probability `1 - 1/ratio`.
    pub hot_auction_ratio: u32,
    /// An auction is by a hot seller with probability `1 - 1/ratio`.
    pub hot_sellers_ratio: u32,
    /// A bid is by a hot bidder with probability `1 - 1/ratio`.
    pub hot_bidders_ratio: u32,
    /// Auctions in flight on average; bids pick among the last this many,
    /// and auctions last about as long as it takes to create this many.
    pub num_in_flight_auctions: u32,
    /// Auctions and bids pick people among the last this many.
    pub num_active_people: u32,
    /// Events in a group whose order is shuffled; 1 keeps event times in
    /// order.
    pub out_of_order_group_size: u32,
    /// How many events there are; `None` for no end.
    pub max_events: Option<u64>,
}

impl Default for GeneratorSettings {
    fn default() -> Self {
        GeneratorSettings {
            seed: 0,
            base_time_ms: 0,
            first_event_id: 0,
            first_event_number: 0,
            events_per_second: 10_000.0,
            num_event_generators: 1,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            avg_person_byte_size: 200,
            avg_auction_byte_size: 500,
            avg_bid_byte_size: 100,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
            num_in_flight_auctions: 100,
            num_active_people: 1000,
            out_of_order_group_size: 1,
            max_events: None,
        }
    }
}

impl GeneratorSettings {
    /// The spec's defaults with this seed and base time.
    pub fn new(seed: u64, base_time_ms: i64) -> Self {
        GeneratorSettings { seed, base_time_ms, ..GeneratorSettings::default() }
    }

    /// With this rate, in events per second of event time.
    pub fn with_rate(mut self, events_per_second: f64) -> Self {
        self.events_per_second = events_per_second;
        self
    }

    /// With this many events in all.
    pub fn with_max_events(mut self, max_events: u64) -> Self {
        self.max_events = Some(max_events);
        self
    }

    /// With out-of-order groups of this many events.
    pub fn with_out_of_order_group_size(mut self, size: u32) -> Self {
        self.out_of_order_group_size = size;
        self
    }

    /// With these first event id and number (the spec's Flink table source
    /// starts both at 1).
    pub fn with_first_event(mut self, id: i64, number: i64) -> Self {
        self.first_event_id = id;
        self.first_event_number = number;
        self
    }

    /// Refuses what the formulas cannot work with, naming the field.
    pub fn validate(&self) -> Result<(), NexmarkError> {
        let invalid =
            |field: &'static str, reason: &str| Err(NexmarkError::InvalidConfig { field, reason: reason.to_string() });
        if !(self.events_per_second.is_finite() && self.events_per_second > 0.0) {
            return invalid("events_per_second", "must be a positive number");
        }
        let at_least_one = [
            ("num_event_generators", self.num_event_generators),
            ("person_proportion", self.person_proportion),
            ("auction_proportion", self.auction_proportion),
            ("hot_auction_ratio", self.hot_auction_ratio),
            ("hot_sellers_ratio", self.hot_sellers_ratio),
            ("hot_bidders_ratio", self.hot_bidders_ratio),
            ("out_of_order_group_size", self.out_of_order_group_size),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return invalid(field, "must be at least 1");
        }
        let ratios = [self.hot_auction_ratio, self.hot_sellers_ratio, self.hot_bidders_ratio];
        if ratios.iter().any(|&r| i32::try_from(r).is_err()) {
            return invalid("hot_*_ratio", "must fit a 32-bit signed integer");
        }
        if self.out_of_order_group_size.is_multiple_of(953) {
            // The shuffle multiplies by 953; a multiple of it would map a
            // whole group to one number.
            return invalid("out_of_order_group_size", "must not be a multiple of 953");
        }
        if self.first_event_id < 0 || self.first_event_number < 0 {
            return invalid("first_event_id/first_event_number", "must not be negative");
        }
        Ok(())
    }

    /// Events per proportion cycle (50 with the defaults).
    pub fn total_proportion(&self) -> i64 {
        i64::from(self.person_proportion) + i64::from(self.auction_proportion) + i64::from(self.bid_proportion)
    }

    /// Microseconds between consecutive event numbers.
    pub fn inter_event_delay_us(&self) -> f64 {
        1_000_000.0 / self.events_per_second * f64::from(self.num_event_generators)
    }

    /// The event number of the event at `position` (the spec's
    /// `nextEventNumber`).
    pub fn event_number(&self, position: u64) -> i64 {
        self.first_event_number.saturating_add(i64::try_from(position).unwrap_or(i64::MAX))
    }

    /// The number the event at `position` takes its id and time from: its
    /// own number shuffled within its out-of-order group (the spec's
    /// `nextAdjustedEventNumber`: the group's base plus `number * 953 mod
    /// group size`).
    pub fn adjusted_event_number(&self, position: u64) -> i64 {
        let n = i64::from(self.out_of_order_group_size);
        let number = self.event_number(position);
        (number / n) * n + number.wrapping_mul(953) % n
    }

    /// The number whose time bounds the times of this and every later event
    /// (the spec's `nextEventNumberForWatermark`: the group's base).
    pub fn watermark_event_number(&self, position: u64) -> i64 {
        let n = i64::from(self.out_of_order_group_size);
        (self.event_number(position) / n) * n
    }

    /// The event time of event number `number`: the base time plus the
    /// number times the inter-event delay, the microseconds truncated to a
    /// whole number before they are divided into milliseconds (the spec's
    /// `timestampForEvent`).
    pub fn timestamp_for_event(&self, number: i64) -> i64 {
        let micros = (number as f64 * self.inter_event_delay_us()) as i64;
        self.base_time_ms.saturating_add(micros / 1000)
    }

    /// The id of the event at `position`.
    pub fn event_id(&self, position: u64) -> i64 {
        self.first_event_id.saturating_add(self.adjusted_event_number(position))
    }

    /// The last person id (from 0) made at or before event id `event_id`;
    /// the id of the person `event_id` makes if it makes one.
    pub fn last_base0_person_id(&self, event_id: i64) -> i64 {
        let total = self.total_proportion();
        let persons = i64::from(self.person_proportion);
        let epoch = event_id / total;
        let offset = (event_id % total).min(persons - 1);
        epoch * persons + offset
    }

    /// The last auction id (from 0) made at or before event id `event_id`;
    /// the id of the auction `event_id` makes if it makes one. Before the
    /// first auction this is -1.
    pub fn last_base0_auction_id(&self, event_id: i64) -> i64 {
        let total = self.total_proportion();
        let persons = i64::from(self.person_proportion);
        let auctions = i64::from(self.auction_proportion);
        let mut epoch = event_id / total;
        let mut offset = event_id % total;
        if offset < persons {
            // A person: the last auction is the previous cycle's last.
            epoch -= 1;
            offset = auctions - 1;
        } else if offset >= persons + auctions {
            // A bid: the last auction is this cycle's last.
            offset = auctions - 1;
        } else {
            offset -= persons;
        }
        epoch * auctions + offset
    }

    /// What kind of event id `event_id` is.
    pub fn kind_of(&self, event_id: i64) -> crate::EventKind {
        let rem = event_id % self.total_proportion();
        if rem < i64::from(self.person_proportion) {
            crate::EventKind::Person
        } else if rem < i64::from(self.person_proportion) + i64::from(self.auction_proportion) {
            crate::EventKind::Auction
        } else {
            crate::EventKind::Bid
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_ids_follow_the_cycle_of_fifty() {
        let c = GeneratorSettings::default();
        // Event 0 is the first person; events 1-3 auctions 0-2; 4-49 bids.
        assert_eq!(c.last_base0_person_id(0), 0);
        assert_eq!(c.last_base0_person_id(49), 0);
        assert_eq!(c.last_base0_person_id(50), 1);
        assert_eq!(c.last_base0_person_id(1049), 20);
        assert_eq!(c.last_base0_auction_id(0), -1);
        assert_eq!(c.last_base0_auction_id(1), 0);
        assert_eq!(c.last_base0_auction_id(3), 2);
        assert_eq!(c.last_base0_auction_id(4), 2);
        assert_eq!(c.last_base0_auction_id(50), 2);
        assert_eq!(c.last_base0_auction_id(51), 3);
        assert_eq!(c.last_base0_auction_id(1049), 62);
    }

    #[test]
    fn timestamps_truncate_microseconds_then_divide() {
        // 3 events per second: 333333.33 us apart; number 7 is at
        // 2333333.33 us, truncated to 2333333 us, i.e. 2333 ms.
        let c = GeneratorSettings::new(0, 1_000).with_rate(3.0);
        assert_eq!(c.timestamp_for_event(7), 1_000 + 2_333);
        let c = GeneratorSettings::new(0, 0);
        assert_eq!(c.inter_event_delay_us(), 100.0);
        assert_eq!(c.timestamp_for_event(19), 1);
        assert_eq!(c.timestamp_for_event(20), 2);
    }

    #[test]
    fn out_of_order_groups_shuffle_within_the_group() {
        let c = GeneratorSettings::new(0, 0).with_out_of_order_group_size(10);
        let mut numbers: Vec<i64> = (20..30).map(|p| c.adjusted_event_number(p)).collect();
        // 21 * 953 = 20013, 20013 mod 10 = 3: position 21 takes number 23.
        assert_eq!(numbers[1], 23);
        numbers.sort_unstable();
        assert_eq!(numbers, (20..30).collect::<Vec<_>>());
        assert!((20..30).all(|p| c.watermark_event_number(p) == 20));
    }

    #[test]
    fn validation_names_the_field() {
        let err = GeneratorSettings { auction_proportion: 0, ..GeneratorSettings::default() }.validate().unwrap_err();
        assert!(err.to_string().contains("auction_proportion"), "{err}");
        let err = GeneratorSettings::default().with_rate(0.0).validate().unwrap_err();
        assert!(err.to_string().contains("events_per_second"), "{err}");
        let err = GeneratorSettings::default().with_out_of_order_group_size(953).validate().unwrap_err();
        assert!(err.to_string().contains("953"), "{err}");
        GeneratorSettings::default().validate().unwrap();
    }
}
