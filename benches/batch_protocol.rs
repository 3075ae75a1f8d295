//! The fault-tolerance bookkeeping of one batch, across the crates: what
//! every receiver-fed batch pays before and after its jobs, whatever the data.
//!
//! One round is a block added to the `ReceivedBlockTracker` (an event-log
//! append and fdatasync), the batch allocation (another), `offsets/N` and
//! `commits/N` through the writer's checkpoint (each an atomic file: temp,
//! fsync, link, directory fsync). The bound is the same durable steps done by
//! hand on the same file system in the same run, interleaved with the rounds:
//! two appends with fdatasync and two temp+fsync+rename+directory-fsync
//! writes. Printed as `BENCH batch_protocol_p50 <ms> ms bound=<ms> ratio=<r>`.
//!
//! Files live under `$SPATE_BENCH_DIR`, else `/var/tmp` (a real disk, where
//! `/tmp` may be tmpfs). Without `--bench` (as `cargo test --all-targets`
//! runs it) only a few rounds are taken.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use spate::core::{
    BatchId, BlockStoreResult, Clock, Duration, ManualClock, ReceivedBlockInfo, StreamBlockId, StreamId, Time,
};
use spate::logstore::{Checkpoint, CheckpointSettings, CommitMetadata, OffsetSeq};
use spate::tracker::ReceivedBlockTracker;

const INTERVAL: Duration = Duration::from_millis(1000);

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SPATE_BENCH_DIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let base = if base.is_dir() { base } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix("spate-batch-bench").tempdir_in(base).unwrap()
}

/// The spate side: a checkpoint's writer, its tracker and the clock they share.
struct Driver {
    checkpoint: Checkpoint,
    tracker: ReceivedBlockTracker,
    clock: ManualClock,
    next: u64,
}

impl Driver {
    fn open(dir: &Path) -> Driver {
        let clock = ManualClock::new(Time::from_millis(1_700_000_000_000));
        let checkpoint =
            Checkpoint::open_for_write(dir, CheckpointSettings::new().with_clock(Arc::new(clock.clone()))).unwrap();
        let (tracker, _) = ReceivedBlockTracker::open(Some(dir), Arc::new(clock.clone())).unwrap();
        Driver { checkpoint, tracker, clock, next: 0 }
    }

    fn round(&mut self) {
        let batch = self.next;
        self.clock.advance(INTERVAL);
        let time = self.clock.now().floor(INTERVAL);
        let block = StreamBlockId::new(StreamId(0), batch);
        let info = ReceivedBlockInfo {
            stream_id: StreamId(0),
            num_records: Some(1000),
            metadata: None,
            store_result: BlockStoreResult { block_id: block, num_records: Some(1000), wal_handle: None },
        };
        assert!(self.tracker.add_block(info));
        self.tracker.allocate_blocks_to_batch(time).unwrap();
        let offsets = OffsetSeq { batch_timestamp: time, ..OffsetSeq::default() };
        assert!(self.checkpoint.offsets().add(BatchId(batch), &offsets).unwrap());
        assert!(self.checkpoint.commit_batch(BatchId(batch), &CommitMetadata::default()).unwrap());
        self.next += 1;
    }
}

/// The same durable steps by hand.
struct Raw {
    dir: PathBuf,
    log: File,
    next: u64,
}

impl Raw {
    fn open(dir: &Path) -> Raw {
        std::fs::create_dir_all(dir).unwrap();
        let log = OpenOptions::new().create(true).append(true).open(dir.join("log")).unwrap();
        Raw { dir: dir.to_path_buf(), log, next: 0 }
    }

    fn append(&mut self, bytes: &[u8]) {
        self.log.write_all(bytes).unwrap();
        self.log.sync_data().unwrap();
    }

    fn atomic_write(&self, name: &str, bytes: &[u8]) {
        let temp = self.dir.join(format!(".{name}.tmp"));
        let mut file = OpenOptions::new().write(true).create_new(true).open(&temp).unwrap();
        file.write_all(bytes).unwrap();
        file.sync_all().unwrap();
        drop(file);
        std::fs::rename(&temp, self.dir.join(name)).unwrap();
        File::open(&self.dir).unwrap().sync_all().unwrap();
    }

    fn round(&mut self) {
        let n = self.next;
        self.append(&[7u8; 96]);
        self.append(&[9u8; 64]);
        self.atomic_write(&format!("offsets-{n}"), b"v1\n{\"batchWatermarkMs\":0,\"batchTimestampMs\":0}\n");
        self.atomic_write(&format!("commits-{n}"), b"v1\n{\"nextBatchWatermarkMs\":0}\n");
        self.next += 1;
    }
}

fn median_ms(samples: &mut [StdDuration]) -> f64 {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default().as_secs_f64() * 1e3
}

fn batch_protocol(c: &mut Criterion) {
    let root = bench_dir();
    let mut driver = Driver::open(&root.path().join("ck"));
    let mut raw = Raw::open(&root.path().join("raw"));

    let mut group = c.benchmark_group("batch_protocol");
    group.sample_size(10).warm_up_time(StdDuration::from_millis(500)).measurement_time(StdDuration::from_secs(3));
    group.bench_function("raw_durable_steps", |b| b.iter(|| raw.round()));
    group.bench_function("tracker_offsets_commit", |b| b.iter(|| driver.round()));
    group.finish();

    // The figure: interleaved rounds, so both see the same disk at the same moments.
    let rounds = if std::env::args().any(|a| a == "--bench") { 200 } else { 3 };
    let (mut raw_samples, mut spate_samples) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        raw.round();
        raw_samples.push(start.elapsed());
        let start = Instant::now();
        driver.round();
        spate_samples.push(start.elapsed());
    }
    let (bound, value) = (median_ms(&mut raw_samples), median_ms(&mut spate_samples));
    println!("BENCH batch_protocol_p50 {value:.3} ms bound={bound:.3} ratio={:.3}", value / bound);
}

criterion_group!(benches, batch_protocol);
criterion_main!(benches);
