//! `spate checkpoint inspect` on a long checkpoint, against the log store's
//! own verdict on the same directory.
//!
//! Figure printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `cli_inspect_10000_batches`: median time of the whole command (verdict,
//!   id lists, last batch, lock probe, and the sizes of every part, which
//!   stats every file) on 10,000 offsets and 10,000 commits; bound: the log
//!   store's `inspect` alone on the same directory, in the same run.
//!
//! The checkpoint lives under `$SPATE_BENCH_DIR`, else `/var/tmp`. Run
//! without `--bench` (as `cargo test --all-targets` does) it has 100 batches.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SPATE_BENCH_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("spate-cli-bench").tempdir_in(base).unwrap()
}

/// Writes `batches` offsets and commits in the log format (no fsync: setup only).
fn long_checkpoint(dir: &Path, batches: u64) {
    for sub in ["offsets", "commits"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("metadata"), "v1\n{\"id\":\"bench\",\"createdAtMs\":1700000000000}").unwrap();
    for id in 0..batches {
        let time = 1_700_000_000_000 + id * 1000;
        let offsets = format!(
            "v1\n{{\"batchWatermarkMs\":0,\"batchTimestampMs\":{time},\"conf\":{{}},\"sources\":[\"events\"]}}\n\
             {{\"events\":{{\"0\":{},\"1\":{}}}}}",
            id * 100,
            id * 98
        );
        std::fs::write(dir.join("offsets").join(id.to_string()), offsets).unwrap();
        std::fs::write(dir.join("commits").join(id.to_string()), "v1\n{\"nextBatchWatermarkMs\":0}").unwrap();
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn time_it(rounds: usize, mut f: impl FnMut()) -> Duration {
    median(
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect(),
    )
}

fn inspect(c: &mut Criterion) {
    let batches = if bench_mode() { 10_000 } else { 100 };
    let dir = bench_dir();
    long_checkpoint(dir.path(), batches);
    let path = dir.path().to_str().unwrap().to_string();
    let command = || {
        let outcome = spate_cli::run_command(["spate", "checkpoint", "inspect", &path]);
        assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    };
    let verdict = || {
        spate_logstore::inspect(dir.path()).unwrap();
    };
    let mut group = c.benchmark_group("cli");
    group.sample_size(10).measurement_time(Duration::from_secs(3));
    group.bench_function(format!("inspect_{batches}_batches"), |b| b.iter(command));
    group.finish();

    let rounds = if bench_mode() { 15 } else { 3 };
    let cli = time_it(rounds, command);
    let bound = time_it(rounds, verdict);
    let (cli_ms, bound_ms) = (cli.as_secs_f64() * 1e3, bound.as_secs_f64() * 1e3);
    println!(
        "BENCH cli_inspect_{batches}_batches {cli_ms:.3} ms bound={bound_ms:.3} ratio={:.3}",
        cli_ms / bound_ms.max(1e-6)
    );
}

criterion_group!(benches, inspect);
criterion_main!(benches);
