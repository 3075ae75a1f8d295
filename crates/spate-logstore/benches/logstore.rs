//! `MetadataLog::add` latency against the same steps done by hand, and
//! `inspect` on a long log.
//!
//! The logs live under `$SPATE_BENCH_DIR`, else `/var/tmp` (a real disk on
//! most machines, where `/tmp` may be tmpfs and fsync free).
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `logstore_add_p50_latency`: median latency of adding one offsets entry
//!   through a writer's checkpoint (epoch check, exists check, encode, temp
//!   file, fsync, link, unlink, directory fsync);
//!   bound: the raw steps by hand on the same file system, in the same run
//!   (create temp, write, fsync, rename, directory fsync). Target ratio <= 1.3.
//! - `logstore_inspect_10000_batches`: median time of `inspect` on a
//!   checkpoint of 10,000 offsets and 10,000 commits; bound: 20 ms.
//!
//! Run without `--bench` (as `cargo test --all-targets` does) the log is
//! shrunk to 100 batches and few samples are taken.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use spate_core::{BatchId, Time};
use spate_logstore::{
    Checkpoint, CheckpointSettings, CommitMetadata, OffsetSeq, SourceOffset, Verdict, encode_entry, inspect,
};

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SPATE_BENCH_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("spate-logstore-bench").tempdir_in(base).unwrap()
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn print_bench(name: &str, value: f64, unit: &str, bound: f64, ratio: f64) {
    println!("BENCH {name} {value:.3} {unit} bound={bound:.3} ratio={ratio:.3}");
}

fn entry(id: u64) -> OffsetSeq {
    OffsetSeq {
        batch_watermark: Time::from_millis(id as i64 * 1000),
        batch_timestamp: Time::from_millis(1_700_000_000_000 + id as i64 * 1000),
        conf: [("spate.state.partitions".to_string(), "8".to_string())].into(),
        sources: vec![
            SourceOffset::new("kafka-in", Some(json!({"events": {"0": id * 1000, "1": id * 998, "2": id * 1003}}))),
            SourceOffset::new("socket", None),
        ],
    }
}

/// The raw protocol by hand: temp file, write, fsync, rename, directory fsync.
fn raw_atomic_write(dir: &Path, name: &str, bytes: &[u8]) {
    let temp = dir.join(format!(".{name}.tmp"));
    let mut file = OpenOptions::new().write(true).create_new(true).open(&temp).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
    drop(file);
    std::fs::rename(&temp, dir.join(name)).unwrap();
    File::open(dir).unwrap().sync_all().unwrap();
}

/// `add` against the raw steps, interleaved so both see the same disk.
fn add_latency(c: &mut Criterion) {
    let root = bench_dir();
    let raw_dir = root.path().join("raw");
    std::fs::create_dir(&raw_dir).unwrap();
    // Through a writer's checkpoint, as the runtime adds: the epoch check is part of the cost.
    let checkpoint = Checkpoint::open_for_write(root.path().join("ck"), CheckpointSettings::new()).unwrap();
    let log = checkpoint.offsets();
    let mut next_raw = 0u64;
    let mut next_add = 0u64;

    let mut group = c.benchmark_group("metadata_log_add");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function("raw_temp_fsync_rename_dirfsync", |b| {
        b.iter(|| {
            let bytes = encode_entry(&entry(next_raw)).unwrap();
            raw_atomic_write(&raw_dir, &next_raw.to_string(), &bytes);
            next_raw += 1;
        })
    });
    group.bench_function("offset_log_add", |b| {
        b.iter(|| {
            assert!(log.add(BatchId(next_add), &entry(next_add)).unwrap());
            next_add += 1;
        })
    });
    group.finish();

    // The figures: interleaved pairs, medians.
    let rounds = if bench_mode() { 300 } else { 5 };
    let (mut raw_samples, mut add_samples) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        let bytes = encode_entry(&entry(next_raw)).unwrap();
        raw_atomic_write(&raw_dir, &next_raw.to_string(), &bytes);
        raw_samples.push(start.elapsed());
        next_raw += 1;

        let start = Instant::now();
        assert!(log.add(BatchId(next_add), &entry(next_add)).unwrap());
        add_samples.push(start.elapsed());
        next_add += 1;
    }
    let raw = median(&mut raw_samples).as_secs_f64() * 1e3;
    let add = median(&mut add_samples).as_secs_f64() * 1e3;
    println!("raw temp+fsync+rename+dirfsync p50: {raw:.3} ms; OffsetLog::add p50: {add:.3} ms (target ratio <= 1.3)");
    print_bench("logstore_add_p50_latency", add, "ms", raw, add / raw);
}

/// A checkpoint of `batches` offsets and commits, written without fsync
/// (this is set-up, not the thing measured).
fn long_checkpoint(dir: &Path, batches: u64) {
    for sub in ["offsets", "commits"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    for id in 0..batches {
        std::fs::write(dir.join(format!("offsets/{id}")), encode_entry(&entry(id)).unwrap()).unwrap();
        std::fs::write(dir.join(format!("commits/{id}")), encode_entry(&CommitMetadata::default()).unwrap()).unwrap();
    }
}

fn inspect_long_log(c: &mut Criterion) {
    let batches = if bench_mode() { 10_000 } else { 100 };
    let root = bench_dir();
    long_checkpoint(root.path(), batches);
    let expected = BatchId(batches);
    let check = |verdict: Verdict| assert!(matches!(verdict, Verdict::Resume { next, .. } if next == expected));

    let mut group = c.benchmark_group("inspect");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function(format!("{batches}_batches"), |b| b.iter(|| check(inspect(root.path()).unwrap())));
    group.finish();

    let rounds = if bench_mode() { 50 } else { 3 };
    let mut samples: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            check(inspect(root.path()).unwrap());
            start.elapsed()
        })
        .collect();
    let ms = median(&mut samples).as_secs_f64() * 1e3;
    print_bench(&format!("logstore_inspect_{batches}_batches"), ms, "ms", 20.0, ms / 20.0);
}

criterion_group!(benches, add_latency, inspect_long_log);
criterion_main!(benches);
