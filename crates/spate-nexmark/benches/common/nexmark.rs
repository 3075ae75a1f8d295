//! The Nexmark queries, events per CPU-second, beside the best published
//! per-core figures: the body of the two Nexmark benchmarks, `nexmark`
//! (mimalloc as the global allocator) and `nexmark_system_alloc` (the
//! process's default allocator, the system's `malloc`), which include it
//! with `#[path]` and differ only in their allocator.
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
//! rows and drops them (the published runs write to a blackhole sink),
//! except q10's, which writes them through `spate-files`' exactly-once
//! sink, partitioned by minute, into a fresh directory a run (see
//! [`q10_output_dir`]).
//!
//! "Per core" is what the Nexmark project's README calls Throughput/Cores:
//! the events divided by the CPU-seconds the job used. Here that is the
//! user and system CPU time of this whole process (from `/proc/self/stat`)
//! over the run, the generator included, as the published figures include
//! their source: nothing is subtracted. The wall-clock rate and the cores
//! used (CPU time over wall time) are printed too; on a shared machine they
//! depend on what else runs.
//!
//! The published figures, none measured here (each query's [`Published`]):
//!
//! - DBSP, q0-q4: the `Throughput/Cores` column of the run of 100 M events
//!   on 8 cores (events over cores times elapsed seconds, in memory, no
//!   checkpoints) posted in vmware-archive/database-stream-processor pull
//!   request 198 (2022-09-28);
//! - Feldera, q0-q9 and q12-q22: the "16-core Nexmark Streaming
//!   Performance" table of `benchmark/README.md` in feldera/feldera
//!   (Feldera streaming, events per second on 16 cores), divided by 16;
//! - Flink 1.13, every query but q6: the Throughput/Cores column of the
//!   nexmark/nexmark README (RocksDB state, exactly-once checkpoints every
//!   3 minutes, 8 workers, 100 M events).
//!
//! A query's best published figure is the highest of its figures; the
//! bound of each `BENCH` line is twice it, the target with checkpoints on.
//!
//! ```sh
//! cargo xtask bench nexmark                      # every query, 10 M events each, both allocators
//! cargo xtask bench nexmark -- --events 2000000 q1
//! ```
//!
//! `--events N` (or `NEXMARK_EVENTS=N`) sets the events a run; other
//! arguments name the queries to run. Without `--bench` (as `cargo test
//! --all-targets` runs it) every query runs on a few batches only.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration as StdDuration, Instant};

use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::{DStream, Data, GraphBuilder};
use spate_files::{FileSink, FileSinkSettings, Partitioning};
use spate_nexmark::queries::Q10Row;
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
/// The target: twice the best published events per core, with checkpoints on.
const TARGET_OVER_BEST: f64 = 2.0;
/// The event time of the first event (a multiple of the batch interval).
const START_MS: i64 = 1_700_000_000_000;
const SEED: u64 = 42;
/// How long a batch may take before the run is declared stuck.
const BATCH_TIMEOUT: StdDuration = StdDuration::from_secs(300);

/// Who published a figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Dbsp,
    Feldera,
    Flink,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Source::Dbsp => "DBSP",
            Source::Feldera => "Feldera",
            Source::Flink => "Flink 1.13",
        })
    }
}

/// A query's published events per core, where published (see the module
/// documentation for where each comes from).
#[derive(Clone, Copy)]
struct Published {
    dbsp: Option<f64>,
    /// Feldera's 16-core events per second, as published; divided by 16 here.
    feldera_16_cores: Option<f64>,
    flink: Option<f64>,
}

impl Published {
    const fn new(dbsp: Option<f64>, feldera_16_cores: Option<f64>, flink: Option<f64>) -> Self {
        Published { dbsp, feldera_16_cores, flink }
    }

    /// The highest figure and its source.
    fn best(&self) -> (f64, Source) {
        let candidates = [
            (self.dbsp, Source::Dbsp),
            (self.feldera_16_cores.map(|f| f / 16.0), Source::Feldera),
            (self.flink, Source::Flink),
        ];
        candidates
            .into_iter()
            .filter_map(|(figure, source)| Some((figure?, source)))
            .fold((0.0, Source::Flink), |best, next| if next.0 > best.0 { next } else { best })
    }
}

/// Where a run's output goes: its row count, and the directory of q10's files.
struct Output {
    rows: Arc<AtomicU64>,
    files: PathBuf,
}

/// One query: its name, the published figures, the rate of event time it
/// runs at, and how it is declared on the events with a sink counting its
/// rows.
struct Query {
    name: &'static str,
    published: Published,
    /// Events per second of event time.
    rate: f64,
    declare: fn(&DStream<Event>, &Output),
}

impl Query {
    /// [`BATCH_EVENTS`] events at the query's rate.
    fn batch_interval(&self) -> Duration {
        Duration::from_millis((BATCH_EVENTS as f64 * 1000.0 / self.rate).round().max(1.0) as u64)
    }
}

/// Figures of DBSP, Feldera (16 cores) and Flink.
const fn published(dbsp: Option<f64>, feldera_16_cores: Option<f64>, flink: Option<f64>) -> Published {
    Published::new(dbsp, feldera_16_cores, flink)
}

/// The queries, one line each, with the published figures. A query added
/// to `spate_nexmark::queries` is a line more: [`FLINK_RATE`] unless it
/// waits on event time or on processing-time windows, then
/// [`EVENT_TIME_RATE`]. Flink has no figure for q6 (its SQL does not run
/// there, FLINK-19059), Feldera none for q10 and q11.
#[rustfmt::skip]
const QUERIES: &[Query] = &[
    Query { name: "q0", published: published(Some(1_172_778.0), Some(6_973_987.0), Some(155_020.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q0(e), out) },
    Query { name: "q1", published: published(Some(1_093_038.0), Some(6_595_871.0), Some(157_940.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q1(e), out) },
    Query { name: "q2", published: published(Some(1_094_335.0), Some(6_748_549.0), Some(175_210.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q2(e), out) },
    Query { name: "q3", published: published(Some(1_007_924.0), Some(6_608_075.0), Some(152_120.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q3(e), out) },
    // DBSP's q4 line: 100 M events in 123.216 core-seconds.
    Query { name: "q4", published: published(Some(811_583.0), Some(4_233_521.0), Some(34_330.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q4(e), out) },
    Query { name: "q5", published: published(None, Some(6_589_786.0), Some(22_140.0)), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q5(e), out) },
    Query { name: "q6", published: published(None, Some(3_997_921.0), None), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q6(e), out) },
    Query { name: "q7", published: published(None, Some(3_136_763.0), Some(12_330.0)), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q7(e), out) },
    Query { name: "q8", published: published(None, Some(6_641_870.0), Some(146_140.0)), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q8(e), out) },
    Query { name: "q9", published: published(None, Some(910_680.0), Some(14_240.0)), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q9(e), out) },
    Query { name: "q10", published: published(None, None, Some(57_810.0)), rate: FLINK_RATE, declare: write_q10_files },
    Query { name: "q11", published: published(None, None, Some(39_700.0)), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q11(e), out) },
    Query { name: "q12", published: published(None, Some(6_682_259.0), Some(75_670.0)), rate: EVENT_TIME_RATE, declare: |e, out| count(&queries::q12(e), out) },
    Query {
        name: "q13",
        published: published(None, Some(3_675_255.0), Some(130_730.0)),
        rate: FLINK_RATE,
        declare: |e, out| count(&queries::q13(e, &queries::q13_side_input(Q13_SIDE_ROWS)), out),
    },
    Query { name: "q14", published: published(None, Some(6_858_711.0), Some(161_230.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q14(e), out) },
    Query { name: "q15", published: published(None, Some(3_539_322.0), Some(72_420.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q15(e), out) },
    Query { name: "q16", published: published(None, Some(810_701.0), Some(18_650.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q16(e), out) },
    Query { name: "q17", published: published(None, Some(3_870_269.0), Some(116_800.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q17(e), out) },
    Query { name: "q18", published: published(None, Some(1_358_216.0), Some(53_700.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q18(e), out) },
    Query { name: "q19", published: published(None, Some(1_201_216.0), Some(44_040.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q19(e), out) },
    Query { name: "q20", published: published(None, Some(1_352_192.0), Some(18_980.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q20(e), out) },
    Query { name: "q21", published: published(None, Some(6_634_820.0), Some(98_490.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q21(e), out) },
    Query { name: "q22", published: published(None, Some(6_305_568.0), Some(129_960.0)), rate: FLINK_RATE, declare: |e, out| count(&queries::q22(e), out) },
];

/// The rows of q13's side input: keys 0 to 9,999, one for every value of
/// its key (an auction modulo 10,000), as the spec's runs generate it.
const Q13_SIDE_ROWS: i64 = 10_000;

/// Registers the output of a query: it counts the rows of each batch.
fn count<T: Data>(stream: &DStream<T>, out: &Output) {
    let rows = Arc::clone(&out.rows);
    stream
        .foreach_batch(move |batch, _info| {
            rows.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        })
        .name("sink");
}

/// q10's output: its rows written through the exactly-once file sink into
/// minute partitions under the run's directory, and counted.
fn write_q10_files(events: &DStream<Event>, out: &Output) {
    let settings = FileSinkSettings::new().partitioned_by(Partitioning::Minute);
    let sink = FileSink::open(&out.files, settings, Q10Row::event_time).unwrap();
    let rows = Arc::clone(&out.rows);
    queries::q10(events)
        .foreach_batch(move |batch, info| {
            sink.write_batch(batch.iter(), info)?;
            rows.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        })
        .name("q10");
}

/// q10's files go to `$NEXMARK_Q10_DIR`, else `/dev/shm` (memory), else
/// the temporary directory. 10 M events make gigabytes of JSON lines a
/// run, more than the project machine's disk often has free; in memory the
/// run still pays every write, fsync and link the sink makes (the CPU the
/// figure counts), not the disk's latency.
fn q10_output_dir() -> tempfile::TempDir {
    let base = std::env::var_os("NEXMARK_Q10_DIR").map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("spate-nexmark-q10").tempdir_in(base).unwrap()
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
    /// The global allocator's name.
    allocator: &'static str,
    /// The best published events per core, and whose.
    best: (f64, Source),
    events: u64,
    /// Events per second of event time.
    rate: f64,
    rows: u64,
    batches: u64,
    cpu_seconds: f64,
    wall_seconds: f64,
}

impl Run {
    fn measured(query: &Query, mode: Mode, options: &Options, out: &Output, batches: u64, watch: &Stopwatch) -> Run {
        let (wall_seconds, cpu_seconds) = watch.stop();
        Run {
            query: query.name,
            mode,
            allocator: options.allocator,
            best: query.published.best(),
            events: options.events,
            rate: query.rate / options.scale,
            rows: out.rows.load(Ordering::Relaxed),
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
        self.best.0 * TARGET_OVER_BEST
    }

    fn bench_line(&self) -> String {
        let value = self.per_cpu_second();
        format!(
            "BENCH nexmark_{}_{}_{} {value:.0} events/s/core bound={:.0} ratio={:.3}",
            self.query,
            self.mode,
            self.allocator,
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
    let files = q10_output_dir();
    let out = Output { rows: Arc::default(), files: files.path().to_path_buf() };
    let watch = Stopwatch::start();
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, |p| {
        let input = p.replayable_input("nexmark", Arc::clone(&source), Some(source.resume_hook()), None);
        (query.declare)(&input, &out);
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
    Run::measured(query, Mode::On, options, &out, batches, &watch)
}

/// The same graph batch by batch, without offset log, commits or state
/// snapshots.
fn run_off(query: &Query, options: &Options) -> Run {
    let interval = query.batch_interval();
    let source = source(options.events, query.rate / options.scale);
    let files = q10_output_dir();
    let out = Output { rows: Arc::default(), files: files.path().to_path_buf() };
    let watch = Stopwatch::start();
    // Stateful queries are refused without a checkpoint configured; none is
    // written here, since nothing calls the graph's snapshot.
    let builder = GraphBuilder::new(interval).checkpointing(true);
    let input = builder.input("nexmark", Arc::clone(&source));
    (query.declare)(&input, &out);
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
    Run::measured(query, Mode::Off, options, &out, batches, &watch)
}

/// What to run, from the arguments and the environment.
struct Options {
    /// The global allocator's name, in the figures' names.
    allocator: &'static str,
    events: u64,
    /// Every query's rate is divided by this (1 under `cargo bench`).
    scale: f64,
    only: Vec<String>,
}

impl Options {
    fn parse(allocator: &'static str) -> Options {
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
        Options { allocator, events: events.unwrap_or(default_events), scale, only }
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
    let allocator = runs.first().map_or("", |run| run.allocator);
    println!();
    println!(
        "Nexmark, events per CPU-second, allocator {allocator}, beside the best published events per core \
         (target: {TARGET_OVER_BEST}x it with checkpoints on)"
    );
    println!(
        "{:<5} {:<4} {:>10} {:>9} {:>8} {:>10} {:>12} {:>12} {:>6} {:>12} {:<10} {:>7}",
        "query", "ckpt", "events", "rate", "batches", "rows", "per core", "wall", "cores", "best/core", "by", "x best"
    );
    for run in runs {
        let (best, source) = run.best;
        println!(
            "{:<5} {:<4} {:>10} {:>9} {:>8} {:>10} {:>12} {:>12} {:>6.2} {:>12} {:<10} {:>7.2}",
            run.query,
            run.mode,
            run.events,
            si(run.rate),
            run.batches,
            run.rows,
            si(run.per_cpu_second()),
            si(run.per_wall_second()),
            run.cores(),
            si(best),
            source,
            run.per_cpu_second() / best
        );
    }
    let missed: Vec<String> = runs
        .iter()
        .filter(|run| run.mode == Mode::On && run.per_cpu_second() < run.bound())
        .map(|run| format!("{} ({:.2}x)", run.query, run.per_cpu_second() / run.best.0))
        .collect();
    if !missed.is_empty() {
        println!("under {TARGET_OVER_BEST}x the best published with checkpoints on: {}", missed.join(", "));
    }
}

/// Runs the selected queries, both ways, and prints their figures; the
/// allocator's name goes into the figures' names.
pub(crate) fn main(allocator: &'static str) {
    let options = Options::parse(allocator);
    // Under `cargo xtask bench FILTER` every benchmark gets the filter;
    // say so when it names none of these queries.
    for name in options.only.iter().filter(|name| !QUERIES.iter().any(|q| q.name == name.as_str())) {
        let known: Vec<&str> = QUERIES.iter().map(|q| q.name).collect();
        println!("nexmark: no query named {name} (there are {})", known.join(", "));
    }
    println!(
        "nexmark ({allocator}): {} events a run, {} a batch, state snapshots every {BATCHES_PER_CHECKPOINT} batches, \
         {} partitions, {} cores",
        options.events,
        (BATCH_EVENTS as f64 / options.scale).round(),
        PARTITIONS_PER_CORE * cores(),
        cores()
    );
    let mut runs = Vec::new();
    for query in QUERIES.iter().filter(|q| options.selects(q)) {
        let (best, source) = query.published.best();
        println!(
            "{}: best published {} events/s/core ({source}); bound {}",
            query.name,
            si(best),
            si(best * TARGET_OVER_BEST)
        );
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
