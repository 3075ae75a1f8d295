//! For the queries' unit tests: events made by hand, a query run on a
//! graph batch by batch, one second of batch time apiece, and random
//! out-of-order batches for the property tests.

use std::sync::{Arc, Mutex};

use spate_core::{BatchId, Duration, Time};
use spate_dstream::{DStream, Data, GraphBuilder, QueueSource};

use crate::model::{Auction, Bid, Event, Person};
use crate::text::SharedStr;

pub(super) fn person(id: i64, state: &str, date_time: i64) -> Event {
    Event::Person(Person {
        id,
        name: format!("name-{id}"),
        email_address: String::new(),
        credit_card: String::new(),
        city: format!("city-{id}"),
        state: state.to_string(),
        date_time,
        extra: SharedStr::default(),
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
        extra: SharedStr::default(),
    })
}

pub(super) fn bid(auction: i64, price: i64, date_time: i64) -> Event {
    Event::Bid(Bid {
        auction,
        bidder: 2000 + price,
        price,
        channel: SharedStr::default(),
        url: SharedStr::default(),
        date_time,
        extra: format!("extra-{price}").into(),
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

/// How many input partitions [`out_of_order`] spreads events over.
pub(super) const PARTITIONS: usize = 3;

/// One event as a property test arranges it: `delay` (0 to 3,000 ms, less
/// than the 4 s the watermarks allow) puts it after the events made up to
/// that much later; `partition` (modulo [`PARTITIONS`]) is where it goes;
/// `cut` ends the batch after it.
pub(super) type Arranged = (Event, i64, usize, bool);

/// The events in the order of their time plus their delay, cut into
/// batches of [`PARTITIONS`] partitions, then a batch with `flush` (an
/// event the query reads, far later) in every partition, which moves the
/// watermark past every window before it. No event is behind the watermark: one that comes after
/// another is at most 3 s older than it.
pub(super) fn out_of_order(mut events: Vec<Arranged>, flush: Event) -> Vec<Vec<Vec<Event>>> {
    events.sort_by_key(|(event, delay, _, _)| event.timestamp_ms() + delay);
    let empty = || (0..PARTITIONS).map(|_| Vec::new()).collect::<Vec<Vec<Event>>>();
    let mut batches = vec![empty()];
    for (event, _, partition, cut) in events {
        if let Some(part) = batches.last_mut().and_then(|b| b.get_mut(partition % PARTITIONS)) {
            part.push(event);
        }
        if cut {
            batches.push(empty());
        }
    }
    batches.push((0..PARTITIONS).map(|_| vec![flush.clone()]).collect());
    batches
}
