//! Page views as JSON on a Kafka topic, counted per page over a sliding
//! window and written back to Kafka exactly once.
//!
//! What it shows:
//!
//! - a [`DirectKafkaStream`] as a replayable input: each batch's offset
//!   ranges are logged to `<checkpoint>/offsets/N` before the batch runs, and
//!   a restart re-reads exactly them;
//! - JSON parsed into a serde struct, with events that do not parse counted
//!   and reported (with their partition and offset), never fatal;
//! - a windowed count per page (`reduce_by_key_and_window` with an inverse:
//!   10 s window sliding by 2 s on 1 s batches by default);
//! - the exactly-once output: each window's counts and the batch's consumed
//!   offsets commit in one Kafka transaction ([`TransactionalKafkaSink`]); a
//!   batch re-run after a crash finds its transaction committed and writes
//!   nothing. Read the output with `isolation.level=read_committed`.
//!
//! Run it (a broker first; `cargo xtask kafka start` prints the export line):
//!
//! ```sh
//! cargo xtask kafka start
//! export SPATE_KAFKA_BROKERS=127.0.0.1:<port>
//! cargo run --example kafka_json_events -- --produce 1000 --seconds 20
//! ```
//!
//! `--produce N` writes N sample events (every tenth one malformed) to the
//! input topic first; without it the example reads whatever is on the topic.
//! It creates both topics if they do not exist. Run it again with the same
//! `--checkpoint`: it resumes after the offsets it committed.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use clap::Parser;
use serde::{Deserialize, Serialize};
use spate::core::{BatchId, Duration, Time};
use spate::kafka::{
    DirectKafkaSettings, DirectKafkaStream, KafkaRecord, OffsetCommit, OffsetRanges, OutputRecord, StartingOffsets,
    TransactionalKafkaSink,
};
use spate::logstore::{Checkpoint, CheckpointSettings};
use spate::runtime::{OffsetsHook, PipelineBuilder, StreamingContext, StreamingSettings};

use common::{Error, Produced, brokers, ensure_topic, produce, run_until};

/// The input's name: the key of its offsets in `offsets/N`.
const INPUT: &str = "page-views";

/// Page views from a Kafka topic, counted per page over a sliding window,
/// written to another topic exactly once.
#[derive(Clone, Debug, Parser)]
struct Args {
    /// The topic of JSON page views read.
    #[arg(long, default_value = "page-views")]
    input_topic: String,
    /// The topic the window counts are written to.
    #[arg(long, default_value = "page-view-counts")]
    output_topic: String,
    /// The checkpoint directory.
    #[arg(long, default_value = "kafka-json-events-checkpoint")]
    checkpoint: PathBuf,
    /// Produce this many sample events to the input topic before starting.
    #[arg(long)]
    produce: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Stop sooner: once this many events were read and every window that
    /// holds them was written.
    #[arg(long)]
    until_events: Option<u64>,
    /// The batch interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    batch_ms: u64,
    /// The window length, in milliseconds (a multiple of the slide).
    #[arg(long, default_value_t = 10_000)]
    window_ms: u64,
    /// The window slide, in milliseconds (a multiple of the batch interval).
    #[arg(long, default_value_t = 2000)]
    slide_ms: u64,
    /// Print nothing per window.
    #[arg(long)]
    quiet: bool,
}

/// One page view, as the producers write it: `{"user":"u1","page":"/a","ms":1700000000000}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PageView {
    user: String,
    page: String,
    ms: u64,
}

/// A Kafka record after parsing: a page view, or why it is not one.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Parsed {
    View(PageView),
    Malformed { partition: i32, offset: i64, error: String },
}

fn parse(record: &KafkaRecord) -> Parsed {
    let bytes = record.value.as_deref().unwrap_or_default();
    match serde_json::from_slice::<PageView>(bytes) {
        Ok(view) => Parsed::View(view),
        Err(e) => Parsed::Malformed { partition: record.partition, offset: record.offset, error: e.to_string() },
    }
}

/// One output record: the views of one page in the window ending at `window_end_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct WindowCount {
    batch: u64,
    window_end_ms: i64,
    page: String,
    views: u64,
}

/// What a run did.
#[derive(Debug, Default)]
struct Summary {
    produced: u64,
    events_read: u64,
    malformed: u64,
    windows_written: u64,
    records_written: u64,
    batches: u64,
    finished_early: bool,
}

/// `n` sample events: users `u0`..`u6` on five pages; every tenth event is cut short (not JSON).
fn sample_events(n: u64) -> Vec<Produced> {
    const PAGES: [&str; 5] = ["/", "/docs", "/pricing", "/cart", "/checkout"];
    (0..n)
        .map(|i| {
            let user = format!("u{}", i % 7);
            let page = PAGES[((i * 7 + i / 5) % 5) as usize];
            let view = PageView { user: user.clone(), page: page.to_string(), ms: 1_700_000_000_000 + i * 37 };
            let mut value = serde_json::to_string(&view).unwrap_or_default();
            if i % 10 == 9 {
                value.truncate(value.len() / 2);
            }
            Produced { partition: None, key: Some(user), value }
        })
        .collect()
}

/// The offset ranges batch `id` read, from `offsets/<id>` (durable before any output runs).
fn logged_ranges(checkpoint: &Path, id: BatchId) -> Result<OffsetRanges, Error> {
    let log = Checkpoint::open_read_only(checkpoint, CheckpointSettings::new())?;
    let entry = log.offsets().get(id)?.ok_or_else(|| format!("offsets/{id} is missing"))?;
    OffsetRanges::from_offset_seq(&entry, INPUT)?.ok_or_else(|| format!("offsets/{id} has no {INPUT} offsets").into())
}

/// What the pipeline's closures share.
struct Shared {
    stream: Arc<DirectKafkaStream>,
    sink: Arc<OnceLock<TransactionalKafkaSink>>,
    malformed: Arc<AtomicU64>,
    windows: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

/// Declares the pipeline: parse, count the malformed, count per page over
/// the window, write each window in one transaction with its offsets.
fn declare(p: &mut PipelineBuilder, args: &Args, shared: &Shared) {
    let resume = Arc::clone(&shared.stream);
    // After a restart the stream continues after the last logged ranges.
    let on_resume: OffsetsHook = Box::new(move |offsets: &str| {
        let ranges = OffsetRanges::from_json(offsets).map_err(|e| e.to_string())?;
        resume.resume_after(&ranges).map_err(|e| e.to_string())
    });
    let parsed = p.replayable_input(INPUT, Arc::clone(&shared.stream), Some(on_resume), None).map(|r| parse(&r));

    let malformed = Arc::clone(&shared.malformed);
    parsed
        .filter(|p| matches!(p, Parsed::Malformed { .. }))
        .foreach_batch(move |batch, info| {
            let bad: Vec<&Parsed> = batch.iter().collect();
            for parsed in bad.iter().take(3) {
                if let Parsed::Malformed { partition, offset, error } = parsed {
                    eprintln!(
                        "batch {}: skipped a malformed event at partition {partition} offset {offset}: {error}",
                        info.batch_id
                    );
                }
            }
            malformed.fetch_add(bad.len() as u64, Ordering::Relaxed);
            Ok(())
        })
        .name("count-malformed");

    let window = Duration::from_millis(args.window_ms);
    let slide = Duration::from_millis(args.slide_ms);
    let counts = parsed
        .flat_map(|p| match p {
            Parsed::View(view) => Some((view.page, 1u64)),
            Parsed::Malformed { .. } => None,
        })
        .reduce_by_key_and_window_inv_filtered(|a, b| a + b, |a, b| a.saturating_sub(*b), window, slide, |_, n| *n > 0)
        .name("views-per-page");

    let (sink, checkpoint, quiet) = (Arc::clone(&shared.sink), args.checkpoint.clone(), args.quiet);
    let (windows, written) = (Arc::clone(&shared.windows), Arc::clone(&shared.written));
    counts
        .foreach_batch(move |batch, info| {
            let mut pages: Vec<(String, u64)> = batch.iter().cloned().collect();
            pages.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let records = pages.iter().map(|(page, views)| {
                let count = WindowCount {
                    batch: info.batch_id.0,
                    window_end_ms: info.time.as_millis(),
                    page: page.clone(),
                    views: *views,
                };
                OutputRecord::keyed(page.clone(), serde_json::to_vec(&count).unwrap_or_default())
            });
            let sink = sink.get().ok_or("the output sink is not open")?;
            let ranges = logged_ranges(&checkpoint, info.batch_id)?;
            let outcome = sink.write_batch(info.batch_id, &ranges, records)?;
            windows.fetch_add(1, Ordering::Relaxed);
            written.fetch_add(pages.len() as u64, Ordering::Relaxed);
            if !quiet {
                let top: Vec<String> = pages.iter().take(5).map(|(p, n)| format!("{p} {n}")).collect();
                println!("window ending {} (batch {}): {} [{outcome:?}]", info.time, info.batch_id, top.join(", "));
            }
            Ok(())
        })
        .name("counts-to-kafka");
}

/// Runs the example and says what it did.
fn run(args: &Args) -> Result<Summary, Error> {
    let brokers = brokers()?;
    ensure_topic(&brokers, &args.input_topic, 3)?;
    ensure_topic(&brokers, &args.output_topic, 3)?;
    let mut summary = Summary::default();
    if let Some(n) = args.produce {
        produce(&brokers, &args.input_topic, &sample_events(n))?;
        summary.produced = n;
        println!("produced {n} sample events to {}", args.input_topic);
    }

    let batch = Duration::from_millis(args.batch_ms);
    let config = DirectKafkaSettings::subscribe(&brokers, "kafka-json-events", [args.input_topic.clone()])
        .with_starting_offsets(StartingOffsets::Earliest)
        // The transactions hold the offsets; the group is only their home.
        .with_commit(OffsetCommit::CheckpointOnly);
    let shared = Shared {
        stream: Arc::new(DirectKafkaStream::new(config)?),
        sink: Arc::new(OnceLock::new()),
        malformed: Arc::default(),
        windows: Arc::default(),
        written: Arc::default(),
    };
    let ctx = StreamingContext::get_or_create(&args.checkpoint, StreamingSettings::new(batch), |p| {
        declare(p, args, &shared);
        Ok(())
    })?;
    if let Some(report) = ctx.recovery() {
        println!("{report}");
    }
    // The context holds the writer lock now. The transactional id is the
    // query's: opening the sink fences an older instance of this job.
    let query = Checkpoint::open_read_only(&args.checkpoint, CheckpointSettings::new())?
        .metadata()
        .map(|m| m.id.clone())
        .ok_or("the checkpoint has no metadata")?;
    let id = format!("spate-{query}");
    let sink = TransactionalKafkaSink::new(&brokers, &args.output_topic, &id, &id)?;
    let _ = shared.sink.set(sink);

    let window = Duration::from_millis(args.window_ms);
    let mut read = 0;
    let mut all_read_at: Option<Time> = None;
    let outcome = run_until(ctx, args.seconds, |progress| {
        read += progress.input_records;
        if args.until_events.is_some_and(|n| read >= n) && all_read_at.is_none() {
            all_read_at = Some(progress.batch_time);
        }
        // Every window holding the last event has fired once a window's length has passed.
        all_read_at.is_some_and(|at| progress.batch_time >= at + window)
    })?;
    summary.events_read = read;
    summary.malformed = shared.malformed.load(Ordering::Relaxed);
    summary.windows_written = shared.windows.load(Ordering::Relaxed);
    summary.records_written = shared.written.load(Ordering::Relaxed);
    summary.batches = outcome.batches;
    summary.finished_early = outcome.done;
    Ok(summary)
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(s) => {
            println!(
                "read {} events ({} malformed, skipped) in {} batches; wrote {} windows ({} page counts) to {} \
                 exactly once; checkpoint {}",
                s.events_read,
                s.malformed,
                s.batches,
                s.windows_written,
                s.records_written,
                args.output_topic,
                args.checkpoint.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kafka_json_events: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn unique(prefix: &str) -> String {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        format!("{prefix}-{}-{nanos}", std::process::id())
    }

    #[test]
    fn malformed_json_is_reported_not_parsed() {
        let record = |value: &str| KafkaRecord {
            topic: Arc::from("t"),
            partition: 2,
            offset: 7,
            timestamp: None,
            key: None,
            value: Some(value.as_bytes().to_vec()),
        };
        let Parsed::View(view) = parse(&record(r#"{"user":"u1","page":"/a","ms":5}"#)) else { panic!("not parsed") };
        assert_eq!(view, PageView { user: "u1".into(), page: "/a".into(), ms: 5 });
        assert!(matches!(parse(&record(r#"{"user":"u1","pa"#)), Parsed::Malformed { partition: 2, offset: 7, .. }));
        let bad = sample_events(20).iter().filter(|e| serde_json::from_str::<PageView>(&e.value).is_err()).count();
        assert_eq!(bad, 2);
    }

    /// The whole example against the test broker: every window written once,
    /// read back committed, adds up to the sample's views per page times the
    /// windows each batch falls in.
    #[test]
    fn the_window_counts_in_kafka_match_the_events_produced() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let (events, window_ms, slide_ms) = (500, 1200, 400);
        let args = Args {
            input_topic: unique("json-events-in"),
            output_topic: unique("json-events-out"),
            checkpoint: dir.path().join("checkpoint"),
            produce: Some(events),
            seconds: 120,
            until_events: Some(events),
            batch_ms: 200,
            window_ms,
            slide_ms,
            quiet: true,
        };
        let summary = run(&args).unwrap();
        assert!(summary.finished_early, "not every window was written within {} s: {summary:?}", args.seconds);
        let samples = sample_events(events);
        let mut expected: BTreeMap<String, u64> = BTreeMap::new();
        for view in samples.iter().filter_map(|e| serde_json::from_str::<PageView>(&e.value).ok()) {
            *expected.entry(view.page).or_default() += window_ms / slide_ms;
        }
        assert_eq!(summary.events_read, events);
        assert_eq!(summary.malformed, events / 10);

        let output = common::read_committed(&brokers().unwrap(), &args.output_topic).unwrap();
        let counts: Vec<WindowCount> = output.iter().map(|r| serde_json::from_str(&r.value).unwrap()).collect();
        assert_eq!(counts.len() as u64, summary.records_written);
        let mut seen = std::collections::BTreeSet::new();
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for count in &counts {
            assert!(seen.insert((count.batch, count.page.clone())), "written twice: {count:?}");
            *totals.entry(count.page.clone()).or_default() += count.views;
        }
        assert_eq!(totals, expected);
    }
}
