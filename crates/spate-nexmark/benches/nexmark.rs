//! The Nexmark queries, events per CPU-second, beside Flink's published
//! figures.
//!
//! Each query of [`QUERIES`] runs the same number of generated events
//! twice:
//!
//! - `on`: through a `StreamingContext` with a checkpoint directory, as a
//!   job runs exactly-once: the source's range is logged to `offsets/N`
//!   before each batch, `commits/N` after its output, and operator state is
//!   snapshot every [`BATCHES_PER_CHECKPOINT`] batches. The batches tick
//!   on a manual clock that the benchmark moves as soon as the last batch
//!   committed, so the run goes as fast as the engine does;
//! - `off`: the same graph driven by `Graph::run_batch`, with no log and no
//!   state snapshots.
//!
//! The generator runs at each query's rate of event time: [`FLINK_RATE`],
//! 10 M events a second as in the Flink runs, or [`EVENT_TIME_RATE`] for
//! the queries over event time, so that a run's events span windows and
//! expiries that close. A batch covers [`BATCH_EVENTS`] events of event
//! time (50 ms at 10 M a second, 1 s at 500,000). The output counts its
//! rows and drops them (Flink's runs write to a blackhole sink).
//!
//! "Per core" is what the Nexmark project's README calls Throughput/Cores:
//! the events divided by the CPU-seconds the job used. Here that is the
//! user and system CPU time of this whole process (from `/proc/self/stat`)
//! over the run, the generator included, as Flink's figure includes its
//! source: nothing is subtracted. The wall-clock rate and the cores used
//! (CPU time over wall time) are printed too; on a shared machine they
//! depend on what else runs. Flink's figures are Flink 1.13 with RocksDB
//! state and exactly-once checkpoints every 3 minutes, on 8 workers, over
//! 100 M events; they are published figures, not measured here. The bound
//! of each `on` and `off` line is ten times Flink's figure.
//!
//! ```sh
//! cargo xtask bench nexmark                      # every query but q10, 10 M events each
//! cargo xtask bench nexmark -- --events 2000000 q1
//! ```
//!
//! `--events N` (or `NEXMARK_EVENTS=N`) sets the events a run; other
//! arguments name the queries to run. Without `--bench` (as `cargo test
//! --all-targets` runs it) every query runs on a few batches only.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fmt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration as StdDuration, Instant};

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::{DStream, Data, GraphBuilder};
use spate_nexmark::{Event, GeneratorSettings, NexmarkGenerator, NexmarkSource, queries};
use spate_runtime::{BackpressureSettings, StreamingContext, StreamingSettings};

/// Events per second of event time: the generator rate of the Flink runs.
const FLINK_RATE: f64 = 10_000_000.0;
/// The rate of the queries over event time. They emit once the watermark,
/// 4 s behind the events, passes an auction's expiry (q6, q9) or the end of
/// a 10 s window (q5, q7, q8, q11): at [`FLINK_RATE`] a run of 10 M events
/// spans 1 s of event time and they would emit nothing; at this rate it
/// spans 20 s. (Flink's runs end their input with a final watermark, which
/// closes everything.) q12's windows of 10 s of processing time close in
/// the same 20 batches of 1 s.
const EVENT_TIME_RATE: f64 = 500_000.0;
/// A batch interval holds this many events at the query's rate.
const BATCH_EVENTS: u64 = 500_000;
/// State snapshots every ten batches (5 M events, a second or two here);
/// Flink's runs checkpoint every 3 minutes.
const BATCHES_PER_CHECKPOINT: u64 = 10;
/// Partitions of the input, generated and processed in parallel. Two a
/// core ran about 5% faster than one here: half the memory a partition,
/// and a core that finishes early takes another.
const PARTITIONS_PER_CORE: usize = 2;
/// Events a run under `cargo bench`: a few seconds a run on two cores.
const BENCH_EVENTS: u64 = 10_000_000;
/// Under `cargo test` (a debug build): 60,000 events, every rate a
/// hundredth, so twelve batches of the same intervals (the runs snapshot
/// state too).
const TEST_EVENTS: u64 = 60_000;
const TEST_SCALE: f64 = 100.0;
/// The target: ten times Flink's events per CPU-second.
const TARGET_OVER_FLINK: f64 = 10.0;
/// The event time of the first event (a multiple of the batch interval).
const START_MS: i64 = 1_700_000_000_000;
const SEED: u64 = 42;
/// How long a batch may take before the run is declared stuck.
const BATCH_TIMEOUT: StdDuration = StdDuration::from_secs(300);

/// The output's row count, shared with its sink.
type Rows = Arc<AtomicU64>;

/// One query: its name, Flink's figure, the rate of event time it runs
/// at, and how it is declared on the events with a sink counting its rows.
struct Query {
    name: &'static str,
    /// Flink 1.13's events per CPU-second (the Nexmark README's
    /// Throughput/Cores).
    flink: f64,
    /// Events per second of event time.
    rate: f64,
    declare: fn(&DStream<Event>, &Rows),
}

impl Query {
    /// [`BATCH_EVENTS`] events at the query's rate.
    fn batch_interval(&self) -> Duration {
        Duration::from_millis((BATCH_EVENTS as f64 * 1000.0 / self.rate).round().max(1.0) as u64)
    }
}

/// The queries, one line each, with Flink's figures. A query added to
/// `spate_nexmark::queries` is a line more: [`FLINK_RATE`] unless it waits
/// on event time or on processing-time windows, then [`EVENT_TIME_RATE`].
/// Flink has no figure for q6 (its SQL does not run there, FLINK-19059):
/// its line takes q9's, whose winning bids it averages. q10 writes files and
/// is not here.
#[rustfmt::skip]
const QUERIES: &[Query] = &[
    Query { name: "q0", flink: 155_020.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q0(e), rows) },
    Query { name: "q1", flink: 157_940.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q1(e), rows) },
    Query { name: "q2", flink: 175_210.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q2(e), rows) },
    Query { name: "q3", flink: 152_120.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q3(e), rows) },
    Query { name: "q4", flink: 34_330.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q4(e), rows) },
    Query { name: "q5", flink: 22_140.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q5(e), rows) },
    Query { name: "q6", flink: 14_240.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q6(e), rows) },
    Query { name: "q7", flink: 12_330.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q7(e), rows) },
    Query { name: "q8", flink: 146_140.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q8(e), rows) },
    Query { name: "q9", flink: 14_240.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q9(e), rows) },
    Query { name: "q11", flink: 39_700.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q11(e), rows) },
    Query { name: "q12", flink: 75_670.0, rate: EVENT_TIME_RATE, declare: |e, rows| count(&queries::q12(e), rows) },
    Query {
        name: "q13",
        flink: 130_730.0,
        rate: FLINK_RATE,
        declare: |e, rows| count(&queries::q13(e, &queries::q13_side_input(Q13_SIDE_ROWS)), rows),
    },
    Query { name: "q14", flink: 161_230.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q14(e), rows) },
    Query { name: "q15", flink: 72_420.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q15(e), rows) },
    Query { name: "q16", flink: 18_650.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q16(e), rows) },
    Query { name: "q17", flink: 116_800.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q17(e), rows) },
    Query { name: "q18", flink: 53_700.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q18(e), rows) },
    Query { name: "q19", flink: 44_040.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q19(e), rows) },
    Query { name: "q20", flink: 18_980.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q20(e), rows) },
    Query { name: "q21", flink: 98_490.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q21(e), rows) },
    Query { name: "q22", flink: 129_960.0, rate: FLINK_RATE, declare: |e, rows| count(&queries::q22(e), rows) },
];

/// The rows of q13's side input: keys 0 to 9,999, one for every value of
/// its key (an auction modulo 10,000), as the spec's runs generate it.
const Q13_SIDE_ROWS: i64 = 10_000;

/// Registers the output of a query: it counts the rows of each batch.
fn count<T: Data>(stream: &DStream<T>, rows: &Rows) {
    let rows = Arc::clone(rows);
    stream
        .foreach_batch(move |batch, _info| {
            rows.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        })
        .name("sink");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    On,
    Off,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Mode::On => "on",
            Mode::Off => "off",
        })
    }
}

/// What one run measured.
struct Run {
    query: &'static str,
    mode: Mode,
    flink: f64,
    events: u64,
    /// Events per second of event time.
    rate: f64,
    rows: u64,
    batches: u64,
    cpu_seconds: f64,
    wall_seconds: f64,
}

impl Run {
    fn measured(query: &Query, mode: Mode, options: &Options, rows: &Rows, batches: u64, watch: &Stopwatch) -> Run {
        let (wall_seconds, cpu_seconds) = watch.stop();
        Run {
            query: query.name,
            mode,
            flink: query.flink,
            events: options.events,
            rate: query.rate / options.scale,
            rows: rows.load(Ordering::Relaxed),
            batches,
            cpu_seconds,
            wall_seconds,
        }
    }

    fn per_cpu_second(&self) -> f64 {
        self.events as f64 / self.cpu_seconds.max(1e-9)
    }

    fn per_wall_second(&self) -> f64 {
        self.events as f64 / self.wall_seconds.max(1e-9)
    }

    fn cores(&self) -> f64 {
        self.cpu_seconds / self.wall_seconds.max(1e-9)
    }

    fn bound(&self) -> f64 {
        self.flink * TARGET_OVER_FLINK
    }

    fn bench_line(&self) -> String {
        let value = self.per_cpu_second();
        format!(
            "BENCH nexmark_{}_{} {value:.0} events/s/core bound={:.0} ratio={:.3}",
            self.query,
            self.mode,
            self.bound(),
            value / self.bound()
        )
    }
}

/// CPU seconds this process used so far, user and system, every thread
/// (exited ones too), from `/proc/self/stat`.
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line (12 and 13 after the
    // name), in clock ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// A point in wall and CPU time.
struct Stopwatch {
    wall: Instant,
    cpu: f64,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch { wall: Instant::now(), cpu: process_cpu_seconds() }
    }

    /// Wall and CPU seconds since the start.
    fn stop(&self) -> (f64, f64) {
        (self.wall.elapsed().as_secs_f64(), process_cpu_seconds() - self.cpu)
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// A source of exactly `events` events at `rate` a second from
/// [`START_MS`], in [`PARTITIONS_PER_CORE`] partitions a core.
fn source(events: u64, rate: f64) -> Arc<NexmarkSource> {
    let config = GeneratorSettings::new(SEED, START_MS).with_rate(rate).with_max_events(events);
    Arc::new(NexmarkSource::new(NexmarkGenerator::new(config).unwrap()).with_partitions(PARTITIONS_PER_CORE * cores()))
}

/// Checkpoints go to `$SPATE_BENCH_DIR`, else `/var/tmp` (a disk, where
/// `/tmp` may be memory), as a job's would.
fn checkpoint_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SPATE_BENCH_DIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("spate-nexmark-bench").tempdir_in(base).unwrap()
}

/// The query through a `StreamingContext` with a checkpoint: exactly-once.
fn run_on(query: &Query, options: &Options) -> Run {
    let interval = query.batch_interval();
    let dir = checkpoint_dir();
    let source = source(options.events, query.rate / options.scale);
    let clock = ManualClock::new(Time::from_millis(START_MS));
    // The clock moves only when a batch committed, so no batch waits behind
    // another and the rate estimator has nothing to hold back.
    let settings = StreamingSettings::new(interval)
        .with_clock(Arc::new(clock.clone()))
        .with_checkpoint_interval(interval.times(BATCHES_PER_CHECKPOINT))
        // The generator's own cap (ten seconds of events) sizes the batches.
        .with_max_records_per_batch(u64::MAX)
        .with_backpressure(BackpressureSettings { enabled: false, ..BackpressureSettings::default() });
    let rows = Rows::default();
    let watch = Stopwatch::start();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, |p| {
        let input = p.replayable_input("nexmark", Arc::clone(&source), Some(source.resume_hook()), None);
        (query.declare)(&input, &rows);
        Ok(())
    })
    .unwrap();
    ctx.start().unwrap();
    let mut batches = 0;
    while !source.is_exhausted() {
        clock.advance(interval);
        let committed = ctx.await_committed(BatchId(batches), BATCH_TIMEOUT);
        assert!(committed, "{} batch {batches} did not commit: {:?}", query.name, ctx.failure());
        batches += 1;
    }
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
    Run::measured(query, Mode::On, options, &rows, batches, &watch)
}

/// The same graph batch by batch, without offset log, commits or state
/// snapshots.
fn run_off(query: &Query, options: &Options) -> Run {
    let interval = query.batch_interval();
    let source = source(options.events, query.rate / options.scale);
    let rows = Rows::default();
    let watch = Stopwatch::start();
    // Stateful queries are refused without a checkpoint configured; none is
    // written here, since nothing calls the graph's snapshot.
    let builder = GraphBuilder::new(interval).checkpointing(true);
    let input = builder.input("nexmark", Arc::clone(&source));
    (query.declare)(&input, &rows);
    drop(input);
    let mut graph = builder.build().unwrap();
    let mut batches = 0;
    let mut time = Time::from_millis(START_MS);
    while !source.is_exhausted() {
        time = time + interval;
        graph.run_batch(time, BatchId(batches)).unwrap();
        batches += 1;
    }
    drop(graph);
    Run::measured(query, Mode::Off, options, &rows, batches, &watch)
}

/// What to run, from the arguments and the environment.
struct Options {
    events: u64,
    /// Every query's rate is divided by this (1 under `cargo bench`).
    scale: f64,
    only: Vec<String>,
}

impl Options {
    fn parse() -> Options {
        let full = std::env::args().any(|a| a == "--bench");
        let mut events = std::env::var("NEXMARK_EVENTS").ok().map(|v| v.parse().expect("NEXMARK_EVENTS: a number"));
        let mut only = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--events" => events = Some(args.next().and_then(|v| v.parse().ok()).expect("--events N")),
                other if other.starts_with('-') => {}
                name => only.push(name.to_string()),
            }
        }
        let (default_events, scale) = if full { (BENCH_EVENTS, 1.0) } else { (TEST_EVENTS, TEST_SCALE) };
        Options { events: events.unwrap_or(default_events), scale, only }
    }

    fn selects(&self, query: &Query) -> bool {
        self.only.is_empty() || self.only.iter().any(|name| name == query.name)
    }
}

/// `1.23 M` or `456.78 K`.
fn si(value: f64) -> String {
    // Millions from what rounds to 1000.00 K up.
    if value >= 999_995.0 { format!("{:.2} M", value / 1e6) } else { format!("{:.2} K", value / 1e3) }
}

fn print_table(runs: &[Run]) {
    println!();
    println!("Nexmark, events per CPU-second (Flink 1.13: the Nexmark README's Throughput/Cores)");
    println!(
        "{:<5} {:<4} {:>10} {:>9} {:>8} {:>10} {:>12} {:>12} {:>6} {:>12} {:>8}",
        "query", "ckpt", "events", "rate", "batches", "rows", "per core", "wall", "cores", "Flink/core", "x Flink"
    );
    for run in runs {
        println!(
            "{:<5} {:<4} {:>10} {:>9} {:>8} {:>10} {:>12} {:>12} {:>6.2} {:>12} {:>8.1}",
            run.query,
            run.mode,
            run.events,
            si(run.rate),
            run.batches,
            run.rows,
            si(run.per_cpu_second()),
            si(run.per_wall_second()),
            run.cores(),
            si(run.flink),
            run.per_cpu_second() / run.flink
        );
    }
}

fn main() {
    let options = Options::parse();
    // Under `cargo xtask bench FILTER` every benchmark gets the filter;
    // say so when it names none of these queries.
    for name in options.only.iter().filter(|name| !QUERIES.iter().any(|q| q.name == name.as_str())) {
        let known: Vec<&str> = QUERIES.iter().map(|q| q.name).collect();
        println!("nexmark: no query named {name} (there are {})", known.join(", "));
    }
    println!(
        "nexmark: {} events a run, {} a batch, state snapshots every {BATCHES_PER_CHECKPOINT} batches, {} partitions, \
         {} cores",
        options.events,
        (BATCH_EVENTS as f64 / options.scale).round(),
        PARTITIONS_PER_CORE * cores(),
        cores()
    );
    let mut runs = Vec::new();
    for query in QUERIES.iter().filter(|q| options.selects(q)) {
        let on = run_on(query, &options);
        println!("{}", on.bench_line());
        let off = run_off(query, &options);
        println!("{}", off.bench_line());
        // Both ways read the same events, so the query gives the same rows.
        assert_eq!(on.rows, off.rows, "{}: {} rows with checkpoints, {} without", query.name, on.rows, off.rows);
        runs.extend([on, off]);
    }
    print_table(&runs);
}
