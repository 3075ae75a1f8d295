//! Moving a Spark Structured Streaming job that reads Kafka to spate,
//! without losing or repeating a record: the spate job starts at exactly the
//! offsets the Spark query last committed.
//!
//! What it shows:
//!
//! - spate's log store reads a Spark checkpoint (read-only: Spark could go
//!   on running from it) and gives its verdict: which batches committed, and
//!   whether a batch was planned but not committed (Spark would re-run it);
//! - the Kafka offsets of the last committed batch (Spark names sources by
//!   position: the Kafka source is `0` when it is the query's first source)
//!   become the direct stream's starting offsets, in Spark's own JSON shape;
//! - the spate job's first batch, logged to `<checkpoint>/offsets/0` before
//!   it runs, starts at those offsets, and from then on the spate checkpoint
//!   holds the position (a restart resumes from it, not from Spark's).
//!
//! By default it reads the hand-written Spark 3 checkpoint of spate-cli's
//! tests (`crates/spate-cli/tests/fixtures/spark-checkpoint`: topic
//! `events`, three partitions, batches 0 and 1 committed, batch 2 planned).
//!
//! ```sh
//! cargo run --example spark_migration -- --offsets-only        # no broker needed
//! cargo xtask kafka start && export SPATE_KAFKA_BROKERS=127.0.0.1:<port>
//! cargo run --example spark_migration -- --produce 60 --seconds 20
//! ```
//!
//! `--produce N` writes N records to every partition of the topic first, so
//! there is something at and after Spark's offsets to read. The `spate
//! checkpoint inspect` command prints the same offsets for any Spark
//! checkpoint, and `spate run --starting-offsets` takes them.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use clap::Parser;
use spate::core::Duration;
use spate::kafka::{
    DirectKafkaSettings, DirectKafkaStream, KafkaRecord, OffsetCommit, OffsetRanges, PartitionOffsets, StartingOffsets,
    TopicPartition, partition_offsets_from_json, partition_offsets_to_json,
};
use spate::logstore::{Checkpoint, CheckpointSettings, Verdict};
use spate::runtime::{OffsetsHook, StreamingContext, StreamingSettings};

use common::{Error, Produced, brokers, ensure_topic, produce, run_until};

/// The input's name in spate's `offsets/N`.
const INPUT: &str = "kafka";

/// Starts a spate job at the Kafka offsets a Spark Structured Streaming query committed.
#[derive(Clone, Debug, Parser)]
struct Args {
    /// The Spark checkpoint (read only).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/spate-cli/tests/fixtures/spark-checkpoint"))]
    spark_checkpoint: PathBuf,
    /// The Spark source that reads Kafka: its position among the query's sources.
    #[arg(long, default_value = "0")]
    spark_source: String,
    /// Read this topic, at the offsets Spark committed for its topic
    /// (default: the topic Spark read).
    #[arg(long)]
    topic: Option<String>,
    /// The spate checkpoint directory.
    #[arg(long, default_value = "spark-migration-checkpoint")]
    checkpoint: PathBuf,
    /// Produce this many records to every partition of the topic first.
    #[arg(long)]
    produce: Option<u64>,
    /// Print the starting offsets and stop (no broker needed).
    #[arg(long)]
    offsets_only: bool,
    /// Stop after this many seconds (sooner once it read what the topic held at start).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// The batch interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    batch_ms: u64,
}

/// Where the Spark query stands, and where a spate job takes over.
#[derive(Debug)]
struct Handover {
    query_id: String,
    /// What the verdict says, in words.
    state: String,
    /// The offsets of the last committed batch: the first record not yet done.
    offsets: PartitionOffsets,
}

/// Reads the Spark checkpoint's verdict and its last committed Kafka offsets.
fn spark_handover(dir: &Path, source: &str) -> Result<Handover, Error> {
    let spark = Checkpoint::open_read_only(dir, CheckpointSettings::new())?;
    let query_id = spark.metadata().map(|m| m.id.clone()).unwrap_or_default();
    let (committed, state) = match spark.verdict()?.into_consistent()? {
        Verdict::Fresh => return Err(format!("the Spark checkpoint {} has no batch", dir.display()).into()),
        Verdict::Resume { next, last_offsets, .. } => {
            (last_offsets, format!("every planned batch committed; Spark would plan batch {next} next"))
        }
        Verdict::Rerun { batch, .. } => {
            let previous = batch.prev().ok_or_else(|| {
                format!(
                    "batch {batch} is the Spark query's first and it never committed: start from its starting offsets"
                )
            })?;
            let offsets = spark.offsets().get(previous)?.ok_or_else(|| format!("offsets/{previous} is missing"))?;
            let state = format!(
                "batch {previous} committed, batch {batch} planned but not committed (Spark would re-run it; \
                 spate reads its records instead)"
            );
            (offsets, state)
        }
        Verdict::Inconsistent(_) => unreachable!("into_consistent refuses an inconsistent verdict"),
    };
    let value = committed.offset_of(source).flatten().ok_or_else(|| {
        let names: Vec<&str> = committed.sources.iter().map(|s| s.name.as_str()).collect();
        format!("the Spark checkpoint has no offsets for source {source:?}; its sources are {}", names.join(", "))
    })?;
    let offsets = partition_offsets_from_json(&value.to_string())
        .map_err(|e| format!("source {source} is not a Kafka source (offsets {value}): {e}"))?;
    Ok(Handover { query_id, state, offsets })
}

/// The same offsets on `topic`.
fn on_topic(offsets: &PartitionOffsets, topic: &str) -> PartitionOffsets {
    offsets.iter().map(|(tp, offset)| (TopicPartition::new(topic, tp.partition), *offset)).collect()
}

/// What a run did.
#[derive(Debug, Default)]
struct Summary {
    start: PartitionOffsets,
    /// Offsets read, per partition, in the order read.
    read: BTreeMap<i32, Vec<i64>>,
    /// The ranges of spate's first batch, from its `offsets/0`.
    first_batch: Option<OffsetRanges>,
    finished_early: bool,
}

/// Produces `n` records to each partition of `start`'s topic, creating it first.
fn produce_records(brokers: &str, topic: &str, start: &PartitionOffsets, n: u64) -> Result<(), Error> {
    let partitions = start.keys().map(|tp| tp.partition).max().map_or(1, |p| p + 1);
    ensure_topic(brokers, topic, partitions)?;
    let records: Vec<Produced> = (0..partitions)
        .flat_map(|p| (0..n).map(move |i| Produced { partition: Some(p), key: None, value: format!("p{p}-{i}") }))
        .collect();
    produce(brokers, topic, &records)?;
    println!("produced {n} records to each of the {partitions} partitions of {topic}");
    Ok(())
}

/// Runs the example and says what it did.
fn run(args: &Args) -> Result<Summary, Error> {
    let handover = spark_handover(&args.spark_checkpoint, &args.spark_source)?;
    println!("Spark query {} in {}: {}", handover.query_id, args.spark_checkpoint.display(), handover.state);
    let topic = match &args.topic {
        Some(topic) => topic.clone(),
        None => handover.offsets.keys().next().map(|tp| tp.topic.clone()).ok_or("Spark committed no partition")?,
    };
    let start = on_topic(&handover.offsets, &topic);
    println!("starting offsets: {}", partition_offsets_to_json(&start));
    let mut summary = Summary { start: start.clone(), ..Summary::default() };
    if args.offsets_only {
        return Ok(summary);
    }

    let brokers = brokers()?;
    if let Some(n) = args.produce {
        produce_records(&brokers, &topic, &start, n)?;
    }
    let batch = Duration::from_millis(args.batch_ms);
    let config = DirectKafkaSettings::subscribe(&brokers, "spark-migration", [topic.clone()])
        .with_starting_offsets(StartingOffsets::Spec(start.clone()))
        .with_commit(OffsetCommit::CheckpointOnly);
    let stream = Arc::new(DirectKafkaStream::new(config)?);
    let read: Arc<Mutex<BTreeMap<i32, Vec<i64>>>> = Arc::default();
    let (input, seen) = (Arc::clone(&stream), Arc::clone(&read));
    let ctx = StreamingContext::get_or_create(&args.checkpoint, StreamingSettings::new(batch), move |p| {
        let resume = Arc::clone(&input);
        // A spate checkpoint with batches of its own resumes from them; the starting offsets are then unused.
        let on_resume: OffsetsHook = Box::new(move |offsets: &str| {
            let ranges = OffsetRanges::from_json(offsets).map_err(|e| e.to_string())?;
            resume.resume_after(&ranges).map_err(|e| e.to_string())
        });
        p.replayable_input(INPUT, input, Some(on_resume), None)
            .foreach_batch(move |records, info| {
                let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                let mut first: BTreeMap<i32, (i64, i64, u64)> = BTreeMap::new();
                for record in records.iter() {
                    let KafkaRecord { partition, offset, .. } = record;
                    seen.entry(*partition).or_default().push(*offset);
                    let e = first.entry(*partition).or_insert((*offset, *offset, 0));
                    (e.0, e.1, e.2) = (e.0.min(*offset), e.1.max(*offset), e.2 + 1);
                }
                for (partition, (low, high, n)) in first {
                    println!("batch {}: partition {partition}: {n} records, offsets {low}..={high}", info.batch_id);
                }
                Ok(())
            })
            .name("show-offsets");
        Ok(())
    })?;
    if let Some(report) = ctx.recovery() {
        println!("{report}");
    }
    // Spark's offsets on a new spate checkpoint; its own position on one that has batches.
    let position = stream.position()?;
    if position != start {
        println!("the spate checkpoint has batches of its own: it continues from them, not from Spark's offsets");
    }
    // What the topic holds now: the run stops once it read up to there.
    let ends = common::end_offsets(&brokers, &topic)?;
    let to_read: u64 = position
        .iter()
        .map(|(tp, from)| ends.get(&tp.partition).map_or(0, |end| end.saturating_sub(*from).max(0).unsigned_abs()))
        .sum();
    let mut count = 0;
    let outcome = run_until(ctx, args.seconds, |progress| {
        count += progress.input_records;
        count >= to_read
    })?;

    let spate = Checkpoint::open_read_only(&args.checkpoint, CheckpointSettings::new())?;
    if let Some(entry) = spate.offsets().get(spate::core::BatchId(0))? {
        summary.first_batch = OffsetRanges::from_offset_seq(&entry, INPUT)?;
    }
    summary.read = std::mem::take(&mut *read.lock().unwrap_or_else(PoisonError::into_inner));
    summary.finished_early = outcome.done;
    Ok(summary)
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(s) if args.offsets_only => {
            println!("start spate there: spate run --starting-offsets '{}' ...", partition_offsets_to_json(&s.start));
            ExitCode::SUCCESS
        }
        Ok(s) => {
            if let Some(first) = &s.first_batch {
                let from = partition_offsets_to_json(&first.from_offsets());
                println!("spate's batch 0 (offsets/0 of {}) read from {from}", args.checkpoint.display());
            }
            let read: usize = s.read.values().map(Vec::len).sum();
            let end = if s.finished_early { "read everything the topic held at start" } else { "time is up" };
            println!("read {read} records; stopped: {end}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("spark_migration: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn args(checkpoint: PathBuf) -> Args {
        Args::parse_from(["spark_migration", "--checkpoint", checkpoint.to_str().unwrap()])
    }

    fn offsets(topic: &str, by_partition: [(i32, i64); 3]) -> PartitionOffsets {
        by_partition.into_iter().map(|(p, o)| (TopicPartition::new(topic, p), o)).collect()
    }

    /// Spark's fixture: batch 1 committed at 36/40/12, batch 2 planned only.
    #[test]
    fn the_offsets_are_those_of_the_last_batch_spark_committed() {
        let dir = tempfile::tempdir().unwrap();
        let summary = run(&Args { offsets_only: true, ..args(dir.path().join("checkpoint")) }).unwrap();
        assert_eq!(summary.start, offsets("events", [(0, 36), (1, 40), (2, 12)]));
        // Reading the Spark checkpoint changed nothing in it, and no spate checkpoint was made.
        assert!(!args(dir.path().into()).spark_checkpoint.join("LOCK").exists());
        assert!(!dir.path().join("checkpoint").exists());
    }

    /// Against the test broker: the job reads every partition from exactly
    /// Spark's offset to the end, each record once, and its `offsets/0`
    /// starts there.
    #[test]
    fn the_spate_job_starts_at_exactly_the_spark_offsets() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let topic = format!("spark-events-{}-{nanos}", std::process::id());
        let produced = 60;
        let args = Args {
            topic: Some(topic.clone()),
            produce: Some(produced),
            seconds: 120,
            batch_ms: 200,
            ..args(dir.path().join("checkpoint"))
        };
        let summary = run(&args).unwrap();
        assert!(summary.finished_early, "the topic was not read to its end within 120 s: {summary:?}");
        let start = offsets(&topic, [(0, 36), (1, 40), (2, 12)]);
        for (tp, from) in &start {
            let expected: Vec<i64> = (*from..produced as i64).collect();
            assert_eq!(summary.read.get(&tp.partition), Some(&expected), "partition {}", tp.partition);
        }
        assert_eq!(summary.first_batch.map(|ranges| ranges.from_offsets()), Some(start));
    }
}
