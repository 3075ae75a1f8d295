//! The cost of a checkpoint in S3, on a real S3 server (SeaweedFS, which
//! `cargo xtask bench` starts; by hand `cargo xtask s3 start` and the
//! `export` lines it prints). Without `SPATE_TEST_S3_ENDPOINT` it fails
//! saying so.
//!
//! Every request the client sends is counted on its way out (an HTTP
//! connector around object_store's own), so the counts are HTTP requests,
//! pages of a listing and any retry included.
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `logstore_s3_offsets_add_p50_latency`, `logstore_s3_commits_add_p50_latency`:
//!   median latency of a writer's `add` of `offsets/N` (a Kafka source's
//!   ranges of three partitions and a receiver input: 279 bytes) and of
//!   `commits/N` (65 bytes); bound: one raw conditional PUT
//!   (`PutMode::Create`) of the same bytes on the same server, in the same
//!   rounds, each round alternating which of the two goes first. Target
//!   ratio <= 1.3. The 99th percentiles are printed beside.
//! - `logstore_s3_requests_per_batch`: the requests one batch makes, as the
//!   runtime drives the log store (lease renewal when due, `offsets/N`,
//!   `commits/N`, the purge past the retention of 100 batches), 1 s
//!   batches, counted over 100 batches in steady state; bound: what Spark's
//!   `HDFSMetadataLog` needs at the least on S3 for the same batch
//!   ([`SPARK_REQUESTS_PER_BATCH`]).
//! - `logstore_s3_startup_10000_batches_p50`, `logstore_s3_startup_retained_p50`:
//!   median time to open a checkpoint as a restarting writer does (lease
//!   takeover, `metadata`, the recovery verdict reading the last offsets and
//!   commit) after 10,000 batches: with all 10,000 entries of each log kept
//!   (the worst case), and as the engine leaves it, with the 100 retained
//!   ones; bound: 1 s.
//! - `logstore_s3_snapshot_upload_peak_rss_growth`: how far the process's
//!   peak resident memory rises while a streamed state file of 256 MiB
//!   (a whole snapshot of some 10,000,000 keys) goes up in the default
//!   8 MiB parts and is published; bound: the file's size, what collecting
//!   it whole before a single conditional PUT took at the least. Printed
//!   beside: the upload's MB/s and requests, and the read back (streamed,
//!   checked against what was written).
//!
//! Run without `--bench` (as `cargo test --all-targets` does) everything is
//! shrunk: a few rounds, 40 batches, a checkpoint of 200 batches, a
//! snapshot of 20 MiB.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde_json::json;
use spate_core::{BatchId, Clock, ManualClock, SystemClock, Time};
use spate_logstore::{
    Checkpoint, CheckpointFileManager, CheckpointSettings, CommitMetadata, LeaseSettings, ObjectStoreFileManager,
    OffsetSeq, SourceOffset, Verdict,
};

/// What Spark's metadata log asks of S3 for one batch at the least, read
/// from `MicroBatchExecution` and `HDFSMetadataLog` over
/// `FileContextBasedCheckpointFileManager` (docs/src/benchmarks.md has the
/// reading): each of `offsets/N` and `commits/N` is an `exists` (HEAD), a
/// temp file (PUT) and a rename without overwrite (on S3: COPY then DELETE),
/// 4 each; reading `offsets/N-1` back to commit the sources is an `exists`
/// and an `open` (HEAD, GET); the purge deletes one entry of each log
/// (DELETE, DELETE). S3A adds probes to several of these (a missing path is
/// a HEAD and a LIST), so Spark's real count is higher.
const SPARK_REQUESTS_PER_BATCH: f64 = 12.0;
/// The retention the runtime keeps by default (`retained_batches`).
const RETAINED: u64 = 100;
/// A restart should answer within this.
const STARTUP_BOUND_MS: f64 = 1000.0;
/// Requests in flight while a long checkpoint is written (set-up, not measured).
const WRITERS: usize = 32;

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn print_bench(name: &str, value: f64, unit: &str, bound: f64, ratio: f64) {
    println!("BENCH {name} {value:.3} {unit} bound={bound:.3} ratio={ratio:.3}");
}

/// The kinds of request counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Put,
    Get,
    Head,
    List,
    Delete,
    Other,
}

const KINDS: [Kind; 6] = [Kind::Put, Kind::Get, Kind::Head, Kind::List, Kind::Delete, Kind::Other];

impl Kind {
    fn of(request: &HttpRequest) -> Kind {
        match request.method().as_str() {
            "PUT" => Kind::Put,
            "GET" if request.uri().query().is_some_and(|q| q.contains("list-type")) => Kind::List,
            "GET" => Kind::Get,
            "HEAD" => Kind::Head,
            // object_store deletes through the multi-object delete, `POST ?delete`, one key at a time here.
            "DELETE" => Kind::Delete,
            "POST" if request.uri().query().is_some_and(|q| q.starts_with("delete")) => Kind::Delete,
            _ => Kind::Other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Put => "PUT",
            Kind::Get => "GET",
            Kind::Head => "HEAD",
            Kind::List => "LIST",
            Kind::Delete => "DELETE",
            Kind::Other => "other",
        }
    }
}

/// Requests sent so far, by kind.
#[derive(Debug, Default)]
struct Counter([AtomicU64; 6]);

impl Counter {
    fn record(&self, kind: Kind) {
        self.0[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn tally(&self) -> Tally {
        Tally(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// A count of requests by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally([u64; 6]);

impl Tally {
    fn since(self, earlier: Tally) -> Tally {
        Tally(std::array::from_fn(|i| self.0[i] - earlier.0[i]))
    }

    fn add(&mut self, other: Tally) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
    }

    fn total(self) -> u64 {
        self.0.iter().sum()
    }

    /// "1 PUT, 2 LIST" with each count divided by `per`.
    fn describe(self, per: f64) -> String {
        let parts: Vec<String> = KINDS
            .iter()
            .filter(|kind| self.0[**kind as usize] > 0)
            .map(|kind| format!("{} {}", trim(self.0[*kind as usize] as f64 / per), kind.name()))
            .collect();
        if parts.is_empty() { "none".to_string() } else { parts.join(", ") }
    }
}

/// A number with at most two decimals, without trailing zeros.
fn trim(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// object_store's HTTP client, counting each request it sends.
#[derive(Debug)]
struct CountingConnector(Arc<Counter>);

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService { inner, counter: Arc::clone(&self.0) }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counter: Arc<Counter>,
}

#[async_trait]
impl HttpService for CountingService {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        self.counter.record(Kind::of(&request));
        self.inner.execute(request).await
    }
}

/// The test server, as tests/common/s3.rs reaches it.
struct Server {
    endpoint: String,
    bucket: String,
}

impl Server {
    fn from_env() -> Server {
        let endpoint = std::env::var("SPATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
            panic!(
                "SPATE_TEST_S3_ENDPOINT is not set: this benchmark needs an S3 server. Run it with `cargo xtask \
                 bench`, or start one with `cargo xtask s3 start` and export what it prints"
            )
        });
        let bucket = std::env::var("SPATE_TEST_S3_BUCKET").unwrap_or_else(|_| "spate-test".to_string());
        Server { endpoint, bucket }
    }

    /// A client of the bucket configured as the log store configures its
    /// own (conditional puts on ETags), its requests counted in `counter`.
    fn store(&self, counter: &Arc<Counter>) -> Arc<dyn ObjectStore> {
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_endpoint(&self.endpoint)
            .with_region(var("AWS_REGION", "us-east-1"))
            .with_access_key_id(var("AWS_ACCESS_KEY_ID", "spate-test"))
            .with_secret_access_key(var("AWS_SECRET_ACCESS_KEY", "spate-test-secret"))
            .with_allow_http(true)
            .with_http_connector(CountingConnector(Arc::clone(counter)))
            .build()
            .unwrap();
        Arc::new(store)
    }

    /// A prefix no earlier run used, and its `s3://` location.
    fn fresh(&self, name: &str) -> (String, PathBuf) {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let prefix = format!("bench/{name}-{}-{nanos}", std::process::id());
        let location = PathBuf::from(format!("s3://{}/{prefix}", self.bucket));
        (prefix, location)
    }
}

/// A checkpoint location in the bucket, its requests counted.
struct Location {
    path: PathBuf,
    /// The key prefix of `path`.
    prefix: String,
    files: Arc<dyn CheckpointFileManager>,
    counter: Arc<Counter>,
}

impl Location {
    fn new(server: &Server, name: &str) -> Location {
        let counter = Arc::new(Counter::default());
        let (prefix, path) = server.fresh(name);
        let store = server.store(&counter);
        let files: Arc<dyn CheckpointFileManager> =
            Arc::new(ObjectStoreFileManager::with_store(&path, &prefix, store).unwrap());
        Location { path, prefix, files, counter }
    }

    /// Opens it as a writer does, with `clock` and `lease`.
    fn open(&self, clock: Arc<dyn Clock>, lease: LeaseSettings) -> Checkpoint {
        let settings = CheckpointSettings::new()
            .with_file_manager(Arc::clone(&self.files))
            .with_clock(clock)
            .with_lease(lease)
            .with_retained_batches(RETAINED);
        Checkpoint::open_for_write(&self.path, settings).unwrap()
    }
}

/// Batch `id`'s offsets as a job with a Kafka source of three partitions
/// and a receiver input logs them.
fn offsets(id: u64) -> OffsetSeq {
    OffsetSeq {
        batch_watermark: Time::from_millis(id as i64 * 1000),
        batch_timestamp: Time::from_millis(1_700_000_000_000 + id as i64 * 1000),
        conf: [("spate.state.partitions".to_string(), "8".to_string())].into(),
        sources: vec![
            SourceOffset::new("kafka-in", Some(json!({"events": {"0": id * 1000, "1": id * 998, "2": id * 1003}}))),
            SourceOffset::new(
                "socket",
                Some(json!({"stream": 0, "blocks": 5, "records": 5000, "recordsThrough": id * 5000})),
            ),
        ],
    }
}

/// The median and the 99th percentile of `samples`, in milliseconds.
fn p50_p99(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let index = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index].as_secs_f64() * 1e3
    };
    (at(0.5), at(0.99))
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed())
}

/// A raw conditional PUT of `bytes` at a new key, run on the runtime's
/// worker and waited for from this thread, as the log store runs its own.
fn raw_put(runtime: &tokio::runtime::Runtime, store: &Arc<dyn ObjectStore>, key: &ObjectPath, bytes: Vec<u8>) {
    let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    let (store, key) = (Arc::clone(store), key.clone());
    let put = runtime.spawn(async move { store.put_opts(&key, PutPayload::from(bytes), options).await });
    runtime.block_on(put).unwrap().unwrap();
}

/// The object's bytes (set-up: not timed).
fn read_back(runtime: &tokio::runtime::Runtime, store: &Arc<dyn ObjectStore>, key: &ObjectPath) -> Vec<u8> {
    runtime.block_on(async { store.get(key).await.unwrap().bytes().await.unwrap().to_vec() })
}

/// (a) `add` of a batch's two entries against a raw conditional PUT of the
/// same bytes. The two alternate which goes first, since a request right
/// after another on the same server may wait for the earlier one's
/// aftermath; the PUT that goes first sends the bytes of the entry before.
fn add_latency(server: &Server) {
    let location = Location::new(server, "add");
    let checkpoint = location.open(Arc::new(SystemClock), LeaseSettings::default());
    // The raw PUTs go through a client of their own, on a runtime whose
    // worker drives its connections between requests, as the log store's does.
    let raw_store = server.store(&Arc::new(Counter::default()));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (prefix, _) = server.fresh("raw");
    let raw_key = |log: &str, id: u64| ObjectPath::from(format!("{prefix}/{log}/{id}"));
    let entry_key = |log: &str, id: u64| ObjectPath::from(format!("{}/{log}/{id}", location.prefix));
    let add = |log: &str, id: u64| match log {
        "offsets" => checkpoint.offsets().add(BatchId(id), &offsets(id)).unwrap(),
        _ => checkpoint.commits().add(BatchId(id), &CommitMetadata::default()).unwrap(),
    };

    let (warm_up, rounds) = if bench_mode() { (20, 400) } else { (2, 6) };
    let logs = ["offsets", "commits"];
    // Per log: the add's samples, the raw PUT's, and the bytes of its last entry.
    let mut samples: [(Vec<Duration>, Vec<Duration>, Vec<u8>); 2] = Default::default();
    for id in 0..warm_up + rounds {
        for (log, (adds, raws, last)) in logs.iter().zip(samples.iter_mut()) {
            let add_first = id % 2 == 0 || last.is_empty();
            let mut raw_took = None;
            if !add_first {
                let ((), took) = timed(|| raw_put(&runtime, &raw_store, &raw_key(log, id), last.clone()));
                raw_took = Some(took);
            }
            let (added, add_took) = timed(|| add(log, id));
            assert!(added);
            *last = read_back(&runtime, &raw_store, &entry_key(log, id));
            if add_first {
                let ((), took) = timed(|| raw_put(&runtime, &raw_store, &raw_key(log, id), last.clone()));
                raw_took = Some(took);
            }
            if id >= warm_up {
                adds.push(add_took);
                raws.extend(raw_took);
            }
        }
    }
    for (log, (adds, raws, last)) in logs.iter().zip(samples.iter_mut()) {
        let ((add50, add99), (raw50, raw99)) = (p50_p99(adds), p50_p99(raws));
        println!(
            "{log}/N ({} bytes), {rounds} rounds: add p50 {add50:.3} ms, p99 {add99:.3} ms; raw conditional PUT \
             p50 {raw50:.3} ms, p99 {raw99:.3} ms (target ratio <= 1.3)",
            last.len()
        );
        print_bench(&format!("logstore_s3_{log}_add_p50_latency"), add50, "ms", raw50, add50 / raw50);
    }
}

/// (b) The requests of a batch as the runtime drives the log store, step by step.
fn requests_per_batch(server: &Server) {
    let location = Location::new(server, "batches");
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    // The runtime renews at each batch when due; the background thread, on
    // the wall clock, would renew at the same cadence in its place.
    let lease = LeaseSettings { renew_in_background: false, ..LeaseSettings::default() };
    let checkpoint = location.open(clock.clone(), lease);
    let retained = if bench_mode() { RETAINED } else { 10 };
    let (batches, measured) = if bench_mode() { (300, 100) } else { (40, 20) };
    let interval = spate_core::Duration::from_millis(1000);
    let steps = ["lease renewal", "offsets/N", "commits/N", "purge", "progress line (runtime)"];
    let mut per_step = [Tally::default(); 5];
    let progress = location.path.join("progress").join("0");
    let fence = checkpoint.fence().unwrap();
    let line = vec![b'x'; 400];
    for id in 0..batches {
        let count = id >= batches - measured;
        let mut step = |n: usize, f: &mut dyn FnMut()| {
            let before = location.counter.tally();
            f();
            if count {
                per_step[n].add(location.counter.tally().since(before));
            }
        };
        // As the runtime's CheckpointStore: write_offsets, write_commit, purge_logs.
        step(0, &mut || checkpoint.renew_lease_if_due().unwrap());
        step(1, &mut || assert!(checkpoint.offsets().add(BatchId(id), &offsets(id)).unwrap()));
        step(2, &mut || assert!(checkpoint.commits().add(BatchId(id), &CommitMetadata::default()).unwrap()));
        let threshold = BatchId((id + 1).saturating_sub(retained));
        step(3, &mut || {
            if threshold > BatchId(0) {
                checkpoint.offsets().purge(threshold).unwrap();
                checkpoint.commits().purge(threshold).unwrap();
            }
        });
        // The runtime's advisory progress line: an append, which S3 makes a read and a conditional replace.
        step(4, &mut || {
            checkpoint.files().append(&progress, &line, &|| fence.check()).unwrap();
        });
        clock.advance(interval);
    }
    assert_eq!(checkpoint.offsets().ids().unwrap().len() as u64, retained);

    let per = measured as f64;
    let mut log_store = Tally::default();
    for (name, tally) in steps.iter().zip(per_step) {
        println!("  {name}: {} a batch ({})", trim(tally.total() as f64 / per), tally.describe(per));
    }
    for tally in &per_step[..4] {
        log_store.add(*tally);
    }
    let spate = log_store.total() as f64 / per;
    println!(
        "requests a batch on S3 (1 s batches, retention {retained}, the last {measured} of {batches} batches): \
         {} ({}); with the runtime's progress line {}; Spark's HDFSMetadataLog at least {SPARK_REQUESTS_PER_BATCH}",
        trim(spate),
        log_store.describe(per),
        trim(spate + per_step[4].total() as f64 / per),
    );
    print_bench(
        "logstore_s3_requests_per_batch",
        spate,
        "requests",
        SPARK_REQUESTS_PER_BATCH,
        spate / SPARK_REQUESTS_PER_BATCH,
    );
}

/// Writes batches `ids` (offsets then commit) from [`WRITERS`] threads at
/// once, through the writer's own logs, so the entries are the runtime's.
fn write_batches(checkpoint: &Checkpoint, ids: std::ops::Range<u64>) {
    let ids: Vec<u64> = ids.collect();
    std::thread::scope(|scope| {
        for chunk in ids.chunks(ids.len().div_ceil(WRITERS).max(1)) {
            scope.spawn(move || {
                for &id in chunk {
                    assert!(checkpoint.offsets().add(BatchId(id), &offsets(id)).unwrap());
                    assert!(checkpoint.commits().add(BatchId(id), &CommitMetadata::default()).unwrap());
                }
            });
        }
    });
}

/// (c) Opening a checkpoint after `batches` batches as a restart does.
fn startup(server: &Server) {
    let batches = if bench_mode() { 10_000 } else { 200 };
    let retained = if bench_mode() { RETAINED } else { 10 };
    let rounds = if bench_mode() { 9 } else { 2 };
    let cases = [
        ("all kept", format!("{batches}_batches"), 0..batches),
        ("as the engine leaves it", "retained".to_string(), batches - retained..batches),
    ];
    for (what, name, ids) in cases {
        let location = Location::new(server, &format!("startup-{name}"));
        let ((), wrote) = timed(|| {
            let checkpoint = location.open(Arc::new(SystemClock), LeaseSettings::default());
            write_batches(&checkpoint, ids.clone());
        });
        let entries = ids.end - ids.start;
        let mut samples = Vec::new();
        let mut requests = Tally::default();
        for _ in 0..rounds {
            let before = location.counter.tally();
            // The previous writer released its lease on a clean stop: taken over at once.
            let (checkpoint, took) = timed(|| {
                let checkpoint = location.open(Arc::new(SystemClock), LeaseSettings::default());
                let verdict = checkpoint.verdict().unwrap();
                assert!(matches!(verdict, Verdict::Resume { next, .. } if next == BatchId(batches)), "{verdict:?}");
                checkpoint
            });
            requests = location.counter.tally().since(before);
            drop(checkpoint);
            samples.push(took);
        }
        let (p50, slowest) = p50_p99(&mut samples);
        println!(
            "start-up after {batches} batches, {what} ({entries} offsets and {entries} commits, written in \
             {:.1} s): p50 {p50:.1} ms, slowest {slowest:.1} ms of {rounds} opens; {} requests ({})",
            wrote.as_secs_f64(),
            requests.total(),
            requests.describe(1.0)
        );
        print_bench(&format!("logstore_s3_startup_{name}_p50"), p50, "ms", STARTUP_BOUND_MS, p50 / STARTUP_BOUND_MS);
    }
}

/// A field of `/proc/self/status`, in MB.
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    let kb: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1000.0
}

/// The bytes of a snapshot, made a chunk at a time: chunk `i` of `len`.
fn snapshot_chunk(i: u64, len: usize) -> Vec<u8> {
    let mut state = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// (d) A large state snapshot streamed up, then read back as a restore does.
fn snapshot_upload(server: &Server) {
    use std::io::Read;
    const CHUNK: usize = 1 << 20;
    let chunks: u64 = if bench_mode() { 256 } else { 20 };
    let location = Location::new(server, "snapshot");
    let path = location.path.join("state/window/10");
    let size_mb = (chunks * CHUNK as u64) as f64 / 1e6;
    // The peak from here on (`VmHWM` reset to the current size).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let (before, requests_before) = (status_mb("VmRSS:"), location.counter.tally());
    let mut content = |out: &mut dyn spate_core::SeekWrite| {
        for i in 0..chunks {
            out.write_all(&snapshot_chunk(i, CHUNK))?;
        }
        Ok(())
    };
    let (written, took) = timed(|| location.files.create_atomic_streamed(&path, &mut content, &|| Ok(())).unwrap());
    let growth = status_mb("VmHWM:") - before;
    let requests = location.counter.tally().since(requests_before);
    assert_eq!(written, chunks * CHUNK as u64);
    let mut reader = location.files.open_read(&path, u64::MAX).unwrap().unwrap();
    let (mut buffer, mut read_back) = (vec![0u8; CHUNK], 0u64);
    let ((), read_took) = timed(|| {
        for i in 0..chunks {
            reader.read_exact(&mut buffer).unwrap();
            assert!(buffer == snapshot_chunk(i, CHUNK), "chunk {i} read back differs");
            read_back += CHUNK as u64;
        }
    });
    assert_eq!(reader.read(&mut buffer).unwrap(), 0, "more than was written");
    println!(
        "a streamed snapshot of {size_mb:.0} MB on S3: uploaded in {:.2} s ({:.0} MB/s, {} requests: {}), peak RSS \
         {growth:.1} MB above the {before:.1} MB before; read back as a stream in {:.2} s ({:.0} MB/s), as written",
        took.as_secs_f64(),
        size_mb / took.as_secs_f64(),
        requests.total(),
        requests.describe(1.0),
        read_took.as_secs_f64(),
        read_back as f64 / 1e6 / read_took.as_secs_f64(),
    );
    print_bench("logstore_s3_snapshot_upload_peak_rss_growth", growth, "MB", size_mb, growth / size_mb);
}

fn main() {
    let server = Server::from_env();
    add_latency(&server);
    requests_per_batch(&server);
    startup(&server);
    snapshot_upload(&server);
}
