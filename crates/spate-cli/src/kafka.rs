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
    DirectKafkaSettings, DirectKafkaStream, KafkaRecord, KafkaSink, OffsetCommit, OffsetRanges, OutputRecord,
    StartingOffsets, TransactionalKafkaSink,
};
use spate_logstore::{Checkpoint, ObjectStoreSettings};
use spate_runtime::demo::more_frequent;
use spate_runtime::{PipelineBuilder, StreamingContext, StreamingSettings};

use crate::args::RunArgs;
use crate::error::CliError;
use crate::job::{JobControl, Lines, drive, refuse_inconsistent, runtime_error};
use crate::location::{checkpoint_options, object_store_settings};
use crate::settings::{JobFlags, job_settings};

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
            .top_n(top, more_frequent)
            .foreach_batch(move |batch, info| {
                let words: Vec<(String, u64)> = batch.iter().cloned().collect();
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

/// The direct stream's configuration from the command line.
fn stream_config(args: &RunArgs) -> Result<DirectKafkaSettings, CliError> {
    let mut config = DirectKafkaSettings::subscribe(&args.kafka, &args.group, [args.topic.clone()])
        .with_starting_offsets(starting_offsets(&args.starting_offsets)?)
        .with_commit(if args.exactly_once { OffsetCommit::CheckpointOnly } else { OffsetCommit::KafkaGroup });
    if let Some(rate) = args.max_rate_per_partition {
        config = config.with_max_rate_per_partition(rate);
    }
    Ok(config)
}

/// The job's settings from the command line (and `--settings`): the batch
/// interval and the caps of every batch are the context's, which tells the
/// stream.
pub(crate) fn run_settings(args: &RunArgs, object_store: &ObjectStoreSettings) -> Result<StreamingSettings, CliError> {
    job_settings(&JobFlags {
        batch_ms: args.batch_ms,
        memory: &args.memory,
        watch: &args.watch,
        object_store,
        max_records_per_batch: args.max_records_per_batch,
        max_bytes_per_batch: args.max_bytes_per_batch,
    })
}

/// Runs the Kafka pipeline until it is stopped; returns the closing line.
pub(crate) fn run(args: &RunArgs) -> Result<String, CliError> {
    if let Some(name) = &args.app.app {
        return crate::app::run(args, &args.app, name);
    }
    let object_store = object_store_settings(&args.s3)?;
    refuse_inconsistent(&args.checkpoint, &object_store, ACTION)?;
    let settings = run_settings(args, &object_store)?;
    let batch = settings.batch_interval;
    let config = stream_config(args)?;
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

    fn settings_of(extra: &[&str]) -> Result<StreamingSettings, CliError> {
        run_settings(&run_args(extra), &ObjectStoreSettings::default())
    }

    #[test]
    fn a_batch_reads_a_quarter_of_the_memory_budget_at_most_unless_told() {
        assert_eq!(settings_of(&["--max-memory", "64M"]).unwrap().batch_bytes(), 16 << 20);
        let large = settings_of(&["--max-memory", "4G"]).unwrap();
        assert_eq!(large.batch_bytes(), spate_runtime::DEFAULT_MAX_BYTES_PER_BATCH);
        let told = settings_of(&["--max-memory", "64M", "--max-bytes-per-batch", "1048576"]).unwrap();
        assert_eq!(told.batch_bytes(), 1 << 20);
        let error = settings_of(&["--max-memory", "64M", "--max-bytes-per-batch", "1073741824"]).unwrap_err();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Usage);
        let error = error.to_string();
        assert!(error.contains("max_bytes_per_batch") && error.contains("memory budget"), "{error}");
    }

    #[test]
    fn every_batch_is_capped_by_default_and_the_caps_can_be_raised() {
        let limits = settings_of(&[]).unwrap().batch_limits(None);
        assert_eq!(limits.max_records, Some(spate_runtime::DEFAULT_MAX_RECORDS_PER_BATCH));
        assert_eq!(limits.max_bytes, Some(spate_runtime::DEFAULT_MAX_BYTES_PER_BATCH));
        let raised = settings_of(&[
            "--max-records-per-batch",
            "2000000",
            "--max-bytes-per-batch",
            "1073741824",
            "--max-memory",
            "4G",
        ])
        .unwrap()
        .batch_limits(None);
        assert_eq!((raised.max_records, raised.max_bytes), (Some(2_000_000), Some(1 << 30)));
        // The help text states the defaults.
        let help = <crate::args::Cli as clap::CommandFactory>::command()
            .find_subcommand_mut("run")
            .map(|c| c.render_long_help().to_string())
            .unwrap();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(help.contains(&format!("default {}", spate_runtime::DEFAULT_MAX_RECORDS_PER_BATCH)), "{help}");
        assert!(help.contains(&format!("default {}", spate_runtime::DEFAULT_MAX_BYTES_PER_BATCH)), "{help}");
        let zero =
            ["spate", "run", "--kafka", "b", "--topic", "t", "--output-topic", "o", "--max-bytes-per-batch", "0"];
        assert!(<crate::args::Cli as clap::Parser>::try_parse_from(zero).is_err());
    }

    #[test]
    fn a_settings_file_sets_what_no_flag_gives_and_flags_override_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("job.json");
        std::fs::write(
            &file,
            r#"{"batch_interval_ms": 500, "max_memory_bytes": 67108864, "max_records_per_batch": 7}"#,
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let from_file = settings_of(&["--settings", path]).unwrap();
        assert_eq!(from_file.batch_interval, Duration::from_millis(500));
        assert_eq!((from_file.max_memory_bytes, from_file.max_records_per_batch), (64 << 20, 7));
        let overridden =
            settings_of(&["--settings", path, "--batch-ms", "2000", "--max-records-per-batch", "9"]).unwrap();
        assert_eq!(overridden.batch_interval, Duration::from_millis(2000));
        assert_eq!((overridden.max_memory_bytes, overridden.max_records_per_batch), (64 << 20, 9));
        std::fs::write(&file, r#"{"batch_intervall_ms": 500}"#).unwrap();
        let error = settings_of(&["--settings", path]).unwrap_err();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Usage);
        assert!(error.to_string().contains("batch_intervall_ms"), "{error}");
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
