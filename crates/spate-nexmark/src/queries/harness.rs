//! For the queries' unit tests: events made by hand, and a query run on a
//! graph batch by batch, one second of batch time apiece.

use std::sync::{Arc, Mutex};

use spate_core::{BatchId, Duration, Time};
use spate_dstream::{DStream, Data, GraphBuilder, QueueSource};

use crate::model::{Auction, Bid, Event, Person};

pub(super) fn person(id: i64, state: &str, date_time: i64) -> Event {
    Event::Person(Person {
        id,
        name: format!("name-{id}"),
        email_address: String::new(),
        credit_card: String::new(),
        city: format!("city-{id}"),
        state: state.to_string(),
        date_time,
        extra: String::new(),
    })
}

pub(super) fn auction(id: i64, seller: i64, category: i64, date_time: i64, expires: i64) -> Event {
    Event::Auction(Auction {
        id,
        item_name: String::new(),
        description: String::new(),
        initial_bid: 0,
        reserve: 0,
        date_time,
        expires,
        seller,
        category,
        extra: String::new(),
    })
}

pub(super) fn bid(auction: i64, price: i64, date_time: i64) -> Event {
    Event::Bid(Bid {
        auction,
        bidder: 2000 + price,
        price,
        channel: String::new(),
        url: String::new(),
        date_time,
        extra: format!("extra-{price}"),
    })
}

/// Runs `query` over `batches` (each a list of partitions) and returns
/// each batch's rows, sorted.
pub(super) fn run<T, Q>(query: Q, batches: Vec<Vec<Vec<Event>>>) -> Vec<Vec<T>>
where
    T: Data + Ord,
    Q: Fn(&DStream<Event>) -> DStream<T>,
{
    let builder = GraphBuilder::new(Duration::from_secs(1)).checkpointing(true);
    let queue = Arc::new(QueueSource::new());
    let rows: Arc<Mutex<Vec<Vec<T>>>> = Arc::default();
    let sink = Arc::clone(&rows);
    query(&builder.input("events", Arc::clone(&queue))).foreach_batch(move |batch, _info| {
        let mut rows: Vec<T> = batch.iter().cloned().collect();
        rows.sort();
        sink.lock().unwrap().push(rows);
        Ok(())
    });
    let mut graph = builder.build().unwrap();
    for (n, partitions) in batches.into_iter().enumerate() {
        queue.push_partitions(partitions);
        let n = n as u64;
        graph.run_batch(Time::from_millis(1000 * (n as i64 + 1)), BatchId(n)).unwrap();
    }
    rows.lock().unwrap().clone()
}
