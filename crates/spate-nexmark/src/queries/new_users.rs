//! Query 8, monitor new users: the persons who opened an auction in the
//! same tumbling window of event time as they registered, from one windowed
//! aggregate per person id over persons and auctions.

use serde::{Deserialize, Serialize};
use spate_core::Duration;
use spate_dstream::{DStream, EventWindows, WindowResult};

use super::{event_time, watermarks};
use crate::model::Event;

/// The length of q8's windows.
pub const Q8_WINDOW: Duration = Duration::from_secs(10);

/// A row of q8: a person who registered and opened an auction in one window.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q8Row {
    /// The person (the spec's `P.id`).
    pub id: i64,
    /// Their name.
    pub name: String,
    /// The window's first instant, in milliseconds (`P.starttime`).
    pub window_start: i64,
}

/// What q8's window reads, keyed by person id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Input {
    /// The person registers (their name).
    Person { name: String, date_time: i64 },
    /// The person opens an auction.
    Auction { date_time: i64 },
}

impl Input {
    fn date_time(&self) -> i64 {
        match self {
            Input::Person { date_time, .. } | Input::Auction { date_time } => *date_time,
        }
    }
}

/// One person id in one window: the name if they registered in it, and
/// whether they opened an auction in it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Seen {
    name: Option<String>,
    auction: bool,
}

impl Seen {
    fn of(input: Input) -> Self {
        match input {
            Input::Person { name, .. } => Seen { name: Some(name), auction: false },
            Input::Auction { .. } => Seen { name: None, auction: true },
        }
    }

    fn add(&mut self, input: Input) {
        self.merge(&Seen::of(input));
    }

    fn merge(&mut self, other: &Seen) {
        if self.name.is_none() {
            self.name.clone_from(&other.name);
        }
        self.auction |= other.auction;
    }
}

fn input(event: Event) -> Option<(i64, Input)> {
    match event {
        Event::Person(p) => Some((p.id, Input::Person { name: p.name, date_time: p.date_time })),
        Event::Auction(a) => Some((a.seller, Input::Auction { date_time: a.date_time })),
        Event::Bid(_) => None,
    }
}

fn row(result: WindowResult<i64, Seen>) -> Option<Q8Row> {
    let name = result.value.name.filter(|_| result.value.auction)?;
    Some(Q8Row { id: result.key, name, window_start: result.window.start.as_millis() })
}

/// Query 8, monitor new users: for each window of 10 s (event time, from
/// the epoch), every person who registered in it and opened at least one
/// auction in it (the spec's join of persons and sellers on id and window),
/// once, in the batch whose watermark passes the window's end.
///
/// One `aggregate_by_event_time` keyed by person id (`q8-new-users`) over
/// persons and the sellers of auctions.
pub fn q8(events: &DStream<Event>) -> DStream<Q8Row> {
    events
        .flat_map(input)
        .aggregate_by_event_time(
            |input: &Input| event_time(input.date_time()),
            watermarks(),
            EventWindows::tumbling(Q8_WINDOW),
            Seen::of,
            Seen::add,
            Seen::merge,
        )
        .name("q8-new-users")
        .results()
        .flat_map(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{auction, person, run};

    const T0: i64 = 1_000_000;

    #[test]
    fn a_person_is_listed_once_for_the_window_they_registered_and_sold_in() {
        let rows = run(
            q8,
            vec![
                vec![
                    vec![
                        person(1, "OR", T0 + 1000),
                        auction(10, 1, 10, T0 + 9000, T0 + 20_000),
                        // Registered at the end of the window, sold in the next.
                        person(2, "OR", T0 + 9500),
                        auction(11, 2, 10, T0 + 10_500, T0 + 20_000),
                        // Sold before registering, in the same window.
                        auction(12, 3, 10, T0 + 2000, T0 + 20_000),
                    ],
                    vec![
                        person(3, "OR", T0 + 3000),
                        person(4, "OR", T0 + 4000),
                        auction(13, 4, 10, T0 + 5000, T0 + 20_000),
                        auction(14, 4, 10, T0 + 6000, T0 + 20_000),
                        // A seller who registered before the window.
                        auction(15, 99, 10, T0 + 6000, T0 + 20_000),
                    ],
                ],
                vec![vec![person(5, "OR", T0 + 20_000)], vec![person(6, "OR", T0 + 20_000)]],
            ],
        );
        let row = |id: i64| Q8Row { id, name: format!("name-{id}"), window_start: T0 };
        assert_eq!(rows, vec![vec![], vec![row(1), row(3), row(4)]]);
    }
}
