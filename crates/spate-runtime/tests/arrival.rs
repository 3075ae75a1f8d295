//! A receiver input's first operator runs on each block as it is stored,
//! before its batch's time comes, on the manual clock: nothing waits for
//! the interval to end, and the batch still gets exactly its blocks, also
//! when an aggregate's results of neighbouring blocks were merged while
//! they waited.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_receiver::{GeneratorReceiver, GeneratorSettings, WordGenerator};
use spate_runtime::{BackpressureSettings, ReceiverSettings, StreamingContext, StreamingSettings};

const WORDS: u64 = 5_000;

fn settings(clock: &ManualClock) -> StreamingSettings {
    StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() })
}

/// Spins (yielding) until `cond` holds: no sleep orders anything here.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + StdDuration::from_secs(60);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        std::thread::yield_now();
    }
}

/// A context whose words (blocks of 1 000, cut by count since the clock
/// stands still) go through `first` and whose batch totals go to `totals`.
fn context<F>(dir: &std::path::Path, clock: &ManualClock, first: F, totals: &Arc<Mutex<Vec<u64>>>) -> StreamingContext
where
    F: Fn(Vec<String>) -> Vec<u64> + Send + Sync + 'static,
{
    let totals = Arc::clone(totals);
    StreamingContext::get_or_create(dir, settings(clock), move |p| {
        let options = ReceiverSettings { max_block_records: Some(1_000), ..ReceiverSettings::default() };
        let mut generator = GeneratorSettings::new(3);
        generator.total_records = Some(WORDS);
        let words = p.receiver_stream("words", options, move |resume| {
            GeneratorReceiver::resuming_at(generator, resume.records_stored)
        });
        words.map_partitions(first).name("sizes").foreach_batch(move |batch, _| {
            totals.lock().unwrap().push(batch.iter().sum());
            Ok(())
        });
        Ok(())
    })
    .unwrap()
}

#[test]
fn blocks_go_through_the_first_operator_before_their_batch_time_and_the_batch_gets_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let (seen, totals) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));
    let counter = Arc::clone(&seen);
    let first = move |part: Vec<String>| {
        counter.fetch_add(part.len() as u64, Ordering::SeqCst);
        vec![part.len() as u64]
    };
    let mut ctx = context(dir.path(), &clock, first, &totals);
    ctx.start().unwrap();
    // The clock has not moved: no batch has run, yet every block was processed.
    eventually("every word counted before the first batch", || seen.load(Ordering::SeqCst) == WORDS);
    assert!(totals.lock().unwrap().is_empty(), "no batch ran yet");
    clock.advance(Duration::from_secs(1));
    assert!(ctx.await_committed(BatchId(0), StdDuration::from_secs(60)), "{:?}", ctx.failure());
    assert_eq!(*totals.lock().unwrap(), vec![WORDS]);
    // Processed once: the batch took the results, it did not run the operator again.
    assert_eq!(seen.load(Ordering::SeqCst), WORDS);
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
}

#[test]
fn a_panic_in_the_first_operator_fails_the_batch_naming_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let (calls, totals) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));
    let counter = Arc::clone(&calls);
    let first = move |_: Vec<String>| -> Vec<u64> {
        counter.fetch_add(1, Ordering::SeqCst);
        panic!("no words today")
    };
    let mut ctx = context(dir.path(), &clock, first, &totals);
    ctx.start().unwrap();
    // A block was tracked before it was processed: batch 0 is given it.
    eventually("a block went through the operator", || calls.load(Ordering::SeqCst) > 0);
    clock.advance(Duration::from_secs(1));
    assert!(!ctx.await_committed(BatchId(0), StdDuration::from_secs(60)));
    let error = ctx.await_termination().unwrap_err().to_string();
    assert!(error.contains("sizes") && error.contains("no words today"), "{error}");
    assert!(totals.lock().unwrap().is_empty());
}

#[test]
fn an_aggregate_over_blocks_merged_while_they_wait_counts_every_word_once() {
    type Counts = Arc<Mutex<BTreeMap<String, u64>>>;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let (seen, counted): (Counts, Counts) = (Arc::default(), Arc::default());
    let (in_map, out) = (Arc::clone(&seen), Arc::clone(&counted));
    let mut sent = BTreeMap::new();
    for word in WordGenerator::new(5).words(0, WORDS as usize) {
        *sent.entry(word).or_insert(0) += 1;
    }
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), move |p| {
        let options = ReceiverSettings { max_block_records: Some(1_000), ..ReceiverSettings::default() };
        let mut generator = GeneratorSettings::new(5);
        generator.total_records = Some(WORDS);
        let words = p.receiver_stream("words", options, move |resume| {
            GeneratorReceiver::resuming_at(generator, resume.records_stored)
        });
        // Runs once a word, on the block as it arrives.
        let pairs = words.map(move |word: String| {
            *in_map.lock().unwrap().entry(word.clone()).or_insert(0) += 1;
            (word, 1u64)
        });
        pairs.reduce_by_key(|a, b| a + b).name("counts").foreach_batch(move |batch, _| {
            let mut counted = out.lock().unwrap();
            for (word, count) in batch.iter() {
                *counted.entry(word.clone()).or_insert(0) += count;
            }
            Ok(())
        });
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    let words_seen = || seen.lock().unwrap().values().sum::<u64>();
    eventually("every word through the map before the first batch", || words_seen() == WORDS);
    clock.advance(Duration::from_secs(1));
    assert!(ctx.await_committed(BatchId(0), StdDuration::from_secs(60)), "{:?}", ctx.failure());
    assert_eq!(*counted.lock().unwrap(), sent, "each word counted as often as it was sent");
    assert_eq!(*seen.lock().unwrap(), sent, "each block processed once");
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
}
