//! Write latency, group-commit throughput and read_all bandwidth of the
//! file write-ahead log, each against a bound measured in the same run on
//! the same file system.
//!
//! The log lives under `$SPATE_BENCH_DIR`, else `/var/tmp` (a real disk on
//! most machines, where `/tmp` may be tmpfs and `fdatasync` free).
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `wal_write_4k_p50_latency`: median latency of one writer writing 4 KiB
//!   records, sync every write; bound: raw `write` + `fdatasync` of 4 KiB
//!   appended to a file, the two alternated op by op (target ratio <= 1.2);
//! - `wal_group_commit_8_writers_1k`: records/s of 8 writers of 1 KiB records;
//!   bound: one writer (target ratio >= 5);
//! - `wal_group_commit_8_writers_1k_bandwidth`: the same in MB/s; bound: raw
//!   sequential write bandwidth, 1 MiB writes and one `fdatasync` (the target,
//!   a ratio of 0.7, no log can reach here: a sync every write, with eight
//!   writers, puts at most 8 KiB behind each `fdatasync`);
//! - `wal_group_commit_8_writers_1k_vs_synced_8k_appends`: the same MB/s;
//!   bound: raw appends of 8 KiB each followed by `fdatasync`, alternated
//!   with the log's rounds (what a perfect group commit of these writers
//!   could get from this disk);
//! - `wal_read_all`: GB/s of `read_all` over 1 GiB of 64 KiB records in the
//!   page cache; bound: raw sequential `read` of the same files (target >= 1 GB/s).
//!
//! Run without `--bench` (as `cargo test --all-targets` does) everything is
//! shrunk (1 GiB becomes 1 MiB) so the run takes moments.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spate_core::Time;
use spate_wal::{FileWriteAheadLog, SyncPolicy, WalSettings, WriteAheadLog};

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SPATE_BENCH_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("spate-wal-bench").tempdir_in(base).unwrap()
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn print_bench(name: &str, value: f64, unit: &str, bound: f64, ratio: f64) {
    println!("BENCH {name} {value:.3} {unit} bound={bound:.3} ratio={ratio:.3}");
}

/// Writes back what earlier benchmarks of the run left dirty (`sync(1)`),
/// so that their writeback does not slow the syncs measured next.
fn settle_disk() {
    let _ = std::process::Command::new("sync").status();
}

fn append_file(path: &Path) -> File {
    OpenOptions::new().create(true).append(true).open(path).unwrap()
}

/// One writer, 4 KiB records, sync every write, against raw write + fdatasync.
fn write_latency(c: &mut Criterion) {
    settle_disk();
    let dir = bench_dir();
    let record = vec![0x5au8; 4096];
    let mut group = c.benchmark_group("write_4k_sync_every_write");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));

    let mut raw = append_file(&dir.path().join("raw"));
    group.bench_function("raw_write_fdatasync", |b| {
        b.iter(|| {
            raw.write_all(&record).unwrap();
            raw.sync_data().unwrap();
        })
    });

    let log = FileWriteAheadLog::open(dir.path().join("wal"), WalSettings::default()).unwrap();
    group.bench_function("wal_write", |b| b.iter(|| log.write(&record, Time::from_millis(1_000)).unwrap()));
    group.finish();

    // The BENCH figure comes from alternating one raw write and one log
    // write, so both see the same disk (a shared disk's fdatasync latency
    // drifts between criterion's separate runs).
    let (mut raw_samples, mut wal_samples) = (Vec::new(), Vec::new());
    let pairs = if bench_mode() { 1_000 } else { 5 };
    for _ in 0..pairs {
        let start = Instant::now();
        raw.write_all(&record).unwrap();
        raw.sync_data().unwrap();
        raw_samples.push(start.elapsed());
        let start = Instant::now();
        log.write(&record, Time::from_millis(1_000)).unwrap();
        wal_samples.push(start.elapsed());
    }
    log.close().unwrap();

    let raw_us = median(&mut raw_samples).as_secs_f64() * 1e6;
    let wal_us = median(&mut wal_samples).as_secs_f64() * 1e6;
    print_bench("wal_write_4k_p50_latency", wal_us, "us", raw_us, wal_us / raw_us);
}

/// Records written and the time it took, summed over criterion's runs.
#[derive(Default)]
struct Rate {
    records: u64,
    elapsed: Duration,
}

impl Rate {
    fn add(&mut self, records: u64, elapsed: Duration) {
        self.records += records;
        self.elapsed += elapsed;
    }

    fn per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `writers` threads each writing `per_writer` 1 KiB records; returns the wall time.
fn run_writers(log: &FileWriteAheadLog, writers: u64, per_writer: u64, record: &[u8]) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                for _ in 0..per_writer {
                    log.write(record, Time::from_millis(1_000)).unwrap();
                }
            });
        }
    });
    start.elapsed()
}

/// Group commit: 8 writers against one, and against the disk's sequential bandwidth.
fn group_commit(c: &mut Criterion) {
    const RECORD: usize = 1024;
    const WRITERS: u64 = 8;
    settle_disk();
    let dir = bench_dir();
    let record = vec![0xa5u8; RECORD];
    let mut group = c.benchmark_group("group_commit_1k_sync_every_write");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));

    let log = Arc::new(FileWriteAheadLog::open(dir.path().join("wal"), WalSettings::default()).unwrap());
    group.bench_function("one_writer", |b| b.iter_custom(|iters| run_writers(&log, 1, iters, &record)));
    group.bench_function("eight_writers", |b| {
        b.iter_custom(|iters| {
            // Each iteration is one record; the eight threads share them.
            let per_writer = iters.div_ceil(WRITERS);
            let took = run_writers(&log, WRITERS, per_writer, &record);
            took.mul_f64(iters as f64 / (per_writer * WRITERS) as f64)
        })
    });

    // The BENCH figures come from short rounds of one writer and of eight,
    // alternated, so both see the same disk: a shared disk's fdatasync
    // latency drifts by half between criterion's separate runs.
    // The third, raw, is the most any group commit of eight 1 KiB writers
    // can get from this disk: the same bytes appended 8 KiB at a time, each
    // followed by one fdatasync.
    let (mut one, mut eight, mut raw_synced) = (Rate::default(), Rate::default(), Rate::default());
    let (rounds, per_round) = if bench_mode() { (20, 400) } else { (2, 5) };
    let mut synced_file = append_file(&dir.path().join("raw-synced-groups"));
    let group_bytes = vec![0x5au8; RECORD * WRITERS as usize];
    for _ in 0..rounds {
        one.add(per_round, run_writers(&log, 1, per_round, &record));
        eight.add(per_round * WRITERS, run_writers(&log, WRITERS, per_round, &record));
        let start = Instant::now();
        for _ in 0..per_round {
            synced_file.write_all(&group_bytes).unwrap();
            synced_file.sync_data().unwrap();
        }
        raw_synced.add(per_round * group_bytes.len() as u64, start.elapsed());
    }

    let chunk = vec![0x3cu8; 1 << 20];
    let chunks_per_run: u64 = if bench_mode() { 256 } else { 4 };
    let raw_path = dir.path().join("raw-sequential");
    let mut raw_bytes = Rate::default();
    group.throughput(Throughput::Bytes(chunk.len() as u64 * chunks_per_run));
    group.bench_function("raw_sequential_write_1MiB_chunks", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut file = File::create(&raw_path).unwrap(); // truncates: the disk does not fill up
                let start = Instant::now();
                for _ in 0..chunks_per_run {
                    file.write_all(&chunk).unwrap();
                }
                file.sync_data().unwrap();
                let took = start.elapsed();
                raw_bytes.add(chunk.len() as u64 * chunks_per_run, took);
                total += took;
            }
            total
        })
    });
    group.finish();

    let (one_rate, eight_rate) = (one.per_sec(), eight.per_sec());
    print_bench("wal_group_commit_8_writers_1k", eight_rate, "records/s", one_rate, eight_rate / one_rate);
    let wal_mb = eight_rate * RECORD as f64 / 1e6;
    let raw_mb = raw_bytes.per_sec() / 1e6;
    print_bench("wal_group_commit_8_writers_1k_bandwidth", wal_mb, "MB/s", raw_mb, wal_mb / raw_mb);
    let synced_mb = raw_synced.per_sec() / 1e6;
    print_bench("wal_group_commit_8_writers_1k_vs_synced_8k_appends", wal_mb, "MB/s", synced_mb, wal_mb / synced_mb);
}

/// `read_all` over 1 GiB (1 MiB in test mode) of 64 KiB records in the page cache.
fn read_all(c: &mut Criterion) {
    const RECORD: usize = 64 * 1024;
    let total_bytes: u64 = if bench_mode() { 1 << 30 } else { 1 << 20 };
    let dir = bench_dir();
    let options = WalSettings::default().with_sync_policy(SyncPolicy::Never);
    let log = FileWriteAheadLog::open(dir.path(), options).unwrap();
    let record = vec![0x7eu8; RECORD];
    let records = total_bytes / RECORD as u64;
    for i in 0..records {
        // 16 segments: a new one every 1/16 of the records.
        let time = Time::from_millis((i * 16 / records) as i64 * 60_000);
        log.write(&record, time).unwrap();
    }
    log.sync().unwrap();
    let paths: Vec<PathBuf> = log.segment_names().iter().map(|n| dir.path().join(n)).collect();

    let mut group = c.benchmark_group("read_all_64k_records");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Bytes(total_bytes));

    let mut raw = Rate::default();
    let mut buf = vec![0u8; 256 * 1024];
    group.bench_function("raw_sequential_read", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut bytes = 0u64;
            for _ in 0..iters {
                for path in &paths {
                    let mut file = File::open(path).unwrap();
                    loop {
                        let n = file.read(&mut buf).unwrap();
                        if n == 0 {
                            break;
                        }
                        bytes += n as u64;
                    }
                }
            }
            let took = start.elapsed();
            raw.add(bytes, took);
            took
        })
    });

    let mut wal = Rate::default();
    group.bench_function("wal_read_all", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut bytes = 0u64;
            for _ in 0..iters {
                for rec in log.read_all().unwrap() {
                    bytes += rec.unwrap().len() as u64;
                }
            }
            assert_eq!(bytes, iters * records * RECORD as u64);
            let took = start.elapsed();
            wal.add(bytes, took);
            took
        })
    });
    group.finish();

    let (wal_gb, raw_gb) = (wal.per_sec() / 1e9, raw.per_sec() / 1e9);
    print_bench("wal_read_all", wal_gb, "GB/s", raw_gb, wal_gb / raw_gb);
}

criterion_group!(benches, write_latency, group_commit, read_all);
criterion_main!(benches);
