//! The demo end to end at steady state, write-ahead log on (fdatasync on
//! every block): generator receiver of String words, each block counted
//! in place as it arrives, windowed word count with an inverse,
//! backpressure on. Prints the records per second sustained and the peak
//! resident set size. Spark Streaming holds about 1.0 M records/s with
//! 1-2 GB of RSS on 2 cores; the targets are >= 20 M records/s and <= 200 MB.
//!
//! Each figure is measured at three key cardinalities, words drawn by
//! Zipf's law of exponent 1 (the demo's default) from 32, 10,000 and
//! 1,000,000 distinct words, and named by it (`..._keys_<N>`): combining a
//! block on arrival turns 256 Ki words into at most N pairs, so the window
//! holds N keys, and a figure at 32 keys says little about a real
//! vocabulary. The runs share one process; the peak RSS is reset
//! (`/proc/self/clear_refs`) before each, so each peak is its own run's
//! (memory a run freed but the allocator kept counts in the next).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::QueueSource;
use spate_receiver::WordGenerator;
use spate_runtime::demo::{DemoSettings, word_count_context};
use spate_runtime::{
    BackpressureSettings, BatchProgress, PidSettings, ProgressListener, StreamingContext, StreamingSettings,
};

const TARGET_RECORDS_PER_SEC: f64 = 20_000_000.0;
const TARGET_RSS_MB: f64 = 200.0;
/// The windowed word count measured on this machine with the inline word
/// type the demo used to have (issue 17's figure); String words, which the
/// demo uses now, are to be within 1.5x of it.
const INLINE_WORDS_QUOTED: f64 = 57_800_000.0;

fn is_bench() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Each committed batch: its records, when it committed, and the process's CPU seconds then.
#[derive(Default)]
struct Commits(Mutex<Vec<(u64, Instant, f64)>>);

impl ProgressListener for Commits {
    fn on_batch_completed(&self, progress: &BatchProgress) {
        self.0.lock().unwrap().push((progress.input_records, Instant::now(), process_cpu_seconds()));
    }
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// CPU seconds this process used so far (user and system), from /proc.
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

/// Records per second of wall time, and per CPU second, sustained after
/// `warm_up` batches of a run of `run` real time.
struct Throughput {
    per_second: f64,
    per_cpu_second: f64,
}

/// The key cardinalities every figure is measured at.
const KEY_COUNTS: [u64; 3] = [32, 10_000, 1_000_000];

/// Resets the process's peak RSS (`VmHWM`) to its current RSS; false when
/// the kernel does not allow it (the peak then covers the runs before).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn steady_state_throughput(interval: Duration, run: StdDuration, warm_up: usize, keys: u64) -> Throughput {
    let dir = tempfile::tempdir().unwrap();
    // Spark's PID takes a full step to each batch's processing rate. At
    // 100 ms batches on two cores shared with the receiver, that rate swings
    // with the receiver's share of the processors, and full steps overshoot
    // into a backlog (a higher peak of memory); half steps follow it smoothly.
    let settings = StreamingSettings::new(interval).with_backpressure(BackpressureSettings {
        initial_rate: Some(4_000_000.0),
        pid: PidSettings { proportional: 0.5, ..PidSettings::default() },
        ..BackpressureSettings::default()
    });
    let options = DemoSettings { keys, ..DemoSettings::new(7) };
    let mut ctx = word_count_context(Some(dir.path()), settings, &options).unwrap();
    let commits = Arc::new(Commits::default());
    ctx.add_progress_listener(commits.clone());
    ctx.start().unwrap();
    std::thread::sleep(run);
    ctx.stop_handle().stop_now();
    ctx.await_termination().unwrap();
    let commits = commits.0.lock().unwrap();
    let steady = commits.get(warm_up..).unwrap_or_default();
    match (steady.first(), steady.last()) {
        (Some(first), Some(last)) if last.1 > first.1 => {
            let records = steady.iter().skip(1).map(|(n, _, _)| n).sum::<u64>() as f64;
            Throughput {
                per_second: records / last.1.duration_since(first.1).as_secs_f64(),
                per_cpu_second: records / (last.2 - first.2).max(0.01),
            }
        }
        _ => Throughput { per_second: 0.0, per_cpu_second: 0.0 },
    }
}

/// One batch of words through the demo's graph (no receiver), per batch size.
fn bench_graph_batch(c: &mut Criterion) {
    let words_per_batch = if is_bench() { 1_000_000 } else { 10_000 };
    let words = WordGenerator::new(7).words(0, words_per_batch);
    let mut group = c.benchmark_group("runtime");
    group.sample_size(10).measurement_time(StdDuration::from_secs(3));
    group.throughput(criterion::Throughput::Elements(words_per_batch as u64));
    group.bench_function("word_count_batch", |b| {
        b.iter_batched(
            || {
                let clock = ManualClock::new(Time::from_millis(1_000_000));
                let settings = StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()));
                let queue = Arc::new(QueueSource::new());
                queue.push(words.clone());
                let input = Arc::clone(&queue);
                let ctx = StreamingContext::new(settings, move |p| {
                    p.input("words", input)
                        .map(|w: String| (w, 1u64))
                        .reduce_by_key(|a, b| a + b)
                        .foreach_batch(|batch, _| {
                            std::hint::black_box(batch.len());
                            Ok(())
                        })
                        .name("counts");
                    Ok(())
                })
                .unwrap();
                (ctx, clock)
            },
            |(mut ctx, clock)| {
                ctx.start().unwrap();
                clock.advance(Duration::from_secs(1));
                assert!(ctx.await_committed(BatchId(0), StdDuration::from_secs(60)));
                ctx.stop_handle().stop_now();
                ctx.await_termination().unwrap();
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

fn bench_end_to_end(c: &mut Criterion) {
    let (interval, run, warm_up) = if is_bench() {
        // 100 ms batches: a batch is held decoded while it runs (24 B a
        // word), so memory is bounded by rate x interval, which backpressure
        // bounds; the window stays 30 s sliding by 2 s.
        (Duration::from_millis(100), StdDuration::from_secs(14), 20)
    } else {
        (Duration::from_millis(200), StdDuration::from_millis(1500), 1)
    };
    for keys in KEY_COUNTS {
        let peak_reset = reset_peak_rss();
        let throughput = steady_state_throughput(interval, run, warm_up, keys);
        print_figures(keys, &throughput, peak_reset);
    }
    // After the end-to-end run, so its batches do not count in the peak RSS above.
    bench_graph_batch(c);
}

/// The BENCH lines of one key cardinality.
fn print_figures(keys: u64, throughput: &Throughput, peak_reset: bool) {
    let within = INLINE_WORDS_QUOTED / 1.5;
    println!(
        "BENCH runtime_demo_throughput_keys_{keys} {:.0} records/s bound={TARGET_RECORDS_PER_SEC:.0} ratio={:.3} \
         inline_words_quoted={INLINE_WORDS_QUOTED:.0} within_1.5x={within:.0} ratio_1.5x={:.2}",
        throughput.per_second,
        throughput.per_second / TARGET_RECORDS_PER_SEC,
        throughput.per_second / within
    );
    // The machine is shared: per CPU second is the figure other load does not
    // skew. The target, 20 M/s on 2 cores, is 10 M per CPU second.
    let per_core_target = TARGET_RECORDS_PER_SEC / 2.0;
    println!(
        "BENCH runtime_demo_throughput_per_cpu_keys_{keys} {:.0} records/cpu-s bound={per_core_target:.0} ratio={:.3}",
        throughput.per_cpu_second,
        throughput.per_cpu_second / per_core_target
    );
    let rss = peak_rss_mb();
    // peak_reset=false: the kernel refused the reset, so the peak covers the runs before too.
    println!(
        "BENCH runtime_demo_peak_rss_keys_{keys} {rss:.1} MB bound={TARGET_RSS_MB:.0} ratio={:.3} peak_reset={peak_reset}",
        rss / TARGET_RSS_MB
    );
}

criterion_group!(benches, bench_end_to_end);
criterion_main!(benches);
