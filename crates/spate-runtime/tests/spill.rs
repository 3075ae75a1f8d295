//! A received input read by a whole-batch operator does not hold its
//! receiver back at the memory budget: its blocks beyond the budget spill
//! to the disk store until their batch gathers them, on the manual clock.
//! The spill area is bounded in turn: past its limit the receiver waits for
//! batches to read blocks out, and every record still arrives once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::Batch;
use spate_receiver::{GeneratorReceiver, GeneratorSettings, WordGenerator};
use spate_runtime::{BackpressureSettings, ReceiverSettings, StreamingContext, StreamingSettings};

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
        let options = ReceiverSettings { max_block_records: Some(500), ..ReceiverSettings::default() };
        let mut generator = GeneratorSettings::new(11);
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

/// The value of the counter `name` in the `/metrics` of `addr` (0 while absent).
fn counter(addr: SocketAddr, name: &str) -> u64 {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let line = answer.lines().find(|line| line.split_whitespace().next() == Some(name));
    line.and_then(|line| line.split_whitespace().nth(1)).map_or(0, |value| value.parse::<f64>().unwrap() as u64)
}

#[test]
fn a_full_spill_area_holds_the_receiver_back_until_batches_read_it_out_and_every_word_arrives_once() {
    let (dir, spill) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    // 16 KiB of memory and 16 KiB on disk: together far short of the 20,000 words.
    let mut settings = StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() })
        .with_spill_dir(spill.path())
        .with_max_spill_bytes(16 << 10)
        .with_metrics_addr("127.0.0.1:0".parse().unwrap());
    settings.max_memory_bytes = 16 << 10;
    let gathered = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&gathered);
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, move |p| {
        let options = ReceiverSettings { max_block_records: Some(500), ..ReceiverSettings::default() };
        let mut generator = GeneratorSettings::new(11);
        generator.total_records = Some(WORDS);
        let words = p.receiver_stream("words", options, move |resume| {
            GeneratorReceiver::resuming_at(generator, resume.records_stored)
        });
        words.transform(|batch: Batch<String>, _| Ok(batch)).foreach_batch(move |batch, _| {
            sink.lock().unwrap().extend(batch.iter().cloned());
            Ok(())
        });
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    let metrics = ctx.metrics_addr().unwrap();
    // The clock stands still, so no batch reads a block out: once memory
    // and the spill area are full, the receiver waits.
    eventually("the receiver waits for room in the full spill area", || {
        counter(metrics, "spate_spill_waits_total") >= 1
    });
    // Then one batch after another reads out what the receiver stored, until every word has arrived.
    let mut batch = 0;
    while gathered.lock().unwrap().len() < WORDS as usize {
        assert!(batch < 2_000, "{batch} batches and still words missing: the receiver is stuck");
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), StdDuration::from_secs(60)), "batch {batch}: {:?}", ctx.failure());
        batch += 1;
    }
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();

    let mut words = gathered.lock().unwrap().clone();
    words.sort();
    let mut expected = WordGenerator::new(11).words(0, WORDS as usize);
    expected.sort();
    assert_eq!(words, expected, "every word arrives, once");
    assert_eq!(spill_areas(spill.path()), 0, "the spill area goes with the input");
}
