//! `spate demo`: the word-count job without a broker, on spate-runtime's
//! demo pipeline: the generator receiver with its write-ahead log on
//! (`--keys` distinct words drawn by Zipf's law of `--zipf`: 10,000 and 1 by
//! default), words counted per batch and over a window of 30 batches sliding by 2
//! (30 s and 2 s at the default 1 s interval), a progress line a batch, the
//! top words of each window, and the runtime's exactly-once file output
//! (`batch-<N>.json`, `window-<N>.json`, default `<checkpoint>/output`).
//!
//! With `--window-files LOCATION`, every word count of each window also goes,
//! exactly once, to JSON lines files partitioned by the window's end under
//! a directory or `s3://bucket/prefix` (spate-files).
//!
//! With an `s3://bucket/prefix` checkpoint the receiver's write-ahead log
//! and the block tracker's event log stay on a local disk (`--wal-dir`,
//! required), and so does the output (default `<wal-dir>/output`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{Duration, Time};
use spate_files::{FileSink, FileSinkSettings};
use spate_logstore::ObjectStoreSettings;
use spate_runtime::StreamingSettings;
use spate_runtime::demo::{DemoSettings, TopWords, WindowCountsCallback, word_count_context};

use crate::args::DemoArgs;
use crate::error::CliError;
use crate::job::{JobControl, Lines, drive, refuse_inconsistent, runtime_error};
use crate::location::object_store_settings;
use crate::settings::{JobFlags, job_settings};

const ACTION: &str = "cannot run the demo on checkpoint";

/// The window, in batches (30 s of 1 s batches).
const WINDOW_BATCHES: u64 = 30;
/// The slide, in batches (2 s of 1 s batches).
const SLIDE_BATCHES: u64 = 2;

/// How `spate demo` runs.
#[derive(Clone, Debug)]
struct StreamingDemo {
    checkpoint: PathBuf,
    object_store: ObjectStoreSettings,
    output: PathBuf,
    window_files: Option<PathBuf>,
    seed: u64,
    keys: u64,
    zipf: f64,
    rate: u64,
    batch: Duration,
    top: usize,
    seconds: Option<u64>,
    until_batch: Option<u64>,
    quiet: bool,
    /// The job's settings: flags over the `--settings` file over the defaults.
    settings: StreamingSettings,
}

fn top_words_line(top: &TopWords, window: Duration) -> String {
    let words: Vec<String> = top.words.iter().map(|(w, c)| format!("{w} {c}")).collect();
    let words = if words.is_empty() { "(no words yet)".to_string() } else { words.join(", ") };
    format!("  top words of the {} s window ending at batch {}: {words}", window.as_secs_f64(), top.batch_id)
}

impl StreamingDemo {
    /// The demo the flags ask for; refuses an `s3://` checkpoint without
    /// `--wal-dir` before anything is created.
    fn from_args(args: &DemoArgs) -> Result<Self, CliError> {
        spate_runtime::demo::check_generator_settings(args.keys, args.zipf)
            .map_err(|reason| CliError::usage(format!("--keys {} --zipf {}: {reason}", args.keys, args.zipf)))?;
        let object_store = object_store_settings(&args.s3)?;
        let mut settings = job_settings(&JobFlags {
            batch_ms: args.batch_ms,
            memory: &args.memory,
            watch: &args.watch,
            object_store: &object_store,
            max_records_per_batch: None,
            max_bytes_per_batch: None,
        })?;
        if let Some(dir) = &args.wal_dir {
            settings.wal_dir = Some(dir.clone());
        }
        let in_s3 = spate_logstore::is_object_store_location(&args.checkpoint);
        let output = match (&args.output, &settings.wal_dir) {
            (Some(output), _) => output.clone(),
            (None, Some(wal_dir)) if in_s3 => wal_dir.join("output"),
            (None, None) if in_s3 => return Err(missing_wal_dir(args)),
            (None, _) => args.checkpoint.join("output"),
        };
        Ok(StreamingDemo {
            checkpoint: args.checkpoint.clone(),
            object_store,
            output,
            window_files: args.window_files.clone(),
            seed: args.seed,
            keys: args.keys,
            zipf: args.zipf,
            rate: args.rate,
            batch: settings.batch_interval,
            top: usize::try_from(args.top).unwrap_or(usize::MAX),
            seconds: args.seconds,
            until_batch: args.until_batch,
            quiet: args.quiet,
            settings,
        })
    }

    fn settings(&self) -> StreamingSettings {
        self.settings.clone()
    }
}

/// One word's count in one window: a line of the `--window-files` output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WindowCount {
    /// The window's start (exclusive: the batch before the window's first).
    pub window_start_ms: i64,
    /// The window's end: the time of the batch that closed it; the files
    /// are partitioned by it.
    pub window_end_ms: i64,
    /// The word.
    pub word: String,
    /// Its count in the window.
    pub count: u64,
}

/// The output of every window's counts through an exactly-once file sink at `location`.
fn window_files(
    location: &Path,
    object_store: &ObjectStoreSettings,
    window: Duration,
) -> Result<WindowCountsCallback, CliError> {
    let settings = FileSinkSettings::new().object_store(object_store.clone());
    let sink = FileSink::open(location, settings, |w: &WindowCount| Time::from_millis(w.window_end_ms))
        .map_err(|source| CliError::Files { location: location.to_path_buf(), source: Box::new(source) })?;
    Ok(Arc::new(move |counts, info| {
        let (start, end) = ((info.time - window).as_millis(), info.time.as_millis());
        let lines: Vec<WindowCount> = counts
            .iter()
            .map(|(word, count)| WindowCount {
                window_start_ms: start,
                window_end_ms: end,
                word: word.clone(),
                count: *count,
            })
            .collect();
        sink.write_batch(&lines, info)?;
        Ok(())
    }))
}

/// The demo's receiver appends to its write-ahead log many times a second:
/// that log stays on a local disk, which an `s3://` checkpoint is not.
fn missing_wal_dir(args: &DemoArgs) -> CliError {
    CliError::usage(format!(
        "--wal-dir DIR is required with the s3:// checkpoint {}: the demo's receiver keeps its write-ahead \
         log and the block tracker's event log in that local directory",
        args.checkpoint.display()
    ))
}

/// Runs the demo until it is stopped; returns the closing line.
pub(crate) fn run(args: &DemoArgs) -> Result<String, CliError> {
    let demo = &StreamingDemo::from_args(args)?;
    refuse_inconsistent(&demo.checkpoint, &demo.object_store, ACTION)?;
    let lines = Arc::new(Lines::default());
    let window = demo.batch.times(WINDOW_BATCHES);
    let mut options = DemoSettings::new(demo.seed);
    options.keys = demo.keys;
    options.zipf = demo.zipf;
    options.rate = Some(demo.rate);
    options.window = window;
    options.slide = demo.batch.times(SLIDE_BATCHES);
    options.top_n = demo.top;
    options.output_dir = Some(demo.output.clone());
    if let Some(location) = &demo.window_files {
        options.on_window_counts = Some(window_files(location, &demo.object_store, window)?);
    }
    if !demo.quiet {
        let lines = Arc::clone(&lines);
        options.on_top_words = Some(Arc::new(move |top: &TopWords| lines.say(&top_words_line(top, window))));
    }
    let ctx = word_count_context(Some(&demo.checkpoint), demo.settings(), &options)
        .map_err(|e| runtime_error(ACTION, &demo.checkpoint, e))?;
    let control = JobControl {
        checkpoint: demo.checkpoint.clone(),
        action: ACTION,
        quiet: demo.quiet,
        seconds: demo.seconds,
        until_batch: demo.until_batch,
    };
    let report = drive(ctx, &control, lines)?;
    let last = report.last_committed.map_or("none".to_string(), |b| b.to_string());
    let window_files =
        demo.window_files.as_ref().map_or(String::new(), |l| format!(", window counts in {}", l.display()));
    Ok(format!(
        "stopped gracefully: last committed batch {last} ({} committed in this run); checkpoint {} released, output in \
         {}{window_files}",
        report.batches_committed,
        demo.checkpoint.display(),
        demo.output.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::{BatchId, Time};

    fn demo_args(extra: &[&str]) -> DemoArgs {
        let argv = [&["spate", "demo"][..], extra].concat();
        let cli = <crate::args::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let crate::args::Command::Demo(args) = cli.command else { panic!("wrong command") };
        *args
    }

    #[test]
    fn an_s3_checkpoint_needs_a_wal_dir_and_puts_the_output_there() {
        let error = StreamingDemo::from_args(&demo_args(&["--checkpoint", "s3://b/demo"])).unwrap_err();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Usage);
        assert!(error.to_string().starts_with("--wal-dir DIR is required with the s3:// checkpoint s3://b/demo"));
        let demo = StreamingDemo::from_args(&demo_args(&["--checkpoint", "s3://b/demo", "--wal-dir", "/w"])).unwrap();
        assert_eq!(demo.output, PathBuf::from("/w/output"));
        assert_eq!(demo.settings().wal_dir, Some(PathBuf::from("/w")));
        let explicit = ["--checkpoint", "s3://b/demo", "--wal-dir", "/w", "--output", "/o"];
        assert_eq!(StreamingDemo::from_args(&demo_args(&explicit)).unwrap().output, PathBuf::from("/o"));
        // A local checkpoint keeps its output inside, with or without --wal-dir.
        let local = StreamingDemo::from_args(&demo_args(&["--checkpoint", "/ck", "--wal-dir", "/w"])).unwrap();
        assert_eq!(local.output, PathBuf::from("/ck/output"));
        assert_eq!(StreamingDemo::from_args(&demo_args(&["--checkpoint", "/ck"])).unwrap().settings().wal_dir, None);
    }

    #[test]
    fn window_counts_go_to_hourly_json_lines_files_once_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let location = dir.path().join("windows");
        let args = demo_args(&["--checkpoint", "/ck", "--window-files", location.to_str().unwrap()]);
        let demo = StreamingDemo::from_args(&args).unwrap();
        assert_eq!(demo.window_files.as_deref(), Some(location.as_path()));
        let write = window_files(&location, &demo.object_store, Duration::from_secs(30)).unwrap();
        // 2026-12-05T18:07:09Z.
        let info = spate_files::BatchInfo { time: Time::from_millis(1_796_494_029_000), batch_id: BatchId(9) };
        let counts = [("spate".to_string(), 3), ("flow".to_string(), 1)];
        write(&counts, info).unwrap();
        write(&counts, info).unwrap(); // the batch re-run: nothing new
        let file = location.join("dt=2026-12-05/hour=18/part-1796494029000-9-00000.jsonl");
        assert_eq!(
            std::fs::read_to_string(file).unwrap(),
            "{\"window_start_ms\":1796493999000,\"window_end_ms\":1796494029000,\"word\":\"spate\",\"count\":3}\n\
             {\"window_start_ms\":1796493999000,\"window_end_ms\":1796494029000,\"word\":\"flow\",\"count\":1}\n"
        );
        assert_eq!(std::fs::read_dir(location.join("dt=2026-12-05/hour=18")).unwrap().count(), 1);
    }

    #[test]
    fn window_files_in_s3_without_the_s3_feature_or_with_a_bad_location_are_usage_errors() {
        let error =
            window_files(Path::new("s3://"), &ObjectStoreSettings::default(), Duration::from_secs(30)).err().unwrap();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Usage, "{error}");
        assert!(error.to_string().starts_with("cannot write files to s3://"), "{error}");
    }

    #[test]
    fn more_zipf_keys_than_the_table_takes_are_a_usage_error() {
        let error = StreamingDemo::from_args(&demo_args(&["--keys", "20000000"])).unwrap_err();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Usage);
        assert!(error.to_string().starts_with("--keys 20000000 --zipf 1: "), "{error}");
        assert!(error.to_string().contains("above 10000000 with a Zipf exponent"), "{error}");
        let uniform = StreamingDemo::from_args(&demo_args(&["--keys", "20000000", "--zipf", "0"])).unwrap();
        assert_eq!((uniform.keys, uniform.zipf), (20_000_000, 0.0));
    }

    #[test]
    fn the_s3_flags_reach_the_runtime_settings() {
        let args = demo_args(&["--checkpoint", "s3://b/demo", "--wal-dir", "/w", "--s3-endpoint", "http://h:1"]);
        let settings = StreamingDemo::from_args(&args).unwrap().settings();
        assert_eq!(settings.object_store.endpoint.as_deref(), Some("http://h:1"));
    }

    #[test]
    fn the_top_words_line_lists_words_with_counts() {
        let top = TopWords { batch_id: BatchId(12), batch_time: Time::ZERO, words: vec![("spate".into(), 9)] };
        assert_eq!(
            top_words_line(&top, Duration::from_secs(30)),
            "  top words of the 30 s window ending at batch 12: spate 9"
        );
        let empty = TopWords { words: Vec::new(), ..top };
        assert!(top_words_line(&empty, Duration::from_secs(30)).ends_with("(no words yet)"));
    }
}
