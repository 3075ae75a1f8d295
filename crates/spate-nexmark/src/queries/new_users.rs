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

/// One person id in one window: the names they registered under in it
/// (each once: the spec groups persons by id and name), and whether they
/// opened an auction in it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Seen {
    names: Vec<String>,
    auction: bool,
}

impl Seen {
    fn of(input: Input) -> Self {
        match input {
            Input::Person { name, .. } => Seen { names: vec![name], auction: false },
            Input::Auction { .. } => Seen { names: Vec::new(), auction: true },
        }
    }

    fn add(&mut self, input: Input) {
        match input {
            Input::Person { name, .. } => {
                if !self.names.contains(&name) {
                    self.names.push(name);
                }
            }
            Input::Auction { .. } => self.auction = true,
        }
    }

    fn merge(&mut self, other: &Seen) {
        for name in &other.names {
            if !self.names.contains(name) {
                self.names.push(name.clone());
            }
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

/// A window's rows of one person id: one per name, if they also sold.
fn rows(result: WindowResult<i64, Seen>) -> impl Iterator<Item = Q8Row> {
    let (id, window_start) = (result.key, result.window.start.as_millis());
    let names = if result.value.auction { result.value.names } else { Vec::new() };
    names.into_iter().map(move |name| Q8Row { id, name, window_start })
}

/// Query 8, monitor new users: for each window of 10 s (event time, from
/// the epoch), every person who registered in it and opened at least one
/// auction in it (the spec's join of persons and sellers on id and window),
/// once, in the batch whose watermark passes the window's end.
///
/// The spec's SQL groups persons by id, name and window, auctions by
/// seller and window, and joins the two on id and window. Here one
/// `aggregate_by_event_time` keyed by person id (`q8-new-users`) over
/// persons and the sellers of auctions keeps, per id and window, the
/// distinct names and whether an auction was opened: the same rows (a
/// property test checks it over random out-of-order input), without a
/// join.
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
        .flat_map(rows)
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

#[cfg(test)]
mod spec {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::queries::harness::{Arranged, auction, out_of_order, person, run};

    const T0: i64 = 1_000_000;

    /// A person (an id of a few, one of two names) or an auction of one of
    /// those sellers, at a time that is often at a window's bounds.
    fn arranged() -> impl Strategy<Value = Arranged> {
        let time = prop_oneof![(0..6i64).prop_map(|k| T0 + k * 10_000 - 1), (0..60_000i64).prop_map(|t| T0 + t)];
        (prop::bool::ANY, 1..6i64, prop::bool::ANY, time, 0..3_000i64, 0..3usize, prop::bool::weighted(0.2)).prop_map(
            |(is_person, id, other_name, t, delay, partition, cut)| {
                let event = if is_person {
                    let Event::Person(mut p) = person(id, "OR", t) else { unreachable!() };
                    if other_name {
                        p.name = format!("other-{id}");
                    }
                    Event::Person(p)
                } else {
                    auction(100 + t, id, 10, t, t + 1)
                };
                (event, delay, partition, cut)
            },
        )
    }

    /// The spec's SQL over `events`: persons grouped by id, name and
    /// tumbling 10 s window, joined with auctions grouped by seller and
    /// window, on id and window.
    fn spec(events: &[Event]) -> Vec<Q8Row> {
        let start = |t: i64| t - t.rem_euclid(10_000);
        let persons: BTreeSet<(i64, String, i64)> = events
            .iter()
            .filter_map(
                |e| if let Event::Person(p) = e { Some((p.id, p.name.clone(), start(p.date_time))) } else { None },
            )
            .collect();
        let sellers: BTreeSet<(i64, i64)> = events
            .iter()
            .filter_map(|e| if let Event::Auction(a) = e { Some((a.seller, start(a.date_time))) } else { None })
            .collect();
        persons
            .into_iter()
            .filter(|(id, _, window)| sellers.contains(&(*id, *window)))
            .map(|(id, name, window_start)| Q8Row { id, name, window_start })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random persons and auctions, out of order within the watermarks'
        /// bound, in random batches and partitions: q8 emits exactly the
        /// rows of the spec's SQL, each once.
        #[test]
        fn q8_emits_the_rows_of_the_spec_sql(arranged in prop::collection::vec(arranged(), 1..60)) {
            let events: Vec<Event> = arranged.iter().map(|(e, ..)| e.clone()).collect();
            let rows = run(q8, out_of_order(arranged, person(0, "OR", T0 + 1_000_005)));
            let mut got: Vec<Q8Row> = rows.into_iter().flatten().collect();
            got.sort();
            prop_assert_eq!(got, spec(&events));
        }
    }
}
