//! Query 3, local item suggestion: who sells in category 10 from Oregon,
//! Idaho or California, and which auctions.
//!
//! The spec's SQL is a regular (unwindowed) inner join of `auction` and
//! `person` on `A.seller = P.id`, with `A.category = 10` and `P.state IN
//! ('OR', 'ID', 'CA')`. Here it is one `map_with_state` keyed by the
//! person id, over persons and category-10 auctions: the state of a person
//! id says whether the person is a local seller (name, city, state kept),
//! someone elsewhere (nothing kept but that), or not seen yet (the auctions
//! naming them wait). Each match is emitted once, in the batch that brings
//! its second side, whichever side that is.

use serde::{Deserialize, Serialize};
use spate_dstream::{DStream, State};

use crate::model::{Auction, Event, Person};

/// The category q3 looks at.
pub const Q3_CATEGORY: i64 = 10;

/// The states q3 looks at.
pub const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];

/// A row of q3: `SELECT P.name, P.city, P.state, A.id`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Q3Row {
    /// The seller's name.
    pub name: String,
    /// The seller's city.
    pub city: String,
    /// The seller's state (OR, ID or CA).
    pub state: String,
    /// The auction (the spec's `A.id`).
    pub auction: i64,
}

/// What q3's join reads, keyed by person id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Side {
    /// A person: `Some` with their name, city and state when they are a
    /// local seller, `None` when they live elsewhere.
    Person(Option<Seller>),
    /// The id of a category-10 auction this person sells.
    Auction(i64),
}

/// A local seller's columns.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Seller {
    name: String,
    city: String,
    state: String,
}

/// What the join keeps per person id.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Kept {
    /// A local seller: auctions arriving later match at once.
    Local(Seller),
    /// A person elsewhere: their auctions never match, so none are kept.
    Elsewhere,
    /// The person has not arrived yet: their auctions so far.
    Waiting(Vec<i64>),
}

impl Seller {
    fn row(&self, auction: i64) -> Q3Row {
        Q3Row { name: self.name.clone(), city: self.city.clone(), state: self.state.clone(), auction }
    }
}

/// The join's input for an event: persons (all of them, so that the join
/// knows whom to stop waiting for) and category-10 auctions.
fn side(event: Event) -> Option<(i64, Side)> {
    match event {
        Event::Person(person) => Some((person.id, Side::Person(local_seller(person)))),
        Event::Auction(Auction { id, seller, category, .. }) if category == Q3_CATEGORY => {
            Some((seller, Side::Auction(id)))
        }
        _ => None,
    }
}

/// A person's columns if they live in one of q3's states.
fn local_seller(person: Person) -> Option<Seller> {
    Q3_STATES.contains(&person.state.as_str()).then_some(Seller {
        name: person.name,
        city: person.city,
        state: person.state,
    })
}

/// The `map_with_state` function: one side of a person id arrives.
fn join(side: Option<Side>, state: &mut State<Kept>) -> Vec<Q3Row> {
    match side {
        Some(Side::Person(Some(seller))) => {
            let rows = match state.get() {
                Some(Kept::Waiting(auctions)) => auctions.iter().map(|a| seller.row(*a)).collect(),
                _ => Vec::new(),
            };
            state.update(Kept::Local(seller));
            rows
        }
        Some(Side::Person(None)) => {
            state.update(Kept::Elsewhere);
            Vec::new()
        }
        Some(Side::Auction(auction)) => match state.get() {
            Some(Kept::Local(seller)) => vec![seller.row(auction)],
            Some(Kept::Elsewhere) => Vec::new(),
            Some(Kept::Waiting(auctions)) => {
                let mut auctions = auctions.clone();
                auctions.push(auction);
                state.update(Kept::Waiting(auctions));
                Vec::new()
            }
            None => {
                state.update(Kept::Waiting(vec![auction]));
                Vec::new()
            }
        },
        // No timeout is set, so the function is only called with a value.
        None => Vec::new(),
    }
}

/// Query 3, local item suggestion: the name, city and state of each seller
/// in OR, ID or CA with the id of each of their category-10 auctions, as
/// soon as both the person and the auction have arrived. Keeps a small
/// entry per person for ever (as the spec's unwindowed join keeps its
/// state), and each category-10 auction until its seller arrives. The
/// stateful operator is named `q3-persons-auctions`.
pub fn q3(events: &DStream<Event>) -> DStream<Q3Row> {
    events
        .flat_map(side)
        .map_with_state(|_person: &i64, side, state: &mut State<Kept>| join(side, state), None)
        .name("q3-persons-auctions")
        .mapped()
        .flat_map(|rows: Vec<Q3Row>| rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queries::harness::{auction, person, run};

    fn row(person: i64, state: &str, auction: i64) -> Q3Row {
        Q3Row { name: format!("name-{person}"), city: format!("city-{person}"), state: state.to_string(), auction }
    }

    #[test]
    fn each_match_comes_once_in_the_batch_of_its_second_side() {
        let rows = run(
            q3,
            vec![
                // Auctions before their sellers: they wait (11 is another category).
                vec![vec![auction(1, 7, 10, 0, 9), auction(2, 8, 10, 0, 9)], vec![auction(3, 7, 11, 0, 9)]],
                // Person 7 is in Oregon, 8 in Washington; then one more auction each.
                vec![
                    vec![person(7, "OR", 1), person(8, "WA", 1)],
                    vec![auction(4, 7, 10, 1, 9), auction(5, 8, 10, 1, 9)],
                ],
                vec![vec![auction(6, 7, 10, 2, 9)], vec![person(9, "CA", 2), auction(7, 9, 10, 2, 9)]],
                vec![vec![auction(8, 8, 10, 3, 9)]],
            ],
        );
        assert_eq!(
            rows,
            vec![vec![], vec![row(7, "OR", 1), row(7, "OR", 4)], vec![row(7, "OR", 6), row(9, "CA", 7)], vec![]]
        );
    }
}
