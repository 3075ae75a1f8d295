//! `spate demo`: the word-count job without a broker, on spate-runtime's
//! demo pipeline: the generator receiver with its write-ahead log on,
//! words counted per batch and over a window of 30 batches sliding by 2
//! (30 s and 2 s at the default 1 s interval), a progress line a batch, the
//! top words of each window, and the runtime's exactly-once file output
//! (`batch-<N>.json`, `window-<N>.json`, default `<checkpoint>/output`).

use std::path::PathBuf;
use std::sync::Arc;

use spate_core::Duration;
use spate_runtime::StreamingSettings;
use spate_runtime::demo::{DemoOptions, TopWords, word_count_context};

use crate::args::DemoArgs;
use crate::error::CliError;
use crate::job::{JobControl, Lines, drive, refuse_inconsistent, runtime_error};

const ACTION: &str = "cannot run the demo on checkpoint";

/// The window, in batches (30 s of 1 s batches).
const WINDOW_BATCHES: u64 = 30;
/// The slide, in batches (2 s of 1 s batches).
const SLIDE_BATCHES: u64 = 2;

/// How `spate demo` runs.
#[derive(Clone, Debug)]
struct StreamingDemo {
    checkpoint: PathBuf,
    output: PathBuf,
    seed: u64,
    rate: u64,
    batch: Duration,
    top: usize,
    seconds: Option<u64>,
    until_batch: Option<u64>,
    quiet: bool,
}

fn top_words_line(top: &TopWords, window: Duration) -> String {
    let words: Vec<String> = top.words.iter().map(|(w, c)| format!("{w} {c}")).collect();
    let words = if words.is_empty() { "(no words yet)".to_string() } else { words.join(", ") };
    format!("  top words of the {} s window ending at batch {}: {words}", window.as_secs_f64(), top.batch_id)
}

impl StreamingDemo {
    fn from_args(args: &DemoArgs) -> Self {
        StreamingDemo {
            checkpoint: args.checkpoint.clone(),
            output: args.output.clone().unwrap_or_else(|| args.checkpoint.join("output")),
            seed: args.seed,
            rate: args.rate,
            batch: Duration::from_millis(args.batch_ms),
            top: usize::try_from(args.top).unwrap_or(usize::MAX),
            seconds: args.seconds,
            until_batch: args.until_batch,
            quiet: args.quiet,
        }
    }
}

/// Runs the demo until it is stopped; returns the closing line.
pub(crate) fn run(args: &DemoArgs) -> Result<String, CliError> {
    let demo = &StreamingDemo::from_args(args);
    refuse_inconsistent(&demo.checkpoint, ACTION)?;
    let lines = Arc::new(Lines::default());
    let window = demo.batch.times(WINDOW_BATCHES);
    let mut options = DemoOptions::new(demo.seed);
    options.rate = Some(demo.rate);
    options.window = window;
    options.slide = demo.batch.times(SLIDE_BATCHES);
    options.top_n = demo.top;
    options.output_dir = Some(demo.output.clone());
    if !demo.quiet {
        let lines = Arc::clone(&lines);
        options.on_top_words = Some(Arc::new(move |top: &TopWords| lines.say(&top_words_line(top, window))));
    }
    let settings = StreamingSettings::new(demo.batch);
    let ctx = word_count_context(Some(&demo.checkpoint), settings, &options)
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
    Ok(format!(
        "stopped gracefully: last committed batch {last} ({} committed in this run); checkpoint {} released, output in {}",
        report.batches_committed,
        demo.checkpoint.display(),
        demo.output.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::{BatchId, Time};

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
