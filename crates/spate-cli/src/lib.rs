//! The `spate` command: run the demo or a Kafka pipeline, and inspect,
//! repair or change a checkpoint, in a local directory or in S3.
//!
//! It features:
//!
//! - `spate demo [--checkpoint LOCATION] [--wal-dir DIR] [--rate N] [--seconds S]`: the word-count
//!   job without a broker, on spate-runtime's demo pipeline (the generator
//!   receiver with its write-ahead log, 1 s batches, 30 s windows sliding
//!   every 2 s, top words per window, one progress line a batch, exactly-once
//!   output files). Stopped and started again, it resumes from its
//!   checkpoint and says which batch it re-ran;
//! - `spate run --kafka BROKERS --topic T --output-topic T2 [--exactly-once]`:
//!   the same word count on a Kafka topic (spate-kafka's direct stream),
//!   each window's top words written to a topic, in a Kafka transaction with
//!   the batch's consumed offsets when `--exactly-once` is given;
//! - `spate checkpoint inspect LOCATION [--json]`: logs, verdict, last offsets,
//!   lock holder and sizes, also of a Spark Structured Streaming checkpoint;
//!   on an application's location (`spate run --app`), a row per task and
//!   the members that hold or last held them;
//! - `spate checkpoint repair LOCATION [--apply]`: the repair plan, applied under
//!   the writer lock, moving files to `_quarantine/` and deleting nothing;
//! - `spate checkpoint set-offsets LOCATION --source S --json J [--commit]`: a new
//!   offsets entry for the next batch, never an edit of an old one. Both
//!   refuse an application's location (exit code 2), naming a task's
//!   checkpoint to give instead.
//!
//! `spate demo` and `spate run` serve Prometheus metrics with
//! `--metrics-addr HOST:PORT` (`/metrics`) and the job's web page with
//! `--ui HOST:PORT` (`/`), each off unless given; the URLs are printed on
//! stderr at start.
//!
//! A checkpoint LOCATION is a directory or `s3://bucket/prefix`; the
//! `--s3-endpoint`, `--s3-region`, `--s3-access-key-id`,
//! `--s3-secret-access-key-file` and `--s3-allow-http` flags of each command
//! say how to reach S3, and each one left out comes from its AWS environment
//! variable. The demo's receiver logs stay on a local disk (`--wal-dir`,
//! required with `s3://`).
//!
//! Errors are printed as one sentence and their causes
//! (`Error: …` then `  caused by: …` lines). Exit codes:
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | ok (a job stopped by Ctrl-C or SIGTERM stopped gracefully) |
//! | 1    | runtime error |
//! | 2    | usage error |
//! | 3    | checkpoint inconsistent, or a change refused to keep it consistent |
//! | 4    | the checkpoint is locked by another live writer, or was taken over by one while this one ran |
//! | 130  | stopped at once by a second signal |
//!
//! The first SIGINT or SIGTERM stops a job gracefully (the batch in flight
//! finishes and commits, the lock is released); a second one stops it at once.
//!
//! It is not a library for building pipelines: use `spate-runtime` for that.
//! This crate's library target exists so the command can be tested in-process.
//!
//! ```
//! let dir = tempfile::tempdir()?;
//! let args = ["spate", "checkpoint", "inspect", dir.path().to_str().ok_or("path")?];
//! let outcome = spate_cli::run_command(args);
//! assert_eq!(outcome.code, 0);
//! assert!(outcome.stdout.contains("Verdict: start fresh"), "{}", outcome.stdout);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

#[cfg(feature = "kafka")]
mod app;
mod args;
mod demo;
mod error;
mod inspect;
mod job;
#[cfg(feature = "kafka")]
mod kafka;
mod location;
mod logging;
mod repair;
mod set_offsets;
mod settings;
mod signals;

use std::ffi::OsString;

use clap::Parser;

pub use args::{CheckpointCommand, Cli, Command, DemoArgs, RunArgs, S3Args, WatchArgs};
pub use error::{CliError, ExitCode, render_error};

/// What a command printed and how it ended (for commands that finish on their own).
#[derive(Debug)]
pub struct Outcome {
    /// The exit code.
    pub code: i32,
    /// What goes to stdout.
    pub stdout: String,
    /// What goes to stderr.
    pub stderr: String,
}

/// Parses `args` (the first is the program name) and runs the command,
/// collecting its output. Jobs (`demo`, `run`) print their progress as they go.
pub fn run_command<I, T>(args: I) -> Outcome
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" to clap, with exit code 0 and stdout text.
            let text = e.render().to_string();
            let code = e.exit_code();
            return if code == 0 {
                Outcome { code, stdout: text, stderr: String::new() }
            } else {
                Outcome { code: ExitCode::Usage.code(), stdout: String::new(), stderr: text }
            };
        }
    };
    logging::init(cli.verbose);
    match dispatch(cli.command) {
        Ok(stdout) => Outcome { code: ExitCode::Ok.code(), stdout, stderr: String::new() },
        Err(error) => Outcome { code: error.exit_code().code(), stdout: String::new(), stderr: render_error(&error) },
    }
}

fn dispatch(command: Command) -> Result<String, CliError> {
    match command {
        Command::Demo(demo) => demo::run(&demo),
        #[cfg(feature = "kafka")]
        Command::Run(run) => kafka::run(&run),
        #[cfg(not(feature = "kafka"))]
        Command::Run(_) => Err(CliError::usage(
            "this spate was built without Kafka: build spate-cli with the `kafka` feature (on by default) for `spate run`",
        )),
        Command::Checkpoint(CheckpointCommand::Inspect { dir, json, s3 }) => {
            inspect::run(&dir, &location::object_store_settings(&s3)?, json)
        }
        Command::Checkpoint(CheckpointCommand::Repair { dir, apply, s3 }) => {
            repair::run(&dir, &location::object_store_settings(&s3)?, apply)
        }
        Command::Checkpoint(CheckpointCommand::SetOffsets { dir, source, json, commit, s3 }) => {
            let settings = location::object_store_settings(&s3)?;
            set_offsets::run(&set_offsets::SetOffsets {
                dir: &dir,
                settings: &settings,
                source: &source,
                json: &json,
                commit,
            })
        }
    }
}
