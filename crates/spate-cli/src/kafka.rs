//! `spate run`: the word-count pipeline on a Kafka topic.
//!
//! The direct stream plans one offset range per partition and batch; the
//! runtime logs them to `offsets/N` before the batch runs. Words are counted
//! over a window of 30 batches sliding by 2, and each window's top words go
//! to the output topic as one JSON record keyed by the batch id. With
//! `--exactly-once` the record and the batch's consumed offsets commit in one
//! Kafka transaction (a re-run batch whose transaction committed writes
//! nothing); otherwise an idempotent producer writes it (at least once across
//! a re-run) and the consumed offsets go to the group for monitoring.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::json;
use spate_core::{BatchId, Duration};
use spate_kafka::{
    DirectKafkaConfig, DirectKafkaStream, KafkaRecord, KafkaSink, OffsetCommit, OffsetRanges, OutputRecord,
    StartingOffsets, TransactionalKafkaSink,
};
use spate_logstore::{Checkpoint, ObjectStoreSettings};
use spate_runtime::{PipelineBuilder, StreamingContext, StreamingSettings};

use crate::args::{MemoryArgs, RunArgs};
use crate::error::CliError;
use crate::job::{JobControl, Lines, drive, refuse_inconsistent, runtime_error};
use crate::location::{checkpoint_options, object_store_settings};

/// The error type the dstream output closures return.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ACTION: &str = "cannot run the Kafka pipeline on checkpoint";
/// The input's name: the key of its offsets in `offsets/N`.
const INPUT: &str = "kafka";
/// The window, in batches (30 s of 1 s batches).
const WINDOW_BATCHES: u64 = 30;
/// The slide, in batches (2 s of 1 s batches).
const SLIDE_BATCHES: u64 = 2;

/// Where the window records go.
enum OutputSink {
    /// Records and consumed offsets in one transaction per batch.
    Transactional(TransactionalKafkaSink),
    /// An idempotent producer: at least once across re-runs.
    Idempotent(KafkaSink),
}

/// What the pipeline closure needs.
struct Pipeline {
    stream: Arc<DirectKafkaStream>,
    sink: Arc<OnceLock<OutputSink>>,
    checkpoint: PathBuf,
    object_store: ObjectStoreSettings,
    batch: Duration,
    top: usize,
    exactly_once: bool,
}

fn kafka_error(what: &'static str, source: spate_kafka::KafkaError) -> CliError {
    CliError::Kafka { what, source: Box::new(source) }
}

pub(crate) fn starting_offsets(spec: &str) -> Result<StartingOffsets, CliError> {
    match spec {
        "earliest" => Ok(StartingOffsets::Earliest),
        "latest" => Ok(StartingOffsets::Latest),
        json => spate_kafka::partition_offsets_from_json(json).map(StartingOffsets::Spec).map_err(|e| {
            CliError::usage(format!("--starting-offsets is neither earliest, latest nor a JSON offsets spec: {e}"))
        }),
    }
}

/// The words of a record's value (UTF-8, split on whitespace).
pub(crate) fn words_of(record: &KafkaRecord) -> Vec<String> {
    record
        .value
        .as_deref()
        .map(|v| String::from_utf8_lossy(v).split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The offset ranges batch `id` read, from `offsets/<id>` (durable before any output runs).
fn logged_ranges(checkpoint: &Path, settings: &ObjectStoreSettings, id: BatchId) -> Result<OffsetRanges, BoxError> {
    let log = Checkpoint::open_read_only(checkpoint, checkpoint_options(settings))?;
    let seq = log.offsets().get(id)?.ok_or_else(|| format!("offsets/{id} is missing"))?;
    let json = seq.offset_of(INPUT).flatten().ok_or_else(|| format!("offsets/{id} has no offsets for {INPUT}"))?;
    Ok(OffsetRanges::from_json(&json.to_string())?)
}

impl Pipeline {
    fn declare(&self, p: &mut PipelineBuilder) {
        let resume = Arc::clone(&self.stream);
        let on_resume: spate_runtime::OffsetsHook = Box::new(move |offsets: &str| {
            let ranges = OffsetRanges::from_json(offsets).map_err(|e| e.to_string())?;
            resume.resume_after(&ranges).map_err(|e| e.to_string())
        });
        let committed = Arc::clone(&self.stream);
        let on_commit: Option<spate_runtime::OffsetsHook> = (!self.exactly_once).then(|| {
            Box::new(move |offsets: &str| {
                let ranges = OffsetRanges::from_json(offsets).map_err(|e| e.to_string())?;
                committed.on_batch_completed(&ranges).map_err(|e| e.to_string())
            }) as spate_runtime::OffsetsHook
        });
        let records = p.replayable_input(INPUT, Arc::clone(&self.stream), Some(on_resume), on_commit);
        let windowed = records
            .flat_map(|record: KafkaRecord| words_of(&record))
            .map(|word| (word, 1u64))
            .reduce_by_key_and_window_inv_filtered(
                |a, b| a + b,
                |a, b| a.saturating_sub(*b),
                self.batch.times(WINDOW_BATCHES),
                self.batch.times(SLIDE_BATCHES),
                |_, count| *count > 0,
            )
            .name("window-counts");
        let (sink, checkpoint, top) = (Arc::clone(&self.sink), self.checkpoint.clone(), self.top);
        let settings = self.object_store.clone();
        windowed
            .foreach_batch(move |batch, info| {
                let mut words: Vec<(String, u64)> = batch.iter().cloned().collect();
                words.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                words.truncate(top);
                let value = json!({"batch": info.batch_id.0, "batchTimeMs": info.time.as_millis(), "top": words});
                let record = OutputRecord::keyed(info.batch_id.0.to_string(), value.to_string());
                match sink.get() {
                    Some(OutputSink::Transactional(sink)) => {
                        let ranges = logged_ranges(&checkpoint, &settings, info.batch_id)?;
                        sink.write_batch(info.batch_id, &ranges, [record])?;
                    }
                    Some(OutputSink::Idempotent(sink)) => {
                        sink.write([record])?;
                    }
                    None => return Err("the output sink is not open".into()),
                }
                Ok(())
            })
            .name("top-words-to-kafka");
    }
}

/// Opens the output sink; the transactional id is the checkpoint's query id,
/// so a restarted job fences its previous incarnation.
fn open_sink(args: &RunArgs, settings: &ObjectStoreSettings) -> Result<OutputSink, CliError> {
    if !args.exactly_once {
        return KafkaSink::new(&args.kafka, &args.output_topic)
            .map(OutputSink::Idempotent)
            .map_err(|e| kafka_error("cannot open the output producer", e));
    }
    let checkpoint = Checkpoint::open_read_only(&args.checkpoint, checkpoint_options(settings))
        .map_err(|e| CliError::checkpoint(ACTION, &args.checkpoint, e))?;
    let id = checkpoint.metadata().map_or_else(|| args.group.clone(), |m| m.id.clone());
    TransactionalKafkaSink::new(&args.kafka, &args.output_topic, &format!("spate-{id}"), &args.group)
        .map(OutputSink::Transactional)
        .map_err(|e| kafka_error("cannot open the transactional output producer", e))
}

/// The bytes one Kafka batch reads at most: `explicit` when given (it may
/// not pass the memory budget), else a quarter of the budget up to the
/// direct stream's default, so a batch and the copies its operators make
/// stay within the budget.
pub(crate) fn batch_bytes(memory: &MemoryArgs, explicit: Option<u64>) -> Result<u64, CliError> {
    match explicit {
        Some(bytes) if bytes > memory.max_memory => Err(CliError::usage(format!(
            "--max-bytes-per-batch {bytes} is more than --max-memory {}: one batch must fit in the budget",
            memory.max_memory
        ))),
        Some(bytes) => Ok(bytes),
        None => Ok(spate_kafka::DEFAULT_MAX_BYTES_PER_BATCH.min(memory.max_memory / 4).max(1)),
    }
}

/// The direct stream's configuration from the command line.
fn stream_config(args: &RunArgs, batch: Duration) -> Result<DirectKafkaConfig, CliError> {
    let mut config = DirectKafkaConfig::subscribe(&args.kafka, &args.group, [args.topic.clone()], batch)
        .starting_offsets(starting_offsets(&args.starting_offsets)?)
        .commit(if args.exactly_once { OffsetCommit::CheckpointOnly } else { OffsetCommit::KafkaGroup });
    if let Some(rate) = args.max_rate_per_partition {
        config = config.max_rate_per_partition(rate);
    }
    if let Some(records) = args.max_records_per_batch {
        config = config.max_records_per_batch(records);
    }
    Ok(config.max_bytes_per_batch(batch_bytes(&args.memory, args.max_bytes_per_batch)?))
}

/// Runs the Kafka pipeline until it is stopped; returns the closing line.
pub(crate) fn run(args: &RunArgs) -> Result<String, CliError> {
    if let Some(name) = &args.app.app {
        return crate::app::run(args, &args.app, name);
    }
    let object_store = object_store_settings(&args.s3)?;
    refuse_inconsistent(&args.checkpoint, &object_store, ACTION)?;
    let batch = Duration::from_millis(args.batch_ms);
    let config = stream_config(args, batch)?;
    let stream = DirectKafkaStream::new(config).map_err(|e| kafka_error("cannot create the Kafka consumer", e))?;
    let pipeline = Pipeline {
        stream: Arc::new(stream),
        sink: Arc::new(OnceLock::new()),
        checkpoint: args.checkpoint.clone(),
        object_store: object_store.clone(),
        batch,
        top: usize::try_from(args.top).unwrap_or(usize::MAX),
        exactly_once: args.exactly_once,
    };
    let settings =
        args.memory.apply(args.watch.apply(StreamingSettings::new(batch).with_object_store(object_store.clone())));
    let ctx = StreamingContext::get_or_create(&args.checkpoint, settings, |p| {
        pipeline.declare(p);
        Ok(())
    })
    .map_err(|e| runtime_error(ACTION, &args.checkpoint, e))?;
    // The context holds the lock now; a second process never gets this far.
    let _ = pipeline.sink.set(open_sink(args, &object_store)?);
    let control = JobControl {
        checkpoint: args.checkpoint.clone(),
        action: ACTION,
        quiet: args.quiet,
        seconds: args.seconds,
        until_batch: args.until_batch,
    };
    let report = drive(ctx, &control, Arc::new(Lines::default()))?;
    let last = report.last_committed.map_or("none".to_string(), |b| b.to_string());
    Ok(format!(
        "stopped gracefully: last committed batch {last} ({} committed in this run); checkpoint {} released",
        report.batches_committed,
        args.checkpoint.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starting_offsets_accept_keywords_and_sparks_spec() {
        assert!(matches!(starting_offsets("earliest"), Ok(StartingOffsets::Earliest)));
        assert!(matches!(starting_offsets("latest"), Ok(StartingOffsets::Latest)));
        let Ok(StartingOffsets::Spec(spec)) = starting_offsets(r#"{"events":{"0":36,"1":-2}}"#) else {
            panic!("spec not parsed")
        };
        assert_eq!(spec.len(), 2);
        let error = starting_offsets("yesterday").err().map(|e| e.exit_code());
        assert_eq!(error, Some(crate::error::ExitCode::Usage));
    }

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["spate", "run", "--kafka", "b:9092", "--topic", "t", "--output-topic", "o"];
        argv.extend_from_slice(extra);
        let cli = <crate::args::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let crate::args::Command::Run(args) = cli.command else { panic!("wrong command") };
        *args
    }

    #[test]
    fn a_batch_reads_a_quarter_of_the_memory_budget_at_most_unless_told() {
        let memory = MemoryArgs { max_memory: 64 << 20, spill_dir: None, max_spill: None };
        assert_eq!(batch_bytes(&memory, None).unwrap(), 16 << 20);
        let large = MemoryArgs { max_memory: 4 << 30, spill_dir: None, max_spill: None };
        assert_eq!(batch_bytes(&large, None).unwrap(), spate_kafka::DEFAULT_MAX_BYTES_PER_BATCH);
        assert_eq!(batch_bytes(&memory, Some(1 << 20)).unwrap(), 1 << 20);
        let error = batch_bytes(&memory, Some(1 << 30)).unwrap_err().to_string();
        assert!(error.contains("--max-bytes-per-batch") && error.contains("--max-memory"), "{error}");
        let config = stream_config(&run_args(&["--max-memory", "64M"]), Duration::from_millis(1000)).unwrap();
        assert_eq!(config.max_bytes_per_batch, 16 << 20);
    }

    #[test]
    fn every_batch_is_capped_by_default_and_the_caps_can_be_raised() {
        let batch = Duration::from_millis(1000);
        let config = stream_config(&run_args(&[]), batch).unwrap();
        assert_eq!(config.max_records_per_batch, spate_kafka::DEFAULT_MAX_RECORDS_PER_BATCH);
        assert_eq!(config.max_bytes_per_batch, spate_kafka::DEFAULT_MAX_BYTES_PER_BATCH);
        let raised = run_args(&[
            "--max-records-per-batch",
            "2000000",
            "--max-bytes-per-batch",
            "1073741824",
            "--max-memory",
            "4G",
        ]);
        let config = stream_config(&raised, batch).unwrap();
        assert_eq!((config.max_records_per_batch, config.max_bytes_per_batch), (2_000_000, 1 << 30));
        // The help text states the defaults.
        let help = <crate::args::Cli as clap::CommandFactory>::command()
            .find_subcommand_mut("run")
            .map(|c| c.render_long_help().to_string())
            .unwrap();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(help.contains(&format!("default {}", spate_kafka::DEFAULT_MAX_RECORDS_PER_BATCH)), "{help}");
        assert!(help.contains(&format!("default {}", spate_kafka::DEFAULT_MAX_BYTES_PER_BATCH)), "{help}");
        let zero =
            ["spate", "run", "--kafka", "b", "--topic", "t", "--output-topic", "o", "--max-bytes-per-batch", "0"];
        assert!(<crate::args::Cli as clap::Parser>::try_parse_from(zero).is_err());
    }

    #[test]
    fn words_come_from_the_value() {
        let record = KafkaRecord {
            topic: Arc::from("t"),
            partition: 0,
            offset: 3,
            timestamp: None,
            key: None,
            value: Some(b"to be  or\nnot".to_vec()),
        };
        assert_eq!(words_of(&record), ["to", "be", "or", "not"]);
        assert!(words_of(&KafkaRecord { value: None, ..record }).is_empty());
    }
}
