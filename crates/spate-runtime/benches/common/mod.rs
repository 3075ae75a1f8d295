//! What the memory benches share: sampling a child process's resident
//! memory and CPU time, reading the batches it committed from its
//! checkpoint's progress files, reporting a restarted child's recovery,
//! and printing a figure beside its bound.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration as StdDuration, Instant};

use spate_core::BatchId;
use spate_runtime::StreamingContext;

const SAMPLE_EVERY: StdDuration = StdDuration::from_millis(250);

/// Starts the line a child prints after it opened its checkpoint: the
/// milliseconds that took, then what the recovery did.
const RECOVERY_LINE: &str = "recovery_ms=";

/// Prints the recovery line of `ctx`, opened at `opening`; returns the
/// batch it resumes at.
pub(crate) fn print_recovery(ctx: &StreamingContext, opening: Instant) -> BatchId {
    let recovery_ms = opening.elapsed().as_secs_f64() * 1000.0;
    let report = ctx.recovery().expect("a checkpoint's recovery");
    println!(
        "{RECOVERY_LINE}{recovery_ms:.1} restored={} restore_ms={} replayed={} replay_ms={} resumed_at={}",
        report.restored_operators.len(),
        report.restore_ms,
        report.replayed_for_state.len(),
        report.replay_ms,
        report.resumed_at,
    );
    report.resumed_at
}

/// From a child's output: how long opening its checkpoint took (ms), and
/// what the recovery did.
pub(crate) fn recovery_of(stdout: &str) -> (f64, String) {
    let line = stdout.lines().find_map(|l| l.strip_prefix(RECOVERY_LINE)).expect("the child's recovery line");
    let (ms, report) = line.split_once(' ').unwrap_or((line, ""));
    (ms.parse().expect("milliseconds"), report.to_string())
}

/// Prints `BENCH <name> <value> <unit> bound=<bound> ratio=<value/bound>`.
pub(crate) fn figure(name: &str, value: f64, unit: &str, bound: f64) {
    println!("BENCH {name} {value:.1} {unit} bound={bound:.0} ratio={:.3}", value / bound);
}

/// A child's memory over its run.
pub(crate) struct Memory {
    /// Peak resident memory (`VmHWM`), MB.
    pub(crate) peak_mb: f64,
    /// Median resident memory (`VmRSS`) after the first second, MB.
    pub(crate) median_mb: f64,
    /// Resident memory every 2 s: (seconds since the start, MB).
    pub(crate) timeline: Vec<(f64, f64)>,
    /// CPU seconds (user and system) the child had used at the last sample.
    pub(crate) cpu_seconds: f64,
}

/// Runs this executable again with `env` set (the child runs the job),
/// samples its memory until it exits, and checks that it succeeded; its
/// memory and, when `stdout` is true, what it printed (a child that prints
/// much must not be asked: its pipe is read only at the end).
pub(crate) fn run_child(env: &[(&str, String)], stdout: bool) -> (Memory, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .envs(env.iter().map(|(key, value)| (*key, value.as_str())))
        .stdout(if stdout { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the job's process");
    let memory = sample_memory(&mut child);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the job failed: {}", String::from_utf8_lossy(&output.stderr));
    (memory, String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Samples the child's memory every 250 ms until it exits.
pub(crate) fn sample_memory(child: &mut Child) -> Memory {
    let (status, stat) = (format!("/proc/{}/status", child.id()), format!("/proc/{}/stat", child.id()));
    let started = Instant::now();
    let (mut samples, mut cpu_seconds) = (Vec::new(), 0.0f64);
    while child.try_wait().unwrap().is_none() {
        if let Ok(text) = std::fs::read_to_string(&status) {
            samples.push((started.elapsed().as_secs_f64(), field_mb(&text, "VmRSS:"), field_mb(&text, "VmHWM:")));
        }
        if let Ok(text) = std::fs::read_to_string(&stat) {
            cpu_seconds = cpu_seconds_of(&text).max(cpu_seconds);
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    let (mut rss, mut peak, mut timeline) = (Vec::new(), 0.0f64, Vec::new());
    for &(at, sampled_rss, hwm) in &samples {
        peak = peak.max(hwm);
        // The first second is the process starting, not the job.
        if at > 1.0 {
            rss.push(sampled_rss);
        }
        if timeline.last().is_none_or(|(last, _)| at - last >= 2.0) {
            timeline.push((at, sampled_rss));
        }
    }
    rss.sort_by(f64::total_cmp);
    Memory { peak_mb: peak, median_mb: rss.get(rss.len() / 2).copied().unwrap_or(0.0), timeline, cpu_seconds }
}

/// User and system CPU seconds of a `/proc/<pid>/stat` line.
fn cpu_seconds_of(stat: &str) -> f64 {
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
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

/// What the progress file says of one committed batch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Committed {
    pub(crate) batch: u64,
    pub(crate) records: u64,
    pub(crate) processing_ms: u64,
    /// When it was done, ms since the epoch: its time, then its wait for
    /// the batches before it, then its processing.
    pub(crate) done_ms: u64,
}

/// Each committed batch, in batch order, from the progress files (a line
/// still being written is left out).
pub(crate) fn committed_records(checkpoint: &Path) -> Vec<Committed> {
    let mut batches = Vec::new();
    let Ok(entries) = std::fs::read_dir(checkpoint.join("progress")) else { return Vec::new() };
    for entry in entries {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let field = |name: &str| value[name].as_u64().unwrap_or(0);
            batches.push(Committed {
                batch: field("batch_id"),
                records: field("input_records"),
                processing_ms: field("processing_time_ms"),
                done_ms: field("batch_time") + field("scheduling_delay_ms") + field("processing_time_ms"),
            });
        }
    }
    batches.sort_unstable();
    batches
}

/// Processing times of `batches`: mean, median and 90th percentile, ms.
pub(crate) fn processing_ms(batches: &[Committed]) -> (f64, f64, f64) {
    let mut processing: Vec<u64> = batches.iter().map(|b| b.processing_ms).collect();
    processing.sort_unstable();
    let percentile = |p: f64| {
        processing
            .get(((processing.len() as f64 * p) as usize).min(processing.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
    };
    let mean = processing.iter().sum::<u64>() as f64 / processing.len().max(1) as f64;
    (mean, percentile(0.5), percentile(0.9))
}

/// Records of `batches` a second of wall-clock time, from when the batch
/// before them was done to when the last was: below the source's rate
/// when batches wait for the ones before them.
pub(crate) fn records_per_wall_second(before: &Committed, batches: &[Committed]) -> f64 {
    let records: u64 = batches.iter().map(|b| b.records).sum();
    let span_ms = batches.last().map_or(0, |last| last.done_ms.saturating_sub(before.done_ms));
    records as f64 * 1000.0 / span_ms.max(1) as f64
}
