//! Ingest throughput: the generator receiver through the block generator
//! into the block handler, with the WAL off and on (one `fdatasync` per
//! block), for 10-byte records, against the raw sequential write bandwidth
//! of the same disk measured in the same run. The receiver WAL appends with
//! direct I/O, as the runtime opens it.
//!
//! Records are 10-byte `String` words, which the generator writes in place
//! into their blocks' bytes (no `String` made or freed per record).
//!
//! Prints `BENCH` lines: records/s with the WAL off (bound: the 20 M/s
//! target), with the WAL on (bound: the lower of the WAL-off rate and what
//! the measured disk bandwidth allows for the bytes written per record),
//! each with the figure the issue that asked for `String` records quoted
//! for the inline word type they replace, and two thirds of it (its
//! target: within 1.5x),
//! and the disk bandwidth itself: raw sequential writes through the page
//! cache, with direct I/O into a new file, and with direct I/O over the
//! blocks of a written file (the best of the three is the bound), and, for
//! reference, block-sized direct writes with an fdatasync after each.
//! Those figures are medians of rounds that alternate them, so that all
//! see the same state of the machine. A full run needs about 3 GB free in
//! `/var/tmp` (the WAL's recycled segment, and the disk probe's files).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use spate_core::{Duration, StreamId, SystemClock, Time};
use spate_receiver::{
    BlockManager, BlockManagerBasedBlockHandler, BlockManagerSettings, FnSink, GeneratorReceiver, GeneratorSettings,
    ReceivedBlockHandler, ReceiverState, ReceiverSupervisor, StorageLevel, SupervisorSettings, WalHandlerSettings,
    WordGenerator, WriteAheadLogBasedBlockHandler, encode_block, open_receiver_wal, receiver_wal_options,
};
use spate_wal::WriteAheadLog;

const STREAM: StreamId = StreamId(0);
const WAL_OFF_TARGET: f64 = 20_000_000.0;
/// Records/s the inline word type measured, WAL off and on, as quoted by
/// the issue that replaced it with `String`, whose target is within 1.5x.
const INLINE_WORDS_WAL_OFF: f64 = 119_000_000.0;
const INLINE_WORDS_WAL_ON: f64 = 28_000_000.0;
/// Records per block at most: a block is cut (and synced) at this size.
const BLOCK_RECORDS: usize = 1 << 20;

fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Records per run of 10-byte words: 122 blocks, so that the start of a
/// run (the block queue, 10 blocks deep, filling with fresh buffers while
/// the first blocks are serialized) and its end (the last blocks in
/// flight) weigh little against its steady state, which is what a
/// long-running receiver sees.
fn records_per_iteration() -> u64 {
    if full_run() { 128_000_000 } else { 50_000 }
}

/// A real disk, not tmpfs: where the WAL and the bandwidth probe write.
fn bench_dir() -> tempfile::TempDir {
    let base = Path::new("/var/tmp");
    let builder = tempfile::Builder::new().prefix("spate-receiver-bench-").tempdir_in(base);
    builder.unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

/// 64 words of exactly 10 bytes.
fn ten_byte_generator() -> WordGenerator {
    let vocabulary = (0..64).map(|i| format!("word-{i:05}")).collect();
    WordGenerator::with_vocabulary(42, vocabulary).unwrap()
}

/// Runs the generator for `n` records into `handler`; returns the elapsed
/// seconds until the last block was stored (durably, with the WAL on).
fn ingest(n: u64, handler: Arc<dyn ReceivedBlockHandler<String>>, blocks: Arc<BlockManager<String>>) -> f64 {
    let mut generator = GeneratorSettings::new(42);
    generator.generator = ten_byte_generator();
    generator.total_records = Some(n);
    generator.batch_size = 4096;
    let mut config = SupervisorSettings::new(STREAM);
    config.block_generator.block_interval = Duration::from_millis(50);
    config.block_generator.max_block_records = Some(BLOCK_RECORDS);
    // Processed blocks are removed, as the runtime's cleanup would, so memory stays flat.
    let sink = FnSink(move |info: spate_core::ReceivedBlockInfo| {
        blocks.remove(info.block_id())?;
        Ok(())
    });
    let started = Instant::now();
    let supervisor = ReceiverSupervisor::start(
        GeneratorReceiver::new(generator),
        config,
        handler,
        Arc::new(sink),
        Arc::new(SystemClock),
    )
    .unwrap();
    let finished = supervisor.wait_for_state(|s| s == ReceiverState::Finished, std::time::Duration::from_secs(600));
    let elapsed = started.elapsed().as_secs_f64();
    assert!(finished.is_some(), "ingest did not finish: {:?}", supervisor.errors());
    supervisor.stop().unwrap();
    elapsed
}

fn block_manager() -> Arc<BlockManager<String>> {
    Arc::new(BlockManager::open(BlockManagerSettings::in_memory(4 << 30), Arc::new(SystemClock)).unwrap())
}

fn wal_off(n: u64) -> f64 {
    let blocks = block_manager();
    let handler =
        Arc::new(BlockManagerBasedBlockHandler::new(Arc::clone(&blocks), StorageLevel::MEMORY_AND_DISK_SER_2));
    ingest(n, handler, blocks)
}

/// One run with the receiver WAL in `checkpoint`; the run's segment is
/// cleaned afterwards (recycled for the next run), as the runtime cleans
/// segments whose batches are done.
fn wal_on(checkpoint: &Path, n: u64) -> f64 {
    let blocks = block_manager();
    // As the runtime opens it, but keeping one spare rather than two: runs
    // follow one another, so one is always there, and the bench's log then
    // takes one run's bytes on disk (1.4 GB) instead of three.
    let options = receiver_wal_options().with_recycled_segments(1);
    let wal = open_receiver_wal(checkpoint, STREAM, options).unwrap();
    let handler = WriteAheadLogBasedBlockHandler::new(
        Arc::clone(&blocks),
        Arc::clone(&wal) as Arc<dyn WriteAheadLog>,
        STREAM,
        StorageLevel::MEMORY_AND_DISK_SER_2,
        WalHandlerSettings::default(),
        Arc::new(SystemClock),
    )
    .unwrap();
    let seconds = ingest(n, Arc::new(handler), blocks);
    wal.clean(Time::from_millis(i64::MAX), true).unwrap();
    seconds
}

/// The disk's write bandwidth in bytes/s, measured four ways on a settled
/// disk (so the writeback of earlier rounds does not slow it).
struct DiskBandwidth {
    /// 1 MiB writes through the page cache, one fdatasync at the end.
    buffered: f64,
    /// 4 MiB direct writes into a new file, one fdatasync at the end.
    direct: f64,
    /// The same over the blocks of the file just written (what a recycled
    /// segment is written like).
    rewrite: f64,
    /// Block-sized direct writes with an fdatasync after each: what the
    /// disk allows for the WAL's pattern (for reference; not the bound).
    synced_blocks: f64,
}

impl DiskBandwidth {
    /// Raw sequential write bandwidth: the best of the unsynced ways.
    fn sequential(&self) -> f64 {
        self.buffered.max(self.direct).max(self.rewrite)
    }
}

fn disk_bandwidth(block_bytes: usize) -> DiskBandwidth {
    let _ = std::process::Command::new("sync").status();
    let dir = bench_dir();
    let total: usize = if full_run() { 256 << 20 } else { 4 << 20 };
    let buffered = sequential_write(&dir.path().join("buffered"), total, 1 << 20, false, false);
    let direct = sequential_write(&dir.path().join("direct"), total, 4 << 20, true, false);
    let rewrite = sequential_write(&dir.path().join("direct"), total, 4 << 20, true, false);
    let synced_blocks = sequential_write(&dir.path().join("blocks"), total, block_bytes, true, true);
    DiskBandwidth { buffered, direct, rewrite, synced_blocks }
}

/// Writes at least `total` bytes in `chunk`-sized writes from the start of
/// `path` (direct I/O or not; with an fdatasync after each, or once at the
/// end); returns bytes/s. The file stays, to be written over.
fn sequential_write(path: &Path, total: usize, chunk: usize, direct: bool, sync_each: bool) -> f64 {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let mut file = options.open(path).unwrap();
    // Whole pages at a page-aligned address, as direct I/O needs.
    let chunk = chunk.next_multiple_of(4096);
    let mut buffer = vec![0x5au8; chunk + 4096];
    let offset = buffer.as_ptr().align_offset(4096);
    let chunk = &mut buffer[offset..offset + chunk];
    let started = Instant::now();
    let mut written = 0;
    while written < total {
        file.write_all(chunk).unwrap();
        if sync_each {
            file.sync_data().unwrap();
        }
        written += chunk.len();
    }
    file.sync_data().unwrap();
    written as f64 / started.elapsed().as_secs_f64()
}

/// Bytes the WAL gets per record: the serialized block divided by its records.
fn bytes_per_record() -> f64 {
    let records = ten_byte_generator().words(0, 1 << 20);
    encode_block(&records).unwrap().len() as f64 / records.len() as f64
}

/// One ingest run of `n` records, returning its seconds.
type IngestRun<'a> = &'a dyn Fn(u64) -> f64;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

fn bench_ingest(c: &mut Criterion) {
    let n = records_per_iteration();
    // The receiver WAL's checkpoint, kept across WAL-on runs; the first run
    // leaves the spare segment file the others write into.
    let words_dir = bench_dir();
    let checkpoint = words_dir.path();
    wal_on(checkpoint, n);
    let rates: Arc<Mutex<[Vec<f64>; 2]>> = Arc::default();
    let mut group = c.benchmark_group("ingest");
    group.sampling_mode(SamplingMode::Flat).sample_size(10).warm_up_time(std::time::Duration::from_millis(500));
    group.measurement_time(std::time::Duration::from_secs(if full_run() { 8 } else { 1 }));
    let runs: [(usize, &str, u64, IngestRun<'_>); 2] =
        [(0, "wal_off", n, &wal_off), (1, "wal_on", n, &|n| wal_on(checkpoint, n))];
    for (slot, name, n, run) in runs {
        let rates = Arc::clone(&rates);
        group.throughput(criterion::Throughput::Elements(n));
        group.bench_function(name, move |b| {
            b.iter_custom(|iters| {
                let mut total = 0.0;
                for _ in 0..iters {
                    let seconds = run(n);
                    rates.lock().unwrap()[slot].push(n as f64 / seconds);
                    total += seconds;
                }
                std::time::Duration::from_secs_f64(total)
            });
        });
    }
    group.finish();

    // The headline figures come from rounds of WAL off, WAL on and the disk
    // probe, alternated, so the three see the same machine: on a shared one
    // each drifts by a quarter between criterion's separate runs.
    let per_record = bytes_per_record();
    let block_bytes = (per_record * BLOCK_RECORDS as f64) as usize;
    let (mut off, mut on, mut disks) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..if full_run() { 7 } else { 1 } {
        disks.push(disk_bandwidth(block_bytes));
        off.push(n as f64 / wal_off(n));
        on.push(n as f64 / wal_on(checkpoint, n));
    }
    let (off, on) = (median(off), median(on));
    let disk = |figure: fn(&DiskBandwidth) -> f64| median(disks.iter().map(figure).collect());
    let bandwidth = disk(DiskBandwidth::sequential);
    let disk_records = bandwidth / per_record;
    let on_bound = off.min(disk_records);
    println!(
        "BENCH receiver_disk_seq_write {:.1} MB/s bound={:.1} ratio=1.00 buffered={:.1} direct={:.1} \
         rewrite={:.1} synced_blocks_of_{:.1}_mb={:.1}",
        bandwidth / 1e6,
        bandwidth / 1e6,
        disk(|d| d.buffered) / 1e6,
        disk(|d| d.direct) / 1e6,
        disk(|d| d.rewrite) / 1e6,
        block_bytes as f64 / 1e6,
        disk(|d| d.synced_blocks) / 1e6,
    );
    println!(
        "BENCH receiver_disk_records {disk_records:.0} records/s bound={disk_records:.0} ratio=1.00 bytes_per_record={per_record:.2}"
    );
    println!(
        "BENCH receiver_ingest_wal_off {off:.0} records/s bound={WAL_OFF_TARGET:.0} ratio={:.2} \
         inline_words_quoted={INLINE_WORDS_WAL_OFF:.0} within_1.5x={:.0} ratio_1.5x={:.2}",
        off / WAL_OFF_TARGET,
        INLINE_WORDS_WAL_OFF / 1.5,
        off / (INLINE_WORDS_WAL_OFF / 1.5),
    );
    println!(
        "BENCH receiver_ingest_wal_on {on:.0} records/s bound={on_bound:.0} ratio={:.2} \
         inline_words_quoted={INLINE_WORDS_WAL_ON:.0} within_1.5x={:.0} ratio_1.5x={:.2}",
        on / on_bound,
        INLINE_WORDS_WAL_ON / 1.5,
        on / (INLINE_WORDS_WAL_ON / 1.5),
    );
}

criterion_group!(benches, bench_ingest);
criterion_main!(benches);
