//! `spate demo`: the word-count job without a broker.
//!
//! A seeded generator produces words; every batch (1 s by default) reads the
//! next `rate × interval` of them; every 2 batches the word counts of the last
//! 30 batches are computed and the top words go to stdout and to an
//! exactly-once file sink (`<checkpoint>/output/output.jsonl` by default).
//! The generator is replayable by position, so a window is recomputed from
//! the logged positions and the offsets log is all the state the job needs.

mod engine;
mod generator;
mod sink;

use std::io::Write;
use std::sync::Arc;

use spate_core::{Clock, Duration, SystemClock};

use crate::args::DemoArgs;
use crate::error::CliError;
use crate::signals::{StopFlag, listen};
use engine::{Demo, DemoConfig};
use sink::FileSink;

/// The window, in batches (30 s of 1 s batches).
const WINDOW_BATCHES: u64 = 30;
/// The slide, in batches (2 s of 1 s batches).
const SLIDE_BATCHES: u64 = 2;

/// Runs the demo until it is stopped; returns the closing line.
pub(crate) fn run(args: &DemoArgs) -> Result<String, CliError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let batch = Duration::from_millis(args.batch_ms);
    let config = DemoConfig {
        seed: args.seed,
        records_per_batch: (args.rate.saturating_mul(args.batch_ms) / 1000).max(1),
        batch,
        window_batches: WINDOW_BATCHES,
        slide_batches: SLIDE_BATCHES,
        top: usize::try_from(args.top).unwrap_or(usize::MAX),
        until_batch: args.until_batch,
        deadline: args.seconds.map(|s| clock.now() + Duration::from_secs(s)),
        quiet: args.quiet,
    };
    let output_dir = args.output.clone().unwrap_or_else(|| args.checkpoint.join("output"));
    let stop = StopFlag::default();
    let _signals = listen(stop.clone())?;
    // The lock is taken before the sink is touched: a second process changes nothing.
    let (demo, start, notes) = Demo::open(&args.checkpoint, FileSink::new(&output_dir), config, clock)?;
    let mut stdout = std::io::stdout();
    for note in notes {
        let _ = writeln!(stdout, "note: {note}");
    }
    let finished = demo.run(start, &stop, &mut stdout)?;
    let last = finished.last_committed.map_or("none".to_string(), |b| b.to_string());
    Ok(format!(
        "{}: last committed batch {last}; checkpoint {} released, output in {}",
        finished.reason,
        demo.dir().display(),
        output_dir.join(sink::OUTPUT_FILE).display()
    ))
}
