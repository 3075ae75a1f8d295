//! q3, q4, q5, q7 and q8 run through a StreamingContext on a manual clock,
//! on 40,000 generated events (40 s of event time in 1 s batches, the
//! source in several partitions), each checked batch by batch against a
//! reference computed directly from the generator's events: the same rows,
//! in the same batches. The batch a windowed result belongs in is the first
//! whose watermark (worked out here from the events each batch's partitions
//! delivered, as the event-time module defines it) passes the window's end;
//! windows it never passes are not expected. Once uninterrupted, and once
//! with out-of-order events, a crash after a batch's outputs (re-run from
//! an earlier state snapshot) and a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use common::{
    BATCHES, Delivered, IN_ORDER, START, Setup, Sink, Stop, check, delivered, first_batch_reaching, nexmark_events,
    record, watermarks,
};
use spate_core::{BatchId, ManualClock, Time};
use spate_nexmark::queries::{self, Q3Row, Q4Row, Q5Row, Q7Row, Q8Row};
use spate_nexmark::{Auction, Bid, Event, NexmarkSource, Person};
use spate_runtime::{PipelineBuilder, RecoveryReport};

/// Everything a pipeline wrote, across the runs on one checkpoint.
#[derive(Default)]
struct Recorded {
    events: Arc<Mutex<Delivered>>,
    times: Arc<Mutex<BTreeMap<u64, i64>>>,
    q3: Sink<Q3Row>,
    q4: Sink<Q4Row>,
    q5: Sink<Q5Row>,
    q7: Sink<Q7Row>,
    q8: Sink<Q8Row>,
}

fn declare(p: &mut PipelineBuilder, source: &Arc<NexmarkSource>, out: &Recorded) {
    let events = nexmark_events(p, source, &out.events, &out.times);
    record(&queries::q3(&events), "q3", &out.q3);
    record(&queries::q4(&events), "q4", &out.q4);
    record(&queries::q5(&events), "q5", &out.q5);
    record(&queries::q7(&events), "q7", &out.q7);
    record(&queries::q8(&events), "q8", &out.q8);
}

/// Runs `batches` of every query in a new context on `dir`.
fn run(
    dir: &std::path::Path,
    clock: &ManualClock,
    setup: Setup,
    out: &Recorded,
    batches: std::ops::Range<u64>,
    stop: Stop,
) -> Option<RecoveryReport> {
    common::run(dir, clock, setup, batches, stop, |p, source| declare(p, source, out))
}

/// One uninterrupted run of every query, shared by the tests of each.
fn uninterrupted() -> &'static Recorded {
    static RUN: OnceLock<Recorded> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = Recorded::default();
        run(dir.path(), &ManualClock::new(Time::from_millis(START)), IN_ORDER, &out, 0..BATCHES, Stop::Graceful);
        out
    })
}

// ---------------------------------------------------------------------------
// The reference: plain Rust over the generated events.

fn window_of(time: i64, size: i64) -> i64 {
    time - time.rem_euclid(size)
}

fn persons(e: &Event) -> Option<&Person> {
    if let Event::Person(p) = e { Some(p) } else { None }
}

fn auctions(e: &Event) -> Option<&Auction> {
    if let Event::Auction(a) = e { Some(a) } else { None }
}

/// Every event with the batch that delivered it.
fn with_batch(events: &Delivered) -> impl Iterator<Item = (u64, &Event)> {
    events.iter().flat_map(|(batch, parts)| parts.iter().flatten().map(move |e| (*batch, e)))
}

/// q3: SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P
/// ON A.seller = P.id WHERE A.category = 10 AND P.state IN ('OR', 'ID',
/// 'CA'); each row in the batch that delivered the later of the two.
fn q3_reference(events: &Delivered) -> BTreeMap<u64, Vec<Q3Row>> {
    let people: HashMap<i64, (u64, &Person)> =
        with_batch(events).filter_map(|(b, e)| persons(e).map(|p| (p.id, (b, p)))).collect();
    let mut out: BTreeMap<u64, Vec<Q3Row>> = BTreeMap::new();
    for (batch, auction) in with_batch(events).filter_map(|(b, e)| auctions(e).map(|a| (b, a))) {
        let Some((person_batch, p)) = people.get(&auction.seller) else { continue };
        if auction.category == 10 && ["OR", "ID", "CA"].contains(&p.state.as_str()) {
            let row = Q3Row { name: p.name.clone(), city: p.city.clone(), state: p.state.clone(), auction: auction.id };
            out.entry(batch.max(*person_batch)).or_default().push(row);
        }
    }
    out
}

/// q4: SELECT category, AVG(final) FROM (SELECT MAX(B.price) AS final,
/// A.category FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime
/// BETWEEN A.dateTime AND A.expires GROUP BY A.id, A.category) GROUP BY
/// category, evaluated over the events delivered up to each batch; after
/// each batch, the rows of the categories whose row changed in it.
fn q4_reference(events: &Delivered) -> BTreeMap<u64, Vec<Q4Row>> {
    let mut auctions_so_far: Vec<&Auction> = Vec::new();
    let mut bids_so_far: HashMap<i64, Vec<&Bid>> = HashMap::new();
    let mut before: BTreeMap<i64, Q4Row> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (batch, parts) in events {
        for event in parts.iter().flatten() {
            match event {
                Event::Auction(a) => auctions_so_far.push(a),
                Event::Bid(b) => bids_so_far.entry(b.auction).or_default().push(b),
                Event::Person(_) => {}
            }
        }
        let mut finals: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        for auction in &auctions_so_far {
            let bids = bids_so_far.get(&auction.id).map(Vec::as_slice).unwrap_or_default();
            let in_range = bids.iter().filter(|b| (auction.date_time..=auction.expires).contains(&b.date_time));
            if let Some(highest) = in_range.map(|b| b.price).max() {
                finals.entry(auction.category).or_default().push(highest);
            }
        }
        let now: BTreeMap<i64, Q4Row> = finals
            .into_iter()
            .map(|(category, prices)| {
                let n = prices.len() as i64;
                (category, Q4Row { category, average: prices.iter().sum::<i64>() / n, auctions: n as u64 })
            })
            .collect();
        let changed = now.iter().filter(|(c, row)| before.get(c) != Some(row)).map(|(_, row)| *row).collect();
        out.insert(*batch, changed);
        before = now;
    }
    out
}

/// q5: per window of 10 s every 2 s, the count of each auction's bids; the
/// auctions with the most; in the first batch whose watermark passes the
/// window's end.
fn q5_reference(events: &Delivered) -> BTreeMap<u64, Vec<Q5Row>> {
    let (size, slide) = (10_000, 2_000);
    let mut counts: BTreeMap<i64, HashMap<i64, u64>> = BTreeMap::new();
    for bid in events.values().flatten().flatten().filter_map(Event::as_bid) {
        let last = window_of(bid.date_time, slide);
        for start in (0..size / slide).map(|k| last - k * slide) {
            *counts.entry(start).or_default().entry(bid.auction).or_default() += 1;
        }
    }
    let marks = watermarks(events, |e| e.as_bid().is_some());
    let mut out: BTreeMap<u64, Vec<Q5Row>> = BTreeMap::new();
    for (start, by_auction) in counts {
        let Some(batch) = first_batch_reaching(&marks, start + size) else { continue };
        let most = by_auction.values().copied().max().unwrap();
        let hottest = by_auction.into_iter().filter(|(_, n)| *n == most);
        let rows = hottest.map(|(auction, num)| Q5Row { window_start: start, window_end: start + size, auction, num });
        out.entry(batch).or_default().extend(rows);
    }
    out
}

/// q7: per tumbling window of 10 s, MAX(price) over its bids; joined with
/// every bid at that price with B.dateTime BETWEEN window_end - 10 s AND
/// window_end (the end included); in the first batch whose watermark
/// passes the window's end.
fn q7_reference(events: &Delivered) -> BTreeMap<u64, Vec<Q7Row>> {
    let size = 10_000;
    let bids: Vec<&Bid> = events.values().flatten().flatten().filter_map(Event::as_bid).collect();
    let mut highest: BTreeMap<i64, i64> = BTreeMap::new();
    for bid in &bids {
        let top = highest.entry(window_of(bid.date_time, size)).or_insert(bid.price);
        *top = (*top).max(bid.price);
    }
    let marks = watermarks(events, |e| e.as_bid().is_some());
    let mut out: BTreeMap<u64, Vec<Q7Row>> = BTreeMap::new();
    for (start, top) in highest {
        let end = start + size;
        let Some(batch) = first_batch_reaching(&marks, end + 1) else { continue };
        let rows = bids.iter().filter(|b| b.price == top && (start..=end).contains(&b.date_time)).map(|b| Q7Row {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            date_time: b.date_time,
            extra: b.extra.clone(),
        });
        out.entry(batch).or_default().extend(rows);
    }
    out
}

/// q8: the persons who registered in a tumbling window of 10 s and are the
/// seller of an auction opened in the same window, in the first batch whose
/// watermark passes the window's end.
fn q8_reference(events: &Delivered) -> BTreeMap<u64, Vec<Q8Row>> {
    let size = 10_000;
    let all: Vec<&Event> = events.values().flatten().flatten().collect();
    let sellers: BTreeSet<(i64, i64)> =
        all.iter().filter_map(|e| auctions(e)).map(|a| (a.seller, window_of(a.date_time, size))).collect();
    let marks = watermarks(events, |e| e.as_bid().is_none());
    let mut out: BTreeMap<u64, Vec<Q8Row>> = BTreeMap::new();
    for p in all.iter().filter_map(|e| persons(e)) {
        let start = window_of(p.date_time, size);
        if !sellers.contains(&(p.id, start)) {
            continue;
        }
        if let Some(batch) = first_batch_reaching(&marks, start + size) {
            out.entry(batch).or_default().push(Q8Row { id: p.id, name: p.name.clone(), window_start: start });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The checks.

#[test]
fn q3_joins_local_sellers_with_their_category_10_auctions_once_both_arrived() {
    let out = uninterrupted();
    let events = delivered(&out.events, IN_ORDER);
    check("q3", &out.q3, q3_reference(&events), 100);
}

#[test]
fn q4_averages_the_highest_bids_per_category_as_they_rise() {
    let out = uninterrupted();
    let events = delivered(&out.events, IN_ORDER);
    let expected = q4_reference(&events);
    // Bids come in every batch: the averages move in most, in every category.
    assert!(expected.values().filter(|rows| !rows.is_empty()).count() >= 30, "{expected:?}");
    let categories: BTreeSet<i64> = expected.values().flatten().map(|r| r.category).collect();
    assert_eq!(categories.len(), 5);
    check("q4", &out.q4, expected, 100);
}

#[test]
fn q5_finds_the_auctions_with_the_most_bids_per_sliding_window() {
    let out = uninterrupted();
    let events = delivered(&out.events, IN_ORDER);
    let expected = q5_reference(&events);
    // 40 s of bids: windows ending every 2 s up to the watermark, 36 s in.
    let windows: BTreeSet<i64> = expected.values().flatten().map(|r| r.window_start).collect();
    assert!(windows.len() >= 15, "{windows:?}");
    check("q5", &out.q5, expected, 15);
}

#[test]
fn q7_finds_the_highest_bids_per_tumbling_window() {
    let out = uninterrupted();
    let events = delivered(&out.events, IN_ORDER);
    let expected = q7_reference(&events);
    assert_eq!(expected.len(), 3, "windows ending at 10, 20 and 30 s are passed, the one at 40 s is not");
    check("q7", &out.q7, expected, 3);
}

#[test]
fn q8_finds_persons_who_opened_an_auction_in_the_window_they_registered_in() {
    let out = uninterrupted();
    let events = delivered(&out.events, IN_ORDER);
    check("q8", &out.q8, q8_reference(&events), 5);
}

/// Every stateful operator of the queries was restored from `snapshot`.
fn assert_restored(recovery: &RecoveryReport, snapshot: BatchId) {
    let restored: BTreeMap<&str, BatchId> =
        recovery.restored_operators.iter().map(|o| (o.name.as_str(), o.snapshot_batch)).collect();
    for name in [
        "q3-persons-auctions",
        "q4-winning-bids",
        "q4-average-by-category",
        "q5-bids-per-auction",
        "q7-highest-bid",
        "q8-new-users",
    ] {
        assert_eq!(restored.get(name), Some(&snapshot), "{name}: {recovery}");
    }
}

#[test]
fn out_of_order_events_a_crash_and_a_restart_still_give_exactly_the_reference() {
    // Events shuffled within groups of 3,000: up to 3 s out of order, within
    // the queries' bound of 4 s (with a bound of 2 s, records come late).
    let setup = Setup { seed: 11, partitions: 4, out_of_order_group: 3_000 };
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let out = Recorded::default();
    run(dir.path(), &clock, setup, &out, 0..15, Stop::Now);
    // A crash after batch 14's outputs, before its commit: the next run
    // restores the state of batch 9 (the last snapshot), recomputes 10 to
    // 13 from the log without their outputs, and runs 14 again.
    std::fs::remove_file(dir.path().join("commits/14")).unwrap();
    let before: Vec<Q5Row> = out.q5.lock().unwrap().get(&14).cloned().unwrap_or_default();
    let recovery = run(dir.path(), &clock, setup, &out, 14..27, Stop::Graceful).unwrap();
    assert_eq!(recovery.rerun_batch, Some(BatchId(14)));
    assert_eq!(recovery.replayed_for_state, (10..14).map(BatchId).collect::<Vec<_>>());
    assert_restored(&recovery, BatchId(9));
    assert_eq!(out.q5.lock().unwrap().get(&14).cloned().unwrap_or_default(), before, "the re-run batch differs");
    // A clean stop, which snapshots its last committed batch, and a restart from it.
    let recovery = run(dir.path(), &clock, setup, &out, 27..BATCHES, Stop::Graceful).unwrap();
    let last = recovery.last_committed.unwrap();
    assert!(last >= BatchId(26), "{recovery}");
    assert_restored(&recovery, last);
    assert!(recovery.replayed_for_state.is_empty(), "{recovery}");

    let events = delivered(&out.events, setup);
    check("q3", &out.q3, q3_reference(&events), 100);
    check("q4", &out.q4, q4_reference(&events), 50);
    check("q5", &out.q5, q5_reference(&events), 15);
    check("q7", &out.q7, q7_reference(&events), 3);
    check("q8", &out.q8, q8_reference(&events), 5);
}
