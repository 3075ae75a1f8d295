//! `spate run --app` on several member processes against the local broker:
//! the word count's throughput with 1, 2 and 3 members, what its
//! repartition hop costs, and how long a killed member's partitions pause.
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `app_repartition_hop_1_member`: input lines a second through the whole
//!   job (split, the hop through `NAME-words`, count per event-time window,
//!   top) on one member; bound: the same job without the hop (the hidden
//!   `--without-repartition`: each input partition counted in its split
//!   task), so the ratio is what the hop leaves of the throughput.
//! - `app_throughput_<n>_members` and `..._per_member`: the same job on 2 and
//!   3 member processes, in total and per member; bound: one member.
//! - `app_rebalance_pause_session_<ms>ms`: from `kill -9` of one of three
//!   members to the last of its partitions' first batch committed by its
//!   new owner, under a live input; bound: the session timeout in force plus
//!   2 s (the target: within 2 s of the group noticing).
//!
//! Every run is a new application (its own consumer group, internal topics
//! and checkpoints) of members started with `--batch-ms 500` (1000, the
//! command's default, in the rebalance runs), a heartbeat of
//! 1 s, 10 s event-time windows and the command's default caps per batch.
//!
//! Throughput: the members start on an empty input topic of 6 partitions;
//! once every member owns its tasks (the members print what they are given),
//! a backlog of `--lines N` lines (400,000; 8 words each from a vocabulary of
//! 200, spread over two minutes of event time) is produced, and the run is
//! timed from its first line until every batch of every stage has committed:
//! the group's committed offsets (each batch's transaction commits them) of
//! the input and of the internal topics reach the topics' ends. Beside it: the
//! CPU each member process used over that time (`/proc/<pid>/stat`), the
//! lines per member CPU-second, each member's peak resident memory, and the
//! machine's busy cores (`/proc/stat`; the broker shares the processors).
//!
//! Rebalance pause: three members start on an empty topic; once they own
//! their tasks, a producer thread writes 3,000 lines a second stamped with
//! the current time, and after ten seconds of it, once no partition of any
//! stage is more than two seconds of input behind five checks in a row, the
//! member with the most input partitions is killed with SIGKILL.
//! The survivors' progress lines (`[<topic>-<partition>] batch …`, printed
//! once the batch committed) say when each of its tasks committed its first
//! batch under its new owner. Also printed: when the killed member's
//! partitions had no offsets pending in a transaction of its any more (a new
//! owner's first transaction waits for that: the broker aborts the dead
//! member's open transaction after `--transaction-timeout-ms`, by default the
//! session timeout, checking for such transactions every second on the broker
//! `cargo xtask kafka start` runs, every 10 s on a broker left at its
//! defaults).
//!
//! Needs the broker in `SPATE_KAFKA_BROKERS` (`cargo xtask bench app`
//! starts one). Without `--bench` (as `cargo test --all-targets` runs it) the
//! backlog is 3,000 lines, only the one-member runs and one pause (session
//! 6 s, two members) run, and no figure is printed. Arguments `throughput`,
//! `hop` and `rebalance` pick parts; with `APP_BENCH_LOGS=DIR` each member's
//! output is kept in `DIR/<app>-<member>.out` and `.err` (and the
//! throughput runs' members print their batches).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 6;
const WORDS_PER_LINE: u64 = 8;
const VOCABULARY: usize = 200;
/// The backlog's lines are spread over this much event time.
const EVENT_SPAN_MS: i64 = 120_000;
const WINDOW_MS: &str = "10000";
/// The members' bound on out-of-orderness.
const OUT_OF_ORDERNESS_MS: &str = "2000";
/// The batches of the throughput runs.
const BATCH_MS: &str = "500";
/// The batches of the rebalance runs: the command's default. With 500 ms
/// batches the fifteen tasks of three members and the broker, each batch a
/// transaction, fill this machine's two cores and the count tasks fall
/// behind before any member is killed, so a pause would measure their
/// backlog, not the rebalance.
const REBALANCE_BATCH_MS: &str = "1000";
/// The heartbeat of every run.
const HEARTBEAT_MS: u64 = 1_000;
/// The session of the throughput runs (no member dies in them).
const THROUGHPUT_SESSION_MS: u64 = 10_000;
/// The live input of the rebalance runs, lines a second over all partitions.
const LIVE_RATE: u64 = 3_000;
const PARTS: [&str; 3] = ["throughput", "hop", "rebalance"];

struct Options {
    full: bool,
    lines: u64,
    parts: Vec<String>,
}

impl Options {
    fn parse() -> Options {
        let full = std::env::args().any(|a| a == "--bench");
        let mut options = Options { full, lines: if full { 400_000 } else { 3_000 }, parts: Vec::new() };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--lines" => options.lines = args.next().and_then(|n| n.parse().ok()).expect("--lines N"),
                a if a.starts_with('-') => {}
                name => options.parts.push(name.to_string()),
            }
        }
        options
    }

    fn selects(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

fn brokers() -> String {
    match std::env::var("SPATE_KAFKA_BROKERS") {
        Ok(b) if !b.trim().is_empty() => b,
        _ => panic!(
            "this benchmark needs a Kafka broker: run it through `cargo xtask bench app` or set \
             SPATE_KAFKA_BROKERS (e.g. after `cargo xtask kafka start`)"
        ),
    }
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn create_topics(topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1))).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for result in runtime.block_on(admin.create_topics(&new, &AdminOptions::new())).unwrap() {
        result.unwrap();
    }
}

/// splitmix64: the same lines every run.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The vocabulary: pronounceable words of 2 to 4 syllables.
fn vocabulary() -> Vec<String> {
    const SYLLABLES: [&str; 16] =
        ["ka", "lo", "mi", "ner", "po", "su", "ta", "vel", "da", "rin", "go", "he", "ju", "bo", "fa", "zu"];
    let mut draws = Draws(7);
    let mut words: Vec<String> = Vec::new();
    while words.len() < VOCABULARY {
        let n = 2 + draws.next() % 3;
        let word: String = (0..n).map(|_| SYLLABLES[(draws.next() % 16) as usize]).collect();
        if !words.contains(&word) {
            words.push(word);
        }
    }
    words
}

/// One line of words, some far more frequent than others (the index is
/// the square of a uniform draw).
fn line(words: &[String], draws: &mut Draws) -> String {
    let mut text = String::new();
    for i in 0..WORDS_PER_LINE {
        let u = (draws.next() >> 11) as f64 / (1u64 << 53) as f64;
        if i > 0 {
            text.push(' ');
        }
        text.push_str(&words[((u * u) * words.len() as f64) as usize]);
    }
    text
}

fn producer(linger_ms: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("linger.ms", linger_ms)
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap()
}

fn send(producer: &BaseProducer, topic: &str, partition: i32, ts: i64, payload: &str) {
    let mut record = BaseRecord::<(), str>::to(topic).payload(payload).partition(partition).timestamp(ts);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((rdkafka::error::KafkaError::MessageProduction(_), back)) => {
                record = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => panic!("producing to {topic}: {e}"),
        }
    }
}

/// `lines` lines, round-robin over the partitions, their timestamps
/// rising evenly over [`EVENT_SPAN_MS`] ending ten minutes ago; returns
/// each word's count per window, computed from what was sent.
fn produce_backlog(topic: &str, lines: u64) -> Reference {
    let producer = producer("50");
    let words = vocabulary();
    let mut draws = Draws(42);
    let base = (now_ms() - 600_000 - EVENT_SPAN_MS) / 10_000 * 10_000;
    let mut reference = Reference::default();
    for i in 0..lines {
        let ts = base + (i as i64 * EVENT_SPAN_MS) / lines as i64;
        let line = line(&words, &mut draws);
        reference.add(ts, &line);
        send(&producer, topic, (i % PARTITIONS as u64) as i32, ts, &line);
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    reference
}

/// Each word's count per window of what was produced, and the latest time.
#[derive(Default)]
struct Reference {
    counts: BTreeMap<(String, i64), u64>,
    latest: i64,
}

impl Reference {
    fn add(&mut self, ts: i64, line: &str) {
        let size: i64 = WINDOW_MS.parse().unwrap();
        for word in line.split_whitespace() {
            *self.counts.entry((word.to_string(), ts.div_euclid(size) * size)).or_default() += 1;
        }
        self.latest = self.latest.max(ts);
    }

    /// Checks the counts `output` holds against the windows the watermark
    /// closed: those ending by the latest time less the bound on
    /// out-of-orderness (every split task idle once its backlog is done).
    fn check(&self, output: &BTreeMap<(String, i64), (u64, u64)>, late_words: u64) -> Windows {
        let size: i64 = WINDOW_MS.parse().unwrap();
        let watermark = self.latest - OUT_OF_ORDERNESS_MS.parse::<i64>().unwrap();
        let closed: Vec<_> = self.counts.iter().filter(|((_, start), _)| start + size <= watermark).collect();
        let exact = closed.iter().filter(|(key, count)| output.get(*key).map(|(c, _)| c) == Some(*count)).count();
        let revised = output.values().filter(|(_, revision)| *revision > 0).count();
        Windows { closed: closed.len(), exact, revised, late_words }
    }
}

/// A run's windows against the reference.
#[derive(Debug)]
struct Windows {
    /// Windows the watermark closed, by the reference.
    closed: usize,
    /// Of those, the ones whose last count equals the reference's.
    exact: usize,
    /// Windows written again after late words changed them.
    revised: usize,
    /// Words the count stage set aside as late.
    late_words: u64,
}

/// Every committed record of `topic` as JSON, read until it has been quiet
/// for a second (the run has committed everything before this is called).
fn read_all(topic: &str) -> Vec<serde_json::Value> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", unique("bench-app-reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer
        .assign(&{
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
            list
        })
        .unwrap();
    let (_, end) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10)).unwrap();
    let mut values = Vec::new();
    let mut quiet_since = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(message) => {
                let message = message.unwrap();
                values.push(serde_json::from_slice(message.payload().unwrap_or_default()).unwrap());
                quiet_since = Instant::now();
                if message.offset() + 1 >= end {
                    return values;
                }
            }
            None if end == 0 || quiet_since.elapsed() > Duration::from_secs(1) => return values,
            None => {}
        }
    }
}

/// The last revision of each word's count per window: (count, revision).
fn latest_counts(values: &[serde_json::Value]) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut latest: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for v in values {
        let key = (v["word"].as_str().unwrap().to_string(), v["windowStart"].as_i64().unwrap());
        let (count, revision) = (v["count"].as_u64().unwrap(), v["revision"].as_u64().unwrap());
        let entry = latest.entry(key).or_insert((count, revision));
        if revision >= entry.1 {
            *entry = (count, revision);
        }
    }
    latest
}

/// Writes lines at [`LIVE_RATE`] stamped with the current time until stopped.
fn live_producer(topic: String, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let producer = producer("5");
        let words = vocabulary();
        let mut draws = Draws(99);
        let started = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = (started.elapsed().as_secs_f64() * LIVE_RATE as f64) as u64;
            while sent < due {
                send(&producer, &topic, (sent % PARTITIONS as u64) as i32, now_ms(), &line(&words, &mut draws));
                sent += 1;
            }
            producer.poll(Duration::from_millis(10));
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        sent
    })
}

/// Reads the group's committed offsets and the topics' ends.
struct Offsets {
    consumer: BaseConsumer,
    partitions: TopicPartitionList,
}

impl Offsets {
    fn new(group: &str, topics: &[(String, i32)]) -> Offsets {
        // read_uncommitted: the committed offsets as they stand (not waiting
        // for transactions in flight) and the topics' high watermarks.
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", group)
            .set("isolation.level", "read_uncommitted")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut partitions = TopicPartitionList::new();
        for (topic, count) in topics {
            for p in 0..*count {
                partitions.add_partition(topic, p);
            }
        }
        Offsets { consumer, partitions }
    }

    /// Each partition's committed offset (0 before its first commit).
    fn committed(&self) -> BTreeMap<(String, i32), i64> {
        let list = self.consumer.committed_offsets(self.partitions.clone(), Duration::from_secs(10)).unwrap();
        list.elements()
            .iter()
            .map(|e| {
                let offset = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                ((e.topic().to_string(), e.partition()), offset)
            })
            .collect()
    }

    /// Each partition's high watermark.
    fn ends(&self) -> BTreeMap<(String, i32), i64> {
        self.partitions
            .elements()
            .iter()
            .map(|e| {
                let (_, high) =
                    self.consumer.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(10)).unwrap();
                ((e.topic().to_string(), e.partition()), high)
            })
            .collect()
    }
}

/// CPU seconds (user and system) a process has used, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime: fields 14 and 15, in ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// A process's peak resident memory so far, MB, from `/proc/<pid>/status`.
fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// The CPU seconds the machine's processors have been busy so far (all but
/// idle and I/O wait), from `/proc/stat`.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or_default();
    let values: Vec<f64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: f64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    // In ticks of 1/100 s.
    (total - idle) / 100.0
}

/// What a member printed, each line with when it was read.
type Printed = Arc<Mutex<Vec<(Instant, String)>>>;

/// One `spate run --app` process.
struct MemberProcess {
    app: String,
    id: String,
    child: Child,
    stdout: Printed,
    stderr: Printed,
}

fn collect(stream: impl std::io::Read + Send + 'static, into: Printed) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            into.lock().unwrap().push((Instant::now(), line));
        }
    });
}

/// The settings of a run's members.
struct Run<'a> {
    app: String,
    input: &'a str,
    output: &'a str,
    checkpoint: &'a Path,
    session_ms: u64,
    quiet: bool,
    without_repartition: bool,
    allowed_lateness_ms: &'a str,
    batch_ms: &'a str,
}

impl Run<'_> {
    fn start_member(&self, id: &str) -> MemberProcess {
        let brokers = brokers();
        let (session, heartbeat) = (self.session_ms.to_string(), HEARTBEAT_MS.to_string());
        let late_topic = format!("{}-late", self.output);
        let mut args = vec![
            "run",
            "--app",
            &self.app,
            "--member-id",
            id,
            "--kafka",
            &brokers,
            "--topic",
            self.input,
            "--output-topic",
            self.output,
            "--checkpoint",
            self.checkpoint.to_str().unwrap(),
            "--batch-ms",
            self.batch_ms,
            "--session-timeout-ms",
            &session,
            "--heartbeat-interval-ms",
            &heartbeat,
            "--window-ms",
            WINDOW_MS,
            "--slide-ms",
            WINDOW_MS,
            "--out-of-orderness-ms",
            OUT_OF_ORDERNESS_MS,
            "--allowed-lateness-ms",
            self.allowed_lateness_ms,
            "--late-topic",
            &late_topic,
            "--top",
            "3",
        ];
        if self.quiet {
            args.push("--quiet");
        }
        if self.without_repartition {
            args.push("--without-repartition");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdout, stderr) = (Printed::default(), Printed::default());
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        MemberProcess { app: self.app.clone(), id: id.to_string(), child, stdout, stderr }
    }

    /// The partitions of the topics the run's members read: the input and
    /// the internal ones.
    fn topics(&self) -> Vec<(String, i32)> {
        let mut topics = vec![(self.input.to_string(), PARTITIONS)];
        if !self.without_repartition {
            topics.push((format!("{}-words", self.app), PARTITIONS));
        }
        topics.push((format!("{}-windows", self.app), 1));
        topics
    }
}

impl MemberProcess {
    /// The tasks it said it owns last (`member <id> given …; owns a, b`).
    fn owned(&self) -> Vec<String> {
        let prefix = format!("member {} ", self.id);
        let stdout = self.stdout.lock().unwrap();
        let last = stdout.iter().rev().find_map(|(_, l)| l.strip_prefix(&prefix)?.split_once("; owns ").map(|x| x.1));
        match last {
            None | Some("nothing") => Vec::new(),
            Some(list) => list.split(", ").map(str::to_string).collect(),
        }
    }

    /// The last lines it wrote to stderr and stdout.
    fn last_words(&self) -> String {
        let tail = |printed: &Printed| {
            let printed = printed.lock().unwrap();
            let lines: Vec<&str> = printed.iter().map(|(_, l)| l.as_str()).collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        format!("member {}: stderr:\n{}\nstdout:\n{}", self.id, tail(&self.stderr), tail(&self.stdout))
    }

    /// Fails the benchmark, with what the member said, if it has exited.
    fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("member {} exited ({status}); {}", self.id, self.last_words());
        }
    }

    /// With `APP_BENCH_LOGS=DIR`, writes what it printed to
    /// `DIR/<app>-<member>.out` and `.err`.
    fn keep_logs(&self) {
        let Some(dir) = std::env::var_os("APP_BENCH_LOGS") else { return };
        for (printed, ext) in [(&self.stdout, "out"), (&self.stderr, "err")] {
            let lines: Vec<String> = printed.lock().unwrap().iter().map(|(_, l)| l.clone()).collect();
            let path = Path::new(&dir).join(format!("{}-{}.{ext}", self.app, self.id));
            std::fs::write(&path, lines.join("\n")).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }

    fn stop(mut self) {
        if self.child.try_wait().unwrap().is_some() {
            self.keep_logs();
            return;
        }
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                eprintln!("member {} did not leave in 60 s; killing it", self.id);
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Its last lines are read before they are kept.
        std::thread::sleep(Duration::from_millis(100));
        self.keep_logs();
    }
}

impl Drop for MemberProcess {
    /// A benchmark that fails leaves no member running.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until every member owns some of the `tasks` tasks and they own
/// all of them together.
fn settled(members: &mut [MemberProcess], tasks: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let owned: Vec<usize> = members.iter().map(|m| m.owned().len()).collect();
        if owned.iter().all(|n| *n > 0) && owned.iter().sum::<usize>() == tasks {
            return;
        }
        for member in members.iter_mut() {
            member.check_alive();
        }
        assert!(Instant::now() < deadline, "the group did not settle in {limit:?}: members own {owned:?} of {tasks}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One throughput run's figures.
struct Throughput {
    members: usize,
    lines: f64,
    without_repartition: bool,
    /// Lines a second from the backlog's first line to everything committed.
    rate: f64,
    seconds: f64,
    /// How long producing the backlog took (inside `seconds`).
    produced_in: f64,
    /// Each member's CPU seconds over the measured time.
    cpu: Vec<f64>,
    /// Each member's peak resident memory, MB.
    peak_rss: Vec<f64>,
    /// The machine's busy cores over the measured time.
    busy_cores: f64,
    /// Whether the group kept its assignment through the run.
    stable: bool,
    /// Its windows against the reference (runs with the repartition hop).
    windows: Option<Windows>,
}

/// Starts `members` members on a new, empty input topic, waits until
/// they own their tasks, then produces the backlog and times it from its
/// first line until every batch of every stage has committed.
fn throughput(lines: u64, members: usize, without_repartition: bool) -> Throughput {
    let (input, output) = (unique("bench-app-in"), unique("bench-app-out"));
    let late_topic = format!("{output}-late");
    create_topics(&[(&input, PARTITIONS), (&output, 1), (&format!("{output}-top"), 1), (&late_topic, 1)]);
    let output = output.as_str();
    let dir = tempfile::tempdir().unwrap();
    let run = Run {
        app: unique("bench-app"),
        input: &input,
        output,
        checkpoint: dir.path(),
        session_ms: THROUGHPUT_SESSION_MS,
        quiet: std::env::var_os("APP_BENCH_LOGS").is_none(),
        without_repartition,
        // The command's default: the count tasks' watermarks follow every
        // split task, so one running ahead makes no word late.
        allowed_lateness_ms: "60000",
        batch_ms: BATCH_MS,
    };
    let topics = run.topics();
    let tasks: usize = topics.iter().map(|(_, n)| *n as usize).sum();
    let mut processes: Vec<MemberProcess> = (1..=members).map(|i| run.start_member(&format!("m{i}"))).collect();
    settled(&mut processes, tasks, Duration::from_secs(120));
    // Every task's context and consumers open, and the producers ready.
    std::thread::sleep(Duration::from_secs(2));
    let owned: Vec<Vec<String>> = processes.iter().map(MemberProcess::owned).collect();
    let offsets = Offsets::new(&run.app, &topics);
    let cpu_at: Vec<f64> = processes.iter().map(|m| cpu_seconds(m.child.id())).collect();
    let machine_at = machine_busy_seconds();
    let started = Instant::now();
    let reference = produce_backlog(&input, lines);
    let produced_in = started.elapsed().as_secs_f64();
    let input_read = |committed: &BTreeMap<(String, i32), i64>| -> i64 {
        committed.iter().filter(|((t, _), _)| *t == input).map(|(_, o)| o).sum()
    };
    let deadline = Instant::now() + Duration::from_secs(if lines > 10_000 { 600 } else { 60 });
    // Every task that writes an internal topic ends each batch with progress
    // marks, so the topics' ends move on while the members run: the run is
    // done when the input is read and, twice over (the stage after each
    // hop), every partition committed up to where it ended before.
    let mut targets: Vec<BTreeMap<(String, i32), i64>> = Vec::new();
    let done = loop {
        let committed = offsets.committed();
        let reached = |target: &BTreeMap<(String, i32), i64>| {
            target.iter().all(|(tp, end)| committed.get(tp).is_some_and(|c| c >= end))
        };
        if input_read(&committed) == lines as i64 && targets.last().is_none_or(reached) {
            if targets.len() == 2 {
                break Instant::now();
            }
            targets.push(offsets.ends());
            continue;
        }
        for member in &mut processes {
            member.check_alive();
        }
        assert!(
            Instant::now() < deadline,
            "{members} member(s): not done in time: committed {committed:?}, ends {:?}\n{}",
            offsets.ends(),
            processes.iter().map(MemberProcess::last_words).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let cpu: Vec<f64> = processes.iter().zip(&cpu_at).map(|(m, at)| cpu_seconds(m.child.id()) - at).collect();
    let peak_rss: Vec<f64> = processes.iter().map(|m| peak_rss_mb(m.child.id())).collect();
    let machine = machine_busy_seconds();
    let stable = processes.iter().map(MemberProcess::owned).collect::<Vec<_>>() == owned;
    let seconds = (done - started).as_secs_f64();
    for member in processes {
        member.stop();
    }
    let windows = (!without_repartition)
        .then(|| reference.check(&latest_counts(&read_all(output)), read_all(&late_topic).len() as u64));
    Throughput {
        members,
        lines: lines as f64,
        without_repartition,
        rate: lines as f64 / seconds,
        seconds,
        produced_in,
        cpu,
        peak_rss,
        busy_cores: (machine - machine_at) / seconds,
        stable,
        windows,
    }
}

fn describe(t: &Throughput) -> String {
    let cpu: Vec<String> = t.cpu.iter().map(|c| format!("{c:.1}")).collect();
    let rss: Vec<String> = t.peak_rss.iter().map(|m| format!("{m:.0}")).collect();
    format!(
        "app: {} member(s){}: {:.0} lines/s ({:.0} words/s), {:.0} lines/s a member, over {:.1} s (the backlog \
         produced in the first {:.1} s); CPU seconds a member: {} ({:.0} lines a member CPU-second); peak RSS a \
         member: {} MB; machine cores busy: {:.2} of {}{}{}",
        t.members,
        if t.without_repartition { ", no repartition" } else { "" },
        t.rate,
        t.rate * WORDS_PER_LINE as f64,
        t.rate / t.members as f64,
        t.seconds,
        t.produced_in,
        cpu.join(" "),
        t.lines / t.cpu.iter().sum::<f64>(),
        rss.join(" "),
        t.busy_cores,
        cores(),
        if t.stable { "" } else { "; the group's assignment changed during the run" },
        t.windows.as_ref().map_or_else(String::new, |w| format!(
            "; windows closed {}, exact {}, written again {}, late words {}",
            w.closed, w.exact, w.revised, w.late_words
        ))
    )
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// One rebalance run's figures.
struct Pause {
    session_ms: u64,
    /// Kill to the last moved task's first batch under its new owner.
    pause_ms: f64,
    /// Per moved task: (task, kill to given to a survivor, kill to its first batch there).
    tasks: Vec<(String, f64, f64)>,
    /// Kill to the moved partitions' committed offsets being stable (no
    /// transaction of the killed member holding some pending).
    stable_ms: f64,
    /// Records of the run's topics not committed yet at the kill.
    lag_at_kill: i64,
}

fn rebalance_pause(output: &str, members: usize, session_ms: u64) -> Pause {
    let input = unique("bench-app-live");
    create_topics(&[(&input, PARTITIONS)]);
    let dir = tempfile::tempdir().unwrap();
    let run = Run {
        app: unique("bench-app"),
        input: &input,
        output,
        checkpoint: dir.path(),
        session_ms,
        quiet: false,
        without_repartition: false,
        // The command's default.
        allowed_lateness_ms: "60000",
        batch_ms: REBALANCE_BATCH_MS,
    };
    let tasks: usize = run.topics().iter().map(|(_, n)| *n as usize).sum();
    let mut processes: Vec<MemberProcess> = (1..=members).map(|i| run.start_member(&format!("m{i}"))).collect();
    settled(&mut processes, tasks, Duration::from_secs(120));
    let stop = Arc::new(AtomicBool::new(false));
    let producing = live_producer(input.clone(), Arc::clone(&stop));
    // Steady running before the kill: every stage keeps up with the input.
    let offsets = Offsets::new(&run.app, &run.topics());
    let lag_at_kill = caught_up(&offsets, &mut processes);
    settled(&mut processes, tasks, Duration::from_secs(1));
    let input_tasks = |m: &MemberProcess| m.owned().iter().filter(|t| t.starts_with(&format!("{input}-"))).count();
    let victim = (0..processes.len()).max_by_key(|i| (input_tasks(&processes[*i]), usize::MAX - i)).unwrap();
    let mut victim = processes.remove(victim);
    let moved = victim.owned();
    let pending = PendingOffsets::new(&run.app, &moved);
    let killed = Instant::now();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    victim.keep_logs();
    let settled_offsets = std::thread::spawn(move || pending.wait());
    let since = |at: Instant| (at - killed).as_secs_f64() * 1000.0;
    let deadline = killed + Duration::from_millis(session_ms) + Duration::from_secs(60);
    let mut found: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    while found.len() < moved.len() {
        for member in &mut processes {
            member.check_alive();
        }
        for task in &moved {
            if let Some(at) = first_batch_after(&processes, task, killed) {
                let given = given_after(&processes, task, killed).map_or(f64::NAN, since);
                found.entry(task.clone()).or_insert((given, since(at)));
            }
        }
        assert!(
            Instant::now() < deadline,
            "session {session_ms} ms: after {:.0} ms, no new owner committed a batch of {:?}",
            since(Instant::now()),
            moved.iter().filter(|t| !found.contains_key(*t)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    producing.join().unwrap();
    for member in processes {
        member.stop();
    }
    let tasks: Vec<(String, f64, f64)> = found.into_iter().map(|(t, (g, b))| (t, g, b)).collect();
    let pause_ms = tasks.iter().map(|(_, _, b)| *b).fold(0.0, f64::max);
    let stable_ms = since(settled_offsets.join().unwrap());
    Pause { session_ms, pause_ms, tasks, stable_ms, lag_at_kill }
}

/// Live input before a member is killed: the members' first batches open
/// their stores and fill their windows, and a member killed in them leaves
/// a backlog its partitions' new owner must first work off.
const WARM_UP: Duration = Duration::from_secs(10);
/// Checks in a row, a second apart, that must find every stage caught up.
const STEADY_CHECKS: u32 = 5;

/// Waits until, [`STEADY_CHECKS`] times in a row a second apart, no
/// partition of the run's topics is more than two seconds of the live input
/// behind (words count eight to a line), after at least [`WARM_UP`] of
/// input; returns the records not yet committed then.
fn caught_up(offsets: &Offsets, members: &mut [MemberProcess]) -> i64 {
    let per_partition = (LIVE_RATE / PARTITIONS as u64) as i64;
    let started = Instant::now();
    let mut in_a_row = 0;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        for member in members.iter_mut() {
            member.check_alive();
        }
        let (committed, ends) = (offsets.committed(), offsets.ends());
        let lag: Vec<(String, i64)> =
            ends.iter().map(|(tp, end)| (tp.0.clone(), end - committed.get(tp).copied().unwrap_or(0))).collect();
        let behind = lag.iter().any(|(topic, lag)| {
            let words = if topic.ends_with("-words") { WORDS_PER_LINE as i64 } else { 1 };
            *lag > 2 * per_partition * words
        });
        in_a_row = if behind { 0 } else { in_a_row + 1 };
        if in_a_row >= STEADY_CHECKS && started.elapsed() >= WARM_UP {
            return lag.iter().map(|(_, l)| l).sum();
        }
        assert!(started.elapsed() < Duration::from_secs(90), "the members did not catch up with the input: {lag:?}");
    }
}

/// Asks the group for the committed offsets of the killed member's
/// partitions, requiring stable ones (`read_committed`), as a new owner's
/// first transaction does: the broker answers only once no transaction
/// holds offsets of them pending, here the killed member's open one,
/// which it aborts after the transaction timeout.
struct PendingOffsets {
    consumer: BaseConsumer,
    partitions: TopicPartitionList,
}

impl PendingOffsets {
    fn new(group: &str, tasks: &[String]) -> PendingOffsets {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", group)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut partitions = TopicPartitionList::new();
        for task in tasks {
            let (topic, partition) = task.rsplit_once('-').unwrap();
            partitions.add_partition(topic, partition.parse().unwrap());
        }
        PendingOffsets { consumer, partitions }
    }

    /// When the offsets were first stable.
    fn wait(self) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if self.consumer.committed_offsets(self.partitions.clone(), Duration::from_millis(200)).is_ok() {
                return Instant::now();
            }
        }
        panic!("the killed member's partitions still had pending offsets after 120 s");
    }
}

/// When a member first printed a committed batch of `task` after `since`.
fn first_batch_after(members: &[MemberProcess], task: &str, since: Instant) -> Option<Instant> {
    let prefix = format!("[{task}] batch ");
    members
        .iter()
        .filter_map(|m| {
            let stdout = m.stdout.lock().unwrap();
            stdout.iter().find(|(at, line)| *at > since && line.starts_with(&prefix)).map(|(at, _)| *at)
        })
        .min()
}

/// When a member first said it was given `task` after `since`
/// (`member <id> given a, b; owns …`).
fn given_after(members: &[MemberProcess], task: &str, since: Instant) -> Option<Instant> {
    let names = |line: &str| -> bool {
        let Some((_, rest)) = line.split_once(" given ") else { return false };
        rest.split_once("; owns").is_some_and(|(given, _)| given.split(", ").any(|t| t == task))
    };
    members
        .iter()
        .filter_map(|m| {
            let stdout = m.stdout.lock().unwrap();
            stdout
                .iter()
                .find(|(at, line)| *at > since && line.starts_with("member ") && names(line))
                .map(|(at, _)| *at)
        })
        .min()
}

fn main() {
    let options = Options::parse();
    for name in options.parts.iter().filter(|p| !PARTS.contains(&p.as_str())) {
        println!("app: no part named {name} (there are {})", PARTS.join(", "));
    }
    let brokers = brokers();
    let output = unique("bench-app-out");
    create_topics(&[(&output, 1), (&format!("{output}-top"), 1), (&format!("{output}-late"), 1)]);
    println!(
        "app: {} cores; broker {brokers}; batches of {BATCH_MS} ms ({REBALANCE_BATCH_MS} ms in the rebalance runs), {WINDOW_MS} ms event-time windows, heartbeat \
         {HEARTBEAT_MS} ms",
        cores()
    );
    let (mut runs, mut pauses) = (Vec::new(), Vec::new());
    if options.selects("throughput") || options.selects("hop") {
        let mut counts = vec![(1, false)];
        if options.selects("hop") {
            counts.push((1, true));
        }
        if options.selects("throughput") && options.full {
            counts.extend([(2, false), (3, false)]);
        }
        println!(
            "app: each run a new application on a new input topic; once its members own their tasks, a backlog of {} \
             lines ({WORDS_PER_LINE} words each) in {PARTITIONS} partitions",
            options.lines
        );
        for (members, without) in counts {
            let run = throughput(options.lines, members, without);
            println!("{}", describe(&run));
            if let Some(w) = &run.windows {
                // With the command's default lateness, every closed window
                // is exact and no word is late, however the split tasks
                // run their backlogs.
                assert!(
                    w.closed > 0 && w.exact == w.closed && w.late_words == 0 && w.revised == 0,
                    "{members} member(s): {w:?}"
                );
            }
            runs.push(run);
        }
    }
    if options.selects("rebalance") {
        let (members, sessions): (usize, &[u64]) = if options.full { (3, &[6_000, 10_000]) } else { (2, &[6_000]) };
        for &session in sessions {
            let pause = rebalance_pause(&output, members, session);
            let detail: Vec<String> =
                pause.tasks.iter().map(|(t, g, b)| format!("{t} given +{g:.0} ms, first batch +{b:.0} ms")).collect();
            println!(
                "app: session {session} ms, transaction timeout {session} ms, {members} members, one \
                 killed ({} records behind): {}; its partitions' offsets stable +{:.0} ms",
                pause.lag_at_kill,
                detail.join("; "),
                pause.stable_ms
            );
            pauses.push(pause);
        }
    }
    if !options.full {
        println!("app: not run with --bench, no figures");
        return;
    }
    let rate = |members: usize, without: bool| {
        runs.iter().find(|r| r.members == members && r.without_repartition == without).map(|r| r.rate)
    };
    if let (Some(hop), Some(no_hop)) = (rate(1, false), rate(1, true)) {
        println!("BENCH app_repartition_hop_1_member {hop:.0} lines/s bound={no_hop:.0} ratio={:.3}", hop / no_hop);
    }
    for run in &runs {
        if let Some(w) = &run.windows {
            println!(
                "BENCH app_exact_windows_{}_members {} windows bound={} ratio={:.3}",
                run.members,
                w.exact,
                w.closed,
                w.exact as f64 / w.closed.max(1) as f64
            );
        }
    }
    if let Some(one) = rate(1, false) {
        for members in [2, 3] {
            if let Some(total) = rate(members, false) {
                println!(
                    "BENCH app_throughput_{members}_members {total:.0} lines/s bound={one:.0} ratio={:.3}",
                    total / one
                );
                let each = total / members as f64;
                println!(
                    "BENCH app_throughput_{members}_members_per_member {each:.0} lines/s bound={one:.0} ratio={:.3}",
                    each / one
                );
            }
        }
    }
    for p in &pauses {
        let bound = p.session_ms as f64 + 2_000.0;
        println!(
            "BENCH app_rebalance_pause_session_{}ms {:.0} ms bound={bound:.0} ratio={:.3}",
            p.session_ms,
            p.pause_ms,
            p.pause_ms / bound
        );
    }
}
