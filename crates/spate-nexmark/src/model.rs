//! The Nexmark data model: an online auction's persons, auctions and bids.
//!
//! Field names and meanings are the spec's (`Person`, `Auction`, `Bid` of
//! the `nexmark/nexmark` project); times are milliseconds since the epoch
//! and prices are in cents.

use serde::{Deserialize, Serialize};

use crate::text::SharedStr;

/// A new person registers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Person {
    /// The person's id (from 1000).
    pub id: i64,
    /// First and last name, from the spec's fixed lists.
    pub name: String,
    /// A random address `xxx@yyy.com`.
    pub email_address: String,
    /// Four groups of four digits.
    pub credit_card: String,
    /// A city from the spec's fixed list.
    pub city: String,
    /// A US state from the spec's fixed list.
    pub state: String,
    /// When the person registered (event time), in milliseconds.
    pub date_time: i64,
    /// Padding to the configured average size: a slice of the generator's
    /// padding text, shared.
    pub extra: SharedStr,
}

/// A new auction opens.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// The auction's id (from 1000).
    pub id: i64,
    /// The item's name.
    pub item_name: String,
    /// The item's description.
    pub description: String,
    /// The opening price, in cents.
    pub initial_bid: i64,
    /// The reserve price, in cents (at least the opening price).
    pub reserve: i64,
    /// When the auction opened (event time), in milliseconds.
    pub date_time: i64,
    /// When the auction closes, in milliseconds: bids at or after it are
    /// ignored.
    pub expires: i64,
    /// The person selling (a [`Person::id`]).
    pub seller: i64,
    /// The category (10 to 14).
    pub category: i64,
    /// Padding to the configured average size: a slice of the generator's
    /// padding text, shared.
    pub extra: SharedStr,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bid {
    /// The auction bid on (an [`Auction::id`]).
    pub auction: i64,
    /// The person bidding (a [`Person::id`]).
    pub bidder: i64,
    /// The price, in cents.
    pub price: i64,
    /// Where the bid came from: one of four hot channels or `channel-N`
    /// (shared with the generator's table of channels).
    pub channel: SharedStr,
    /// The URL the bid came from, fixed per channel (shared likewise).
    pub url: SharedStr,
    /// When the bid was made (event time), in milliseconds.
    pub date_time: i64,
    /// Padding to the configured average size: a slice of the generator's
    /// padding text, shared.
    pub extra: SharedStr,
}

/// One Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Event {
    /// A person registers.
    Person(Person),
    /// An auction opens.
    Auction(Auction),
    /// A bid is made.
    Bid(Bid),
}

/// The kind of an [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventKind {
    /// A [`Person`].
    Person,
    /// An [`Auction`].
    Auction,
    /// A [`Bid`].
    Bid,
}

impl Event {
    /// The event's time, in milliseconds since the epoch: the `date_time`
    /// of the person, auction or bid (what the spec's tables use as their
    /// event-time column).
    pub fn timestamp_ms(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }

    /// The kind of event.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Person(_) => EventKind::Person,
            Event::Auction(_) => EventKind::Auction,
            Event::Bid(_) => EventKind::Bid,
        }
    }

    /// The bid, if the event is one.
    pub fn as_bid(&self) -> Option<&Bid> {
        match self {
            Event::Bid(b) => Some(b),
            _ => None,
        }
    }

    /// The bid, if the event is one, by value.
    pub fn into_bid(self) -> Option<Bid> {
        match self {
            Event::Bid(b) => Some(b),
            _ => None,
        }
    }
}
