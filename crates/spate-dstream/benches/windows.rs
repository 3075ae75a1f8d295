//! Windowed aggregation throughput, driving the graph batch by batch.
//!
//! - `dstream_windowed_wordcount`: random words from a 10,000-word
//!   vocabulary, 1 s batches, `reduce_by_key_and_window_inv(sum, minus, 30 s,
//!   2 s)`. The bound, 1,000,000 records/s, is Spark Streaming's figure for
//!   this job on a 2-core machine (`local[2]`); it is a published reference,
//!   not measured here, since no JVM runs in this benchmark.
//! - `dstream_sliding_max_wN`: the same stream with a non-invertible `max`
//!   over window/slide = 15, 60 and 300 (slide 2 s). The pane/two-stack
//!   window should cost the same per slide whatever the ratio, so each is
//!   printed with the ratio-15 figure, measured in the same run, as its bound.
//!
//! Words are fixed 16-byte arrays (a user key type; no allocation per
//! record); a `String` variant is printed for comparison.
//!
//! The machine is shared, so throughput is measured per core: records per
//! second of CPU time the process used (from `/proc/self/stat`), times the
//! number of cores for the figure "on all cores". The wall-clock rate, which
//! depends on whatever else runs at the time, is printed too.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{BoxError, Data, Graph, GraphBuilder, InputSource, Key};

mod common;
use common::{Rng, full_run};

type Word = [u8; 16];

const VOCABULARY: usize = 10_000;
const BATCH: Duration = Duration::from_secs(1);

fn vocabulary() -> Vec<Word> {
    (0..VOCABULARY)
        .map(|i| {
            let mut word = [0u8; 16];
            let text = format!("word{i:05}x{}", i % 7);
            word[..text.len()].copy_from_slice(text.as_bytes());
            word
        })
        .collect()
}

/// Replays a few pre-generated batches over and over (generation is not measured; copying is).
struct CyclingSource<T> {
    batches: Vec<Vec<Vec<T>>>,
    next: AtomicUsize,
}

impl<T: Clone + Send + Sync> InputSource<T> for CyclingSource<T> {
    fn compute(&self, _time: Time, _planned: Option<&str>) -> Result<Vec<Vec<T>>, BoxError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.batches.len();
        Ok(self.batches[index].clone())
    }
}

fn generate<T>(records_per_batch: usize, partitions: usize, make: impl Fn(&mut Rng) -> T) -> Vec<Vec<Vec<T>>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..4)
        .map(|_| {
            (0..partitions).map(|_| (0..records_per_batch / partitions).map(|_| make(&mut rng)).collect()).collect()
        })
        .collect()
}

/// A graph over one cycling input, and the batch clock that drives it.
struct Driver {
    graph: Graph,
    batch: i64,
    records_per_batch: u64,
    output_records: Arc<AtomicU64>,
}

impl Driver {
    fn new<T: Data, W: Key>(
        batches: Vec<Vec<Vec<T>>>,
        pipeline: impl FnOnce(spate_dstream::DStream<T>) -> spate_dstream::DStream<(W, u64)>,
    ) -> Self {
        let records_per_batch = batches[0].iter().map(Vec::len).sum::<usize>() as u64;
        let builder = GraphBuilder::new(BATCH).checkpointing(true);
        let input = builder.input("words", Arc::new(CyclingSource { batches, next: AtomicUsize::new(0) }));
        let output_records = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&output_records);
        pipeline(input).foreach_batch(move |batch, _| {
            counter.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        });
        Driver { graph: builder.build().unwrap(), batch: 0, records_per_batch, output_records }
    }

    fn run_batches(&mut self, n: usize) {
        for _ in 0..n {
            self.batch += 1;
            let time = Time::from_millis(self.batch * 1000);
            self.graph.run_batch(time, BatchId(self.batch as u64)).unwrap();
        }
    }

    /// Runs `n` batches (after whatever ran before) and returns the rates.
    fn measure(&mut self, n: usize) -> Rates {
        let (start, cpu_start) = (Instant::now(), cpu_seconds());
        self.run_batches(n);
        let wall = start.elapsed().as_secs_f64();
        let records = (n as u64 * self.records_per_batch) as f64;
        let per_core = match (cpu_start, cpu_seconds()) {
            (Some(before), Some(after)) if after > before => records / (after - before),
            _ => records / wall / cores() as f64,
        };
        Rates { wall: records / wall, per_core }
    }
}

/// Throughput over a measured run.
struct Rates {
    /// Records per wall-clock second (depends on what else the machine runs).
    wall: f64,
    /// Records per second of CPU time this process used: per core.
    per_core: f64,
}

impl Rates {
    /// What the machine's cores sustain when the job has them to itself.
    fn all_cores(&self) -> f64 {
        self.per_core * cores() as f64
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// CPU time (user + system, all threads) this process used, from
/// `/proc/self/stat` (in clock ticks of 1/100 s on Linux).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn wordcount<T: Data, W: Key>(batches: Vec<Vec<Vec<T>>>, to_word: fn(T) -> W) -> Driver {
    Driver::new(batches, move |words| {
        words.map(move |w| (to_word(w), 1u64)).reduce_by_key_and_window_inv(
            |a, b| a + b,
            |a, b| a - b,
            Duration::from_secs(30),
            Duration::from_secs(2),
        )
    })
}

fn sliding_max(batches: Vec<Vec<Vec<(Word, u64)>>>, ratio: u64) -> Driver {
    Driver::new(batches, move |pairs| {
        pairs.reduce_by_key_and_window(|a, b| *a.max(b), Duration::from_secs(2 * ratio), Duration::from_secs(2))
    })
}

fn benches(c: &mut Criterion) {
    let full = full_run();
    let cores = cores();
    let words = vocabulary();

    // Windowed word count with an inverse function.
    let per_batch = if full { 2_000_000 } else { 20_000 };
    let batches = generate(per_batch, cores, |rng| words[rng.next() as usize % VOCABULARY]);
    let mut driver = wordcount(batches, |w| w);
    driver.run_batches(32); // fill the 30 s window: steady state from here on
    let rates = driver.measure(if full { 40 } else { 4 });
    // Bound: Spark Streaming 4.3, local[2], same job (published figure, not measured here).
    let spark = 1_000_000.0;
    println!(
        "BENCH dstream_windowed_wordcount {:.0} records/s bound={spark:.0} ratio={:.2}",
        rates.all_cores(),
        rates.all_cores() / spark
    );
    println!(
        "BENCH dstream_windowed_wordcount_per_core {:.0} records/s bound={:.0} ratio={:.2}",
        rates.per_core,
        spark / 2.0,
        rates.per_core / (spark / 2.0)
    );
    println!(
        "BENCH dstream_windowed_wordcount_wall_clock {:.0} records/s bound={spark:.0} ratio={:.2}",
        rates.wall,
        rates.wall / spark
    );
    c.bench_function("windowed_wordcount_slide", |b| b.iter(|| driver.run_batches(2)));
    black_box(driver.output_records.load(Ordering::Relaxed));

    // The same with String words, for comparison with the JVM's strings.
    let per_batch_strings = if full { 1_000_000 } else { 10_000 };
    let string_batches = generate(per_batch_strings, cores, |rng| {
        String::from_utf8_lossy(&words[rng.next() as usize % VOCABULARY]).trim_end_matches('\0').to_string()
    });
    let mut strings = wordcount(string_batches, |w| w);
    strings.run_batches(32);
    let string_rates = strings.measure(if full { 20 } else { 2 });
    println!(
        "BENCH dstream_windowed_wordcount_strings {:.0} records/s bound={spark:.0} ratio={:.2}",
        string_rates.all_cores(),
        string_rates.all_cores() / spark
    );

    // Non-invertible max: cost per slide should not grow with window/slide.
    let per_batch_max = if full { 100_000 } else { 2_000 };
    let pairs = generate(per_batch_max, cores, |rng| (words[rng.next() as usize % VOCABULARY], rng.next() % 1_000_000));
    let mut baseline = None;
    for ratio in [15u64, 60, 300] {
        let mut driver = sliding_max(pairs.clone(), ratio);
        // Fill the window, then measure whole two-stack cycles (a rebuild of
        // the front stack every `ratio` slides) so the amortized cost shows.
        driver.run_batches(2 * ratio as usize + 2);
        let slides = if full { 300 } else { 2 };
        let rate = driver.measure(2 * slides).all_cores();
        let bound = *baseline.get_or_insert(rate);
        println!("BENCH dstream_sliding_max_w{ratio} {rate:.0} records/s bound={bound:.0} ratio={:.2}", rate / bound);
        c.bench_function(&format!("sliding_max_w{ratio}_slide"), |b| b.iter(|| driver.run_batches(2)));
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
}

criterion_group! { name = group; config = config(); targets = benches }
criterion_main!(group);
