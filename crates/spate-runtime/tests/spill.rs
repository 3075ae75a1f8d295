//! A received input read by a whole-batch operator does not hold its
//! receiver back at the memory budget: its blocks beyond the budget spill
//! to the disk store until their batch gathers them, on the manual clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::Batch;
use spate_receiver::{GeneratorConfig, GeneratorReceiver, WordGenerator};
use spate_runtime::{BackpressureSettings, ReceiverOptions, StreamingContext, StreamingSettings};

const WORDS: u64 = 20_000;

/// Spins (yielding) until `cond` holds: no sleep orders anything here.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + StdDuration::from_secs(60);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        std::thread::yield_now();
    }
}

/// Folders of spill areas in `dir`.
fn spill_areas(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("spate-spill-"))
        .count()
}

#[test]
fn blocks_waiting_for_a_whole_batch_operator_spill_past_the_budget_and_the_batch_gets_them_all() {
    let (dir, spill) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    // 64 KiB: a few blocks of these words, far from the 20,000 of the batch.
    let mut settings = StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() })
        .with_spill_dir(spill.path());
    settings.max_memory_bytes = 64 << 10;
    let gathered = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&gathered);
    let progress = Arc::new(Mutex::new(None));
    let progress_slot = Arc::clone(&progress);
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, move |p| {
        let options = ReceiverOptions { max_block_records: Some(500), ..ReceiverOptions::default() };
        let mut generator = GeneratorConfig::new(11);
        generator.total_records = Some(WORDS);
        let words = p.receiver_stream("words", options, move |resume| {
            let receiver = GeneratorReceiver::resuming_at(generator, resume.records_stored);
            *progress_slot.lock().unwrap() = Some(receiver.progress());
            receiver
        });
        // A whole-batch operator right after the input: nothing runs on arrival.
        let sorted = words.transform(|batch: Batch<String>, _| {
            let mut words = batch.into_vec();
            words.sort();
            Ok(Batch::from_vec(words))
        });
        sorted.foreach_batch(move |batch, _| {
            sink.lock().unwrap().push(batch.iter().cloned().collect::<Vec<_>>());
            Ok(())
        });
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    // The clock stands still, so no batch reads a block out: every word is
    // stored only because the blocks past the budget went to disk.
    eventually("every word stored before the first batch", || {
        progress.lock().unwrap().as_ref().is_some_and(|p| p.acknowledged() == WORDS)
    });
    assert_eq!(spill_areas(spill.path()), 1, "the input's spill area");
    clock.advance(Duration::from_secs(1));
    assert!(ctx.await_committed(BatchId(0), StdDuration::from_secs(60)), "{:?}", ctx.failure());
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();

    let mut expected = WordGenerator::new(11).words(0, WORDS as usize);
    expected.sort();
    assert_eq!(gathered.lock().unwrap()[0], expected, "batch 0 is every word, in order once sorted");
    assert_eq!(spill_areas(spill.path()), 0, "the spill area goes with the input");
}
