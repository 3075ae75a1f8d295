//! Lines of text from a TCP socket, with the receiver write-ahead log on,
//! counted into running word totals that survive a restart.
//!
//! What it shows:
//!
//! - a receiver input ([`PipelineBuilder::receiver_stream`]) fed by spate's
//!   [`SocketTextReceiver`] (Spark's `socketTextStream`): each line is one
//!   record;
//! - the receiver write-ahead log: every block of lines is written to
//!   `<checkpoint>/receivedData/<stream>/` before it is acknowledged, so a
//!   crash loses nothing the job received (a plain socket cannot replay what
//!   it sent; the log can);
//! - word counts per batch, and running totals per word with
//!   `update_state_by_key`, a named stateful operator: run the example twice
//!   with the same `--checkpoint` and the totals continue (state restored from
//!   its snapshot, and the batches after it recomputed from the logs).
//!
//! The example starts a small line server of its own on 127.0.0.1 that
//! sends generated lines, so it runs standalone:
//!
//! ```sh
//! cargo run --example socket_wal -- --seconds 10
//! cargo run --example socket_wal -- --seconds 10      # again: the totals continue
//! ```
//!
//! To type the lines yourself, start a server (`nc -lk 9999`) and pass
//! `--connect 127.0.0.1:9999`.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration as StdDuration, Instant};

use clap::Parser;
use spate::core::Duration;
use spate::receiver::{SocketSettings, SocketTextReceiver};
use spate::runtime::{PipelineBuilder, ReceiverSettings, StreamingContext, StreamingSettings};

use common::{Error, run_until};

/// Word totals over lines read from a socket, with the receiver write-ahead log on.
#[derive(Clone, Debug, Parser)]
struct Args {
    /// The checkpoint directory (the write-ahead log lives under it).
    #[arg(long, default_value = "socket-wal-checkpoint")]
    checkpoint: PathBuf,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Read from this `host:port` instead of the built-in line server.
    #[arg(long)]
    connect: Option<String>,
    /// Lines the built-in server sends per second.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// The built-in server sends this many lines, then stays connected;
    /// the example stops once all of them were processed.
    #[arg(long)]
    lines: Option<u64>,
    /// The first line the built-in server sends (lines are numbered, so a
    /// second run can continue the sequence).
    #[arg(long, default_value_t = 0)]
    first_line: u64,
    /// The batch interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    batch_ms: u64,
    /// Print nothing per batch.
    #[arg(long)]
    quiet: bool,
}

const WORDS: [&str; 12] =
    ["spate", "stream", "batch", "window", "state", "offset", "commit", "log", "kafka", "socket", "word", "count"];

/// Line `i` of the built-in server: three words, picked by `i`.
fn line(i: u64) -> String {
    let word = |k: u64| WORDS[(k % WORDS.len() as u64) as usize];
    format!("{} {} {}", word(i), word(i / 3 + 1), word(i * 7 + 5))
}

/// Starts the built-in line server on a free port of 127.0.0.1: it sends
/// lines `first..first + count` (or without end) at `rate` a second to the
/// first client, then keeps the connection open until the client closes it.
fn start_line_server(first: u64, count: Option<u64>, rate: u64) -> Result<String, Error> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?.to_string();
    std::thread::Builder::new().name("line-server".into()).spawn(move || {
        let Ok((stream, _)) = listener.accept() else { return };
        if let Err(e) = serve(stream, first, count, rate) {
            eprintln!("line server: {e}");
        }
    })?;
    Ok(address)
}

fn serve(mut stream: TcpStream, first: u64, count: Option<u64>, rate: u64) -> std::io::Result<()> {
    let started = Instant::now();
    let last = count.map_or(u64::MAX, |n| first + n);
    let mut i = first;
    while i < last {
        // Ten chunks a second at the configured rate.
        let due = (started.elapsed().as_millis() as u64).saturating_mul(rate.max(1)) / 1000 + rate.max(10) / 10;
        let mut chunk = String::new();
        while i < last && i - first < due {
            chunk.push_str(&line(i));
            chunk.push('\n');
            i += 1;
        }
        stream.write_all(chunk.as_bytes())?;
        if i < last {
            std::thread::sleep(StdDuration::from_millis(100));
        }
    }
    stream.flush()?;
    // Stay connected: a closed connection makes the receiver reconnect.
    let mut sink = [0u8; 1024];
    while stream.read(&mut sink)? > 0 {}
    Ok(())
}

/// What a run did.
#[derive(Debug, Default)]
struct Summary {
    lines: u64,
    batches: u64,
    totals: BTreeMap<String, u64>,
    recovery: String,
    finished_early: bool,
}

/// The words of a line, lower-cased.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_lowercase).collect()
}

fn declare(
    p: &mut PipelineBuilder,
    address: String,
    batch: Duration,
    totals: Arc<Mutex<BTreeMap<String, u64>>>,
    quiet: bool,
) {
    let options = ReceiverSettings {
        // On by default; said here because it is the point of this example.
        write_ahead_log: true,
        block_interval: Duration::from_millis(batch.as_millis().clamp(50, 200)),
        ..ReceiverSettings::default()
    };
    let lines =
        p.receiver_stream("lines", options, move |_resume| SocketTextReceiver::new(SocketSettings::new(address)));
    let per_batch = lines.flat_map(|l: String| words(&l)).map(|w| (w, 1u64)).reduce_by_key(|a, b| a + b);
    per_batch
        .update_state_by_key(|counts: Vec<u64>, total: Option<u64>| {
            Some(total.unwrap_or(0) + counts.iter().sum::<u64>())
        })
        .name("totals")
        .foreach_batch(move |batch, info| {
            let mut all = totals.lock().unwrap_or_else(PoisonError::into_inner);
            *all = batch.iter().cloned().collect();
            if !quiet {
                let mut top: Vec<(&String, &u64)> = all.iter().collect();
                top.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
                let top: Vec<String> = top.iter().take(4).map(|(w, n)| format!("{w} {n}")).collect();
                println!("batch {}: totals {}", info.batch_id, top.join(", "));
            }
            Ok(())
        })
        .name("print-totals");
}

/// Bytes of receiver write-ahead log segments under `checkpoint`.
fn wal_bytes(checkpoint: &Path) -> u64 {
    fn walk(dir: &Path) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
        entries
            .filter_map(Result::ok)
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path()),
                _ if e.file_name().to_string_lossy().starts_with("log-") => e.metadata().map_or(0, |m| m.len()),
                _ => 0,
            })
            .sum()
    }
    walk(&checkpoint.join("receivedData"))
}

/// Runs the example and says what it did.
fn run(args: &Args) -> Result<Summary, Error> {
    let address = match &args.connect {
        Some(address) => address.clone(),
        None => start_line_server(args.first_line, args.lines, args.rate)?,
    };
    println!("reading lines from {address}");
    let batch = Duration::from_millis(args.batch_ms);
    let totals = Arc::new(Mutex::new(BTreeMap::new()));
    let (shared, quiet) = (Arc::clone(&totals), args.quiet);
    let ctx = StreamingContext::get_or_create(&args.checkpoint, StreamingSettings::new(batch), move |p| {
        declare(p, address, batch, shared, quiet);
        Ok(())
    })?;
    let recovery = ctx.recovery().map(ToString::to_string).unwrap_or_default();
    let mut lines = 0;
    let outcome = run_until(ctx, args.seconds, |progress| {
        lines += progress.input_records;
        args.lines.is_some_and(|n| lines >= n)
    })?;
    let totals = std::mem::take(&mut *totals.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(Summary { lines, batches: outcome.batches, totals, recovery, finished_early: outcome.done })
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(s) => {
            let words: u64 = s.totals.values().sum();
            let end = if s.finished_early { "every line sent was processed" } else { "time is up" };
            println!("{}; stopped: {end}", s.recovery);
            println!(
                "processed {} lines in {} batches; {} words counted in total over every run; receiver WAL: {} \
                 bytes in {}",
                s.lines,
                s.batches,
                words,
                wal_bytes(&args.checkpoint),
                args.checkpoint.join("receivedData").display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("socket_wal: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn expected(lines: std::ops::Range<u64>) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for i in lines {
            for word in words(&line(i)) {
                *counts.entry(word).or_default() += 1;
            }
        }
        counts
    }

    /// Two runs on one checkpoint: each reads its lines through the
    /// receiver write-ahead log, and the second run's totals continue the
    /// first's, so they count every line sent exactly once.
    #[test]
    fn the_totals_count_every_line_once_across_a_restart() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let run_with = |first_line, lines| Args {
            checkpoint: dir.path().join("checkpoint"),
            seconds: 120,
            connect: None,
            rate: 2000,
            lines: Some(lines),
            first_line,
            batch_ms: 200,
            quiet: true,
        };
        let first = run(&run_with(0, 300)).unwrap();
        assert!(first.finished_early, "the 300 lines were not processed within 120 s: {first:?}");
        assert_eq!(first.lines, 300);
        assert_eq!(first.totals, expected(0..300));
        assert!(first.recovery.starts_with("started"), "{}", first.recovery);
        assert!(wal_bytes(&dir.path().join("checkpoint")) > 0, "nothing was written to the receiver WAL");

        let second = run(&run_with(300, 200)).unwrap();
        assert!(second.finished_early, "the 200 lines were not processed within 120 s: {second:?}");
        assert!(second.recovery.starts_with("resumed"), "{}", second.recovery);
        assert_eq!(second.lines, 200);
        assert_eq!(second.totals, expected(0..500));
    }

    #[test]
    fn lines_are_three_known_words() {
        for i in 0..50 {
            let words = words(&line(i));
            assert_eq!(words.len(), 3);
            assert!(words.iter().all(|w| WORDS.contains(&w.as_str())));
        }
    }
}
