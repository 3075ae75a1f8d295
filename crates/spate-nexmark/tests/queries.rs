//! q0, q1 and q2 run through a StreamingContext on a manual clock, on
//! 10,000 generated events, each checked against a reference computed
//! directly from the generator's events; and the source across a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::DStream;
use spate_nexmark::queries::{self, Q0Row, Q1Row, Q2Row};
use spate_nexmark::{Event, GeneratorSettings, NexmarkGenerator, NexmarkSource, SharedStr};
use spate_runtime::{PipelineBuilder, StreamingContext, StreamingSettings};

const WAIT: StdDuration = StdDuration::from_secs(60);
const START: i64 = 1_700_000_000_000;
const EVENTS: u64 = 10_000;
const SEED: u64 = 31;
/// 1,000 events a second from START: ten one-second batches hold them all.
const RATE: f64 = 1_000.0;

fn config() -> GeneratorSettings {
    GeneratorSettings::new(SEED, START).with_rate(RATE).with_max_events(EVENTS)
}

fn new_source() -> Arc<NexmarkSource> {
    Arc::new(NexmarkSource::new(NexmarkGenerator::new(config()).unwrap()).with_partitions(3))
}

/// The events the test compares against, made without the engine.
fn reference_events() -> Vec<Event> {
    NexmarkGenerator::new(config()).unwrap().events(0..EVENTS)
}

type Rows<T> = Arc<Mutex<Vec<(BatchId, i64, T)>>>;

/// Collects every row of `stream` with its batch id and batch time.
fn collect<T: spate_dstream::Data>(stream: &DStream<T>, name: &str) -> Rows<T> {
    let rows: Rows<T> = Arc::default();
    let sink = Arc::clone(&rows);
    stream
        .foreach_batch(move |batch, info| {
            let mut rows = sink.lock().unwrap();
            rows.extend(batch.iter().map(|r| (info.batch_id, info.time.as_millis(), r.clone())));
            Ok(())
        })
        .name(name);
    rows
}

fn settings(clock: &ManualClock) -> StreamingSettings {
    StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()))
}

fn nexmark_input(p: &mut PipelineBuilder, source: &Arc<NexmarkSource>) -> DStream<Event> {
    p.replayable_input("nexmark", Arc::clone(source), Some(source.resume_hook()), None)
}

/// Runs batches `batches` on the clock, each one second later.
fn run(ctx: &mut StreamingContext, clock: &ManualClock, batches: std::ops::Range<u64>) {
    ctx.start().unwrap();
    for batch in batches {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", ctx.failure());
    }
    ctx.stop_handle().stop_gracefully();
}

fn sorted<T: Ord + Clone>(rows: &Rows<T>) -> Vec<T> {
    let mut v: Vec<T> = rows.lock().unwrap().iter().map(|(_, _, r)| r.clone()).collect();
    v.sort();
    v
}

struct Outputs {
    events: Rows<Event>,
    q0: Rows<Q0Row>,
    q1: Rows<Q1Row>,
    q2: Rows<Q2Row>,
}

fn declare(p: &mut PipelineBuilder, source: &Arc<NexmarkSource>) -> Outputs {
    let events = nexmark_input(p, source);
    Outputs {
        events: collect(&events, "events"),
        q0: collect(&queries::q0(&events), "q0"),
        q1: collect(&queries::q1(&events), "q1"),
        q2: collect(&queries::q2(&events), "q2"),
    }
}

fn run_all(dir: &Path) -> Outputs {
    let clock = ManualClock::new(Time::from_millis(START));
    let source = new_source();
    let outputs = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&outputs);
    let mut ctx = StreamingContext::get_or_create(dir, settings(&clock), |p| {
        *slot.lock().unwrap() = Some(declare(p, &source));
        Ok(())
    })
    .unwrap();
    // Ten seconds of events, and two batches more to see that nothing follows.
    run(&mut ctx, &clock, 0..12);
    ctx.await_termination().unwrap();
    assert!(source.is_exhausted());
    outputs.lock().unwrap().take().unwrap()
}

#[test]
fn q0_q1_and_q2_match_a_reference_computed_from_the_generated_events() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_all(dir.path());
    let events = reference_events();
    let bids: Vec<_> = events.iter().filter_map(|e| e.as_bid()).collect();
    assert_eq!(bids.len(), 9_200, "46 bids in each of 200 cycles of 50");

    // Every event once; each read by a batch at or after its time.
    let mut read: Vec<Event> = out.events.lock().unwrap().iter().map(|(_, _, e)| e.clone()).collect();
    assert_eq!(read.len(), events.len());
    for (batch, time, event) in out.events.lock().unwrap().iter() {
        assert!(event.timestamp_ms() <= *time, "batch {batch:?} at {time} read an event of {}", event.timestamp_ms());
    }
    read.sort_by_key(|e| format!("{e:?}"));
    let mut expected_events = events.clone();
    expected_events.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(read, expected_events);

    // q0: SELECT auction, bidder, price, dateTime, extra FROM bid.
    let mut q0: Vec<Q0Row> = bids
        .iter()
        .map(|b| Q0Row {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            date_time: b.date_time,
            extra: b.extra.clone(),
        })
        .collect();
    q0.sort();
    assert_eq!(sorted(&out.q0), q0);

    // q1: the same with 0.908 * price, exact to three places.
    let mut q1: Vec<(i64, i64, i128, i64, SharedStr)> =
        bids.iter().map(|b| (b.auction, b.bidder, i128::from(b.price) * 908, b.date_time, b.extra.clone())).collect();
    q1.sort();
    let mut got: Vec<(i64, i64, i128, i64, SharedStr)> = sorted(&out.q1)
        .into_iter()
        .map(|r| (r.auction, r.bidder, i128::from(r.price.thousandths), r.date_time, r.extra))
        .collect();
    got.sort();
    assert_eq!(got, q1);
    // Printed as the SQL decimal: 0.908 * 12345 cents is 11209.260.
    let row = sorted(&out.q1).into_iter().next().unwrap();
    let cents = bids.iter().find(|b| b.auction == row.auction && b.extra == row.extra).unwrap().price;
    assert_eq!(row.price.to_string(), format!("{}.{:03}", cents * 908 / 1000, cents * 908 % 1000));

    // q2: SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0.
    let mut q2: Vec<Q2Row> =
        bids.iter().filter(|b| b.auction % 123 == 0).map(|b| Q2Row { auction: b.auction, price: b.price }).collect();
    q2.sort();
    assert!(!q2.is_empty(), "no bid on a multiple of 123: the check would be empty");
    assert_eq!(sorted(&out.q2), q2);
}

/// One run on `dir` whose only output collects the events; runs `batches`.
fn run_collecting(dir: &Path, clock: &ManualClock, batches: std::ops::Range<u64>) -> Vec<(BatchId, i64, Event)> {
    let source = new_source();
    let rows = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&rows);
    let mut ctx = StreamingContext::get_or_create(dir, settings(clock), |p| {
        *slot.lock().unwrap() = Some(collect(&nexmark_input(p, &source), "events"));
        Ok(())
    })
    .unwrap();
    run(&mut ctx, clock, batches);
    ctx.await_termination().unwrap();
    let rows = rows.lock().unwrap().take().unwrap();
    rows.lock().unwrap().clone()
}

#[test]
fn a_batch_rerun_after_a_crash_reads_the_same_events_and_restarts_go_on_after_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let first = run_collecting(dir.path(), &clock, 0..4);
    // A crash after batch 3's outputs, before its commit: the commit is not there.
    std::fs::remove_file(dir.path().join("commits/3")).unwrap();
    let second = run_collecting(dir.path(), &clock, 3..7);
    // A clean stop and restart: nothing to re-run, the source resumes from the log.
    let third = run_collecting(dir.path(), &clock, 7..12);

    let of_batch = |rows: &[(BatchId, i64, Event)], n: u64| -> Vec<Event> {
        rows.iter().filter(|(b, _, _)| *b == BatchId(n)).map(|(_, _, e)| e.clone()).collect()
    };
    let rerun = of_batch(&second, 3);
    assert!(!rerun.is_empty());
    assert_eq!(rerun, of_batch(&first, 3), "the re-run batch read other events");

    // Batches 0-3 of the first run, 4-6 of the second, the rest of the
    // third: every event once, in order.
    let all: Vec<Event> = first
        .iter()
        .chain(second.iter().filter(|(b, _, _)| b.0 >= 4))
        .chain(third.iter())
        .map(|(_, _, e)| e.clone())
        .collect();
    assert_eq!(all.len(), reference_events().len());
    assert!(all == reference_events(), "the runs together did not read each event once, in order");
}
