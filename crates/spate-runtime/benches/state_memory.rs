//! Keyed state larger than the memory budget: sessions over 10,000,000
//! keys with `map_with_state`, with the default budget (its state moves to
//! disk) and with a budget it never reaches (all in memory); and running
//! totals over 10,000,000 keys with `update_state_by_key` at the default
//! budget (`update_state_10m_keys_default_budget`).
//!
//! The job: a replayable source of 100,000 records a 1 s batch; record
//! `n` is the key `u{k}`, `k` = `n` × 7,919,993 mod 10,000,000 (a
//! permutation, so the first 100 batches bring every key once, in scattered
//! order, and later batches visit them again), with the value `n`;
//! `map_with_state` keeps per key the count and sum of its values with a
//! 30 min idle timeout (no key is idle that long in a run, so all
//! 10,000,000 stay) and maps each record to its key's count; an output
//! counts the mapped records. The default checkpoint interval (10 s) with
//! incremental snapshots. It runs in a child process (this executable
//! started again) for 130 batches, so the resident memory sampled is the
//! job's alone. The on-disk shape then restarts from its checkpoint in a
//! new process (the whole snapshot of 10,000,000 keys and the changes
//! after it restored) and runs 5 batches more.
//!
//! The `update_state_by_key` job: the same keys, 400,000 records a batch
//! (25 batches bring every key once), each key's count and sum of its
//! values kept, and a `top_n` of the ten keys with the most records its
//! only reader, so the operator lists those alone. It calls its function
//! on every key every batch (Spark's semantics): each batch reads the whole
//! state, and its processing time grows with the keys, not the batch. Its
//! snapshots list what changed, whole every tenth. 30 batches, then 2 more
//! after a restart.
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `<shape>_rss_peak` and `_rss_median`: the child's peak (`VmHWM`) and
//!   median resident memory; bound: 300 MB, the process target of the
//!   million-key issue (the budget, 256 MiB, is what the engine holds its
//!   buffers and state to; the code, RocksDB's caches and the allocator's
//!   slack come on top);
//! - `<shape>_records_per_sec`: records committed a second over the
//!   batches after the first 5; bound: the source's rate, its records a
//!   batch a second (a ratio below 1 is a job falling behind);
//! - `<shape>_processing_ms_mean` and `_p90`: bound: the 1 s batch interval;
//! - `<shape>_revisits_records_per_sec`, `_revisits_processing_ms_mean`
//!   and `_p90`: the same over the batches after the first 100 (the
//!   first 25 for the `update_state_by_key` job), where
//!   every key the batch brings has state already (a job's steady state,
//!   where the first 100 batches mostly add keys);
//! - `<shape>_restart_rss_peak`: the restarted process's peak resident
//!   memory, its restore included; bound: 300 MB.
//!
//! With the restart it prints how long opening the checkpoint took, and
//! of that the restore (ten million keys: the whole snapshot and the
//! changes after it) and the recomputing of the batches after the last
//! snapshot: no target, the time a restart at this key count costs.
//!
//! The checkpoint and the spill directory live under `$SPATE_BENCH_DIR`,
//! else `/var/tmp`: a disk, where `/tmp` may be memory. A run needs about
//! 2 GB free there.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) a short run
//! of 200,000 keys of each operator checks that the measuring works, that
//! the state went to disk, and prints no figure.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant};

use common::{
    committed_records, figure, print_recovery, processing_ms, records_per_wall_second, recovery_of, run_child,
};
use serde_json::json;
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{BatchLimits, BoxError, DStream, InputSource, State};
use spate_runtime::{StreamingContext, StreamingSettings};

/// Records a batch, as the source plans them.
const PER_BATCH: u64 = 100_000;
/// Scatters record numbers over the keys: prime, so a permutation of any
/// key count that 2 and 5 alone divide.
const STRIDE: u64 = 7_919_993;
const TARGET_RSS_MB: f64 = 300.0;
/// Enough for every key to have come once (10,000,000 / `PER_BATCH`) and
/// for thirty more batches, which revisit keys.
const BATCHES: u64 = 130;
const WARM_UP_BATCHES: usize = 5;
/// How long a run may take before it is given up as stuck.
const GIVE_UP: StdDuration = StdDuration::from_secs(600);

/// The operator a job keeps its state with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Operator {
    /// `map_with_state` sessions: each record's key read and written.
    Sessions,
    /// `update_state_by_key` totals read by a `top_n` of 10: every key's
    /// function called each batch (Spark's semantics).
    Totals,
}

impl Operator {
    fn parse(name: &str) -> Self {
        match name {
            "Sessions" => Operator::Sessions,
            "Totals" => Operator::Totals,
            other => panic!("no operator {other}"),
        }
    }
}

/// A job's shape: its operator, keys, batch size and memory budget.
#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    operator: Operator,
    keys: u64,
    /// Records a batch, as the source plans them.
    per_batch: u64,
    max_memory_bytes: u64,
    batches: u64,
    /// Batches a restart from the checkpoint runs after the first run; 0: no restart.
    restart_batches: u64,
}

const ON_DISK: Shape = Shape {
    name: "state_10m_keys_default_budget",
    operator: Operator::Sessions,
    keys: 10_000_000,
    per_batch: PER_BATCH,
    max_memory_bytes: 256 << 20,
    batches: BATCHES,
    restart_batches: 5,
};
const IN_MEMORY: Shape = Shape {
    name: "state_10m_keys_in_memory",
    operator: Operator::Sessions,
    keys: 10_000_000,
    per_batch: PER_BATCH,
    max_memory_bytes: 64 << 30,
    batches: BATCHES,
    restart_batches: 0,
};
/// `update_state_by_key` over ten million keys with the default budget:
/// every batch calls the function on every key, so a batch reads the whole
/// state; 25 batches of 400,000 bring every key once.
const TOTALS_ON_DISK: Shape = Shape {
    name: "update_state_10m_keys_default_budget",
    operator: Operator::Totals,
    keys: 10_000_000,
    per_batch: 400_000,
    max_memory_bytes: 256 << 20,
    batches: 30,
    restart_batches: 2,
};
/// Snapshots every 10 s: 12 batches take one, and the restart restores it.
const CHECK: Shape = Shape {
    name: "check",
    operator: Operator::Sessions,
    keys: 200_000,
    per_batch: PER_BATCH,
    max_memory_bytes: 16 << 20,
    batches: 12,
    restart_batches: 2,
};
const CHECK_TOTALS: Shape = Shape { name: "check-totals", operator: Operator::Totals, ..CHECK };

/// Tells the child `<checkpoint dir>,<operator>,<records a batch>,<keys>,<max memory>,<batches>`.
const CHILD_ENV: &str = "SPATE_BENCH_STATE_MEMORY_CHILD";

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut fields = spec.rsplitn(6, ',');
        let mut next =
            || fields.next().expect("<checkpoint dir>,<operator>,<records a batch>,<keys>,<max memory>,<batches>");
        let (batches, max_memory_bytes, keys, per_batch): (u64, u64, u64, u64) =
            (next().parse().unwrap(), next().parse().unwrap(), next().parse().unwrap(), next().parse().unwrap());
        let operator = Operator::parse(next());
        let shape = Shape { name: "child", operator, keys, per_batch, max_memory_bytes, batches, restart_batches: 0 };
        run_job(Path::new(next()), shape);
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        for shape in [CHECK, CHECK_TOTALS] {
            let run = measure(shape);
            let name = shape.name;
            assert!(run.peak_mb > 0.0, "{name}: no memory sampled");
            assert!(run.committed >= shape.batches, "{name}: the job committed {} batches", run.committed);
            assert!(run.spilled, "{name}: the state did not go to disk");
            assert!(run.revisits.0 > 0.0, "{name}: no batch measured after every key came once");
            let restart = run.restart.expect("the check restarts");
            assert!(restart.peak_mb > 0.0, "{name}: no memory sampled after the restart");
            assert!(restart.committed > run.committed, "{name}: the restarted job committed no batch");
        }
        println!("state_memory: measuring works (run with --bench for the figures)");
        return;
    }
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for shape in [ON_DISK, IN_MEMORY, TOTALS_ON_DISK] {
        if only.as_deref().is_none_or(|o| shape.name.contains(o)) {
            bench_shape(shape);
        }
    }
}

fn bench_shape(shape: Shape) {
    let name = shape.name;
    let operator = match shape.operator {
        Operator::Sessions => "map_with_state sessions",
        Operator::Totals => "update_state_by_key totals read by a top_n of 10",
    };
    println!(
        "{name}: {operator}, {} keys (strings u0..), {} records a 1 s batch in scattered key order, max_memory {} \
         MiB, {} batches",
        shape.keys,
        shape.per_batch,
        shape.max_memory_bytes >> 20,
        shape.batches
    );
    let run = measure(shape);
    for (at, rss) in &run.timeline {
        println!("{name}: t={at:>5.1} s RSS {rss:.1} MB");
    }
    println!(
        "{name}: {:.0} records/s committed, processing {:.0} ms mean, {:.0} ms median, {:.0} ms p90, RSS peak {:.1} \
         MB, median {:.1} MB, state on disk: {}",
        run.records_per_sec,
        run.processing.0,
        run.processing.1,
        run.processing.2,
        run.peak_mb,
        run.median_mb,
        run.spilled,
    );
    figure(&format!("{name}_rss_peak"), run.peak_mb, "MB", TARGET_RSS_MB);
    figure(&format!("{name}_rss_median"), run.median_mb, "MB", TARGET_RSS_MB);
    figure(&format!("{name}_records_per_sec"), run.records_per_sec, "records/s", shape.per_batch as f64);
    figure(&format!("{name}_processing_ms_mean"), run.processing.0, "ms", 1000.0);
    figure(&format!("{name}_processing_ms_p90"), run.processing.2, "ms", 1000.0);
    let (rate, processing) = run.revisits;
    println!(
        "{name}: once every key has state, {rate:.0} records/s committed, processing {:.0} ms mean, {:.0} ms \
         median, {:.0} ms p90",
        processing.0, processing.1, processing.2
    );
    figure(&format!("{name}_revisits_records_per_sec"), rate, "records/s", shape.per_batch as f64);
    figure(&format!("{name}_revisits_processing_ms_mean"), processing.0, "ms", 1000.0);
    figure(&format!("{name}_revisits_processing_ms_p90"), processing.2, "ms", 1000.0);
    if let Some(restart) = &run.restart {
        for (at, rss) in &restart.timeline {
            println!("{name}: restarted, t={at:>5.1} s RSS {rss:.1} MB");
        }
        println!(
            "{name}: restarted from the checkpoint, {} more batches: opening it {:.0} ms ({}), RSS peak {:.1} MB, \
             median {:.1} MB",
            shape.restart_batches, restart.recovery_ms, restart.report, restart.peak_mb, restart.median_mb
        );
        figure(&format!("{name}_restart_rss_peak"), restart.peak_mb, "MB", TARGET_RSS_MB);
    }
}

struct Run {
    peak_mb: f64,
    median_mb: f64,
    timeline: Vec<(f64, f64)>,
    records_per_sec: f64,
    /// Mean, median and 90th percentile, ms.
    processing: (f64, f64, f64),
    /// Records a second and processing over the batches after every key
    /// came once.
    revisits: (f64, (f64, f64, f64)),
    committed: u64,
    /// The state was on disk when the job stopped.
    spilled: bool,
    /// The run restarted from the checkpoint, when the shape restarts.
    restart: Option<Restart>,
}

struct Restart {
    peak_mb: f64,
    median_mb: f64,
    timeline: Vec<(f64, f64)>,
    committed: u64,
    /// Opening the checkpoint, ms.
    recovery_ms: f64,
    /// What the recovery did.
    report: String,
}

fn measure(shape: Shape) -> Run {
    let base = std::env::var_os("SPATE_BENCH_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let dir = tempfile::tempdir_in(&base).unwrap();
    let checkpoint = dir.path().join("checkpoint");
    let (memory, stdout) = run_job_child(&checkpoint, shape, shape.batches);
    let batches = committed_records(&checkpoint);
    let measured = batches.len().saturating_sub(1);
    let first = WARM_UP_BATCHES.min(measured.saturating_sub(1)).max(1);
    let steady = batches.get(first..measured).unwrap_or_default();
    let first_revisit = usize::try_from(shape.keys / shape.per_batch).unwrap().clamp(first, measured.saturating_sub(1));
    let revisits = batches.get(first_revisit..measured).unwrap_or_default();
    let restart = (shape.restart_batches > 0).then(|| {
        let (memory, stdout) = run_job_child(&checkpoint, shape, shape.batches + shape.restart_batches);
        let (recovery_ms, report) = recovery_of(&stdout);
        Restart {
            peak_mb: memory.peak_mb,
            median_mb: memory.median_mb,
            timeline: memory.timeline,
            committed: committed_records(&checkpoint).len() as u64,
            recovery_ms,
            report,
        }
    });
    Run {
        peak_mb: memory.peak_mb,
        median_mb: memory.median_mb,
        timeline: memory.timeline,
        records_per_sec: batches.get(first - 1).map_or(0.0, |before| records_per_wall_second(before, steady)),
        processing: processing_ms(steady),
        revisits: (
            batches.get(first_revisit - 1).map_or(0.0, |before| records_per_wall_second(before, revisits)),
            processing_ms(revisits),
        ),
        committed: batches.len() as u64,
        spilled: stdout.contains("state on disk: true"),
        restart,
    }
}

/// Runs the job in a child process on `checkpoint` (restoring from it when
/// it holds one) until `batches` batches in all committed; its memory,
/// sampled, and what it printed.
fn run_job_child(checkpoint: &Path, shape: Shape, batches: u64) -> (common::Memory, String) {
    let spec = format!(
        "{},{:?},{},{},{},{batches}",
        checkpoint.display(),
        shape.operator,
        shape.per_batch,
        shape.keys,
        shape.max_memory_bytes
    );
    run_child(&[(CHILD_ENV, spec)], true)
}

/// Record numbers `from..until` of a batch, planned as an offset range.
#[derive(Debug)]
struct Sequence {
    position: Mutex<u64>,
    per_batch: u64,
}

fn range_of(planned: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(planned).unwrap();
    (v["from"].as_u64().unwrap(), v["until"].as_u64().unwrap())
}

impl InputSource<u64> for Sequence {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, _time: Time, _limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let mut position = self.position.lock().unwrap();
        let until = *position + self.per_batch;
        let planned = json!({"from": *position, "until": until}).to_string();
        *position = until;
        Ok(Some(planned))
    }

    fn compute(&self, _time: Time, planned: Option<&str>) -> Result<Vec<Vec<u64>>, BoxError> {
        let (from, until) = range_of(planned.ok_or("no plan")?);
        let middle = from + (until - from) / 2;
        Ok(vec![(from..middle).collect(), (middle..until).collect()])
    }
}

/// Each key's count and sum of its values with `map_with_state` and a
/// 30 min idle timeout, each record mapped to its key's count.
fn sessions(keyed: &DStream<(String, u64)>) {
    keyed
        .map_with_state(
            |_key: &String, value: Option<u64>, state: &mut State<(u64, u64)>| {
                let (count, sum) = state.get().copied().unwrap_or((0, 0));
                if let Some(value) = value {
                    state.update((count + 1, sum + value));
                }
                count + 1
            },
            Some(Duration::from_secs(30 * 60)),
        )
        .name("sessions")
        .mapped()
        .foreach_batch(|counts, _| {
            std::hint::black_box(counts.len());
            Ok(())
        })
        .name("session-counts");
}

/// Each key's count and sum of its values with `update_state_by_key`, the
/// ten keys with the most records listed each batch.
fn totals(keyed: &DStream<(String, u64)>) {
    let most = |a: &(String, (u64, u64)), b: &(String, (u64, u64))| a.1.0.cmp(&b.1.0).then_with(|| b.0.cmp(&a.0));
    keyed
        .update_state_by_key(|values: Vec<u64>, state: Option<(u64, u64)>| {
            let (count, sum) = state.unwrap_or((0, 0));
            Some((count + values.len() as u64, sum + values.iter().sum::<u64>()))
        })
        .name("totals")
        .top_n(10, most)
        .foreach_batch(|top, _| {
            std::hint::black_box(top.len());
            Ok(())
        })
        .name("top-totals");
}

/// The job, in this process, until `shape.batches` batches committed.
fn run_job(checkpoint: &Path, shape: Shape) {
    let keys = shape.keys;
    let spill_dir = checkpoint.with_file_name("spill");
    let settings = StreamingSettings::new(Duration::from_secs(1))
        .with_max_memory_bytes(shape.max_memory_bytes)
        .with_spill_dir(&spill_dir);
    let opening = Instant::now();
    let (operator, per_batch) = (shape.operator, shape.per_batch);
    let mut ctx = StreamingContext::get_or_create(checkpoint, settings, move |p| {
        let source = Arc::new(Sequence { position: Mutex::new(0), per_batch });
        let records = p.replayable_input("records", source, None, None);
        let keyed = records.map(move |n| (format!("u{}", n.wrapping_mul(STRIDE) % keys), n));
        match operator {
            Operator::Sessions => sessions(&keyed),
            Operator::Totals => totals(&keyed),
        }
        Ok(())
    })
    .unwrap();
    print_recovery(&ctx, opening);
    ctx.start().unwrap();
    assert!(ctx.await_committed(BatchId(shape.batches - 1), GIVE_UP), "{:?}", ctx.failure());
    let on_disk = std::fs::read_dir(&spill_dir)
        .map(|entries| {
            entries.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().starts_with("spate-state-"))
        })
        .unwrap_or(false);
    println!("state on disk: {on_disk}");
    ctx.stop_handle().stop_now();
    ctx.await_termination().unwrap();
}
