//! `spate demo` as a user runs it (write-ahead log on, 30 s / 2 s window,
//! the default `--max-memory`, words by Zipf's law of exponent 1), asked
//! for 20 million words a second: the resident memory of the process with
//! 1 s batches at 32, 10,000 (the demo's default) and 1,000,000 distinct
//! words, with 100 ms and 10 s batches at 10,000, and the time from a
//! batch's end to its commit with 1 s batches at 10 million words a second
//! and 10,000 words. The window holds one key a distinct word, so the key
//! count, as much as the rate, sets the memory.
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`,
//! each name ending in its key count (`_keys_<N>`):
//! - `demo_rss_peak_<interval>` and `demo_rss_median_<interval>`: the
//!   process's peak (`VmHWM`) and median resident memory (`VmRSS`, sampled
//!   every 100 ms); bound: the target, 200 MB. Beside each: the words a
//!   second the run sustained (backpressure and the memory budget hold a
//!   source back that the engine cannot keep up with) and the figure the
//!   issue quoted before this benchmark existed.
//! - `demo_batch_end_to_commit_p50_1s` and `..._max_1s`: from a batch's end
//!   (its time) to its commit (scheduling delay plus processing time, from
//!   the progress files), batches after the first five seconds; bound: 50 ms.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) one short run
//! at 100 ms batches and a low rate checks that the measuring works and
//! prints no figure.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TARGET_RSS_MB: f64 = 200.0;
const TARGET_END_TO_COMMIT_MS: f64 = 50.0;

/// The demo's default key count.
const DEFAULT_KEYS: u64 = 10_000;

/// The memory runs: (interval ms, distinct words, what the issue measured
/// before, with the demo's 32 words).
const RSS_RUNS: &[(u64, u64, &str)] = &[
    (1_000, 32, "at 10 M/s median 180 MB, max 340 MB; 20 M/s would need about 700 MB"),
    (1_000, DEFAULT_KEYS, "not measured"),
    (1_000, 1_000_000, "not measured"),
    (100, DEFAULT_KEYS, "the demo benchmark stayed under 200 MB only at 100 ms batches, 32 words"),
    (10_000, DEFAULT_KEYS, "ten times the 1 s figure, 32 words"),
];

struct Run {
    peak_mb: f64,
    median_mb: f64,
    words_per_sec: f64,
    /// Batch end to commit, ms, of the batches after the warm-up.
    end_to_commit_ms: Vec<u64>,
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    if !bench {
        // No warm-up to skip: a short run in a debug build only shows that
        // the figures are measured.
        let run = demo(100, 1_000_000, 3, 0, DEFAULT_KEYS);
        assert!(run.peak_mb > 0.0 && run.median_mb > 0.0, "no memory sampled");
        assert!(run.words_per_sec > 0.0, "the demo committed no words");
        println!("demo_memory: measuring works (run with --bench for the figures)");
        return;
    }
    println!(
        "demo_memory: `spate demo --rate 20000000 --keys N` (Zipf 1), WAL on, default --max-memory; each run a new \
         checkpoint"
    );
    for &(interval, keys, quoted) in RSS_RUNS {
        let seconds = (interval * 6 / 1000).max(20);
        let run = demo(interval, 20_000_000, seconds, WARM_UP_MS, keys);
        let name = format!("{}_keys_{keys}", label(interval));
        println!(
            "demo_memory: {} batches, {keys} keys, {seconds} s: {:.1} M words/s sustained, RSS peak {:.1} MB, median \
             {:.1} MB (issue: {quoted})",
            label(interval),
            run.words_per_sec / 1e6,
            run.peak_mb,
            run.median_mb
        );
        figure(&format!("demo_rss_peak_{name}"), run.peak_mb, "MB", TARGET_RSS_MB);
        figure(&format!("demo_rss_median_{name}"), run.median_mb, "MB", TARGET_RSS_MB);
    }
    let run = demo(1_000, 10_000_000, 30, WARM_UP_MS, DEFAULT_KEYS);
    let mut latencies = run.end_to_commit_ms.clone();
    latencies.sort_unstable();
    let median = latencies.get(latencies.len() / 2).copied().unwrap_or(0) as f64;
    let max = latencies.last().copied().unwrap_or(0) as f64;
    println!(
        "demo_memory: 1 s batches, {DEFAULT_KEYS} keys, at 10 M words/s requested ({:.1} M sustained): batch end to commit p50 {median} ms, \
         max {max} ms over {} batches (issue: each batch's latency is the interval plus all of its processing)",
        run.words_per_sec / 1e6,
        latencies.len()
    );
    figure(&format!("demo_batch_end_to_commit_p50_1s_keys_{DEFAULT_KEYS}"), median, "ms", TARGET_END_TO_COMMIT_MS);
    figure(&format!("demo_batch_end_to_commit_max_1s_keys_{DEFAULT_KEYS}"), max, "ms", TARGET_END_TO_COMMIT_MS);
}

fn label(interval_ms: u64) -> String {
    if interval_ms < 1000 { format!("{interval_ms}ms") } else { format!("{}s", interval_ms / 1000) }
}

fn figure(name: &str, value: f64, unit: &str, bound: f64) {
    println!("BENCH {name} {value:.1} {unit} bound={bound:.0} ratio={:.3}", value / bound);
}

/// The first five seconds (at least one batch) start the receiver and
/// ramp the rate up: not counted.
const WARM_UP_MS: u64 = 5_000;

/// Runs the demo for `seconds` at `rate` words a second over `keys`
/// distinct words and `interval_ms` batches; the figures leave out the
/// batches of the first `warm_up_ms`.
fn demo(interval_ms: u64, rate: u64, seconds: u64, warm_up_ms: u64, keys: u64) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("checkpoint");
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
        .arg("demo")
        .arg("--checkpoint")
        .arg(&checkpoint)
        .args(["--rate", &rate.to_string(), "--batch-ms", &interval_ms.to_string()])
        .args(["--seconds", &seconds.to_string(), "--keys", &keys.to_string(), "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start spate demo");
    let (peak_mb, median_mb) = sample_memory(&mut child);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "spate demo failed: {}", String::from_utf8_lossy(&output.stderr));
    let batches = progress(&checkpoint);
    let warm_up = warm_up_ms.div_ceil(interval_ms) as usize;
    // The last batch is the graceful stop's, cut short: not a whole interval.
    let measured = batches.len().saturating_sub(1);
    let steady: Vec<&(u64, u64)> = batches.iter().take(measured).skip(warm_up).collect();
    let words: u64 = steady.iter().map(|(records, _)| records).sum();
    let span = steady.len() as f64 * interval_ms as f64 / 1000.0;
    Run {
        peak_mb,
        median_mb,
        words_per_sec: if span > 0.0 { words as f64 / span } else { 0.0 },
        end_to_commit_ms: steady.iter().map(|(_, latency)| *latency).collect(),
    }
}

/// Samples the child's memory every 100 ms until it exits: (peak, median), MB.
fn sample_memory(child: &mut Child) -> (f64, f64) {
    let status = format!("/proc/{}/status", child.id());
    let (mut peak, mut samples) = (0.0f64, Vec::new());
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if let Ok(text) = std::fs::read_to_string(&status) {
            peak = peak.max(field_mb(&text, "VmHWM:"));
            // The first second is the process starting, not the pipeline.
            if started.elapsed() > Duration::from_secs(1) {
                samples.push(field_mb(&text, "VmRSS:"));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    samples.sort_by(f64::total_cmp);
    (peak, samples.get(samples.len() / 2).copied().unwrap_or(0.0))
}

fn field_mb(status: &str, field: &str) -> f64 {
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Each committed batch's records and its end-to-commit time (scheduling
/// delay plus processing), in batch order, from the checkpoint's progress files.
fn progress(checkpoint: &Path) -> Vec<(u64, u64)> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(checkpoint.join("progress")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            let field = |name: &str| value[name].as_u64().unwrap_or(0);
            lines.push((
                field("batch_id"),
                field("input_records"),
                field("scheduling_delay_ms") + field("processing_time_ms"),
            ));
        }
    }
    lines.sort_unstable();
    lines.into_iter().map(|(_, records, latency)| (records, latency)).collect()
}
