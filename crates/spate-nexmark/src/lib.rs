//! The Nexmark benchmark for spate: the standard event generator.
//!
//! Nexmark models an online auction: people register, open auctions and
//! bid on them. Its queries (currency conversion, selections, joins of
//! people and auctions, averages per category, hot items over sliding
//! windows, the highest bid per window, …) are how streaming engines are
//! compared. This crate follows the generator of the `nexmark/nexmark`
//! project (the Flink implementation, itself from Apache Beam's), whose
//! published figures are the usual yardstick.
//!
//! # The model
//!
//! An [`Event`] is a [`Person`] (id, name, email, credit card, city, state),
//! an [`Auction`] (id, item name, description, opening and reserve price,
//! expiry, seller, category) or a [`Bid`] (auction, bidder, price, channel,
//! URL). Each has a `date_time` (its event time, milliseconds since the
//! epoch: [`Event::timestamp_ms`]) and an `extra` field of padding that
//! brings it to the spec's average size (200, 500 and 100 bytes).
//!
//! # What is generated
//!
//! The event at position `p` is a pure function of the [`GeneratorConfig`]
//! and `p` ([`NexmarkGenerator::event`]), as in the spec:
//!
//! - kinds cycle in fifties: one person, three auctions, 46 bids;
//! - ids come from the position: a person or auction takes the next id
//!   (from 1000); an auction's seller and a bid's auction and bidder are
//!   "hot" (the first auction of the last block of 100, the first or second
//!   person of the last block of 100) with probability `1 - 1/ratio`
//!   (ratios 2 for auctions, 4 for sellers and bidders), else drawn from the
//!   last 1000 people or last 100 auctions plus up to ten not created yet,
//!   so references almost always name something that exists;
//! - times: the base time plus the event number times `1e6 / rate`
//!   microseconds (10,000 events per second by default), optionally
//!   shuffled within out-of-order groups;
//! - prices `round(10^(6u) * 100)` cents, `u` uniform (one dollar to a
//!   million, log-uniformly); five categories; cities, states and names from
//!   the spec's fixed lists; half of the bids from four hot channels, the
//!   others from `channel-0` to `channel-9999`, each with a fixed URL;
//!   auctions that expire after about as long as it takes to open 100 more.
//!
//! Random choices come from SplitMix64 (the algorithm of the spec's
//! `SplittableRandom`, with the same bounded draws), one stream per event
//! seeded by the config's seed and the event's id, so the same seed gives
//! the same events, in any order and after any restart.
//!
//! Where this differs from the spec's Flink code, and why:
//!
//! - the Flink generator draws from one unseeded random stream per
//!   generator, so its values differ run to run and an event cannot be
//!   made again alone; here each event has its own seeded stream;
//! - its table of channel URLs and its padding text are drawn from unseeded
//!   randoms too; here from the seed;
//! - it adds the first person id to a bid's bidder twice (nexmark/nexmark
//!   issue 30); here once, so bidders are people that exist;
//! - with parallelism `n`, Flink runs `n` generators on `n` interleaved
//!   timelines with disjoint id ranges; here one timeline is cut into
//!   partitions, so the events do not depend on the parallelism.
//!
//! ```
//! use spate_nexmark::{Event, EventKind, GeneratorConfig, NexmarkGenerator};
//!
//! let generator = NexmarkGenerator::new(GeneratorConfig::new(42, 1_700_000_000_000))?;
//! let events = generator.events(0..50);
//! let persons = events.iter().filter(|e| e.kind() == EventKind::Person).count();
//! assert_eq!(persons, 1);
//! let Event::Person(first) = &events[0] else { unreachable!() };
//! assert_eq!(first.id, 1000);
//! // The same config gives the same events, one at a time too.
//! assert_eq!(generator.event(17), events[17]);
//! # Ok::<(), spate_nexmark::NexmarkError>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod config;
mod error;
mod generator;
mod model;
mod random;

pub use config::{FIRST_AUCTION_ID, FIRST_CATEGORY_ID, FIRST_PERSON_ID, GeneratorConfig};
pub use error::NexmarkError;
pub use generator::NexmarkGenerator;
pub use model::{Auction, Bid, Event, EventKind, Person};
