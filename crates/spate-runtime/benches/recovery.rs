//! Recovery: from `get_or_create` on a checkpoint whose last batch was
//! logged but not committed to that batch committed. The pipeline has a
//! generator receiver with the write-ahead log, the block tracker's event
//! log, a named windowed state restored from its snapshot and rebuilt past
//! it, and an output. Spark Streaming needs 8.6 s (WAL off) to 15 s (WAL on)
//! to its first completed batch after a kill -9; the target is 0.5 s.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration as StdDuration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_receiver::{GeneratorReceiver, GeneratorSettings};
use spate_runtime::{BackpressureSettings, PipelineBuilder, ReceiverSettings, StreamingContext, StreamingSettings};

const START: i64 = 1_000_000;
const BOUND_MS: f64 = 500.0;

fn is_bench() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn settings(clock: &ManualClock) -> StreamingSettings {
    StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_checkpoint_interval(Duration::from_secs(4))
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() })
}

/// Words from the generator (WAL on), counted over a 10 s window with an
/// inverse, written by an output that fails while `crash` is set.
fn pipeline(p: &mut PipelineBuilder, rate: u64, crash: Arc<AtomicBool>) {
    let mut generator = GeneratorSettings::new(7);
    generator.records_per_sec = Some(rate);
    let words = p.receiver_stream("words", ReceiverSettings::default(), move |resume| {
        GeneratorReceiver::resuming_at(generator, resume.records_stored)
    });
    words
        .map(|w: String| (w, 1u64))
        .reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(10), Duration::from_secs(1))
        .name("window-counts")
        .foreach_batch(move |batch, _| {
            if crash.load(Ordering::Acquire) {
                return Err("crashed".into());
            }
            std::hint::black_box(batch.len());
            Ok(())
        })
        .name("out");
}

/// Runs `batches` committed batches, then one whose output fails: the
/// directory is left with that batch logged and not committed.
fn prepare(dir: &Path, batches: u64, rate: u64) -> ManualClock {
    let clock = ManualClock::new(Time::from_millis(START));
    let crash = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&crash);
    let mut ctx = StreamingContext::get_or_create(dir, settings(&clock), move |p| {
        pipeline(p, rate, flag);
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    for batch in 0..batches {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), StdDuration::from_secs(60)), "{:?}", ctx.failure());
    }
    crash.store(true, Ordering::Release);
    clock.advance(Duration::from_secs(1));
    assert!(ctx.await_termination().is_err());
    assert!(dir.join(format!("offsets/{batches}")).exists() && !dir.join(format!("commits/{batches}")).exists());
    clock.advance(Duration::from_millis(500));
    clock
}

/// Starts on the prepared directory and waits for the re-run batch to commit.
fn recover(dir: &Path, clock: &ManualClock, rerun: BatchId, rate: u64) -> StdDuration {
    let started = Instant::now();
    let mut ctx = StreamingContext::get_or_create(dir, settings(clock), move |p| {
        pipeline(p, rate, Arc::new(AtomicBool::new(false)));
        Ok(())
    })
    .unwrap();
    assert_eq!(ctx.recovery().unwrap().rerun_batch, Some(rerun));
    ctx.start().unwrap();
    assert!(ctx.await_committed(rerun, StdDuration::from_secs(60)), "{:?}", ctx.failure());
    let took = started.elapsed();
    ctx.stop_handle().stop_now();
    let _ = ctx.await_termination();
    took
}

fn bench_recovery(c: &mut Criterion) {
    let (batches, rate) = if is_bench() { (9, 100_000) } else { (2, 1000) };
    let times = RefCell::new(Vec::new());
    let mut group = c.benchmark_group("runtime");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(StdDuration::from_millis(1))
        .measurement_time(StdDuration::from_secs(1));
    group.bench_function("recovery", |b| {
        b.iter_custom(|iters| {
            let mut total = StdDuration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().unwrap();
                let clock = prepare(dir.path(), batches, rate);
                let took = recover(dir.path(), &clock, BatchId(batches), rate);
                times.borrow_mut().push(took);
                total += took;
            }
            total
        });
    });
    group.finish();
    let mut times = times.into_inner();
    times.sort_unstable();
    if let Some(median) = times.get(times.len() / 2) {
        let ms = median.as_secs_f64() * 1000.0;
        println!("BENCH runtime_recovery {ms:.1} ms bound={BOUND_MS} ratio={:.3}", ms / BOUND_MS);
    }
}

criterion_group!(benches, bench_recovery);
criterion_main!(benches);
