//! A Nexmark query on the benchmark's event generator: persons, auctions
//! and bids of an online auction, as the `nexmark/nexmark` project makes
//! them, read as a replayable source.
//!
//! What it shows:
//!
//! - [`NexmarkSource`]: each batch reads the events due by its time,
//!   `--rate` events per second of event time, in `--partitions`
//!   partitions; what a batch read is logged, so a re-run reads the same
//!   events and a second run on the same `--checkpoint` continues the
//!   timeline;
//! - the queries of [`spate_nexmark::queries`] (all 23 of the spec's),
//!   each a function from the event stream to a stream of rows: q0-q2,
//!   q13, q14, q21 and q22 per record, q3, q4, q6, q9 and q15-q20 with
//!   keyed state, q5, q7, q8 and q11 over event-time windows (each
//!   window's rows in the batch whose watermark passes its end, 4 s behind
//!   the events), q12 over windows of processing time;
//! - q10's rows written to `--output` (a directory or `s3://bucket/prefix`)
//!   by the exactly-once file sink ([`spate::files`]), as JSON lines in
//!   `dt=YYYY-MM-DD/hm=HH%3Amm/` directories by each bid's minute;
//! - what it costs: each batch's rows (a sample of them), and at the end
//!   the events per second of wall time and of processing time.
//!
//! ```sh
//! cargo run --release --example nexmark -- --query q5 --seconds 30
//! cargo run --release --example nexmark -- --query q4 --events 1000000 --backlog-seconds 100
//! cargo run --release --example nexmark -- --query q10 --output /tmp/bids --seconds 10
//! ```
//!
//! `--backlog-seconds S` starts the timeline S seconds in the past: the
//! first batches catch up on those events (at most ten seconds of them a
//! batch) as fast as the engine goes. The checkpoint defaults to
//! `nexmark-checkpoint/<query>`; stateful queries keep their state there.
//! q10's output defaults to `nexmark-output/q10`: one checkpoint writes one
//! output, so a new checkpoint wants a new output too.

mod common;

use std::fmt::Debug;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use spate::core::Duration;
use spate::dstream::{DStream, Data};
use spate::files::{FileSink, FileSinkSettings, Partitioning, WriteFiles};
use spate::runtime::{PipelineBuilder, StreamingContext, StreamingSettings};
use spate_nexmark::queries::Q10Row;
use spate_nexmark::{Event, GeneratorSettings, NexmarkGenerator, NexmarkSource, queries};

use common::{Error, run_until};

/// The queries the example runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Query {
    /// Pass-through.
    Q0,
    /// Currency conversion.
    Q1,
    /// Selection.
    Q2,
    /// Local item suggestion: an incremental join.
    Q3,
    /// Average price for a category.
    Q4,
    /// Hot items: sliding windows.
    Q5,
    /// Average selling price by seller: over each seller's last closed auctions.
    Q6,
    /// Highest bid: tumbling windows.
    Q7,
    /// Monitor new users: a join within tumbling windows.
    Q8,
    /// Winning bids: each auction's highest bid once it closed.
    Q9,
    /// Log to file system: every bid written to files by its minute.
    Q10,
    /// User sessions: session windows.
    Q11,
    /// Bids per bidder in windows of processing time.
    Q12,
    /// A join with a bounded side input.
    Q13,
    /// A filter with a user function.
    Q14,
    /// Bidding statistics per day: exact distinct counts.
    Q15,
    /// Channel statistics per day.
    Q16,
    /// Auction statistics per day.
    Q17,
    /// Each bidder's last bid per auction: deduplication.
    Q18,
    /// The ten highest bids per auction: top N per key.
    Q19,
    /// Bids with their category-10 auction: an incremental join.
    Q20,
    /// Channel ids from URLs.
    Q21,
    /// URL directories as columns.
    Q22,
}

impl Query {
    fn name(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

/// Runs one Nexmark query on the generator and prints what it yields.
#[derive(Clone, Debug, Parser)]
struct Args {
    /// The query.
    #[arg(long, value_enum, default_value = "q5")]
    query: Query,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Generate this many events, and stop once they are processed.
    #[arg(long)]
    events: Option<u64>,
    /// Events per second of event time.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Start the event timeline this many seconds before now.
    #[arg(long, default_value_t = 0)]
    backlog_seconds: u64,
    /// Partitions of the source.
    #[arg(long, default_value_t = 4)]
    partitions: usize,
    /// The batch interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    batch_ms: u64,
    /// Rows printed per batch.
    #[arg(long, default_value_t = 3)]
    sample: usize,
    /// The generator's seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The checkpoint directory (default: `nexmark-checkpoint/<query>`).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Where q10 writes its files, a directory or `s3://bucket/prefix`
    /// (default: `nexmark-output/q10`).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print nothing per batch.
    #[arg(long)]
    quiet: bool,
    /// Keep every row as JSON in the summary (for the tests).
    #[arg(skip)]
    keep_rows: bool,
}

/// What the pipeline's output reports.
#[derive(Default)]
struct Shared {
    rows: AtomicU64,
    kept: Mutex<Vec<serde_json::Value>>,
}

/// Prints a sample of each batch's rows and counts them.
fn output<T: Data + Debug>(rows: &DStream<T>, args: &Args, shared: &Arc<Shared>) {
    let (out, sample, quiet, keep) = (Arc::clone(shared), args.sample, args.quiet, args.keep_rows);
    rows.foreach_batch(move |batch, info| {
        out.rows.fetch_add(batch.len() as u64, Ordering::Relaxed);
        if keep {
            let json: Result<Vec<_>, _> = batch.iter().map(serde_json::to_value).collect();
            out.kept.lock().unwrap_or_else(PoisonError::into_inner).extend(json?);
        }
        if !quiet && !batch.is_empty() {
            println!("batch {}: {} rows", info.batch_id, batch.len());
            for row in batch.iter().take(sample) {
                println!("  {row:?}");
            }
        }
        Ok(())
    })
    .name("print-rows");
}

/// q10's file sink on `--output`, partitioned by minute as the spec's
/// `dt`/`hm` columns; `None` for the other queries.
fn q10_sink(args: &Args) -> Result<Option<FileSink<Q10Row>>, Error> {
    if args.query != Query::Q10 {
        return Ok(None);
    }
    let location = args.output.clone().unwrap_or_else(|| PathBuf::from("nexmark-output/q10"));
    let settings = FileSinkSettings::new().partitioned_by(Partitioning::Minute);
    Ok(Some(FileSink::open(location, settings, Q10Row::event_time)?))
}

fn declare(
    p: &mut PipelineBuilder,
    args: &Args,
    source: &Arc<NexmarkSource>,
    shared: &Arc<Shared>,
    files: Option<FileSink<Q10Row>>,
) {
    let events: DStream<Event> = p.replayable_input("nexmark", Arc::clone(source), Some(source.resume_hook()), None);
    match args.query {
        Query::Q0 => output(&queries::q0(&events), args, shared),
        Query::Q1 => output(&queries::q1(&events), args, shared),
        Query::Q2 => output(&queries::q2(&events), args, shared),
        Query::Q3 => output(&queries::q3(&events), args, shared),
        Query::Q4 => output(&queries::q4(&events), args, shared),
        Query::Q5 => output(&queries::q5(&events), args, shared),
        Query::Q6 => output(&queries::q6(&events), args, shared),
        Query::Q7 => output(&queries::q7(&events), args, shared),
        Query::Q8 => output(&queries::q8(&events), args, shared),
        Query::Q9 => output(&queries::q9(&events), args, shared),
        Query::Q10 => {
            let rows = queries::q10(&events);
            output(&rows, args, shared);
            if let Some(sink) = files {
                rows.write_files(sink).name("q10-files");
            }
        }
        Query::Q11 => output(&queries::q11(&events), args, shared),
        Query::Q12 => output(&queries::q12(&events), args, shared),
        Query::Q13 => output(&queries::q13(&events, &queries::q13_side_input(10_000)), args, shared),
        Query::Q14 => output(&queries::q14(&events), args, shared),
        Query::Q15 => output(&queries::q15(&events), args, shared),
        Query::Q16 => output(&queries::q16(&events), args, shared),
        Query::Q17 => output(&queries::q17(&events), args, shared),
        Query::Q18 => output(&queries::q18(&events), args, shared),
        Query::Q19 => output(&queries::q19(&events), args, shared),
        Query::Q20 => output(&queries::q20(&events), args, shared),
        Query::Q21 => output(&queries::q21(&events), args, shared),
        Query::Q22 => output(&queries::q22(&events), args, shared),
    }
}

/// The generator's config: the timeline starts `backlog_seconds` before now.
fn config(args: &Args) -> Result<GeneratorSettings, Error> {
    let now = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let backlog = i64::try_from(args.backlog_seconds.saturating_mul(1000))?;
    let mut config = GeneratorSettings::new(args.seed, now - backlog).with_rate(args.rate);
    if let Some(events) = args.events {
        config = config.with_max_events(events);
    }
    Ok(config)
}

/// What a run did.
#[derive(Debug)]
struct Summary {
    /// The generator the run read from (after a resume, on the logged
    /// timeline), for the tests to compute what the query should give.
    #[cfg_attr(not(test), allow(dead_code))]
    generator: NexmarkGenerator,
    events: u64,
    rows: u64,
    batches: u64,
    elapsed_secs: f64,
    processing_ms: u64,
    recovery: String,
    /// Every row, as JSON, when `keep_rows` is set (by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    kept: Vec<serde_json::Value>,
}

/// Runs the example and says what it did.
fn run(args: &Args) -> Result<Summary, Error> {
    let generator = NexmarkGenerator::new(config(args)?)?;
    let source = Arc::new(NexmarkSource::new(generator).with_partitions(args.partitions));
    let shared = Arc::new(Shared::default());
    let checkpoint =
        args.checkpoint.clone().unwrap_or_else(|| PathBuf::from("nexmark-checkpoint").join(args.query.name()));
    let settings = StreamingSettings::new(Duration::from_millis(args.batch_ms));
    let files = q10_sink(args)?;
    let ctx = StreamingContext::get_or_create(&checkpoint, settings, |p| {
        declare(p, args, &source, &shared, files);
        Ok(())
    })?;
    let recovery = ctx.recovery().map(ToString::to_string).unwrap_or_default();
    let (mut events, mut processing_ms) = (0u64, 0u64);
    let started = Instant::now();
    let outcome = run_until(ctx, args.seconds, |progress| {
        events += progress.input_records;
        processing_ms += progress.processing_time_ms;
        // Batches commit in order: an empty one after the source planned
        // its last event comes after the batch that read it.
        source.is_exhausted() && progress.input_records == 0
    })?;
    let kept = std::mem::take(&mut *shared.kept.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(Summary {
        generator: source.generator(),
        events,
        rows: shared.rows.load(Ordering::Relaxed),
        batches: outcome.batches,
        elapsed_secs: started.elapsed().as_secs_f64(),
        processing_ms,
        recovery,
        kept,
    })
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(s) => {
            let per_second = |events: u64, secs: f64| if secs > 0.0 { events as f64 / secs } else { 0.0 };
            println!(
                "{}; {}: {} events in {} batches, {} rows; {:.0} events/s over {:.1} s, {:.0} events per second of \
                 batch processing",
                s.recovery,
                args.query.name(),
                s.events,
                s.batches,
                s.rows,
                per_second(s.events, s.elapsed_secs),
                s.elapsed_secs,
                per_second(s.events, s.processing_ms as f64 / 1000.0),
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nexmark: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::BTreeMap;

    use spate_nexmark::queries::{Q3Row, Q7Row};

    use super::*;

    /// 6,000 events, 30 s of event time all due at once: three batches of
    /// ten seconds of events each, then an empty one.
    fn args(query: Query, dir: &std::path::Path) -> Args {
        Args {
            query,
            seconds: 120,
            events: Some(6000),
            rate: 200.0,
            backlog_seconds: 30,
            partitions: 2,
            batch_ms: 200,
            sample: 0,
            seed: 5,
            checkpoint: Some(dir.join(query.name())),
            output: Some(dir.join("output")),
            quiet: true,
            keep_rows: true,
        }
    }

    fn rows<T: serde::de::DeserializeOwned + Ord>(summary: &Summary) -> Vec<T> {
        let mut rows: Vec<T> = summary.kept.iter().map(|row| serde_json::from_value(row.clone()).unwrap()).collect();
        rows.sort();
        rows
    }

    #[test]
    fn q3_joins_every_local_seller_with_their_category_10_auctions() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let summary = run(&args(Query::Q3, dir.path())).unwrap();
        assert_eq!(summary.events, 6000, "{summary:?}");
        assert!(summary.processing_ms > 0 && summary.elapsed_secs > 0.0);
        let events = summary.generator.events(0..6000);
        let sellers: BTreeMap<i64, _> = events
            .iter()
            .filter_map(|e| if let Event::Person(p) = e { Some((p.id, p)) } else { None })
            .filter(|(_, p)| ["OR", "ID", "CA"].contains(&p.state.as_str()))
            .collect();
        let mut expected: Vec<Q3Row> = events
            .iter()
            .filter_map(|e| if let Event::Auction(a) = e { Some(a) } else { None })
            .filter(|a| a.category == 10)
            .filter_map(|a| {
                let p = sellers.get(&a.seller)?;
                Some(Q3Row { name: p.name.clone(), city: p.city.clone(), state: p.state.clone(), auction: a.id })
            })
            .collect();
        expected.sort();
        assert!(expected.len() >= 3, "{expected:?}");
        assert_eq!(summary.rows, expected.len() as u64);
        assert_eq!(rows::<Q3Row>(&summary), expected);
    }

    #[test]
    fn q7_lists_the_highest_bids_of_the_windows_the_watermark_passed() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let summary = run(&args(Query::Q7, dir.path())).unwrap();
        assert_eq!(summary.events, 6000, "{summary:?}");
        let mut windows: BTreeMap<i64, Vec<Q7Row>> = BTreeMap::new();
        for event in summary.generator.events(0..6000) {
            if let Event::Bid(b) = event {
                let row = Q7Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra,
                };
                windows.entry(b.date_time - b.date_time.rem_euclid(10_000)).or_default().push(row);
            }
        }
        // The watermark ends 4 s behind the first partition of the last
        // batch (25 s into the timeline): the first two windows or three.
        // A window lists its bids at its highest price, and those at that
        // price made exactly at its end (the spec's BETWEEN includes it).
        let got = rows::<Q7Row>(&summary);
        let all: Vec<&Q7Row> = windows.values().flatten().collect();
        let listed = |start: i64| -> Vec<Q7Row> {
            let highest = windows[&start].iter().map(|r| r.price).max().unwrap();
            let end = start + 10_000;
            all.iter()
                .filter(|r| r.price == highest && (start..=end).contains(&r.date_time))
                .map(|r| (*r).clone())
                .collect()
        };
        let closed: Vec<i64> =
            windows.keys().copied().filter(|start| listed(*start).iter().all(|r| got.contains(r))).collect();
        assert!(closed.len() >= 2, "{closed:?}");
        assert_eq!(closed, windows.keys().copied().take(closed.len()).collect::<Vec<_>>(), "not the first windows");
        let mut expected: Vec<Q7Row> = closed.iter().flat_map(|start| listed(*start)).collect();
        expected.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn q10_writes_every_bid_once_into_the_directory_of_its_minute() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let summary = run(&args(Query::Q10, dir.path())).unwrap();
        assert_eq!(summary.events, 6000, "{summary:?}");
        let mut expected: Vec<Q10Row> =
            summary.generator.events(0..6000).into_iter().filter_map(queries::q10_row).collect();
        expected.sort();
        assert_eq!(rows::<Q10Row>(&summary), expected);
        // The files: every data file under `dt=…/hm=…`, each row in its minute's directory.
        let mut written = Vec::new();
        let mut pending = vec![dir.path().join("output")];
        while let Some(path) = pending.pop() {
            for entry in std::fs::read_dir(&path).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                if name.starts_with('_') {
                    continue;
                }
                if entry.file_type().unwrap().is_dir() {
                    pending.push(entry.path());
                    continue;
                }
                let text = std::fs::read_to_string(entry.path()).unwrap();
                for line in text.lines() {
                    let row: Q10Row = serde_json::from_str(line).unwrap();
                    let partition = format!("dt={}/hm={}", row.dt, row.hm.replace(':', "%3A"));
                    assert!(
                        entry.path().parent().unwrap().ends_with(&partition),
                        "{}: {row:?}",
                        entry.path().display()
                    );
                    written.push(row);
                }
            }
        }
        written.sort();
        assert!(expected.len() > 5000, "{}", expected.len());
        assert_eq!(written, expected);
    }
}
